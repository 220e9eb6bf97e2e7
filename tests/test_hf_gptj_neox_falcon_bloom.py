"""Hugging Face <-> Cerebras mapping of GPT-J, CodeGen, GPT-NeoX, Falcon and BLOOM, checked on
tiny random models built from ``transformers`` config classes (no downloaded weights).

Each case: HF state dict -> CS tensors (names as Model Zoo's converters spell them) -> HF tensors
bitwise equal to the original, config round trip, and equal logits from a fresh model loading
the round-tripped tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from ckpt_migrate.hf import families  # noqa: E402
from ckpt_migrate.hf.fused import alibi_slopes  # noqa: E402
from ckpt_migrate.hf.mapping import MappingError, run, unused_inputs  # noqa: E402
from ckpt_migrate.hf.ops import interleave  # noqa: E402

L0 = "transformer_decoder.layers.0."
ATTN = [f"{L0}self_attn.proj_{p}_dense_layer.weight" for p in ("q", "k", "v", "output")]
ATTN_B = [f"{L0}self_attn.proj_{p}_dense_layer.bias" for p in ("q", "k", "v", "output")]
FFN = [f"{L0}ffn.ffn.{i}.linear_layer.{w}" for i in (0, 1) for w in ("weight", "bias")]
FFN_W = [f"{L0}ffn.ffn.{i}.linear_layer.weight" for i in (0, 1)]
NORM1 = [f"{L0}norm1.weight", f"{L0}norm1.bias"]
NORM3 = [f"{L0}norm3.weight", f"{L0}norm3.bias"]
# The final norm under both of the CS model's names (one module): Model Zoo's
# ``replace_final_norm`` writes ``ln_f.*`` too (gptj_hf_cs.py lines 158-172,
# salesforce_codegen_hf_cs.py 320-334, gpt_neox_hf_cs.py 421-435, falcon_40b.py 407-421,
# bloom_hf_cs.py 293-307).
TOP = [
    "embedding_layer.word_embeddings.weight",
    "transformer_decoder.norm.weight",
    "transformer_decoder.norm.bias",
    "ln_f.weight",
    "ln_f.bias",
]
HEAD = ["lm_head.weight"]
HEAD_B = ["lm_head.weight", "lm_head.bias"]
SLOPES = ["embedding_layer.position_embed_helper.slopes"]
EMB_LN = ["embedding_ln_f.weight", "embedding_ln_f.bias"]
# Config fields the CS model section does not carry (token ids, generation and cache
# switches, transformers bookkeeping): excluded from the config round-trip comparison.
NOT_MAPPED = {
    "transformers_version",
    "dtype",
    "torch_dtype",
    "architectures",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "use_cache",
    # CS fields Model Zoo copies into config.json under their CS names, and so do we (HF keeps
    # them as unused attributes): gptj_hf_cs.py lines 485-488, falcon_180b.py lines 215-229.
    "use_bias_in_output",
    "use_ffn_bias",
    "use_ffn_bias_in_attention",
    "use_projection_bias_in_attention",
}


@dataclass
class Case:
    id: str
    module: str
    name: str
    config: str
    kwargs: dict[str, Any]
    model: str
    # Model Zoo's CS names for layer 0 and outside the layers (see each list's comment).
    expected: list[str]
    not_mapped: set[str] = field(default_factory=set)


SMALL = {"vocab_size": 128}
CASES = [
    # Model Zoo salesforce_codegen_hf_cs.py lines 37-70 (qkv_proj unpacked into q/k/v, out_proj,
    # no bias), 249-303 (wte, ln_f, ln_1, fc_in, fc_out), 466-470 (lm_head weight and bias).
    Case(
        "codegen",
        "codegen",
        "codegen",
        "CodeGenConfig",
        {
            **SMALL,
            "n_positions": 64,
            "n_ctx": 64,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "rotary_dim": 8,
            "n_inner": 256,
        },
        "CodeGenForCausalLM",
        TOP + NORM1 + ATTN + FFN + HEAD_B,
        {"n_ctx"},  # HF CodeGen does not use n_ctx; Model Zoo does not map it
    ),
    Case(
        "codegen-headless-tied",
        "codegen",
        "codegen-headless",
        "CodeGenConfig",
        {
            **SMALL,
            "n_positions": 64,
            "n_embd": 96,
            "n_layer": 2,
            "n_head": 8,
            "rotary_dim": 4,
            "n_inner": 384,
            "tie_word_embeddings": True,
        },
        "CodeGenModel",
        TOP + NORM1 + ATTN + FFN + HEAD_B,
    ),
    # Model Zoo gpt_neox_hf_cs.py lines 37-69 (query_key_value unfused into q/k/v with biases,
    # dense), 335-406 (embed_in, final_layer_norm, input/post_attention layernorm as norm1/norm3,
    # mlp), 568-573 (embed_out/lm_head, no bias).
    Case(
        "gpt-neox",
        "gpt_neox",
        "gpt-neox",
        "GPTNeoXConfig",
        {
            **SMALL,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 256,
            "max_position_embeddings": 64,
        },
        "GPTNeoXForCausalLM",
        TOP + NORM1 + NORM3 + ATTN + ATTN_B + FFN + HEAD,
    ),
    Case(
        "gpt-neox-tied-full-rotary",
        "gpt_neox",
        "gpt-neox",
        "GPTNeoXConfig",
        {
            **SMALL,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
            "max_position_embeddings": 64,
            "rotary_pct": 1.0,
            "tie_word_embeddings": True,
            "hidden_act": "gelu_new",
        },
        "GPTNeoXForCausalLM",
        TOP + NORM1 + NORM3 + ATTN + ATTN_B + FFN + HEAD,
    ),
    Case(
        "gpt-neox-headless",
        "gpt_neox",
        "gpt-neox-headless",
        "GPTNeoXConfig",
        {
            **SMALL,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 256,
            "max_position_embeddings": 64,
            "rotary_pct": 0.5,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
        "GPTNeoXModel",
        TOP + NORM1 + NORM3 + ATTN + ATTN_B + FFN + HEAD,
    ),
    # Model Zoo falcon_40b.py lines 35-69 and 333-404 (word_embeddings, query_key_value unfused
    # into q/k/v, dense, mlp, ln_f) with falcon_180b.py lines 48-127 (input_layernorm as norm1,
    # ln_attn/ln_mlp as norm1/norm3) and lines 574-580 (lm_head). Multi-query, tied, no bias:
    Case(
        "falcon-mqa",
        "falcon",
        "falcon",
        "FalconConfig",
        {**SMALL, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
        "FalconForCausalLM",
        TOP + NORM1 + ATTN + FFN_W + HEAD,
        # HF ignores num_kv_heads under multi_query; Model Zoo writes 1 (falcon_180b.py
        # lines 392-393), the HF class defaults it to num_attention_heads.
        {"num_kv_heads"},
    ),
    # New decoder architecture, grouped-query, biases, untied, linear RoPE scaling.
    Case(
        "falcon-gqa",
        "falcon",
        "falcon",
        "FalconConfig",
        {
            **SMALL,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_kv_heads": 2,
            "new_decoder_architecture": True,
            "bias": True,
            "tie_word_embeddings": False,
            "max_position_embeddings": 64,
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
        },
        "FalconForCausalLM",
        TOP + NORM1 + NORM3 + ATTN + ATTN_B + FFN + HEAD,
        # HF ignores multi_query under the new decoder architecture; Model Zoo writes
        # num_kv_heads == 1 (falcon_180b.py line 532), the HF class defaults it to true.
        {"multi_query"},
    ),
    # Old architecture with per-head [q, k, v] (multi_query false), headless, untied.
    Case(
        "falcon-headless-mha",
        "falcon",
        "falcon-headless",
        "FalconConfig",
        {
            **SMALL,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "multi_query": False,
            "tie_word_embeddings": False,
        },
        "FalconModel",
        TOP + NORM1 + ATTN + FFN_W + HEAD,
    ),
    # Model Zoo bloom_hf_cs.py lines 41-75 (query_key_value unfused into q/k/v with biases,
    # dense), 208-282 (word_embeddings, word_embeddings_layernorm as embedding_ln_f, norms, mlp,
    # ln_f), 730 (lm_head) and 970-982 (ALiBi slopes created on the CS side).
    Case(
        "bloom-tied",
        "bloom",
        "bloom",
        "BloomConfig",
        {**SMALL, "hidden_size": 64, "n_layer": 2, "n_head": 4},
        "BloomForCausalLM",
        TOP + EMB_LN + NORM1 + NORM3 + ATTN + ATTN_B + FFN + HEAD + SLOPES,
    ),
    Case(
        "bloom-headless-6-heads",
        "bloom",
        "bloom-headless",
        "BloomConfig",
        {
            **SMALL,
            "hidden_size": 96,
            "n_layer": 2,
            "n_head": 6,
            "tie_word_embeddings": False,
            "hidden_dropout": 0.1,
            "attention_dropout": 0.05,
        },
        "BloomModel",
        TOP + EMB_LN + NORM1 + NORM3 + ATTN + ATTN_B + FFN + HEAD + SLOPES,
    ),
    # Model Zoo gptj_hf_cs.py lines 39-71 (q/k/v/out, no bias), 86-148 (wte, ln_f, ln_1,
    # fc_in, fc_out), 305-309 (lm_head weight and bias).
    Case(
        "gptj",
        "gptj",
        "gptj",
        "GPTJConfig",
        {
            **SMALL,
            "n_positions": 64,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "rotary_dim": 8,
            "n_inner": 256,
        },
        "GPTJForCausalLM",
        TOP + NORM1 + ATTN + FFN + HEAD_B,
    ),
    # Tied, the head in the state dict: Model Zoo renames it (lines 305-309), so the CS side has
    # both; a head save_pretrained left out is not written (test_tied_head_save_pretrained...).
    Case(
        "gptj-tied",
        "gptj",
        "gptj",
        "GPTJConfig",
        {
            **SMALL,
            "n_positions": 64,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "rotary_dim": 16,
            "n_inner": 128,
            "tie_word_embeddings": True,
            "activation_function": "gelu",
        },
        "GPTJForCausalLM",
        TOP + NORM1 + ATTN + FFN + HEAD_B,
    ),
    # Headless: Model Zoo lines 212-230 add lm_head (random) and a zero bias.
    Case(
        "gptj-headless",
        "gptj",
        "gptj-headless",
        "GPTJConfig",
        {
            **SMALL,
            "n_positions": 64,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "rotary_dim": 8,
            "n_inner": 256,
        },
        "GPTJModel",
        TOP + NORM1 + ATTN + FFN + HEAD_B,
    ),
]


def _family(case: Case):
    return getattr(families, case.module)


def _hf(case: Case):
    torch.manual_seed(0)
    config = getattr(transformers, case.config)(**case.kwargs)
    model = getattr(transformers, case.model)(config).eval()
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return config, model, state


def _shapes(tensors: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in tensors.items()}


def _to_cs(case: Case):
    family = _family(case)
    config, model, state = _hf(case)
    hf_cfg = config.to_dict()
    cs_model = family.config_to_cs(hf_cfg, case.name)
    plan = family.plan_to_cs(_shapes(state), hf_cfg, case.name)
    cs = dict(run(plan, state.__getitem__))
    return family, config, model, state, cs_model, plan, cs


def _outputs(model, ids):
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _layer0_and_top(names):
    return sorted(n for n in names if ".layers." not in n or n.startswith(L0))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_round_trip(case: Case) -> None:
    family, config, model, state, cs_model, plan, cs = _to_cs(case)
    assert case.name in family.NAMES
    assert unused_inputs(plan, _shapes(state)) == []
    assert _layer0_and_top(cs) == sorted(case.expected)
    layers = config.num_hidden_layers
    assert {n.split(".")[2] for n in cs if ".layers." in n} == {str(i) for i in range(layers)}

    roundtrip = family.config_to_hf(cs_model, case.name)
    assert roundtrip["architectures"] == [case.model]
    rebuilt = type(config)(**{k: v for k, v in roundtrip.items() if k != "architectures"})
    skip = NOT_MAPPED | case.not_mapped
    original = {k: v for k, v in config.to_diff_dict().items() if k not in skip}
    assert {k: v for k, v in rebuilt.to_diff_dict().items() if k not in skip} == original

    back_plan = family.plan_to_hf(_shapes(cs), cs_model, case.name)
    back = dict(run(back_plan, cs.__getitem__))
    if "embed_out.weight" in back:  # the name in HF files; transformers 5 loads it as lm_head
        back["lm_head.weight"] = back.pop("embed_out.weight")
    expected_unused = _hook(family, "cs_ties", cs, cs_model, case) | _hook(
        family, "cs_dropped", cs, cs_model, case
    )
    assert set(unused_inputs(back_plan, _shapes(cs))) == expected_unused
    tied = getattr(config, "tie_word_embeddings", False) and "lm_head.weight" in state
    assert set(back) == set(state) - ({"lm_head.weight"} if tied else set())
    for key, value in back.items():
        assert value.dtype == state[key].dtype and value.shape == state[key].shape, key
        assert np.array_equal(value, state[key]), key

    fresh = getattr(transformers, case.model)(rebuilt).eval()
    result = fresh.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=False)
    assert result.unexpected_keys == []
    assert set(result.missing_keys) <= ({"lm_head.weight"} if tied else set())
    ids = torch.arange(12).reshape(2, 6) % config.vocab_size
    assert torch.equal(_outputs(fresh, ids), _outputs(model, ids))


def _hook(family, hook: str, tensors, config, case: Case) -> set[str]:
    """Names an optional family hook (``cs_ties``, ``cs_dropped``, ``hf_dropped``) gives."""
    fn = getattr(family, hook, None)
    return set(fn(_shapes(tensors), config, case.name)) if fn else set()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_unknown_cs_tensor_is_reported(case: Case) -> None:
    """No rule reads it and no hook excuses it: the pipeline's unused check names it."""
    family, _, _, _, cs_model, _, cs = _to_cs(case)
    cs[f"{L0}self_attn.bogus.weight"] = np.zeros((4, 4), np.float32)
    plan = family.plan_to_hf(_shapes(cs), cs_model, case.name)
    excused = _hook(family, "cs_ties", cs, cs_model, case)
    excused |= _hook(family, "cs_dropped", cs, cs_model, case)
    assert set(unused_inputs(plan, _shapes(cs))) - excused == {f"{L0}self_attn.bogus.weight"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_unknown_hf_tensor_is_reported(case: Case) -> None:
    family, config, _, state, _, _, _ = _to_cs(case)
    state = {**state, "mystery.weight": np.zeros((4, 4), np.float32)}
    plan = family.plan_to_cs(_shapes(state), config.to_dict(), case.name)
    excused = _hook(family, "hf_dropped", state, config.to_dict(), case)
    assert set(unused_inputs(plan, _shapes(state))) - excused == {"mystery.weight"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_missing_cs_tensor_is_named(case: Case) -> None:
    family, _, _, _, cs_model, _, cs = _to_cs(case)
    del cs[f"{L0}self_attn.proj_v_dense_layer.weight"]
    with pytest.raises(MappingError, match="proj_v_dense_layer"):
        family.plan_to_hf(_shapes(cs), cs_model, case.name)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_mup_is_refused(case: Case) -> None:
    family, _, _, _, cs_model, _, _ = _to_cs(case)
    with pytest.raises(MappingError, match="mup_base_hidden_size"):
        family.config_to_hf({**cs_model, "mup_base_hidden_size": 32}, case.name)


@pytest.mark.parametrize(
    ("module", "name", "field", "value"),
    [
        ("gptj", "gptj", "position_embedding_type", "learned"),
        ("gptj", "gptj", "use_projection_bias_in_attention", True),
        ("gptj", "gptj", "norm_type", "rmsnorm"),
        ("codegen", "codegen", "num_heads", 2),
        ("codegen", "codegen", "use_bias_in_output", False),
        ("gpt_neox", "gpt-neox", "use_untied_layer_norm", False),
        ("gpt_neox", "gpt-neox", "rope_theta", 500000.0),
        ("gpt_neox", "gpt-neox", "pos_scaling_type", "yarn"),
        ("falcon", "falcon", "filter_size", 100),
        ("falcon", "falcon", "use_ffn_bias", True),
        ("falcon", "falcon", "attention_module", "aiayn_attention"),
        ("falcon", "falcon", "rotary_dim", 4),
        ("bloom", "bloom", "alibi_trainable_slopes", True),
        ("bloom", "bloom", "embedding_layer_norm", False),
        ("bloom", "bloom", "embedding_dropout_rate", 0.1),
        ("bloom", "bloom", "position_embedding_type", "rotary"),
    ],
)
def test_unsupported_cs_field(module: str, name: str, field: str, value: Any) -> None:
    case = next(c for c in CASES if c.module == module)
    family, _, _, _, cs_model, _, _ = _to_cs(case)
    with pytest.raises(MappingError, match=field):
        family.config_to_hf({**cs_model, field: value}, name)


@pytest.mark.parametrize("heads", [4, 6, 12])
def test_bloom_slopes_match_transformers(heads: int) -> None:
    """The CS slopes are the ones HF BLOOM builds its ALiBi bias from: Model Zoo computes them
    in double precision and rounds once to float32, HF in float32 powers (within an ulp)."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, 2), heads, torch.float32)  # [heads, 1, 2]
    ours = np.asarray(alibi_slopes(heads), dtype=np.float32)
    np.testing.assert_allclose(ours, alibi[:, 0, 1].numpy(), rtol=2e-7, atol=0)


def test_falcon_refuses_alibi_and_sequential_blocks() -> None:
    family = families.falcon
    base = transformers.FalconConfig(**SMALL, hidden_size=64, num_attention_heads=4).to_dict()
    for key, value in (("alibi", True), ("parallel_attn", False)):
        with pytest.raises(MappingError, match=key):
            family.config_to_cs({**base, key: value}, "falcon")


def test_neox_refuses_sequential_residual() -> None:
    family = families.gpt_neox
    base = transformers.GPTNeoXConfig(**SMALL, hidden_size=64, num_attention_heads=4).to_dict()
    with pytest.raises(MappingError, match="use_parallel_residual"):
        family.config_to_cs({**base, "use_parallel_residual": False}, "gpt-neox")


def _rope_halves(x: np.ndarray, pos: int, rotary_dim: int) -> np.ndarray:
    """HF GPT-NeoX / Falcon RoPE: channel i pairs with i + rotary_dim / 2."""
    half = rotary_dim // 2
    angle = pos / 10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    a, b = x[:half], x[half:rotary_dim]
    rotated = [a * np.cos(angle) - b * np.sin(angle), b * np.cos(angle) + a * np.sin(angle)]
    return np.concatenate([*rotated, x[rotary_dim:]])


def _rope_pairs(x: np.ndarray, pos: int, rotary_dim: int) -> np.ndarray:
    """CS (and GPT-J) RoPE: channel 2i pairs with 2i + 1."""
    angle = pos / 10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    a, b = x[0:rotary_dim:2], x[1:rotary_dim:2]
    out = x.copy()
    out[0:rotary_dim:2] = a * np.cos(angle) - b * np.sin(angle)
    out[1:rotary_dim:2] = b * np.cos(angle) + a * np.sin(angle)
    return out


@pytest.mark.parametrize("module", ["gpt_neox", "falcon"])
def test_interleaving_turns_hf_rope_into_cs_rope(module: str) -> None:
    """Why Model Zoo permutes Q and K rows: the interleaved head rotated the CS way equals the
    HF head rotated the HF way, then interleaved."""
    x = np.random.default_rng(0).normal(size=16)
    for rotary_dim in (8, 16):
        swapped = interleave(x.reshape(1, -1), rotary_dim)[0]
        for pos in (0, 3, 17):
            hf = _rope_halves(x, pos, rotary_dim).reshape(1, -1)
            expected = interleave(hf, rotary_dim)[0]
            np.testing.assert_allclose(_rope_pairs(swapped, pos, rotary_dim), expected)


def test_gptj_head_bias_cs_lacks_is_zeros() -> None:
    """``use_bias_in_output: false`` (allowed by Model Zoo's GPT-J rules, lines 485-488): HF
    GPT-J always has ``lm_head.bias``, written as the zeros HF would initialise it to."""
    case = next(c for c in CASES if c.id == "gptj")
    family, _, _, state, cs_model, _, cs = _to_cs(case)
    del cs["lm_head.bias"]
    cs_model = {**cs_model, "use_bias_in_output": False}
    back = dict(run(family.plan_to_hf(_shapes(cs), cs_model, "gptj"), cs.__getitem__))
    assert back["lm_head.bias"].dtype == state["lm_head.bias"].dtype
    assert not back["lm_head.bias"].any()


TIED = [c for c in CASES if c.kwargs.get("tie_word_embeddings", c.module in ("falcon", "bloom"))]


@pytest.mark.parametrize("case", TIED, ids=[c.id for c in TIED])
def test_a_tied_head_save_pretrained_left_out_is_the_embeddings(case: Case) -> None:
    """``save_pretrained`` leaves a tied head out; the CS file gets it from the embeddings (the
    CS model's state dict has ``lm_head.weight`` and the Trainer loads strictly, while Model
    Zoo's 2.1+ head rule writes none: docs/MODELZOO_PARITY.md §5), and the way back reads the
    embeddings once, the head being their tie."""
    family, config, _, state, cs_model, _, _ = _to_cs(case)
    hf_cfg = config.to_dict()
    saved = {k: v for k, v in state.items() if k not in ("lm_head.weight", "embed_out.weight")}
    cs = dict(run(family.plan_to_cs(_shapes(saved), hf_cfg, case.name), saved.__getitem__))
    assert np.array_equal(cs["lm_head.weight"], cs["embedding_layer.word_embeddings.weight"])
    assert family.cs_ties(_shapes(cs), cs_model, case.name).get("lm_head.weight") == (
        "embedding_layer.word_embeddings.weight"
    )
    back = dict(run(family.plan_to_hf(_shapes(cs), cs_model, case.name), cs.__getitem__))
    assert back.keys() == saved.keys()
    assert all(np.array_equal(back[k], v) for k, v in saved.items())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_final_norm_is_read_from_whichever_copy_exists(case: Case) -> None:
    """A Trainer save and a Model Zoo file hold the final norm under both of the CS model's
    names (``ln_f.*`` a tie of ``transformer_decoder.norm.*``); either one alone converts."""
    family, _, _, _, cs_model, _, cs = _to_cs(case)
    ties = family.cs_ties(_shapes(cs), cs_model, case.name)
    assert {k: ties[k] for k in ("ln_f.weight", "ln_f.bias")} == {
        "ln_f.weight": "transformer_decoder.norm.weight",
        "ln_f.bias": "transformer_decoder.norm.bias",
    }
    expected = dict(run(family.plan_to_hf(_shapes(cs), cs_model, case.name), cs.__getitem__))
    for gone in ("ln_f.", "transformer_decoder.norm."):
        alone = {k: v for k, v in cs.items() if not k.startswith(gone)}
        plan = family.plan_to_hf(_shapes(alone), cs_model, case.name)
        ties = family.cs_ties(_shapes(alone), cs_model, case.name)
        assert not {"ln_f.weight", "ln_f.bias"} & set(ties)
        assert set(unused_inputs(plan, _shapes(alone))) <= set(ties) | set(
            family.cs_dropped(_shapes(alone), cs_model, case.name)
        )
        back = dict(run(plan, alone.__getitem__))
        assert back.keys() == expected.keys()
        assert all(np.array_equal(back[k], v) for k, v in expected.items())


@pytest.mark.parametrize(
    ("module", "name"), [("gptj", "gptj"), ("codegen", "codegen"), ("gpt_neox", "gpt-neox")]
)
def test_position_embedding_type_defaults_to_rotary(module: str, name: str) -> None:
    """Model Zoo's CS config leaves ``position_embedding_type`` out; the CS model's default is
    rotary (``GPTJSubModelConfig``, models/nlp/gptj/gptj_model.py lines 69-71)."""
    case = next(c for c in CASES if c.module == module)
    family, _, _, _, cs_model, _, _ = _to_cs(case)
    cs_model = {k: v for k, v in cs_model.items() if k != "position_embedding_type"}
    assert family.config_to_hf(cs_model, name) == family.config_to_hf(
        {**cs_model, "position_embedding_type": "rotary"}, name
    )


def test_config_fields_model_zoo_writes() -> None:
    """Fields of Model Zoo's config.json that are not transformers' own, written the same:
    GPT-J's ``use_bias_in_output`` (gptj_hf_cs.py lines 485-488), Falcon's CS bias switches
    (falcon_180b.py lines 215-229) and a null ``rope_scaling`` (falcon_180b.py lines 682-684,
    gpt_neox_hf_cs.py lines 1082-1084)."""
    gptj = families.gptj
    _, _, _, _, cs_model, _, _ = _to_cs(next(c for c in CASES if c.id == "gptj"))
    assert gptj.config_to_hf(cs_model, "gptj")["use_bias_in_output"] is True
    for case_id, bias, scaled in (("falcon-mqa", False, False), ("falcon-gqa", True, True)):
        family, _, _, _, cs_model, _, _ = _to_cs(next(c for c in CASES if c.id == case_id))
        hf = family.config_to_hf(cs_model, "falcon")
        for key in (
            "use_ffn_bias",
            "use_ffn_bias_in_attention",
            "use_projection_bias_in_attention",
        ):
            assert hf[key] is bias and hf["bias"] is bias
        assert hf["rope_scaling"] == (hf["rope_parameters"] if scaled else None)
    for case_id, scaled in (("gpt-neox", False), ("gpt-neox-headless", True)):
        family, _, _, _, cs_model, _, _ = _to_cs(next(c for c in CASES if c.id == case_id))
        hf = family.config_to_hf(cs_model, case_id)
        assert hf["rope_scaling"] == (hf["rope_parameters"] if scaled else None)
