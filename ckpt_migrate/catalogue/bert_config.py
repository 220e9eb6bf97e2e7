"""The Hugging Face config table of ESM-2 (``bert_like.py``), in the vocabulary of
``config.py``, and BERT's HF defaults it starts from. Model Zoo, tag Release_2.10.0,
``src/cerebras/modelzoo/tools/checkpoint_converters/``: ``bert.py``
(``ConfigConverter_Bert_HF_CS17``, lines 814-1082), ``esm2.py`` (``ConfigConverter_Esm2_HF_CS21``,
lines 358-604).
"""

from __future__ import annotations

from typing import Any

from ckpt_migrate.catalogue.config import CS, HF, Defaults, Fixed, Op, Renames, Required, Written

# HF defaults Model Zoo fills in before converting (bert.py lines 933-947).
BERT_HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "layer_norm_eps": 1e-12,
    "tie_word_embeddings": True,
}
# CS model field <-> HF config field, copied when present (ConfigConverter_Bert_HF_CS17, bert.py
# lines 822-930; esm2.py lines 380-399 add the ESM fields). Not ``hidden_act``: ESM's rule for
# ``encoder_nonlinearity`` only asserts gelu (esm2.py lines 368-371) and EsmConfig has none.
_ESM2_RENAMED = (
    ("vocab_size", "vocab_size"),
    ("share_embedding_weights", "tie_word_embeddings"),
    ("hidden_size", "hidden_size"),
    ("num_heads", "num_attention_heads"),
    ("num_hidden_layers", "num_hidden_layers"),
    ("filter_size", "intermediate_size"),
    ("dropout_rate", "hidden_dropout_prob"),
    ("attention_dropout_rate", "attention_probs_dropout_prob"),
    ("layer_norm_epsilon", "layer_norm_eps"),
    ("initializer_range", "initializer_range"),
    ("embedding_layer_norm", "emb_layer_norm_before"),
    ("token_dropout", "token_dropout"),
    ("mask_token_id", "mask_token_id"),
    ("pad_token_id", "pad_token_id"),
)
# HF defaults Model Zoo fills in (bert.py lines 933-947, esm2.py lines 409-416); the position
# type is EsmConfig's default (Model Zoo leaves a missing one unconverted).
ESM2_HF_DEFAULTS: dict[str, Any] = {
    **BERT_HF_DEFAULTS,
    "mask_token_id": None,
    "pad_token_id": None,
    "token_dropout": False,
    "emb_layer_norm_before": False,
    "position_embedding_type": "absolute",
}
# CS defaults Model Zoo fills in (bert.py lines 948-953, esm2.py lines 417-426); the position
# type is BertModelConfig's default (models/nlp/bert/bert_model.py).
ESM2_CS_DEFAULTS: dict[str, Any] = {
    "share_embedding_weights": True,
    "encoder_nonlinearity": "gelu",
    "disable_nsp": False,
    "pad_token_id": 0,
    "mask_padding_in_positional_embed": False,
    "use_final_layer_norm": False,
    "token_dropout": False,
    "embedding_layer_norm": True,
    "position_embedding_type": "learned",
}
# CS fields BERT-like HF encoders can express with one value only (bert.py lines 900-929).
ENCODER_FIXED: dict[str, Any] = {
    "attention_type": "scaled_dot_product",
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True,
    "use_ffn_bias_in_mlm": True,
    "use_output_bias_in_mlm": True,
}
# CS fields with the one value HF ESM can express: esm2.py lines 368-379 and 400-403, bert.py
# lines 900-929; ``norm_first`` and ``attention_module`` are ours (HF ESM is a pre-LN encoder
# with plain multi-head attention; Model Zoo does not check them).
_ESM2_CS_FIXED: dict[str, Any] = {
    "encoder_nonlinearity": "gelu",
    "use_final_layer_norm": True,
    "disable_nsp": True,
    **ENCODER_FIXED,
    "norm_first": True,
    "attention_module": "aiayn_attention",
}
# HF fields Model Zoo requires (bert.py lines 884-895); ``is_folding_model`` is ours (ESMFold is
# another class, ``EsmForProteinFolding``).
_ESM2_HF_FIXED: dict[str, Any] = {
    "hidden_act": "gelu",
    "is_decoder": False,
    "add_cross_attention": False,
    "is_folding_model": False,
}
# ESM-2: BERT's renames and ESM's (its CS side as (CS, HF) pairs above), the one value each
# side can express, the positions (esm2.py lines 494-569), ``rope_theta`` (ours: Model Zoo has
# no rule for it, a non-default one would be lost), what Model Zoo writes after converting
# (lines 427-438, bert.py line 1228). ``model_type`` is ``esm``: Model Zoo writes ``bert`` (the
# BERT post default of bert.py line 955 its ESM subclass does not override), which transformers
# would build as a BERT model.
ESM2_CONFIG = (
    Op("architecture", {"model_type": True}),
    Fixed(HF, {"model_type": "esm"}, "{key}={got!r}: expected {want!r}"),
    Op("refuse mup"),
    Defaults(HF, ESM2_HF_DEFAULTS),
    Defaults(CS, ESM2_CS_DEFAULTS),
    Fixed(CS, _ESM2_CS_FIXED, "{key}={got!r}: only {want!r} converts to HF"),
    Fixed(HF, _ESM2_HF_FIXED, "{key}={got!r}: only {want!r} converts to CS"),
    Op("esm heads"),
    Required(
        CS,
        ("hidden_size", "num_heads", "max_position_embeddings"),
        "{key}: required in the CS model section",
    ),
    Op("token dropout needs a mask token"),
    Op("esm rotary dim"),
    Renames(tuple((hf, cs) for cs, hf in _ESM2_RENAMED)),
    # bert.py lines 856-859: ``hidden_act`` is the encoder's nonlinearity (ESM's rule only
    # asserts gelu, so there is no HF field written back)
    Renames((("hidden_act", "encoder_nonlinearity"),), side=HF),
    Op("bool", {"hf": "emb_layer_norm_before", "cs": "embedding_layer_norm", "side": HF}),
    Op("esm positions"),
    Op("rope theta", {"default": 10000.0}),  # CS BertModelConfig and HF EsmConfig default
    Written(CS, {"is_folding_model": False, "esmfold_config": None}),
    Written(
        HF, {"use_final_layer_norm": True, "disable_nsp": True, "freeze_ffn_bias_in_glu": False}
    ),
)


