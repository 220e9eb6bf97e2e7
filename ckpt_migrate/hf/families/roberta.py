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
from ckpt_migrate.hf.families._bert_common import check_name, expect, layers_of, with_defaults
from ckpt_migrate.hf.families.bert import (
    CS_DEFAULTS,
    HF_DEFAULTS,
    check_pooler_and_mlm,
    encoder_config_to_cs,
    encoder_config_to_hf,
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

# Defaults Model Zoo fills in before converting (roberta.py lines 240-255).
_HF_DEFAULTS = {
    **HF_DEFAULTS,
    "vocab_size": 50265,
    "position_embedding_type": "absolute",
    "type_vocab_size": 2,
    "pad_token_id": 1,
}
_CS_DEFAULTS = {
    **CS_DEFAULTS,
    "disable_nsp": False,
    "pad_token_id": 0,
    "mask_padding_in_positional_embed": False,
}
# The one value HF RoBERTa can express (roberta.py lines 225-236).
_CS_REQUIRED = {"disable_nsp": True, "mask_padding_in_positional_embed": True}
_HF_REQUIRED = {"is_decoder": False, "add_cross_attention": False}

_CS_P, _HF_P = "bert_encoder.", "roberta."


def _num_segments(cs: Mapping[str, Any]) -> int:
    """CS ``num_segments`` defaults to 0 without NSP, else 2 (roberta.py lines 312-314)."""
    value = cs.get("num_segments")
    if value is None:
        value = 0 if cs.get("disable_nsp") else 2
    return int(value)


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: ConfigConverter_Roberta_HF_CS21 (roberta.py lines 346-364), CS -> HF.

    ``max_position_embeddings`` grows by ``pad_token_id + 1`` (lines 282-302); CS without
    segment embeddings (``num_segments`` 0) becomes ``type_vocab_size`` 1 (lines 265-280)."""
    check_name(name, NAMES)
    cs = with_defaults(cs_model, _CS_DEFAULTS)
    expect(cs, _CS_REQUIRED, "HF")
    if cs.get("mlm_nonlinearity", "gelu") != "gelu":
        raise MappingError(f"mlm_nonlinearity={cs['mlm_nonlinearity']!r}: HF RoBERTa uses gelu")
    check_pooler_and_mlm({**cs, "mlm_nonlinearity": None})
    if "max_position_embeddings" not in cs:
        raise MappingError("max_position_embeddings: required to size HF's position table")
    out: dict[str, Any] = {"architectures": [ARCHITECTURES[name]], "model_type": MODEL_TYPE}
    out.update(encoder_config_to_hf(cs))
    out["max_position_embeddings"] = cs["max_position_embeddings"] + cs["pad_token_id"] + 1
    out["pad_token_id"] = cs["pad_token_id"]
    out["type_vocab_size"] = _num_segments(cs) or 1
    return out


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: the same converter, HF -> CS; the CS side gets ``disable_nsp``,
    ``mask_padding_in_positional_embed``, ``mlm_nonlinearity: gelu`` and ``pooler_nonlinearity:
    tanh`` (roberta.py lines 257-263 and 318-337, bert.py lines 1077-1082)."""
    check_name(name, NAMES)
    if hf_config.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise MappingError(f"model_type={hf_config['model_type']!r}: expected 'roberta'")
    hf = with_defaults(hf_config, _HF_DEFAULTS)
    expect(hf, _HF_REQUIRED, "CS")
    out = encoder_config_to_cs(hf)
    out["max_position_embeddings"] = hf["max_position_embeddings"] - hf["pad_token_id"] - 1
    out["num_segments"] = hf["type_vocab_size"]
    out["pad_token_id"] = hf["pad_token_id"]
    out["disable_nsp"] = True
    out["mask_padding_in_positional_embed"] = True
    out["mlm_nonlinearity"] = "gelu"
    out["pooler_nonlinearity"] = "tanh"
    return out


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
        segments, key = _num_segments(cfg) > 0, "share_embedding_weights"
    else:
        cfg = with_defaults(config, _HF_DEFAULTS)
        segments, key = True, "tie_word_embeddings"
    layers = layers_of(cfg, "num_hidden_layers", 12)
    tied = cfg[key]
    flags = {"zero bias"} | ({"segments"} if segments else set()) | ({"tied"} if tied else set())
    dims = {"mlm": "lm_head", "cfg": cfg, "side": "CS" if direction == TO_HF else "HF"}
    return Ctx(shapes, layers, _HF_P, frozenset(flags), dims, cs_prefix=_CS_P)


plan_to_hf, plan_to_cs = plans(TABLE, context)
