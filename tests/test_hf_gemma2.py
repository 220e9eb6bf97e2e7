"""HF <-> CS for Gemma 2 (ckpt_migrate/hf/families/gemma2.py): tiny random ``Gemma2ForCausalLM``
models of the installed transformers round-trip bit for bit through the CS names Model Zoo (tag
Release_2.10.0, checkpoint_converters/gemma2.py) gives them, with HF's norm offset folded into
the CS norms, and compute the same logits after."""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from ckpt_migrate.hf.families import by_model_type, by_name, gemma2  # noqa: E402
from ckpt_migrate.hf.mapping import MappingError, run, unused_inputs  # noqa: E402
from ckpt_migrate.hf.ops import shift  # noqa: E402

NAME = "gemma2"
SMALL = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
CASES = {
    # GQA, tied head, head_dim * heads == hidden_size, query_pre_attn_scalar == head_dim
    "gqa-tied": dict(
        intermediate_size=96,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=4,
        hidden_activation="gelu",
    ),
    # MHA, untied head, attention biases, head_dim * heads != hidden_size, an attention scale
    # other than the head size (attention_logits_alpha), no final soft-capping, other rope theta
    "mha-untied-bias": dict(
        intermediate_size=80,
        num_key_value_heads=4,
        head_dim=32,
        query_pre_attn_scalar=24,
        sliding_window=8,
        hidden_activation="silu",
        tie_word_embeddings=False,
        attention_bias=True,
        final_logit_softcapping=None,
        attn_logit_softcapping=20.0,
        rope_parameters={"rope_type": "default", "rope_theta": 1e5},
        rms_norm_eps=1e-5,
        initializer_range=0.03,
        max_position_embeddings=256,
    ),
}
# transformers' bookkeeping, not model fields
BOOKKEEPING = ("transformers_version", "dtype", "torch_dtype", "architectures")

# Model Zoo gemma2.py lines 46-161 (and llama.py lines 42-69 for the attention): the CS names of
# layer 0 and outside the layers (ln_f: lines 185-190; lm_head: line 154, and ours when tied).
L0 = "transformer_decoder.layers.0."
CS_LAYER0 = [
    L0 + "self_attn.proj_q_dense_layer.weight",
    L0 + "self_attn.proj_k_dense_layer.weight",
    L0 + "self_attn.proj_v_dense_layer.weight",
    L0 + "self_attn.proj_output_dense_layer.weight",
    L0 + "ffn.ffn.0.linear_layer_for_glu.weight",
    L0 + "ffn.ffn.0.linear_layer.weight",
    L0 + "ffn.ffn.1.linear_layer.weight",
    L0 + "norm1.weight",
    L0 + "norm1_post.weight",
    L0 + "norm3.weight",
    L0 + "norm3_post.weight",
]
CS_LAYER0_BIASES = [L0 + f"self_attn.proj_{p}_dense_layer.bias" for p in ("q", "k", "v", "output")]
CS_OUTER = [
    "embedding_layer.word_embeddings.weight",
    "transformer_decoder.norm.weight",
    "ln_f.weight",
    "lm_head.weight",
]
HF_TO_CS_NORMS = {
    "model.norm.weight": "transformer_decoder.norm.weight",
    "model.layers.0.input_layernorm.weight": L0 + "norm1.weight",
    "model.layers.0.post_attention_layernorm.weight": L0 + "norm1_post.weight",
    "model.layers.0.pre_feedforward_layernorm.weight": L0 + "norm3.weight",
    "model.layers.0.post_feedforward_layernorm.weight": L0 + "norm3_post.weight",
}


def _build(extra: dict):
    config = transformers.Gemma2Config(**SMALL, **extra, architectures=["Gemma2ForCausalLM"])
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config).eval()
    with torch.no_grad():
        for key, param in model.named_parameters():
            if key.endswith("norm.weight"):
                # multiples of 1/256 in [-1/4, 1/4): w + 1 - 1 == w exactly in float32
                param.copy_(torch.randint(-64, 64, param.shape) / 256.0)
            elif key.endswith(".bias"):
                param.normal_()
    return config, model


def _saved(model, config) -> dict[str, np.ndarray]:
    """The tensors ``save_pretrained`` writes: the state dict minus a tied head."""
    sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        sd.pop("lm_head.weight")
    return sd


def _shapes(tensors):
    return {k: tuple(v.shape) for k, v in tensors.items()}


