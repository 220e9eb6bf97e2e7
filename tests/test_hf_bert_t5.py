"""BERT, RoBERTa and T5 HF <-> CS mappings (``ckpt_migrate/hf/families/{bert,roberta,t5}.py``)
checked against real ``transformers`` models: tiny random models go HF -> CS -> HF and must come
back bit for bit, with identical logits.

Expected CS names are Model Zoo's (tag Release_2.10.0,
``src/cerebras/modelzoo/tools/checkpoint_converters/``): bert.py lines 82-242 (encoder),
549-599 (pretraining heads), 1241-1254 (``position_embeddings.embed``); bert_finetune.py lines
51-54 and 447-453 (classifier heads); roberta.py lines 43-91; t5.py lines 73-328 (blocks) and
1275-1298 (``position_embed_helper``). Model Zoo renames the tied MLM decoder weight only when
the HF file has it (bert.py lines 569-578, roberta.py lines 70-79): from a state dict (the round
trips below) it is written, from a ``save_pretrained`` file it is not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from ckpt_migrate.errors import UnsupportedContentError  # noqa: E402
from ckpt_migrate.format.read import read_checkpoint  # noqa: E402
from ckpt_migrate.format.tree import DictNode, MemoryData, TensorLeaf, iter_leaves  # noqa: E402
from ckpt_migrate.format.write import write_checkpoint  # noqa: E402
from ckpt_migrate.hf import mapping  # noqa: E402
from ckpt_migrate.hf.encoders import bitwise_equal  # noqa: E402
from ckpt_migrate.hf.export import export  # noqa: E402
from ckpt_migrate.hf.families import bert, roberta, t5  # noqa: E402
from ckpt_migrate.hf.import_ import import_hf  # noqa: E402
from ckpt_migrate.hf.mapping import MappingError  # noqa: E402

# Bookkeeping transformers adds to a config dict; ``architectures`` is what save_pretrained
# writes and a config built in memory lacks (config_to_hf always names the class).
BOOKKEEPING = {"transformers_version", "dtype", "architectures"}


def wb(*names: str) -> list[str]:
    return [f"{n}.{p}" for n in names for p in ("weight", "bias")]


def _bert_layer0(p: str) -> list[str]:
    """bert.py lines 127-233: one encoder layer, 2.x spelling."""
    c = f"{p}transformer_encoder.layers.0."
    return wb(
        f"{c}self_attn.proj_q_dense_layer",
        f"{c}self_attn.proj_k_dense_layer",
        f"{c}self_attn.proj_v_dense_layer",
        f"{c}self_attn.proj_output_dense_layer",
        f"{c}norm1",
        f"{c}ffn.ffn.0.linear_layer",
        f"{c}ffn.ffn.1.linear_layer",
        f"{c}norm2",
    )


def _bert_embeddings(p: str) -> list[str]:
    """bert.py lines 82-125 and 1241-1254."""
    return [
        f"{p}embedding_layer.word_embeddings.weight",
        f"{p}embedding_layer.position_embeddings.embed.weight",
        f"{p}embedding_layer.segment_embeddings.weight",
        *wb(f"{p}embed_ln_f"),
    ]


CS_BERT = [
    *_bert_embeddings("bert_encoder."),
    *_bert_layer0("bert_encoder."),
    *wb("bert_encoder.pooler.pooler.ffn.0.linear_layer"),  # bert.py lines 235-242
    # bert.py lines 549-599: MLM transform, decoder (weight and bias), NSP head
    *wb("bert_mlm_head.mlm_transform.ffn.ffn.0.linear_layer"),
    *wb("bert_mlm_head.mlm_transform.ln"),
    *wb("bert_mlm_head.classifier.ffn.0.linear_layer"),
    *wb("bert_cls_head.classifier.ffn.0.linear_layer"),
]
CS_BERT_SEQ = [
    *_bert_embeddings("bert."),
    *_bert_layer0("bert."),
    *wb("bert.pooler.pooler.ffn.0.linear_layer"),
    *wb("classifier"),  # bert_finetune.py lines 51-54
]
CS_BERT_TOKEN_OR_QA = [*_bert_embeddings("bert."), *_bert_layer0("bert."), *wb("classifier")]
CS_ROBERTA = [  # roberta.py lines 43-91 on the BERT encoder
    *_bert_embeddings("bert_encoder."),
    *_bert_layer0("bert_encoder."),
    *wb("bert_mlm_head.mlm_transform.ffn.ffn.0.linear_layer"),
    *wb("bert_mlm_head.mlm_transform.ln"),
    *wb("bert_mlm_head.classifier.ffn.0.linear_layer"),
]


def _t5_cs(gated: bool) -> list[str]:
    """t5.py lines 73-328 (2.x: ``position_embed_helper``, lines 1275-1298)."""
    ffn0 = ["ffn.ffn.0.linear_layer_for_glu.weight"] if gated else []
    ffn = [*ffn0, "ffn.ffn.0.linear_layer.weight", "ffn.ffn.1.linear_layer.weight"]
    attn = ["proj_q_dense_layer", "proj_k_dense_layer", "proj_v_dense_layer"]
    attn.append("proj_output_dense_layer")
    enc, dec = "encoder.layers.0.", "decoder.layers.0."
    return [
        "encoder_embeddings.word_embeddings.weight",
        "decoder_embeddings.word_embeddings.weight",
        "lm_head.weight",
        "encoder_embeddings.position_embed_helper.relative_attention_bias.weight",
        "decoder_embeddings.position_embed_helper.relative_attention_bias.weight",
        *[f"{enc}self_attn.{a}.weight" for a in attn],
        f"{enc}norm1.weight",
        f"{enc}norm2.weight",
        *[f"{enc}{f}" for f in ffn],
        "encoder.norm.weight",
        *[f"{dec}self_attn.{a}.weight" for a in attn],
        *[f"{dec}multihead_attn.{a}.weight" for a in attn],
        f"{dec}norm1.weight",
        f"{dec}norm2.weight",
        f"{dec}norm3.weight",
        *[f"{dec}{f}" for f in ffn],
        "decoder.norm.weight",
    ]


@dataclass
class Case:
    name: str
    family: Any
    model_cls: Callable[..., Any]
    config_cls: Callable[..., Any]
    config: dict[str, Any]
    cs_layer0: list[str]
    # HF names save_pretrained leaves out because transformers ties them (the plan mirrors it)
    tied: set[str] = field(default_factory=set)
    untie_lm_head: bool = False  # transformers 5 T5 always ties lm_head; v1.1 files untie it
    # run after randomising, to give tensors Model Zoo cannot keep apart their one value
    settle: Callable[[Any], None] = lambda model: None
    inputs: Callable[[], dict[str, Any]] = lambda: {}


SMALL_BERT = {
    "vocab_size": 128,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 96,
    "max_position_embeddings": 40,
}
SMALL_T5 = {"vocab_size": 128, "d_model": 64, "d_kv": 16, "d_ff": 96, "num_layers": 2}
SMALL_T5 |= {"num_heads": 4, "relative_attention_num_buckets": 8}


def _untied_bert_bias(model: Any) -> None:
    """Untied, HF's ``cls.predictions.bias`` is a parameter forward never reads; Model Zoo
    writes the decoder bias to it (bert.py lines 602-629), so that is its value here."""
    model.cls.predictions.bias.copy_(model.cls.predictions.decoder.bias)


def _ids(batch: int = 2, length: int = 9, low: int = 3) -> Any:
    return torch.randint(low, 128, (batch, length), generator=torch.Generator().manual_seed(1))


def _bert_inputs() -> dict[str, Any]:
    ids = _ids()
    return {"input_ids": ids, "token_type_ids": (ids % 2), "attention_mask": torch.ones_like(ids)}


def _roberta_inputs() -> dict[str, Any]:
    ids = _ids()
    ids[1, -3:] = 1  # padding: positions restart after padding_idx
    return {"input_ids": ids, "attention_mask": (ids != 1).long()}


def _t5_inputs() -> dict[str, Any]:
    return {"input_ids": _ids(), "decoder_input_ids": _ids(2, 5)}


T = transformers
CASES = [
    Case(
        "bert",
        bert,
        T.BertForPreTraining,
        T.BertConfig,
        SMALL_BERT,
        CS_BERT,
        {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"},
        inputs=_bert_inputs,
    ),
    Case(  # untied MLM decoder: HF saves the decoder weight and bias
        "bert",
        bert,
        T.BertForPreTraining,
        T.BertConfig,
        {**SMALL_BERT, "tie_word_embeddings": False},
        CS_BERT,
        inputs=_bert_inputs,
        settle=_untied_bert_bias,
    ),
    Case(
        "bert-sequence-classifier",
        bert,
        T.BertForSequenceClassification,
        T.BertConfig,
        # classifier_dropout None would come back as hidden_dropout_prob (the same dropout;
        # bert_finetune.py lines 246-250), so the test gives it
        {
            **SMALL_BERT,
            "num_labels": 3,
            "problem_type": "single_label_classification",
            "classifier_dropout": 0.3,
        },
        CS_BERT_SEQ,
        inputs=_bert_inputs,
    ),
    Case(
        "bert-token-classifier",
        bert,
        T.BertForTokenClassification,
        T.BertConfig,
        {**SMALL_BERT, "num_labels": 5, "classifier_dropout": 0.2},
        CS_BERT_TOKEN_OR_QA,
        inputs=_bert_inputs,
    ),
    Case(
        "bert-qa",
        bert,
        T.BertForQuestionAnswering,
        T.BertConfig,
        SMALL_BERT,
        CS_BERT_TOKEN_OR_QA,
        inputs=_bert_inputs,
    ),
    Case(
        "roberta",
        roberta,
        T.RobertaForMaskedLM,
        T.RobertaConfig,
        {**SMALL_BERT, "max_position_embeddings": 42, "type_vocab_size": 1},
        CS_ROBERTA,
        {"lm_head.decoder.weight", "lm_head.decoder.bias"},
        inputs=_roberta_inputs,
    ),
    Case(  # T5 v1.0: relu, lm_head tied to the embeddings and rescaled by d_model**-0.5
        "t5",
        t5,
        T.T5ForConditionalGeneration,
        T.T5Config,
        SMALL_T5,
        _t5_cs(gated=False),
        {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"},
        inputs=_t5_inputs,
    ),
    Case(  # T5 v1.1: gated-gelu, untied lm_head, no rescaling, 3 decoder layers
        "t5",
        t5,
        T.T5ForConditionalGeneration,
        T.T5Config,
        {
            **SMALL_T5,
            "feed_forward_proj": "gated-gelu",
            "tie_word_embeddings": False,
            "num_decoder_layers": 3,
        },
        _t5_cs(gated=True),
        {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"},
        untie_lm_head=True,
        inputs=_t5_inputs,
    ),
    Case(  # UL2: gated-silu, untied
        "ul2",
        t5,
        T.T5ForConditionalGeneration,
        T.T5Config,
        {**SMALL_T5, "feed_forward_proj": "gated-silu", "tie_word_embeddings": False},
        _t5_cs(gated=True),
        {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"},
        untie_lm_head=True,
        inputs=_t5_inputs,
    ),
]
IDS = [
    "bert",
    "bert-untied",
    "bert-seq",
    "bert-token",
    "bert-qa",
    "roberta",
    "t5-v1.0",
    "t5-v1.1",
    "ul2",
]


def _build(case: Case, config: Any) -> Any:
    model = case.model_cls(config)
    if case.untie_lm_head:
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    return model.eval()


def _original(case: Case) -> tuple[Any, Any]:
    torch.manual_seed(0)
    config = case.config_cls(**case.config)
    model = _build(case, config)
    with torch.no_grad():
        for p in model.parameters():  # every tensor distinct, so a swapped rename shows
            p.copy_(torch.randn_like(p) * 0.2)
        case.settle(model)
    return config, model


def _numpy(model: Any) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _shapes(tensors: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in tensors.items()}


def _run(plan: list[mapping.Out], tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(mapping.run(plan, tensors.__getitem__))


def _diff(config: Any) -> dict[str, Any]:
    return {k: v for k, v in config.to_diff_dict().items() if k not in BOOKKEEPING}


def _logits(model: Any, inputs: dict[str, Any]) -> list[Any]:
    with torch.no_grad():
        out = model(**inputs)
    return [v for k, v in out.items() if k.endswith("logits")]


@pytest.fixture(scope="module", params=range(len(CASES)), ids=IDS)
def trip(request: pytest.FixtureRequest) -> dict[str, Any]:
    """One HF -> CS -> HF round trip, shared by the checks below."""
    case = CASES[request.param]
    config, model = _original(case)
    hf = _numpy(model)
    hf_cfg = config.to_dict()
    cs_model = case.family.config_to_cs(hf_cfg, case.name)
    to_cs = case.family.plan_to_cs(_shapes(hf), hf_cfg, case.name)
    cs = _run(to_cs, hf)
    back_cfg = case.family.config_to_hf(cs_model, case.name)
    to_hf = case.family.plan_to_hf(_shapes(cs), cs_model, case.name)
    back = _run(to_hf, cs)
    return locals()


def test_cs_names_are_model_zoos(trip: dict[str, Any]) -> None:
    case, cs = trip["case"], trip["cs"]
    assert mapping.unused_inputs(trip["to_cs"], trip["hf"]) == []
    first = sorted(n for n in cs if not any(f"layers.{i}." in n for i in range(1, 4)))
    assert first == sorted(case.cs_layer0)
    assert all(tuple(o.out_shape(_shapes(trip["hf"]))) == cs[o.name].shape for o in trip["to_cs"])


def test_config_round_trip(trip: dict[str, Any]) -> None:
    case = trip["case"]
    assert trip["back_cfg"]["architectures"] == [case.model_cls.__name__]
    back = _diff(case.config_cls(**trip["back_cfg"]))
    original = _diff(trip["config"])
    if case.family is t5 and "decoder_start_token_id" not in original:
        # transformers' T5 needs it to shift labels right; every Hub T5 config gives it (0)
        assert back.pop("decoder_start_token_id") == 0
    if case.family is not t5 and "position_embedding_type" not in trip["config"].to_dict():
        # Model Zoo writes position_embedding_type "absolute" (bert.py lines 957-988), the one
        # kind older transformers know; transformers 5 dropped the field from BertConfig and
        # RobertaConfig, so it is an extra attribute there, with no effect.
        assert back.pop("position_embedding_type") == "absolute"
    assert back == original


def _cs_ties(trip: dict[str, Any]) -> dict[str, str]:
    case = trip["case"]
    return case.family.cs_ties(_shapes(trip["cs"]), trip["cs_model"], case.name)


def test_tensors_round_trip_bitwise(trip: dict[str, Any]) -> None:
    hf, back, case, cs = trip["hf"], trip["back"], trip["case"], trip["cs"]
    # CS names of one tied tensor the plan does not read: the pipeline checks them (cs_ties)
    ties = _cs_ties(trip)
    assert mapping.unused_inputs(trip["to_hf"], cs) == sorted(ties)
    assert all(np.array_equal(cs[copy], cs[original]) for copy, original in ties.items())
    assert set(back) == set(hf) - case.tied
    assert all(tuple(o.out_shape(_shapes(trip["cs"]))) == back[o.name].shape for o in trip["to_hf"])
    for name, value in back.items():
        assert value.dtype == hf[name].dtype and value.shape == hf[name].shape, name
        assert np.array_equal(value, hf[name]), name


def test_logits_round_trip(trip: dict[str, Any]) -> None:
    case = trip["case"]
    fresh = _build(case, case.config_cls(**trip["back_cfg"]))
    state = {k: torch.from_numpy(v) for k, v in trip["back"].items()}
    result = fresh.load_state_dict(state, strict=False)
    assert result.unexpected_keys == []
    assert set(result.missing_keys) == case.tied
    inputs = case.inputs()
    for a, b in zip(_logits(trip["model"], inputs), _logits(fresh, inputs), strict=True):
        assert torch.equal(a, b)


def test_untied_t5_through_save_files(tmp_path: Path) -> None:
    """What the pipeline writes (config.json + model.safetensors) loads with from_pretrained:
    transformers 5 keeps the distinct lm_head (it unties when both tensors are in the file)."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    case = CASES[IDS.index("t5-v1.1")]
    config, model = _original(case)
    hf = _numpy(model)
    cs_model = t5.config_to_cs(config.to_dict(), "t5")
    cs = _run(t5.plan_to_cs(_shapes(hf), config.to_dict(), "t5"), hf)
    back = _run(t5.plan_to_hf(_shapes(cs), cs_model, "t5"), cs)
    safetensors_numpy.save_file(back, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(t5.config_to_hf(cs_model, "t5")))
    loaded = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert not torch.equal(loaded.lm_head.weight, loaded.shared.weight)
    inputs = case.inputs()
    assert torch.equal(_logits(loaded, inputs)[0], _logits(model, inputs)[0])


