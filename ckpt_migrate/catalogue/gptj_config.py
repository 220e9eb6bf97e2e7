"""The Hugging Face config tables of the GPT-J-style families (``gptj_like.py``: GPT-J and
CodeGen), in the vocabulary of ``config.py``, and the GPT-J backbone's CS defaults and fixed
fields GPT-NeoX, Falcon and BLOOM share. Model Zoo, tag Release_2.10.0,
``src/cerebras/modelzoo/tools/checkpoint_converters/``: ``gptj_hf_cs.py``
(``ConfigConverter_GPTJModel_HF_CS17`` lines 391-621), ``salesforce_codegen_hf_cs.py``
(``ConfigConverter_Codegen_Model_HF_CS17`` lines 552-740), ``gpt_neox_hf_cs.py``.
"""

from __future__ import annotations

from typing import Any

from ckpt_migrate.catalogue.config import (
    CS,
    DECODER_SIZES,
    HF,
    Defaults,
    Fixed,
    Op,
    Renames,
    Required,
    Written,
)

# The CS GPT-J model's defaults (GPT-J, CodeGen and GPT-NeoX), as Model Zoo fills them in before
# converting: gptj_hf_cs.py lines 529-546, salesforce_codegen_hf_cs.py lines 689-706,
# gpt_neox_hf_cs.py lines 808-825 and 1035-1039.
GPTJ_CS_DEFAULTS: dict[str, Any] = {
    "max_position_embeddings": 1024,
    "embedding_dropout_rate": 0.1,
    "share_embedding_weights": True,
    "residual_dropout_rate": 0.1,
    "nonlinearity": "gelu",
    "layer_norm_epsilon": 1.0e-5,
    "use_ffn_bias": False,
    "use_untied_layer_norm": False,
    "attention_dropout_rate": 0.1,
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "initializer_range": 0.02,
    "use_bias_in_output": False,
    "norm_first": True,
    "pos_scaling_factor": 1.0,
    # Not in Model Zoo's defaults: the CS model's own (``GPTJSubModelConfig``,
    # models/nlp/gptj/gptj_model.py lines 69-71). Model Zoo's CS config leaves the field out.
    "position_embedding_type": "rotary",
    "attention_type": "scaled_dot_product",
    "embedding_layer_norm": False,
    "fixed_sparse_attention": None,
    "use_ff_layer1_dropout": False,
    "norm_type": "layernorm",
    "use_position_embedding": True,
    "rope_theta": 10000.0,
}
_OWN: Any = object()  # a fixed field whose value is the family's (:func:`gptj_fixed`)
# CS GPT-J fields a rotary GPT-J-backbone converter fixes to one value (gptj_hf_cs.py lines
# 451-509, salesforce_codegen_hf_cs.py lines 563-669, gpt_neox_hf_cs.py lines 666-788), in the
# order they are checked: the values all three need, and ``_OWN`` where they differ.
_GPTJ_FIXED: dict[str, Any] = {
    "position_embedding_type": "rotary",
    "use_position_embedding": True,
    "embedding_dropout_rate": _OWN,
    "attention_type": "scaled_dot_product",
    "use_projection_bias_in_attention": _OWN,
    "use_ffn_bias_in_attention": _OWN,
    "use_ffn_bias": True,
    "use_bias_in_output": _OWN,
    "embedding_layer_norm": False,
    "fixed_sparse_attention": None,
    "norm_first": True,
    "use_ff_layer1_dropout": False,
    "use_untied_layer_norm": _OWN,
    "norm_type": "layernorm",
    "rope_theta": 10000.0,  # the HF models hard-code base 10000
    "pos_scaling_factor": _OWN,
}
# CS fields GPT-J and CodeGen fix alike besides those (gptj_hf_cs.py lines 451-509,
# salesforce_codegen_hf_cs.py lines 563-669): no attention biases, one layer norm; the HF models
# have no RoPE scaling (Model Zoo does not check ``pos_scaling_factor``).
GPTJ_STYLE_FIXED: dict[str, Any] = {
    "use_projection_bias_in_attention": False,
    "use_ffn_bias_in_attention": False,
    "use_untied_layer_norm": False,
    "pos_scaling_factor": 1.0,
}
# The HF config fields GPT-J and CodeGen spell alike, with the defaults both converters fill in
# (gptj_hf_cs.py lines 512-528, salesforce_codegen_hf_cs.py lines 672-688) but the dropouts
# (:func:`gptj_style_hf_defaults`).
_GPTJ_STYLE_HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50400,
    "n_positions": 2048,
    "n_embd": 4096,
    "n_layer": 28,
    "n_head": 16,
    "rotary_dim": 64,
    "n_inner": None,
    "activation_function": "gelu_new",
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": False,
    "scale_attn_weights": True,
}


