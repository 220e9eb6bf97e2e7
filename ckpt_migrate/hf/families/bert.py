"""BERT: Cerebras ``BertPretrainModel`` / ``BertForSequenceClassification`` /
``BertForTokenClassification`` / BERT question answering <-> Hugging Face ``BertForPreTraining`` /
``BertForSequenceClassification`` / ``BertForTokenClassification`` / ``BertForQuestionAnswering``.

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:
``bert.py`` (encoder rules ``Converter_BertModel_CS16_CS17`` lines 78-298, pretraining heads
``Converter_BertPretrainModel_CS16_CS17`` lines 538-629, the 2.1 position-embedding rename
``Converter_BertModel_WithoutOptionalModel_HF_CS21`` lines 1238-1265, config rules
``ConfigConverter_Bert_HF_CS17`` / ``_CS18`` / ``_CS21`` lines 807-1091 and 1223-1235) and
``bert_finetune.py`` (the three fine-tuning heads and their config rules, lines 41-55, 213-261,
351-418, 437-454, 510-541, 568-766). ``registry.py`` lines 174-208 name the models.

``bert-summarization`` is not served: Model Zoo has no HF converter for it (``registry.py``
lines 197-202 list only CS <-> CS converters). muP: Model Zoo's ``*_HF_CS23`` converters
(``bert.py`` lines 1302-1378) turn a muP BERT into standard parametrisation on the way to HF;
``export-hf`` folds it before these rules run (``hf/mup.py``), so a muP config reaching them is
refused naming the field. Everything in this file is a rename.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.bert_config import BERT_HF_DEFAULTS, ENCODER_FIXED
from ckpt_migrate.hf import mup
from ckpt_migrate.hf.families._bert_common import (
    bitwise_equal,  # noqa: F401 (the tied-copy check, tested as bert.bitwise_equal)
    check_name,
    expect,
    layers_of,
    with_defaults,
)
from ckpt_migrate.hf.layouts import bert_like
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
MODEL_TYPE = HF_MODEL_TYPES[0]
ARCHITECTURES = catalogue.hf_architectures(__name__)
_NAME_OF = {cls: name for name, cls in ARCHITECTURES.items()}
PRETRAINING = _NAME_OF["BertForPreTraining"]  # the others are fine-tuning models
SEQUENCE_CLASSIFIER = _NAME_OF["BertForSequenceClassification"]
QA = _NAME_OF["BertForQuestionAnswering"]
TOKEN_CLASSIFIER = _NAME_OF["BertForTokenClassification"]
# HF tensors Model Zoo drops on import: the position_ids buffer older transformers saved
# (bert.py lines 113-118). (The duplicate decoder bias, line 589, is read and dropped by
# mlm_to_cs.)
HF_DROPPED = re.compile(r"(?:bert|roberta)\.embeddings\.(?:position_ids|token_type_ids)")

# CS model field <-> HF config field, copied as they are (ConfigConverter_Bert_HF_CS17, bert.py
# lines 822-930). Model Zoo copies a field only when the source config has it.
RENAMED = (
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
HF_DEFAULTS = BERT_HF_DEFAULTS  # Model Zoo fills them in before converting
# CS defaults Model Zoo fills in (bert.py lines 948-953).
CS_DEFAULTS: dict[str, Any] = {"share_embedding_weights": True, "encoder_nonlinearity": "gelu"}
# CS fields with the one value HF BERT can express (assert_factory_fn rules, bert.py lines
# 900-929), plus BertModelConfig layout fields a HF BERT cannot have (ours: Model Zoo fails on
# them as unmatched keys).
CS_REQUIRED: dict[str, Any] = {
    **ENCODER_FIXED,
    "norm_first": False,
    "embedding_layer_norm": True,
    "attention_module": "aiayn_attention",
}
# HF fields Model Zoo requires (bert.py lines 884-895).
HF_REQUIRED: dict[str, Any] = {
    "type_vocab_size": 2,
    "is_decoder": False,
    "add_cross_attention": False,
}

# ----------------------------------------------------------------------------- config helpers


def hf_position_type(cs_model: Mapping[str, Any]) -> str:
    """CS ``learned`` is HF ``absolute``; nothing else converts (bert.py lines 957-988)."""
    kind = cs_model.get("position_embedding_type", "learned")
    if kind != "learned":
        raise MappingError(f"position_embedding_type={kind!r}: HF BERT has learned positions only")
    return "absolute"


def cs_position_type(hf_config: Mapping[str, Any]) -> str:
    kind = hf_config.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise MappingError(f"position_embedding_type={kind!r}: CS BERT has no relative positions")
    return "learned"


def check_pooler_and_mlm(cs: Mapping[str, Any]) -> None:
    """HF's pooler is tanh and its MLM transform uses ``hidden_act``. A CS config without
    ``pooler_nonlinearity`` pools with ``encoder_nonlinearity`` (bert.py lines 1058-1065),
    and ``mlm_nonlinearity`` must equal the encoder's (lines 990-1005)."""
    if "pooler_nonlinearity" in cs:
        if cs["pooler_nonlinearity"] != "tanh":
            raise MappingError(f"pooler_nonlinearity={cs['pooler_nonlinearity']!r}: HF uses tanh")
    elif cs["encoder_nonlinearity"] != "tanh":
        raise MappingError(
            "pooler_nonlinearity: absent, so CS pools with encoder_nonlinearity="
            f"{cs['encoder_nonlinearity']!r}; HF only pools with tanh"
        )
    mlm = cs.get("mlm_nonlinearity")
    if mlm is not None and mlm != cs["encoder_nonlinearity"]:
        raise MappingError(f"mlm_nonlinearity={mlm!r}: HF uses hidden_act for the MLM transform")


