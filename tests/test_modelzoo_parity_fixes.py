"""Issue #20, part A: the conversions where Model Zoo's own converter was right and ckpt-migrate
was not, and the fixture fields that did not match the real Model Zoo classes.

Each expected value is read from the named Model Zoo release's sources (tags of
github.com/Cerebras/modelzoo); the docstrings give file and line. Configs are read back with
PyYAML, the YAML 1.1 reader Model Zoo itself loads them with.
"""

from __future__ import annotations

import pytest
import yaml
from conftest import CONFIGS

from ckpt_migrate.config.upgrade import upgrade_config_text
from ckpt_migrate.config.yaml_edit import yaml11_float


def _upgrade(doc: dict, frm: str, to: str, family: str | None = "gpt2"):
    text = yaml.safe_dump(doc, sort_keys=False)
    return upgrade_config_text(text, frm, to, family=family)


# ---------------------------------------------------------------- sparsity globs (2.1 → 2.2)


@pytest.mark.parametrize(
    ("patterns", "expected"),
    [
        (".*proj_[qkv]_dense_layer.weight", "*proj_[qkv]_dense_layer.weight"),
        (
            [".*proj_[qkv]_dense_layer.weight", ".*ffn.*"],
            ["*proj_[qkv]_dense_layer.weight", "*ffn*"],
        ),
        (".*layers\\.[0-9]\\.attn.*", "*layers.[0-9].attn*"),
        (".*[^k]_dense_layer.weight", "*[!k]_dense_layer.weight"),
    ],
)
def test_regex_character_classes_become_fnmatch_classes(patterns, expected):
    """Model Zoo's ``regex_to_glob`` only replaces ``.*`` by ``*``, so a ``[qkv]`` class reaches
    ``param_filter`` unchanged (tag Release_2.2.0,
    src/cerebras/modelzoo/tools/checkpoint_converters/base_converter.py lines 1858-1860; the
    same code at Release_2.10.0 lines 2136-2138), and 2.2's filter is an fnmatch glob, where
    ``[qkv]`` is a class too and a negated ``[^k]`` is written ``[!k]``."""
    doc = {"sparsity": {"type": "static", "sparsity": 0.5, "param_name_patterns": patterns}}
    res = _upgrade(doc, "2.1", "2.2", family=None)
    got = yaml.safe_load(res.text)["sparsity"]
    assert got == {"sparsity": 0.5, "param_filter": expected}
    assert not [c for c in res.report if c.kind == "unknown"]


def test_a_regex_no_glob_expresses_is_still_kept_and_reported():
    doc = {"sparsity": {"sparsity": 0.5, "param_name_patterns": [".*[qkv]+_dense"]}}
    res = _upgrade(doc, "2.1", "2.2", family=None)
    assert yaml.safe_load(res.text)["sparsity"]["param_name_patterns"] == [".*[qkv]+_dense"]
    assert any(c.kind == "unknown" and "[qkv]+" in c.why for c in res.report)


# ---------------------------------------------------------------- ConstantLR (2.2 → 2.3)


@pytest.mark.parametrize("written", ["2.0e-5", "2e-5", "0.0001", "1"])
def test_constant_learning_rate_is_a_float_for_pyyaml(written):
    """2.3's ``convert_legacy_params_to_trainer_params`` writes ``ConstantLR`` with
    ``learning_rate: float(optimizer.learning_rate)`` (tag Release_2.3.0,
    src/cerebras/modelzoo/trainer/utils.py lines 1016-1021) and dumps it with PyYAML; the
    value must read back as that float, not as the string ``2e-05``."""
    text = (
        "train_input: {batch_size: 4}\n"
        "model: {hidden_size: 8}\n"
        f"optimizer: {{optimizer_type: AdamW, learning_rate: {written}}}\n"
    )
    res = upgrade_config_text(text, "2.2", "2.3", family="gpt2")
    schedulers = yaml.safe_load(res.text)["trainer"]["init"]["schedulers"]
    rate = schedulers[0]["ConstantLR"]["learning_rate"]
    assert isinstance(rate, float) and rate == float(written)


def test_llama_fixture_learning_rate_reads_back_as_a_float():
    res = upgrade_config_text((CONFIGS / "llama-1.9.yaml").read_text(), "1.9", "2.3")
    init = yaml.safe_load(res.text)["trainer"]["init"]
    assert init["schedulers"] == [{"ConstantLR": {"learning_rate": 2.0e-5}}]


@pytest.mark.parametrize(
    ("value", "text"),
    [(2e-05, "2.0e-05"), (1e20, "1.0e+20"), (0.00028, "0.00028"), (3.0, "3.0")],
)
def test_yaml11_float_text(value, text):
    assert yaml11_float(value) == text
    assert yaml.safe_load(text) == value


# ---------------------------------------------------------------- precision keys (2.3, 2.4)

LEGACY = {
    "train_input": {"batch_size": 4},
    "model": {"hidden_size": 8, "mixed_precision": True, "fp16_type": "cbfloat16"},
    "optimizer": {"optimizer_type": "SGD", "learning_rate": 0.1},
}