def test_legacy_hf_bert_file() -> None:
    """An old HF BERT file: LayerNorm ``gamma``/``beta``, a saved ``position_ids`` buffer and the
    tied decoder weight (bert.py lines 39-66, 113-118, 716-739) gives the same CS tensors."""
    config, model = _original(CASES[0])
    hf = _numpy(model)
    old = {re.sub(r"(LayerNorm)\.weight$", r"\1.gamma", k): v for k, v in hf.items()}
    old = {re.sub(r"(LayerNorm)\.bias$", r"\1.beta", k): v for k, v in old.items()}
    old["bert.embeddings.position_ids"] = np.arange(40)[None]
    assert "bert.embeddings.LayerNorm.gamma" in old and "cls.predictions.decoder.weight" in old
    plan = bert.plan_to_cs(_shapes(old), config.to_dict(), "bert")
    assert mapping.unused_inputs(plan, old) == ["bert.embeddings.position_ids"]
    assert list(bert.hf_dropped(_shapes(old), config.to_dict(), "bert")) == [
        "bert.embeddings.position_ids"
    ]
    expected = _run(bert.plan_to_cs(_shapes(hf), config.to_dict(), "bert"), hf)
    got = _run(plan, old)
    assert got.keys() == expected.keys()
    assert all(np.array_equal(got[k], expected[k]) for k in got)


