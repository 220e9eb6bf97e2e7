"""Model families: names and aliases, detection from key names, ``--model`` on the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import MODELS, run_cli

from ckpt_migrate.cli import commands
from ckpt_migrate.errors import UsageError
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import DictNode
from ckpt_migrate.models.detect import FEATURES, choose_family, detect_family, key_lines
from ckpt_migrate.models.keys import model_keys
from ckpt_migrate.models.names import FAMILIES, MODEL_NAMES, canonical_family, resolve_name

L0 = "transformer_decoder.layers.0"


def fixture_keys(name: str) -> list[str]:
    with read_checkpoint(MODELS / name / "checkpoint_100.mdl") as ckpt:
        return model_keys(ckpt.root)


def test_family_names_are_the_agreed_ones():
    assert FAMILIES == (
        "gpt2",
        "gptj",
        "gpt-neox",
        "codegen",
        "llama",
        "bloom",
        "falcon",
        "btlm",
        "jais",
        "starcoder",
        "santacoder",
        "mistral",
        "mixtral",
        "gemma2",
        "bert",
        "t5",
        "clip-vit",
        "dpo",
        "dragon",
        "esm-2",
        "llava",
        "mmsimple-llava",
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpt2", ("gpt2", None)),
        ("GPT-NeoX", ("gpt-neox", None)),
        ("llamaV2", ("llama", "llamav2")),
        ("llama2", ("llama", "llama2")),
        ("code-llama", ("llama", "code-llama")),
        ("wizardlm", ("llama", "wizardlm")),
        ("bert-sequence-classifier", ("bert", "bert-sequence-classifier")),
        ("bert-token-classifier", ("bert", "bert-token-classifier")),
        ("bert-summarization", ("bert", "bert-summarization")),
        ("bert-qa", ("bert", "bert-qa")),
        ("bert-q&a", ("bert", "bert-q&a")),
        ("transformer", ("t5", "transformer")),
        ("ul2", ("t5", "ul2")),
        ("flan-ul2", ("t5", "flan-ul2")),
    ],
)
def test_canonical_family(name, expected):
    assert canonical_family(name) == expected


def test_one_name_table_serves_every_path():
    """--model, convert_checkpoint.py and the config upgrade read one table (models.names), so a
    name one of them accepts, all accept: gpt3 was once refused by --model."""
    for name, (family, registry) in MODEL_NAMES.items():
        assert resolve_name(name.upper()) == (family, registry)
        assert canonical_family(name)[0] == family
        assert commands.step_inputs(model=name) == {"model": name}
        assert choose_family(DictNode([]), name).family == family
    assert canonical_family("gpt3") == ("gpt2", "gpt3")


def test_model_gpt3_is_accepted_by_the_cli():
    proc = run_cli("plan", str(MODELS / "gpt2-2.0" / "checkpoint_100.mdl"), "--model", "gpt3")
    assert proc.returncode == 0, proc.stderr
    assert "model: gpt2 (gpt3) (from --model" in proc.stdout


def test_unknown_model_name_lists_the_known_ones():
    with pytest.raises(UsageError) as info:
        canonical_family("gpt5")
    message = str(info.value)
    assert "gpt5" in message and "gpt2" in message and "flan-ul2" in message
    assert "\n" not in message


@pytest.mark.parametrize("release", ["1.9", "2.0"])
@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "t5"])
def test_fixtures_are_detected_with_full_confidence(family, release):
    guess = detect_family(fixture_keys(f"{family}-{release}"))
    assert (guess.family, guess.confidence) == (family, 1.0)
    assert any("model." in line or "." in line for line in guess.evidence)


def test_evidence_names_the_deciding_keys():
    guess = detect_family(fixture_keys("gpt2-2.0"))
    text = " | ".join(guess.evidence)
    # learned absolute positions tell GPT-2 from GPT-NeoX, whose keys are otherwise the same
    assert "model.embedding_layer.position_embeddings.weight" in text
    assert "gpt-neox" in text
    guess = detect_family(fixture_keys("llama-2.0"))
    text = " | ".join(guess.evidence)
    assert f"model.{L0}.ffn.ffn.0.linear_layer_for_glu.weight" in text


def _decoder(*extra: str, bias: bool = True) -> list[str]:
    keys = ["embedding_layer.word_embeddings.weight", f"{L0}.self_attn.proj_q_dense_layer.weight"]
    keys += [f"{L0}.norm1.weight", f"{L0}.ffn.ffn.0.linear_layer.weight", "lm_head.weight"]
    if bias:
        keys += [f"{L0}.norm1.bias"]
    return keys + list(extra)


@pytest.mark.parametrize(
    ("keys", "family"),
    [
        # GPT-NeoX: rotary (no position keys), biases everywhere, two norms, no head bias
        (
            _decoder(
                f"{L0}.self_attn.proj_q_dense_layer.bias",
                f"{L0}.norm3.weight",
                f"{L0}.norm3.bias",
                f"{L0}.ffn.ffn.0.linear_layer.bias",
            ),
            "gpt-neox",
        ),
        # Bloom: ALiBi slopes and an embedding norm
        (
            _decoder(
                "relative_pe_helper.slopes",
                "embedding_ln_f.weight",
                "embedding_ln_f.bias",
                f"{L0}.self_attn.proj_q_dense_layer.bias",
                f"{L0}.norm3.weight",
                f"{L0}.ffn.ffn.0.linear_layer.bias",
            ),
            "bloom",
        ),
        # Falcon: one norm per layer, no linear biases
        (_decoder(), "falcon"),
    ],
)
def test_other_decoder_families(keys, family):
    guess = detect_family(keys)
    assert guess.family == family and guess.confidence == 1.0


def test_gptj_and_codegen_share_their_keys_so_confidence_is_halved():
    keys = _decoder(f"{L0}.ffn.ffn.0.linear_layer.bias", "lm_head.bias")
    guess = detect_family(keys)
    assert guess.family == "gptj" and guess.confidence == 0.5
    assert any("codegen" in line and "identical" in line for line in guess.evidence)


def test_partial_match_lowers_confidence():
    # GPT-2 whose attention has no biases: 9 of 10 signature checks hold
    keys = [k for k in fixture_keys("gpt2-2.0") if "self_attn" not in k or k.endswith("weight")]
    guess = detect_family(keys)
    assert guess.family == "gpt2" and guess.confidence == 0.9
    assert any("unlike gpt2: attention projection biases" in line for line in guess.evidence)


def test_unknown_model():
    guess = detect_family(["fc.weight", "fc.bias", "head.weight"])
    assert guess.family is None and guess.confidence == 0.0
    assert "no family's anchor keys" in guess.evidence[0]
    assert detect_family([]).family is None


def test_model_override_and_contradiction_warning():
    with read_checkpoint(MODELS / "gpt2-2.0" / "checkpoint_100.mdl") as ckpt:
        choice = choose_family(ckpt.root, "llama2")
        assert (choice.family, choice.variant, choice.source) == ("llama", "llama2", "--model")
        assert choice.guess.family == "gpt2"
        (warning,) = choice.warnings()
        assert "--model llama2" in warning and "gpt2" in warning
        assert choose_family(ckpt.root, "gpt2").warnings() == []
        assert choose_family(ckpt.root).source == "detected"


def test_upgrade_reports_the_family_and_model_overrides_it(tmp_path):
    src = MODELS / "bert-2.0" / "checkpoint_100.mdl"
    (tmp_path / "a").mkdir()
    proc = run_cli(
        "upgrade",
        "--drop-dataloader-state",
        str(src),
        "--output-dir",
        str(tmp_path / "a"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["family"] == "bert"
    assert res["model"]["source"] == "detected" and res["model"]["detected"]["confidence"] == 1.0
    assert any("position_embeddings.embed.weight" in c for c in res["changes"])
    # --model gpt2 on a BERT checkpoint: the GPT rules match no BERT key, so nothing is
    # renamed; the override is honoured and the report says the keys disagree.
    (tmp_path / "b").mkdir()
    proc = run_cli(
        "upgrade",
        "--drop-dataloader-state",
        str(src),
        "--output-dir",
        str(tmp_path / "b"),
        "--json",
        "--model",
        "gpt2",
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["family"] == "gpt2" and res["model"]["source"] == "--model"
    assert not any("position_embeddings" in c for c in res["changes"])
    assert any("look like bert" in w for w in res["warnings"])
    assert any("not in the gpt2 key tables" in w for w in res["warnings"])


@pytest.mark.parametrize(
    ("name", "guess"),
    [("gpt5", None), ("gpt-2", "did you mean gpt2?"), ("mistal", "did you mean mistral or")],
)
def test_unknown_model_name_is_a_one_line_usage_error(name, guess, tmp_path):
    src = MODELS / "gpt2-2.0" / "checkpoint_100.mdl"
    proc = run_cli(
        "upgrade",
        "--drop-dataloader-state",
        str(src),
        "--output-dir",
        str(tmp_path),
        "--model",
        name,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"unknown model '{name}'" in lines[0] and "known models" in lines[0]
    assert guess in lines[0] if guess else "did you mean" not in lines[0]
    assert not list(tmp_path.iterdir())


def test_plan_shows_the_family():
    src = MODELS / "t5-2.0" / "checkpoint_100.mdl"
    proc = run_cli("plan", str(src))
    assert proc.returncode == 0, proc.stderr
    assert "model: t5 (detected, confidence 1.00" in proc.stdout
    proc = run_cli("plan", str(src), "--model", "flan-ul2", "--json")
    data = json.loads(proc.stdout)
    assert data["model"]["family"] == "t5" and data["model"]["variant"] == "flan-ul2"
    assert any("position_embed_helper" in line for h in data["hops"] for line in h["changes"])


def test_unknown_family_upgrade_still_runs_every_other_step(tmp_path):
    src = Path(__file__).resolve().parent.parent / "fixtures" / "release-1.9.mdl"
    proc = run_cli(
        "upgrade", "--drop-dataloader-state", str(src), "--output-dir", str(tmp_path), "--json"
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res.get("family") is None and res["model"]["source"] == "unknown"
    # no key matches any family's rename rules: nothing is missed, so no warning says otherwise
    assert not any("model family unknown" in w for w in res["warnings"]), res["warnings"]
    assert any("restored as a tie" in c for c in res["changes"])  # 1.9→2.0 steps still ran


def test_unknown_family_warns_only_when_a_rename_may_be_missed(tmp_path):
    """A key some family's rules would rename, in a file whose family is not evident: the
    warning names the keys and --model."""
    import torch

    import ckpt_migrate

    src = tmp_path / "checkpoint_1.mdl"
    state = {"model": {"embedding_layer.position_embeddings.weight": torch.ones(2, 2)}}
    ckpt_migrate.save(state, src, release="2.0")
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("upgrade", str(src), "--output-dir", str(out), "--to", "2.1", "--json")
    assert proc.returncode == 0, proc.stderr
    warnings = json.loads(proc.stdout)["warnings"]
    said = [w for w in warnings if "model family unknown" in w]
    assert len(said) == 1 and "embedding_layer.position_embeddings.weight" in said[0], warnings
    assert "--model" in said[0] and "nothing is missed" not in said[0]


@pytest.mark.parametrize("release", ["1.9", "2.0"])
@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "t5"])
def test_one_expression_finds_the_key_a_match_per_key_finds(family, release):
    """``Feature.first_key`` over the keys as lines (one regular expression for 150k keys)
    names the same first key as matching each key in turn, prefixed keys and all."""
    keys = fixture_keys(f"{family}-{release}")
    keys = [*keys, *(f"model.{k}" for k in keys[:5]), "model.", "a..b", "x.7.y"]
    lines = key_lines(keys)
    assert lines is not None
    for feature in FEATURES.values():
        assert feature.first_key(keys, lines) == feature.first_key(keys)
    assert key_lines(["a\nb"]) is None  # (a key holding a line break: matched key by key)


def test_a_feature_whose_literal_text_no_key_holds_runs_no_expression(monkeypatch):
    """Keys of another naming (a MoE checkpoint's Hugging Face-style names) are told from
    each feature's literal text alone, as the expression would tell them: same answers."""
    keys = [f"model.layers.{i}.moe.experts.{e}.w{{w}}.weight" for i in range(4) for e in range(8)]
    keys = [k.replace("{w}", w) for k in keys for w in "123"] + ["lm_head.weight"]
    lines = key_lines(keys)
    from ckpt_migrate.models import detect

    assert detect._literals(("a.{b,c}.d.#.e.f", "{x,y}", "*.bias", "p.**")) == (
        "e.f",
        None,
        "bias",
        "p",
    )
    for feature in FEATURES.values():
        assert feature.first_key(keys, lines) == feature.first_key(keys) is None
    searched: list[tuple[str, ...]] = []
    real = detect._one_regex

    def spy(patterns: tuple[str, ...]):
        searched.append(patterns)
        return real(patterns)

    monkeypatch.setattr(detect, "_one_regex", spy)
    assert detect_family(keys).family is None
    # (only a feature with a pattern of no literal text is searched by its expression)
    assert searched == [FEATURES["encoder_decoder_embeddings"].patterns]