def _logits(model):
    ids = torch.arange(12).remainder(model.config.vocab_size).reshape(1, 12)
    with torch.no_grad():
        return model(input_ids=ids).logits


def _cs_of(extra):
    config, model = _build(extra)
    hf = _saved(model, config)
    cfg = config.to_dict()
    plan = gemma2.plan_to_cs(_shapes(hf), cfg, NAME)
    return gemma2.config_to_cs(cfg, NAME), dict(run(plan, hf.__getitem__))


@pytest.mark.parametrize("case", list(CASES))
def test_round_trip(case):
    assert by_name()[NAME] is gemma2 and by_model_type()["gemma2"] is gemma2
    config, model = _build(CASES[case])
    hf_cfg = config.to_dict()
    hf = _saved(model, config)

    # 2. HF -> CS: the names Model Zoo gives, every HF tensor read, norms shifted by +1.
    cs_model = gemma2.config_to_cs(hf_cfg, NAME)
    plan = gemma2.plan_to_cs(_shapes(hf), hf_cfg, NAME)
    assert unused_inputs(plan, _shapes(hf)) == []
    assert gemma2.hf_dropped(_shapes(hf), hf_cfg, NAME) == {}
    cs = dict(run(plan, hf.__getitem__))
    layer0 = CS_LAYER0 + (CS_LAYER0_BIASES if config.attention_bias else [])
    assert sorted(k for k in cs if k.startswith(L0)) == sorted(layer0)
    outer = sorted(k for k in cs if not k.startswith("transformer_decoder.layers."))
    assert outer == sorted(CS_OUTER)
    assert len(cs) == len(CS_OUTER) + config.num_hidden_layers * len(layer0)
    for hf_name, cs_name in HF_TO_CS_NORMS.items():
        assert np.array_equal(cs[cs_name], hf[hf_name] + np.float32(1)), cs_name
        assert not np.array_equal(cs[cs_name], hf[hf_name])
    assert np.array_equal(cs["ln_f.weight"], cs["transformer_decoder.norm.weight"])
    if config.tie_word_embeddings:
        assert np.array_equal(cs["lm_head.weight"], cs["embedding_layer.word_embeddings.weight"])

    # 3. the config round-trips on every field.
    roundtrip = gemma2.config_to_hf(cs_model, NAME)
    assert roundtrip["architectures"] == ["Gemma2ForCausalLM"]
    fresh_config = transformers.Gemma2Config(
        **{k: v for k, v in roundtrip.items() if k != "model_type"}
    )
    again, want = fresh_config.to_diff_dict(), config.to_diff_dict()
    for key in BOOKKEEPING:
        again.pop(key, None), want.pop(key, None)
    assert again == want

    # 4. CS -> HF: bit for bit; the CS tensors left unread are the ties.
    back_plan = gemma2.plan_to_hf(_shapes(cs), cs_model, NAME)
    ties = gemma2.cs_ties(_shapes(cs), cs_model, NAME)
    tied_head = {"lm_head.weight": "embedding_layer.word_embeddings.weight"}
    assert ties == {
        "ln_f.weight": "transformer_decoder.norm.weight",
        **(tied_head if config.tie_word_embeddings else {}),
    }
    assert unused_inputs(back_plan, _shapes(cs)) == sorted(ties)
    back = dict(run(back_plan, cs.__getitem__))
    assert sorted(back) == sorted(hf)
    for key, value in hf.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        assert np.array_equal(back[key], value), key

    # 5. the round-tripped tensors in a fresh model give the same logits.
    fresh = transformers.Gemma2ForCausalLM(fresh_config).eval()
    result = fresh.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, False)
    assert result.unexpected_keys == []
    assert result.missing_keys == (["lm_head.weight"] if config.tie_word_embeddings else [])
    assert torch.equal(_logits(fresh), _logits(model))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_norm_offset_is_computed_as_torch_computes_it(dtype):
    """Model Zoo gemma2.py lines 178-181: ``weight +/- torch.ones_like(weight)``, in the weight's
    dtype; bf16 travels as its 16-bit pattern (int16)."""
    torch.manual_seed(0)
    w = (torch.randn(4096) * torch.logspace(-8, 2, 4096)).to(dtype)
    bf16 = dtype == torch.bfloat16
    as_numpy = (lambda t: t.view(torch.int16).numpy()) if bf16 else torch.Tensor.numpy
    for delta in (1.0, -1.0):
        want = as_numpy(w + delta * torch.ones_like(w))
        got = shift(as_numpy(w), delta)
        assert got.dtype == want.dtype and np.array_equal(got, want), (dtype, delta)


