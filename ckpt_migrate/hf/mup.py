"""muP on the way to Hugging Face: one check (:func:`refuse`) every family's config mapping runs,
and one operation (:func:`to_sp`) the export runs first, folding the muP multipliers into the
CS weights so that the HF model, which has no muP, computes the CS model's function.

What is muP, which values are neutral and which tensors each multiplier folds into is declared
once per CS layout in ``catalogue/mup.py`` (sources cited there); a record's ``Hf.mup`` says
whether its export folds (Model Zoo's converters with ``supports_mup_conversion``).

The multipliers, as the CS decoder computes them (Model Zoo Release_2.10.0,
``models/nlp/gpt2/gpt2_model.py`` lines 750-790, 1085-1093, 1186-1193,
``layers/AttentionLayer.py`` lines 354-361 and 646):

- ``embeddings``: ``embeddings_scale`` times the embedding output: folded into the word and
  position embeddings, or into the embedding norm's weight and bias when there is one;
- ``attention_logits``: the QK logits times ``attention_logits_alpha / sqrt(d_head)`` more when
  ``scale_qk_dot_by_d`` (d instead of sqrt(d)): folded into the k projection (weight and bias);
- ``output_logits``: the logits times ``output_logits_alpha / (hidden / mup_base_hidden_size)``
  (square root of the ratio without ``scale_output_logits_by_d``), or 2.2's
  ``output_logits_scale``: folded into ``lm_head`` weight *and bias* (the forward scales the
  biased logits; Model Zoo's ``mup.py`` lines 537-579 scales the weight only).

BERT's (the scale before the embedding norm; MLM and NSP heads) and T5's (q, k, v and output
projections) are described where they are declared, ``catalogue/mup.py``.

A scaled tied head cannot stay tied to unscaled embeddings: the output unties it
(``share_embedding_weights: false``), as Model Zoo's ``mup.py`` lines 128-142 do.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.mup import BY_LAYOUT, Multiplier, Mup
from ckpt_migrate.format.tree import DataSource, TensorLeaf
from ckpt_migrate.hf.arrays import cast
from ckpt_migrate.hf.mapping import MappingError


def declaration(name: str) -> tuple[Mup | None, bool, frozenset[str]]:
    """(the muP declaration ``name`` is checked against, whether its export folds it, the
    muP-named fields its HF config carries itself)."""
    record = catalogue.by_name(name)
    if record is None or record.hf is None:
        return None, False, frozenset()
    hf = record.hf
    mup = hf.mup or (BY_LAYOUT.get(record.layout.name) if record.layout else None)
    return mup, bool(mup and mup.multipliers), frozenset(hf.mup_native)


def found(cs_model: Mapping[str, Any], name: str) -> list[str]:
    """The muP fields ``cs_model`` sets to a value that changes the function, in declared order."""
    mup, _, native = declaration(name)
    if mup is None:
        return []
    return [
        f.name for f in mup.fields if f.name not in native and cs_model.get(f.name) not in f.neutral
    ]


def fields(name: str) -> frozenset[str]:
    """Every muP field of ``name``'s layout (those a family's mapping need not know itself)."""
    mup, _, _ = declaration(name)
    return mup.names if mup is not None else frozenset()


def describe(name: str) -> str | None:
    """What ``export-hf`` does with a muP checkpoint of ``name`` (None: no HF conversion)."""
    record = catalogue.by_name(name)
    if record is None or record.hf is None:
        return None
    mup, folds, native = declaration(name)
    if folds:
        return "folded into the weights (as Model Zoo's mup.py rescales them; head biases too)"
    if native:
        return f"{', '.join(sorted(native))} map to the HF config; other muP fields refused"
    return "refused, naming the field" if mup is not None else None


def refuse(cs_model: Mapping[str, Any], name: str) -> None:
    """A muP config reaching a family's mapping is refused, naming the first muP field: the
    export folds first where it can (:func:`to_sp`), so only what cannot fold gets here."""
    bad = found(cs_model, name)
    if not bad:
        return
    _, folds, _ = declaration(name)
    why = (
        "muP is folded into the weights by export-hf, not by this mapping"
        if folds
        else f"muP models are not supported for {name}: its Hugging Face class has no muP "
        "multipliers and they are not folded into the weights for it"
    )
    raise MappingError(f"{bad[0]}={cs_model[bad[0]]!r}: {why}")


def to_sp(
    cs_model: Mapping[str, Any], leaves: Mapping[str, TensorLeaf], name: str
) -> tuple[dict[str, Any], dict[str, TensorLeaf]]:
    """muP -> standard parametrisation: the config without its muP fields and the tensors with
    the multipliers folded in (read lazily, one tensor at a time). A config without muP comes
    back unchanged, the leaves the same objects (the export is then bit-identical)."""
    bad = found(cs_model, name)
    if not bad:
        return dict(cs_model), dict(leaves)
    mup, folds, _ = declaration(name)
    if not folds or mup is None:
        refuse(cs_model, name)
    assert mup is not None
    scales = multipliers(cs_model, mup)
    out = dict(leaves)
    sp = {k: v for k, v in cs_model.items() if k not in mup.names}
    force = mup.head_rescaled_when_tied and _on(cs_model)
    _untie(sp, out, name, {m: scales[m.name] for m in mup.multipliers}, force)
    for multiplier in mup.multipliers:
        factor = scales[multiplier.name]
        if factor == 1.0:
            continue
        hit = [n for n in out if any(re.fullmatch(p, n) for p in multiplier.tensors)]
        if not hit and not (multiplier.name == "output_logits" and name.endswith("-headless")):
            raise MappingError(
                f"{bad[0]}: the muP {multiplier.name} multiplier ({factor!r}) has no tensor to "
                f"fold into ({', '.join(multiplier.tensors)})"
            )
        for n in hit:
            out[n] = scaled(out[n], factor)
    return sp, out


def multipliers(cs_model: Mapping[str, Any], mup: Mup) -> dict[str, float]:
    """Each multiplier's value for ``cs_model`` (1.0: nothing to fold), from the CS forward's
    formulas (module docstring; T5's in ``catalogue/mup.py``)."""
    if mup.formulas == "encoder-decoder":
        return _t5(cs_model, _on(cs_model))
    return _decoder(cs_model, mup, _on(cs_model))


def _on(cs: Mapping[str, Any]) -> bool:
    """muP switched on: a base dimension set (Model Zoo's ``_is_mup``, mup.py lines 861-865)."""
    return any(k.startswith("mup_base_") and v is not None for k, v in cs.items())


def _decoder(cs: Mapping[str, Any], mup: Mup, on: bool) -> dict[str, float]:
    emb = float(cs.get("embeddings_scale") or 1.0)
    norm = bool(cs.get("embedding_layer_norm", False))
    by_d = cs.get("scale_qk_dot_by_d")
    if by_d is None:
        by_d = on if mup.qk_by_d_unset is None else mup.qk_by_d_unset
    attn = float(cs.get("attention_logits_alpha") or 1.0)
    if by_d and cs.get("attention_type", "scaled_dot_product") == "scaled_dot_product":
        heads = int(cs["num_heads"])
        attn /= math.sqrt((cs.get("attention_inner_dim") or cs["hidden_size"]) // heads)
    return {
        "embeddings": 1.0 if norm else emb,
        "embedding_norm": emb if norm else 1.0,
        "attention_logits": attn,
        "output_logits": _output_scale(cs, on),
    }


def _t5(cs: Mapping[str, Any], on: bool) -> dict[str, float]:
    if on and not cs.get("mup_base_d_model"):  # t5_model.py lines 296-320
        raise MappingError("mup_base_d_ff: muP T5 needs mup_base_d_model too (Model Zoo's too)")
    if on and cs.get("use_transformer_initialization"):
        raise MappingError("use_transformer_initialization: its muP is not folded (T5's only)")
    d_model, d_kv = float(cs["d_model"]), float(cs.get("d_kv", 64))
    width = d_model / float(cs["mup_base_d_model"]) if on else 1.0
    proj = 1.0 if not on or cs.get("mup_base_d_kv") else width**-0.5
    qk = math.sqrt(d_kv) if on else 1.0  # scaled dot product only under muP (lines 514-516)

    def k(side: str) -> float:
        by_d = cs.get(f"scale_{side}_qk_dot_by_d")
        alpha = float(cs.get(f"{side}_attention_logits_alpha") or 1.0)
        return alpha * proj / (qk if (on if by_d is None else by_d) else 1.0)

    out = 1.0
    if on:
        alpha = float(cs.get("output_logits_alpha") or 1.0)
        out = alpha / (width if cs.get("scale_output_logits_by_d") else math.sqrt(width))
    return {
        "embeddings": float(cs.get("embeddings_alpha") or 1.0) * (math.sqrt(d_model) if on else 1),
        "q": proj / qk,
        "encoder_k": k("encoder"),
        "decoder_k": k("decoder"),
        "v": proj,
        "attention_output": 1.0 / proj,
        "output_logits": out,
    }


def _output_scale(cs: Mapping[str, Any], on: bool) -> float:
    legacy = cs.get("output_logits_scale")
    if not on:
        return float(legacy or 1.0)
    if legacy not in (None, 1, 1.0):  # gpt2_model.py lines 482-488
        raise MappingError(
            "output_logits_scale: a 2.2 muP field beside mup_base_hidden_size (Model Zoo's "
            "model refuses this config too); remove one"
        )
    alpha = float(cs.get("output_logits_alpha") or 1.0)
    width = float(cs["hidden_size"]) / float(cs["mup_base_hidden_size"])
    by_d = cs.get("scale_output_logits_by_d")
    return alpha / width if by_d in (None, True) else alpha / math.sqrt(width)


def _untie(
    sp: dict[str, Any],
    leaves: dict[str, TensorLeaf],
    name: str,
    scales: dict[Multiplier, float],
    force: bool,
) -> None:
    """A tie the config switches on (the head *is* the embeddings) whose two names take
    different multipliers (or every head tie, ``force``): the copy becomes the original's
    tensor, scaled apart from here on, and the config says untied (Model Zoo's mup.py lines
    128-142, 172-186 likewise)."""
    record = catalogue.by_name(name)
    for tie in record.ties if record is not None else ():
        if tie.config_flag is None or not sp.get(tie.config_flag, True):
            continue
        original = next((n for n in leaves if _is(n, tie.b)), None)
        copy = next((n for n in leaves if _is(n, tie.a)), tie.a)
        apart = _factor(copy, scales) != _factor(original or copy, scales)
        if original is not None and (apart or (force and tie.config_flag == _HEAD_TIE)):
            leaves[copy] = leaves[original]
            sp[tie.config_flag] = False


_HEAD_TIE = "share_embedding_weights"


def _is(name: str, suffix: str) -> bool:
    return name == suffix or name.endswith("." + suffix)


def _factor(name: str, scales: dict[Multiplier, float]) -> float:
    factor = 1.0
    for multiplier, value in scales.items():
        if any(re.fullmatch(p, name) for p in multiplier.tensors):
            factor *= value
    return factor


_CHUNK = 1 << 20  # elements


@dataclasses.dataclass(frozen=True, eq=False)
class Scaled(DataSource):
    """A tensor times a muP multiplier, computed in float64 when read and stored in the source's
    dtype (bf16 rounded to nearest even); the source and the result are whole, the float64
    products one chunk at a time (peak near twice the tensor, as a fused output's)."""

    source: DataSource
    dtype: str
    factor: float

    def read(self) -> np.ndarray:
        array = self.source.read()
        flat = np.ascontiguousarray(array).reshape(-1)
        out = np.empty(flat.shape, flat.dtype)
        for i in range(0, flat.size, _CHUNK):  # the float64 products a chunk at a time
            part = cast(flat[i : i + _CHUNK], self.dtype, "float32").astype(np.float64)
            out[i : i + _CHUNK] = cast(
                (part * self.factor).astype(np.float32), "float32", self.dtype
            )
        return out.reshape(array.shape)

    def describe(self) -> str:
        return f"{self.source.describe()} times {self.factor!r} (muP)"


def scaled(leaf: TensorLeaf, factor: float) -> TensorLeaf:
    """``leaf`` times ``factor`` (floating tensors only)."""
    if leaf.dtype not in ("float32", "float16", "bfloat16"):
        raise MappingError(f"a {leaf.dtype} tensor cannot take the muP multiplier {factor!r}")
    return dataclasses.replace(leaf, data=Scaled(leaf.data, leaf.dtype, factor))