@pytest.mark.parametrize("case_id", ["t5-v1.0", "t5-v1.1"])
def test_t5_file_from_save_pretrained(case_id: str) -> None:
    """``save_pretrained`` leaves out ``encoder/decoder.embed_tokens`` (and a tied lm_head): CS
    still gets all three tensors Model Zoo writes (t5.py lines 648-668, 1162-1168)."""
    case = CASES[IDS.index(case_id)]
    config, model = _original(case)
    hf = _numpy(model)
    saved = {k: v for k, v in hf.items() if k not in case.tied}
    got = _run(t5.plan_to_cs(_shapes(saved), config.to_dict(), "t5"), saved)
    expected = _run(t5.plan_to_cs(_shapes(hf), config.to_dict(), "t5"), hf)
    assert got.keys() == expected.keys()
    assert all(np.array_equal(got[k], expected[k]) for k in got)
    if case_id == "t5-v1.1":
        # transformers 5 shares T5 v1.1's lm_head with the embeddings unscaled
        # (``tie_word_embeddings: true``, ``scale_decoder_outputs: false``) and saves only
        # ``shared.weight``: that was refused as an untied T5 without its lm_head. CS gets an
        # untied lm_head equal to the embeddings; an old-style untied config still refuses.
        del saved["lm_head.weight"]
        new_style = {
            **config.to_dict(),
            "tie_word_embeddings": True,
            "scale_decoder_outputs": False,
        }
        cs = _run(t5.plan_to_cs(_shapes(saved), new_style, "t5"), saved)
        head = "lm_head.weight" if "lm_head.weight" in cs else next(k for k in cs if "lm_head" in k)
        assert np.array_equal(cs[head], saved["shared.weight"])
        assert t5.config_to_cs(new_style, "t5")["share_embedding_weights"] is False
        old_style = {**config.to_dict(), "tie_word_embeddings": False}
        old_style.pop("scale_decoder_outputs", None)
        with pytest.raises(MappingError, match=r"lm_head\.weight"):
            t5.plan_to_cs(_shapes(saved), old_style, "t5")
        rescaled = {**old_style, "scale_decoder_outputs": True}
        with pytest.raises(MappingError, match="rescales the decoder output only for an lm_head"):
            t5.plan_to_cs(_shapes(saved), rescaled, "t5")


