"""HF <-> CS rules of the StarCoder group, SantaCoder, BTLM and JAIS
(``ckpt_migrate/hf/families/{starcoder,santacoder,btlm,jais}.py``).

StarCoder and its aliases run against real ``transformers`` GPTBigCode models (tiny, random,
seeded): tensors and config round trip bit for bit and the reloaded model's logits are equal.
SantaCoder (``GPT2LMHeadCustomModel``), BTLM (``BTLMLMHeadModel``) and JAIS (``JAISLMHeadModel``)
are remote code, not in ``transformers``: their HF state dicts are built here by hand with the
remote classes' names and shapes (as Model Zoo's converters read and write them), and the tests
check the tensor and config round trips without logits.

Expected CS names: Model Zoo Release_2.10.0, GPT-2 rules ``Converter_GPT2Model_HF_CS17``
(gpt2_hf_cs.py lines 230-310: ``norm1``/``norm3``, ``ffn.ffn.{0,1}.linear_layer``,
``transformer_decoder.norm``), the 2.1 position-embedding spelling (starcoder.py lines 696-707),
the attention split into ``proj_{q,k,v}_dense_layer`` (starcoder.py lines 98-168, santacoder.py
lines 98-119, gpt2_hf_cs.py lines 113-151), BTLM/JAIS ``linear_layer_for_glu`` and ALiBi
slopes (btlm_hf_cs.py lines 50-60 and 386-394), the final norm under its second CS name ``ln_f``
too (``replace_final_norm``, gpt2_hf_cs.py lines 323-337), CS ``lm_head`` always present
(gpt2_hf_cs.py lines 376-394 and 777-781; Model Zoo's 2.1+ converters leave a tied head out, and
its GPT2LMHeadModel then refuses the file: see ``starcoder.lm_head_to_cs``). On the way back
``ln_f`` and a tied ``lm_head`` are ties the pipeline checks (``cs_ties``), and a CS file without
the tied head (Model Zoo's) converts to the same HF tensors.
"""

from __future__ import annotations

import numpy as np
import pytest

from ckpt_migrate.hf import mapping
from ckpt_migrate.hf.families import btlm, jais, santacoder, starcoder
from ckpt_migrate.hf.mapping import MappingError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

L, E, HEADS, V, P = 2, 64, 4, 128, 32
D = E // HEADS

NON_LAYER = [
    "embedding_layer.word_embeddings.weight",
    "embedding_layer.position_embeddings.embed.weight",
    "transformer_decoder.norm.weight",
    "transformer_decoder.norm.bias",
    "ln_f.weight",  # the same norm's second CS name (gpt2_hf_cs.py lines 323-337)
    "ln_f.bias",
    "lm_head.weight",
]
HEAD = "lm_head.weight"
NORM_TIES = {f"ln_f.{s}": f"transformer_decoder.norm.{s}" for s in ("weight", "bias")}
EMB = "embedding_layer.word_embeddings.weight"
LAYER0 = [
    f"transformer_decoder.layers.0.{m}.{s}"
    for m in (
        "self_attn.proj_q_dense_layer",
        "self_attn.proj_k_dense_layer",
        "self_attn.proj_v_dense_layer",
        "self_attn.proj_output_dense_layer",
        "norm1",
        "norm3",
        "ffn.ffn.0.linear_layer",
        "ffn.ffn.1.linear_layer",
    )
    for s in ("weight", "bias")
]
GLU0 = [
    f"transformer_decoder.layers.0.ffn.ffn.0.linear_layer_for_glu.{s}" for s in ("weight", "bias")
]
SLOPES = "embedding_layer.position_embed_helper.slopes"


def expected_cs(layer0: list[str], non_layer: list[str]) -> list[str]:
    names = list(non_layer)
    for i in range(L):
        names += [n.replace("layers.0.", f"layers.{i}.") for n in layer0]
    return sorted(names)


def shapes(tensors: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in tensors.items()}


