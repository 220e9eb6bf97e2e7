"""params.yaml upgrades: every hop's config steps, the report, comments and key order kept.

The expected outputs in fixtures/configs/*.expected.yaml were written by hand from the tables
(MODELZOO_HISTORY.md §3.6, §4.5, §5 and Model Zoo's trainer mapping), not by this code.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from conftest import CONFIGS, FIXTURES, MODELS, run_cli

from ckpt_migrate.config import yaml_edit
from ckpt_migrate.config.upgrade import (
    ConfigChange,
    family_from_config,
    upgrade_config_file,
    upgrade_config_text,
)
from ckpt_migrate.errors import CkptError, UsageError
from ckpt_migrate.hops import graph


def run(name: str, frm: str, to: str, **kw):
    return upgrade_config_text((CONFIGS / name).read_text(), frm, to, **kw)


def structure(text: str) -> str:
    """The document as plain data, order-sensitive (json keeps insertion order)."""
    data, _ = yaml_edit.load(text)
    return json.dumps(yaml_edit.plain(data), indent=1)


def entry(report: list[ConfigChange], kind: str, key: str, hop: str | None = None):
    found = [c for c in report if c.kind == kind and c.key == key and hop in (None, c.hop)]
    assert found, f"no {kind} {key} ({hop}) in:\n" + "\n".join(c.line() for c in report)
    return found[0]


def line_of(text: str, needle: str) -> int:
    lines = text.splitlines()
    return next(i for i, line in enumerate(lines) if needle in line)


def indent_of(text: str, needle: str) -> int:
    line = text.splitlines()[line_of(text, needle)]
    return len(line) - len(line.lstrip())


# ---------------------------------------------------------------- hand-written expected outputs


def test_gpt2_2_0_to_2_10_matches_the_hand_written_expectation():
    res = run("gpt2-2.0.yaml", "2.0", "2.10", family="gpt2")
    expected = (CONFIGS / "gpt2-2.0.to-2.10.expected.yaml").read_text()
    assert structure(res.text) == structure(expected)
    # valid YAML for any loader; validate/validate_all share fit's val_dataloader (an alias)
    plain = yaml.safe_load(res.text)
    trainer = plain["trainer"]
    assert trainer["validate"]["val_dataloader"] == trainer["fit"]["val_dataloader"]
    assert list(plain) == ["trainer", "runconfig"]
    assert list(trainer["init"]) == [
        "seed",
        "model",
        "optimizer",
        "schedulers",
        "precision",
        "loop",
        "checkpoint",
        "logging",
        "callbacks",
    ]


def test_gpt2_comments_survive_where_they_belong():
    text = run("gpt2-2.0.yaml", "2.0", "2.10", family="gpt2").text
    for comment in (
        "# GPT-2 small (117M) pretraining on OpenWebText, as run on Cerebras 2.0.",
        "# The effective batch size, which is evenly divided across",
        "# Important to avoid seeding at each epoch",
        "# Embedding",
        "# Decoder - Attention",
        "# Cerebras parameters",
        "# warm-up",
        "# bf16 weights and activations",
        "# POL 1: faster, slightly less precise",
        "# one checkpoint every 5k steps",
        "# not a Model Zoo key",
        "# site-specific, not a Model Zoo key",
    ):
        assert comment in text, comment
    assert text.startswith("# GPT-2 small")  # the header stays on top
    # section comments sit right above the keys they describe, at their indentation
    assert line_of(text, "# Embedding") == line_of(text, "name: gpt2") + 1
    assert line_of(text, "vocab_size: 50257") == line_of(text, "# Embedding") + 1
    assert indent_of(text, "# Embedding") == indent_of(text, "vocab_size: 50257") == 12
    effective = line_of(text, "# The effective batch size")
    assert "batch_size: 112" in text.splitlines()[effective + 1]
    assert indent_of(text, "# The effective batch size") == indent_of(text, "batch_size: 112")
    # end-of-line comments follow their (moved or renamed) keys
    assert "# bf16 weights and activations" in text.splitlines()[line_of(text, "fp16_type:")]
    assert "# warm-up" in text.splitlines()[line_of(text, "total_iters: 2000")]
    assert "# one checkpoint" in text.splitlines()[line_of(text, "steps: 5000")]
    # quoting and boolean spelling of untouched values are the file's
    assert 'data_processor: "GptHDF5DataProcessor"' in text
    assert "shuffle: True" in text and "true" not in text.replace("True", "")


def test_gpt2_report_names_every_change_with_its_hop():
    res = run("gpt2-2.0.yaml", "2.0", "2.10", family="gpt2")
    r = res.report
    assert entry(r, "removed", "runconfig.save_losses", "2.0→2.1").old is True
    assert entry(r, "removed", "runconfig.num_wgt_servers", "2.0→2.1").old == 12
    assert entry(r, "removed", "csconfig", "2.0→2.1").old == {"num_csx": 1}
    lcs = entry(r, "changed", "runconfig.is_pretrained_checkpoint", "2.0→2.1")
    assert lcs.moved_to == "runconfig.load_checkpoint_states" and lcs.new == "model,dataloader"
    betas = entry(r, "changed", "optimizer.beta1+beta2", "2.0→2.1")
    assert betas.moved_to == "optimizer.betas" and betas.new == [0.9, 0.999]
    assert entry(r, "changed", "optimizer.weight_decay_rate").moved_to == "optimizer.weight_decay"
    steps = entry(r, "changed", "optimizer.learning_rate[0].steps", "2.0→2.1")
    assert steps.moved_to == "optimizer.learning_rate[0].total_iters"
    fp16 = entry(r, "changed", "model.use_bfloat16", "2.0→2.1")
    assert (fp16.old, fp16.new, fp16.moved_to) == (True, "bfloat16", "model.fp16_type")
    assert entry(r, "removed", "runconfig.use_cs_grad_accum", "2.1→2.2").old is True
    assert entry(r, "added", "train_input.micro_batch_size", "2.1→2.2").new == "auto"
    assert entry(r, "removed", "model.use_position_embedding", "2.2→2.3").old is True
    assert entry(r, "changed", "runconfig.max_steps", "2.2→2.3").moved_to == (
        "trainer.init.loop.max_steps"
    )
    assert entry(r, "changed", "model", "2.2→2.3").moved_to == "trainer.init.model"
    unknown = entry(r, "unknown", "runconfig.cluster_queue", "2.2→2.3")
    assert unknown.old == "lab-7" and "kept under runconfig" in unknown.why
    assert entry(r, "added", "trainer.init.model.name", "2.3→2.4").new == "gpt2"
    assert all(c.hop for c in r)
    assert res.family == "gpt2" and res.family_source == "from --model"
    lines = res.lines()
    assert lines[0] == "config 2.0 → 2.10, model family gpt2 (from --model)"
    assert lines[-1].strip().endswith("0 note") and "2 unknown" in lines[-1]
    site = entry(r, "unknown", "model.site_note", "2.2→2.3")
    assert site.old == "tuned by team A" and "GPT2ModelConfig" in site.why
    data = json.loads(json.dumps(res.to_json()))
    assert {e["kind"] for e in data["report"]} == {"changed", "added", "removed", "unknown"}


def test_t5_2_0_to_2_10_matches_the_hand_written_expectation():
    res = run("t5-2.0.yaml", "2.0", "2.10", family="t5")
    expected = (CONFIGS / "t5-2.0.to-2.10.expected.yaml").read_text()
    assert structure(res.text) == structure(expected)
    text = res.text
    assert text.startswith("# T5-small pretraining on C4")
    for comment in (
        "# Encoder / decoder",
        "# 2.0 name of use_t5_layer_norm: true",
        "# Adafactor keeps beta1 under its own name",
        "# linear warm-up, then 1/sqrt(step)",
        "# all dense layers",
        "# The effective batch size across all systems (1.9+)",
    ):
        assert comment in text, comment
    assert "# all dense layers" in text.splitlines()[line_of(text, "param_filter:")]
    assert indent_of(text, "# Encoder / decoder") == indent_of(text, "d_model: 512") == 6
    r = res.report
    eps = entry(r, "changed", "optimizer.eps1+eps2", "2.0→2.1")
    assert eps.new == [1e-30, 1e-3]
    assert not [c for c in r if c.key.startswith("optimizer.beta1")]  # Adafactor's own argument
    assert entry(r, "removed", "sparsity.algorithm", "2.1→2.2").old == "static"
    pf = entry(r, "changed", "sparsity.param_name_patterns", "2.1→2.2")
    assert (pf.old, pf.new) == (".*dense_layer.weight", "*dense_layer.weight")
    assert entry(r, "removed", "runconfig.mode", "2.2→2.3").old == "train"
    assert entry(r, "added", "trainer.init.model.name", "2.3→2.4").new == "t5"


def test_t5_1_7_to_2_0_matches_and_keeps_the_file_as_it_was():
    res = run("t5-1.7.yaml", "1.7", "2.0", family="t5", num_csx=2)
    source = (CONFIGS / "t5-1.7.yaml").read_text()
    expected = (CONFIGS / "t5-1.7.to-2.0.expected.yaml").read_text()
    assert structure(res.text) == structure(expected)
    r = res.report
    flip = entry(r, "changed", "model.use_pre_encoder_decoder_layer_norm", "1.7→1.8")
    assert (flip.old, flip.new) == (True, False)
    batch = entry(r, "changed", "train_input.batch_size", "1.8→1.9")
    assert (batch.old, batch.new) == (128, 256)
    norm = entry(r, "changed", "model.use_t5_layer_norm", "1.9→2.0")
    assert (norm.moved_to, norm.new) == ("model.norm_type", "rmsnorm")
    assert entry(r, "removed", "runconfig.experimental_api", "1.9→2.0").old is True
    assert entry(r, "removed", "cerebras", "1.9→2.0").old == {
        "save_iter_state_path": "./model_dir/data_iter"
    }
    assert entry(r, "changed", "runconfig.keep_checkpoint_max").moved_to == (
        "runconfig.max_checkpoints"
    )
    # the legacy layout stays: lines no step touched are byte-for-byte the source's
    touched = ("batch_size", "norm_type", "use_pre_encoder", "max_checkpoints")
    kept = [line for line in res.text.splitlines() if not any(t in line for t in touched)]
    source_lines = set(source.splitlines())
    assert all(line in source_lines for line in kept), [
        line for line in kept if line not in source_lines
    ]
    assert "# RMS norm, as in the T5 paper" in res.text.splitlines()[line_of(res.text, "norm_type")]


# ---------------------------------------------------------------- 1.7 → 1.8, 1.8 → 1.9


def test_bert_1_8_nonlinearities_are_added_after_encoder_nonlinearity():
    res = run("bert-1.7.yaml", "1.7", "1.8", family="bert")
    text = res.text
    i = line_of(text, "encoder_nonlinearity:")
    assert "# also the pooler's, in 1.7" in text.splitlines()[i]
    assert yaml.safe_load(text.splitlines()[i + 1]) == {"pooler_nonlinearity": "gelu"}
    assert yaml.safe_load(text.splitlines()[i + 2]) == {"mlm_nonlinearity": "gelu"}
    assert entry(res.report, "added", "model.pooler_nonlinearity", "1.7→1.8").new == "gelu"
    assert entry(res.report, "added", "model.mlm_nonlinearity", "1.7→1.8").new == "gelu"


def test_bert_1_8_without_encoder_nonlinearity_is_reported_not_invented():
    text = "model:\n  disable_nsp: false\n  pooler_nonlinearity: tanh\n"
    res = upgrade_config_text(text, "1.7", "1.8", family="bert")
    assert entry(res.report, "unknown", "model.pooler_nonlinearity").old == "tanh"
    assert yaml.safe_load(res.text)["model"] == {
        "disable_nsp": False,
        "pooler_nonlinearity": "tanh",
        "mlm_nonlinearity": "gelu",
    }
    res = upgrade_config_text("model:\n  disable_nsp: false\n", "1.7", "1.8", family="bert")
    assert "encoder_nonlinearity" in entry(res.report, "note", "model.pooler_nonlinearity").why


def test_t5_flag_missing_in_1_7_is_a_note():
    res = upgrade_config_text("model:\n  d_kv: 64\n", "1.7", "1.8", family="transformer")
    note = entry(res.report, "note", "model.use_pre_encoder_decoder_layer_norm", "1.7→1.8")
    assert "opposite meaning" in note.why
    assert res.text == "model:\n  d_kv: 64\n"


def test_batch_size_without_num_csx_is_reported_not_changed():
    source = (CONFIGS / "t5-1.7.yaml").read_text().replace("num_csx: 2", "num_csx: 4")
    res = upgrade_config_text(source, "1.8", "1.9", family="t5")
    note = entry(res.report, "note", "train_input.batch_size", "1.8→1.9")
    assert "--num-csx" in note.why and "left at 128" in note.why
    assert yaml.safe_load(res.text)["train_input"]["batch_size"] == 128
    res = upgrade_config_text(source, "1.8", "1.9", num_csx=1)
    assert "one system" in entry(res.report, "note", "eval_input.batch_size").why
    with pytest.raises(UsageError, match="--num-csx"):
        upgrade_config_text(source, "1.8", "1.9", num_csx=0)


# ---------------------------------------------------------------- 1.9 → 2.0


@pytest.mark.parametrize(
    ("name", "family", "expected"),
    [
        ("gptj-1.9.yaml", None, "biasless-layernorm"),  # family from the config's keys
        ("gptj-1.9.yaml", "gpt-neox", "biasless-layernorm"),
        ("llama-1.9.yaml", "llama", "rmsnorm"),
        ("llama-1.9.yaml", None, "rmsnorm"),  # use_rms_norm alone decides its rule
    ],
)
def test_norm_flags_become_norm_type_in_place(name, family, expected):
    res = run(name, "1.9", "2.0", family=family)
    model = yaml.safe_load(res.text)["model"]
    assert model["norm_type"] == expected
    assert "use_biasless_norm" not in model and "use_rms_norm" not in model
    text = res.text
    comment = "# 2.0: norm_type biasless-layernorm" if "gptj" in name else "# Llama uses RMSNorm"
    assert comment in text.splitlines()[line_of(text, "norm_type:")]
    src_keys = list(yaml.safe_load((CONFIGS / name).read_text())["model"])
    flag = "use_biasless_norm" if "gptj" in name else "use_rms_norm"
    assert list(model).index("norm_type") == src_keys.index(flag)  # same position


def test_norm_defaults_follow_model_zoo():
    gpt2 = upgrade_config_text("model:\n  hidden_size: 8\n", "1.9", "2.0", family="gpt2")
    assert yaml.safe_load(gpt2.text)["model"]["norm_type"] == "layernorm"
    assert entry(gpt2.report, "added", "model.norm_type", "1.9→2.0").new == "layernorm"
    for family in ("gptj", "codegen", "t5"):
        res = upgrade_config_text("model:\n  hidden_size: 8\n", "1.9", "2.0", family=family)
        assert "norm_type" not in yaml.safe_load(res.text)["model"]
        assert "sets no default" in entry(res.report, "note", "model.norm_type").why
    conflict = "model:\n  use_rms_norm: true\n  norm_type: layernorm\n"
    res = upgrade_config_text(conflict, "1.9", "2.0", family="llama")
    assert "conflicts" in entry(res.report, "unknown", "model.use_rms_norm").why
    assert yaml.safe_load(res.text)["model"] == {"use_rms_norm": True, "norm_type": "layernorm"}
    other = upgrade_config_text("model:\n  use_t5_layer_norm: true\n", "1.9", "2.0", family="gpt2")
    assert entry(other.report, "unknown", "model.use_t5_layer_norm")


@pytest.mark.parametrize(
    ("frm", "to", "family", "flag", "key", "true_value"),
    [
        ("1.9", "2.0", "llama", "use_rms_norm", "norm_type", "rmsnorm"),
        ("2.0", "2.1", "gpt2", "use_bfloat16", "fp16_type", "bfloat16"),
    ],
)
def test_a_flag_whose_new_key_is_already_set(frm, to, family, flag, key, true_value):
    agree = upgrade_config_text(
        f"model:\n  {flag}: true\n  {key}: {true_value}\n", frm, to, family=family
    )
    assert yaml.safe_load(agree.text)["model"] == {key: true_value}
    assert f"{key} already says" in entry(agree.report, "removed", f"model.{flag}").why
    clash = upgrade_config_text(
        f"model:\n  {flag}: false\n  {key}: {true_value}\n", frm, to, family=family
    )
    assert yaml.safe_load(clash.text)["model"] == {flag: False, key: true_value}
    assert "both kept" in entry(clash.report, "unknown", f"model.{flag}").why


def test_runconfig_cleanup_writes_a_string_2_0_can_split():
    text = (
        "runconfig:\n"
        "  is_pretrained_checkpoint: true # load weights only\n"
        "  keep_checkpoint_max: 4\n"
        "  max_checkpoints: 2\n"
        "  service_dir: /tmp/svc\n"
    )
    res = upgrade_config_text(text, "1.9", "2.0")
    run_cfg = yaml.safe_load(res.text)["runconfig"]
    assert run_cfg == {"load_checkpoint_states": "model,dataloader", "max_checkpoints": 2}
    assert "# load weights only" in res.text
    assert (
        "max_checkpoints (2)" in entry(res.report, "removed", "runconfig.keep_checkpoint_max").why
    )
    assert entry(res.report, "removed", "runconfig.service_dir", "1.9→2.0").old == "/tmp/svc"


def test_mixed_precision_is_never_injected():
    res = upgrade_config_text("model:\n  hidden_size: 8\n", "1.9", "2.0")
    assert "mixed_precision" not in res.text
    assert "inject" in entry(res.report, "note", "model.mixed_precision", "1.9→2.0").why


# ---------------------------------------------------------------- 2.0 → 2.1


def test_optimizer_aliases_only_where_the_optimizer_has_the_argument():
    def opt(body: str, frm="2.0", to="2.1"):
        res = upgrade_config_text(f"optimizer:\n{body}", frm, to)
        return yaml.safe_load(res.text)["optimizer"], res

    got, _ = opt("  optimizer_type: Rprop\n  eta1: 0.5\n  eta2: 1.2\n  step_size_min: 1.0e-6\n")
    assert got == {"optimizer_type": "Rprop", "etas": [0.5, 1.2], "step_size_min": 1e-6}
    got, res = opt("  optimizer_type: Adam\n  beta1: 0.9\n  weight_decay_rate: 0.1\n")
    assert got == {"optimizer_type": "Adam", "beta1": 0.9, "weight_decay": 0.1}
    assert "only some are set" in entry(res.report, "unknown", "optimizer.beta1").why
    got, _ = opt("  optimizer_type: Adafactor\n  beta1: 0.0\n  eps1: 1.0e-30\n  eps2: 0.001\n")
    assert got == {"optimizer_type": "Adafactor", "beta1": 0.0, "eps": [1e-30, 0.001]}
    got, res = opt("  optimizer_type: MyOpt\n  weight_decay_rate: 0.1\n")
    assert got == {"optimizer_type": "MyOpt", "weight_decay_rate": 0.1}
    assert (
        "not in the argument table"
        in entry(res.report, "unknown", "optimizer.weight_decay_rate").why
    )
    got, _ = opt("  optimizer_type: SGD\n  weight_decay_rate: 0.1\n  weight_decay: 0.2\n")
    assert got["weight_decay"] == 0.2 and got["weight_decay_rate"] == 0.1  # new name wins


def test_scheduler_aliases_follow_each_schedulers_arguments():
    text = (
        "optimizer:\n"
        "  optimizer_type: SGD\n"
        "  learning_rate:\n"
        "    - {scheduler: Constant, learning_rate: 0.1, steps: 10}\n"
        "    - {scheduler: Exponential, learning_rate: 0.1, decay_steps: 5, decay_rate: 0.5}\n"
        "    - {scheduler: PiecewiseConstant, values: [0.1, 0.01], boundaries: [100]}\n"
        "    - {scheduler: Cyclic, learning_rate: 0.1, max_lr: 1.0}\n"
        "    - {scheduler: CosineAnnealing, learning_rate: 0.1, t_max: 100}\n"
        "    - {scheduler: Wobbly, steps: 3}\n"
    )
    res = upgrade_config_text(text, "2.0", "2.1")
    got = yaml.safe_load(res.text)["optimizer"]["learning_rate"]
    assert got[0] == {"scheduler": "Constant", "learning_rate": 0.1, "total_iters": 10}
    assert got[1] == {
        "scheduler": "Exponential",
        "initial_learning_rate": 0.1,
        "total_iters": 5,
        "decay_rate": 0.5,
    }
    assert got[2] == {
        "scheduler": "PiecewiseConstant",
        "learning_rates": [0.1, 0.01],
        "milestones": [100],
    }
    assert got[3] == {"scheduler": "Cyclic", "base_lr": 0.1, "max_lr": 1.0}
    assert got[4] == {"scheduler": "CosineAnnealing", "initial_learning_rate": 0.1, "T_max": 100}
    assert got[5] == {"scheduler": "Wobbly", "steps": 3}
    assert entry(res.report, "unknown", "optimizer.learning_rate[5].scheduler").old == "Wobbly"


def test_precision_opt_level_and_fp16_type():
    text = "model:\n  precision_opt_level: 2 # POL\n  use_bfloat16: false\nrunconfig:\n  seed: 1\n"
    res = upgrade_config_text(text, "2.0", "2.1")
    got = yaml.safe_load(res.text)
    assert got == {
        "model": {"fp16_type": "float16"},
        "runconfig": {"seed": 1, "precision_opt_level": 2},
    }
    assert "# POL" in res.text.splitlines()[line_of(res.text, "precision_opt_level")]
    res = upgrade_config_text("model:\n  precision_opt_level: 1\n", "2.0", "2.1")
    assert yaml.safe_load(res.text) == {"model": {}, "runconfig": {"precision_opt_level": 1}}


def test_2_1_0_retention_note_only_when_stopping_at_2_1():
    text = "runconfig:\n  seed: 1\n"
    assert entry(
        upgrade_config_text(text, "2.0", "2.1").report, "note", "runconfig.max_checkpoints"
    )
    later = upgrade_config_text(text, "2.0", "2.2").report
    assert not [c for c in later if c.key == "runconfig.max_checkpoints"]


# ---------------------------------------------------------------- 2.1 → 2.2


def test_grad_accum_and_autogen_policy():
    text = (
        "train_input:\n  batch_size: 8\neval_input:\n  batch_size: 8\n  micro_batch_size: 2\n"
        "runconfig:\n  use_cs_grad_accum: false\n  autogen_policy: medium\n"
    )
    got = yaml.safe_load(upgrade_config_text(text, "2.1", "2.2").text)
    assert got["train_input"] == {"batch_size": 8, "micro_batch_size": None}
    assert got["eval_input"] == {"batch_size": 8, "micro_batch_size": None}
    assert got["runconfig"] == {}
    text = text.replace("false", "true")
    got = yaml.safe_load(upgrade_config_text(text, "2.1", "2.2").text)
    assert got["train_input"]["micro_batch_size"] == "auto"
    assert got["eval_input"]["micro_batch_size"] == 2  # an explicit value stays


@pytest.mark.parametrize(
    ("sparsity", "expected"),
    [
        ({"type": "static", "sparsity": 0.3}, 0.3),
        (
            {"type": "gmp", "init_sparsity": 0.0, "schedule": 2000},
            {"algorithm": "gmp", "init_sparsity": 0.0, "update": {"freq": 2000}},
        ),
        ({"type": "set", "schedule": 1}, {"algorithm": "set"}),
        (
            {"type": "gmp", "sparsity_schedule": [[0, 0.0], [1000, 0.5]]},
            {"algorithm": "gmp", "schedule": [0.0, 0.5], "update": {"steps": [0, 1000]}},
        ),
        (
            {"type": "rigl", "sparsity": {"type": "cosine", "init": 0.9}},
            {"algorithm": "rigl", "schedule": {"type": "cosine", "init": 0.9}},
        ),
        (
            {"sparsity": 0.5, "param_name_patterns": [".*attn.*", "lm_head\\.weight"]},
            {"sparsity": 0.5, "param_filter": ["*attn*", "lm_head.weight"]},
        ),
        (
            {
                "sparsity": 0.5,
                "param_name_patterns": {".*fc.*": {"sparsity": 0.9}, ".*proj.*": None},
            },
            [
                {"param_filter": "*fc*", "sparsity": 0.9},
                {"param_filter": "*proj*", "sparsity": 0.5},
            ],
        ),
    ],
)
def test_sparsity_schema_2_2(sparsity, expected):
    text = yaml.safe_dump({"sparsity": sparsity}, sort_keys=False)
    got = yaml.safe_load(upgrade_config_text(text, "2.1", "2.2").text)["sparsity"]
    assert got == expected


def test_unconvertible_regex_is_kept_and_reported():
    text = "sparsity:\n  sparsity: 0.5\n  param_name_patterns: '(attn|ffn)\\.weight$'\n"
    res = upgrade_config_text(text, "2.1", "2.2")
    assert yaml.safe_load(res.text)["sparsity"]["param_name_patterns"] == "(attn|ffn)\\.weight$"
    assert "by hand" in entry(res.report, "unknown", "sparsity.param_name_patterns").why


# ---------------------------------------------------------------- 2.2 → 2.3, 2.3 → 2.4


def test_trainer_layout_places_runconfig_callbacks_and_loggers():
    text = """\
