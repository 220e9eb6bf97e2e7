"""The named operations of the BERT-like families' config tables
(``catalogue/bert_config.py``: ESM-2, BERT and its fine-tuning models, RoBERTa), each a pair
as in ``config_ops.py``: (exporting, importing). Model Zoo (tag Release_2.10.0,
``src/cerebras/modelzoo/tools/checkpoint_converters/``): ``bert.py``, ``bert_finetune.py``,
``roberta.py``, ``esm2.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate.catalogue.config import CS
from ckpt_migrate.hf.config_ops import Fn, State
from ckpt_migrate.hf.mapping import MappingError


def _esm_heads(s: State) -> None:
    """esm2.py lines 372-375, bert.py lines 864-867: HF's MLM transform is GELU, its pooler
    tanh."""
    for key, wanted in (("mlm_nonlinearity", "gelu"), ("pooler_nonlinearity", "tanh")):
        if s.src.get(key) not in (None, wanted):
            raise MappingError(f"{key}={s.src[key]!r}: only {wanted!r} converts to HF")


def _token_dropout(s: State) -> None:
    """esm2.py lines 478-492: token dropout needs the mask token's id."""
    src = s.src
    missing = src.get("mask_token_id") is None if s.side == CS else src["mask_token_id"] is None
    if src["token_dropout"] and missing:
        raise MappingError("mask_token_id: required when token_dropout is true")


def _esm_rotary_dim(s: State) -> None:
    """esm2.py lines 457-476: a rotary model converts only when ``rotary_dim`` is the head size.
    Ours: an absent ``rotary_dim`` fails too (CS then rotates a quarter of each head,
    bert_model.py lines 293-294, which HF cannot)."""
    cs = s.src
    if cs["position_embedding_type"] != "rotary":
        return
    if cs.get("rotary_dim") != cs["hidden_size"] // cs["num_heads"]:
        raise MappingError(
            f"rotary_dim={cs.get('rotary_dim')!r}: must be hidden_size // num_heads for HF"
        )


def _esm_positions_to_hf(s: State) -> None:
    """esm2.py lines 494-569: rotary stays rotary; learned needs
    ``mask_padding_in_positional_embed`` and becomes absolute, whose table HF sizes MSL +
    ``pad_token_id`` + 1."""
    cs = s.src
    kind, msl = cs["position_embedding_type"], cs["max_position_embeddings"]
    if kind == "rotary":
        s.out.update(position_embedding_type="rotary", max_position_embeddings=msl)
        return
    if kind != "learned":
        raise MappingError(f"position_embedding_type={kind!r}: HF ESM has rotary or absolute")
    if cs["mask_padding_in_positional_embed"] is not True:
        raise MappingError(
            "mask_padding_in_positional_embed: must be true for learned positions (HF ESM)"
        )
    table = msl + cs["pad_token_id"] + 1
    s.out.update(position_embedding_type="absolute", max_position_embeddings=table)


def _esm_positions_to_cs(s: State) -> None:
    """esm2.py lines 494-545 and 590-594: absolute positions become ``learned`` with
    ``mask_padding_in_positional_embed`` and a table of ``max_position_embeddings`` -
    ``pad_token_id`` - 1; rotary ones get ``rotary_dim`` = head size."""
    hf = s.src
    kind, table = hf["position_embedding_type"], hf["max_position_embeddings"]
    if kind == "rotary":
        s.out.update(position_embedding_type="rotary", max_position_embeddings=table)
        s.out["rotary_dim"] = hf["hidden_size"] // hf["num_attention_heads"]
    elif kind == "absolute":
        if hf["pad_token_id"] is None:
            raise MappingError("pad_token_id: required to size CS's position table")
        s.out.update(
            position_embedding_type="learned",
            mask_padding_in_positional_embed=True,
            max_position_embeddings=table - hf["pad_token_id"] - 1,
        )
    else:
        raise MappingError(f"position_embedding_type={kind!r}: CS ESM-2 has rotary or learned")


def _rope_theta(s: State, default: float) -> None:
    """``rope_theta`` carried each way as a float (``default`` when absent)."""
    s.out["rope_theta"] = float(s.src.get("rope_theta", default))


# ---- BERT and RoBERTa (bert.py, bert_finetune.py, roberta.py) ------------------------------


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


def _pooler_and_mlm(s: State) -> None:
    check_pooler_and_mlm(s.src)


def _nsp(s: State) -> None:
    """HF BERT keeps the NSP segment embeddings: two segments (None: 2 with NSP,
    bert_model.py line 206)."""
    if s.src.get("disable_nsp", False):
        raise MappingError("disable_nsp=True: HF BERT models keep the NSP segment embeddings")
    if s.src.get("num_segments") not in (None, 2):
        raise MappingError(f"num_segments={s.src['num_segments']!r}: HF BERT has type_vocab_size=2")


def _positions_to_hf(s: State) -> None:
    s.out["position_embedding_type"] = hf_position_type(s.src)


def _positions_to_cs(s: State) -> None:
    s.out["position_embedding_type"] = cs_position_type(s.src)


def _head_class(s: State) -> str:
    hf = s.record.hf
    assert hf is not None
    return hf.architectures[s.name]


