"""BLOOM: Hugging Face ``BloomForCausalLM`` / ``BloomModel`` <-> Cerebras ``bloom`` (the GPT-2
backbone configured with ALiBi and an embedding layer norm).

Model Zoo's reference is ``tools/checkpoint_converters/bloom_hf_cs.py`` at Release_2.10.0
(``Converter_Bloom_Attention_HF_CS17`` lines 41-201, ``Converter_BloomModel_HF_CS17`` lines
204-417, ``ConfigConverter_BloomModel_HF_CS17`` lines 460-715, the CS21 classes lines 946-1062
for 2.1 to 2.9). HF fuses Q, K and V per head (``query_key_value`` rows are
``[head][q|k|v][head_dim]``); ALiBi has no weights in HF, while CS stores its slopes, which
Model Zoo computes on the way to CS and drops on the way back (lines 309-329, 970-982).

The CS model is GPT-2's (``BloomModelConfig(GPT2ModelConfig)``, ``models/nlp/bloom/model.py``
lines 20-27), one final norm under ``ln_f`` and ``transformer_decoder.norm``
(``models/nlp/gpt2/gpt2_model.py`` lines 910 and 965), both written by Model Zoo
(``replace_final_norm``, bloom_hf_cs.py lines 276-282 and 293-307). Its ``lm_head`` rule (lines
1020-1023) renames only a head the HF file has; see ``_decoder_common`` for both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ckpt_migrate import catalogue
from ckpt_migrate.hf.families import _decoder_common as dc
from ckpt_migrate.hf.layouts.gptj_like import cs_config, decoder_context, decoder_table, qkv_row
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import Ctx, fused_qkv, made_on_import
from ckpt_migrate.hf.table import plans, row
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
MODEL_TYPE = HF_MODEL_TYPES[0]
# The transformers class of each name (``config.json`` ``architectures``).
ARCHITECTURES = catalogue.hf_architectures(__name__)
LABEL = "BLOOM"  # in messages

# Model Zoo: bloom_hf_cs.py lines 612-625, HF defaults filled in first.
HF_DEFAULTS: dict[str, Any] = {
    "tie_word_embeddings": True,
    "vocab_size": 250880,
    "hidden_size": 64,
    "n_layer": 2,
    "n_head": 8,
    "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.02,
    "apply_residual_connection_post_layernorm": False,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
}
# Model Zoo: bloom_hf_cs.py lines 626-628, CS defaults filled in first.
CS_DEFAULTS: dict[str, Any] = {"share_embedding_weights": True, "embedding_layer_norm": False}
# Model Zoo: bloom_hf_cs.py lines 470-609 and 915-924, CS fields that must hold these values
# when present (``embedding_layer_norm`` always, through its default).
CS_FIXED: dict[str, Any] = {
    "position_embedding_type": "alibi",
    "use_position_embedding": True,
    "embedding_layer_norm": True,
    "attention_type": "scaled_dot_product",
    "attention_module": "aiayn_attention",
    "use_rms_norm": False,
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True,
    "nonlinearity": "gelu",
    "norm_first": True,
    "use_bias_in_output": False,
    "fixed_sparse_attention": None,
    "use_ff_layer1_dropout": False,
    "alibi_trainable_slopes": False,
    "norm_type": "layernorm",
}
# (HF name inside ``h.N.``, CS name inside ``transformer_decoder.layers.N.``).
# Model Zoo: bloom_hf_cs.py lines 47-53 (dense) and 236-275 (norms, mlp).
LAYER_PAIRS = dc.megatron_layer(
    "self_attention.dense", [("input_layernorm", "norm1"), ("post_attention_layernorm", "norm3")]
)
# HF's fused Q, K, V inside a block (Model Zoo lines 54-74), and the plan's notes.
QKV = "h.{i}.self_attention.query_key_value.{kind}"
QKV_NOTES = ("of the per-head fused query_key_value", "Q, K, V fused per head")
# Model Zoo: bloom_hf_cs.py lines 209-226 and 276-282 (embeddings, their norm, final norm).
TOP_PAIRS = (
    ("word_embeddings.weight", "embedding_layer.word_embeddings.weight"),
    ("word_embeddings_layernorm.weight", "embedding_ln_f.weight"),
    ("word_embeddings_layernorm.bias", "embedding_ln_f.bias"),
    ("ln_f.weight", "transformer_decoder.norm.weight"),
    ("ln_f.bias", "transformer_decoder.norm.bias"),
)
SLOPES = "embedding_layer.position_embed_helper.slopes"  # 2.1+ (Model Zoo line 975)


def _check_cs(cs: Mapping[str, Any]) -> None:
    """Reject CS settings HF BLOOM cannot express, naming the field (Model Zoo lines 470-690)."""
    merged = {**CS_DEFAULTS, **cs}
    fixed = {k: v for k, v in CS_FIXED.items() if k in merged}
    dc.check_cs(cs, LABEL, fixed, CS_DEFAULTS, name=NAMES[0])
    required = ("hidden_size", "num_heads", "num_hidden_layers", "vocab_size", "dropout_rate")
    dc.require(cs, required, LABEL)
    if cs.get("filter_size", 4 * cs["hidden_size"]) != 4 * cs["hidden_size"]:
        raise MappingError("filter_size: HF BLOOM needs 4 * hidden_size")
    if cs.get("attention_inner_dim") not in (None, cs["hidden_size"]):
        raise MappingError("attention_inner_dim: HF BLOOM needs it equal to hidden_size")
    # Model Zoo lines 685-687: the embedding dropout defaults to dropout_rate, and must be 0.
    if cs.get("embedding_dropout_rate", cs["dropout_rate"]) != 0.0:
        raise MappingError("embedding_dropout_rate: HF BLOOM has no embedding dropout")


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: bloom_hf_cs.py lines 460-715 (rules, defaults, ``n_embed`` alias, post
    ``filter_size`` = 4 * ``hidden_size``). ``embedding_dropout_rate: 0.0`` is written too so
    that the CS config converts back (Model Zoo would default it to ``dropout_rate``)."""
    dc.check_name(name, NAMES)
    hf = dc.hf_with_defaults(hf_config, HF_DEFAULTS, MODEL_TYPE)
    if hf.get("n_embed") is not None:
        hf["hidden_size"] = hf["n_embed"]
    if hf["apply_residual_connection_post_layernorm"]:
        raise MappingError("apply_residual_connection_post_layernorm: CS BLOOM needs false")
    return {
        "vocab_size": hf["vocab_size"],
        "hidden_size": hf["hidden_size"],
        "num_heads": hf["n_head"],
        "num_hidden_layers": hf["n_layer"],
        "share_embedding_weights": hf["tie_word_embeddings"],
        "layer_norm_epsilon": hf["layer_norm_epsilon"],
        "initializer_range": hf["initializer_range"],
        "attention_dropout_rate": hf["attention_dropout"],
        "dropout_rate": hf["hidden_dropout"],
        "filter_size": 4 * hf["hidden_size"],
        "embedding_dropout_rate": 0.0,
        # Model Zoo: bloom_hf_cs.py lines 630-641, the post-conversion CS defaults.
        "position_embedding_type": "alibi",
        "use_ffn_bias_in_attention": True,
        "use_projection_bias_in_attention": True,
        "use_ffn_bias": True,
        "use_bias_in_output": False,
        "attention_type": "scaled_dot_product",
        "embedding_layer_norm": True,
    }


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: bloom_hf_cs.py lines 460-715 read from CS to HF (``attention_dropout``
    defaults to ``dropout_rate``, lines 688-689)."""
    dc.check_name(name, NAMES)
    _check_cs(cs_model)
    cs = {**CS_DEFAULTS, **cs_model}
    return {
        **dc.hf_header(ARCHITECTURES, name, MODEL_TYPE),
        "vocab_size": cs["vocab_size"],
        "hidden_size": cs["hidden_size"],
        "n_layer": cs["num_hidden_layers"],
        "n_head": cs["num_heads"],
        "layer_norm_epsilon": cs.get("layer_norm_epsilon", 1e-5),
        "initializer_range": cs.get("initializer_range", 0.02),
        "hidden_dropout": cs["dropout_rate"],
        "attention_dropout": cs.get("attention_dropout_rate", cs["dropout_rate"]),
        "apply_residual_connection_post_layernorm": False,
        "tie_word_embeddings": cs["share_embedding_weights"],
    }


def alibi_slopes(heads: int) -> list[float]:
    """Model Zoo: bloom_hf_cs.py lines 309-329, the ALiBi paper's slopes; for a head count that
    is not a power of two, the closest power's slopes then every other one of twice that."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(heads).is_integer():
        return power_of_2(heads)
    closest = 2 ** math.floor(math.log2(heads))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: heads - closest]