train_input:
  batch_size: 4
eval_input:
  batch_size: 4
model:
  hidden_size: 8
  lora_params: {r: 4}
optimizer:
  optimizer_type: SGD
  learning_rate:
    - {scheduler: Linear, main_scheduler: chained, total_iters: 10}
    - {scheduler: Constant, main_scheduler: chained, learning_rate: 0.1}
  grad_accum_steps: 2
  adjust_learning_rate: {decoder_kernel: 0.5}
sparsity:
  algorithm: gmp
  add_summaries: true
runconfig:
  mode: train_and_eval
  target_device: CSX
  num_csx: 2
  num_workers_per_csx: 1
  mount_dirs: [/data]
  checkpoint_path: ./ckpt/checkpoint_100.mdl
  log_input_summaries: false
  check_loss_values: true
  transfer_processes: 4
  summary_dir: ./tb
  experimental:
    listeners:
      - {listener_type: NormListener, every: 10}
wandb:
  project: demo
  color: blue
extra_section:
  a: 1
"""
    res = upgrade_config_text(text, "2.2", "2.3")
    got = yaml.safe_load(res.text)
    init = got["trainer"]["init"]
    assert init["backend"] == {
        "backend_type": "CSX",
        "cluster_config": {"num_csx": 2, "mount_dirs": ["/data"], "num_workers_per_csx": 1},
    }
    assert init["model"] == {"hidden_size": 8}
    assert init["optimizer"] == {"SGD": {"adjust_learning_rate": {"decoder_kernel": 0.5}}}
    assert init["schedulers"] == [
        {
            "ScalePerParamLR": {
                "scheduler": {
                    "ChainedScheduler": {
                        "schedulers": [
                            {"LinearLR": {"total_iters": 10}},
                            {"ConstantLR": {"learning_rate": 0.1}},
                        ]
                    }
                }
            }
        }
    ]
    assert init["loop"] == {"grad_accum_steps": 2}
    assert init["sparsity"] == {"algorithm": "gmp", "add_summaries": True}
    assert init["callbacks"] == [
        {"GlobalFlags": {"csx.performance.transfer_processes": 4}},
        {"Lora": {"lora_params": {"r": 4}}},
        {"LogInputSummaries": None},
        {"CheckLoss": {}},
        {"LogSparsity": {}},
        {"NormListener": {"every": 10}},
    ]
    assert init["loggers"] == [
        {"TensorBoardLogger": {"summary_dir": "./tb"}},
        {"WandbLogger": {"project": "demo"}},
    ]
    assert list(init)[-2:] == ["callbacks", "loggers"]
    trainer = got["trainer"]
    assert trainer["fit"]["ckpt_path"] == "./ckpt/checkpoint_100.mdl"
    assert trainer["validate"]["ckpt_path"] == "./ckpt/checkpoint_100.mdl"
    assert trainer["validate_all"]["ckpt_paths"] == "./ckpt/checkpoint_100.mdl"
    assert trainer["validate"]["val_dataloader"] == {"batch_size": 4}
    assert got["wandb"] == {"color": "blue"} and got["extra_section"] == {"a": 1}
    assert "runconfig" not in got
    assert entry(res.report, "unknown", "wandb.color", "2.2→2.3")
    assert entry(res.report, "unknown", "extra_section", "2.2→2.3")
    assert entry(res.report, "removed", "runconfig.mode", "2.2→2.3")


def test_a_config_already_in_the_trainer_layout_skips_the_legacy_steps():
    text = "trainer:\n  init:\n    model:\n      use_rms_norm: true\n"
    res = upgrade_config_text(text, "1.9", "2.4", family="llama")
    got = yaml.safe_load(res.text)["trainer"]["init"]["model"]
    assert got == {"name": "llama", "use_rms_norm": True}
    note = entry(res.report, "note", "trainer")
    assert "1.9→2.0" in note.why and "2.1→2.2" in note.why
    assert entry(res.report, "note", "trainer", "2.2→2.3")  # nothing to restructure


@pytest.mark.parametrize(
    ("family", "source", "name"),
    [
        ("transformer", None, "transformer"),
        ("bert-sequence-classifier", None, "bert/classifier"),
        ("gpt-neox", None, "gpt-neox"),  # its own registry.yaml entry (2.4, 2.10), not gptj
        ("llama", "checkpoint keys", "llama"),
        ("bert", "checkpoint keys", None),  # fine-tuning variants share the keys
        ("t5", "checkpoint keys", None),  # so do T5 and Transformer
        ("codegen", None, "gptj"),  # Model Zoo 2.10 registry.py _model_aliases, line 344
        ("bert-qa", None, None),  # no Model Zoo registry name
        (None, None, None),
    ],
)
def test_model_name_is_never_guessed(family, source, name):
    text = "trainer:\n  init:\n    model:\n      hidden_size: 8\n"
    res = upgrade_config_text(text, "2.3", "2.4", family=family, family_source=source)
    model = yaml.safe_load(res.text)["trainer"]["init"]["model"]
    if name is None:
        assert "name" not in model
        assert "set it by hand" in entry(res.report, "unknown", "trainer.init.model.name").why
    else:
        assert list(model) == ["name", "hidden_size"] and model["name"] == name


def test_a_config_with_its_own_name_decides_the_family():
    text = "trainer:\n  init:\n    model:\n      name: bert/classifier\n"
    assert family_from_config(yaml_edit.load(text)[0])[:2] == ("bert", "bert/classifier")
    res = upgrade_config_text(text, "2.3", "2.10")
    assert res.text == text and res.report == [] and res.family == "bert"


# ---------------------------------------------------------------- API, errors, plans


def test_nothing_to_change_returns_the_text_verbatim():
    text = (CONFIGS / "gpt2-2.0.yaml").read_text()
    res = upgrade_config_text(text, "2.5", "2.10", family="gpt2")
    assert res.text == text and not res.changed


def test_bad_inputs_are_clear_errors():
    with pytest.raises(UsageError, match="not valid YAML"):
        upgrade_config_text("a: [1, 2\n", "2.0", "2.1")
    with pytest.raises(UsageError, match="not a YAML mapping"):
        upgrade_config_text("- 1\n", "2.0", "2.1")
    with pytest.raises(UsageError, match="unknown model 'gpt5'"):
        upgrade_config_text("model: {}\n", "2.0", "2.1", family="gpt5")
    with pytest.raises(UsageError, match="cannot downgrade"):
        upgrade_config_text("model: {}\n", "2.1", "2.0")
    with pytest.raises(UsageError, match=r"'3\.7' is newer than this ckpt-migrate knows"):
        upgrade_config_text("model: {}\n", "2.0", "3.7")
    with pytest.raises(UsageError, match=r"unknown release '1\.5'"):
        upgrade_config_text("model: {}\n", "1.5", "2.0")


def test_upgrade_config_file_is_atomic_and_never_overwrites(tmp_path):
    src = tmp_path / "params.yaml"
    src.write_text((CONFIGS / "t5-2.0.yaml").read_text())
    dst = tmp_path / "out.yaml"
    res = upgrade_config_file(src, dst, "2.0", "2.10", family="t5")
    assert res.output == dst and dst.read_text() == res.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.yaml", "params.yaml"]
    before = dst.read_text()
    with pytest.raises(CkptError, match="already exists"):
        upgrade_config_file(src, dst, "2.0", "2.10", family="t5")
    assert dst.read_text() == before
    with pytest.raises(CkptError, match="no such config"):
        upgrade_config_file(tmp_path / "missing.yaml", tmp_path / "x.yaml", "2.0", "2.1")
    with pytest.raises(CkptError, match="directory does not exist"):
        upgrade_config_file(src, tmp_path / "nope" / "x.yaml", "2.0", "2.1")


def test_every_config_step_is_documented_and_listed_in_plans():
    hops = {(h.source, h.target): h for h in graph.load().hops}
    steps = [op for h in hops.values() for op in h.config_operations]
    assert len(steps) >= 15
    for op in steps:
        doc = op.__doc__ or ""
        assert doc.strip() and len(doc.strip().splitlines()[0]) <= 100, op.__name__
        assert any(s in doc for s in ("MODELZOO_HISTORY", "RELEASE-NOTES", "f1fd1e0")), op.__name__
    hop = hops["1.9", "2.0"]
    data = hop.to_json()
    assert data["config_changes"][0].startswith("``use_rms_norm``")
    assert any(line.startswith("config: ") for line in data["changes"])
    assert hops["2.5", "2.6"].config_operations == ()
    # Each line is a whole sentence: a summary wrapped over two docstring lines was cut at the
    # first ("… 2.5 reads them only from").
    for h in hops.values():
        for line in h.describe()[: len(h.operations)] + h.describe_config():
            assert line.rstrip("`").endswith((".", ")")), (h.source, h.target, line)


def test_ruamel_is_not_loaded_for_help_or_plain_upgrades():
    code = (
        "import sys; from ckpt_migrate.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"main(['plan', {str(FIXTURES / 'release-2.0.mdl')!r}])\n"
        "print('RUAMEL' if any(m.startswith('ruamel') for m in sys.modules) else 'NO-RUAMEL')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip().endswith("NO-RUAMEL"), out.stdout + out.stderr


def test_a_family_the_config_contradicts_is_applied_and_said():
    res = run("t5-2.0.yaml", "2.0", "2.1", family="gpt2")
    note = entry(res.report, "note", "model")
    assert "looks like t5" in note.why and "gpt2's config steps are applied" in note.why


def test_report_lines_read_well():
    change = ConfigChange("changed", "model.a", 1, 2, "2.0→2.1", "because")
    assert change.line() == "[2.0→2.1] changed: model.a: 1 → 2 — because"
    moved = ConfigChange("changed", "a.x", 3, 3, "2.2→2.3", "layout", moved_to="b.y")
    assert moved.line() == "[2.2→2.3] changed: a.x → b.y — layout"
    gone = ConfigChange("removed", "csconfig", {"num_csx": 1}, None, "1.9→2.0", "unused")
    assert gone.line() == '[1.9→2.0] removed: csconfig (was {"num_csx": 1}) — unused'
    assert ConfigChange("note", "model", why="w").line() == "note: model — w"


def test_non_mapping_legacy_sections_are_reported_once():
    res = upgrade_config_text("model: null\nrunconfig:\n  seed: 3\n", "2.2", "2.3")
    assert [c.key for c in res.report if c.kind == "unknown"] == ["model"]
    assert yaml.safe_load(res.text) == {"trainer": {"init": {"seed": 3}}, "model": None}


def test_duplicate_keys_are_refused_not_merged():
    """The message named ruamel's context (``while constructing a mapping``), not the key or
    where it stands (two values: see test_a_key_given_twice_with_two_values_is_refused...)."""
    with pytest.raises(UsageError, match=r"'model.a' is given twice .* \(lines 2 and 3;"):
        upgrade_config_text("model:\n  a: 1\n  a: 2\n", "2.0", "2.1")
    with pytest.raises(UsageError, match=r"expected ',' or '\}', but got ':' at line 2, column 2"):
        upgrade_config_text("a: {b: 1\nc: 2\n", "2.0", "2.1")


# Spelled as YAML 1.1 (PyYAML, which Model Zoo reads params.yaml with) spells booleans.
YES_NO_1_9 = """\
train_input:
  batch_size: 8
  shuffle: no
