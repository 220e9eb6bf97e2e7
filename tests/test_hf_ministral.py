"""A family added by one catalogue record alone (issue #32): Ministral, an HF model type of the
LLaMA-like layout (transformers' ``models/ministral``: ``MinistralConfig`` is ``MistralConfig``
with ``layer_types``, its decoder layer Qwen2's without the projection biases, so Mistral's
tensors and config rules hold it). Tiny random ``transformers`` models go through the real
commands, import-hf then export-hf, bit for bit both ways; ``from_pretrained`` loads the export
with no missing or unexpected key and computes the same logits."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import one_line_error, run_cli

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.llama_like import MINISTRAL
from ckpt_migrate.hf import families

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

PACKAGE = Path(__file__).resolve().parents[1] / "ckpt_migrate"
SMALL = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
    head_dim=16,  # MinistralConfig does not derive it (its checkpoints give it)
)
# (model name, LM head or not, config fields): GQA, MHA, MQA tied; a sliding window always
# (transformers' Ministral builds a sliding-window mask whatever ``layer_types`` says).
CASES = [
    ("ministral", True, {"num_key_value_heads": 2, "sliding_window": 4}),
    ("ministral", True, {"num_key_value_heads": 4, "sliding_window": 64}),
    ("ministral", True, {"num_key_value_heads": 1, "tie_word_embeddings": True}),
    ("ministral-headless", False, {"num_key_value_heads": 2, "sliding_window": 6}),
]


def _tensors(directory: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(safetensors_numpy.load_file(str(file)))
    return out


def _outputs(model):
    ids = torch.arange(12).reshape(1, 12) % 90 + 3
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize(("name", "lm_head", "fields"), CASES)
def test_round_trip_through_the_commands(name, lm_head, fields, tmp_path):
    cls = transformers.MinistralForCausalLM if lm_head else transformers.MinistralModel
    config = transformers.MinistralConfig(**SMALL, **fields)
    torch.manual_seed(0)
    model = cls(config).eval()
    original = tmp_path / "hf"
    model.save_pretrained(original)

    ckpt, params = tmp_path / "model.mdl", tmp_path / "params.yaml"
    args = ("--model", name) if not lm_head else ()  # LM head: told by config.json alone
    proc = run_cli("import-hf", original, ckpt, "--config-out", params, *args, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"] == name
    assert "name: mistral" in params.read_text()  # a CS Mistral checkpoint

    back = tmp_path / "back"
    proc = run_cli("export-hf", ckpt, back, "--config", params, "--model", name, "-q")
    assert proc.returncode == 0, proc.stderr

    before, after = _tensors(original), _tensors(back)
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert after[key].dtype == value.dtype and np.array_equal(after[key], value), key
    cfg = json.loads((back / "config.json").read_text())
    assert cfg["architectures"] == [cls.__name__] and cfg["model_type"] == "ministral"
    again = transformers.MinistralConfig(**cfg).to_diff_dict()
    want = config.to_diff_dict()
    for bookkeeping in ("transformers_version", "dtype", "architectures"):
        again.pop(bookkeeping, None), want.pop(bookkeeping, None)
    assert {k: again.get(k) for k in want} == want

    reloaded, info = cls.from_pretrained(back, output_loading_info=True)
    assert info["missing_keys"] == set() or not info["missing_keys"]
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    assert torch.equal(_outputs(reloaded.eval()), _outputs(model))


def test_a_layer_pattern_the_cs_model_cannot_hold_is_refused(tmp_path):
    config = transformers.MinistralConfig(
        **SMALL,
        num_key_value_heads=2,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )
    transformers.MinistralForCausalLM(config).save_pretrained(tmp_path / "hf")
    proc = run_cli("import-hf", tmp_path / "hf", tmp_path / "m.mdl")
    one_line_error(proc, None, "layer_types")
    assert not (tmp_path / "m.mdl").exists()


def test_the_record_is_the_only_place_the_family_is_declared():
    """No module but the record's (and the catalogue's list of records) names Ministral; the
    rules, names and model type come from it (the LLaMA rules module, the CS family Mistral)."""
    spelled = re.compile(r"ministral", re.IGNORECASE)
    outside = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if spelled.search(p.read_text(encoding="utf-8"))
    )
    assert outside == ["catalogue/__init__.py", "catalogue/llama_like.py"]
    assert catalogue.by_name("ministral") is MINISTRAL
    assert families.by_model_type()["ministral"] is families.by_name()["mistral"]
    assert {n for n, _ in catalogue.modelzoo_names()}.isdisjoint(MINISTRAL.names)