def gptj_style_hf_defaults(dropout: float) -> dict[str, Any]:
    """The HF GPT-J-style defaults with ``dropout`` for the residual, embedding and attention
    dropouts (``resid_pdrop``, ``embd_pdrop``, ``attn_pdrop``)."""
    rates = dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop"), dropout)
    return {**_GPTJ_STYLE_HF_DEFAULTS, **rates}


def gptj_fixed(**own: Any) -> dict[str, Any]:
    """The CS fields a GPT-J-backbone family needs at one value: the shared ones and the
    family's ``own`` ones, in the checking order."""
    if any(_GPTJ_FIXED.get(key) is not _OWN for key in own):
        raise TypeError(f"not all of {sorted(own)} are a family's own fixed fields")
    return {k: v for k, v in {**_GPTJ_FIXED, **own}.items() if v is not _OWN}


# GPT-J-style rules (GPT-J, CodeGen): gptj_hf_cs.py lines 391-621 (post-conversion defaults
# 549-558), salesforce_codegen_hf_cs.py lines 552-740 (708-718); ``n_inner`` null is
# ``4 * n_embd``; HF must scale the attention weights.
_GPTJ_STYLE_RENAMES = (
    ("vocab_size", "vocab_size"),
    ("n_embd", "hidden_size"),
    ("n_head", "num_heads"),
    ("n_layer", "num_hidden_layers"),
    ("n_positions", "max_position_embeddings"),
    ("n_inner", "filter_size"),
    ("rotary_dim", "rotary_dim"),
)
_GPTJ_STYLE_MORE = (
    ("embd_pdrop", "embedding_dropout_rate"),
    ("tie_word_embeddings", "share_embedding_weights"),
    ("activation_function", "nonlinearity"),
    ("attn_pdrop", "attention_dropout_rate"),
    ("resid_pdrop", "residual_dropout_rate"),
    ("layer_norm_epsilon", "layer_norm_epsilon"),
    ("initializer_range", "initializer_range"),
)


def gptj_style_config(
    model_type: str, label: str, dropout: float, fixed: dict[str, Any], more: tuple = ()
) -> tuple:
    """The rules of a GPT-J-style family: its HF ``model_type``, its name in messages
    (``label``), its HF dropouts' default, its fixed CS fields, further steps (``more``) after
    the checks."""
    return (
        Op("architecture", {"model_type": True}),
        Defaults(HF, gptj_style_hf_defaults(dropout)),
        Fixed(HF, {"model_type": model_type}, "{key}: expected {want!r}, got {got!r}"),
        Op("refuse mup", {"as_name": model_type}),  # named as the family's first name
        Defaults(CS, GPTJ_CS_DEFAULTS),
        Fixed(CS, fixed, "{key}: HF " + label + " needs {want!r}, got {got!r}"),
        *more,
        Required(CS, ("rotary_dim",), "{key}: a CS " + label + " config must give it"),
        Fixed(
            HF,
            {"scale_attn_weights": True},
            "{key}: HF " + label + " must scale attention weights",
        ),
        Op("n_inner"),
        Renames(_GPTJ_STYLE_RENAMES),
        Written(HF, {"position_embedding_type": "rotary"}),
        Renames(_GPTJ_STYLE_MORE),
        Written(
            HF,
            {
                "use_untied_layer_norm": False,
                "use_ffn_bias_in_attention": False,
                "use_projection_bias_in_attention": False,
                "use_ffn_bias": True,
                "use_bias_in_output": True,
                "attention_type": "scaled_dot_product",
            },
        ),
    )


# GPT-J: ``use_bias_in_output`` copied under its CS name as Model Zoo does (rule lines 485-488,
# default false from lines 529-546); transformers keeps it as an unused attribute.
GPTJ_CONFIG = (
    *gptj_style_config("gptj", "GPT-J", 0.1, gptj_fixed(**GPTJ_STYLE_FIXED)),
    Renames((("use_bias_in_output", "use_bias_in_output"),), side=CS),
)
# CodeGen: a head bias; HF needs ``n_head`` >= 4 (lines 731-739); ``n_ctx`` is not carried.
CODEGEN_CONFIG = gptj_style_config(
    "codegen",
    "CodeGen",
    0.0,
    gptj_fixed(**GPTJ_STYLE_FIXED, use_bias_in_output=True),
    (Op("codegen heads"),),
)