def test_t5_tie_fields_of_both_transformers_generations() -> None:
    """transformers 5 writes ``tie_word_embeddings: true`` always and keeps the T5 v1.1 switch in
    ``scale_decoder_outputs``; older files say ``tie_word_embeddings: false``."""
    old_style = {**SMALL_T5, "model_type": "t5", "tie_word_embeddings": False}
    new_style = {**old_style, "tie_word_embeddings": True, "scale_decoder_outputs": False}
    assert t5.config_to_cs(old_style, "t5")["share_embedding_weights"] is False
    assert t5.config_to_cs(new_style, "t5")["share_embedding_weights"] is False
    assert t5.config_to_cs({**SMALL_T5}, "t5")["share_embedding_weights"] is True
    cs = t5.config_to_cs(new_style, "ul2")
    assert t5.config_to_hf(cs, "transformer")["tie_word_embeddings"] is False


def test_roberta_file_without_mlm_bias_gets_zeros() -> None:
    """roberta.py lines 183-192: no ``lm_head.bias`` at all -> a zero CS decoder bias."""
    config, model = _original(CASES[IDS.index("roberta")])
    hf = {
        k: v for k, v in _numpy(model).items() if not k.endswith(("lm_head.bias", "decoder.bias"))
    }
    cs = _run(roberta.plan_to_cs(_shapes(hf), config.to_dict(), "roberta"), hf)
    bias = cs["bert_mlm_head.classifier.ffn.0.linear_layer.bias"]
    assert bias.shape == (128,) and bias.dtype == np.float32 and not bias.any()