# BERT (ConfigConverter_Bert_HF_CS17/21, bert.py lines 814-1082 and 1223-1235, and the
# fine-tuning ConfigConverter_*_HF_CS21, bert_finetune.py lines 213-722) and RoBERTa
# (ConfigConverter_Roberta_HF_CS21, roberta.py lines 225-364), on the same encoder rules.
# CS model field <-> HF config field, copied as they are (ConfigConverter_Bert_HF_CS17, bert.py
# lines 822-930). Model Zoo copies a field only when the source config has it.
BERT_RENAMED = (
    ("vocab_size", "vocab_size"),
    ("max_position_embeddings", "max_position_embeddings"),
    ("share_embedding_weights", "tie_word_embeddings"),
    ("hidden_size", "hidden_size"),
    ("num_heads", "num_attention_heads"),
    ("num_hidden_layers", "num_hidden_layers"),
    ("filter_size", "intermediate_size"),
    ("encoder_nonlinearity", "hidden_act"),
    ("dropout_rate", "hidden_dropout_prob"),
    ("attention_dropout_rate", "attention_probs_dropout_prob"),
    ("layer_norm_epsilon", "layer_norm_eps"),
    ("initializer_range", "initializer_range"),
)
# CS defaults Model Zoo fills in (bert.py lines 948-953).
BERT_CS_DEFAULTS: dict[str, Any] = {"share_embedding_weights": True, "encoder_nonlinearity": "gelu"}
# CS fields with the one value HF BERT can express (assert_factory_fn rules, bert.py lines
# 900-929), plus BertModelConfig layout fields a HF BERT cannot have (ours: Model Zoo fails on
# them as unmatched keys).
_BERT_CS_FIXED: dict[str, Any] = {
    **ENCODER_FIXED,
    "norm_first": False,
    "embedding_layer_norm": True,
    "attention_module": "aiayn_attention",
}
# HF fields Model Zoo requires (bert.py lines 884-895).
_BERT_HF_FIXED: dict[str, Any] = {
    "type_vocab_size": 2,
    "is_decoder": False,
    "add_cross_attention": False,
}

