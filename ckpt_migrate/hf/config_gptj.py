"""The named operations of the GPT-J backbone families' config tables
(``catalogue/gptj_config.py``: GPT-J, CodeGen, GPT-NeoX, BLOOM, Falcon), each a pair as in
``config_ops.py``: (exporting, importing), and the RoPE helpers. Model Zoo (tag
Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``):
``salesforce_codegen_hf_cs.py``, ``gpt_neox_hf_cs.py``, ``bloom_hf_cs.py``, ``falcon_180b.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate.catalogue.config import CS
from ckpt_migrate.hf.config_ops import Fn, State
from ckpt_migrate.hf.mapping import MappingError

Config = Mapping[str, Any]


def rope_factor(params: Config, legacy: Config) -> float:
    """The linear RoPE scaling factor (1 without scaling) of transformers 5 ``rope_parameters``
    or the older ``rope_scaling``; any other kind is refused (Model Zoo: gpt_neox_hf_cs.py lines
    1041-1080, falcon_180b.py lines 642-681, which only the linear kind is carried of)."""
    kind = params.get("rope_type", legacy.get("type", legacy.get("rope_type", "default")))
    if kind not in ("default", "linear"):
        raise MappingError(f"rope_parameters: rope_type {kind!r} is not supported")
    return params.get("factor", legacy.get("factor", 1.0)) if kind == "linear" else 1.0


def check_scaling_type(cs: Config) -> None:
    """Only linear position scaling converts (``pos_scaling_type`` absent means linear)."""
    if cs.get("pos_scaling_type", "linear") != "linear":
        raise MappingError(f"pos_scaling_type: {cs['pos_scaling_type']!r} is not supported")


def hf_rope(factor: float, **fields: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(``rope_parameters``, ``rope_scaling``): ``fields`` and the kind, linear with ``factor``
    when it is not 1; ``rope_scaling`` is null without scaling, as Model Zoo writes it
    (``convert_pi``), else the same mapping (transformers 5 reads it as an alias)."""
    rope: dict[str, Any] = {**fields, "rope_type": "default"}
    if factor != 1.0:
        rope.update(rope_type="linear", factor=factor)
    return rope, dict(rope) if rope["rope_type"] == "linear" else None


def _codegen_heads(s: State) -> None:
    """salesforce_codegen_hf_cs.py lines 731-739: HF CodeGen packs Q, K, V in 4 shards (mp_num),
    so at least 4 heads and a hidden size 4 divides."""
    field, hidden = ("num_heads", "hidden_size") if s.side == CS else ("n_head", "n_embd")
    heads = s.src[field]
    if heads < 4:
        raise MappingError(f"{field}: HF CodeGen needs at least 4 heads, got {heads}")
    if s.src[hidden] % 4:
        raise MappingError(f"{field}: the hidden size {s.src[hidden]} must split into 4 shards")


def _neox_rope(hf: Config) -> tuple[float, float, float]:
    """(theta, rotary fraction, linear scaling factor) from transformers 5 ``rope_parameters``
    or the older ``rotary_pct`` / ``rotary_emb_base`` / ``rope_scaling`` fields.

    Model Zoo: gpt_neox_hf_cs.py lines 752-759 (``rotary_pct``, base 10000 asserted) and
    1041-1080 (``rope_scaling``; only the linear kind is carried here)."""
    params = dict(hf.get("rope_parameters") or {})
    legacy = dict(hf.get("rope_scaling") or {})
    theta = params.get("rope_theta", hf.get("rotary_emb_base", 10000.0))
    fraction = params.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))
    factor = rope_factor(params, legacy)
    if theta != 10000:
        raise MappingError(f"rope_parameters: rope_theta must be 10000 (Model Zoo), got {theta}")
    return float(theta), float(fraction), float(factor)


