"""ESM-2 HF <-> CS mapping (``ckpt_migrate/hf/families/esm2.py``) checked against real
``transformers`` ``EsmForMaskedLM`` models: tiny random models go HF -> CS -> HF and must come
back bit for bit, with identical logits, and through the real ``import-hf`` / ``export-hf``.

Expected CS names are Model Zoo's (tag Release_2.10.0,
``src/cerebras/modelzoo/tools/checkpoint_converters/``): esm2.py lines 46-123 (encoder layers,
embedding and final norms), 259-315 (MLM head), bert.py lines 82-125 and 155-233 (the BERT rules
ESM inherits), 1244-1252 (``position_embeddings.embed``). The tied MLM decoder weight is written
on the CS side (``Esm2PretrainModel``'s state dict holds it; Model Zoo leaves it out).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from ckpt_migrate.hf import mapping  # noqa: E402
from ckpt_migrate.hf.families import esm2  # noqa: E402
from ckpt_migrate.hf.mapping import MappingError  # noqa: E402
from ckpt_migrate.hf.ops import interleave_rotary  # noqa: E402

NAME = "esm-2"
SMALL = dict(
    vocab_size=96,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    pad_token_id=1,
    mask_token_id=32,
    max_position_embeddings=64,
)
# rotary + tied (ESM-2 as published); learned positions + untied head + embedding norm + token
# dropout (the other branches of every rule)
CONFIGS = {
    "rotary-tied": dict(position_embedding_type="rotary", emb_layer_norm_before=False),
    "absolute-untied": dict(
        position_embedding_type="absolute",
        emb_layer_norm_before=True,
        token_dropout=True,
        tie_word_embeddings=False,
        rope_theta=5000.0,
    ),
}
# Bookkeeping transformers adds to a config dict; ``architectures`` is what save_pretrained
# writes and a config built in memory lacks (config_to_hf always names the class).
BOOKKEEPING = {"transformers_version", "dtype", "architectures"}
# HF tensors with no CS counterpart: the contact head (Model Zoo drops it, esm2.py lines
# 316-320; transformers initialises it anew) and the rotary buffer transformers recomputes.
NO_CS = {"esm.contact_head.regression.weight", "esm.contact_head.regression.bias"}
INV_FREQ = "esm.rotary_embeddings.inv_freq"
CS_DECODER_W = "bert_mlm_head.classifier.ffn.0.linear_layer.weight"


def wb(*names: str) -> list[str]:
    return [f"{n}.{p}" for n in names for p in ("weight", "bias")]


def expected_cs(kind: str) -> list[str]:
    """Layer 0 and the non-layer keys (esm2.py lines 46-123 and 259-315; bert.py lines 82-125,
    155-233, 1244-1252)."""
    c = "bert_encoder.transformer_encoder.layers.0."
    names = wb(
        f"{c}self_attn.proj_q_dense_layer",
        f"{c}self_attn.proj_k_dense_layer",
        f"{c}self_attn.proj_v_dense_layer",
        f"{c}self_attn.proj_output_dense_layer",
        f"{c}norm1",
        f"{c}ffn.ffn.0.linear_layer",
        f"{c}ffn.ffn.1.linear_layer",
        f"{c}norm2",
        "bert_encoder.transformer_encoder.norm",
        "bert_mlm_head.mlm_transform.ffn.ffn.0.linear_layer",
        "bert_mlm_head.mlm_transform.ln",
        "bert_mlm_head.classifier.ffn.0.linear_layer",
    )
    names.append("bert_encoder.embedding_layer.word_embeddings.weight")
    if kind == "absolute-untied":
        names.append("bert_encoder.embedding_layer.position_embeddings.embed.weight")
        names += wb("bert_encoder.embed_ln_f")
    return sorted(names)


def build(kind: str):
    config = transformers.EsmConfig(**SMALL, **CONFIGS[kind])
    torch.manual_seed(0)
    model = transformers.EsmForMaskedLM(config).eval()
    with torch.no_grad():  # transformers starts biases and norms at 0 and 1: make them tell
        for param in model.parameters():
            param.normal_(0.0, 0.05)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return config, model, state


def shapes(tensors: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in tensors.items()}


def to_cs(config, state: dict[str, np.ndarray]) -> tuple[dict, dict[str, np.ndarray]]:
    hf_cfg = config.to_dict()
    cs_model = esm2.config_to_cs(hf_cfg, NAME)
    plan = esm2.plan_to_cs(shapes(state), hf_cfg, NAME)
    assert mapping.missing_inputs(plan, shapes(state)) == []
    unused = mapping.unused_inputs(plan, shapes(state))
    assert unused == sorted(esm2.hf_dropped(shapes(state), hf_cfg, NAME))
    return cs_model, dict(mapping.run(plan, state.__getitem__))


def logits(model) -> torch.Tensor:
    ids = torch.arange(12).reshape(1, 12) % 90 + 3
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_hf_to_cs_names_and_dropped(kind):
    config, _, state = build(kind)
    _, cs = to_cs(config, state)
    layer1 = {k for k in cs if ".layers.1." in k}
    assert sorted(set(cs) - layer1) == expected_cs(kind)
    assert len(layer1) == 16
    dropped = set(esm2.hf_dropped(shapes(state), config.to_dict(), NAME))
    assert dropped == NO_CS | ({INV_FREQ} if kind == "rotary-tied" else set())


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_rotary_rows_are_permuted_only_with_rotary(kind):
    """esm2.py lines 127-185: q/k rows interleaved per head (weight and bias), v untouched."""
    config, _, state = build(kind)
    _, cs = to_cs(config, state)
    c, h = "bert_encoder.transformer_encoder.layers.0.self_attn.", "esm.encoder.layer.0.attention."
    for cs_n, hf_n in (("proj_q_dense_layer", "self.query"), ("proj_k_dense_layer", "self.key")):
        for p in ("weight", "bias"):
            want = state[f"{h}{hf_n}.{p}"]
            if kind == "rotary-tied":
                want = interleave_rotary(want, 4)
                assert not np.array_equal(want, state[f"{h}{hf_n}.{p}"])
            assert np.array_equal(cs[f"{c}{cs_n}.{p}"], want)
    assert np.array_equal(cs[f"{c}proj_v_dense_layer.weight"], state[f"{h}self.value.weight"])


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_config_round_trip(kind):
    config, _, _ = build(kind)
    cs_model = esm2.config_to_cs(config.to_dict(), NAME)
    back = esm2.config_to_hf(cs_model, NAME)
    assert back["architectures"] == ["EsmForMaskedLM"] and back["model_type"] == "esm"
    again = transformers.EsmConfig(**back).to_diff_dict()
    original = config.to_diff_dict()
    for key in BOOKKEEPING:
        again.pop(key, None), original.pop(key, None)
    assert again == original
    if kind == "absolute-untied":  # esm2.py lines 494-545: the MSL, not HF's table size
        assert cs_model["max_position_embeddings"] == 64 - 1 - 1
        assert cs_model["mask_padding_in_positional_embed"] is True
    else:  # esm2.py lines 590-594
        assert cs_model["rotary_dim"] == 16


def test_null_embedding_norm_is_false_on_cs():
    """EsmConfig's default ``emb_layer_norm_before`` is None (no norm); CS gets a bool. The
    round trip writes false, which means the same: the only field excluded from equality."""
    config = transformers.EsmConfig(**SMALL, position_embedding_type="rotary")
    assert config.emb_layer_norm_before is None
    cs_model = esm2.config_to_cs(config.to_dict(), NAME)
    assert cs_model["embedding_layer_norm"] is False
    assert esm2.config_to_hf(cs_model, NAME)["emb_layer_norm_before"] is False


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_round_trip_is_bitwise_and_logits_equal(kind):
    config, model, state = build(kind)
    cs_model, cs = to_cs(config, state)
    tied = kind == "rotary-tied"
    word = state["esm.embeddings.word_embeddings.weight"]
    assert np.array_equal(cs[CS_DECODER_W], word) == tied
    plan = esm2.plan_to_hf(shapes(cs), cs_model, NAME)
    ties = esm2.cs_ties(shapes(cs), cs_model, NAME)
    assert ties == (
        {CS_DECODER_W: "bert_encoder.embedding_layer.word_embeddings.weight"} if tied else {}
    )
    assert [n for n in mapping.unused_inputs(plan, shapes(cs)) if n not in ties] == []
    hf = dict(mapping.run(plan, cs.__getitem__))
    # not written: what has no CS counterpart, and the tied decoder save_pretrained leaves out
    absent = NO_CS | ({INV_FREQ, "lm_head.decoder.weight"} if tied else set())
    assert set(hf) == set(state) - absent
    for key, value in hf.items():
        assert value.dtype == state[key].dtype and value.shape == state[key].shape, key
        assert np.array_equal(value, state[key]), key

    fresh = transformers.EsmForMaskedLM(config).eval()
    result = fresh.load_state_dict({k: torch.from_numpy(v) for k, v in hf.items()}, strict=False)
    assert result.unexpected_keys == []
    assert set(result.missing_keys) == absent
    assert torch.equal(logits(fresh), logits(model))


def test_state_dict_decoder_must_match_tied_embeddings():
    config, _, state = build("rotary-tied")
    state = dict(state)
    state["lm_head.decoder.weight"] = state["lm_head.decoder.weight"] + 1.0
    plan = esm2.plan_to_cs(shapes(state), config.to_dict(), NAME)
    with pytest.raises(MappingError, match="tied"):
        dict(mapping.run(plan, state.__getitem__))


def test_unknown_cs_tensor_is_reported():
    config, _, state = build("rotary-tied")
    cs_model, cs = to_cs(config, state)
    cs["bert_encoder.pooler.pooler.ffn.0.linear_layer.weight"] = np.zeros((64, 64), np.float32)
    plan = esm2.plan_to_hf(shapes(cs), cs_model, NAME)
    ties = esm2.cs_ties(shapes(cs), cs_model, NAME)
    unused = [n for n in mapping.unused_inputs(plan, shapes(cs)) if n not in ties]
    assert unused == ["bert_encoder.pooler.pooler.ffn.0.linear_layer.weight"]


def test_missing_cs_tensor_is_named():
    config, _, state = build("absolute-untied")
    cs_model, cs = to_cs(config, state)
    del cs["bert_encoder.embed_ln_f.weight"]
    with pytest.raises(MappingError, match=r"embed_ln_f\.weight"):
        esm2.plan_to_hf(shapes(cs), cs_model, NAME)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("position_embedding_type", "fixed", "position_embedding_type"),
        ("mask_padding_in_positional_embed", False, "mask_padding_in_positional_embed"),
        ("rotary_dim", 4, "rotary_dim"),
        ("disable_nsp", False, "disable_nsp"),
        ("use_final_layer_norm", False, "use_final_layer_norm"),
        ("encoder_nonlinearity", "relu", "encoder_nonlinearity"),
        ("mlm_nonlinearity", "relu", "mlm_nonlinearity"),
        ("norm_first", False, "norm_first"),
        ("mup_base_hidden_size", 32, "mup_base_hidden_size"),
    ],
)
def test_unsupported_cs_config(field, value, match):
    rotary = esm2.config_to_cs(
        transformers.EsmConfig(**SMALL, position_embedding_type="rotary").to_dict(), NAME
    )
    learned = esm2.config_to_cs(transformers.EsmConfig(**SMALL).to_dict(), NAME)
    base = rotary if field == "rotary_dim" else learned
    with pytest.raises(MappingError, match=match):
        esm2.config_to_hf({**base, field: value}, NAME)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("position_embedding_type", "relative_key", "position_embedding_type"),
        ("is_folding_model", True, "is_folding_model"),
        ("is_decoder", True, "is_decoder"),
        ("model_type", "bert", "model_type"),
        ("mask_token_id", None, "mask_token_id"),
    ],
)
def test_unsupported_hf_config(field, value, match):
    hf = {**transformers.EsmConfig(**SMALL, token_dropout=True).to_dict(), field: value}
    with pytest.raises(MappingError, match=match):
        esm2.config_to_cs(hf, NAME)


def _tensors(directory: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(safetensors_numpy.load_file(str(file)))
    return out


def _legacy(name: str) -> str:
    """transformers 5 ``save_pretrained`` spells ESM's ``LayerNorm.weight``/``.bias`` as
    ``gamma``/``beta`` (the reverse of its load renames, conversion_mapping.py "esm")."""
    return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
        "LayerNorm.beta", "LayerNorm.bias"
    )


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_cli_import_then_export(kind, tmp_path):
    """The real commands on a ``save_pretrained`` directory: every saved tensor comes back bit
    for bit under its state-dict name, except the contact head and the rotary buffer (no CS
    counterpart), and ``from_pretrained`` gives the same logits."""
    config, model, _ = build(kind)
    model.save_pretrained(tmp_path / "hf")
    ckpt, params = tmp_path / "m.mdl", tmp_path / "params.yaml"
    proc = run_cli("import-hf", tmp_path / "hf", ckpt, "--config-out", params, "--model", NAME)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("export-hf", ckpt, tmp_path / "back", "--config", params, "--model", NAME, "-q")
    assert proc.returncode == 0, proc.stderr

    before = {_legacy(k): v for k, v in _tensors(tmp_path / "hf").items()}
    after = _tensors(tmp_path / "back")
    star = "esm.encoder.layer.*.attention.self.rotary_embeddings.inv_freq"
    assert set(before) - set(after) == NO_CS | ({star} if kind == "rotary-tied" else set())
    assert set(after) <= set(before)
    for key, value in after.items():
        assert value.dtype == before[key].dtype and np.array_equal(value, before[key]), key

    cfg_after = json.loads((tmp_path / "back" / "config.json").read_text())
    again = transformers.EsmConfig(**cfg_after).to_diff_dict()
    expected = config.to_diff_dict()
    for key in BOOKKEEPING:
        again.pop(key, None), expected.pop(key, None)
    assert {k: again.get(k) for k in expected} == expected
    reloaded = transformers.EsmForMaskedLM.from_pretrained(tmp_path / "back").eval()
    assert torch.equal(logits(reloaded), logits(model))
