"""CodeGen: Hugging Face ``CodeGenForCausalLM`` / ``CodeGenModel`` <-> Cerebras ``codegen``
(the CodeGen backbone configured as CodeGen).

Model Zoo's reference is ``tools/checkpoint_converters/salesforce_codegen_hf_cs.py`` at
Release_2.10.0 (``Converter_Codegen_Attention_HF_CS17`` lines 37-242,
``Converter_Codegen_Headless_HF_CS17`` lines 245-400, ``Converter_Codegen_LMHeadModel_HF_CS17``
lines 463-499, ``ConfigConverter_Codegen_Model_HF_CS17`` lines 552-740; the CS20 classes lines
779-858 serve 2.0 to 2.9 with ``norm_type: layernorm`` asserted). HF packs Q, K and V into one
``qkv_proj`` laid out for ``mp_num = 4`` model-parallel shards, each holding its slice of Q, V
and K in that order; everything else is a rename, and HF CodeGen rotates every two channels like
CS, so no rotary permutation.

The CS model is GPT-J's (``registry.py`` line 344, maps codegen to gptj): its final norm's two
names are both written by Model Zoo (``replace_final_norm``, salesforce_codegen_hf_cs.py lines
257-264 and 320-334), whose ``lm_head`` rule (lines 466-470) renames only a head the HF file has;
``_decoder_common`` carries both each way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.gptj_config import GPTJ_CS_DEFAULTS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.families import _decoder_common as dc
from ckpt_migrate.hf.layouts.gptj_like import cs_config, decoder_context, decoder_table, qkv_row
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx, fused_qkv
from ckpt_migrate.hf.table import plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
MP_NUM = 4  # HF CodeGen hard-codes 4 shards (Model Zoo line 40)
QKV_ORDER = {"q": 0, "v": 1, "k": 2}  # within a shard (Model Zoo lines 132-142)

CS_DEFAULTS = GPTJ_CS_DEFAULTS  # what the tensor context reads the CS config over
# (HF name inside a block ``h.N.``, CS name inside ``transformer_decoder.layers.N.``; Q, K and V
# are packed, :func:`_layout`). Model Zoo: salesforce_codegen_hf_cs.py lines 63-69 (out_proj) and
# 275-303 (norm, ffn: GPT-J-style names).
LAYER_PAIRS = dc.gptj_style_layer(
    ("attn.out_proj.weight", "self_attn.proj_output_dense_layer.weight")
)
# HF's packed Q, V, K inside a block (no bias; Model Zoo lines 42-62), and the plan's notes.
QKV = "h.{i}.attn.qkv_proj.{kind}"
QKV_NOTES = ("of the mp_num=4 packed qkv_proj", "Q, V, K packed per mp_num=4 shard")
# Model Zoo: salesforce_codegen_hf_cs.py lines 249-264 (embeddings, final norm).
TOP_PAIRS = dc.GPTJ_STYLE_TOP


config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs


def _unpack(x: np.ndarray, which: str) -> np.ndarray:
    """Model Zoo: salesforce_codegen_hf_cs.py lines 132-145, ``qkv_proj`` [3E, E] viewed as
    [4, 3E/4, E]; each shard's rows are its Q, V, K slices of E/4 rows."""
    dim = x.shape[-1]
    local = dim // MP_NUM
    start = QKV_ORDER[which] * local
    return np.ascontiguousarray(
        x.reshape(MP_NUM, -1, dim)[:, start : start + local].reshape(-1, dim)
    )


def _pack(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Model Zoo: salesforce_codegen_hf_cs.py lines 171-190, the inverse of :func:`_unpack`."""
    dim = q.shape[-1]
    parts = [t.reshape(MP_NUM, -1, dim) for t in (q, v, k)]
    return np.concatenate(parts, axis=1).reshape(-1, dim)


TABLE = decoder_table(
    TOP_PAIRS,
    LAYER_PAIRS,
    attention=[
        qkv_row(
            QKV,
            fused_qkv(lambda x, w, _: _unpack(x, w), lambda q, k, v, _: _pack(q, k, v), QKV_NOTES),
            ("weight",),
        )
    ],
)


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: salesforce_codegen_hf_cs.py lines 245-318 and 463-499, renames (of whichever
    copy of the embeddings and the final norm exists), the ``qkv_proj`` unpacking and packing
    (lines 132-217), the final norm under both names (lines 320-334); a headless model gets a
    new head (lines 374-392): the embeddings when tied, else N(0, 0.02), and a zero bias; a head
    bias CS lacks (``use_bias_in_output: false``) is written as the zeros HF would initialise
    it to."""
    cfg = cs_config(direction, config, name, config_to_cs, config_to_hf, CS_DEFAULTS)
    return decoder_context(shapes, cfg, name, "transformer.", bias=True)


plan_to_hf, plan_to_cs = plans(TABLE, context)