def encoder_config_to_hf(cs: Mapping[str, Any]) -> dict[str, Any]:
    """The encoder fields shared by BERT and RoBERTa (ConfigConverter_Bert_HF_CS17, bert.py
    lines 814-931): renamed when present, positions ``learned`` -> ``absolute``."""
    mup.refuse(cs, NAMES[0])  # not folded: catalogue/mup.py BERT_MUP
    expect(cs, CS_REQUIRED, "HF")
    out = {hf: cs[key] for key, hf in RENAMED if key in cs}
    out["position_embedding_type"] = hf_position_type(cs)
    return out


def encoder_config_to_cs(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The reverse of :func:`encoder_config_to_hf`, after Model Zoo's HF defaults."""
    out = {key: hf[name] for key, name in RENAMED if name in hf}
    out["position_embedding_type"] = cs_position_type(hf)
    return out


def _num_labels(hf: Mapping[str, Any]) -> int:
    """HF ``num_labels`` is ``len(id2label)``, else 2 (bert_finetune.py lines 240-244)."""
    if "num_labels" in hf:
        return int(hf["num_labels"])
    return len(hf["id2label"]) if hf.get("id2label") else 2


def _head_config_to_cs(hf: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The fine-tuning heads' fields (bert_finetune.py lines 213-261, 351-418, 510-541)."""
    dropout = hf.get("classifier_dropout")
    if dropout is None:
        dropout = hf["hidden_dropout_prob"]
    if name == SEQUENCE_CLASSIFIER:
        labels = _num_labels(hf)
        problem = hf.get("problem_type")
        if problem is None:
            if labels != 1:
                raise MappingError(
                    "problem_type: absent and num_labels != 1; Model Zoo cannot infer single- "
                    "or multi-label classification, set problem_type in config.json"
                )
            problem = "regression"
        return {"task_dropout": dropout, "num_labels": labels, "problem_type": problem}
    if name == TOKEN_CLASSIFIER:
        return {
            "encoder_output_dropout_rate": dropout,
            "num_classes": _num_labels(hf),
            "loss_weight": 1.0,
            "include_padding_in_loss": False,
        }
    if name == QA and _num_labels(hf) != 2:
        raise MappingError(f"num_labels={_num_labels(hf)}: BERT QA has exactly 2 (start, end)")
    return {}


def _head_config_to_hf(cs: Mapping[str, Any], name: str) -> dict[str, Any]:
    if name == SEQUENCE_CLASSIFIER:
        out = {"num_labels": cs.get("num_labels", 2)}
        if "task_dropout" in cs:
            out["classifier_dropout"] = cs["task_dropout"]
        if "problem_type" in cs:
            out["problem_type"] = cs["problem_type"]
        return out
    if name == TOKEN_CLASSIFIER:
        out = {"num_labels": cs.get("num_classes", 2)}
        if "encoder_output_dropout_rate" in cs:
            out["classifier_dropout"] = cs["encoder_output_dropout_rate"]
        return out
    if name == QA:
        return {"num_labels": 2}
    return {}


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: ConfigConverter_Bert_HF_CS21 (bert.py lines 1223-1235) and the fine-tuning
    ConfigConverter_*_HF_CS21 (bert_finetune.py lines 568-722), CS -> HF direction."""
    check_name(name, NAMES)
    cs = with_defaults(cs_model, CS_DEFAULTS)
    check_pooler_and_mlm(cs)
    if cs.get("disable_nsp", False):
        raise MappingError("disable_nsp=True: HF BERT models keep the NSP segment embeddings")
    if cs.get("num_segments") not in (None, 2):  # None: 2 with NSP (bert_model.py line 206)
        raise MappingError(f"num_segments={cs['num_segments']!r}: HF BERT has type_vocab_size=2")
    out = {"architectures": [ARCHITECTURES[name]], "model_type": MODEL_TYPE}
    out.update(encoder_config_to_hf(cs))
    out.update(_head_config_to_hf(cs, name))
    return out


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: the same converters, HF -> CS direction; the CS side gets
    ``pooler_nonlinearity: tanh`` and ``mlm_nonlinearity`` = ``hidden_act`` (bert.py lines
    1077-1082), BERT pretraining also ``freeze_ffn_bias_in_glu: False`` (line 1228)."""
    check_name(name, NAMES)
    if hf_config.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise MappingError(f"model_type={hf_config['model_type']!r}: expected 'bert'")
    hf = with_defaults(hf_config, HF_DEFAULTS)
    expect(hf, HF_REQUIRED, "CS")
    out = encoder_config_to_cs(hf)
    out.update(_head_config_to_cs(hf, name))
    out["pooler_nonlinearity"] = "tanh"
    out["mlm_nonlinearity"] = out["encoder_nonlinearity"]
    if name == PRETRAINING:
        out["freeze_ffn_bias_in_glu"] = False
    return out


# ----------------------------------------------------------------------------- tensors

TABLE = bert_like.BERT


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: Converter_BertPretrainModel_HF_CS21 and Converter_BertFor*_HF_CS21 (bert.py
    lines 1268-1299, bert_finetune.py lines 591-766), renames only, either way. BertPretrainModel
    names its encoder ``bert_encoder``, the fine-tuning models ``bert`` (bert.py line 544,
    bert_finetune.py line 47); HF token classification and QA have no pooler. Tied, the word
    embeddings come from whichever of the two tied CS names the file has; on import the tied MLM
    decoder weight is written only when the HF file has it, as Model Zoo does, the MLM bias
    always (ours on purpose, :func:`~ckpt_migrate.hf.families._bert_common.mlm_bias_to_cs`).
    HF's ``position_ids`` buffer, when an old file has it, is dropped (``HF_DROPPED``; bert.py
    lines 113-118)."""
    check_name(name, NAMES)
    layers = layers_of(config, "num_hidden_layers", 12)
    key = "share_embedding_weights" if direction == TO_HF else "tie_word_embeddings"
    flags = {"segments"} | ({"tied"} if config.get(key, True) else set())
    if name in (PRETRAINING, SEQUENCE_CLASSIFIER):
        flags.add("pooler")
    flags.add({PRETRAINING: "mlm", QA: "qa"}.get(name, "classifier"))
    dims = {"mlm": "cls.predictions", "side": "CS" if direction == TO_HF else "HF"}
    cs_prefix = "bert_encoder." if name == PRETRAINING else "bert."
    return Ctx(shapes, layers, "bert.", frozenset(flags), dims, cs_prefix=cs_prefix)


plan_to_hf, plan_to_cs = plans(TABLE, context)
