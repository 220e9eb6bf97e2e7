"""The GPT-2 family's rules (``ckpt_migrate/hf/families/gpt2.py``) on real transformers models:
HF -> CS -> HF is bitwise, the CS names are Model Zoo's, the config survives as data and the
round-tripped model gives the same logits. Names served: gpt2 (tied and untied lm_head) and
gpt2-headless (GPT2Model)."""

from __future__ import annotations

import numpy as np
import pytest

from ckpt_migrate.hf import families
from ckpt_migrate.hf.families import gpt2
from ckpt_migrate.hf.mapping import MappingError, run, unused_inputs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Not compared: transformers' bookkeeping (the version that wrote it, the weights' dtype,
# ``architectures``: set by save_pretrained, a fresh config has none; checked apart) and the
# tokenizer's special token ids, which a CS model config does not hold (Model Zoo maps none).
BOOKKEEPING = {"transformers_version", "dtype", "torch_dtype", "architectures"}
TOKENS = {"bos_token_id", "eos_token_id", "pad_token_id"}


def _model(name: str, tied: bool):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_embd=64,
        n_layer=2,
        n_head=4,
        vocab_size=128,
        n_positions=32,
        n_inner=256,
        tie_word_embeddings=tied,
        bos_token_id=0,
        eos_token_id=0,
    )
    cls = transformers.GPT2LMHeadModel if name == "gpt2" else transformers.GPT2Model
    model = cls(config).eval()
    with torch.no_grad():  # LayerNorms start as ones/zeros: make every tensor distinct
        for p in model.parameters():
            p.normal_()
    return model


def _saved(model, name: str, tied: bool) -> dict[str, np.ndarray]:
    """The tensors ``save_pretrained`` writes: a tied lm_head is left out."""
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    if name == "gpt2" and tied:
        state.pop("lm_head.weight")
    return state


# Model Zoo gpt2_hf_cs.py (Release_2.10.0): wte/wpe lines 236-249 and 1040-1050 (2.1 ``.embed``),
# c_attn -> proj_q/k/v lines 113-151, c_proj -> proj_output line 52, ln_1/ln_2 -> norm1/norm3
# lines 259-276, mlp.c_fc/c_proj -> ffn.ffn.0/1 lines 277-294, ln_f -> transformer_decoder.norm
# lines 295-301, lm_head lines 428-431 (and 768-790 for a tied one).
LAYER0 = [
    f"transformer_decoder.layers.0.{part}.{p}"
    for part in (
        "norm1",
        "self_attn.proj_output_dense_layer",
        "norm3",
        "ffn.ffn.0.linear_layer",
        "ffn.ffn.1.linear_layer",
        "self_attn.proj_q_dense_layer",
        "self_attn.proj_k_dense_layer",
        "self_attn.proj_v_dense_layer",
    )
    for p in ("weight", "bias")
]
NON_LAYER = [
    "embedding_layer.word_embeddings.weight",
    "embedding_layer.position_embeddings.embed.weight",
    "transformer_decoder.norm.weight",
    "transformer_decoder.norm.bias",
    "ln_f.weight",  # the same norm's second name in the CS model (lines 323-337)
    "ln_f.bias",
    # always, the embeddings when tied (lines 768-790): Model Zoo's 2.1+ converter leaves a tied
    # head out, and its GPT2LMHeadModel then refuses the file (strict load; see gpt2.plan_to_cs)
    "lm_head.weight",
]
HEAD = "lm_head.weight"

CASES = [("gpt2", True), ("gpt2", False), ("gpt2-headless", True), ("gpt2-headless", False)]


def test_discovered():
    assert families.by_name()["gpt2"] is gpt2
    assert families.by_name()["gpt2-headless"] is gpt2
    assert families.by_model_type()["gpt2"] is gpt2


