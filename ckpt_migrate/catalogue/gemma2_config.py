"""The Hugging Face config table of Gemma 2 (``llama_like.py``), in the vocabulary of
``config.py``. Model Zoo, tag Release_2.10.0,
``src/cerebras/modelzoo/tools/checkpoint_converters/gemma2.py``
(``ConfigConverter_Gemma2_HF_CS23``, lines 218-781); the named operations are in
``hf/config_gemma2.py`` and ``hf/config_llama.py``.
"""

from __future__ import annotations

from typing import Any

from ckpt_migrate.catalogue.config import CS, HF, Defaults, Fixed, Op, Renames, Required, Written
from ckpt_migrate.catalogue.llama_config import CS_IGNORED

# Model Zoo gemma2.py lines 438-464: HF fields absent from config.json take these values.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 256000,
    "hidden_size": 3072,
    "intermediate_size": 24576,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
    "query_pre_attn_scalar": 224,
    "sliding_window": 4096,
}
# Model Zoo gemma2.py lines 468-512: CS fields absent from the model section take these values
# (so a section that leaves out a Gemma 2 setting fails the checks below, as in Model Zoo).
CS_DEFAULTS: dict[str, Any] = {
    "embeddings_scale": 1.0, "embedding_layer_norm": False, "embedding_dropout_rate": None,
    "share_embedding_weights": True, "position_embedding_type": "learned",
    "max_position_embeddings": 1024, "position_embedding_offset": 0, "rotary_dim": None,
    "rope_theta": 10000, "pos_scaling_factor": 1.0, "hidden_size": 768, "num_hidden_layers": 12,
    "dropout_rate": 0.1, "norm_type": "layernorm", "layer_norm_epsilon": 1e-5, "norm_first": True,
    "norm_first_sandwich": False, "num_heads": 12, "attention_module": "aiayn_attention",
    "extra_attention_params": {}, "attention_type": "scaled_dot_product",
    "attention_dropout_rate": None, "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True, "attention_sliding_window_length": None,
    "sliding_window_every_other_decoder_layer": False, "attention_sink_tokens": None,
    "attention_qk_norm_layer": None, "attention_inner_dim": None,
    "scale_qk_dot_by_layer_idx": False, "attention_logit_softcapping": None,
    "filter_size": 3072, "nonlinearity": "gelu", "use_ffn_bias": True,
    "use_bias_in_output": False, "use_ff_layer1_dropout": False, "final_logit_softcapping": None,
    "attention_logits_alpha": 1,
}  # fmt: skip
# Model Zoo gemma2.py lines 359-433 (assert_factory_fn rules, CS side): the one value HF Gemma 2
# can express (a tuple: any of them).
CS_FIXED: dict[str, Any] = {
    "position_embedding_type": "rotary",
    "dropout_rate": 0.0,
    "sliding_window_every_other_decoder_layer": True,
    "norm_first": True,
    "norm_first_sandwich": True,
    "use_bias_in_output": False,
    "embedding_dropout_rate": (None, 0.0),
    "position_embedding_offset": 0,
    "use_ffn_bias": False,
    "embedding_layer_norm": False,
    "attention_type": "scaled_dot_product",
    "norm_type": "rmsnorm",
    "use_ff_layer1_dropout": False,
}
# Ours: CS fields Model Zoo drops without a rule whose other values HF Gemma 2 cannot express
# (rope scaling, attention sinks, QK norms, per-layer QK scaling, fixed sparsity, SWA on the
# even layers only being HF's pattern).
CS_NEUTRAL: dict[str, Any] = {
    "pos_scaling_factor": 1.0,
    "attention_sink_tokens": None,
    "attention_qk_norm_layer": None,
    "scale_qk_dot_by_layer_idx": False,
    "fixed_sparse_attention": None,
    "sliding_window_every_other_decoder_layer_pattern": "sliding_window_first",
}
CS_MAPPED = frozenset(
    {
        "vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "attention_module",
        "extra_attention_params", "max_position_embeddings", "layer_norm_epsilon", "rope_theta",
        "final_logit_softcapping", "attention_logit_softcapping",
        "attention_sliding_window_length", "nonlinearity", "share_embedding_weights",
        "filter_size", "attention_inner_dim", "attention_dropout_rate",
        "use_projection_bias_in_attention", "use_ffn_bias_in_attention", "rotary_dim",
        "embeddings_scale", "attention_logits_alpha", "initializer_range",
        # no effect with rotary positions (Model Zoo drops them too)
        "num_relative_attention_buckets", "alibi_trainable_slopes", "attention_qk_norm_eps",
    }
)  # fmt: skip
_KNOWN = CS_MAPPED | CS_FIXED.keys() | CS_NEUTRAL.keys() | CS_IGNORED
# gemma2.py lines 513-522: the CS fields written on import.
_CS_WRITTEN: dict[str, Any] = {
    "norm_first": True,
    "norm_first_sandwich": True,
    "sliding_window_every_other_decoder_layer": True,
    "position_embedding_type": "rotary",
    "norm_type": "rmsnorm",
    "use_ffn_bias": False,
    "dropout_rate": 0.0,
}

