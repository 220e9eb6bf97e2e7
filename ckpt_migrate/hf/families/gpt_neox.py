"""GPT-NeoX: Hugging Face ``GPTNeoXForCausalLM`` / ``GPTNeoXModel`` <-> Cerebras ``gpt-neox``
(the GPT-J backbone configured as NeoX: parallel residual with two layer norms).

Model Zoo's reference is ``tools/checkpoint_converters/gpt_neox_hf_cs.py`` at Release_2.10.0
(``Converter_GPT_Neox_Attention_HF_CS17`` lines 37-328, ``Converter_GPT_Neox_Headless_HF_CS17``
lines 331-501, ``Converter_GPT_Neox_LMHeadModel_HF_CS17`` lines 564-603,
``ConfigConverter_GPT_Neox_HF_CS17`` lines 656-870 and ``ConfigConverter_GPT_Neox_HF_CS21``
lines 1011-1093, which serves 2.1 to 2.9). HF fuses Q, K and V per head
(``query_key_value`` rows are ``[head][q|k|v][head_size]``) and rotates the first ``rotary_dim``
channels of a head as two halves, while CS rotates adjacent pairs: Model Zoo interleaves the
rotary rows of Q and K (lines 79-136).

The CS model is GPT-J's (``GPTNeoXModelConfig(GPTJModelConfig)``, ``models/nlp/gptj/model.py``
lines 402-410). Model Zoo writes the final norm under both of its names (``replace_final_norm``,
gpt_neox_hf_cs.py lines 345-354 and 421-435); its ``embed_out`` rule (lines 568-574) renames only
a head the HF file has. How ``_decoder_common`` carries the two: its docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.gptj_config import GPTJ_CS_DEFAULTS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.families import _decoder_common as dc
from ckpt_migrate.hf.families._decoder_common import HEAD
from ckpt_migrate.hf.layouts.gptj_like import (
    cs_config,
    decoder_context,
    decoder_table,
    qkv_row,
)
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx, deinterleave, fused_qkv
from ckpt_migrate.hf.ops import interleave as _interleave  # tests use it
from ckpt_migrate.hf.table import TO_CS, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)

CS_DEFAULTS = GPTJ_CS_DEFAULTS  # what the tensor context reads the CS config over
# (HF name inside ``layers.N.``, CS name inside ``transformer_decoder.layers.N.``).
# Model Zoo: gpt_neox_hf_cs.py lines 41-47 (dense) and 365-406 (norms, ffn).
LAYER_PAIRS = dc.megatron_layer(
    "attention.dense", [("input_layernorm", "norm1"), ("post_attention_layernorm", "norm3")]
)
# HF's fused Q, K, V inside a block (Model Zoo lines 48-68), and the plan's notes.
QKV = "layers.{i}.attention.query_key_value.{kind}"
QKV_NOTES = (
    "of the per-head fused query_key_value",
    "Q, K, V fused per head, rotary rows de-interleaved",
)
# Model Zoo: gpt_neox_hf_cs.py lines 335-354 (embeddings, final norm).
TOP_PAIRS = (
    ("embed_in.weight", "embedding_layer.word_embeddings.weight"),
    ("final_layer_norm.weight", "transformer_decoder.norm.weight"),
    ("final_layer_norm.bias", "transformer_decoder.norm.bias"),
)
LEGACY_HEAD = "embed_out.weight"  # the name in HF files (transformers 5 loads it as lm_head)


config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs


def _unfuse(x: np.ndarray, which: str, dims: Mapping[str, Any]) -> np.ndarray:
    """Model Zoo: gpt_neox_hf_cs.py lines 156-216, ``query_key_value`` viewed as
    [heads, 3, head_size, ...]; Q and K get their rotary rows interleaved (lines 79-104,
    :func:`~ckpt_migrate.hf.ops.interleave`), V not."""
    heads, rotary_dim = dims["heads"], dims["rotary_dim"]
    t = x.reshape(heads, 3, -1, *x.shape[1:])[:, "qkv".index(which)]
    if which != "v":
        t = _interleave(t, rotary_dim)
    return np.ascontiguousarray(t.reshape(-1, *x.shape[1:]))


def _fuse(q: np.ndarray, k: np.ndarray, v: np.ndarray, dims: Mapping[str, Any]) -> np.ndarray:
    """Model Zoo: gpt_neox_hf_cs.py lines 218-303, the inverse of :func:`_unfuse` (lines
    106-136, :func:`~ckpt_migrate.hf.ops.deinterleave`)."""
    heads, rotary_dim = dims["heads"], dims["rotary_dim"]
    rest = q.shape[1:]
    parts = [t.reshape(heads, -1, *rest) for t in (q, k, v)]
    parts[0] = deinterleave(parts[0], rotary_dim)
    parts[1] = deinterleave(parts[1], rotary_dim)
    return np.concatenate(parts, axis=1).reshape(-1, *rest)


TABLE = decoder_table(
    TOP_PAIRS,
    LAYER_PAIRS,
    "layers",
    [qkv_row(QKV, fused_qkv(_unfuse, _fuse, QKV_NOTES))],
)


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: gpt_neox_hf_cs.py lines 331-419 and 564-603, renames (of whichever copy of
    the embeddings and the final norm exists) and Q/K/V unfusing and fusing, the final norm
    under both names (lines 421-435); a headless model gets a new head (lines 475-490): the
    embeddings when tied, else N(0, 0.02). The HF head is ``lm_head`` (``embed_out`` before
    transformers 5) on import; an untied head is exported as ``embed_out.weight``, the name
    Model Zoo writes and transformers' ``save_pretrained`` still saves (it reads it back as
    ``lm_head``)."""
    cfg = cs_config(direction, config, name, config_to_cs, config_to_hf, CS_DEFAULTS)
    head = LEGACY_HEAD
    if direction == TO_CS and (LEGACY_HEAD not in shapes or HEAD in shapes):
        head = HEAD
    dims = {"heads": cfg["num_heads"], "rotary_dim": cfg["rotary_dim"], "hf_head": head}
    return decoder_context(shapes, cfg, name, "gpt_neox.", dims=dims)


plan_to_hf, plan_to_cs = plans(TABLE, context)
