"""Falcon: Hugging Face ``FalconForCausalLM`` / ``FalconModel`` <-> Cerebras ``falcon``.

Model Zoo's reference at Release_2.10.0: ``tools/checkpoint_converters/falcon.py`` picks the
converter by the HF config (lines 164-199, 244-258): ``model_type: falcon`` (the transformers
class) always takes the "180B" one, ``falcon_180b.py`` (``ConfigConverter_Falcon_180B_HF_CS20``
lines 134-551, ``..._HF_CS21`` lines 612-693 for 2.1 to 2.9, layer norms lines 36-131), built
on ``falcon_40b.py``'s grouped fused QKV (``Converter_Falcon_40B_Attention_HF_CS20`` lines
35-301, model rules lines 327-405). The 7B/40B converters serve the remote-code ``RWModel``
configs (``n_head_kv``), which transformers does not have; they are not served here.

``query_key_value`` rows are ``[kv group][its query heads..., key, value][head_dim]``, which
covers multi-query (one group), grouped-query (new decoder architecture) and the old per-head
``[q, k, v]`` layout (one group per head). HF rotates head halves, CS adjacent pairs: Model Zoo
interleaves the Q and K rows of every head (``rotary_dim`` = head size).

The CS model is GPT-J's (``FalconModelConfig(GPTJModelConfig)``, ``models/nlp/falcon/model.py``
lines 20-27); Model Zoo's ``replace_final_norm`` (falcon_40b.py lines 394-401 and 407-421, rules
the 180B converters include) writes the final norm under ``ln_f`` too, and its ``lm_head`` rule
(falcon_180b.py lines 756-759) renames only a head the HF file has (``_decoder_common``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ckpt_migrate import catalogue
from ckpt_migrate.hf.families import _decoder_common as dc
from ckpt_migrate.hf.families._decoder_common import EMBED
from ckpt_migrate.hf.layouts.gptj_like import decoder_context, decoder_table, qkv_row
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import Ctx, deinterleave, fused_qkv
from ckpt_migrate.hf.ops import interleave as _interleave  # tests use it
from ckpt_migrate.hf.table import BOTH, TO_CS, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
MODEL_TYPE = HF_MODEL_TYPES[0]
# The transformers class of each name (``config.json`` ``architectures``).
ARCHITECTURES = catalogue.hf_architectures(__name__)
LABEL = "Falcon"  # in messages

# Model Zoo: falcon_180b.py lines 267-291 and 631-635, HF defaults filled in first.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 65024,
    "hidden_size": 4544,
    "num_hidden_layers": 32,
    "num_attention_heads": 71,
    "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.02,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "num_kv_heads": None,
    "alibi": False,
    "new_decoder_architecture": False,
    "multi_query": True,
    "parallel_attn": True,
    "bias": False,
    "max_position_embeddings": 2048,
    "rope_scaling": None,
    "num_ln_in_parallel_attn": None,
    "ffn_hidden_size": None,
    "activation": "gelu",
    "tie_word_embeddings": True,
}
# Model Zoo: falcon_180b.py lines 292-305 and 636-640, CS defaults filled in first.
CS_DEFAULTS: dict[str, Any] = {
    "position_embedding_type": "rotary",
    "rope_theta": 10000.0,
    "embedding_dropout_rate": 0.1,
    "share_embedding_weights": True,
    "nonlinearity": "gelu",
    "max_position_embeddings": 1024,
    "attention_module": "aiayn_attention",
    "attention_type": "scaled_dot_product",
    "use_untied_layer_norm": False,
    "extra_attention_params": {"num_kv_groups": 1},
    "pos_scaling_factor": 1.0,
    "use_bias_in_output": False,
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": False,
    "attention_dropout_rate": 0.0,
    "residual_dropout_rate": 0.0,
    "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.02,
    "norm_type": "layernorm",
}
# Model Zoo: falcon_180b.py lines 181-264 and 502-512, CS fields that must hold these values.
CS_FIXED: dict[str, Any] = {
    "position_embedding_type": "rotary",
    "nonlinearity": "gelu",
    "use_bias_in_output": False,
    "attention_module": "multiquery_attention",
    "attention_type": "scaled_dot_product",
    "embedding_dropout_rate": 0.0,
    "norm_type": "layernorm",
}
# Model Zoo: falcon_40b.py lines 334-342 (embeddings) and 395-401 (final norm).
TOP_PAIRS = (
    ("word_embeddings.weight", EMBED),
    ("ln_f.weight", "transformer_decoder.norm.weight"),
    ("ln_f.bias", "transformer_decoder.norm.bias"),
)
# HF's grouped fused Q, K, V inside a block (Model Zoo: falcon_40b.py lines 48-68), and the
# plan's notes.
QKV = "h.{i}.self_attention.query_key_value.{kind}"
QKV_NOTES = (
    "of the grouped fused query_key_value",
    "Q, K, V fused per KV group, rotary rows de-interleaved",
)
BIAS_FIELDS = ("use_projection_bias_in_attention", "use_ffn_bias_in_attention", "use_ffn_bias")


def _hf_layout(hf: Mapping[str, Any]) -> tuple[int, bool]:
    """(KV groups, two layer norms) of an HF config.

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