# ----------------------------------------------------------------------------- CS-native cases


def test_roberta_without_segments_gets_zero_token_types() -> None:
    """A CS RoBERTa trained without segment embeddings (``num_segments`` absent, NSP off):
    HF gets ``type_vocab_size`` 1 and a zero table (roberta.py lines 173-181, 265-280)."""
    cfg = {"vocab_size": 128, "hidden_size": 8, "num_hidden_layers": 1, "num_heads": 2}
    cfg |= {"max_position_embeddings": 10, "disable_nsp": True, "pooler_nonlinearity": "tanh"}
    cfg |= {"mask_padding_in_positional_embed": True, "share_embedding_weights": True}
    hf_cfg = roberta.config_to_hf(cfg, "roberta")
    assert hf_cfg["type_vocab_size"] == 1 and hf_cfg["max_position_embeddings"] == 11
    names = [n for n in CS_ROBERTA if "segment" not in n]
    shapes = {n: (3,) for n in names}
    shapes |= {"bert_encoder.embedding_layer.position_embeddings.embed.weight": (11, 8)}
    plan = roberta.plan_to_hf(shapes, cfg, "roberta")
    pos = np.ones((11, 8), np.float16)
    out = {o.name: o for o in plan}["roberta.embeddings.token_type_embeddings.weight"]
    built = out.build(pos)
    assert built.shape == (1, 8) and built.dtype == np.float16 and not built.any()


