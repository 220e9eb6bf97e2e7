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
from ckpt_migrate.catalogue.config import CS
from ckpt_migrate.catalogue.gptj_config import FALCON_CS_DEFAULTS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.config_gptj import falcon_cs_layout
from ckpt_migrate.hf.families import _decoder_common as dc
from ckpt_migrate.hf.families._decoder_common import EMBED
from ckpt_migrate.hf.layouts.gptj_like import decoder_context, decoder_table, qkv_row
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx, deinterleave, fused_qkv
from ckpt_migrate.hf.ops import interleave as _interleave  # tests use it
from ckpt_migrate.hf.table import BOTH, TO_CS, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)

CS_DEFAULTS = FALCON_CS_DEFAULTS  # what the tensor context reads the CS config over
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


config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs


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
        cfg = config_table.source(CS, config, name)
        groups, untied = falcon_cs_layout(cfg)
        bias = bool(cfg["use_ffn_bias"])
    heads, head_dim = cfg["num_heads"], cfg["hidden_size"] // cfg["num_heads"]
    rows = {"q": heads * head_dim, "k": groups * head_dim, "v": groups * head_dim}
    dims = {"groups": groups, "head_dim": head_dim, "rows": rows}
    flags = frozenset(({"untied"} if untied else set()) | ({"bias"} if bias else set()))
    return decoder_context(shapes, cfg, name, "transformer.", dims=dims, flags=flags)


plan_to_hf, plan_to_cs = plans(TABLE, context)