def _num_labels(hf: Mapping[str, Any]) -> int:
    """HF ``num_labels`` is ``len(id2label)``, else 2 (bert_finetune.py lines 240-244)."""
    if "num_labels" in hf:
        return int(hf["num_labels"])
    return len(hf["id2label"]) if hf.get("id2label") else 2


def _head_config_to_cs(hf: Mapping[str, Any], cls: str) -> dict[str, Any]:
    """The fine-tuning heads' fields (bert_finetune.py lines 213-261, 351-418, 510-541)."""
    dropout = hf.get("classifier_dropout")
    if dropout is None:
        dropout = hf["hidden_dropout_prob"]
    if cls == "BertForSequenceClassification":
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
    if cls == "BertForTokenClassification":
        return {
            "encoder_output_dropout_rate": dropout,
            "num_classes": _num_labels(hf),
            "loss_weight": 1.0,
            "include_padding_in_loss": False,
        }
    if cls == "BertForQuestionAnswering" and _num_labels(hf) != 2:
        raise MappingError(f"num_labels={_num_labels(hf)}: BERT QA has exactly 2 (start, end)")
    return {}


def _head_config_to_hf(cs: Mapping[str, Any], cls: str) -> dict[str, Any]:
    if cls == "BertForSequenceClassification":
        out = {"num_labels": cs.get("num_labels", 2)}
        if "task_dropout" in cs:
            out["classifier_dropout"] = cs["task_dropout"]
        if "problem_type" in cs:
            out["problem_type"] = cs["problem_type"]
        return out
    if cls == "BertForTokenClassification":
        out = {"num_labels": cs.get("num_classes", 2)}
        if "encoder_output_dropout_rate" in cs:
            out["classifier_dropout"] = cs["encoder_output_dropout_rate"]
        return out
    if cls == "BertForQuestionAnswering":
        return {"num_labels": 2}
    return {}


def _heads_to_hf(s: State) -> None:
    s.out.update(_head_config_to_hf(s.src, _head_class(s)))


def _heads_to_cs(s: State) -> None:
    s.out.update(_head_config_to_cs(s.src, _head_class(s)))


def _mlm_nonlinearity(s: State) -> None:
    """bert.py lines 1077-1082: the MLM transform's nonlinearity is the encoder's."""
    s.out["mlm_nonlinearity"] = s.out["encoder_nonlinearity"]


def _pretraining(s: State) -> None:
    """bert.py line 1228: BERT pretraining also gets ``freeze_ffn_bias_in_glu: False``."""
    if _head_class(s) == "BertForPreTraining":
        s.out["freeze_ffn_bias_in_glu"] = False


def _roberta_mlm(s: State) -> None:
    """roberta.py: HF RoBERTa's MLM transform is GELU; its pooler tanh."""
    cs = s.src
    if cs.get("mlm_nonlinearity", "gelu") != "gelu":
        raise MappingError(f"mlm_nonlinearity={cs['mlm_nonlinearity']!r}: HF RoBERTa uses gelu")
    check_pooler_and_mlm({**cs, "mlm_nonlinearity": None})


def num_segments(cs: Mapping[str, Any]) -> int:
    """CS ``num_segments`` defaults to 0 without NSP, else 2 (roberta.py lines 312-314)."""
    value = cs.get("num_segments")
    if value is None:
        value = 0 if cs.get("disable_nsp") else 2
    return int(value)


def _roberta_positions_to_hf(s: State) -> None:
    """roberta.py lines 265-302: ``max_position_embeddings`` grows by ``pad_token_id + 1``; CS
    without segment embeddings (``num_segments`` 0) is ``type_vocab_size`` 1."""
    cs = s.src
    s.out["max_position_embeddings"] = cs["max_position_embeddings"] + cs["pad_token_id"] + 1
    s.out["pad_token_id"] = cs["pad_token_id"]
    s.out["type_vocab_size"] = num_segments(cs) or 1


def _roberta_positions_to_cs(s: State) -> None:
    hf = s.src
    s.out["max_position_embeddings"] = hf["max_position_embeddings"] - hf["pad_token_id"] - 1
    s.out["num_segments"] = hf["type_vocab_size"]
    s.out["pad_token_id"] = hf["pad_token_id"]


OPS: dict[str, tuple[Fn, Fn]] = {
    "esm heads": (_esm_heads, None),
    "token dropout needs a mask token": (_token_dropout, _token_dropout),
    "esm rotary dim": (_esm_rotary_dim, None),
    "esm positions": (_esm_positions_to_hf, _esm_positions_to_cs),
    "rope theta": (_rope_theta, _rope_theta),
    "bert pooler and mlm": (_pooler_and_mlm, None),
    "bert nsp": (_nsp, None),
    "bert positions": (_positions_to_hf, _positions_to_cs),
    "bert heads": (_heads_to_hf, _heads_to_cs),
    "mlm nonlinearity": (None, _mlm_nonlinearity),
    "bert pretraining": (None, _pretraining),
    "roberta mlm": (_roberta_mlm, None),
    "roberta positions": (_roberta_positions_to_hf, _roberta_positions_to_cs),
}
