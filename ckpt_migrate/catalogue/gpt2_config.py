"""The Hugging Face config tables of the GPT-2-like families (``gpt2_like.py``), in the
vocabulary of ``config.py``. Model Zoo, tag Release_2.10.0,
``src/cerebras/modelzoo/tools/checkpoint_converters/``: ``gpt2_hf_cs.py``, ``starcoder.py``,
``santacoder.py``, ``btlm_hf_cs.py``, ``jais_hf_cs.py``.
"""

from __future__ import annotations

from typing import Any

from ckpt_migrate.catalogue.config import CS, HF, Defaults, Fixed, Op, Renames, Required, Written

# (HF key, CS key) of the GPT-2 config rules that only rename (gpt2_hf_cs.py lines 486-573).
GPT2_RENAMES: tuple[tuple[str, str], ...] = (
    ("vocab_size", "vocab_size"),
    ("embd_pdrop", "embedding_dropout_rate"),
    ("tie_word_embeddings", "share_embedding_weights"),
    ("n_embd", "hidden_size"),
    ("n_head", "num_heads"),
    ("n_layer", "num_hidden_layers"),
    ("n_positions", "max_position_embeddings"),
    ("n_inner", "filter_size"),
    ("activation_function", "nonlinearity"),
    ("attn_pdrop", "attention_dropout_rate"),
    ("resid_pdrop", "dropout_rate"),
    ("rotary_dim", "rotary_dim"),
    ("layer_norm_epsilon", "layer_norm_epsilon"),
    ("initializer_range", "initializer_range"),
)
# CS fields the GPT-2 rules accept with one value only (assert_factory_fn, lines 487-585 and
# 920-923).
GPT2_CS_FIXED: dict[str, Any] = {
    "norm_type": "layernorm",
    "position_embedding_type": "learned",
    "use_position_embedding": True,
    "embedding_layer_norm": False,
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True,
    "use_bias_in_output": False,
    "fixed_sparse_attention": None,
    "norm_first": True,
    "use_ff_layer1_dropout": False,
}
# Model Zoo's assert_factory_fn message (base_converter.py lines 1603-1640), each side.
_ONLY_CS = "CS {key}={got!r} is not supported (only {allowed})"
_ONLY_HF = "HF {key}={got!r} is not supported (only {allowed})"
_ATTENTION_TYPE = Op("attention type", {"message": "attention_type={got!r} is not supported"})
# The GPT-2 rules StarCoder, SantaCoder, BTLM and JAIS inherit (ConfigConverter_GPT2Model_HF_CS17,
# gpt2_hf_cs.py lines 477-656): ``tie_word_embeddings`` / ``share_embedding_weights`` default
# to true (lines 596-600), the HF checks (lines 586-593), ``n_inner``, the dropouts, the
# renames, ``attention_type``, no head bias (line 607).
_GPT2_COMMON = (
    Defaults(HF, {"tie_word_embeddings": True}),
    Defaults(CS, {"share_embedding_weights": True}),
)


def _gpt2_rules(model_type: str, cs_fixed: dict[str, Any], renames: tuple) -> tuple:
    """The inherited GPT-2 rules with a family's model type, fixed CS fields and renames."""
    return (
        *_GPT2_COMMON,
        Fixed(HF, {"model_type": model_type, "reorder_and_upcast_attn": False}, _ONLY_HF),
        Fixed(CS, cs_fixed, _ONLY_CS),
        Op("dropouts"),
        Op("n_inner"),
        Renames(renames),
        _ATTENTION_TYPE,
        Written(HF, {"use_bias_in_output": False}),
    )


# GPT-2 itself (gpt2_hf_cs.py lines 477-660): HF GPT-2 cannot express the CS fields below at
# other values (ours besides Model Zoo's, which fails on them as unmatched keys); cross
# attention would be extra weights; ``n_inner`` null is ``4 * n_embd`` (line 649).
GPT2_CONFIG = (
    Op("architecture", {"model_type": True}),
    Op("refuse mup"),
    Fixed(
        CS,
        {
            **{k: v for k, v in GPT2_CS_FIXED.items() if k != "norm_type"},
            "norm_type": GPT2_CS_FIXED["norm_type"],
            "use_rms_norm": False,
            "scale_qk_dot_by_layer_idx": False,
            "attention_sliding_window_length": None,
            "position_embedding_offset": 0,
            "pos_scaling_factor": 1.0,
        },
        "model.{key} = {got!r}: Hugging Face GPT-2 supports only {want!r}",
        empty_is_none=True,
    ),
    Fixed(HF, {"model_type": "gpt2"}, "config.json model_type = {got!r}, not gpt2"),
    Fixed(
        HF,
        {
            "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False,
            "add_cross_attention": False,
        },
        "config.json {key} = {got!r}: only {want!r} converts",
    ),
    Op("n_inner"),
    *_GPT2_COMMON,
    Op("dropouts"),
    Renames(GPT2_RENAMES, skip_none=True),
    Op(
        "attention type",
        {
            "message": "model.attention_type = {got!r}: only scaled_dot_product and dot_product "
            "convert to Hugging Face GPT-2",
            "always": True,
        },
    ),
    Written(HF, {"use_bias_in_output": False}),
    Required(
        CS,
        ("hidden_size", "num_heads", "num_hidden_layers", "vocab_size"),
        "model.{key} is missing from the config",
    ),
)