# GPT-NeoX (gpt_neox_hf_cs.py lines 656-870 and 1011-1093): Model Zoo's HF defaults (lines
# 791-807, 1030-1034), the parallel residual and attention biases HF must have, the rotary
# fraction ``rotary_pct`` = ``rotary_dim`` / head size (lines 866-870), base 10000 (lines
# 752-759), linear RoPE scaling only (lines 1041-1089), the post-conversion CS defaults (lines
# 835-847).
GPT_NEOX_CONFIG = (
    Op("architecture", {"model_type": True}),
    Defaults(
        HF,
        {
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
        },
    ),
    Fixed(HF, {"model_type": "gpt_neox"}, "{key}: expected {want!r}, got {got!r}"),
    Fixed(HF, {"use_parallel_residual": True}, "{key}: CS GPT-NeoX needs the parallel residual"),
    Fixed(HF, {"attention_bias": True}, "{key}: CS GPT-NeoX needs attention biases"),
    Op("refuse mup", {"as_name": "gpt-neox"}),
    Defaults(CS, GPTJ_CS_DEFAULTS),
    Fixed(
        CS,
        gptj_fixed(
            embedding_dropout_rate=0.0,
            use_untied_layer_norm=True,
            use_projection_bias_in_attention=True,
            use_ffn_bias_in_attention=True,
            use_bias_in_output=False,
        ),
        "{key}: HF GPT-NeoX needs {want!r}, got {got!r}",
    ),
    Required(
        CS,
        ("rotary_dim", "hidden_size", "num_heads"),
        "{key}: a CS GPT-NeoX config must give it",
    ),
    Op("neox rope"),
    Renames(
        (
            *DECODER_SIZES,
            ("hidden_act", "nonlinearity"),
            ("layer_norm_eps", "layer_norm_epsilon"),
            ("attention_dropout", "attention_dropout_rate"),
            ("hidden_dropout", "residual_dropout_rate"),
        )
    ),
    Op("neox rotary dim"),
    Renames(
        (
            ("initializer_range", "initializer_range"),
            ("tie_word_embeddings", "share_embedding_weights"),
        )
    ),
    Written(CS, {"use_parallel_residual": True, "attention_bias": True}),
    Written(HF, {"position_embedding_type": "rotary"}),
    Op("neox scaling factor"),
    Written(
        HF,
        {
            "attention_type": "scaled_dot_product",
            "use_untied_layer_norm": True,
            "use_projection_bias_in_attention": True,
            "use_ffn_bias_in_attention": True,
            "use_ffn_bias": True,
            "use_bias_in_output": False,
            "embedding_dropout_rate": 0.0,
        },
    ),
    Op("neox scaling type"),
)

