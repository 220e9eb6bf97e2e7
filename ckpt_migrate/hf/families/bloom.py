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
from ckpt_migrate.catalogue.gptj_config import BLOOM_CS_DEFAULTS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.families import _decoder_common as dc
from ckpt_migrate.hf.layouts.gptj_like import cs_config, decoder_context, decoder_table, qkv_row
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx, fused_qkv, made_on_import
from ckpt_migrate.hf.table import plans, row
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)

CS_DEFAULTS = BLOOM_CS_DEFAULTS  # what the tensor context reads the CS config over
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


config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs


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
