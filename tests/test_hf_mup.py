"""muP export (issue #35 item 2): a muP CS model exported to Hugging Face computes the CS model's
muP function. Each case imports a tiny random ``transformers`` model (its weights are then the CS
weights, bit for bit), turns the run's config into a muP one, exports, and compares the exported
model's logits with the CS muP forward, written here from Model Zoo's formulas (tag
Release_2.10.0, ``src/cerebras/modelzoo/``), not from the converter:

- ``models/nlp/gpt2/gpt2_model.py`` lines 1085-1093: the embedding output (after the embedding
  norm, if any) times ``embeddings_scale``, so the first decoder layer's input is scaled;
- ``layers/AttentionLayer.py`` lines 354-361 and 630-646: the QK logits are
  ``attention_logits_alpha * (q / sqrt(d)) @ (k / sqrt(d))^T`` with ``scale_qk_dot_by_d`` (else
  ``k`` is not divided), ALiBi added after;
- ``gpt2_model.py`` lines 757-782 and 1186-1193: the logits (bias included) times
  ``output_logits_alpha / (hidden_size / mup_base_hidden_size)`` (square root of the ratio when
  ``scale_output_logits_by_d`` is false), or 2.2's ``output_logits_scale`` as given.

The reference runs the original HF model (eager attention) with those multipliers put back: a
pre-hook on the first layer, the attention's own logit scale, a hook on ``lm_head``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from ckpt_migrate.catalogue.mup import DECODER_MUP
from ckpt_migrate.errors import CkptError
from ckpt_migrate.format.tree import MemoryData, TensorLeaf
from ckpt_migrate.hf import mup
from ckpt_migrate.hf.export import export
from ckpt_migrate.hf.import_ import import_hf

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

SMALL = {"vocab_size": 96}
DECODER = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, **SMALL}
D_HEAD = 16  # 64 / 4 in every case


@dataclass(frozen=True)
class Case:
    cls: str
    config: object
    scaled_input: Callable  # the module whose input is the scaled embedding output
    attr: str  # the attention modules' logit-scale attribute
    heads: Callable = lambda m: [m.lm_head]  # the modules whose outputs are the logits
    outputs: tuple[str, ...] = ("logits",)


CASES = {
    "gpt2": Case(
        "GPT2LMHeadModel",
        transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_inner=256, **SMALL),
        lambda m: m.transformer.h[0],
        "scaling",
    ),
    "gptj": Case(
        "GPTJForCausalLM",
        transformers.GPTJConfig(n_embd=64, n_layer=2, n_head=4, n_inner=256, rotary_dim=8, **SMALL),
        lambda m: m.transformer.h[0],
        "scaling",
    ),
    "llama": Case(
        "LlamaForCausalLM",
        transformers.LlamaConfig(intermediate_size=128, num_key_value_heads=2, **DECODER),
        lambda m: m.model.layers[0],
        "scaling",
    ),
    "mistral": Case(
        "MistralForCausalLM",
        transformers.MistralConfig(
            intermediate_size=128, num_key_value_heads=2, sliding_window=4, **DECODER
        ),
        lambda m: m.model.layers[0],
        "scaling",
    ),
    "bloom": Case(  # an embedding norm (the scale follows it) and ALiBi
        "BloomForCausalLM",
        transformers.BloomConfig(hidden_size=64, n_head=4, n_layer=2, **SMALL),
        lambda m: m.transformer.h[0],
        "inv_norm_factor",
    ),
    "starcoder": Case(  # multi-query attention
        "GPTBigCodeForCausalLM",
        transformers.GPTBigCodeConfig(
            n_embd=64, n_layer=2, n_head=4, n_inner=256, multi_query=True, **SMALL
        ),
        lambda m: m.transformer.h[0],
        "scaling",
    ),
    # the scale before the embedding norm (bert_model.py lines 600-612); MLM and NSP logits
    # both scaled (bert_pretrain_models.py lines 255-273)
    "bert": Case(
        "BertForPreTraining",
        transformers.BertConfig(intermediate_size=128, **DECODER),
        lambda m: m.bert.embeddings.LayerNorm,
        "scaling",
        lambda m: [m.cls.predictions, m.cls.seq_relationship],
        ("prediction_logits", "seq_relationship_logits"),
    ),
}

# A 2.3+ muP run: width 64 against a base of 16 (muP fields as Model Zoo's muP configs write them,
# e.g. models/nlp/gptj/configs/params_gptj_6B_muP.yaml).
MUP = {
    "mup_base_hidden_size": 16,
    "mup_base_filter_size": 32,
    "embeddings_scale": 10.0,
    "scale_qk_dot_by_d": True,
    "attention_logits_alpha": 0.5,
    "output_logits_alpha": 2.0,
}


def _inputs():
    return torch.arange(12).reshape(1, 12) % 90 + 3


def _model(name: str):
    case = CASES[name]
    torch.manual_seed(0)
    case.config._attn_implementation = "eager"
    model = getattr(transformers, case.cls)(case.config).eval()
    with torch.no_grad():  # norms start as ones/zeros: make every tensor count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def _logits(model, name: str) -> torch.Tensor:
    with torch.no_grad():
        out = model(_inputs())
    return torch.cat([getattr(out, o).reshape(-1) for o in CASES[name].outputs])


def _mup_logits(model, name: str, fields: dict, run: Callable | None = None) -> torch.Tensor:
    """The CS muP forward from the formulas of the module docstring, on the same weights
    (``run``: what to compute instead of the logits)."""
    case = CASES[name]
    attr = case.attr
    emb = fields.get("embeddings_scale", 1.0)
    alpha = fields.get("attention_logits_alpha", 1.0)
    if fields.get("mup_base_hidden_size"):
        width = 64 / fields["mup_base_hidden_size"]
        by_d = fields.get("scale_output_logits_by_d", True)
        out = fields.get("output_logits_alpha", 1.0) / (width if by_d else math.sqrt(width))
    else:
        out = fields.get("output_logits_scale", 1.0)
    logit_scale = alpha / D_HEAD if fields.get("scale_qk_dot_by_d") else alpha / math.sqrt(D_HEAD)

    def scale_input(_module, args, kwargs):
        if args:
            return (args[0] * emb, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] * emb}

    hooks = [case.scaled_input(model).register_forward_pre_hook(scale_input, with_kwargs=True)]
    hooks += [h.register_forward_hook(lambda _m, _i, o: o * out) for h in case.heads(model)]
    saved = []
    for module in model.modules():
        if hasattr(module, attr) and isinstance(getattr(module, attr), float):
            saved.append((module, getattr(module, attr)))
            setattr(module, attr, logit_scale)
    assert len(saved) == 2  # one attention per layer
    try:
        return run(model) if run is not None else _logits(model, name)
    finally:
        for h in hooks:
            h.remove()
        for module, value in saved:
            setattr(module, attr, value)


def _checkpoint(tmp_path: Path, model, name: str, fields: dict) -> tuple[Path, Path]:
    """The model imported as a 2.10 CS checkpoint, its params.yaml given ``fields``."""
    model.save_pretrained(tmp_path / "hf")
    ckpt, params = tmp_path / "model.mdl", tmp_path / "params.yaml"
    import_hf(tmp_path / "hf", ckpt, model=name, config_out=params)
    data = yaml.safe_load(params.read_text())
    data["trainer"]["init"]["model"].update(fields)
    params.write_text(yaml.safe_dump(data))
    return ckpt, params


@pytest.mark.parametrize("name", list(CASES))
def test_mup_export_computes_the_mup_forward(name: str, tmp_path: Path):
    model = _model(name)
    expected = _mup_logits(model, name, MUP)
    assert not torch.allclose(expected, _logits(model, name), atol=1e-3)  # muP matters here

    ckpt, params = _checkpoint(tmp_path, model, name, MUP)
    export(ckpt, tmp_path / "out", config=params, model=name)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert not any(k in config for k in DECODER_MUP.names)
    assert config.get("tie_word_embeddings") is False  # a scaled head is its own tensor
    cls = getattr(transformers, CASES[name].cls)
    exported = cls.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    torch.testing.assert_close(_logits(exported, name), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "fields",
    [
        # 2.2's spelling (mup.py lines 328-455): no base, the logits' multiplier given as is
        {"embeddings_scale": 4.0, "scale_qk_dot_by_d": True, "output_logits_scale": 0.25},
        # the square root of the width ratio, and muP's default scale_qk_dot_by_d (model.py
        # lines 161-171: unset is on under muP)
        {"mup_base_hidden_size": 16, "mup_base_filter_size": 64, "scale_output_logits_by_d": False},
    ],
)
def test_other_mup_spellings(fields: dict, tmp_path: Path):
    model = _model("gpt2")
    full = {**fields}
    if "mup_base_hidden_size" in fields:
        full.setdefault("scale_qk_dot_by_d", True)
    expected = _mup_logits(model, "gpt2", full)
    ckpt, params = _checkpoint(tmp_path, model, "gpt2", fields)
    export(ckpt, tmp_path / "out", config=params, model="gpt2")
    exported = transformers.GPT2LMHeadModel.from_pretrained(
        tmp_path / "out", attn_implementation="eager"
    ).eval()
    torch.testing.assert_close(_logits(exported, "gpt2"), expected, rtol=1e-4, atol=1e-4)


def test_a_config_without_mup_exports_bit_for_bit(tmp_path: Path):
    """Neutral muP values written out change nothing: the export equals the imported model."""
    model = _model("gpt2")
    neutral = {
        "embeddings_scale": 1.0,
        "attention_logits_alpha": 1.0,
        "scale_qk_dot_by_d": False,
        "mup_base_hidden_size": None,
        "scale_output_logits_by_d": True,
    }
    ckpt, params = _checkpoint(tmp_path, model, "gpt2", neutral)
    export(ckpt, tmp_path / "out", config=params, model="gpt2")
    (hf_file,), (out_file,) = (sorted((tmp_path / d).glob("*.safetensors")) for d in ("hf", "out"))
    before, after = (safetensors_numpy.load_file(str(f)) for f in (hf_file, out_file))
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert after[key].dtype == value.dtype and np.array_equal(after[key], value), key
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["tie_word_embeddings"] is True


def test_to_sp_leaves_a_standard_model_alone():
    leaf = TensorLeaf("float32", (4, 2), MemoryData(np.ones((4, 2), np.float32)))
    leaves = {"embedding_layer.word_embeddings.weight": leaf}
    cs = {"hidden_size": 2, "num_heads": 1, "embeddings_scale": 1.0}
    sp, out = mup.to_sp(cs, leaves, "gpt2")
    assert sp == cs and out["embedding_layer.word_embeddings.weight"] is leaf


def test_bf16_is_scaled_and_rounded_like_torch():
    value = torch.randn(5, 3).to(torch.bfloat16)
    stored = value.view(torch.int16).numpy()
    leaf = mup.scaled(TensorLeaf("bfloat16", (5, 3), MemoryData(stored)), 0.3)
    got = torch.from_numpy(leaf.data.read()).view(torch.bfloat16)
    assert torch.equal(got, (value.to(torch.float64) * 0.3).to(torch.float32).to(torch.bfloat16))


@pytest.mark.parametrize(
    ("name", "field"),
    [
        # Model Zoo's converters for these have no muP conversion (gpt_neox_hf_cs.py,
        # falcon.py, mixtral.py lines 396-457, gemma2.py): refused, naming the field
        ("falcon", "mup_base_hidden_size"),
        ("gpt-neox", "mup_base_hidden_size"),
        ("mixtral", "mup_base_hidden_size"),
        ("gemma2", "mup_base_hidden_size"),
        ("roberta", "mup_base_hidden_size"),  # roberta.py: no CS23 converter, no muP
    ],
)
def test_what_does_not_fold_is_refused_naming_the_field(name: str, field: str):
    cs = {"hidden_size": 64, "num_heads": 4, field: 16}
    with pytest.raises(Exception, match=field) as info:
        mup.to_sp(cs, {}, name)
    assert "not supported" in str(info.value)


def test_a_2_2_and_a_2_3_logits_multiplier_together_are_refused(tmp_path: Path):
    model = _model("gpt2")
    bad = {"mup_base_hidden_size": 16, "output_logits_scale": 0.5}
    ckpt, params = _checkpoint(tmp_path, model, "gpt2", bad)
    with pytest.raises(CkptError, match="output_logits_scale"):
        export(ckpt, tmp_path / "out", config=params, model="gpt2")


def test_list_converters_says_what_export_does_with_mup():
    script = Path(__file__).resolve().parents[1] / "scripts" / "convert_checkpoint.py"
    shown = {}
    for name in ("gpt2", "falcon", "btlm"):
        proc = subprocess.run(
            [sys.executable, str(script), "list-converters", name, "--hide-notes"],
            capture_output=True,
            text=True,
            check=True,
        )
        line = next(x for x in proc.stdout.splitlines() if "muP" in x)
        shown[name] = line.split(": ", 1)[1]
    assert shown["gpt2"].startswith("folded into the weights")
    assert shown["falcon"] == "refused, naming the field"
    assert "output_logits_scale" in shown["btlm"] and "refused" in shown["btlm"]


# T5's muP forward (t5_model.py lines 514-600, 830-845, 1038-1058; AttentionLayer.py lines
# 520-560, 646, 443, 903), with d_model 64 against a base of 16 (width 4), d_kv 16.
T5_MUP = {
    "mup_base_d_model": 16,
    "mup_base_d_ff": 32,
    "embeddings_alpha": 1.5,
    "encoder_attention_logits_alpha": 0.5,
    "decoder_attention_logits_alpha": 2.0,
    "output_logits_alpha": 3.0,
}


def _t5_mup_logits(model, inputs: dict) -> torch.Tensor:
    """The CS T5 muP forward: embeddings times ``embeddings_alpha * sqrt(d_model)``; q, k, v
    projections times ``width**-0.5``, q over ``sqrt(d_kv)`` (scaled dot product) and k too
    (``scale_*_qk_dot_by_d``, on under muP when unset: t5 model.py lines 111-135), k times the
    encoder's or decoder's ``attention_logits_alpha`` (they multiply q.k, before the position
    bias); the attention output times ``width**0.5``; the LM logits times
    ``output_logits_alpha / sqrt(width)``, the tied head's ``d_model**-0.5`` left out
    (t5_model.py line 1038: only without an output multiplier)."""
    width, d_kv, d_model = 4.0, 16, 64
    proj = width**-0.5
    factors = {"q": proj / math.sqrt(d_kv), "v": proj, "o": width**0.5}
    alpha = {"encoder": 0.5, "decoder": 2.0}
    hooks = []

    def times(factor):
        return lambda _m, _i, o: o * factor

    emb = 1.5 * math.sqrt(d_model)
    for embed in {
        id(m): m for m in (model.encoder.embed_tokens, model.decoder.embed_tokens)
    }.values():
        hooks.append(embed.register_forward_hook(times(emb)))
    for side in ("encoder", "decoder"):
        for module in getattr(model, side).modules():
            if isinstance(module, transformers.models.t5.modeling_t5.T5Attention):
                for proj_name, factor in factors.items():
                    hooks.append(getattr(module, proj_name).register_forward_hook(times(factor)))
                k = alpha[side] * proj / math.sqrt(d_kv)
                hooks.append(module.k.register_forward_hook(times(k)))
    hooks.append(model.lm_head.register_forward_hook(times(3.0 / math.sqrt(width))))
    model.config.scale_decoder_outputs = False
    try:
        with torch.no_grad():
            return model(**inputs).logits
    finally:
        model.config.scale_decoder_outputs = True
        for h in hooks:
            h.remove()


def test_t5_mup_export_computes_the_mup_forward(tmp_path: Path):
    torch.manual_seed(0)
    config = transformers.T5Config(
        d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, **SMALL
    )
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ids = _inputs()
    inputs = {"input_ids": ids, "decoder_input_ids": ids[:, :5]}
    expected = _t5_mup_logits(model, inputs)
    with torch.no_grad():
        assert not torch.allclose(expected, model(**inputs).logits, atol=1e-3)
    ckpt, params = _checkpoint(tmp_path, model, "t5", T5_MUP)
    export(ckpt, tmp_path / "out", config=params, model="t5")
    config_out = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config_out["tie_word_embeddings"] is False and not config_out["scale_decoder_outputs"]
    exported = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        got = exported(**inputs).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_mup_export_memory_stays_near_two_tensors(tmp_path: Path):
    """The fold reads one tensor and writes its scaled copy (float64 products a chunk at a
    time): the peak stays near twice the largest tensor, the embedding it scales."""
    import tracemalloc

    from test_hf_pipeline import _big_cs_checkpoint

    ckpt, params = tmp_path / "big.mdl", tmp_path / "p.yaml"
    largest = _big_cs_checkpoint(ckpt, vocab=262144)  # a 64 MiB embedding
    params.write_text(
        "model:\n  vocab_size: 262144\n  hidden_size: 64\n  num_heads: 4\n"
        "  num_hidden_layers: 1\n  max_position_embeddings: 8\n  filter_size: 256\n"
        "  mup_base_hidden_size: 16\n  mup_base_filter_size: 64\n  embeddings_scale: 10.0\n"
    )
    tracemalloc.start()
    try:
        export(ckpt, tmp_path / "hf", config=params, model="gpt2")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * largest, f"peak {peak / 2**20:.0f} MiB for a 64 MiB tensor"
    out = safetensors_numpy.load_file(str(next((tmp_path / "hf").glob("*.safetensors"))))
    assert out["lm_head.weight"].shape == out["transformer.wte.weight"].shape  # untied


def test_a_headless_mup_export_gives_the_mup_hidden_states(tmp_path: Path):
    """Without the head only the embedding and attention multipliers matter."""
    model = _model("gpt2")

    def hidden(m):
        with torch.no_grad():
            return m.transformer(_inputs()).last_hidden_state

    expected = _mup_logits(model, "gpt2", MUP, run=hidden)
    ckpt, params = _checkpoint(tmp_path, model, "gpt2", MUP)
    result = export(ckpt, tmp_path / "out", config=params, model="gpt2-headless")
    assert list(result.dropped) == ["lm_head.weight"]
    exported = transformers.GPT2Model.from_pretrained(
        tmp_path / "out", attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        got = exported(_inputs()).last_hidden_state
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