def test_a_norm_weight_small_against_one_does_not_come_back_bit_for_bit():
    """The documented limit of Model Zoo's fold: ``(w + 1) - 1`` rounds for small ``w``."""
    w = np.array([1e-9, 0.123456789, 0.0, 0.5], np.float32)
    back = shift(shift(w, 1.0), -1.0)
    assert back[2] == 0.0 and back[3] == 0.5
    assert back[0] != w[0] and abs(back[1] - w[1]) <= np.spacing(np.float32(1.0))


def test_q_and_k_rows_are_interleaved_as_model_zoo_does():
    """llama.py lines 239-264 (``interleave_helper`` with rotary_dim = head_dim, gemma2.py line
    756), written in torch here: per head, rows ``[x0..x7, y0..y7]`` become ``[x0, y0, ...]``."""
    extra = CASES["gqa-tied"]
    _, model = _build(extra)
    _, cs = _cs_of(extra)
    for proj, heads in (("q", 4), ("k", 2)):
        w = model.state_dict()[f"model.layers.1.self_attn.{proj}_proj.weight"]
        t = w.view(heads, w.shape[0] // heads, w.shape[1])
        want = t.reshape(heads, 2, -1, t.shape[-1]).permute(0, 2, 1, 3).reshape(w.shape)
        got = cs[f"transformer_decoder.layers.1.self_attn.proj_{proj}_dense_layer.weight"]
        assert np.array_equal(got, want.numpy())


def test_config_fields_model_zoo_derives():
    """gemma2.py lines 755-765 (rotary_dim, embeddings_scale, attention_logits_alpha), 621-625
    (attention_inner_dim), 549-564 (GQA), 674-688 (any gelu_* is geglu)."""
    cfg = transformers.Gemma2Config(**SMALL, **CASES["mha-untied-bias"]).to_dict()
    cs = gemma2.config_to_cs(cfg, NAME)
    assert cs["attention_inner_dim"] == 128 and cs["rotary_dim"] == 32
    assert cs["embeddings_scale"] == 8.0 and cs["attention_logits_alpha"] == (32 / 24) ** 0.5
    assert cs["attention_module"] == "aiayn_attention" and "extra_attention_params" not in cs
    assert cs["use_projection_bias_in_attention"] and cs["use_ffn_bias_in_attention"]
    assert cs["nonlinearity"] == "swiglu" and cs["rope_theta"] == 1e5
    assert gemma2.config_to_hf(cs, NAME)["query_pre_attn_scalar"] == 24
    tanh = {**cfg, "hidden_activation": "gelu_pytorch_tanh"}
    assert gemma2.config_to_cs(tanh, NAME)["nonlinearity"] == "geglu"
    gqa_cfg = transformers.Gemma2Config(**SMALL, **CASES["gqa-tied"]).to_dict()
    gqa = gemma2.config_to_cs(gqa_cfg, NAME)
    assert gqa["attention_module"] == "multiquery_attention"
    assert gqa["extra_attention_params"] == {"num_kv_groups": 2}
    assert "attention_logits_alpha" not in gqa


def test_a_tied_head_in_the_state_dict_is_checked_and_old_rotary_buffers_dropped():
    config, model = _build(CASES["gqa-tied"])
    hf = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    hf["model.rotary_emb.inv_freq"] = np.ones(8, np.float32)
    cfg = config.to_dict()
    plan = gemma2.plan_to_cs(_shapes(hf), cfg, NAME)
    assert unused_inputs(plan, _shapes(hf)) == ["model.rotary_emb.inv_freq"]
    assert list(gemma2.hf_dropped(_shapes(hf), cfg, NAME)) == ["model.rotary_emb.inv_freq"]
    assert "lm_head.weight" in dict(run(plan, hf.__getitem__))
    hf["lm_head.weight"] = hf["lm_head.weight"] + 1
    with pytest.raises(MappingError, match=r"lm_head\.weight"):
        dict(run(plan, hf.__getitem__))


def test_unknown_cs_tensor_is_reported_and_a_missing_one_named():
    cs_model, cs = _cs_of(CASES["gqa-tied"])
    shapes = _shapes(cs)
    shapes["transformer_decoder.layers.0.self_attn.q_norm.weight"] = (16,)
    plan = gemma2.plan_to_hf(shapes, cs_model, NAME)
    assert "transformer_decoder.layers.0.self_attn.q_norm.weight" in unused_inputs(plan, shapes)
    del shapes["transformer_decoder.layers.1.norm3_post.weight"]
    with pytest.raises(MappingError, match=r"layers\.1\.norm3_post\.weight"):
        gemma2.plan_to_hf(shapes, cs_model, NAME)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("embeddings_scale", 1.0),
        ("norm_first_sandwich", False),
        ("sliding_window_every_other_decoder_layer", False),
        ("use_ffn_bias", True),
        ("position_embedding_type", "learned"),
        ("nonlinearity", "gelu"),
        ("rotary_dim", 8),
        ("use_ffn_bias_in_attention", True),
        ("pos_scaling_factor", 2.0),
        ("attention_qk_norm_layer", "rmsnorm"),
        ("sliding_window_every_other_decoder_layer_pattern", "full_attention_first"),
        ("mup_base_hidden_size", 32),
        ("attention_module", "multihead_latent_attention"),
        ("moe", {"num_experts": 4}),
    ],
)
def test_unsupported_cs_config_field_is_named(field, value):
    cs_model, cs = _cs_of(CASES["gqa-tied"])
    if field == "attention_module":
        cs_model.pop("extra_attention_params")
    bad = {**cs_model, field: value}
    with pytest.raises(MappingError, match=field):
        gemma2.config_to_hf(bad, NAME)
    with pytest.raises(MappingError, match=field):
        gemma2.plan_to_hf(_shapes(cs), bad, NAME)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("layer_types", ["full_attention", "sliding_attention"]),
        ("use_bidirectional_attention", True),
        ("rope_parameters", {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
        ("hidden_activation", "tanh"),
        ("model_type", "llama"),
        ("num_key_value_heads", 3),
    ],
)
def test_unsupported_hf_config_field_is_named(field, value):
    cfg = {**transformers.Gemma2Config(**SMALL, **CASES["gqa-tied"]).to_dict(), field: value}
    with pytest.raises(MappingError, match=field):
        gemma2.config_to_cs(cfg, NAME)
    with pytest.raises(MappingError, match=field):
        gemma2.plan_to_cs({}, cfg, NAME)