# BLOOM (bloom_hf_cs.py lines 460-715): Model Zoo's defaults each side (lines 612-628), the CS
# fields HF BLOOM can express at one value only when present (lines 470-609, 915-924;
# ``embedding_layer_norm`` always, through its default), ``n_embed`` an alias of
# ``hidden_size``, the post-conversion CS defaults (lines 630-641); ``embedding_dropout_rate:
# 0.0`` is written too so that the CS config converts back (Model Zoo would default it to
# ``dropout_rate``).
BLOOM_CS_DEFAULTS: dict[str, Any] = {"share_embedding_weights": True, "embedding_layer_norm": False}
BLOOM_CONFIG = (
    Op("architecture", {"model_type": True}),
    Defaults(
        HF,
        {
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
        },
    ),
    Fixed(HF, {"model_type": "bloom"}, "{key}: expected {want!r}, got {got!r}"),
    Op("n_embed"),
    Fixed(HF, {"apply_residual_connection_post_layernorm": False}, "{key}: CS BLOOM needs false"),
    Op("refuse mup", {"as_name": "bloom"}),
    Defaults(CS, BLOOM_CS_DEFAULTS),
    Fixed(
        CS,
        {
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
        },
        "{key}: HF BLOOM needs {want!r}, got {got!r}",
    ),
    Required(
        CS,
        ("hidden_size", "num_heads", "num_hidden_layers", "vocab_size", "dropout_rate"),
        "{key}: a CS BLOOM config must give it",
    ),
    Op("bloom widths"),
    Op("dropouts"),
    Defaults(CS, {"layer_norm_epsilon": 1e-5, "initializer_range": 0.02}),
    Renames(
        (
            ("vocab_size", "vocab_size"),
            ("hidden_size", "hidden_size"),
            ("n_head", "num_heads"),
            ("n_layer", "num_hidden_layers"),
            ("tie_word_embeddings", "share_embedding_weights"),
            ("layer_norm_epsilon", "layer_norm_epsilon"),
            ("initializer_range", "initializer_range"),
            ("attention_dropout", "attention_dropout_rate"),
            ("hidden_dropout", "dropout_rate"),
        )
    ),
    Op("filter size"),
    Written(CS, {"apply_residual_connection_post_layernorm": False}),
    Written(
        HF,
        {
            "embedding_dropout_rate": 0.0,
            "position_embedding_type": "alibi",
            "use_ffn_bias_in_attention": True,
            "use_projection_bias_in_attention": True,
            "use_ffn_bias": True,
            "use_bias_in_output": False,
            "attention_type": "scaled_dot_product",
            "embedding_layer_norm": True,
        },
    ),
)


# Falcon (falcon_180b.py lines 134-551 and 612-693): Model Zoo's defaults each side, rotary
# positions only, GELU, an MLP 4 * hidden wide, one bias switch for all linear layers, its
# layouts (multi-query, per-head, the new decoder architecture with KV groups and two norms),
# linear RoPE scaling only, the post-conversion CS defaults (lines 314-330). Written to HF as
# Model Zoo writes them: the three CS bias switches under their CS names besides ``bias``.
FALCON_HF_DEFAULTS: dict[str, Any] = {
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
FALCON_CS_DEFAULTS: dict[str, Any] = {
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
FALCON_CONFIG = (
    Op("architecture", {"model_type": True}),
    Defaults(HF, FALCON_HF_DEFAULTS),
    Fixed(HF, {"model_type": "falcon"}, "{key}: expected {want!r}, got {got!r}"),
    Op("refuse mup", {"as_name": "falcon"}),
    Required(
        CS, ("hidden_size", "num_heads", "filter_size"), "{key}: a CS Falcon config must give it"
    ),
    Defaults(CS, FALCON_CS_DEFAULTS),
    Fixed(  # falcon_180b.py lines 181-264 and 502-512
        CS,
        {
            "position_embedding_type": "rotary",
            "nonlinearity": "gelu",
            "use_bias_in_output": False,
            "attention_module": "multiquery_attention",
            "attention_type": "scaled_dot_product",
            "embedding_dropout_rate": 0.0,
            "norm_type": "layernorm",
        },
        "{key}: HF Falcon needs {want!r}, got {got!r}",
    ),
    Op("falcon layout"),
    Renames((("vocab_size", "vocab_size"), ("hidden_size", "hidden_size"))),
    Renames((("ffn_hidden_size", "filter_size"),), side=CS),
    Op("filter size"),
    Renames((("num_attention_heads", "num_heads"),)),
    Op("falcon kv groups"),
    Renames(
        (
            ("num_hidden_layers", "num_hidden_layers"),
            ("max_position_embeddings", "max_position_embeddings"),
        )
    ),
    Written(HF, {"position_embedding_type": "rotary"}),
    Op("falcon rope"),
    Op("rotary dim"),
    Renames(
        (
            ("tie_word_embeddings", "share_embedding_weights"),
            ("attention_dropout", "attention_dropout_rate"),
            ("hidden_dropout", "residual_dropout_rate"),
            ("layer_norm_epsilon", "layer_norm_epsilon"),
            ("initializer_range", "initializer_range"),
        )
    ),
    Op("falcon biases"),
    Written(
        HF,
        {
            "embedding_dropout_rate": 0.0,
            "nonlinearity": "gelu",
            "attention_module": "multiquery_attention",
            "attention_type": "scaled_dot_product",
            "loss_scaling": "num_tokens",
            "use_bias_in_output": False,
        },
    ),
    Op("falcon scaling type"),
    Written(CS, {"activation": "gelu", "alibi": False, "parallel_attn": True}),
)