@pytest.mark.parametrize("target", ["2.3", "2.4"])
def test_model_keeps_mixed_precision_and_fp16_type_for_2_3_and_2_4(target):
    """Model Zoo 2.3 and 2.4 map ``model.mixed_precision`` / ``fp16_type`` into
    ``trainer.init.precision`` and copy them back into the model (tag Release_2.3.0,
    src/cerebras/modelzoo/trainer/utils.py lines 1034-1050; Release_2.4.0, the same file, lines
    892-908)."""
    res = _upgrade(LEGACY, "2.2", target)
    init = yaml.safe_load(res.text)["trainer"]["init"]
    assert init["precision"] == {"enabled": True, "fp16_type": "cbfloat16"}
    assert init["model"]["mixed_precision"] is True
    assert init["model"]["fp16_type"] == "cbfloat16"


def test_2_5_reads_precision_only_from_the_precision_section():
    """2.5 prunes ``init.model.mixed_precision`` / ``init.model.fp16_type`` (tag Release_2.5.0,
    src/cerebras/modelzoo/trainer/utils.py lines 682-686) and its config classes forbid unknown
    fields (src/cerebras/modelzoo/config/base_config.py line 36)."""
    res = _upgrade(LEGACY, "2.2", "2.5")
    init = yaml.safe_load(res.text)["trainer"]["init"]
    assert init["precision"] == {"enabled": True, "fp16_type": "cbfloat16"}
    assert "mixed_precision" not in init["model"] and "fp16_type" not in init["model"]
    # a 2.4 config with the copies (as Model Zoo 2.4 writes it) loses them at 2.5
    from_2_4 = _upgrade(LEGACY, "2.2", "2.4").text
    res = upgrade_config_text(from_2_4, "2.4", "2.5", family="gpt2")
    removed = {c.key for c in res.report if c.kind == "removed"}
    assert removed == {"trainer.init.model.mixed_precision", "trainer.init.model.fp16_type"}


def test_2_5_moves_a_model_only_precision_key_and_keeps_a_contradiction():
    doc = {
        "trainer": {
            "init": {
                "model": {"name": "gpt2", "mixed_precision": True, "fp16_type": "float16"},
                "precision": {"fp16_type": "bfloat16"},
            }
        }
    }
    res = _upgrade(doc, "2.4", "2.5")
    init = yaml.safe_load(res.text)["trainer"]["init"]
    assert init["precision"] == {"fp16_type": "bfloat16", "enabled": True}
    assert init["model"] == {"name": "gpt2", "fp16_type": "float16"}
    assert any(c.kind == "unknown" and c.key == "trainer.init.model.fp16_type" for c in res.report)


# ---------------------------------------------------------------- fixture field names


@pytest.mark.parametrize("name", ["t5-1.7.yaml", "t5-2.0.yaml"])
def test_t5_fixtures_name_the_field_the_t5_processor_reads(name):
    """``T5DynamicDataProcessor`` reads ``params["src_data_dir"]`` (tag R_1.7.1,
    modelzoo/transformers/pytorch/t5/input/T5DynamicDataProcessor.py line 108; Release_2.0.2
    line 109); it has no ``data_dir``."""
    doc = yaml.safe_load((CONFIGS / name).read_text())
    for section in ("train_input", "eval_input"):
        assert doc[section]["data_processor"] == "T5DynamicDataProcessor"
        assert "src_data_dir" in doc[section] and "data_dir" not in doc[section]


def test_attention_sink_tokens_is_a_gpt2_field_from_2_4_on():
    """``GPT2LMHeadModel``'s config gained ``attention_sink_tokens`` in 2.4 (tag Release_2.4.0,
    src/cerebras/modelzoo/models/nlp/gpt2/gpt2_model.py line 180; 2.10: line 193); 2.3's
    ``GPT2ModelConfig`` does not have it."""
    doc = {"model": {"hidden_size": 8, "attention_sink_tokens": 4}}
    to_2_3 = _upgrade(doc, "2.2", "2.3")
    unknown = [c for c in to_2_3.report if c.kind == "unknown"]
    assert [c.key for c in unknown] == ["model.attention_sink_tokens"]
    assert "from 2.4 on" in unknown[0].why
    to_2_10 = _upgrade(doc, "2.2", "2.10")
    assert not [c for c in to_2_10.report if c.kind == "unknown"]
    assert yaml.safe_load(to_2_10.text)["trainer"]["init"]["model"]["attention_sink_tokens"] == 4


def test_norm_first_goes_at_2_5():
    """2.5's decoder configs have no norm_first (pre-LN only) and forbid unknown fields:
    ``true`` is removed, ``false`` is kept and reported (Release_2.5.0 gpt2_model.py)."""
    text = "model:\n  hidden_size: 4\n  norm_first: true\n"
    done = upgrade_config_text(text, "2.2", "2.10", family="llama")
    assert "norm_first" not in done.text
    assert any(c.kind == "removed" and c.key.endswith("norm_first") for c in done.report)
    post = upgrade_config_text("model:\n  norm_first: false\n", "2.2", "2.10", family="llama")
    assert "norm_first: false" in post.text
    assert any(c.kind == "unknown" and c.key.endswith("norm_first") for c in post.report)
