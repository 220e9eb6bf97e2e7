"""Mixtral: HF ``MixtralForCausalLM`` / ``MixtralModel`` <-> CS ``GPT2LMHeadModel`` configured as
Mixtral (a sparse mixture-of-experts FFN).

Model Zoo (tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/mixtral.py``):
the attention, norms, embeddings and head are LLaMA's (lines 39-124, reusing
``Converter_LlamaAttention_HF_CS``; here :mod:`.llama`'s rules), the router is renamed (lines
96-104) and each expert projection is fused across experts on dimension 1 (lines 172-300,
``moe_optimized_impl_rules`` / ``convert_expert_weights``). The config adds ``moe`` (lines
458-510). HF tensors are named as transformers saves them (``block_sparse_moe.experts.<e>.w1``
..., which transformers 5 fuses into ``mlp.experts.gate_up_proj`` when it loads them); the fused
transformers 5 state-dict names are accepted on import too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ckpt_migrate import catalogue
from ckpt_migrate.hf.families import llama
from ckpt_migrate.hf.mapping import MappingError, Out, Shape, rename
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
MODEL_TYPE = HF_MODEL_TYPES[0]

_DEFAULT_THETA = 1e6  # HF MixtralConfig's rope_theta default
# MoE settings HF Mixtral's router cannot express (softmax over the experts, top-k, renormalised
# top-k weights, no bias, no shared or null expert): Model Zoo layers/SparseMoEBlock.py.
_MOE_FIXED: dict[str, tuple[Any, ...]] = {
    "num_shared_experts": (None, 0),
    "routing_algorithm": ("learned",),
    "router_selection_nonlinearity": ("softmax",),
    "expert_weighting_nonlinearity": ("softmax",),
    "expert_weighting_normalization": (True,),
    "router_use_bias": (False, None),
    "null_expert_bias": (None, 0, 0.0),
    "probability_before_ffn": (False,),
}
_MOE_MAPPED = frozenset({"num_experts", "top_k", "load_balancing_loss_coef"})
_MOE_IGNORED = frozenset(
    {"moe_implementation", "router_fp32", "gate_initializer", "sinkhorn_n_iters"}
)
# CS expert layouts by ``moe.moe_implementation`` (layers/SparseMoEBlock.py): "optimized" fuses
# the experts (what Model Zoo's converter writes), "functional" and "experimental" (the 2.10
# default) keep one FFN per expert.
_FUSED = "ffn.experts.fused_ffns.{j}.{kind}.expert_weights"
_PER_EXPERT = {
    "functional": "ffn.experts.experts.{e}.ffn.{j}.{kind}.weight",
    "experimental": "ffn.experts.experts.{e}.{j}.{kind}.weight",
}
# (HF legacy expert weight, CS FFN index, CS layer): Model Zoo mixtral.py lines 139-166.
_EXPERT_PARTS = (
    ("w1", 0, "linear_layer_for_glu"),
    ("w3", 0, "linear_layer"),
    ("w2", 1, "linear_layer"),
)


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise MappingError(f"{name}: not a Mixtral model name")


def _moe_checked(cs_model: Mapping[str, Any]) -> dict[str, Any]:
    moe = dict(cs_model.get("moe") or {})
    if not moe.get("num_experts"):
        raise MappingError("moe.num_experts: required for Mixtral")
    for key, allowed in _MOE_FIXED.items():
        if key in moe and moe[key] not in allowed:
            raise MappingError(f"moe.{key}={moe[key]!r}: HF Mixtral needs {allowed[0]!r}")
    for key in moe:
        if key not in _MOE_FIXED.keys() | _MOE_MAPPED | _MOE_IGNORED:
            raise MappingError(f"moe.{key}: not supported by the HF Mixtral mapping")
    return moe


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``config.json`` of ``MixtralForCausalLM`` / ``MixtralModel``: LLaMA's rules, plus
    ``sliding_window`` and ``moe`` -> ``num_local_experts``, ``num_experts_per_tok``,
    ``router_aux_loss_coef`` (Model Zoo mixtral.py lines 462-510)."""
    _check_name(name)
    cs = llama.cs_model_checked(cs_model, frozenset({"moe"}))
    moe = _moe_checked(cs_model)
    return {
        **llama.config_to_hf_common(cs, MODEL_TYPE, name),
        "sliding_window": cs.get("attention_sliding_window_length"),
        "num_local_experts": moe["num_experts"],
        "num_experts_per_tok": moe.get("top_k", 1),
        "router_aux_loss_coef": moe.get("load_balancing_loss_coef", 0.0),
    }


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The CS ``model:`` section (Model Zoo ``ConfigConverter_Mixtral_HF_CS23``). ``moe`` also
    names the fused expert layout the plan writes (``moe_implementation: optimized``): Model Zoo
    writes that layout without saying so, and 2.10's default is another."""
    _check_name(name)
    if hf_config.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise MappingError(f"model_type={hf_config['model_type']!r}: expected 'mixtral'")
    cs = llama.config_to_cs_common(hf_config, _DEFAULT_THETA)
    cs["attention_sliding_window_length"] = hf_config.get("sliding_window")
    cs["moe"] = {
        "num_experts": hf_config.get("num_local_experts", 8),
        "top_k": hf_config.get("num_experts_per_tok", 2),
        "load_balancing_loss_coef": hf_config.get("router_aux_loss_coef", 0.001),
        "moe_implementation": "optimized",
    }
    return cs


