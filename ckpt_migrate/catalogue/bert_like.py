"""BERT-like families: encoders, CS key layout
:data:`~ckpt_migrate.catalogue.layouts.BERT_ENCODER` (``bert_encoder.`` for pre-training,
``bert.`` for the fine-tuning heads).

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:
``bert.py``, ``roberta.py`` (RoBERTa converts with ``Converter_Bert_CS20_CS21``, registry.py
lines 294-297: BERT's steps), ``esm2.py`` (ESM-2 is a ``BertModel`` configured with rotary
positions, but Model Zoo has no CS↔CS key rules for it: no key table here either).
"""

from __future__ import annotations

from ckpt_migrate.catalogue.layouts import BERT_ENCODER
from ckpt_migrate.catalogue.record import Hf, Name, Record, Signature

BERT = Record(
    "bert",
    BERT_ENCODER,
    names=(
        Name("bert", "bert", 0, since="1.7"),
        Name("bert-sequence-classifier", "bert/classifier", 1, since="1.7"),
        Name("bert-token-classifier", "bert/token_classifier", 2, since="1.7"),
        Name("bert-summarization", "bert/extractive_summarization", 3, since="1.7", hf=False),
        Name("bert-qa", None, 4, since="1.7"),
    ),
    more_names=(
        ("bert/classifier", "bert/classifier"),
        ("bert/token_classifier", "bert/token_classifier"),
        ("bert/extractive_summarization", "bert/extractive_summarization"),
        ("bert-q&a", None),
    ),
    signature=Signature(
        ("bert_encoder",), {"bert_segments": True, "bert_heads": True, "decoder": False}
    ),
    config_markers=frozenset(
        {"disable_nsp", "pooler_nonlinearity", "mlm_nonlinearity", "num_segments"}
    ),
    marker_veto=frozenset({"decoder_nonlinearity"}),  # T5/transformer configs have it too
    hf=Hf(
        "bert",
        ("bert",),
        {
            "bert": "BertForPreTraining",
            "bert-sequence-classifier": "BertForSequenceClassification",
            "bert-token-classifier": "BertForTokenClassification",
            "bert-qa": "BertForQuestionAnswering",
        },
        by_architecture=True,
    ),
)

ROBERTA = Record(
    "roberta",
    None,
    names=(Name("roberta", "bert", 33, since="2.0"),),
    steps_of="bert",
    same_keys_as="bert",
    hf=Hf("roberta", ("roberta",), {"roberta": "RobertaForMaskedLM"}, by_architecture=True),
)

ESM2 = Record(
    "esm-2",
    None,
    names=(Name("esm-2", "esm2", 12, since="2.1"),),
    more_names=(("esm2", "esm2"),),
    hf=Hf("esm2", ("esm",), {"esm-2": "EsmForMaskedLM"}, by_architecture=True),
)
