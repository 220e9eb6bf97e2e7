"""RoBERTa: Cerebras ``BertPretrainModel`` configured as RoBERTa (no NSP, padding-aware
positions) <-> Hugging Face ``RobertaForMaskedLM``.

Model Zoo, tag Release_2.10.0: ``src/cerebras/modelzoo/tools/checkpoint_converters/roberta.py``
(``Converter_RobertaPretrainModel_HF_CS`` lines 39-128, its ``post_model_convert`` lines
164-200, ``ConfigConverter_Roberta_HF_CS18`` lines 203-337 and the 2.1 converters lines
346-434), built on the BERT encoder rules of ``bert.py`` (see :mod:`.bert`, whose helpers this
module reuses). ``registry.py`` lines 294-297 name the model ``roberta``.

Positions: HF counts position embeddings from ``padding_idx + 1`` and calls the table size
``max_position_embeddings`` (MSL + pad + 1); CS calls the MSL ``max_position_embeddings`` and,
with ``mask_padding_in_positional_embed``, sizes its table MSL + ``pad_token_id`` + 1
(``layers/LearnedPositionEmbeddingLayer.py`` lines 33-37, ``models/nlp/bert/bert_model.py``
lines 446-453). The tables are the same tensor; only the config number moves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.bert_config import ROBERTA_CS_DEFAULTS, ROBERTA_HF_DEFAULTS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.config_bert import num_segments
from ckpt_migrate.hf.encoders import check_name, layers_of, with_defaults
from ckpt_migrate.hf.layouts import bert_like
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)

_HF_DEFAULTS, _CS_DEFAULTS = ROBERTA_HF_DEFAULTS, ROBERTA_CS_DEFAULTS  # the context reads them
_CS_P, _HF_P = "bert_encoder.", "roberta."


config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs


TABLE = bert_like.ROBERTA


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: Converter_RobertaPretrainModel_HF_CS21 (roberta.py lines 413-434) either way:
    the BERT encoder (no pooler: RobertaForMaskedLM has none) and the MLM transform,
    ``lm_head.dense`` and ``lm_head.layer_norm`` (roberta.py lines 50-69). CS may have no
    segment embeddings (HF then gets a zero table of one row); the tied MLM decoder weight is
    imported only when the HF file has it, as Model Zoo does (roberta.py lines 70-79;
    ``save_pretrained`` leaves it out); the MLM bias from ``lm_head.decoder.bias`` or
    ``lm_head.bias`` (ours on purpose: Model Zoo drops ``lm_head.bias``, line 90, and writes
    zeros instead), or zeros of ``vocab_size`` when the file has neither (lines 183-192)."""
    check_name(name, NAMES)
    if direction == TO_HF:
        cfg = with_defaults(config, _CS_DEFAULTS)
        segments, key = num_segments(cfg) > 0, "share_embedding_weights"
    else:
        cfg = with_defaults(config, _HF_DEFAULTS)
        segments, key = True, "tie_word_embeddings"
    layers = layers_of(cfg, "num_hidden_layers", 12)
    tied = cfg[key]
    flags = {"zero bias"} | ({"segments"} if segments else set()) | ({"tied"} if tied else set())
    dims = {"mlm": "lm_head", "cfg": cfg, "side": "CS" if direction == TO_HF else "HF"}
    return Ctx(shapes, layers, _HF_P, frozenset(flags), dims, cs_prefix=_CS_P)


plan_to_hf, plan_to_cs = plans(TABLE, context)