# Defaults Model Zoo fills in before converting (roberta.py lines 240-255).
ROBERTA_HF_DEFAULTS: dict[str, Any] = {
    **BERT_HF_DEFAULTS,
    "vocab_size": 50265,
    "position_embedding_type": "absolute",
    "type_vocab_size": 2,
    "pad_token_id": 1,
}
ROBERTA_CS_DEFAULTS: dict[str, Any] = {
    **BERT_CS_DEFAULTS,
    "disable_nsp": False,
    "pad_token_id": 0,
    "mask_padding_in_positional_embed": False,
}
# The one value HF RoBERTa can express (roberta.py lines 225-236).
_ROBERTA_CS_FIXED = {"disable_nsp": True, "mask_padding_in_positional_embed": True}
_ROBERTA_HF_FIXED = {"is_decoder": False, "add_cross_attention": False}

_ONLY_HF = "{key}={got!r}: only {want!r} converts to HF"
_ONLY_CS = "{key}={got!r}: only {want!r} converts to CS"


def _encoder(*between: Any) -> tuple:
    """The encoder rules BERT and RoBERTa share (bert.py lines 814-931): muP refused (not
    folded: catalogue/mup.py BERT_MUP), the fixed fields, the renames, learned positions as HF
    ``absolute``; ``between``: steps after the checks, before the renames."""
    return (
        Op("refuse mup", {"as_name": "bert"}),
        Fixed(CS, _BERT_CS_FIXED, _ONLY_HF),
        *between,
        Renames(tuple((hf, cs) for cs, hf in BERT_RENAMED)),
        Op("bert positions"),
    )


BERT_CONFIG = (
    Op("architecture", {"model_type": True}),
    Fixed(HF, {"model_type": "bert"}, "{key}={got!r}: expected {want!r}"),
    Defaults(HF, BERT_HF_DEFAULTS),
    Defaults(CS, BERT_CS_DEFAULTS),
    Fixed(HF, _BERT_HF_FIXED, _ONLY_CS),
    Op("bert pooler and mlm"),
    Op("bert nsp"),
    *_encoder(),
    Op("bert heads"),
    Written(HF, {"pooler_nonlinearity": "tanh"}),
    Op("mlm nonlinearity"),
    Op("bert pretraining"),
)
ROBERTA_CONFIG = (
    Op("architecture", {"model_type": True}),
    Fixed(HF, {"model_type": "roberta"}, "{key}={got!r}: expected {want!r}"),
    Defaults(HF, ROBERTA_HF_DEFAULTS),
    Defaults(CS, ROBERTA_CS_DEFAULTS),
    Fixed(CS, _ROBERTA_CS_FIXED, _ONLY_HF),
    Fixed(HF, _ROBERTA_HF_FIXED, _ONLY_CS),
    Op("roberta mlm"),
    Required(CS, ("max_position_embeddings",), "{key}: required to size HF's position table"),
    *_encoder(),
    Op("roberta positions"),
    Written(
        HF,
        {
            "disable_nsp": True,
            "mask_padding_in_positional_embed": True,
            "mlm_nonlinearity": "gelu",
            "pooler_nonlinearity": "tanh",
        },
    ),
)