model:
  use_rms_norm: yes
  share_embedding_weights: on
runconfig:
  is_pretrained_checkpoint: yes
"""
YES_NO_2_2 = """\
train_input:
  data_dir: "on"
model:
  hidden_size: 64
sparsity:
  type: static
  sparsity: 0.5
  add_summaries: off
runconfig:
  max_steps: 100
  check_loss_values: off
  log_input_summaries: no
"""


@pytest.mark.parametrize(
    ("text", "frm", "to"), [(YES_NO_1_9, "1.9", "2.0"), (YES_NO_2_2, "2.2", "2.3")]
)
def test_yes_no_on_off_are_the_booleans_model_zoo_reads(text, frm, to):
    """Read as YAML 1.2 strings, ``use_rms_norm: yes`` was left unconverted (a LLaMA fell back
    to LayerNorm), ``is_pretrained_checkpoint: yes`` was dropped as if false, and
    ``add_summaries: off`` switched the LogSparsity callback on."""
    spelled = upgrade_config_text(text, frm, to, family="llama")
    as_bools = text
    for word, value in (("yes", "true"), ("on", "true"), ("no", "false"), ("off", "false")):
        as_bools = as_bools.replace(f": {word}\n", f": {value}\n")
    assert as_bools != text
    assert yaml.safe_load(spelled.text) == yaml.safe_load(
        upgrade_config_text(as_bools, frm, to, family="llama").text
    )
    assert not [c for c in spelled.report if c.kind == "unknown"]
    out = yaml.safe_load(spelled.text)
    if frm == "1.9":
        assert out["model"]["norm_type"] == "rmsnorm"
        assert out["runconfig"]["load_checkpoint_states"] == "model,dataloader"
        assert out["train_input"]["shuffle"] is False
    else:
        callbacks = {k: v for c in out["trainer"]["init"]["callbacks"] for k, v in c.items()}
        assert callbacks["LogSparsity"] is None and callbacks["CheckLoss"] is None
        assert out["trainer"]["fit"]["train_dataloader"]["data_dir"] == "on"


@pytest.mark.parametrize(
    "text",
    [
        "model:\n    # Embedding\n    vocab_size: 32000\n    hidden_size: 64\n",
        "trainer:\n  init:\n    model:\n      # Embedding\n      vocab_size: 32000\n",
    ],
)
def test_model_name_goes_above_the_sections_first_comment_once(text):
    """Every Model Zoo 2.3.0 model section opens with ``# Embedding``; adding ``name`` above
    it printed it twice (ruamel keeps it in the section and in its parent's entry)."""
    res = upgrade_config_text(text, "2.3", "2.4", family="llama")
    assert res.text.count("# Embedding") == 1
    lines = [line.strip() for line in res.text.splitlines()]
    assert lines[lines.index("name: llama") + 1 :][:2] == ["# Embedding", "vocab_size: 32000"]


def test_a_comment_continued_below_its_key_moves_with_it():
    """Model Zoo 2.2.0's ``params_llama2_7b.yaml``: ``max_steps`` ends in a comment continued
    on the next line, aligned with it. That line was taken to stand above ``log_steps`` and
    was lost when both moved into the trainer layout."""
    text = (
        "model:\n    hidden_size: 64\nrunconfig:\n"
        "    max_steps: 476837       # Llama v2 7B was trained on 2T tokens.\n"
        "                            # steps = 2T / (1024 * 4096)\n"
        "    log_steps: 100\n"
    )
    out = upgrade_config_text(text, "2.2", "2.3").text
    lines = out.splitlines()
    at = line_of(out, "max_steps: 476837  # Llama v2 7B was trained on 2T tokens.")
    assert lines[at + 1].strip() == "# steps = 2T / (1024 * 4096)"


def test_a_2_2_mup_config_gets_2_3_mup_parameters_as_model_zoo_wrote_them():
    """2.3 reworked muP (Model Zoo's ``ConfigConverter_muP_CS22_CS23``); the upgrade kept
    ``output_logits_scale`` and ``adjust_learning_rate`` without a word. Model Zoo's own
    111m_mup.yaml of 2.2.0, upgraded, now has the muP fields of its 2.4.0 version."""
    res = run("modelzoo-gpt3-111m-mup-2.2.yaml", "2.2", "2.4", family="gpt2")
    got = yaml.safe_load(res.text)["trainer"]["init"]
    want = yaml.safe_load((CONFIGS / "modelzoo-gpt3-111m-mup-2.4.yaml").read_text())
    want = want["trainer"]["init"]
    fields = ("mup_base_hidden_size", "mup_base_filter_size", "output_logits_alpha")
    for key in (*fields, "scale_qk_dot_by_d", "embeddings_scale"):
        assert got["model"][key] == want["model"][key], key
    for key in ("initializer", "output_layer_initializer"):
        assert got["model"][key]["std"] == pytest.approx(want["model"][key]["std"]), key
    assert "output_logits_scale" not in got["model"]
    assert "adjust_learning_rate" not in json.dumps(got)
    entry(res.report, "removed", "optimizer.adjust_learning_rate", "2.2→2.3")
    entry(res.report, "changed", "model.output_logits_scale", "2.2→2.3")
    # Without the width multiplier the fields cannot be derived: said, not guessed.
    partial = "model:\n  scale_qk_dot_by_d: true\n  embeddings_scale: 10\n"
    partial += "  output_logits_scale: 0.5\n"
    res = upgrade_config_text(partial, "2.2", "2.3", family="gpt2")
    assert "mup_base_hidden_size" in entry(res.report, "unknown", "model.output_logits_scale").why
    # An initializer whose std is not a number is left as it is (Model Zoo's would fail).
    odd = partial + "  hidden_size: 64\n  filter_size: 256\n  num_hidden_layers: 2\n"
    odd += '  initializer: {name: normal, std: "x"}\n'
    odd += "optimizer:\n  adjust_learning_rate: {decoder_kernel: 0.5}\n"
    model = yaml.safe_load(upgrade_config_text(odd, "2.2", "2.3").text)["trainer"]["init"]["model"]
    assert model["initializer"] == {"name": "normal", "std": "x"}
    assert model["mup_base_hidden_size"] == 32 and model["output_logits_alpha"] == 1.0


def test_comments_left_in_runconfig_go_to_trainer_init():
    """The tail of Model Zoo 2.2.0's ``gpt3/configs/params_gpt3_6p7b.yaml`` runconfig: comment
    lines after its last key (a commented-out setting). They were lost with the emptied
    runconfig (56 comment lines in 20 of Model Zoo 2.2.0's configs)."""
    tail = (
        "    # Default optimizations level (POL=1) has not been tested for this model.\n"
        "    # Convergence might be affected. POL=0 has been tested for convergence. To\n"
        "    # use POL=0, uncomment this config:\n"
        "    # precision_opt_level: 0\n"
    )
    text = (
        "model:\n    hidden_size: 64\nrunconfig:\n    max_steps: 10\n"
        "    save_initial_checkpoint: False\n" + tail
    )
    out = upgrade_config_text(text, "2.2", "2.3").text
    assert "trainer:\n    init:\n" + tail.replace("    #", "        #") in out
    assert "runconfig" not in out


def test_floats_a_step_does_not_change_keep_their_text():
    """ruamel re-formatted every float it wrote back from a width and a precision, which moved
    the last digit: the learning rates of Model Zoo 2.2.0's
    ``nlp/transformer/configs/transformer_large.yaml`` changed in a 2.2 → 2.3 upgrade, and the
    report showed the old value."""
    rates = ["8.436676240964464e-05", "7.056663329594336e-05", ".5e-3", "1e-4", "2.50"]
    text = "model:\n  hidden_size: 8\noptimizer:\n  optimizer_type: SGD\n  learning_rate:\n"
    text += "".join(
        f"    - {{scheduler: Constant, learning_rate: {r}, total_iters: 1}}\n" for r in rates
    )
    res = upgrade_config_text(text, "2.2", "2.3")
    for rate in rates:
        assert f"learning_rate: {rate}" in res.text
    schedulers = yaml.safe_load(res.text)["trainer"]["init"]["schedulers"][0]["SequentialLR"]
    got = [s["ConstantLR"]["learning_rate"] for s in schedulers["schedulers"]]
    assert got == [yaml.safe_load(r) for r in rates]


@pytest.mark.parametrize(
    ("config", "release"),
    [
        (CONFIGS / "modelzoo-gpt2-small-2.2.yaml", "2.2"),  # Model Zoo's own
        (MODELS / "llama-1.9" / "params.yaml", "1.9"),
        (MODELS / "gpt2-2.0" / "params.yaml", "2.0"),
        (MODELS / "t5-1.9" / "params.yaml", "1.9"),
    ],
)
def test_crlf_text_upgrades_as_its_lf_text_does(config, release):
    """Given CRLF text, ruamel kept a carriage return in some tokens and not in others: the
    output mixed endings, and the LLaMA 1.9 config's upgrade differed from its LF text's."""
    text = config.read_text()
    crlf = text.replace("\n", "\r\n")
    lf_result = upgrade_config_text(text, release, "2.10")
    assert lf_result.changed
    assert upgrade_config_text(crlf, release, "2.10").text == lf_result.text.replace("\n", "\r\n")
    assert upgrade_config_text(crlf, release, release).text == crlf  # byte for byte


def test_a_key_model_zoo_gives_twice_with_one_value_is_read_once():
    """Model Zoo's own Cerebras_GPT/256m_mup.yaml (Release_2.0.3 to 2.3.1) gives ``a: -0.16``
    twice under ``embedding_initializer``. Model Zoo reads it with PyYAML (the last wins);
    ruamel refused it ("not valid YAML ... fix the config file"), so Model Zoo's config for
    that model could not be upgraded at all."""
    text = (CONFIGS / "modelzoo-gpt3-256m-mup-2.0.yaml").read_text()
    res = upgrade_config_text(text, "2.0", "2.10", family="gpt2")
    note = entry(res.report, "note", "model.embedding_initializer.a")
    assert "lines 66 and 67" in note.why, note.why
    got = yaml.safe_load(res.text)["trainer"]["init"]["model"]["embedding_initializer"]
    assert got["a"] == yaml.safe_load(text)["model"]["embedding_initializer"]["a"]
    block = res.text[res.text.index("embedding_initializer:") :].split("initializer:")[1]
    assert block.count("a: -0.16") == 1, block
    # Nothing to change: the text stays the input's, byte for byte, the note still said.
    same = upgrade_config_text(text, "2.0", "2.0", family="gpt2")
    assert same.text == text and entry(same.report, "note", "model.embedding_initializer.a")


def test_a_key_given_twice_with_two_values_is_refused_naming_both_lines():
    """Which of the two the run used is the user's to say (Model Zoo's loader took the last)."""
    text = (CONFIGS / "modelzoo-gpt3-256m-mup-2.0.yaml").read_text()
    twice = text.replace("a: -0.16\n        a: -0.16", "a: -0.16\n        a: -0.17")
    with pytest.raises(UsageError) as err:
        upgrade_config_text(twice, "2.0", "2.10", family="gpt2")
    assert "'model.embedding_initializer.a' is given twice with different values (lines 66 " in str(
        err.value
    )
    assert "delete the one the run did not mean" in str(err.value)
    # A merge key twice stays ruamel's error, and a repeated alias is compared once.
    with pytest.raises(UsageError, match="duplicate merge key"):
        upgrade_config_text("a: &x {k: 1}\nb:\n  <<: *x\n  <<: *x\n", "2.0", "2.10")
    aliased = "x: &big [1, 2, 3]\nm:\n  k: *big\n  k: *big\n"
    assert upgrade_config_text(aliased, "2.0", "2.0").text == aliased


def _comment_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("#")]