def test_other_names_are_refused():
    with pytest.raises(MappingError, match="llama"):
        gemma2.config_to_cs({}, "llama")


def test_a_bare_config_json_takes_model_zoos_hf_defaults():
    """gemma2.py lines 438-464: the HF fields a ``config.json`` leaves out take Model Zoo's
    defaults (no golden case leaves them out, so they are pinned here)."""
    cs = gemma2.config_to_cs({"model_type": "gemma2"}, NAME)
    assert (cs["vocab_size"], cs["hidden_size"], cs["num_hidden_layers"]) == (256000, 3072, 28)
    assert (cs["num_heads"], cs["attention_module"], cs["filter_size"]) == (
        16,
        "aiayn_attention",
        24576,
    )
    assert (cs["attention_inner_dim"], cs["rotary_dim"]) == (16 * 256, 256)
    assert cs["attention_logits_alpha"] == (256 / 224) ** 0.5
    assert cs["embeddings_scale"] == 3072**0.5 and cs["share_embedding_weights"] is True
    assert (cs["max_position_embeddings"], cs["layer_norm_epsilon"]) == (8192, 1e-06)
    assert (cs["final_logit_softcapping"], cs["attention_logit_softcapping"]) == (30.0, 50.0)
    assert (cs["attention_sliding_window_length"], cs["nonlinearity"]) == (4096, "geglu")
    assert cs["use_projection_bias_in_attention"] is False and cs["initializer_range"] == 0.02


def test_an_embedding_dropout_of_zero_is_no_dropout():
    """gemma2.py lines 359-433: ``embedding_dropout_rate`` may be null or 0.0."""
    cs = gemma2.config_to_cs({"model_type": "gemma2"}, NAME)
    with_zero = gemma2.config_to_hf({**cs, "embedding_dropout_rate": 0.0}, NAME)
    assert with_zero == gemma2.config_to_hf(cs, NAME)
    with pytest.raises(MappingError, match=r"embedding_dropout_rate=0.1: HF Gemma 2 needs \(None"):
        gemma2.config_to_hf({**cs, "embedding_dropout_rate": 0.1}, NAME)
