"""Hugging Face models written by transformers' own ``save_pretrained``, imported
(``import-hf --config-out``) and exported back (``export-hf --config``) through the command
line, with no ``--model``: the same model type, the same tensors bit for bit, the same logits.

The cases: CLIP's vision tower, whose CS keys no family's detection knows, and a transformers 5
T5, whose config differs from the older releases' in what ties the head."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import one_line_error, run_cli

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

IDS = torch.tensor([[1, 5, 9, 3, 7, 2]])


def _tensors(directory: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(path))
    return out


def _round_trip(tmp_path: Path, model: Any) -> tuple[Path, Path]:
    src, ckpt, params, out = (tmp_path / n for n in ("src", "ck.mdl", "params.yaml", "out"))
    model.save_pretrained(src)
    proc = run_cli("import-hf", src, ckpt, "--config-out", params)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("export-hf", ckpt, out, "--config", params)
    assert proc.returncode == 0, proc.stderr
    return src, out


def test_a_clip_vision_tower_comes_back_by_the_model_its_config_names(tmp_path):
    """CLIP's vision tower has keys no family's detection knows; the config ``import-hf`` wrote
    names the model (``vision_transformer``), and the export refused it ("pass --model").
    StarCoder's and ESM-2's cases (their keys are GPT-2's and BERT's):
    test_hf_transformers_families.py."""
    config = transformers.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
        projection_dim=16,
    )
    cls = transformers.CLIPVisionModelWithProjection
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = cls(config).eval()
    src, out = _round_trip(tmp_path, model)
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == config.model_type
    assert written["architectures"] == [cls.__name__]
    original, back = _tensors(src), _tensors(out)
    assert all(torch.equal(original[k], back[k]) for k in original)
    again = cls.from_pretrained(out).eval()
    with torch.no_grad():
        assert torch.equal(
            model(pixel_values=pixels).image_embeds, again(pixel_values=pixels).image_embeds
        )


def test_a_transformers_5_t5_with_its_own_head_comes_back_and_trains(tmp_path):
    """transformers 5 writes T5 v1.1 (``tie_word_embeddings=False``) as a head shared with the
    embeddings but not rescaled (``tie_word_embeddings: true``, ``scale_decoder_outputs:
    false``) and saves only ``shared.weight``: the import refused it as an untied T5 without
    its lm_head. And the export wrote no ``decoder_start_token_id``, which T5 needs to shift
    labels right: every training step failed."""
    config = transformers.T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        decoder_start_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    src, out = _round_trip(tmp_path, model)
    assert json.loads((src / "config.json").read_text())["scale_decoder_outputs"] is False
    written = json.loads((out / "config.json").read_text())
    assert written["decoder_start_token_id"] == 0
    original, back = _tensors(src), _tensors(out)
    assert all(torch.equal(original[k], back[k]) for k in original)
    assert torch.equal(back["lm_head.weight"], original["shared.weight"])  # now its own
    again = transformers.T5ForConditionalGeneration.from_pretrained(out).eval()
    with torch.no_grad():
        a = model(input_ids=IDS, labels=IDS)
        b = again(input_ids=IDS, labels=IDS)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)


def test_a_model_type_without_rules_is_refused_without_a_dead_end(tmp_path):
    """A Qwen2 model: the refusal said "pass --model", and every --model then failed again
    ("model_type='qwen2': expected 'llama'"). It names the types import-hf reads; "pass
    --model" is for a config.json that names no model_type, and there it works."""
    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    transformers.Qwen2ForCausalLM(config).save_pretrained(tmp_path / "qwen2")
    proc = run_cli("import-hf", tmp_path / "qwen2", tmp_path / "q.mdl")
    one_line_error(proc, 2, "model_type 'qwen2' has no Hugging Face rules here", "gpt2, ", "llama")
    assert "--model" not in proc.stderr
    llama = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
    )
    untyped = tmp_path / "untyped"
    transformers.LlamaForCausalLM(llama).save_pretrained(untyped)
    data = json.loads((untyped / "config.json").read_text())
    del data["model_type"]
    (untyped / "config.json").write_text(json.dumps(data))
    proc = run_cli("import-hf", untyped, tmp_path / "u.mdl")
    one_line_error(proc, 2, "names no model_type; pass --model")
    proc = run_cli("import-hf", untyped, tmp_path / "u.mdl", "--model", "llama")
    assert proc.returncode == 0, proc.stderr