# StarCoder (starcoder.py lines 394-645; the CS21 class keeps them, lines 665-689): the GPT-2
# rules with its own defaults before and after converting (lines 522-584), the softmax
# precision renamed, ``multi_query`` <-> ``attention_module`` (lines 595-627); HF keys no rule
# names are dropped, as ``drop_unmatched_keys`` does.
STARCODER_HF_DEFAULTS: dict[str, Any] = {
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
STARCODER_CONFIG = (
    Defaults(HF, STARCODER_HF_DEFAULTS),
    Defaults(
        CS,
        {
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
        },
    ),
    Fixed(CS, {**GPT2_CS_FIXED, "scale_qk_dot_by_layer_idx": False}, _ONLY_CS),
    Op("refuse mup"),
    Fixed(HF, {"model_type": "gpt_bigcode"}, _ONLY_HF),
    Op("n_inner"),
    Renames((*GPT2_RENAMES, ("attention_softmax_in_fp32", "attention_softmax_fp32"))),
    _ATTENTION_TYPE,
    Op("multi query"),
    Written(
        HF,
        {
            "position_embedding_type": "learned",
            "use_projection_bias_in_attention": True,
            "use_ffn_bias_in_attention": True,
            "use_ffn_bias": True,
            "nonlinearity": "gelu",
            "use_bias_in_output": False,
            "loss_scaling": "num_tokens",
        },
    ),
    Op("architecture", {"classes": ("GPTBigCodeForCausalLM", "GPTBigCodeModel")}),
    Written(
        CS,
        {
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
        },
    ),
)

# SantaCoder (santacoder.py lines 323-391, the CS21 class drops ``use_bfloat16``, lines
# 414-416): the GPT-2 rules, multi-query only, ``scale_attn_by_inverse_layer_idx`` renamed.
SANTACODER_CONFIG = (
    Fixed(HF, {"attention_head_type": "multiquery"}, _ONLY_HF),
    Fixed(
        CS,
        {
            "attention_module": "multiquery_attention",
            "extra_attention_params": {"num_kv_groups": 1},
        },
        _ONLY_CS,
    ),
    Op("refuse mup"),
    *_gpt2_rules(
        "gpt2",
        GPT2_CS_FIXED,
        (*GPT2_RENAMES, ("scale_attn_by_inverse_layer_idx", "scale_qk_dot_by_layer_idx")),
    ),
    Written(
        HF,
        {
            "use_bias_in_output": False,
            "position_embedding_type": "learned",
            "attention_module": "multiquery_attention",
            "softmax_dtype_fp32": False,
            "scale_by_layer_index": False,
            "extra_attention_params": {"num_kv_groups": 1},
            "use_projection_bias_in_attention": True,
            "use_ffn_bias_in_attention": True,
            "use_ffn_bias": True,
            "loss_scaling": "num_tokens",
        },
    ),
    Op("architecture", {"classes": ("GPT2LMHeadCustomModel", "GPT2CustomModel")}),
    Written(
        CS,
        {
            "attention_head_type": "multiquery",
            "scale_attn_by_inverse_layer_idx": False,
            "scale_attn_weight": True,  # sic: Model Zoo's spelling, HF's default applies
            "auto_map": {
                "AutoConfig": "configuration_gpt2_mq.GPT2CustomConfig",
                "AutoModelForCausalLM": "modeling_gpt2_mq.GPT2LMHeadCustomModel",
            },
            "model_type": "gpt2",
            "reorder_and_upcast_attn": False,
            "summary_activation": None,
            "summary_first_dropout": 0.1,
            "summary_proj_to_labels": True,
            "summary_type": "cls_index",
            "summary_use_proj": True,
            "torch_dtype": "float32",
            "transformers_version": "4.24.0",
            "use_cache": True,
        },
    ),
)

# (HF, CS) renames of btlm_hf_cs.py lines 150-182, ahead of the GPT-2 rules.
_BTLM_RENAMES = (
    ("position_embedding_type", "position_embedding_type"),
    ("mup_scale_qk_dot_by_d", "scale_qk_dot_by_d"),
    ("mup_embeddings_scale", "embeddings_scale"),
    ("scale_attn_by_inverse_layer_idx", "scale_qk_dot_by_layer_idx"),
    *GPT2_RENAMES,
)


def btlm_config(model_type: str, post: dict[str, Any]) -> tuple:
    """BTLM's rules (btlm_hf_cs.py lines 141-351; JAIS's are the same, jais_hf_cs.py lines
    141-354) with the family's HF ``model_type`` and the fields written after converting:
    ALiBi or learned positions, SwiGLU only, ``alibi_scaling`` <-> ``pos_scaling_factor``, the
    muP output scale."""
    return (
        Defaults(HF, {"mup_width_scale": 1.0, "alibi_scaling": None}),
        Defaults(CS, {"decoder_kernel": 1.0, "pos_scaling_factor": 1.0}),
        Op("refuse mup"),  # 2.3+ muP beyond the HF class's own (mup_native)
        Op("positions", {"allowed": ("alibi", "learned")}),
        Op("swiglu"),
        *_gpt2_rules(
            model_type,
            {k: v for k, v in GPT2_CS_FIXED.items() if k != "position_embedding_type"},
            _BTLM_RENAMES,
        ),
        Op("alibi scaling"),
        Op("mup output"),
        Op("architecture", {"model_type": True}),
        Written(CS, post),
    )