@pytest.mark.parametrize(
    ("name", "frm", "to"),
    [
        ("modelzoo-gpt3-111m-mup-2.2.yaml", "2.2", "2.3"),
        ("modelzoo-gpt3-256m-mup-2.0.yaml", "2.0", "2.10"),
    ],
)
def test_a_sections_heading_stays_above_it_in_the_trainer_layout(name, frm, to):
    """Model Zoo heads its sections (``### Model``, ``### Cerebras parameters``); ruamel keeps
    each heading with the last entry of the section before. ``### Cerebras parameters`` went
    with ``adjust_learning_rate`` (muP rework) or ``runconfig`` (emptied), and ``### Model``
    moved with ``eval_input`` to the end of the fit section."""
    text = (CONFIGS / name).read_text()
    out = upgrade_config_text(text, frm, to, family="gpt2").text
    kept = _comment_lines(out)
    assert [c for c in _comment_lines(text) if c not in kept] == []
    lines = [line.strip() for line in out.splitlines()]
    assert lines[lines.index("### Model") + 1] == "model:"
    assert lines[lines.index("### Optimization") + 1] == "optimizer:"
    heading = lines.index("### Cerebras parameters")
    assert lines[heading - 1] == "init:" and lines[heading + 1] == "backend:", lines[:12]
    assert out.count("### Cerebras parameters") == 1
    # ``# Cerebras parameters`` heads the model's precision keys, which stay there too (2.3).
    if to == "2.3":
        at = lines.index("# Cerebras parameters")
        assert lines[at + 1 : at + 3] == ["mixed_precision: True", 'fp16_type: "bfloat16"']