def run(plan: list[mapping.Out], tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(mapping.run(plan, tensors.__getitem__))


def export_checks(family, cs: dict, cs_model: dict, name: str, tie: bool) -> dict:
    """The CS -> HF plan's ties and drops for ``cs`` as ours and a Trainer save hold it and as
    Model Zoo's 2.1+ converter writes it (no tied ``lm_head``): every CS tensor is read, a tie
    or dropped, and both give the same HF tensors."""
    headless = name.endswith("-headless")
    theirs = {k: v for k, v in cs.items() if not (tie and not headless and k == HEAD)}
    out = None
    for tensors in (cs, theirs):
        plan = family.plan_to_hf(shapes(tensors), cs_model, name)
        ties = family.cs_ties(shapes(tensors), cs_model, name)
        dropped = family.cs_dropped(shapes(tensors), cs_model, name)
        assert ties == NORM_TIES | ({HEAD: EMB} if tie and HEAD in tensors else {})
        assert list(dropped) == ([HEAD] if headless and not tie else [])
        assert set(mapping.unused_inputs(plan, shapes(tensors))) == set(ties) | set(dropped)
        got = run(plan, tensors)
        assert out is None or all(np.array_equal(got[k], out[k]) for k in out)
        out = got
    return out


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert np.array_equal(got[k], want[k]), k


# ---- StarCoder group: real GPTBigCode models --------------------------------------------------

# Fields Model Zoo's config rules do not carry (starcoder.py lines 539-554 write its own values):
# version/dtype bookkeeping, and the post-defaults GPTBigCodeConfig ignores.
IGNORED = {
    "transformers_version",
    "dtype",
    "torch_dtype",
    "validate_runner_input",
    "inference_runner",
    "max_sequence_length",
    "max_batch_size",
    "summary_use_proj",
    "summary_type",
}
STARCODER_CASES = [
    ("starcoder", True, True, 4 * E),
    ("octocoder", False, False, 3 * E),
    ("wizardcoder", True, False, None),
    ("sqlcoder", False, True, 2 * E),
    ("starcoder-headless", True, True, None),
    ("octocoder-headless", False, False, 4 * E),
    ("wizardcoder-headless", True, False, 3 * E),
    ("sqlcoder-headless", False, True, 4 * E),
]


def bigcode(name: str, multi_query: bool, tie: bool, n_inner: int | None):
    headless = name.endswith("-headless")
    arch = "GPTBigCodeModel" if headless else "GPTBigCodeForCausalLM"
    config = transformers.GPTBigCodeConfig(
        vocab_size=V,
        n_positions=P,
        n_embd=E,
        n_layer=L,
        n_head=HEADS,
        n_inner=n_inner,
        multi_query=multi_query,
        tie_word_embeddings=tie,
        scale_attn_weights=multi_query,  # both attention_type values
        bos_token_id=0,  # StarCoder's, and Model Zoo's post-default
        eos_token_id=0,
        architectures=[arch],
    )
    torch.manual_seed(0)
    cls = transformers.GPTBigCodeModel if headless else transformers.GPTBigCodeForCausalLM
    return config, cls(config).eval(), cls


def outputs(model, headless: bool):
    ids = torch.arange(12).reshape(2, 6) * 7 % V
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.last_hidden_state if headless else out.logits


@pytest.mark.parametrize(("name", "multi_query", "tie", "n_inner"), STARCODER_CASES)
def test_starcoder_round_trip(name: str, multi_query: bool, tie: bool, n_inner: int | None):
    headless = name.endswith("-headless")
    config, model, cls = bigcode(name, multi_query, tie, n_inner)
    hf = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    hf = {k: v for k, v in hf.items() if not (tie and k == HEAD)}  # what save_pretrained writes
    hf_config = config.to_dict()

    cs_model = starcoder.config_to_cs(hf_config, name)
    plan = starcoder.plan_to_cs(shapes(hf), hf_config, name)
    assert mapping.unused_inputs(plan, shapes(hf)) == []
    cs = run(plan, hf)
    assert sorted(cs) == expected_cs(LAYER0, NON_LAYER)
    k_rows = D if multi_query else E
    assert cs["transformer_decoder.layers.0.self_attn.proj_k_dense_layer.weight"].shape == (
        k_rows,
        E,
    )
    assert cs_model["attention_module"] == (
        "multiquery_attention" if multi_query else "aiayn_attention"
    )
    if tie:
        assert np.array_equal(cs[HEAD], cs[EMB])
    assert all(np.array_equal(cs[k], cs[v]) for k, v in NORM_TIES.items())

    # Config: every field the rules map comes back; n_inner null comes back as 4 * n_embd
    # (starcoder.py lines 637-639), the same model.
    back = starcoder.config_to_hf(cs_model, name)
    want = {k: v for k, v in config.to_diff_dict().items() if k not in IGNORED}
    got = transformers.GPTBigCodeConfig(**back).to_diff_dict()
    got = {k: v for k, v in got.items() if k not in IGNORED}
    if n_inner is None:
        assert got.pop("n_inner") == 4 * E and want.pop("n_inner") is None
    assert got == want

    hf_back = export_checks(starcoder, cs, cs_model, name, tie)
    assert_same(hf_back, hf)

    fresh = cls(config).eval()
    result = fresh.load_state_dict(
        {k: torch.from_numpy(v) for k, v in hf_back.items()}, strict=False
    )
    assert result.unexpected_keys == []
    assert result.missing_keys == (["lm_head.weight"] if tie and not headless else [])
    assert torch.equal(outputs(fresh, headless), outputs(model, headless))


def test_starcoder_negative_cases():
    config, model, _ = bigcode("starcoder", True, False, None)
    hf = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    hf_config = config.to_dict()
    cs_model = starcoder.config_to_cs(hf_config, "starcoder")
    cs = run(starcoder.plan_to_cs(shapes(hf), hf_config, "starcoder"), hf)

    stray = "transformer_decoder.layers.0.self_attn.rotary.weight"
    with pytest.raises(MappingError, match=stray):
        starcoder.plan_to_hf({**shapes(cs), stray: (4,)}, cs_model, "starcoder")
    with pytest.raises(MappingError, match=r"transformer\.h\.0\.attn\.q_attn\.weight"):
        starcoder.plan_to_cs(
            {**shapes(hf), "transformer.h.0.attn.q_attn.weight": (E, E)}, hf_config, "starcoder"
        )
    bad = {**shapes(hf), "transformer.h.0.attn.c_attn.weight": (3 * E, E)}
    with pytest.raises(MappingError, match="c_attn"):
        starcoder.plan_to_cs(bad, hf_config, "starcoder")
    missing = {k: v for k, v in shapes(cs).items() if "layers.1.norm1" not in k}
    with pytest.raises(MappingError, match=r"layers\.1\.norm1"):
        starcoder.plan_to_hf(missing, cs_model, "starcoder")

    for field, value in [
        ("position_embedding_type", "rotary"),
        ("output_logits_scale", 2.0),
        ("mup_base_hidden_size", 32),
        ("extra_attention_params", {"num_kv_groups": 2}),
        ("use_bias_in_output", True),
        ("attention_type", "scaled_cosine"),
    ]:
        with pytest.raises(MappingError, match=field.split("_params")[0]):
            starcoder.config_to_hf({**cs_model, field: value}, "starcoder")
    with pytest.raises(MappingError, match="model_type"):
        starcoder.config_to_cs({**hf_config, "model_type": "gpt2"}, "starcoder")
    with pytest.raises(MappingError, match="bigcode"):
        starcoder.config_to_cs(hf_config, "bigcode")

    # untied in the file but tied in the config: lm_head is a tie the pipeline checks (and
    # refuses, as they differ); the plan reads the embeddings only
    tied = {**cs_model, "share_embedding_weights": True}
    plan = starcoder.plan_to_hf(shapes(cs), tied, "starcoder")
    assert starcoder.cs_ties(shapes(cs), tied, "starcoder") == NORM_TIES | {HEAD: EMB}
    assert HEAD not in {i for out in plan for i in out.inputs}
    stray_norm = {k: v for k, v in shapes(cs).items() if k != "transformer_decoder.norm.bias"}
    with pytest.raises(MappingError, match=r"transformer_decoder\.norm\.bias"):
        starcoder.plan_to_hf(stray_norm, cs_model, "starcoder")  # ln_f.bias is no tie alone


# ---- SantaCoder, BTLM, JAIS: remote-code HF classes, state dicts built by hand ---------------


def gpt2_like(
    prefix: str, layers: dict[str, tuple[int, ...]], extra: dict
) -> dict[str, np.ndarray]:
    """A random state dict: ``extra`` plus, per layer, ``layers`` under ``{prefix}h.{i}.``."""
    names = dict(extra)
    for i in range(L):
        names.update({f"{prefix}h.{i}.{k}": s for k, s in layers.items()})
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in sorted(names.items())}


