"""The Hugging Face config table of T5 (``t5.py``: T5, UL2, Flan-UL2, transformer), in the
vocabulary of ``config.py``. Model Zoo, tag Release_2.10.0,
``src/cerebras/modelzoo/tools/checkpoint_converters/t5.py`` (``ConfigConverter_T5_HF_CS21``,
lines 822-1338).
"""

from __future__ import annotations

from typing import Any

from ckpt_migrate.catalogue.config import CS, HF, Defaults, Fixed, Op, Renames, Written

# HF defaults Model Zoo fills in before converting (t5.py lines 923-939).
T5_HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32128,
    "d_model": 512,
    "d_kv": 64,
    "d_ff": 2048,
    "num_layers": 6,
    "num_heads": 8,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "dropout_rate": 0.1,
    "layer_norm_epsilon": 1e-6,
    "feed_forward_proj": "relu",
    "tie_word_embeddings": True,
}
# CS defaults Model Zoo fills in (t5.py lines 941-956, 1055-1057, 1233-1234).
T5_CS_DEFAULTS: dict[str, Any] = {
    "use_projection_bias_in_attention": False,
    "relative_attention_num_buckets": 32,
    "share_embedding_weights": True,
    "layer_norm_epsilon": 1.0e-5,
    "position_embedding_type": "relative",
    "use_dropout_outside_residual_path": True,
    "share_encoder_decoder_embedding": True,
    "use_pre_encoder_decoder_dropout": False,
    "use_pre_encoder_decoder_layer_norm": True,
    "use_ffn_bias": False,
    "use_transformer_initialization": False,
    "norm_type": "rmsnorm",
}
# CS defaults HF T5 can take any value of (the rest of CS_DEFAULTS it can express only so)
_FREE = frozenset(
    {"relative_attention_num_buckets", "share_embedding_weights", "layer_norm_epsilon"}
)
# The one value HF T5 can express (assert_factory_fn rules, t5.py lines 842-920, 1047-1052,
# 1226-1231), plus T5ForConditionalGenerationModelConfig fields HF T5 has no weights for (ours).
_CS_FIXED: dict[str, Any] = {
    **{k: v for k, v in T5_CS_DEFAULTS.items() if k not in _FREE},
    "tie_encoder_decoder": False,
    "attention_module": "aiayn_attention",
}
_HF_FIXED: dict[str, Any] = {"is_encoder_decoder": True, "relative_attention_max_distance": 128}
# (CS field, HF field) copied as they are (t5.py lines 822-870).
_RENAMED = (
    ("src_vocab_size", "vocab_size"),
    ("d_model", "d_model"),
    ("d_kv", "d_kv"),
    ("d_ff", "d_ff"),
    ("encoder_num_hidden_layers", "num_layers"),
    ("decoder_num_hidden_layers", "num_decoder_layers"),
    ("num_heads", "num_heads"),
    ("relative_attention_num_buckets", "relative_attention_num_buckets"),
    ("dropout_rate", "dropout_rate"),
    ("layer_norm_epsilon", "layer_norm_epsilon"),
)
# T5: Model Zoo's defaults each side, the one value each side can express, the renames, one
# vocabulary and one dropout (ours: HF T5 has one of each), the feed-forward activation (lines
# 966-1008), the tie (lines 850-857; transformers 5's ``scale_decoder_outputs`` too), what the
# CS side gets after converting (lines 958-964, 1235).
T5_CONFIG = (
    Op("architecture", {"model_type": True}),
    Fixed(HF, {"model_type": "t5"}, "{key}={got!r}: expected {want!r}"),
    Op("refuse mup"),  # not folded: catalogue/mup.py T5_MUP
    Defaults(HF, T5_HF_DEFAULTS),
    Defaults(CS, T5_CS_DEFAULTS),
    Fixed(CS, _CS_FIXED, "{key}={got!r}: only {want!r} converts to HF"),
    Fixed(HF, _HF_FIXED, "{key}={got!r}: only {want!r} converts to CS"),
    Op("one vocabulary, one dropout"),
    Renames(tuple((hf, cs) for cs, hf in _RENAMED)),
    Op("t5 activation"),
    Op("t5 tie"),
    # transformers' T5 needs ``decoder_start_token_id`` to shift labels right, and every Hub T5
    # config gives it (the pad token, 0); Model Zoo's converter writes none (ours: the CS
    # model's own, else 0, as ``T5ForConditionalGenerationModelConfig`` starts from pad).
    Renames((("decoder_start_token_id", "decoder_start_token_id"),), skip_none=True, side=CS),
    Written(CS, {"decoder_start_token_id": 0}),
    Written(
        HF,
        {
            "src_max_position_embeddings": 512,
            "tgt_max_position_embeddings": 512,
            "norm_type": "rmsnorm",
        },
    ),
)
