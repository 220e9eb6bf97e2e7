"""Export of the CS files Model Zoo's own HF → CS import writes (issue #35 item 3): they lack
BERT's MLM bias and T5's embeddings (``tests/modelzoo_hf_import.py`` builds them with Model
Zoo's key rules from a ``save_pretrained`` directory). BERT exports with the bias zero-filled,
as Model Zoo's export gives, and says so; T5 is refused, naming the cause and the way out,
unless ``--allow-missing-tensors``."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import one_line_error, run_cli, run_script
from modelzoo_hf_import import BERT_RULES, T5_RULES, modelzoo_cs
from test_hf_end_to_end import _tensors, modules_first_imported_by_the_read

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from ckpt_migrate.errors import UnsupportedContentError  # noqa: E402
from ckpt_migrate.format.read import read_checkpoint  # noqa: E402
from ckpt_migrate.format.tree import DictNode, MemoryData, TensorLeaf, iter_leaves  # noqa: E402
from ckpt_migrate.format.write import write_checkpoint  # noqa: E402
from ckpt_migrate.hf.export import export  # noqa: E402
from ckpt_migrate.hf.import_ import import_hf  # noqa: E402

SMALL = {"vocab_size": 96}
BERT = transformers.BertConfig(
    hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128, **SMALL
)


def _t5(**kw) -> transformers.T5Config:
    return transformers.T5Config(
        d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, **SMALL, **kw
    )


def _modelzoo_file(tmp: Path, cls: str, config, rules, name: str) -> tuple[Path, Path, dict]:
    """(Model Zoo's CS file, the run's params.yaml, the HF tensors) of a tiny random model;
    the Model Zoo file's keys are checked to be ours but for the tensors Model Zoo drops."""
    torch.manual_seed(0)
    model = getattr(transformers, cls)(config)
    model.save_pretrained(tmp / "hf")
    hf = _tensors(tmp / "hf")
    if getattr(config, "scale_decoder_outputs", True) is False:  # untied T5 (transformers 5)
        hf["lm_head.weight"] = hf["shared.weight"][::-1].copy()
        safetensors_numpy.save_file(hf, str(tmp / "hf" / "model.safetensors"), {"format": "pt"})
    params = tmp / "params.yaml"
    import_hf(tmp / "hf", tmp / "ours.mdl", model=name, config_out=params)
    with read_checkpoint(tmp / "ours.mdl") as ckpt:
        ours = {r.name for r in iter_leaves(ckpt.root.get("model"))}
    tensors = modelzoo_cs(hf, rules)
    assert set(tensors) < ours
    items = [(k, TensorLeaf(str(v.dtype), v.shape, MemoryData(v))) for k, v in tensors.items()]
    write_checkpoint(DictNode([("model", DictNode(items))]), tmp / "mz.mdl", "2.9")
    return tmp / "mz.mdl", params, hf


def _loads(cls: str, directory: Path):
    model, info = getattr(transformers, cls).from_pretrained(directory, output_loading_info=True)
    return model, info


def test_bert_from_modelzoo_exports_with_a_zero_bias(tmp_path):
    src, params, hf = _modelzoo_file(tmp_path, "BertForPreTraining", BERT, BERT_RULES, "bert")
    result = export(src, tmp_path / "out", config=params, model="bert")
    bias = "bert_mlm_head.classifier.ffn.0.linear_layer.bias"
    assert list(result.missing) == [bias]
    line = result.missing[bias]
    assert "bert.py line 589" in line and "cls.predictions.bias written as zeros" in line
    out = _tensors(tmp_path / "out")
    assert out.keys() == hf.keys()
    assert not out["cls.predictions.bias"].any()
    assert out["cls.predictions.bias"].dtype == hf["cls.predictions.bias"].dtype
    for key in set(hf) - {"cls.predictions.bias"}:
        assert np.array_equal(out[key], hf[key]), key
    _, info = _loads("BertForPreTraining", tmp_path / "out")
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_the_export_of_model_zoos_file_loads_its_code_before_reading_it(tmp_path):
    """The export of the file Model Zoo's HF -> CS import writes (2.9, no MLM bias) imports no
    module once it has opened it (issue 33: see ``test_hf_end_to_end``)."""
    src, params, _ = _modelzoo_file(tmp_path, "BertForPreTraining", BERT, BERT_RULES, "bert")
    assert modules_first_imported_by_the_read(src, params, tmp_path / "out", "bert") == []


