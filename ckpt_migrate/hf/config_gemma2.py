"""The named operations of Gemma 2's config table (``catalogue/gemma2_config.py``), each a pair
as in ``config_ops.py``: (exporting, importing).

Model Zoo (tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``):
``gemma2.py`` (``ConfigConverter_Gemma2_HF_CS23``, lines 218-781).
"""

from __future__ import annotations

import math

from ckpt_migrate.hf.config_llama import kv_heads_cs
from ckpt_migrate.hf.config_ops import Fn, State
from ckpt_migrate.hf.mapping import MappingError


def _attention_to_hf(s: State) -> None:
    """gemma2.py lines 701-744: ``embeddings_scale`` must be ``hidden_size ** 0.5``,
    ``attention_inner_dim`` defaults to ``hidden_size``, ``rotary_dim`` is required and (lines
    591-610) the head size, ``attention_dropout_rate`` defaults to ``dropout_rate``; lines
    640-663: the two attention bias flags agree (HF has one ``attention_bias``)."""
    cs = s.src
    scale, want = float(cs["embeddings_scale"]), cs["hidden_size"] ** 0.5
    if abs(scale - want) > 1e-6 + 2.0e-7 * want:
        raise MappingError(f"embeddings_scale={scale!r}: must be hidden_size**0.5 ({want})")
    if cs["attention_inner_dim"] is None:
        cs["attention_inner_dim"] = cs["hidden_size"]
    if cs["rotary_dim"] is None:
        raise MappingError("rotary_dim: must be specified (Model Zoo gemma2.py line 736)")
    if cs["attention_inner_dim"] % cs["num_heads"]:
        raise MappingError("attention_inner_dim: must be divisible by num_heads")
    if cs["rotary_dim"] != cs["attention_inner_dim"] // cs["num_heads"]:
        raise MappingError("rotary_dim: must be attention_inner_dim // num_heads for HF")
    if cs["attention_dropout_rate"] is None:
        cs["attention_dropout_rate"] = cs["dropout_rate"]
    if cs["use_projection_bias_in_attention"] != cs["use_ffn_bias_in_attention"]:
        raise MappingError(
            "use_ffn_bias_in_attention: must equal use_projection_bias_in_attention (HF has one "
            "attention_bias)"
        )


def _attention_to_cs(s: State) -> None:
    """Ours: what Model Zoo drops without a rule but the CS model cannot hold: another layer
    pattern than HF's alternating default (sliding on layers 0, 2, ...), bidirectional
    attention, key/value heads that do not divide the heads."""
    hf = s.src
    default = [
        "sliding_attention" if (i + 1) % 2 else "full_attention"
        for i in range(hf["num_hidden_layers"])
    ]
    if hf.get("layer_types") not in (None, default):
        raise MappingError("layer_types: CS alternates sliding and full attention only")
    if hf.get("use_bidirectional_attention"):
        raise MappingError("use_bidirectional_attention: CS Gemma 2 is causal")
    kv = hf["num_key_value_heads"]
    if kv is None or hf["num_attention_heads"] % kv:
        raise MappingError("num_key_value_heads: must divide num_attention_heads")


def _kv_heads_to_hf(s: State) -> None:
    """gemma2.py lines 565-589, LLaMA's rule (``config_llama.kv_heads_cs``)."""
    s.out["num_key_value_heads"] = kv_heads_cs(s.src, "Gemma 2")


def _kv_heads_to_cs(s: State) -> None:
    """gemma2.py lines 549-564: as many key/value heads as heads is MHA, fewer is GQA."""
    heads, kv = s.src["num_attention_heads"], s.src["num_key_value_heads"]
    if kv == heads:
        s.out["attention_module"] = "aiayn_attention"
    else:
        s.out["extra_attention_params"] = {"num_kv_groups": kv}
        s.out["attention_module"] = "multiquery_attention"


def _rope_to_hf(s: State) -> None:
    """gemma2.py lines 263-266: ``rope_theta``, also written as transformers 5's
    ``rope_parameters``."""
    theta = float(s.src["rope_theta"])
    s.out.update(rope_theta=theta, rope_parameters={"rope_type": "default", "rope_theta": theta})


def _rope_to_cs(s: State) -> None:
    """``rope_theta``, read from transformers 5's ``rope_parameters`` too; Gemma 2 in Model Zoo
    has no rope scaling, so any is refused."""
    params = dict(s.src.get("rope_parameters") or {})
    scaling = s.src.get("rope_scaling") or {}
    for spec in (params, scaling):
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind != "default":
            raise MappingError(f"rope_parameters: rope type {kind!r} not supported for Gemma 2")
    s.out["rope_theta"] = float(params.get("rope_theta", s.src["rope_theta"]))


def _head_dim_to_hf(s: State) -> None:
    """gemma2.py lines 612-638: ``head_dim`` is ``attention_inner_dim // num_heads``."""
    s.out["head_dim"] = s.src["attention_inner_dim"] // s.src["num_heads"]


def _head_dim_to_cs(s: State) -> None:
    """gemma2.py lines 621-625: ``attention_inner_dim`` is ``head_dim * num_attention_heads``."""
    s.out["attention_inner_dim"] = s.src["head_dim"] * s.src["num_attention_heads"]


def _embeddings_scale_to_cs(s: State) -> None:
    """gemma2.py lines 755-765: Gemma scales its embeddings by ``sqrt(hidden_size)``
    (exporting, the attention checks hold ``embeddings_scale`` to it)."""
    s.out["embeddings_scale"] = s.src["hidden_size"] ** 0.5


def _query_scalar_to_hf(s: State) -> None:
    """gemma2.py lines 766-772: ``head size / attention_logits_alpha ** 2``. Written as an int
    when it is one up to rounding (transformers 5's ``Gemma2Config`` accepts only ints; Model
    Zoo writes the float)."""
    cs = s.src
    value = (cs["attention_inner_dim"] / cs["num_heads"]) / float(cs["attention_logits_alpha"]) ** 2
    nearest = round(value)
    s.out["query_pre_attn_scalar"] = (
        int(nearest) if math.isclose(value, nearest, rel_tol=1e-9) else value
    )


def _query_scalar_to_cs(s: State) -> None:
    """gemma2.py lines 755-765: ``attention_logits_alpha`` is
    ``sqrt(head_dim / query_pre_attn_scalar)``, written only when it is not 1."""
    head_dim, scalar = s.src["head_dim"], s.src["query_pre_attn_scalar"]
    if head_dim != scalar:
        s.out["attention_logits_alpha"] = (head_dim / scalar) ** 0.5


OPS: dict[str, tuple[Fn, Fn]] = {
    "gemma2 attention": (_attention_to_hf, _attention_to_cs),
    "gemma2 kv heads": (_kv_heads_to_hf, _kv_heads_to_cs),
    "gemma2 rope": (_rope_to_hf, _rope_to_cs),
    "gemma2 head dim": (_head_dim_to_hf, _head_dim_to_cs),
    "gemma2 embeddings scale": (None, _embeddings_scale_to_cs),
    "gemma2 query scalar": (_query_scalar_to_hf, _query_scalar_to_cs),
}
