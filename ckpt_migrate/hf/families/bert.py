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
from ckpt_migrate.catalogue.bert_config import BERT_CS_DEFAULTS, BERT_HF_DEFAULTS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.encoders import (
    bitwise_equal,  # noqa: F401 (the tied-copy check, tested as bert.bitwise_equal)
    check_name,
    layers_of,
)
from ckpt_migrate.hf.layouts import bert_like
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
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

HF_DEFAULTS, CS_DEFAULTS = BERT_HF_DEFAULTS, BERT_CS_DEFAULTS  # Model Zoo's (bert.py 933-953)
config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs


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
    always (ours on purpose, :func:`~ckpt_migrate.hf.encoders.mlm_bias_to_cs`).
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