# ----------------------------------------------------------------------------- negative cases


def _cs_of(index: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    trip_case = CASES[index]
    config, model = _original(trip_case)
    hf, hf_cfg = _numpy(model), config.to_dict()
    fam = trip_case.family
    cs = _run(fam.plan_to_cs(_shapes(hf), hf_cfg, trip_case.name), hf)
    return cs, fam.config_to_cs(hf_cfg, trip_case.name)


def test_unknown_cs_tensor_is_reported() -> None:
    cs, cfg = _cs_of(0)
    shapes = _shapes(cs) | {"bert_encoder.extra_head.weight": (2, 2)}
    plan = bert.plan_to_hf(shapes, cfg, "bert")
    unused = set(mapping.unused_inputs(plan, shapes)) - set(bert.cs_ties(shapes, cfg, "bert"))
    assert sorted(unused) == ["bert_encoder.extra_head.weight"]
    assert bert.hf_dropped(shapes, cfg, "bert") == {}


def test_missing_cs_tensor_is_named() -> None:
    cs, cfg = _cs_of(0)
    shapes = _shapes(cs)
    del shapes["bert_cls_head.classifier.ffn.0.linear_layer.bias"]
    with pytest.raises(MappingError, match=r"bert_cls_head\.classifier\.ffn\.0\.linear_layer"):
        bert.plan_to_hf(shapes, cfg, "bert")


def test_unknown_hf_tensor_is_reported() -> None:
    config, model = _original(CASES[IDS.index("t5-v1.0")])
    shapes = _shapes(_numpy(model)) | {"encoder.block.0.layer.9.extra.weight": (2,)}
    plan = t5.plan_to_cs(shapes, config.to_dict(), "t5")
    assert mapping.unused_inputs(plan, shapes) == ["encoder.block.0.layer.9.extra.weight"]
    assert t5.hf_dropped(shapes, config.to_dict(), "t5") == {}


def test_tied_cs_copies_are_ties_not_inputs() -> None:
    """A Trainer save holds every CS name of a tied tensor: the plan reads one, ``cs_ties``
    lists the others for the pipeline to check (t5.py lines 1098-1168, bert.py lines 716-739)."""
    cs, cfg = _cs_of(IDS.index("t5-v1.0"))
    assert t5.cs_ties(_shapes(cs), cfg, "t5") == {
        "decoder_embeddings.word_embeddings.weight": "encoder_embeddings.word_embeddings.weight",
        "lm_head.weight": "encoder_embeddings.word_embeddings.weight",
    }
    untied = {**cfg, "share_embedding_weights": False}
    assert list(t5.cs_ties(_shapes(cs), untied, "t5")) == [
        "decoder_embeddings.word_embeddings.weight"
    ]
    cs, cfg = _cs_of(IDS.index("bert"))
    word = "bert_encoder.embedding_layer.word_embeddings.weight"
    assert bert.cs_ties(_shapes(cs), cfg, "bert") == {
        "bert_mlm_head.classifier.ffn.0.linear_layer.weight": word
    }
    assert bert.cs_ties(_shapes(cs), {**cfg, "share_embedding_weights": False}, "bert") == {}


@pytest.mark.parametrize(
    ("family", "name", "change", "field"),
    [
        (bert, "bert", {"position_embedding_type": "fixed"}, "position_embedding_type"),
        (bert, "bert", {"mup_base_hidden_size": 32}, "mup_base_hidden_size"),
        (bert, "bert", {"pooler_nonlinearity": "gelu"}, "pooler_nonlinearity"),
        (bert, "bert", {"disable_nsp": True}, "disable_nsp"),
        (bert, "bert", {"use_ffn_bias": False}, "use_ffn_bias"),
        (bert, "bert-qa", {"norm_first": True}, "norm_first"),
        (roberta, "roberta", {"mask_padding_in_positional_embed": False}, "mask_padding"),
        (t5, "t5", {"position_embedding_type": "fixed"}, "position_embedding_type"),
        (t5, "transformer", {"use_ffn_bias": True}, "use_ffn_bias"),
        (t5, "t5", {"norm_type": "layernorm"}, "norm_type"),
        (t5, "t5", {"decoder_nonlinearity": "gelu"}, "decoder_nonlinearity"),
        (t5, "t5", {"mup_base_d_model": 32}, "mup_base_d_model"),
        (t5, "t5", {"tgt_vocab_size": 99}, "tgt_vocab_size"),
    ],
)
def test_unsupported_cs_config_is_named(family: Any, name: str, change: dict, field: str) -> None:
    index = {"bert": 0, "bert-qa": 4, "roberta": 5, "t5": 6, "transformer": 6}[name]
    _, cfg = _cs_of(index)
    with pytest.raises(MappingError, match=field):
        family.config_to_hf({**cfg, **change}, name)


@pytest.mark.parametrize(
    ("family", "name", "hf_cfg", "field"),
    [
        (bert, "bert-sequence-classifier", {"num_labels": 3}, "problem_type"),
        (bert, "bert", {"type_vocab_size": 3}, "type_vocab_size"),
        (bert, "bert", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
        (bert, "bert-qa", {"num_labels": 3}, "num_labels"),
        (t5, "t5", {"relative_attention_max_distance": 64}, "relative_attention_max_distance"),
        (t5, "t5", {"feed_forward_proj": "silu"}, "feed_forward_proj"),
    ],
)
def test_unsupported_hf_config_is_named(family: Any, name: str, hf_cfg: dict, field: str) -> None:
    with pytest.raises(MappingError, match=field):
        family.config_to_cs(hf_cfg, name)


def test_transformer_with_absolute_positions_is_refused() -> None:
    """The ``transformer`` model's sinusoidal table (``position_embeddings.fpe`` in 2.1+,
    t5.py lines 1264-1274) has no HF T5 equivalent."""
    cs, cfg = _cs_of(IDS.index("t5-v1.0"))
    shapes = _shapes(cs) | {"encoder_embeddings.position_embeddings.fpe": (512, 64)}
    with pytest.raises(MappingError, match="position_embedding_type"):
        t5.plan_to_hf(shapes, cfg, "transformer")


def test_summarization_is_not_served() -> None:
    """Model Zoo has no HF converter for bert-summarization (registry.py lines 197-202)."""
    assert "bert-summarization" not in bert.NAMES
    with pytest.raises(MappingError, match="bert-summarization"):
        bert.config_to_hf({}, "bert-summarization")


def test_tied_check_is_bitwise() -> None:
    """Tied copies are compared bit for bit: NaNs (pruned weights of a sparse CS run) agree,
    a dtype change does not."""
    a = np.array([[1.0, np.nan], [0.0, 2.0]], np.float32)
    assert bitwise_equal(a, a.copy())
    assert not bitwise_equal(a, a.astype(np.float64))
    assert not bitwise_equal(a, np.where(np.isnan(a), 0, a))


def test_t5_relative_bias_past_block_0_is_dropped() -> None:
    """Old HF files repeat the relative bias on every block; Model Zoo converts block 0's
    (t5.py lines 1345-1381) and the cross-attention one is dropped (lines 637-644)."""
    config, model = _original(CASES[IDS.index("t5-v1.0")])
    hf = _numpy(model)
    extra = {
        "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight": (8, 4),
        "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight": (8, 4),
    }
    plan = t5.plan_to_cs(_shapes(hf) | extra, config.to_dict(), "t5")
    assert mapping.unused_inputs(plan, _shapes(hf) | extra) == sorted(extra)
    assert sorted(t5.hf_dropped(_shapes(hf) | extra, config.to_dict(), "t5")) == sorted(extra)


def test_roberta_pooler_in_hf_file_is_dropped() -> None:
    """Some RoBERTa files carry a pooler RobertaForMaskedLM has no use for; Model Zoo drops it
    (roberta.py lines 373-380)."""
    config, model = _original(CASES[IDS.index("roberta")])
    shapes = _shapes(_numpy(model)) | {
        "roberta.pooler.dense.weight": (64, 64),
        "roberta.pooler.dense.bias": (64,),
    }
    plan = roberta.plan_to_cs(shapes, config.to_dict(), "roberta")
    pooler = ["roberta.pooler.dense.bias", "roberta.pooler.dense.weight"]
    assert mapping.unused_inputs(plan, shapes) == pooler
    assert sorted(roberta.hf_dropped(shapes, config.to_dict(), "roberta")) == pooler


# ----------------------------------------------------------------------------- save_pretrained


@pytest.mark.parametrize("case_id", ["bert", "roberta", "t5-v1.0"])
def test_save_pretrained_file_gives_model_zoos_cs_names(case_id: str) -> None:
    """``save_pretrained`` leaves the tied HF copies out, and Model Zoo then writes no CS MLM
    decoder weight (bert.py lines 569-578, roberta.py lines 70-79); the CS file still converts
    back bit for bit. T5 keeps all three embedding names (ours on purpose: Model Zoo drops
    ``shared.weight``, t5.py line 628, and with it every embedding)."""
    case = CASES[IDS.index(case_id)]
    config, model = _original(case)
    hf = _numpy(model)
    saved = {k: v for k, v in hf.items() if k not in case.tied}
    cs_model = case.family.config_to_cs(config.to_dict(), case.name)
    cs = _run(case.family.plan_to_cs(_shapes(saved), config.to_dict(), case.name), saved)
    first = sorted(n for n in cs if not any(f"layers.{i}." in n for i in range(1, 4)))
    head = [] if case.family is t5 else ["bert_mlm_head.classifier.ffn.0.linear_layer.weight"]
    assert first == sorted(set(case.cs_layer0) - set(head))
    ties = case.family.cs_ties(_shapes(cs), cs_model, case.name)
    assert sorted(ties) == ([] if case.family is not t5 else sorted(TIED_CS["t5-v1.0"][1:]))
    back = _run(case.family.plan_to_hf(_shapes(cs), cs_model, case.name), cs)
    assert back.keys() == saved.keys()
    assert all(bitwise_equal(back[k], saved[k]) for k in saved)


def _cs_file(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    items = [
        (k, TensorLeaf(str(v.dtype), tuple(v.shape), MemoryData(v))) for k, v in tensors.items()
    ]
    write_checkpoint(DictNode([("model", DictNode(items))]), path, "2.10")
    return path


def _hf_dir_tensors(directory: Path) -> dict[str, np.ndarray]:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    out: dict[str, np.ndarray] = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(safetensors_numpy.load_file(str(file)))
    return out


# (case, the CS names of the one tied tensor, as a Trainer saves them)
TIED_CS = {
    "bert": (
        "bert_encoder.embedding_layer.word_embeddings.weight",
        "bert_mlm_head.classifier.ffn.0.linear_layer.weight",
    ),
    "t5-v1.0": (
        "encoder_embeddings.word_embeddings.weight",
        "decoder_embeddings.word_embeddings.weight",
        "lm_head.weight",
    ),
}


@pytest.mark.parametrize("case_id", sorted(TIED_CS))
def test_export_reads_any_one_tied_copy_and_checks_the_rest(case_id: str, tmp_path: Path) -> None:
    """Export takes a CS file with every tied name (a Trainer save: the others are checked
    equal) or with only one of them (Model Zoo's HF -> CS file keeps none of the copies), and
    refuses copies that differ."""
    case = CASES[IDS.index(case_id)]
    _, model = _original(case)
    model.save_pretrained(tmp_path / "hf")
    saved = _hf_dir_tensors(tmp_path / "hf")
    params = tmp_path / "params.yaml"
    import_hf(tmp_path / "hf", tmp_path / "ours.mdl", model=case.name, config_out=params)
    with read_checkpoint(tmp_path / "ours.mdl") as ckpt:
        cs = {r.name: r.leaf.data.read() for r in iter_leaves(ckpt.root.get("model"))}
    names = TIED_CS[case_id]
    one = next(cs[n] for n in names if n in cs)
    variants = {"every": dict.fromkeys(names, one)}
    variants |= {n: {n: one} for n in names}
    for label, copies in variants.items():
        body = {k: v for k, v in cs.items() if k not in names}
        src = _cs_file(tmp_path / f"{label}.mdl", body | copies)
        result = export(src, tmp_path / f"hf-{label}", config=params, model=case.name)
        assert result.dropped == {}
        back = _hf_dir_tensors(tmp_path / f"hf-{label}")
        assert back.keys() == saved.keys(), label
        assert all(bitwise_equal(back[k], saved[k]) for k in saved), label
    changed = dict.fromkeys(names, one) | {names[-1]: one + 1}
    src = _cs_file(
        tmp_path / "differs.mdl", {k: v for k, v in cs.items() if k not in names} | changed
    )
    with pytest.raises(UnsupportedContentError, match=re.escape(names[-1])):
        export(src, tmp_path / "hf-differs", config=params, model=case.name)
    missing = _cs_file(tmp_path / "none.mdl", body)
    with pytest.raises(UnsupportedContentError, match=re.escape(names[0])):
        export(missing, tmp_path / "hf-none", config=params, model=case.name)