def _rope(hf: Mapping[str, Any]) -> tuple[float, float]:
    """(theta, linear scaling factor) from ``rope_parameters`` (transformers 5) or the older
    ``rope_theta`` / ``rope_scaling``. Model Zoo: falcon_180b.py lines 642-681 (only the
    linear kind is carried here)."""
    params = dict(hf.get("rope_parameters") or {})
    legacy = dict(hf.get("rope_scaling") or {})
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    return float(theta), float(dc.rope_factor(params, legacy))


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: falcon_180b.py lines 134-551 and 612-693 (rules, defaults, post-conversion
    ``rotary_dim`` = head size, ``filter_size`` = 4 * ``hidden_size``)."""
    dc.check_name(name, NAMES)
    hf = dc.hf_with_defaults(hf_config, HF_DEFAULTS, MODEL_TYPE)
    hidden = hf["hidden_size"]
    if hf["ffn_hidden_size"] not in (None, 4 * hidden):
        raise MappingError(f"ffn_hidden_size: CS Falcon needs 4 * hidden_size ({4 * hidden})")
    if hf["activation"] != "gelu":
        raise MappingError(f"activation: CS Falcon needs gelu, got {hf['activation']!r}")
    groups, untied = _hf_layout(hf)
    theta, factor = _rope(hf)
    cs = {
        "vocab_size": hf["vocab_size"],
        "hidden_size": hidden,
        "filter_size": 4 * hidden,
        "num_heads": hf["num_attention_heads"],
        "extra_attention_params": {"num_kv_groups": groups},
        "num_hidden_layers": hf["num_hidden_layers"],
        "max_position_embeddings": hf["max_position_embeddings"],
        "position_embedding_type": "rotary",
        "rope_theta": theta,
        "pos_scaling_factor": factor,
        "rotary_dim": hidden // hf["num_attention_heads"],
        "share_embedding_weights": hf["tie_word_embeddings"],
        "attention_dropout_rate": hf["attention_dropout"],
        "residual_dropout_rate": hf["hidden_dropout"],
        "layer_norm_epsilon": hf["layer_norm_epsilon"],
        "initializer_range": hf["initializer_range"],
        **dict.fromkeys(BIAS_FIELDS, hf["bias"]),
        "use_untied_layer_norm": untied,
        # Model Zoo: falcon_180b.py lines 314-330, the post-conversion CS defaults.
        "embedding_dropout_rate": 0.0,
        "nonlinearity": "gelu",
        "attention_module": "multiquery_attention",
        "attention_type": "scaled_dot_product",
        "loss_scaling": "num_tokens",
        "use_bias_in_output": False,
    }
    if factor != 1.0:
        cs["pos_scaling_type"] = "linear"
    return cs


def _cs_layout(cs: Mapping[str, Any]) -> tuple[int, bool]:
    """(KV groups, two layer norms) of a CS config, checked as Model Zoo does
    (falcon_180b.py lines 395-424 biases, 449-465 filter size, 502-538 layout)."""
    required = ("hidden_size", "num_heads", "filter_size")
    dc.check_cs(cs, LABEL, CS_FIXED, CS_DEFAULTS, name=NAMES[0], required=required)
    if len({dc.get(cs, key, CS_DEFAULTS) for key in BIAS_FIELDS}) != 1:
        raise MappingError(f"{BIAS_FIELDS[0]}: HF Falcon needs {', '.join(BIAS_FIELDS)} equal")
    hidden, heads = cs["hidden_size"], cs["num_heads"]
    if cs["filter_size"] != 4 * hidden:
        raise MappingError(f"filter_size: HF Falcon needs 4 * hidden_size ({4 * hidden})")
    if cs.get("rotary_dim", hidden // heads) != hidden // heads:
        raise MappingError(f"rotary_dim: HF Falcon rotates whole heads ({hidden // heads})")
    groups = dc.get(cs, "extra_attention_params", CS_DEFAULTS).get("num_kv_groups", 1)
    untied = bool(dc.get(cs, "use_untied_layer_norm", CS_DEFAULTS))
    if not untied and groups not in (1, heads):
        raise MappingError(
            "use_untied_layer_norm: false needs num_kv_groups of 1 or num_heads in HF Falcon"
        )
    dc.check_scaling_type(cs)
    return groups, untied


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: falcon_180b.py lines 134-551 and 612-693 read from CS to HF (lines 514-538:
    untied norms mean the new decoder architecture, else multi-query or per-head MHA).

    As Model Zoo writes them: the three CS bias switches under their CS names (its rules, lines
    215-229 with ``convert_bias`` lines 411-424, copy them so; transformers keeps them as unused
    attributes) besides HF's ``bias``, which Model Zoo leaves out; ``rope_scaling`` null without
    scaling (``convert_pi``, lines 682-684), else the ``rope_parameters`` mapping (transformers 5
    reads ``rope_scaling`` as its alias, so the two must agree) where Model Zoo writes the legacy
    ``{"type": "linear", "factor": f}`` (lines 685-689)."""
    dc.check_name(name, NAMES)
    groups, untied = _cs_layout(cs_model)
    cs = {**CS_DEFAULTS, **cs_model}
    rope, scaling = dc.hf_rope(cs["pos_scaling_factor"], rope_theta=float(cs["rope_theta"]))
    return {
        **dc.hf_header(ARCHITECTURES, name, MODEL_TYPE),
        "vocab_size": cs["vocab_size"],
        "hidden_size": cs["hidden_size"],
        "ffn_hidden_size": cs["filter_size"],
        "activation": "gelu",
        "num_attention_heads": cs["num_heads"],
        "num_kv_heads": groups,
        "num_hidden_layers": cs["num_hidden_layers"],
        "max_position_embeddings": cs["max_position_embeddings"],
        "attention_dropout": cs["attention_dropout_rate"],
        "hidden_dropout": cs["residual_dropout_rate"],
        "layer_norm_epsilon": cs["layer_norm_epsilon"],
        "initializer_range": cs["initializer_range"],
        "bias": bool(cs["use_ffn_bias"]),
        "alibi": False,
        "parallel_attn": True,
        "new_decoder_architecture": untied,
        "multi_query": groups == 1,
        "num_ln_in_parallel_attn": 2 if untied else None,
        "rope_theta": float(cs["rope_theta"]),
        "rope_parameters": rope,
        "rope_scaling": scaling,
        "tie_word_embeddings": cs["share_embedding_weights"],
        **{key: cs[key] for key in BIAS_FIELDS},
    }