@pytest.mark.parametrize(("name", "tied"), CASES)
def test_round_trip(name: str, tied: bool):
    model = _model(name, tied)
    hf_cfg = model.config.to_dict()
    hf = _saved(model, name, tied)
    hf_shapes = {k: v.shape for k, v in hf.items()}

    # HF -> CS: Model Zoo's names, every HF tensor used.
    cs_model = gpt2.config_to_cs(hf_cfg, name)
    to_cs = gpt2.plan_to_cs(hf_shapes, hf_cfg, name)
    cs = dict(run(to_cs, hf.__getitem__))
    assert unused_inputs(to_cs, hf_shapes) == []
    assert {k for k in cs if ".layers.0." in k} == set(LAYER0)
    assert {k for k in cs if ".layers." not in k} == set(NON_LAYER)
    assert len(cs) == len(NON_LAYER) + 2 * len(LAYER0)
    if tied:  # both names on the CS side, as the CS model's state dict has them
        wte = hf[("" if name == "gpt2-headless" else "transformer.") + "wte.weight"]
        assert np.array_equal(cs["lm_head.weight"], wte)
    q = cs["transformer_decoder.layers.1.self_attn.proj_q_dense_layer.weight"]
    c_attn = hf[("" if name == "gpt2-headless" else "transformer.") + "h.1.attn.c_attn.weight"]
    assert np.array_equal(q, c_attn[:, :64].T)

    # The config back: equal as data on every field the family maps.
    back = gpt2.config_to_hf(cs_model, name)
    assert back["architectures"] == [gpt2.ARCHITECTURES[name]]
    again = transformers.GPT2Config(**back).to_diff_dict()
    original = model.config.to_diff_dict()
    for key in BOOKKEEPING | TOKENS:
        again.pop(key, None)
        original.pop(key, None)
    assert again == original

    # CS -> HF: bitwise the tensors save_pretrained writes.
    cs_shapes = {k: v.shape for k, v in cs.items()}
    to_hf = gpt2.plan_to_hf(cs_shapes, cs_model, name)
    out = dict(run(to_hf, cs.__getitem__))
    assert sorted(out) == sorted(hf)
    for key, value in hf.items():
        assert out[key].dtype == value.dtype and np.array_equal(out[key], value), key
    ties = gpt2.cs_ties(cs_shapes, cs_model, name)
    dropped = gpt2.cs_dropped(cs_shapes, cs_model, name)
    assert sorted(set(unused_inputs(to_hf, cs_shapes)) - set(ties) - set(dropped)) == []
    if name == "gpt2-headless" and not tied:
        assert list(dropped) == ["lm_head.weight"]
    norm = {f"ln_f.{p}": f"transformer_decoder.norm.{p}" for p in ("weight", "bias")}
    emb = "embedding_layer.word_embeddings.weight"
    assert ties == norm | ({HEAD: emb} if tied else {})
    if tied:  # Model Zoo's 2.1+ file has no tied head (gpt2_hf_cs.py 1079-1130): same HF tensors
        theirs = {k: v.shape for k, v in cs.items() if k != HEAD}
        assert gpt2.cs_ties(theirs, cs_model, name) == norm
        plan = gpt2.plan_to_hf(theirs, cs_model, name)
        assert unused_inputs(plan, theirs) == sorted(norm)
        got = dict(run(plan, cs.__getitem__))
        assert got.keys() == out.keys() and all(np.array_equal(got[k], out[k]) for k in out)

    # A fresh model with the round-tripped tensors gives the same logits.
    fresh = type(model)(transformers.GPT2Config(**back)).eval()
    result = fresh.load_state_dict({k: torch.from_numpy(v) for k, v in out.items()}, strict=False)
    assert result.unexpected_keys == []
    assert set(result.missing_keys) <= ({"lm_head.weight"} if tied else set())
    ids = torch.tensor([[1, 5, 9, 3, 7, 2]])
    with torch.no_grad():
        a, b = model(ids), fresh(ids)
    key = "logits" if name == "gpt2" else "last_hidden_state"
    assert torch.equal(a[key], b[key])


