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
from ckpt_migrate.hf.families import _decoder_common as dc
from ckpt_migrate.hf.families._decoder_common import HEAD
from ckpt_migrate.hf.layouts.gptj_like import (
    cs_config,
    decoder_context,
    decoder_table,
    qkv_row,
)
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import Ctx, deinterleave, fused_qkv
from ckpt_migrate.hf.ops import interleave as _interleave  # tests use it
from ckpt_migrate.hf.table import TO_CS, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
# The transformers class of each name (``config.json`` ``architectures``).
ARCHITECTURES = catalogue.hf_architectures(__name__)
LABEL = "GPT-NeoX"  # in messages

# Model Zoo: gpt_neox_hf_cs.py lines 791-807 and 1030-1034, HF defaults filled in first.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50432,
    "hidden_size": 6144,
    "num_hidden_layers": 44,
    "num_attention_heads": 64,
    "intermediate_size": 24576,
    "hidden_act": "gelu",
    "max_position_embeddings": 2048,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "use_parallel_residual": True,
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
    "attention_bias": True,
}
# Model Zoo: gpt_neox_hf_cs.py lines 808-825 and 1035-1039, CS defaults filled in first, with the
# CS GPT-J model's own for the fields Model Zoo's CS config leaves out (``position_embedding_type``:
# its rule, lines 666-669, only checks a value the CS config gives).
CS_DEFAULTS = dc.GPTJ_CS_DEFAULTS
# Model Zoo: gpt_neox_hf_cs.py lines 666-788 and 929-938, CS fields that must hold these values
# (and the ones every GPT-J-backbone converter fixes, :func:`dc.gptj_fixed`; ``rope_theta``:
# Model Zoo asserts HF ``rotary_emb_base`` == 10000, line 756-759).
CS_FIXED = dc.gptj_fixed(
    embedding_dropout_rate=0.0,
    use_untied_layer_norm=True,
    use_projection_bias_in_attention=True,
    use_ffn_bias_in_attention=True,
    use_bias_in_output=False,
)
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


def _check_cs(cs: Mapping[str, Any]) -> None:
    """Reject CS settings HF GPT-NeoX cannot express, naming the field."""
    dc.check_cs(cs, LABEL, CS_FIXED, CS_DEFAULTS, name=NAMES[0])
    dc.require(cs, ("rotary_dim", "hidden_size", "num_heads"), LABEL)
    if cs["rotary_dim"] % 2:
        raise MappingError(f"rotary_dim: must be even, got {cs['rotary_dim']}")


def _rope(hf: Mapping[str, Any]) -> tuple[float, float, float]:
    """(theta, rotary fraction, linear scaling factor) from transformers 5 ``rope_parameters``
    or the older ``rotary_pct`` / ``rotary_emb_base`` / ``rope_scaling`` fields.

    Model Zoo: gpt_neox_hf_cs.py lines 752-759 (``rotary_pct``, base 10000 asserted) and
    1041-1080 (``rope_scaling``; only the linear kind is carried here)."""
    params = dict(hf.get("rope_parameters") or {})
    legacy = dict(hf.get("rope_scaling") or {})
    theta = params.get("rope_theta", hf.get("rotary_emb_base", 10000.0))
    fraction = params.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))
    factor = dc.rope_factor(params, legacy)
    if theta != 10000:
        raise MappingError(f"rope_parameters: rope_theta must be 10000 (Model Zoo), got {theta}")
    return float(theta), float(fraction), float(factor)


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: gpt_neox_hf_cs.py lines 656-870 and 1011-1093 (rules and defaults)."""
    dc.check_name(name, NAMES)
    hf = dc.hf_with_defaults(hf_config, HF_DEFAULTS, "gpt_neox")
    if hf["use_parallel_residual"] is not True:
        raise MappingError("use_parallel_residual: CS GPT-NeoX needs the parallel residual")
    if hf["attention_bias"] is not True:
        raise MappingError("attention_bias: CS GPT-NeoX needs attention biases")
    _, fraction, factor = _rope(hf)
    head_size = hf["hidden_size"] // hf["num_attention_heads"]
    cs = {
        "vocab_size": hf["vocab_size"],
        "hidden_size": hf["hidden_size"],
        "num_heads": hf["num_attention_heads"],
        "num_hidden_layers": hf["num_hidden_layers"],
        "max_position_embeddings": hf["max_position_embeddings"],
        "filter_size": hf["intermediate_size"],
        "nonlinearity": hf["hidden_act"],
        "layer_norm_epsilon": hf["layer_norm_eps"],
        "attention_dropout_rate": hf["attention_dropout"],
        "residual_dropout_rate": hf["hidden_dropout"],
        "rotary_dim": int(head_size * fraction),
        "initializer_range": hf["initializer_range"],
        "share_embedding_weights": hf["tie_word_embeddings"],
        "position_embedding_type": "rotary",
        "pos_scaling_factor": factor,
        # Model Zoo: gpt_neox_hf_cs.py lines 835-847, the post-conversion CS defaults.
        "attention_type": "scaled_dot_product",
        "use_untied_layer_norm": True,
        "use_projection_bias_in_attention": True,
        "use_ffn_bias_in_attention": True,
        "use_ffn_bias": True,
        "use_bias_in_output": False,
        "embedding_dropout_rate": 0.0,
    }
    if factor != 1.0:
        cs["pos_scaling_type"] = "linear"
    return cs


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: gpt_neox_hf_cs.py lines 656-870 and 1011-1093 read from CS to HF;
    ``rotary_pct`` = ``rotary_dim`` / head size (lines 866-870). Written both as transformers 5
    ``rope_parameters`` and as the older ``rotary_pct`` / ``rotary_emb_base`` / ``rope_scaling``
    fields: ``rope_scaling`` is null without scaling, as Model Zoo writes it (``convert_pi``,
    lines 1082-1084); with scaling it is the ``rope_parameters`` mapping (transformers 5 reads
    ``rope_scaling`` as its alias, so the two must agree), where Model Zoo writes the legacy
    ``{"type": "linear", "factor": f}`` (lines 1085-1089)."""
    dc.check_name(name, NAMES)
    _check_cs(cs_model)
    cs = {**CS_DEFAULTS, **cs_model}
    dc.check_scaling_type(cs)
    fraction = cs["rotary_dim"] / (cs["hidden_size"] // cs["num_heads"])
    rope, scaling = dc.hf_rope(
        cs["pos_scaling_factor"], rope_theta=10000.0, partial_rotary_factor=fraction
    )
    return {
        **dc.hf_header(ARCHITECTURES, name, "gpt_neox"),
        "vocab_size": cs["vocab_size"],
        "hidden_size": cs["hidden_size"],
        "num_attention_heads": cs["num_heads"],
        "num_hidden_layers": cs["num_hidden_layers"],
        "max_position_embeddings": cs["max_position_embeddings"],
        "intermediate_size": cs["filter_size"],
        "hidden_act": cs["nonlinearity"],
        "layer_norm_eps": cs["layer_norm_epsilon"],
        "attention_dropout": cs["attention_dropout_rate"],
        "hidden_dropout": cs["residual_dropout_rate"],
        "initializer_range": cs["initializer_range"],
        "tie_word_embeddings": cs["share_embedding_weights"],
        "use_parallel_residual": True,
        "attention_bias": True,
        "rope_parameters": rope,
        "rotary_pct": fraction,
        "rotary_emb_base": 10000,
        "rope_scaling": scaling,
    }


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