def _neox_rope_to_hf(s: State) -> None:
    """gpt_neox_hf_cs.py lines 866-870 and 1082-1089: ``rotary_pct`` = ``rotary_dim`` / head
    size, written both as transformers 5 ``rope_parameters`` and as the older ``rotary_pct`` /
    ``rotary_emb_base`` / ``rope_scaling`` fields (null without scaling, as Model Zoo writes it;
    with scaling the ``rope_parameters`` mapping, which transformers 5 reads as its alias)."""
    if s.src["rotary_dim"] % 2:
        raise MappingError(f"rotary_dim: must be even, got {s.src['rotary_dim']}")
    check_scaling_type(s.src)
    fraction = s.src["rotary_dim"] / (s.src["hidden_size"] // s.src["num_heads"])
    rope, scaling = hf_rope(
        s.src["pos_scaling_factor"], rope_theta=10000.0, partial_rotary_factor=fraction
    )
    s.out.update(
        rope_parameters=rope, rotary_pct=fraction, rotary_emb_base=10000, rope_scaling=scaling
    )


def _neox_rope_to_cs(s: State) -> None:
    _neox_rope(s.src)


def _neox_rotary_dim(s: State) -> None:
    """The rotary fraction of the head size."""
    head_size = s.src["hidden_size"] // s.src["num_attention_heads"]
    s.out["rotary_dim"] = int(head_size * _neox_rope(s.src)[1])


def _neox_scaling_factor(s: State) -> None:
    s.out["pos_scaling_factor"] = _neox_rope(s.src)[2]


def _neox_scaling_type(s: State) -> None:
    if _neox_rope(s.src)[2] != 1.0:
        s.out["pos_scaling_type"] = "linear"


def _n_embed(s: State) -> None:
    """bloom_hf_cs.py: ``n_embed`` is an older spelling of ``hidden_size``."""
    if s.src.get("n_embed") is not None:
        s.src["hidden_size"] = s.src["n_embed"]


def _bloom_widths(s: State) -> None:
    """bloom_hf_cs.py lines 470-690: HF BLOOM's MLP is 4 * hidden wide, its attention
    hidden-wide, and it has no embedding dropout (which defaults to ``dropout_rate``, lines
    685-687)."""
    cs = s.src
    if cs.get("filter_size", 4 * cs["hidden_size"]) != 4 * cs["hidden_size"]:
        raise MappingError("filter_size: HF BLOOM needs 4 * hidden_size")
    if cs.get("attention_inner_dim") not in (None, cs["hidden_size"]):
        raise MappingError("attention_inner_dim: HF BLOOM needs it equal to hidden_size")
    if cs.get("embedding_dropout_rate", cs["dropout_rate"]) != 0.0:
        raise MappingError("embedding_dropout_rate: HF BLOOM has no embedding dropout")


def _filter_size(s: State) -> None:
    """bloom_hf_cs.py lines 700-715, falcon_180b.py lines 449-465: ``filter_size`` = 4 *
    ``hidden_size``."""
    s.out["filter_size"] = 4 * s.src["hidden_size"]


_BIAS_FIELDS = ("use_projection_bias_in_attention", "use_ffn_bias_in_attention", "use_ffn_bias")


def falcon_hf_layout(hf: Config) -> tuple[int, bool]:
    """(KV groups, two layer norms) of a Falcon HF config.

    Model Zoo: falcon_180b.py lines 332-393 (``num_kv_heads``: 1 for the old multi-query
    layout, one per head for the old per-head layout) and 491-500 (``use_untied_layer_norm``
    when the new decoder architecture has ``num_ln_in_parallel_attn`` == 2)."""
    if hf["alibi"]:
        raise MappingError("alibi: CS Falcon supports rotary embeddings only (Model Zoo)")
    if not hf["parallel_attn"]:
        raise MappingError("parallel_attn: sequential Falcon blocks have no CS equivalent")
    heads = hf["num_attention_heads"]
    new = hf["new_decoder_architecture"]
    norms = hf["num_ln_in_parallel_attn"]
    if new:
        groups = hf["num_kv_heads"] if hf["num_kv_heads"] is not None else heads
        return groups, norms in (None, 2)
    if norms == 2:
        raise MappingError("num_ln_in_parallel_attn: 2 needs new_decoder_architecture")
    return (1 if hf["multi_query"] else heads), False


def falcon_cs_layout(cs: Config) -> tuple[int, bool]:
    """(KV groups, two layer norms) of a Falcon CS config (its defaults filled in)."""
    return cs["extra_attention_params"].get("num_kv_groups", 1), bool(cs["use_untied_layer_norm"])


def _falcon_rope(hf: Config) -> tuple[float, float]:
    """(theta, linear scaling factor) from ``rope_parameters`` (transformers 5) or the older
    ``rope_theta`` / ``rope_scaling``. Model Zoo: falcon_180b.py lines 642-681 (only the
    linear kind is carried here)."""
    params = dict(hf.get("rope_parameters") or {})
    legacy = dict(hf.get("rope_scaling") or {})
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    return float(theta), float(rope_factor(params, legacy))


def _falcon_layout_to_hf(s: State) -> None:
    """falcon_180b.py lines 395-424 (one bias switch), 449-465 (filter size), 502-538 (the
    layout: untied norms mean the new decoder architecture, else multi-query or per head, or
    the new architecture's one-norm variant for other KV groups)."""
    cs = s.src
    if len({cs[key] for key in _BIAS_FIELDS}) != 1:
        raise MappingError(f"{_BIAS_FIELDS[0]}: HF Falcon needs {', '.join(_BIAS_FIELDS)} equal")
    hidden, heads = cs["hidden_size"], cs["num_heads"]
    if cs["filter_size"] != 4 * hidden:
        raise MappingError(f"filter_size: HF Falcon needs 4 * hidden_size ({4 * hidden})")
    if cs.get("rotary_dim", hidden // heads) != hidden // heads:
        raise MappingError(f"rotary_dim: HF Falcon rotates whole heads ({hidden // heads})")
    groups, untied = falcon_cs_layout(cs)
    # One norm with KV groups neither 1 nor one per head: only the new architecture groups
    # them, with its one-norm variant (transformers' ``num_ln_in_parallel_attn: 1``, Falcon
    # 11B's layout); Model Zoo's converter refuses it.
    new = untied or groups not in (1, heads)
    check_scaling_type(cs)
    s.out.update(
        num_kv_heads=groups,
        new_decoder_architecture=new,
        multi_query=groups == 1,
        num_ln_in_parallel_attn=(2 if untied else 1) if new else None,
    )


def _falcon_layout_to_cs(s: State) -> None:
    """falcon_180b.py lines 134-551: HF's MLP 4 * hidden wide, GELU, the layout, RoPE."""
    hidden = s.src["hidden_size"]
    if s.src["ffn_hidden_size"] not in (None, 4 * hidden):
        raise MappingError(f"ffn_hidden_size: CS Falcon needs 4 * hidden_size ({4 * hidden})")
    if s.src["activation"] != "gelu":
        raise MappingError(f"activation: CS Falcon needs gelu, got {s.src['activation']!r}")
    falcon_hf_layout(s.src)
    _falcon_rope(s.src)


def _falcon_kv_groups(s: State) -> None:
    s.out["extra_attention_params"] = {"num_kv_groups": falcon_hf_layout(s.src)[0]}


def _falcon_rope_to_hf(s: State) -> None:
    """``rope_scaling`` null without scaling (``convert_pi``, lines 682-684), else the
    ``rope_parameters`` mapping (transformers 5 reads ``rope_scaling`` as its alias)."""
    theta = float(s.src["rope_theta"])
    rope, scaling = hf_rope(s.src["pos_scaling_factor"], rope_theta=theta)
    s.out.update(rope_theta=theta, rope_parameters=rope, rope_scaling=scaling)


def _falcon_rope_to_cs(s: State) -> None:
    theta, factor = _falcon_rope(s.src)
    s.out.update(rope_theta=theta, pos_scaling_factor=factor)


def _falcon_biases_to_hf(s: State) -> None:
    """HF's one ``bias``, and the three CS switches under their CS names as Model Zoo copies
    them (lines 215-229, ``convert_bias`` lines 411-424; transformers keeps them unused)."""
    s.out["bias"] = bool(s.src["use_ffn_bias"])
    s.out.update({key: s.src[key] for key in _BIAS_FIELDS})


def _falcon_biases_to_cs(s: State) -> None:
    s.out.update(dict.fromkeys(_BIAS_FIELDS, s.src["bias"]))
    s.out["use_untied_layer_norm"] = falcon_hf_layout(s.src)[1]


def _falcon_scaling_type(s: State) -> None:
    if _falcon_rope(s.src)[1] != 1.0:
        s.out["pos_scaling_type"] = "linear"


OPS: dict[str, tuple[Fn, Fn]] = {
    "codegen heads": (_codegen_heads, _codegen_heads),
    "neox rope": (_neox_rope_to_hf, _neox_rope_to_cs),
    "neox rotary dim": (None, _neox_rotary_dim),
    "neox scaling factor": (None, _neox_scaling_factor),
    "neox scaling type": (None, _neox_scaling_type),
    "n_embed": (None, _n_embed),
    "bloom widths": (_bloom_widths, None),
    "filter size": (None, _filter_size),
    "falcon layout": (_falcon_layout_to_hf, _falcon_layout_to_cs),
    "falcon kv groups": (None, _falcon_kv_groups),
    "falcon rope": (_falcon_rope_to_hf, _falcon_rope_to_cs),
    "falcon biases": (_falcon_biases_to_hf, _falcon_biases_to_cs),
    "falcon scaling type": (None, _falcon_scaling_type),
}