def _unfuse(x: np.ndarray, which: str, dims: Mapping[str, Any]) -> np.ndarray:
    """Model Zoo: falcon_40b.py lines 128-201, ``query_key_value`` viewed as
    [groups, group size + 2, head_dim, ...]: the group's query heads, then its key, then its
    value; Q and K get their rotary rows interleaved (lines 71-95,
    :func:`~ckpt_migrate.hf.ops.interleave`)."""
    groups, head_dim = dims["groups"], dims["head_dim"]
    rest = x.shape[1:]
    t = x.reshape(groups, -1, head_dim, *rest)
    size = t.shape[1] - 2
    part = {"q": t[:, :size], "k": t[:, size : size + 1], "v": t[:, size + 1 :]}[which]
    part = part.reshape(-1, head_dim, *rest)
    if which != "v":
        part = _interleave(part, head_dim)
    return np.ascontiguousarray(part.reshape(-1, *rest))


def _fuse(q: np.ndarray, k: np.ndarray, v: np.ndarray, dims: Mapping[str, Any]) -> np.ndarray:
    """Model Zoo: falcon_40b.py lines 203-283, the inverse of :func:`_unfuse` (lines 97-126,
    :func:`~ckpt_migrate.hf.ops.deinterleave`)."""
    groups, head_dim = dims["groups"], dims["head_dim"]
    rest = q.shape[1:]
    q = deinterleave(q.reshape(-1, head_dim, *rest), head_dim)
    k = deinterleave(k.reshape(-1, head_dim, *rest), head_dim)
    parts = [t.reshape(groups, -1, head_dim, *rest) for t in (q, k, v)]
    return np.concatenate(parts, axis=1).reshape(-1, *rest)


