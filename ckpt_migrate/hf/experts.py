"""Mixtral's experts as one table operation: a layer's router and expert FFNs, CS (any of its
three expert layouts) <-> HF (the per-expert names ``save_pretrained`` writes, or
transformers 5's fused ``gate_up_proj``/``down_proj`` on import).

Model Zoo: ``mixtral.py`` at tag Release_2.10.0, lines 139-166 (the expert parts) and 281-300
(the fused layout it writes).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ckpt_migrate.hf.mapping import MappingError, Out, Shape, rename
from ckpt_migrate.hf.ops import Ctx, Op

# CS expert layouts by ``moe.moe_implementation`` (layers/SparseMoEBlock.py): "optimized" fuses
# the experts (what Model Zoo's converter writes), "functional" and "experimental" (the 2.10
# default) keep one FFN per expert.
FUSED = "ffn.experts.fused_ffns.{j}.{kind}.expert_weights"
PER_EXPERT = {
    "functional": "ffn.experts.experts.{e}.ffn.{j}.{kind}.weight",
    "experimental": "ffn.experts.experts.{e}.{j}.{kind}.weight",
}
# (HF legacy expert weight, CS FFN index, CS layer): Model Zoo mixtral.py lines 139-166.
EXPERT_PARTS = (
    ("w1", 0, "linear_layer_for_glu"),
    ("w3", 0, "linear_layer"),
    ("w2", 1, "linear_layer"),
)


def _fuse(*experts: np.ndarray) -> np.ndarray:
    """Model Zoo mixtral.py lines 281-291: ``[out, in]`` per expert -> ``[out, E, in]``."""
    return np.stack(experts, axis=1)


def _fused_shape(*shapes: Shape) -> Shape:
    return (shapes[0][0], len(shapes), shapes[0][1])


def _expert(fused: str, dst: str, e: int) -> Out:
    """Model Zoo mixtral.py lines 292-300: expert ``e`` is ``fused[:, e]``."""
    return Out(
        dst,
        (fused,),
        lambda x: np.ascontiguousarray(x[:, e]),
        infer=lambda s: (s[0], s[2]),
        note=f"expert {e}",
    )


def _cs_layout(cs: Ctx, stem: str) -> str:
    if stem + FUSED.format(j=0, kind="linear_layer") in cs.available:
        return "optimized"
    for layout, pattern in PER_EXPERT.items():
        if stem + pattern.format(e=0, j=0, kind="linear_layer") in cs.available:
            return layout
    raise MappingError(f"{stem}ffn.experts: no expert weights in a known layout")


def _to_hf(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """From the fused layout every expert's tensor reads the whole fused tensor (the contract
    reads whole inputs), so the experts cost ``num_experts`` reads each."""
    stem, hf_stem = srcs[0], dsts[0] + "block_sparse_moe."
    outs = [rename(stem + "ffn.gate.weight", hf_stem + "gate.weight")]
    layout = _cs_layout(ctx, stem)
    for part, j, kind in EXPERT_PARTS:
        for e in range(int(ctx.dims["experts"])):
            dst = f"{hf_stem}experts.{e}.{part}.weight"
            if layout == "optimized":
                outs.append(_expert(stem + FUSED.format(j=j, kind=kind), dst, e))
            else:
                outs.append(rename(stem + PER_EXPERT[layout].format(e=e, j=j, kind=kind), dst))
    return outs


def _fused_part(src: str, dst: str, rows: slice | None) -> Out:
    """From transformers 5's ``gate_up_proj`` ``[E, 2I, H]`` (gate rows first, then up; ``rows``)
    or ``down_proj`` ``[E, H, I]`` to CS ``[out, E, in]``."""

    def build(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray((x if rows is None else x[:, rows]).transpose(1, 0, 2))

    def infer(s: Shape) -> Shape:
        out = s[1] if rows is None else len(range(*rows.indices(s[1])))
        return (out, s[0], s[2])

    return Out(dst, (src,), build, infer=infer, note="experts unfused from transformers 5")


def _to_cs(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """CS tensors in Model Zoo's fused expert layout, from the saved HF names (per expert) or
    transformers 5's state-dict names (fused)."""
    hf, stem = srcs[0], dsts[0]
    experts, inter = int(ctx.dims["experts"]), int(ctx.dims["inter"])
    fused = f"{hf}mlp.experts.gate_up_proj"
    if fused in ctx.available:
        return [
            rename(f"{hf}mlp.gate.weight", stem + "ffn.gate.weight"),
            _fused_part(
                fused, stem + FUSED.format(j=0, kind="linear_layer_for_glu"), slice(0, inter)
            ),
            _fused_part(
                fused, stem + FUSED.format(j=0, kind="linear_layer"), slice(inter, 2 * inter)
            ),
            _fused_part(
                f"{hf}mlp.experts.down_proj", stem + FUSED.format(j=1, kind="linear_layer"), None
            ),
        ]
    hf_stem = f"{hf}block_sparse_moe."
    outs = [rename(hf_stem + "gate.weight", stem + "ffn.gate.weight")]
    for part, j, kind in EXPERT_PARTS:
        parts = tuple(f"{hf_stem}experts.{e}.{part}.weight" for e in range(experts))
        dst = stem + FUSED.format(j=j, kind=kind)
        outs.append(Out(dst, parts, _fuse, infer=_fused_shape, note=f"{experts} experts fused"))
    return outs


# A layer's router and experts; the row's names are the layer stems (``...layers.{i}.``) and
# ``ctx.dims`` gives ``experts`` and, on import, the FFN width ``inter``.
EXPERTS = Op("MoE experts stacked", _to_hf, _to_cs)