# --------------------------------------------------------------------------- tensors


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


def _cs_layout(cs: Mapping[str, Shape], i: int) -> str:
    stem = f"transformer_decoder.layers.{i}."
    if stem + _FUSED.format(j=0, kind="linear_layer") in cs:
        return "optimized"
    for layout, pattern in _PER_EXPERT.items():
        if stem + pattern.format(e=0, j=0, kind="linear_layer") in cs:
            return layout
    raise MappingError(f"{stem}ffn.experts: no expert weights in a known layout")


def _moe_to_hf(cs: Mapping[str, Shape], i: int, experts: int, p: str) -> list[Out]:
    stem, hf_stem = f"transformer_decoder.layers.{i}.", f"{p}layers.{i}.block_sparse_moe."
    outs = [rename(stem + "ffn.gate.weight", hf_stem + "gate.weight")]
    layout = _cs_layout(cs, i)
    for part, j, kind in _EXPERT_PARTS:
        for e in range(experts):
            dst = f"{hf_stem}experts.{e}.{part}.weight"
            if layout == "optimized":
                outs.append(_expert(stem + _FUSED.format(j=j, kind=kind), dst, e))
            else:
                outs.append(rename(stem + _PER_EXPERT[layout].format(e=e, j=j, kind=kind), dst))
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


def _moe_to_cs(hf: Mapping[str, Shape], i: int, experts: int, p: str, inter: int) -> list[Out]:
    stem = f"transformer_decoder.layers.{i}."
    fused = f"{p}layers.{i}.mlp.experts.gate_up_proj"
    if fused in hf:
        down = f"{p}layers.{i}.mlp.experts.down_proj"
        return [
            rename(f"{p}layers.{i}.mlp.gate.weight", stem + "ffn.gate.weight"),
            _fused_part(
                fused, stem + _FUSED.format(j=0, kind="linear_layer_for_glu"), slice(0, inter)
            ),
            _fused_part(
                fused, stem + _FUSED.format(j=0, kind="linear_layer"), slice(inter, 2 * inter)
            ),
            _fused_part(down, stem + _FUSED.format(j=1, kind="linear_layer"), None),
        ]
    hf_stem = f"{p}layers.{i}.block_sparse_moe."
    outs = [rename(hf_stem + "gate.weight", stem + "ffn.gate.weight")]
    for part, j, kind in _EXPERT_PARTS:
        srcs = tuple(f"{hf_stem}experts.{e}.{part}.weight" for e in range(experts))
        dst = stem + _FUSED.format(j=j, kind=kind)
        outs.append(Out(dst, srcs, _fuse, infer=_fused_shape, note=f"{experts} experts fused"))
    return outs


def plan_to_hf(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> list[Out]:
    """HF tensors as transformers saves them, from any of the three CS expert layouts. From the
    fused layout every expert's tensor reads the whole fused tensor (the contract reads whole
    inputs), so the experts cost ``num_experts`` reads each."""
    _check_name(name)
    cfg = llama.cs_model_checked(cs_model, frozenset({"moe"}))
    experts = int(_moe_checked(cs_model)["num_experts"])
    heads, kv, p = cfg["num_heads"], llama.kv_heads_cs(cfg), llama.hf_prefix(name)
    plan = llama.outer_to_hf(cs, cfg, name)
    for i in range(cfg["num_hidden_layers"]):
        plan += llama.layer_outs(i, llama.ATTENTION_AND_NORMS, heads, kv, True, p)
        plan += _moe_to_hf(cs, i, experts, p)
    return llama.finish(plan, cs)


def plan_to_cs(hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str) -> list[Out]:
    """CS tensors in Model Zoo's fused expert layout, from the saved HF names (per expert) or
    transformers 5's state-dict names (fused)."""
    cfg = config_to_cs(hf_config, name)
    heads, kv, p = cfg["num_heads"], llama.kv_heads_cs(cfg), llama.hf_prefix(name)
    experts, inter = int(cfg["moe"]["num_experts"]), int(cfg["filter_size"])
    plan = llama.outer_to_cs(hf, hf_config, name)
    for i in range(cfg["num_hidden_layers"]):
        plan += llama.layer_outs(i, llama.ATTENTION_AND_NORMS, heads, kv, False, p)
        plan += _moe_to_cs(hf, i, experts, p, inter)
    return llama.finish(plan, hf)
