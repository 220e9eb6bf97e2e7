"""HF <-> CS for the LLaMA family, Mistral and Mixtral (ckpt_migrate/hf/families/llama.py and
mixtral.py): tiny random models of the installed transformers round-trip bit for bit, through
the CS names Model Zoo (tag Release_2.10.0) gives them, and compute the same logits after."""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
save_file = pytest.importorskip("safetensors.numpy").save_file

from ckpt_migrate.hf.experts import PER_EXPERT  # noqa: E402
from ckpt_migrate.hf.families import by_model_type, by_name, llama, mixtral  # noqa: E402
from ckpt_migrate.hf.mapping import MappingError, run, unused_inputs  # noqa: E402
from ckpt_migrate.hf.ops import deinterleave_rotary, interleave_rotary  # noqa: E402

SMALL = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    initializer_range=0.03,
)
# (model name, config class name, extra config fields): every name served, every variant.
CASES = [
    ("llama", "Llama", {}),  # MHA, untied
    ("llamaV2", "Llama", {"num_key_value_heads": 2}),  # GQA
    ("code-llama", "Llama", {"tie_word_embeddings": True, "rope_theta": 1e6}),  # tied
    (
        "wizardlm",
        "Llama",
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}},
    ),
    ("llama-headless", "Llama", {"num_key_value_heads": 1}),
    ("llamaV2-headless", "Llama", {"tie_word_embeddings": True}),
    ("code-llama-headless", "Llama", {"hidden_act": "gelu"}),
    ("wizardlm-headless", "Llama", {}),
    ("mistral", "Mistral", {"num_key_value_heads": 2, "sliding_window": 4}),
    ("mistral-headless", "Mistral", {"sliding_window": None, "num_key_value_heads": 4}),
    ("mixtral", "Mixtral", {"num_key_value_heads": 2, "num_local_experts": 4}),
    (
        "mixtral-headless",
        "Mixtral",
        {"num_local_experts": 4, "sliding_window": 4, "num_key_value_heads": 4},
    ),
]

# Model Zoo llama.py lines 305-393 (Converter_LlamaModel_HF_CS) and 395-409 (ln_f copy), 502-517
# (lm_head): the CS names of layer 0 and outside the layers.
L0 = "transformer_decoder.layers.0."
CS_LAYER0_ATTN = [
    L0 + "self_attn.proj_q_dense_layer.weight",
    L0 + "self_attn.proj_k_dense_layer.weight",
    L0 + "self_attn.proj_v_dense_layer.weight",
    L0 + "self_attn.proj_output_dense_layer.weight",
    L0 + "norm1.weight",
    L0 + "norm3.weight",
]
CS_LAYER0_MLP = [
    L0 + "ffn.ffn.0.linear_layer.weight",
    L0 + "ffn.ffn.0.linear_layer_for_glu.weight",
    L0 + "ffn.ffn.1.linear_layer.weight",
]
# Model Zoo mixtral.py lines 96-104 (router) and 172-267 (experts fused over dim 1).
CS_LAYER0_MOE = [
    L0 + "ffn.gate.weight",
    L0 + "ffn.experts.fused_ffns.0.linear_layer_for_glu.expert_weights",
    L0 + "ffn.experts.fused_ffns.0.linear_layer.expert_weights",
    L0 + "ffn.experts.fused_ffns.1.linear_layer.expert_weights",
]
CS_OUTER = [
    "embedding_layer.word_embeddings.weight",
    "transformer_decoder.norm.weight",
    "ln_f.weight",
    "lm_head.weight",
]
# Left out of the config comparison: transformers' bookkeeping (version, dtype of the run).
BOOKKEEPING = ("transformers_version", "dtype")


def _family(name):
    return mixtral if name.startswith("mixtral") else llama


def _build(name: str, kind: str, extra: dict):
    cfg_cls = getattr(transformers, f"{kind}Config")
    headless = name.endswith("-headless")
    model_cls = getattr(transformers, f"{kind}Model" if headless else f"{kind}ForCausalLM")
    config = cfg_cls(**SMALL, **extra, architectures=[model_cls.__name__])
    torch.manual_seed(0)
    model = model_cls(config).eval()
    return config, model, cfg_cls, model_cls