def _unfuse(x: np.ndarray, which: str, dims: Mapping[str, Any]) -> np.ndarray:
    """Model Zoo: bloom_hf_cs.py lines 95-127, ``query_key_value`` viewed as
    [heads, 3, head_dim, ...]; Q, K, V are 0, 1, 2."""
    heads = dims["heads"]
    part = x.reshape(heads, 3, -1, *x.shape[1:])[:, "qkv".index(which)]
    return np.ascontiguousarray(part).reshape(-1, *x.shape[1:])


def _fuse(q: np.ndarray, k: np.ndarray, v: np.ndarray, dims: Mapping[str, Any]) -> np.ndarray:
    """Model Zoo: bloom_hf_cs.py lines 129-168, the inverse of :func:`_unfuse`."""
    heads = dims["heads"]
    parts = [t.reshape(heads, 1, -1, *t.shape[1:]) for t in (q, k, v)]
    return np.concatenate(parts, axis=1).reshape(-1, *q.shape[1:])


def _slopes(dims: Mapping[str, Any]) -> np.ndarray:
    """The ALiBi slopes as the CS model stores them: float32 [heads, 1] (lines 387-391)."""
    heads = dims["heads"]
    return np.asarray(alibi_slopes(heads), dtype=np.float32).reshape(heads, 1)


TABLE = decoder_table(
    TOP_PAIRS,
    LAYER_PAIRS,
    attention=[qkv_row(QKV, fused_qkv(_unfuse, _fuse, QKV_NOTES))],
    made=[row(SLOPES, (), made_on_import(_slopes, "ALiBi slopes"))],
)


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: bloom_hf_cs.py lines 204-399 and 724-786, renames (on export of whichever
    copy of the embeddings and the final norm exists), Q/K/V unfusing and fusing, the ALiBi
    slopes made on import (lines 387-391 and 774-778) and dropped on export (HF recomputes
    them), the final norm under both names (lines 293-307); a headless model gets a new head
    (lines 368-383): the embeddings when tied, else N(0, 0.02) (lines 378-382); a tied head is
    not written."""
    cfg = cs_config(direction, config, name, config_to_cs, config_to_hf, CS_DEFAULTS)
    return decoder_context(shapes, cfg, name, "transformer.", dims={"heads": cfg["num_heads"]})


plan_to_hf, plan_to_cs = plans(TABLE, context)
