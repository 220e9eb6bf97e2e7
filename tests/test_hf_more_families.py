"""The Model Zoo names whose Hugging Face converters compose others (issue #35 item 1):
CLIP-ViT (``CLIPVisionModelWithProjection``) and DPO (a policy model of another family). Tiny
random ``transformers`` models go HF -> ``import-hf`` -> ``export-hf`` and must come back bit
for bit, load with ``from_pretrained`` with no missing or unexpected key, and compute the same
outputs; the CS side has Model Zoo's names (tag Release_2.10.0, ``clip_vit.py``, ``dpo.py``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import one_line_error, run_cli
from test_hf_end_to_end import _tensors

from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import iter_leaves
from ckpt_migrate.hf import unconverted

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

CLIP = transformers.CLIPVisionConfig(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    image_size=16,
    patch_size=4,
    projection_dim=24,
)


def _cs(path: Path) -> dict[str, np.ndarray]:
    with read_checkpoint(path) as ckpt:
        return {r.name: r.leaf.data.read() for r in iter_leaves(ckpt.root.get("model"))}


def _round_trip(tmp: Path, model, *import_args: str, export_model: str) -> tuple[Path, Path]:
    """``model`` saved, imported and exported through the CLI; the HF tensors must come back
    bit for bit. Returns (the CS checkpoint, the exported directory)."""
    model.save_pretrained(tmp / "hf")
    ckpt, params = tmp / "model.mdl", tmp / "params.yaml"
    proc = run_cli("import-hf", tmp / "hf", ckpt, "--config-out", params, *import_args, "-q")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("export-hf", ckpt, tmp / "back", "--config", params, "--model", export_model)
    assert proc.returncode == 0, proc.stderr
    before, after = _tensors(tmp / "hf"), _tensors(tmp / "back")
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert after[key].dtype == value.dtype and np.array_equal(after[key], value), key
    return ckpt, tmp / "back"


def _reload(cls, directory: Path):
    model, info = cls.from_pretrained(directory, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def test_clip_vit_round_trip(tmp_path):
    torch.manual_seed(0)
    model = transformers.CLIPVisionModelWithProjection(CLIP).eval()
    ckpt, back = _round_trip(tmp_path, model, export_model="clip-vit")
    cs = _cs(ckpt)
    hf = _tensors(tmp_path / "hf")
    # clip_vit.py lines 212-236: CS keeps the class token's position row last
    positions = cs["vit_model.embedding_layer.position_embeddings.weight"]
    hf_positions = hf["vision_model.embeddings.position_embedding.weight"]
    assert np.array_equal(positions[-1], hf_positions[0])
    assert np.array_equal(positions[:-1], hf_positions[1:])
    assert "classifier.classifier.ffn.0.linear_layer.weight" in cs  # visual_projection
    assert "vit_model.encoder.transformer_encoder.layers.1.self_attn.proj_q_dense_layer.bias" in cs
    config = json.loads((back / "config.json").read_text())
    assert config["model_type"] == "clip_vision_model" and config["projection_dim"] == 24
    reloaded = _reload(transformers.CLIPVisionModelWithProjection, back)
    pixels = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(reloaded(pixels).image_embeds, model(pixels).image_embeds)


def test_clip_vit_without_projection_is_named(tmp_path):
    """registry.py line 223 serves clip-vit with the projection converter only."""
    transformers.CLIPVisionModel(CLIP).save_pretrained(tmp_path / "hf")
    proc = run_cli("import-hf", tmp_path / "hf", tmp_path / "c.mdl", "--model", "clip-vit")
    one_line_error(proc, 2, "architectures='CLIPVisionModel'", "CLIPVisionModelWithProjection")


def test_clip_vit_params_are_model_zoos(tmp_path):
    """clip_vit.py lines 501-516 and vit.py lines 556-566: the CS config Model Zoo writes."""
    torch.manual_seed(0)
    transformers.CLIPVisionModelWithProjection(CLIP).save_pretrained(tmp_path / "hf")
    params = tmp_path / "p.yaml"
    run_cli("import-hf", tmp_path / "hf", tmp_path / "c.mdl", "--config-out", params, "-q")
    text = params.read_text()
    for line in (
        "name: vision_transformer",
        "num_classes: 24",
        "nonlinearity: quick_gelu",
        "use_post_embed_layer_norm: true",
        "use_bias_in_output: false",
        "use_encoder_pooler_layer: false",
    ):
        assert line in text, line


DPO_POLICIES = {
    "llama": (
        "LlamaForCausalLM",
        transformers.LlamaConfig(
            hidden_size=64,
            num_attention_heads=4,
            num_hidden_layers=2,
            vocab_size=96,
            intermediate_size=128,
            num_key_value_heads=2,
        ),
    ),
    # a tied head, Conv1D transposes and a fused QKV: plans that are not only renames
    "gpt2": (
        "GPT2LMHeadModel",
        transformers.GPT2Config(
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_inner=256,
            vocab_size=96,
            bos_token_id=0,
            eos_token_id=0,
        ),
    ),
}


@pytest.mark.parametrize("policy", sorted(DPO_POLICIES))
def test_dpo_round_trip(tmp_path, policy):
    """dpo.py lines 97-141: the policy under ``policy_model.model.``, the reference model a copy
    under ``ref_model.model.`` (a tie here, stored once); export gives the policy alone."""
    cls_name, config = DPO_POLICIES[policy]
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config).eval()
    ckpt, back = _round_trip(tmp_path, model, "--model", "dpo", export_model="dpo")
    cs = _cs(ckpt)
    policy_keys = {k[len("policy_model.model.") :] for k in cs if k.startswith("policy_model.")}
    ref_keys = {k[len("ref_model.model.") :] for k in cs if k.startswith("ref_model.")}
    assert policy_keys == ref_keys and len(policy_keys) + len(ref_keys) == len(cs)
    assert "embedding_layer.word_embeddings.weight" in policy_keys
    for key in policy_keys:
        assert np.array_equal(cs[f"policy_model.model.{key}"], cs[f"ref_model.model.{key}"]), key
    params = (tmp_path / "params.yaml").read_text()
    assert "name: dpo" in params and f"model_name: {policy}" in params
    assert "beta: 0.1" in params and "reference_free: false" in params
    reloaded = _reload(getattr(transformers, cls_name), back)
    original = getattr(transformers, cls_name).from_pretrained(tmp_path / "hf").eval()
    ids = torch.arange(10).reshape(1, 10) + 3
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, original(ids).logits)


def test_dpo_policy_must_be_named_and_supported(tmp_path):
    cls_name, config = DPO_POLICIES["llama"]
    torch.manual_seed(0)
    getattr(transformers, cls_name)(config).save_pretrained(tmp_path / "hf")
    ckpt, params = tmp_path / "m.mdl", tmp_path / "p.yaml"
    proc = run_cli("import-hf", tmp_path / "hf", ckpt, "--config-out", params, "--model", "dpo")
    assert proc.returncode == 0, proc.stderr
    text = params.read_text()
    for edited, words in (
        (text.replace("model_name: llama", "model_name: gemma2"), "names 'gemma2'; it holds one"),
        (re.sub(r"\n *model_name: llama", "", text), "does not name the model it holds"),
    ):
        (tmp_path / "edited.yaml").write_text(edited)
        proc = run_cli("export-hf", ckpt, tmp_path / "out", "--config", tmp_path / "edited.yaml",
                       "--model", "dpo")  # fmt: skip
        line = one_line_error(proc, 2, words)
        assert "model_name" in line


def test_a_part_follows_its_ties_and_never_recurses():
    """A composite's part ties as its own family does, under the part's prefix; a config
    naming the composite itself as its part is not followed."""
    p = "policy_model.model."
    cs = {f"{p}lm_head.weight": (4, 2), f"{p}embedding_layer.word_embeddings.weight": (4, 2)}
    ties = unconverted.cs_ties(cs, {"model_name": "gpt2"}, "dpo")
    assert ties == {f"{p}lm_head.weight": f"{p}embedding_layer.word_embeddings.weight"}
    assert unconverted.cs_ties(cs, {"model_name": "dpo"}, "dpo") == {}
    dropped = unconverted.cs_dropped({"ref_model.model.x": (1,)}, {"model_name": "gpt2"}, "dpo")
    assert "reference model" in dropped["ref_model.model.x"]