# The rules in Model Zoo's order (gemma2.py lines 221-327 renames, 540-589 GQA, 612-638
# ``head_dim``, 640-663 ``attention_bias``, 665-699 GLU, 755-772 the derived fields);
# ``initializer_range`` is carried (ours, Model Zoo drops it).
GEMMA2_CONFIG = (
    Op("architecture", {"model_type": True}),
    Fixed(HF, {"model_type": "gemma2"}, "model_type={got!r}: expected {want!r}"),
    Required(CS, ("vocab_size",), "{key}: required in the CS model section"),
    Op("refuse mup", {"as_name": "gemma2"}),  # gemma2.py has no muP conversion
    Defaults(CS, CS_DEFAULTS),
    Defaults(HF, HF_DEFAULTS),
    Fixed(CS, CS_FIXED, "{key}={got!r}: HF Gemma 2 needs {want!r}"),
    Fixed(CS, CS_NEUTRAL, "{key}={got!r}: HF Gemma 2 cannot express it"),
    Op("known fields", {"known": _KNOWN, "as_name": "gemma2", "label": "Gemma 2"}),
    Op("gemma2 attention"),
    Renames(
        (
            ("vocab_size", "vocab_size"),
            ("hidden_size", "hidden_size"),
            ("num_hidden_layers", "num_hidden_layers"),
            ("num_attention_heads", "num_heads"),
        )
    ),
    Op("gemma2 kv heads"),
    Renames(
        (
            ("max_position_embeddings", "max_position_embeddings"),
            ("rms_norm_eps", "layer_norm_epsilon"),
        )
    ),
    Op("gemma2 rope"),
    Renames(
        (
            ("final_logit_softcapping", "final_logit_softcapping"),
            ("attn_logit_softcapping", "attention_logit_softcapping"),
            ("sliding_window", "attention_sliding_window_length"),
        )
    ),
    Op("glu activation", {"hf": "hidden_activation", "any_gelu": True}),
    Op("bool", {"hf": "tie_word_embeddings", "cs": "share_embedding_weights"}),
    Renames((("intermediate_size", "filter_size"),)),
    Op("gemma2 head dim"),
    Renames((("attention_dropout", "attention_dropout_rate"),)),
    Op("bool", {"hf": "attention_bias", "cs": "use_projection_bias_in_attention"}),
    Op("bool", {"hf": "attention_bias", "cs": "use_ffn_bias_in_attention", "side": HF}),
    Renames((("initializer_range", "initializer_range"),)),
    # lines 755-765: ``rotary_dim`` is ``head_dim`` (exporting, the attention checks hold it)
    Renames((("head_dim", "rotary_dim"),), side=HF),
    Op("gemma2 embeddings scale"),
    Op("gemma2 query scalar"),
    Written(HF, _CS_WRITTEN),
)