def test_comment_lines_above_a_key_after_a_flow_sequence_are_kept():
    """Model Zoo 2.0.3's ``unet/configs/params_cityscapes.yaml``: after a flow sequence ruamel
    keeps the lines above ``loss_scaling_factor`` with that key, and taking the key (it moves
    to the precision settings) dropped them."""
    text = (
        "optimizer:\n"
        '    optimizer_type: "Adam"\n'
        "    weight_decay: 0.0\n"
        "    learning_rate:\n"
        "        initial_learning_rate: 5.0e-4\n"
        '        scheduler: "PiecewiseConstant"\n'
        "        milestones: [10000]\n"
        "        learning_rates: [5.0e-4, 1.0e-5]\n"
        '    # Choices: `loss_scaling_factor`: {"dynamic", use values >= 1.0 for static loss '
        "scaling}\n"
        "    # Note: When `use_bfloat16: True`, this always defaults to `1.0`\n"
        "    loss_scaling_factor: 1.0\n"
        "\nrunconfig:\n    max_steps: 15000\n"
    )
    out = upgrade_config_text(text, "2.0", "2.3").text
    assert _comment_lines(out) == _comment_lines(text)
    assert yaml.safe_load(out)["trainer"]["init"]["precision"]["loss_scaling_factor"] == 1.0
    # They go where the key goes, as the lines above a runconfig key do.
    lines = out.splitlines()
    at = line_of(out, "loss_scaling_factor: 1.0")
    assert lines[at - 2 : at] == [" " * 12 + c for c in _comment_lines(text)], lines