def _saved(model, config) -> dict[str, np.ndarray]:
    """The tensors ``save_pretrained`` writes: the state dict minus a tied head, and Mixtral's
    experts as transformers saves them (per expert ``w1``/``w2``/``w3``)."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    if config.model_type == "mixtral":
        sd = mixtral_legacy(sd, config)
    return sd


def mixtral_legacy(sd: dict, config) -> dict:
    out = {}
    inter = config.intermediate_size
    for key, value in sd.items():
        if key.endswith("mlp.gate.weight"):
            out[key.replace("mlp.gate", "block_sparse_moe.gate")] = value
        elif key.endswith("mlp.experts.gate_up_proj"):
            stem = key[: -len("mlp.experts.gate_up_proj")] + "block_sparse_moe.experts."
            for e in range(value.shape[0]):
                out[f"{stem}{e}.w1.weight"] = np.ascontiguousarray(value[e, :inter])
                out[f"{stem}{e}.w3.weight"] = np.ascontiguousarray(value[e, inter:])
        elif key.endswith("mlp.experts.down_proj"):
            stem = key[: -len("mlp.experts.down_proj")] + "block_sparse_moe.experts."
            for e in range(value.shape[0]):
                out[f"{stem}{e}.w2.weight"] = np.ascontiguousarray(value[e])
        else:
            out[key] = value
    return out


def _shapes(tensors):
    return {k: tuple(v.shape) for k, v in tensors.items()}


def _outputs(model, ids):
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize(("name", "kind", "extra"), CASES, ids=[c[0] for c in CASES])
def test_round_trip(name, kind, extra, tmp_path):
    family = _family(name)
    assert by_name()[name] is family
    assert by_model_type()[kind.lower()] is family
    config, model, cfg_cls, model_cls = _build(name, kind, extra)
    hf_cfg = config.to_dict()
    hf = _saved(model, config)

    # 2. HF -> CS: the names Model Zoo gives, every HF tensor read.
    cs_model = family.config_to_cs(hf_cfg, name)
    plan = family.plan_to_cs(_shapes(hf), hf_cfg, name)
    assert unused_inputs(plan, _shapes(hf)) == []
    assert family.hf_dropped(_shapes(hf), hf_cfg, name) == {}
    cs = dict(run(plan, hf.__getitem__))
    layer0 = CS_LAYER0_ATTN + (CS_LAYER0_MOE if kind == "Mixtral" else CS_LAYER0_MLP)
    assert sorted(k for k in cs if k.startswith(L0)) == sorted(layer0)
    assert sorted(k for k in cs if not k.startswith("transformer_decoder.layers.")) == sorted(
        CS_OUTER
    )
    assert len(cs) == len(CS_OUTER) + config.num_hidden_layers * len(layer0)
    if config.tie_word_embeddings:
        assert np.array_equal(cs["lm_head.weight"], cs["embedding_layer.word_embeddings.weight"])

    # 3. the config round-trips on every field.
    roundtrip = family.config_to_hf(cs_model, name)
    assert roundtrip["architectures"] == [model_cls.__name__]
    assert roundtrip["model_type"] == config.model_type
    again = cfg_cls(**{k: v for k, v in roundtrip.items() if k != "model_type"}).to_diff_dict()
    want = config.to_diff_dict()
    for key in BOOKKEEPING:
        again.pop(key, None)
        want.pop(key, None)
    assert again == want

    # 4. CS -> HF: bit for bit; the CS tensors left unread are the ties and the dropped head.
    back_plan = family.plan_to_hf(_shapes(cs), cs_model, name)
    ties = family.cs_ties(_shapes(cs), cs_model, name)
    dropped = family.cs_dropped(_shapes(cs), cs_model, name)
    tied_head = {"lm_head.weight": "embedding_layer.word_embeddings.weight"}
    assert ties == {
        "ln_f.weight": "transformer_decoder.norm.weight",
        **(tied_head if config.tie_word_embeddings else {}),
    }
    untied_headless = name.endswith("-headless") and not config.tie_word_embeddings
    assert list(dropped) == (["lm_head.weight"] if untied_headless else [])
    assert unused_inputs(back_plan, _shapes(cs)) == sorted([*ties, *dropped])
    for copy, original in ties.items():
        assert np.array_equal(cs[copy], cs[original])
    back = dict(run(back_plan, cs.__getitem__))
    assert sorted(back) == sorted(hf)
    for key, value in hf.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        assert np.array_equal(back[key], value), key

    # 5. the round-tripped tensors in a fresh model give the same outputs.
    ids = torch.arange(12).remainder(config.vocab_size).reshape(1, 12)
    fresh_config = cfg_cls(**{k: v for k, v in roundtrip.items() if k != "model_type"})
    if kind == "Mixtral":  # experts as saved on disk: let transformers load them
        fresh_config.save_pretrained(tmp_path)
        save_file(back, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
        fresh = model_cls.from_pretrained(tmp_path).eval()
    else:
        fresh = model_cls(fresh_config).eval()
        result = fresh.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, False)
        assert result.unexpected_keys == []
        assert result.missing_keys == (
            ["lm_head.weight"]
            if config.tie_word_embeddings and not name.endswith("-headless")
            else []
        )
    assert torch.equal(_outputs(fresh, ids), _outputs(model, ids))


def _cs_of(name, kind, extra):
    config, model, _, _ = _build(name, kind, extra)
    hf_cfg = config.to_dict()
    hf = _saved(model, config)
    family = _family(name)
    cs = dict(run(family.plan_to_cs(_shapes(hf), hf_cfg, name), hf.__getitem__))
    return config, model, hf_cfg, hf, family.config_to_cs(hf_cfg, name), cs


def test_rotary_rows_are_interleaved_per_head():
    """Model Zoo llama.py lines 239-264: in each head CS holds the rotary pairs side by side
    (row 2j is HF row j, row 2j+1 is HF row j + head_size/2); V is not permuted."""
    config, _, _, hf, _, cs = _cs_of("llamaV2", "Llama", {"num_key_value_heads": 2})
    d = config.hidden_size // config.num_attention_heads
    for proj, heads in (("q", config.num_attention_heads), ("k", 2)):
        h = hf[f"model.layers.1.self_attn.{proj}_proj.weight"].reshape(heads, 2, d // 2, -1)
        c = cs[f"transformer_decoder.layers.1.self_attn.proj_{proj}_dense_layer.weight"]
        c = c.reshape(heads, d // 2, 2, -1)
        assert np.array_equal(c[:, :, 0], h[:, 0]) and np.array_equal(c[:, :, 1], h[:, 1])
    v = "self_attn.proj_v_dense_layer.weight"
    assert np.array_equal(cs[f"{L0}{v}"], hf["model.layers.0.self_attn.v_proj.weight"])


def test_interleaved_rotary_computes_the_same_scores():
    """The permutation is the right one: CS-style rotary (pairs interleaved) on the CS rows gives
    the same q.k scores as HF's rotate_half on the HF rows."""
    rng = np.random.default_rng(0)
    heads, d, hidden, seq = 2, 8, 16, 5
    wq, wk = rng.standard_normal((heads * d, hidden)), rng.standard_normal((heads * d, hidden))
    x = rng.standard_normal((seq, hidden))
    inv = 1.0 / 10000 ** (np.arange(0, d, 2) / d)
    ang = np.arange(seq)[:, None] * inv[None]  # [seq, d/2]
    cos, sin = np.cos(ang), np.sin(ang)

    def hf_rope(t):  # rotate_half: halves
        a, b = t[..., : d // 2], t[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    def cs_rope(t):  # interleaved pairs
        a, b = t[..., 0::2], t[..., 1::2]
        return np.stack([a * cos - b * sin, b * cos + a * sin], -1).reshape(t.shape)

    def scores(wq_, wk_, rope):
        q = (x @ wq_.T).reshape(seq, heads, d).transpose(1, 0, 2)
        k = (x @ wk_.T).reshape(seq, heads, d).transpose(1, 0, 2)
        return rope(q) @ rope(k).transpose(0, 2, 1)

    cq, ck = interleave_rotary(wq, heads), interleave_rotary(wk, heads)
    np.testing.assert_allclose(scores(cq, ck, cs_rope), scores(wq, wk, hf_rope), rtol=1e-10)
    assert np.array_equal(deinterleave_rotary(cq, heads), wq)


def test_tied_head_in_the_state_dict_is_checked_and_not_written_back():
    _, model, hf_cfg, _, cs_model, _ = _cs_of("code-llama", "Llama", {"tie_word_embeddings": True})
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert "lm_head.weight" in sd
    plan = llama.plan_to_cs(_shapes(sd), hf_cfg, "code-llama")
    assert unused_inputs(plan, _shapes(sd)) == []  # read, to check the tie
    cs = dict(run(plan, sd.__getitem__))
    back_plan = llama.plan_to_hf(_shapes(cs), cs_model, "code-llama")
    assert "lm_head.weight" not in {out.name for out in back_plan}
    sd["lm_head.weight"] = sd["lm_head.weight"] + 1
    with pytest.raises(MappingError, match=r"lm_head\.weight"):
        dict(run(plan, sd.__getitem__))


def test_old_rotary_buffers_are_dropped_on_import():
    """transformers 4.2x saved ``rotary_emb.inv_freq``; Model Zoo llama.py lines 337-341 skip it."""
    _, _, hf_cfg, hf, _, _ = _cs_of("llama", "Llama", {})
    shapes = {**_shapes(hf), "model.layers.1.self_attn.rotary_emb.inv_freq": (8,)}
    plan = llama.plan_to_cs(shapes, hf_cfg, "llama")
    assert unused_inputs(plan, shapes) == ["model.layers.1.self_attn.rotary_emb.inv_freq"]
    assert list(llama.hf_dropped(shapes, hf_cfg, "llama")) == unused_inputs(plan, shapes)


def test_headless_untied_import_gets_a_seeded_head():
    _, _, hf_cfg, hf, _, cs = _cs_of("llama-headless", "Llama", {})
    head = cs["lm_head.weight"]
    assert head.shape == (128, 64) and head.dtype == np.float32
    assert abs(float(head.std()) - 0.02) < 0.002  # Model Zoo llama.py lines 435-439
    again = dict(run(llama.plan_to_cs(_shapes(hf), hf_cfg, "llama-headless"), hf.__getitem__))
    assert np.array_equal(again["lm_head.weight"], head)


def test_llama3_rope_scaling_round_trips():
    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
        "rope_theta": 5e5,
    }
    config = transformers.LlamaConfig(**SMALL, rope_parameters=rope)
    cs_model = llama.config_to_cs(config.to_dict(), "llama")
    assert cs_model["pos_scaling_factor"] == 8.0 and cs_model["pos_scaling_type"] == "llama3"
    assert cs_model["pos_scaling_extra_args"] == {
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    }
    assert cs_model["rope_theta"] == 5e5
    back = llama.config_to_hf(cs_model, "llama")
    again = transformers.LlamaConfig(**{k: v for k, v in back.items() if k != "model_type"})
    assert again.rope_parameters == config.rope_parameters
    # transformers 4 spelling of the same config
    v4 = {**config.to_dict(), "rope_parameters": None, "rope_theta": 5e5}
    v4["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    assert llama.config_to_cs(v4, "llama") == cs_model


def test_gqa_config_fields():
    """Model Zoo llama.py lines 917-932: num_key_value_heads < heads is multiquery_attention."""
    cs = llama.config_to_cs(
        transformers.LlamaConfig(**SMALL, num_key_value_heads=2).to_dict(), "llama"
    )
    assert cs["attention_module"] == "multiquery_attention"
    assert cs["extra_attention_params"] == {"num_kv_groups": 2}
    assert cs["rotary_dim"] == 16 and cs["norm_type"] == "rmsnorm"
    assert cs["nonlinearity"] == "swiglu" and cs["position_embedding_type"] == "rotary"
    mha = llama.config_to_cs(transformers.LlamaConfig(**SMALL).to_dict(), "llama")
    assert mha["attention_module"] == "aiayn_attention" and "extra_attention_params" not in mha


# --------------------------------------------------------------------------- Mixtral layouts


def test_mixtral_fused_state_dict_names_import_the_same():
    extra = {"num_key_value_heads": 2, "num_local_experts": 4}
    config, model, hf_cfg, _, _, cs = _cs_of("mixtral", "Mixtral", extra)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    plan = mixtral.plan_to_cs(_shapes(sd), hf_cfg, "mixtral")
    assert unused_inputs(plan, _shapes(sd)) == []
    fused = dict(run(plan, sd.__getitem__))
    assert sorted(fused) == sorted(cs)
    assert all(np.array_equal(fused[k], cs[k]) for k in cs)
    w = cs[L0 + "ffn.experts.fused_ffns.0.linear_layer_for_glu.expert_weights"]
    assert w.shape == (config.intermediate_size, 4, config.hidden_size)


@pytest.mark.parametrize("layout", ["functional", "experimental"])
def test_mixtral_per_expert_cs_layouts_export(layout):
    """2.10's default MoE layout ("experimental") and "functional" keep one FFN per expert."""
    extra = {"num_key_value_heads": 2, "num_local_experts": 4}
    _, _, _, hf, cs_model, cs = _cs_of("mixtral", "Mixtral", extra)
    pattern = PER_EXPERT[layout]
    split = {}
    for key, value in cs.items():
        m = key.split("ffn.experts.fused_ffns.")
        if len(m) == 1:
            split[key] = value
            continue
        j, kind = m[1].split(".")[0], m[1].split(".")[1]
        for e in range(value.shape[1]):
            split[m[0] + pattern.format(e=e, j=j, kind=kind)] = value[:, e]
    cs_model = {**cs_model, "moe": {**cs_model["moe"], "moe_implementation": layout}}
    plan = mixtral.plan_to_hf(_shapes(split), cs_model, "mixtral")
    assert unused_inputs(plan, _shapes(split)) == ["ln_f.weight"]  # a tie (cs_ties)
    back = dict(run(plan, split.__getitem__))
    assert sorted(back) == sorted(hf) and all(np.array_equal(back[k], hf[k]) for k in hf)


# --------------------------------------------------------------------------- refusals


def test_unknown_cs_tensor_is_reported_and_a_missing_one_named():
    _, _, _, _, cs_model, cs = _cs_of("llama", "Llama", {})
    shapes = _shapes(cs)
    bias = L0 + "self_attn.proj_q_dense_layer.bias"
    shapes[bias] = (64,)
    plan = llama.plan_to_hf(shapes, cs_model, "llama")
    ties = llama.cs_ties(shapes, cs_model, "llama")
    assert [n for n in unused_inputs(plan, shapes) if n not in ties] == [bias]
    del shapes[bias], shapes[L0 + "norm3.weight"]
    with pytest.raises(MappingError, match=r"norm3\.weight"):
        llama.plan_to_hf(shapes, cs_model, "llama")


def test_unknown_hf_tensor_is_reported():
    _, _, hf_cfg, hf, _, _ = _cs_of("mistral", "Mistral", {"num_key_value_heads": 2})
    shapes = {**_shapes(hf), "model.layers.0.self_attn.q_proj.bias": (64,)}
    plan = llama.plan_to_cs(shapes, hf_cfg, "mistral")
    assert unused_inputs(plan, shapes) == ["model.layers.0.self_attn.q_proj.bias"]
    assert llama.hf_dropped(shapes, hf_cfg, "mistral") == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mup_base_hidden_size", 256),
        ("use_projection_bias_in_attention", True),
        ("position_embedding_type", "learned"),
        ("norm_type", "layernorm"),
        ("nonlinearity", "gelu"),
        ("rotary_dim", 8),
        ("attention_module", "fancy_attention"),
        ("attention_sliding_window_length", 16),  # LLaMA has no sliding window
        ("use_alibi", True),  # a field the mapping does not know
    ],
)
def test_unsupported_cs_config_field_is_named(field, value):
    cs_model = llama.config_to_cs(transformers.LlamaConfig(**SMALL).to_dict(), "llama")
    with pytest.raises(MappingError, match=field):
        llama.config_to_hf({**cs_model, field: value}, "llama")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("attention_bias", True),
        ("mlp_bias", True),
        ("hidden_act", "tanh"),
        ("head_dim", 32),
        ("rope_parameters", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
    ],
)
def test_unsupported_hf_config_field_is_named(field, value):
    hf_cfg = {**transformers.LlamaConfig(**SMALL).to_dict(), field: value}
    with pytest.raises(MappingError, match=field.split("_parameters")[0]):
        llama.config_to_cs(hf_cfg, "llama")


@pytest.mark.parametrize(
    ("moe", "field"),
    [
        ({"num_shared_experts": 1}, "num_shared_experts"),
        ({"router_selection_nonlinearity": "sigmoid"}, "router_selection_nonlinearity"),
        ({"null_expert_bias": 0.5}, "null_expert_bias"),
        ({"hash_seed": 3}, "hash_seed"),
    ],
)
def test_unsupported_moe_field_is_named(moe, field):
    hf_cfg = transformers.MixtralConfig(**SMALL, num_key_value_heads=4).to_dict()
    cs_model = mixtral.config_to_cs(hf_cfg, "mixtral")
    cs_model["moe"] = {**cs_model["moe"], **moe}
    with pytest.raises(MappingError, match=field):
        mixtral.config_to_hf(cs_model, "mixtral")


def test_wrong_model_type_is_refused():
    with pytest.raises(MappingError, match="model_type"):
        llama.config_to_cs(transformers.MistralConfig(**SMALL).to_dict(), "llama")