def test_a_zero_fill_is_sized_by_the_file_not_the_config(tmp_path):
    """A config's vocab_size may not buy a zero tensor larger than anything in the file."""
    src, params, _ = _modelzoo_file(tmp_path, "BertForPreTraining", BERT, BERT_RULES, "bert")
    text = params.read_text().replace("vocab_size: 96", "vocab_size: 4000000000")
    (tmp_path / "huge.yaml").write_text(text)
    with pytest.raises(UnsupportedContentError, match="more than any tensor the file has"):
        export(src, tmp_path / "out", config=tmp_path / "huge.yaml", model="bert")


def test_bert_fine_tuning_names_do_not_report_the_mlm_bias(tmp_path):
    """The declaration concerns the pre-training model only: a sequence classifier has no MLM
    head, so nothing is missing and nothing is reported."""
    cfg = transformers.BertConfig(**{**BERT.to_dict(), "num_labels": 1})
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(cfg).save_pretrained(tmp_path / "hf")
    params = tmp_path / "params.yaml"
    name = "bert-sequence-classifier"
    import_hf(tmp_path / "hf", tmp_path / "c.mdl", model=name, config_out=params)
    result = export(tmp_path / "c.mdl", tmp_path / "out", config=params, model=name)
    assert result.missing == {} and result.dropped == {}


def test_t5_from_modelzoo_is_refused_naming_cause_and_way_out(tmp_path):
    src, params, _ = _modelzoo_file(tmp_path, "T5ForConditionalGeneration", _t5(), T5_RULES, "t5")
    with pytest.raises(UnsupportedContentError) as err:
        export(src, tmp_path / "out", config=params, model="t5")
    text = str(err.value)
    assert "encoder_embeddings.word_embeddings.weight is missing" in text
    assert "t5.py line 628" in text and "shared.weight without its trained values" in text
    assert "import-hf" in text and "--allow-missing-tensors" in text
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tied", [True, False])
def test_t5_from_modelzoo_exports_the_rest_when_allowed(tmp_path, tied):
    """Opted in: every tensor but the embeddings (and, tied, the lm_head they stand for); an
    untied lm_head, which Model Zoo's file keeps, is exported."""
    config = _t5(tie_word_embeddings=tied)
    src, params, hf = _modelzoo_file(tmp_path, "T5ForConditionalGeneration", config, T5_RULES, "t5")
    result = export(src, tmp_path / "out", config=params, model="t5", allow_missing_tensors=True)
    assert list(result.missing) == ["encoder_embeddings.word_embeddings.weight"]
    assert "shared.weight not written (--allow-missing-tensors)" in next(
        iter(result.missing.values())
    )
    out = _tensors(tmp_path / "out")
    assert out.keys() == set(hf) - {"shared.weight"}
    assert ("lm_head.weight" in out) is (not tied)
    for key, value in out.items():
        assert np.array_equal(value, hf[key]), key
    model, info = _loads("T5ForConditionalGeneration", tmp_path / "out")
    assert not info["unexpected_keys"]
    assert not np.array_equal(model.shared.weight.detach().numpy(), hf["shared.weight"])


def test_cli_names_the_opt_in_and_reports_each_missing_tensor(tmp_path):
    src, params, _ = _modelzoo_file(tmp_path, "T5ForConditionalGeneration", _t5(), T5_RULES, "t5")
    proc = run_cli("export-hf", src, tmp_path / "out", "--config", params, "--model", "t5")
    line = one_line_error(proc, 2, "--allow-missing-tensors", "import-hf")
    assert re.search(r"encoder_embeddings\.word_embeddings\.weight is missing", line)
    proc = run_cli(
        "export-hf", src, tmp_path / "out", "--config", params, "--model", "t5",
        "--allow-missing-tensors",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    missing = [ln for ln in proc.stdout.splitlines() if "encoder_embeddings" in ln]
    assert len(missing) == 1 and "shared.weight not written" in missing[0]


def test_model_zoos_command_line_takes_the_opt_in_too(tmp_path):
    """``convert_checkpoint.py convert --tgt-fmt hf``, Model Zoo's own command line."""
    src, params, _ = _modelzoo_file(tmp_path, "T5ForConditionalGeneration", _t5(), T5_RULES, "t5")
    args = ("convert", src, "--model", "t5", "--config", params, "--src-fmt", "cs-auto")
    proc = run_script("convert_checkpoint.py", *args, "--tgt-fmt", "hf")
    one_line_error(proc, 2, "--allow-missing-tensors", "t5.py line 628")
    proc = run_script("convert_checkpoint.py", *args, "--tgt-fmt", "hf", "--allow-missing-tensors")
    assert proc.returncode == 0, proc.stderr
    assert "encoder_embeddings.word_embeddings.weight missing" in proc.stdout
    assert (tmp_path / "mz_to_hf" / "config.json").is_file()