def norms_and_embeddings(p: str, learned: bool) -> dict[str, tuple[int, ...]]:
    names = {f"{p}wte.weight": (V, E), f"{p}ln_f.weight": (E,), f"{p}ln_f.bias": (E,)}
    return {**names, f"{p}wpe.weight": (P, E)} if learned else names


LN = {"ln_1.weight": (E,), "ln_1.bias": (E,), "ln_2.weight": (E,), "ln_2.bias": (E,)}


def santacoder_state(headless: bool, tie: bool) -> dict[str, np.ndarray]:
    p, inner = ("" if headless else "transformer."), 4 * E
    layer = {
        **LN,
        "attn.q_attn.weight": (E, E),  # Conv1D: [in, out]
        "attn.q_attn.bias": (E,),
        "attn.kv_attn.weight": (E, 2 * D),
        "attn.kv_attn.bias": (2 * D,),
        "attn.c_proj.weight": (E, E),
        "attn.c_proj.bias": (E,),
        "mlp.c_fc.weight": (E, inner),
        "mlp.c_fc.bias": (inner,),
        "mlp.c_proj.weight": (inner, E),
        "mlp.c_proj.bias": (E,),
    }
    extra = norms_and_embeddings(p, True) | ({} if headless or tie else {"lm_head.weight": (V, E)})
    state = gpt2_like(p, layer, extra)
    for i in range(L):  # the buffers Model Zoo writes (santacoder.py lines 156-168)
        state[f"{p}h.{i}.attn.bias"] = np.tril(np.ones((P, P), np.uint8)).reshape(1, 1, P, P)
        state[f"{p}h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    return state


def santacoder_config(headless: bool, tie: bool) -> dict:
    return {
        "architectures": ["GPT2CustomModel" if headless else "GPT2LMHeadCustomModel"],
        "model_type": "gpt2",
        "attention_head_type": "multiquery",
        "vocab_size": V,
        "n_positions": P,
        "n_embd": E,
        "n_layer": L,
        "n_head": HEADS,
        "n_inner": 4 * E,
        "activation_function": "gelu_fast",
        "resid_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": tie,
        "use_cache": True,
    }


def assert_config_back(
    back: dict, original: dict, approx: tuple[str, ...] = (), unmapped: tuple[str, ...] = ()
) -> None:
    """Every field of the original config comes back equal (``approx``: equal to rounding),
    but ``unmapped``: fields Model Zoo's rules only check on import and do not write."""
    for key, value in original.items():
        if key in unmapped:
            continue
        if key in approx:
            assert back[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert back[key] == value, key


@pytest.mark.parametrize(("name", "tie"), [("santacoder", True), ("santacoder-headless", False)])
def test_santacoder_round_trip(name: str, tie: bool):
    headless = name.endswith("-headless")
    hf, hf_config = santacoder_state(headless, tie), santacoder_config(headless, tie)
    cs_model = santacoder.config_to_cs(hf_config, name)
    plan = santacoder.plan_to_cs(shapes(hf), hf_config, name)
    buffers = [k for k in hf if k.endswith((".attn.bias", ".attn.masked_bias"))]
    assert mapping.unused_inputs(plan, shapes(hf)) == sorted(buffers)  # regenerated on export
    cs = run(plan, hf)
    assert sorted(cs) == expected_cs(LAYER0, NON_LAYER)
    assert cs["transformer_decoder.layers.0.self_attn.proj_k_dense_layer.weight"].shape == (D, E)
    q = cs["transformer_decoder.layers.1.self_attn.proj_q_dense_layer.weight"]
    assert np.array_equal(q, hf[("" if headless else "transformer.") + "h.1.attn.q_attn.weight"].T)

    assert_config_back(santacoder.config_to_hf(cs_model, name), hf_config)
    assert_same(export_checks(santacoder, cs, cs_model, name, tie), hf)


def test_santacoder_negative_cases():
    hf_config = santacoder_config(False, True)
    cs_model = santacoder.config_to_cs(hf_config, "santacoder")
    with pytest.raises(MappingError, match="attention_module"):
        santacoder.config_to_hf({**cs_model, "attention_module": "aiayn_attention"}, "santacoder")
    with pytest.raises(MappingError, match="num_kv_groups"):
        santacoder.config_to_hf(
            {**cs_model, "extra_attention_params": {"num_kv_groups": 4}}, "santacoder"
        )
    with pytest.raises(MappingError, match="attention_head_type"):
        santacoder.config_to_cs({**hf_config, "attention_head_type": "multihead"}, "santacoder")
    with pytest.raises(MappingError, match="embeddings_scale"):
        santacoder.config_to_hf({**cs_model, "embeddings_scale": 10.0}, "santacoder")
    hf = santacoder_state(False, True)
    with pytest.raises(MappingError, match=r"transformer\.h\.0\.attn\.c_attn\.weight"):
        santacoder.plan_to_cs(
            {**shapes(hf), "transformer.h.0.attn.c_attn.weight": (E, 3 * E)},
            hf_config,
            "santacoder",
        )


def btlm_state(headless: bool, tie: bool, alibi: bool, glu: bool) -> dict[str, np.ndarray]:
    p, inner = ("" if headless else "transformer."), 3 * E
    layer = {
        **LN,
        "attn.c_attn.weight": (E, 3 * E),  # Conv1D: [in, out]
        "attn.c_attn.bias": (3 * E,),
        "attn.c_proj.weight": (E, E),
        "attn.c_proj.bias": (E,),
        "mlp.c_fc.weight": (E, inner),
        "mlp.c_fc.bias": (inner,),
        "mlp.c_proj.weight": (inner, E),
        "mlp.c_proj.bias": (E,),
    }
    if glu:
        layer |= {"mlp.c_fc2.weight": (E, inner), "mlp.c_fc2.bias": (inner,)}
    extra = norms_and_embeddings(p, not alibi)
    extra |= {f"{p}relative_pe.slopes": (HEADS, 1)} if alibi else {}
    extra |= {} if headless or tie else {"lm_head.weight": (V, E)}
    return gpt2_like(p, layer, extra)


def btlm_config(model_type: str, tie: bool, alibi: bool, glu: bool, mup: bool) -> dict:
    config = {
        "model_type": model_type,
        "vocab_size": V,
        "n_positions": P,
        "n_embd": E,
        "n_layer": L,
        "n_head": HEADS,
        "n_inner": 3 * E,
        "activation_function": "swiglu" if glu else "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.073,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "position_embedding_type": "alibi" if alibi else "learned",
        "tie_word_embeddings": tie,
        "use_cache": True,
    }
    if mup:  # cerebras/btlm-3b-8k-base's muP values, and a fixed linear ALiBi scaling
        config |= {
            "mup_width_scale": 0.1,
            "mup_output_alpha": 2.22,
            "mup_embeddings_scale": 14.6,
            "mup_scale_qk_dot_by_d": True,
            "alibi_scaling": {"type": "linear", "factor": 2.0},
        }
    return config


BTLM_CASES = [
    (btlm, "btlm", True, True, True, True),
    (btlm, "btlm-headless", False, False, False, False),
    (btlm, "btlm", False, False, True, False),
    (jais, "jais", False, True, True, True),
    (jais, "jais", True, False, False, False),
]


@pytest.mark.parametrize(("family", "name", "tie", "alibi", "glu", "mup"), BTLM_CASES)
def test_btlm_jais_round_trip(family, name: str, tie: bool, alibi: bool, glu: bool, mup: bool):
    headless = name.endswith("-headless")
    hf = btlm_state(headless, tie, alibi, glu)
    hf_config = btlm_config(family.HF_MODEL_TYPES[0], tie, alibi, glu, mup)
    cs_model = family.config_to_cs(hf_config, name)
    plan = family.plan_to_cs(shapes(hf), hf_config, name)
    assert mapping.unused_inputs(plan, shapes(hf)) == []
    cs = run(plan, hf)
    non_layer = [n for n in NON_LAYER if not (alibi and "position_embeddings" in n)]
    assert sorted(cs) == expected_cs(
        LAYER0 + (GLU0 if glu else []),
        non_layer + ([SLOPES] if alibi else []),
    )
    if mup:  # btlm_hf_cs.py lines 263-280, 330-343
        assert cs_model["output_logits_scale"] == pytest.approx(0.222)
        assert cs_model["scale_qk_dot_by_d"] is True and cs_model["embeddings_scale"] == 14.6
        assert cs_model["pos_scaling_factor"] == 2.0
        assert family.cs_optimizer(hf_config) == {"adjust_learning_rate": {"decoder_kernel": 0.1}}
        # Without the optimizer's decoder_kernel Model Zoo uses 1.0: same product, same logits.
        plain = family.config_to_hf(cs_model, name)
        assert plain["mup_width_scale"] == 1.0
        assert plain["mup_output_alpha"] == cs_model["output_logits_scale"]
        cs_model = {**cs_model, "decoder_kernel": 0.1}  # what the pipeline copies in
    else:
        assert cs_model["pos_scaling_factor"] == 1.0

    back = family.config_to_hf(cs_model, name)
    # reorder_and_upcast_attn: asserted false on import, not written (gpt2_hf_cs.py 590-593).
    unmapped = ("reorder_and_upcast_attn",)
    assert_config_back(back, hf_config, approx=("mup_output_alpha",), unmapped=unmapped)
    arch = {"btlm": "BTLMLMHeadModel", "btlm-headless": "BTLMModel", "jais": "JAISLMHeadModel"}
    assert back["architectures"] == [arch[name]]
    assert back["alibi_scaling"] == (hf_config["alibi_scaling"] if mup else None)

    back_hf = export_checks(family, cs, cs_model, name, tie)
    assert_same(back_hf, {k: v for k, v in hf.items() if not (tie and k == HEAD)})


def test_btlm_jais_negative_cases():
    hf_config = btlm_config("btlm", True, True, True, True)
    cs_model = btlm.config_to_cs(hf_config, "btlm")
    dynamic = {**hf_config, "alibi_scaling": {"type": "linear", "factor": 2.0, "train_seq_len": 8}}
    with pytest.raises(MappingError, match="train_seq_len"):
        btlm.config_to_cs(dynamic, "btlm")
    for field, value in [
        ("mup_base_hidden_size", 32),
        ("output_logits_alpha", 2.0),
        ("position_embedding_type", "rotary"),
        ("nonlinearity", "geglu"),
        ("norm_type", "rmsnorm"),
    ]:
        with pytest.raises(MappingError, match=field):
            btlm.config_to_hf({**cs_model, field: value}, "btlm")
    with pytest.raises(MappingError, match="model_type"):
        jais.config_to_cs(hf_config, "jais")  # model_type btlm
    with pytest.raises(MappingError, match="jais-headless"):
        jais.config_to_cs({**hf_config, "model_type": "jais"}, "jais-headless")
    hf = btlm_state(False, True, True, True)
    cs = run(btlm.plan_to_cs(shapes(hf), hf_config, "btlm"), hf)
    stray = "transformer_decoder.layers.1.ffn.ffn.2.linear_layer.weight"
    with pytest.raises(MappingError, match=stray):
        btlm.plan_to_hf({**shapes(cs), stray: (E, E)}, cs_model, "btlm")
    no_glu = {**cs_model, "nonlinearity": "gelu"}  # the glu tensors are then unknown
    with pytest.raises(MappingError, match="linear_layer_for_glu"):
        btlm.plan_to_hf(shapes(cs), no_glu, "btlm")