def test_the_comment_above_a_learning_rate_lists_first_item_stays_with_it():
    """Model Zoo's params_gpt2_small.yaml: ``## GPT-3 schedule warms up over 375M tokens``
    opens the ``learning_rate`` list; the list is rebuilt into ``schedulers`` and the line
    was lost. It now opens the first scheduler's settings."""
    text = (CONFIGS / "modelzoo-gpt2-small-2.2.yaml").read_text()
    out = upgrade_config_text(text, "2.2", "2.3").text
    assert [c for c in _comment_lines(text) if c not in _comment_lines(out)] == []
    lines = [line.strip() for line in out.splitlines()]
    at = lines.index("## GPT-3 schedule warms up over 375M tokens")
    assert lines[at - 1] == "- LinearLR:" and lines[at + 1] == "initial_learning_rate: 0.0"


def test_a_mistral_config_beside_llama_keys_is_named_mistral(tmp_path):
    """A Mistral checkpoint's keys are LLaMA's, so upgrading it past 2.4 with Model Zoo 2.3's own
    Mistral config (no model name) wrote ``name: llama``: the HF export then read it as a LLaMA
    and its sliding window was lost. Before 2.4 only Mistral's configs set
    ``attention_sliding_window_length``; beside LLaMA keys it decides. Without it the name stays
    ``llama`` and the report says what the keys cannot tell."""
    ckpt = MODELS / "llama-2.0" / "checkpoint_100.mdl"
    mistral = CONFIGS / "modelzoo-mistral-7b-2.3.yaml"
    proc = run_cli("upgrade", ckpt, "--from", "2.3", "--config", mistral, "-o", tmp_path / "m")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load((tmp_path / "m" / mistral.name).read_text())["model"]["name"] == "mistral"
    assert "model family mistral (checkpoint keys; model keys only mistral" in proc.stdout

    text = mistral.read_text().replace("    attention_sliding_window_length: 4096\n", "")
    res = upgrade_config_text(text, "2.3", "2.4", family="llama", family_source="checkpoint keys")
    assert yaml.safe_load(res.text)["model"]["name"] == "llama"
    why = entry(res.report, "added", "model.name").why
    assert "which mistral checkpoints share: pass --model mistral" in why, why
