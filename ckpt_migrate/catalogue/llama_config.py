"""The Hugging Face config tables of the LLaMA-like families (``llama_like.py``: LLaMA, Mistral,
Mixtral), in the vocabulary of ``config.py``. Model Zoo, tag Release_2.10.0,
``src/cerebras/modelzoo/tools/checkpoint_converters/``: ``llama.py``
(``ConfigConverter_LLaMa_HF_CS19/20/21``, lines 564-833, 883-961, 1026-1143), ``mistral.py``
(lines 92-110), ``mixtral.py`` (lines 458-510).
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

# Model Zoo llama.py lines 693-706: HF fields absent from config.json take these values.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "max_position_embeddings": 2048,
    "rope_scaling": None,
}
# Model Zoo llama.py lines 707-721 and 902-904, 1050-1054: CS fields absent from the model
# section take the CS model's defaults (so a config without them fails the checks below).
CS_DEFAULTS: dict[str, Any] = {
    "share_embedding_weights": True,
    "max_position_embeddings": 1024,
    "position_embedding_type": "learned",
    "layer_norm_epsilon": 1.0e-5,
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "nonlinearity": "gelu",
    "use_ffn_bias": True,
    "use_bias_in_output": False,
    "norm_first": True,
    "norm_type": "layernorm",
    "pos_scaling_factor": 1.0,
}
# Model Zoo llama.py lines 579-690 and 887-889: CS fields that must hold one value (HF has no
# equivalent); checked when present (after CS_DEFAULTS), written on import (lines 724-741) but
# the two pre-2.0 flags.
CS_FIXED: dict[str, Any] = {
    "position_embedding_type": "rotary",
    "use_position_embedding": True,
    "embedding_dropout_rate": 0.0,
    "embedding_layer_norm": False,
    "attention_type": "scaled_dot_product",
    "use_projection_bias_in_attention": False,
    "use_ffn_bias_in_attention": False,
    "use_ffn_bias": False,
    "attention_dropout_rate": 0.0,
    "dropout_rate": 0.0,
    "use_bias_in_output": False,
    "fixed_sparse_attention": None,
    "norm_first": True,
    "use_ff_layer1_dropout": False,
    "use_rms_norm": True,
    "norm_type": "rmsnorm",
}
CS_MAPPED = frozenset(
    {
        "vocab_size", "hidden_size", "num_heads", "num_hidden_layers", "max_position_embeddings",
        "filter_size", "nonlinearity", "rope_theta", "layer_norm_epsilon", "initializer_range",
        "share_embedding_weights", "attention_module", "extra_attention_params", "rotary_dim",
        "pos_scaling_factor", "pos_scaling_type", "pos_scaling_extra_args",
        "attention_sliding_window_length",
    }
)  # fmt: skip
# Fields with no effect on the weights or the HF config (precision, loss, initialisers, name).
CS_IGNORED = frozenset(
    {
        "name", "mixed_precision", "fp16_type", "boundary_casting", "loss_scaling", "loss_weight",
        "attention_softmax_fp32", "attention_kernel", "compute_eval_metrics", "initializer",
        "embedding_initializer", "output_layer_initializer", "ffn_initializer",
        "ffn_output_layer_initializer", "attention_initializer", "use_bfloat16", "dtype",
        "precision_opt_level", "label_smoothing", "z_loss_coef",
    }
)  # fmt: skip
_PRE_2_0 = ("use_position_embedding", "use_rms_norm")  # checked, not written
_WINDOW = ("sliding_window", "attention_sliding_window_length")


def llama_config(
    model_type: str, theta: float, more: tuple = (), known: frozenset[str] = frozenset()
) -> tuple:
    """LLaMA's rules with the family's HF ``model_type``, its HF ``rope_theta`` default
    (``theta``), further fields it maps itself (``known``) and steps (``more``): the CS defaults
    and checks (lines 579-690, 772-805 ``rotary_dim``; ours: a field no rule knows is refused),
    the renames, GLU activations (lines 743-770), GQA (lines 917-957), RoPE (lines 1056-1123)."""
    return (
        Op("architecture", {"model_type": True}),
        Fixed(HF, {"model_type": model_type}, "model_type={got!r}: expected {want!r}"),
        Op("rms norm flag"),
        Defaults(CS, {**CS_DEFAULTS, "initializer_range": 0.02}),
        Defaults(HF, HF_DEFAULTS),
        Op("refuse mup", {"as_name": "llama"}),  # its muP fields (mup.py), Mixtral's too
        Fixed(CS, CS_FIXED, "{key}={got!r}: HF LLaMA needs {want!r}"),
        Op(
            "known fields",
            {"known": CS_MAPPED | CS_FIXED.keys() | CS_IGNORED | known, "as_name": "llama"},
        ),
        Required(
            CS,
            ("vocab_size", "hidden_size", "num_heads", "num_hidden_layers", "filter_size"),
            "{key}: required in the CS model section",
        ),
        Op("rotary dim is the head size"),
        Op("kv heads default"),
        Op("no biases"),
        Renames(DECODER_SIZES),
        Op("glu activation", {"hf": "hidden_act"}),
        Renames(
            (("rms_norm_eps", "layer_norm_epsilon"), ("initializer_range", "initializer_range"))
        ),
        Op("bool", {"hf": "tie_word_embeddings", "cs": "share_embedding_weights"}),
        Op("rotary dim"),
        Op("rope", {"theta": theta}),
        Written(HF, {k: v for k, v in CS_FIXED.items() if k not in _PRE_2_0}),
        Op("kv heads"),
        *more,
    )


# LLaMA: no sliding window; transformers' bias flags written false.
LLAMA_CONFIG = llama_config(
    "llama",
    10000.0,
    (
        Fixed(CS, {_WINDOW[1]: None}, "{key}: LLaMA has no sliding window"),
        Written(CS, {"attention_bias": False, "mlp_bias": False}),
    ),
)
# Mistral (mistral.py lines 96-110): LLaMA's rules and the sliding window.
SLIDING_WINDOW = (
    Defaults(CS, {_WINDOW[1]: None}),
    Defaults(HF, {_WINDOW[0]: None}),
    Renames((_WINDOW,)),
)
MISTRAL_CONFIG = llama_config("mistral", 10000.0, SLIDING_WINDOW)
# Mixtral (mixtral.py lines 458-510): Mistral's and ``moe``; HF MixtralConfig's rope_theta
# default is 1e6.
MIXTRAL_CONFIG = llama_config("mixtral", 1e6, (*SLIDING_WINDOW, Op("moe")), frozenset({"moe"}))
