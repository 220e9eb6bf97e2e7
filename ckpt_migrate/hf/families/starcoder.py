"""StarCoder and its fine-tunes (OctoCoder, WizardCoder, SQLCoder): HF ``GPTBigCodeForCausalLM``
(``-headless``: ``GPTBigCodeModel``) <-> CS ``GPT2LMHeadModel`` configured as StarCoder.

Model Zoo: starcoder.py (tag Release_2.10.0; registry.py lines 300-331 alias the fine-tunes to
it). GPTBigCode uses ``nn.Linear`` (no Conv1D transposes), learned positions and multi-query
attention; ``c_attn`` packs ``[q (hidden), k (head_dim), v (head_dim)]``. The GPT-2 config
rules Model Zoo's converter inherits (``Converter_GPT2Model_HF_CS17``) are in ``_gpt2_layout.py``,
the tensor table in ``hf/layouts/gpt2_like.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.hf import mup
from ckpt_migrate.hf.families._gpt2_layout import (
    GPT2_CS_FIXED,
    GPT2_RENAMES,
    check_name,
    expect,
    with_defaults,
)
from ckpt_migrate.hf.layouts import gpt2_like
from ckpt_migrate.hf.layouts.gpt2_like import hf_prefix, layout_context
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import BOTH, TO_CS, TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)

# (HF key, CS key) of the config rules that only rename (starcoder.py lines 407-519): GPT-2's
# and the softmax precision.
_RENAMES: tuple[tuple[str, str], ...] = (
    *GPT2_RENAMES,
    ("attention_softmax_in_fp32", "attention_softmax_fp32"),
)
# CS fields the rules accept only with one value (assert_factory_fn, lines 398-519).
_CS_FIXED: dict[str, Any] = {**GPT2_CS_FIXED, "scale_qk_dot_by_layer_idx": False}
# pre_convert_defaults / post_convert_defaults, starcoder.py lines 522-584.
_HF_PRE = {
    "tie_word_embeddings": True,
    "multi_query": True,
    "attn_pdrop": 0.0,
    "scale_attn_weights": True,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "n_inner": 24576,
    "n_embd": 6144,
    "n_head": 48,
    "n_layer": 40,
    "vocab_size": 49152,
    "n_positions": 8192,
}
_HF_POST = {
    "model_type": "gpt_bigcode",
    "validate_runner_input": True,
    "use_cache": True,
    "transformers_version": "4.28.1",
    "summary_use_proj": True,
    "summary_type": "cls_index",
    "inference_runner": 0,
    "eos_token_id": 0,
    "bos_token_id": 0,
    "max_sequence_length": None,
    "max_batch_size": None,
}
_CS_PRE = {
    "share_embedding_weights": True,
    "attention_dropout_rate": 0.0,
    "attention_module": "multiquery_attention",
    "attention_type": "scaled_dot_product",
    "scale_qk_dot_by_layer_idx": False,
    "dropout_rate": 0.0,
    "embedding_dropout_rate": 0.0,
    "filter_size": 24576,
    "hidden_size": 6144,
    "max_position_embeddings": 8192,
    "num_heads": 48,
    "num_hidden_layers": 40,
    "vocab_size": 49152,
}
_CS_POST = {
    "position_embedding_type": "learned",
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True,
    "nonlinearity": "gelu",
    "use_bias_in_output": False,
    "loss_scaling": "num_tokens",
}


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: starcoder.py lines 394-645 (``ConfigConverter_StarcoderModel_HF_CS20``, which
    the CS21 class keeps, lines 665-689). ``n_inner: null`` becomes ``4 * n_embd`` (lines
    637-639); ``scale_attn_weights`` and ``multi_query`` give ``attention_type``,
    ``attention_module`` and ``extra_attention_params`` (lines 595-608). HF keys no rule names
    are dropped, as ``drop_unmatched_keys`` does."""
    check_name(name, NAMES)
    hf = with_defaults(hf_config, _HF_PRE)
    expect(hf, "model_type", ("gpt_bigcode",), "HF")
    if hf.get("n_inner") is None:
        hf["n_inner"] = 4 * hf["n_embd"]
    cs = {c: hf[h] for h, c in _RENAMES if h in hf}
    cs["attention_type"] = "scaled_dot_product" if hf["scale_attn_weights"] else "dot_product"
    cs["attention_module"] = "multiquery_attention" if hf["multi_query"] else "aiayn_attention"
    if hf["multi_query"]:
        cs["extra_attention_params"] = {"num_kv_groups": 1}
    return {**cs, **{k: v for k, v in _CS_POST.items() if k not in cs}}


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: starcoder.py lines 394-645, CS -> HF: the fixed-value fields are asserted,
    ``attention_type`` gives ``scale_attn_weights`` and ``attention_module`` ``multi_query``
    (lines 609-627). muP configs are refused (the export folds them to sP first, ``hf/mup.py``,
    as Model Zoo's mup.py does), as are KV groups other than 1 (GPTBigCode has MQA or MHA only)."""
    headless = check_name(name, NAMES)
    cs = with_defaults(cs_model, _CS_PRE)
    for key, value in _CS_FIXED.items():
        if key in cs:
            expect(cs, key, (value,), "CS")
    mup.refuse(cs, name)
    if cs["attention_type"] not in ("scaled_dot_product", "dot_product"):
        raise MappingError(f"attention_type={cs['attention_type']!r} is not supported")
    multi_query = cs["attention_module"] == "multiquery_attention"
    groups = (cs.get("extra_attention_params") or {}).get("num_kv_groups", 1)
    if multi_query and groups != 1:
        raise MappingError(f"extra_attention_params.num_kv_groups={groups} is not supported")
    hf = {h: cs[c] for h, c in _RENAMES if c in cs}
    hf["scale_attn_weights"] = cs["attention_type"] == "scaled_dot_product"
    hf["multi_query"] = multi_query
    arch = "GPTBigCodeModel" if headless else "GPTBigCodeForCausalLM"
    return {**hf, "architectures": [arch], **{k: v for k, v in _HF_POST.items() if k not in hf}}


def _shape(hf_config: Mapping[str, Any]) -> tuple[int, int, int, int, bool]:
    cfg = with_defaults(hf_config, _HF_PRE)
    embed, heads = cfg["n_embd"], cfg["n_head"]
    return cfg["n_layer"], embed, heads, embed // heads, bool(cfg["multi_query"])


TABLE = gpt2_like.STARCODER


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """What the StarCoder table reads: multi-query (``mq``) or not, the heads, the rows of Q, K
    and V in an MQA ``c_attn`` (starcoder.py lines 98-168); on import MappingError when a
    ``c_attn`` does not pack Q, K and V. On export the HF config is the one
    :func:`config_to_hf` gives."""
    headless = check_name(name, NAMES)
    hf_config = config_to_hf(config, name) if direction == TO_HF else config
    layers, embed, heads, d_head, mq = _shape(hf_config)
    if direction == TO_CS:
        rows = embed + 2 * d_head if mq else 3 * embed
        for i in range(layers):
            for suffix in BOTH:
                src = f"{hf_prefix(headless)}h.{i}.attn.c_attn.{suffix}"
                if src in shapes and shapes[src][0] != rows:
                    raise MappingError(
                        f"{src}: {shapes[src]} does not pack Q, K and V ({rows} rows)"
                    )
    flags = frozenset({"learned", "mq"} if mq else {"learned"})
    dims = {"heads": heads, "rows": (0, embed, embed + d_head, embed + 2 * d_head)}
    return layout_context(direction, shapes, config, headless, layers, flags, dims)


plan_to_hf, plan_to_cs = plans(TABLE, context)