# (HF, CS[, when]) names inside a block. Model Zoo: falcon_180b.py lines 48-127 (norms: two
# with untied layer norms, else one), falcon_40b.py lines 372-393 (mlp; dense via the attention
# rules, lines 41-47); the linear layers' biases only with ``use_ffn_bias``.
_LINEAR = (
    ("self_attention.dense", "self_attn.proj_output_dense_layer"),
    ("mlp.dense_h_to_4h", "ffn.ffn.0.linear_layer"),
    ("mlp.dense_4h_to_h", "ffn.ffn.1.linear_layer"),
)
LAYER_PAIRS = (
    *((*pair, "untied") for pair in dc.params([("ln_attn", "norm1"), ("ln_mlp", "norm3")])),
    *((*pair, "!untied") for pair in dc.params([("input_layernorm", "norm1")])),
    *((f"{h}.{k}", f"{c}.{k}", "bias" if k == "bias" else None) for h, c in _LINEAR for k in BOTH),
)
_OP = fused_qkv(_unfuse, _fuse, QKV_NOTES, lambda _, which, dims: dims["rows"][which])
TABLE = decoder_table(
    TOP_PAIRS,
    LAYER_PAIRS,
    attention=[qkv_row(QKV, _OP, ("weight",)), qkv_row(QKV, _OP, ("bias",), when="bias")],
)


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: falcon_180b.py lines 36-131 and 568-588, renames (``norm1``/``norm3`` are
    ``ln_attn``/``ln_mlp`` with untied norms, else ``input_layernorm``; on export of whichever
    copy of the embeddings and the final norm exists) and grouped QKV unfusing and fusing, the
    final norm under both names (falcon_40b.py lines 407-421); a headless model gets a new head
    (falcon_40b.py lines 461-481): the embeddings when tied, else N(0, 0.02) (lines 471-478); a
    tied head is not written."""
    if direction == TO_CS:
        cfg = config_to_cs(config, name)
        groups, bias = cfg["extra_attention_params"]["num_kv_groups"], cfg["use_ffn_bias"]
        untied = cfg["use_untied_layer_norm"]
    else:
        dc.check_name(name, NAMES)
        groups, untied = _cs_layout(config)
        cfg = {**CS_DEFAULTS, **config}
        bias = bool(cfg["use_ffn_bias"])
    heads, head_dim = cfg["num_heads"], cfg["hidden_size"] // cfg["num_heads"]
    rows = {"q": heads * head_dim, "k": groups * head_dim, "v": groups * head_dim}
    dims = {"groups": groups, "head_dim": head_dim, "rows": rows}
    flags = frozenset(({"untied"} if untied else set()) | ({"bias"} if bias else set()))
    return decoder_context(shapes, cfg, name, "transformer.", dims=dims, flags=flags)


plan_to_hf, plan_to_cs = plans(TABLE, context)