def test_untied_headless_lm_head_is_initialised_like_model_zoo():
    model = _model("gpt2-headless", False)
    hf = _saved(model, "gpt2-headless", False)
    plan = gpt2.plan_to_cs(
        {k: v.shape for k, v in hf.items()}, model.config.to_dict(), "gpt2-headless"
    )
    head = dict(run(plan, hf.__getitem__))["lm_head.weight"]
    assert head.shape == (128, 64) and head.dtype == np.float32
    assert abs(float(head.std()) - 0.02) < 0.002  # normal(0, 0.02), gpt2_hf_cs.py line 390


def _cs_of(name: str = "gpt2", tied: bool = True):
    model = _model(name, tied)
    hf = _saved(model, name, tied)
    cfg = model.config.to_dict()
    cs = dict(run(gpt2.plan_to_cs({k: v.shape for k, v in hf.items()}, cfg, name), hf.__getitem__))
    return cs, gpt2.config_to_cs(cfg, name)


def test_unknown_cs_tensor_is_reported():
    cs, cs_model = _cs_of()
    cs["transformer_decoder.layers.0.extra.weight"] = np.zeros(3, np.float32)
    shapes = {k: v.shape for k, v in cs.items()}
    plan = gpt2.plan_to_hf(shapes, cs_model, "gpt2")
    unused = set(unused_inputs(plan, shapes)) - set(gpt2.cs_ties(shapes, cs_model, "gpt2"))
    assert unused == {"transformer_decoder.layers.0.extra.weight"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("position_embedding_type", "rotary"),
        ("norm_type", "rmsnorm"),
        ("use_bias_in_output", True),
        ("attention_type", "linear"),
        ("mup_base_hidden_size", 256),
        ("scale_qk_dot_by_d", True),
        ("embeddings_scale", 10.0),
    ],
)
def test_unsupported_cs_config_fields(field: str, value):
    _, cs_model = _cs_of()
    with pytest.raises(MappingError, match=field):
        gpt2.config_to_hf({**cs_model, field: value}, "gpt2")


@pytest.mark.parametrize(
    "field", ["scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"]
)
def test_unsupported_hf_config_fields(field: str):
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, **{field: True}).to_dict()
    with pytest.raises(MappingError, match=field):
        gpt2.config_to_cs(cfg, "gpt2")


def test_model_zoo_config_defaults():
    cs = gpt2.config_to_cs({"model_type": "gpt2", "n_embd": 16, "n_head": 2, "n_layer": 1}, "gpt2")
    assert cs["filter_size"] == 64  # n_inner None: 4 * n_embd (gpt2_hf_cs.py line 649)
    assert cs["share_embedding_weights"] is True and cs["use_bias_in_output"] is False
    hf = gpt2.config_to_hf(
        {
            "hidden_size": 16,
            "num_heads": 2,
            "num_hidden_layers": 1,
            "vocab_size": 8,
            "dropout_rate": 0.2,
        },
        "gpt2",
    )  # the dropout rates default to dropout_rate (lines 652-655)
    assert hf["embd_pdrop"] == hf["attn_pdrop"] == hf["resid_pdrop"] == 0.2
    assert hf["tie_word_embeddings"] is True


def test_wrong_shapes_are_mapping_errors():
    cs, cs_model = _cs_of()
    cs["transformer_decoder.layers.0.self_attn.proj_k_dense_layer.weight"] = np.zeros(
        (3, 64), np.float32
    )
    with pytest.raises(MappingError, match=r"proj_k_dense_layer\.weight has shape"):
        gpt2.plan_to_hf({k: v.shape for k, v in cs.items()}, cs_model, "gpt2")
    model = _model("gpt2", True)
    cfg = {**model.config.to_dict(), "n_embd": 32}
    hf = {k: v.shape for k, v in _saved(model, "gpt2", True).items()}
    with pytest.raises(MappingError, match=r"transformer\.wte\.weight has shape"):
        gpt2.plan_to_cs(hf, cfg, "gpt2")
