"""``scripts/convert_checkpoint.py``: Model Zoo's verbs and flags, run on the engine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import CKPT, FIXTURES, MODELS, ROOT, one_line_error, run_script

from ckpt_migrate.errors import UsageError
from ckpt_migrate.format import releases
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import DictNode, MemoryData, TensorLeaf, first_positions, iter_leaves
from ckpt_migrate.format.write import write_checkpoint

sys.path.insert(0, str(ROOT / "scripts"))
try:
    import convert_checkpoint as cc
finally:
    sys.path.pop(0)


def script(*args: str | Path) -> subprocess.CompletedProcess:
    return run_script("convert_checkpoint.py", *args)


def copy_fixture(tmp_path: Path, name: str) -> tuple[Path, Path]:
    d = tmp_path / name
    shutil.copytree(MODELS / name, d)
    return d / CKPT, d / "params.yaml"


def model_of(path: Path) -> tuple[str, list[str]]:
    with read_checkpoint(path) as ckpt:
        return ckpt.release.name, [k for k, _ in ckpt.root.get("model").items]


# --------------------------------------------------------------------------- formats and names


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("cs-2.10", "2.10"),
        ("cs-2.1", "2.1"),
        ("CS-2.10.0", "2.10"),
        ("cs-1.9", "1.9"),
        ("cs-2.9", "2.9"),
    ],
)
def test_formats_with_two_digit_minors(text, release):
    assert cc.parse_format(text, source=True).name == release
    assert cc.parse_format(text, source=False).name == release


def test_auto_and_current():
    assert cc.parse_format("cs-auto", source=True) is None
    assert cc.parse_format("cs-current", source=False) is releases.LATEST
    with pytest.raises(UsageError, match="not a Cerebras format"):
        cc.parse_format("cs-auto", source=False)
    with pytest.raises(UsageError, match="not a Cerebras format"):
        cc.parse_format("cs-current", source=True)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("hf", "Hugging Face"),
        ("2.0", "not a Cerebras format"),
        ("cs-2", "not a Cerebras format"),
        ("cs-1.6", "unknown release 1.6"),
        ("cs-2.11", "unknown release 2.11"),
    ],
)
def test_bad_formats(text, words):
    with pytest.raises(UsageError, match=words):
        cc.parse_format(text, source=True)


def test_output_names_strip_alphabetic_extensions_as_model_zoo_does():
    assert cc.stem("checkpoint_100.mdl") == "checkpoint_100"
    assert cc.stem("checkpoint_1.7.mdl") == "checkpoint_1.7"
    assert cc.stem("pytorch_model.bin.index.json") == "pytorch_model"
    assert cc.stem("params.yaml") == "params"
    assert cc.output_name(Path("a/ckpt.mdl"), releases.get("2.10"), ".mdl") == "ckpt_to_cs-2.10.mdl"


# --------------------------------------------------------------------------- convert


def test_convert_1_9_to_2_3_in_one_run(tmp_path):
    ckpt, config = copy_fixture(tmp_path, "gpt2-1.9")
    proc = script(
        "convert", ckpt, "--model", "gpt2", "--src-fmt", "cs-1.9", "--tgt-fmt", "cs-2.3",
        "--config", config, "--no-progress-bar", "--drop-dataloader-state",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = ckpt.parent / "checkpoint_100_to_cs-2.3.mdl"
    out_config = config.parent / "params_to_cs-2.3.yaml"
    assert f"Checkpoint saved to {out}" in proc.stdout
    assert f"Config saved to {out_config}" in proc.stdout
    release, keys = model_of(out)
    assert release == "2.3"
    assert "model.embedding_layer.position_embeddings.embed.weight" in keys
    assert "model.embedding_layer.position_embeddings.weight" not in keys
    assert "[1.9→2.0] model.model.lm_head.weight: restored as a tie" in proc.stdout
    assert "model: gpt2 (from --model" in proc.stdout
    text = out_config.read_text()
    assert "# GPT-2 (tiny) as a Cerebras Model Zoo 1.9 run" in text  # comments kept
    assert isinstance(yaml.safe_load(text), dict)
    assert config.read_text() == (MODELS / "gpt2-1.9" / "params.yaml").read_text()
    # never overwritten: a second run is refused and leaves the outputs alone
    before = out.stat().st_mtime_ns
    proc = script(
        "convert", ckpt, "--model", "gpt2", "--src-fmt", "cs-1.9", "--tgt-fmt", "cs-2.3",
        "--config", config,
    )  # fmt: skip
    one_line_error(proc, 2, "already exists", "checkpoint_100_to_cs-2.3.mdl", skip_warnings=True)
    assert out.stat().st_mtime_ns == before


def test_convert_keeps_the_optimizer_aligned(tmp_path):
    """The T5 helpers move to another module in 2.1; with shared embeddings the parameter order
    is unchanged, so Adam state index i still has the shape of the i-th distinct parameter."""
    ckpt, config = copy_fixture(tmp_path, "t5-2.0")
    proc = script(
        "convert", ckpt, "--model", "t5", "--src-fmt", "cs-auto", "--tgt-fmt", "cs-2.10",
        "--config", config, "--output-dir", tmp_path / "out",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with read_checkpoint(tmp_path / "out" / "checkpoint_100_to_cs-2.10.mdl") as out:
        model = out.root.get("model")
        firsts = first_positions(model)
        distinct = [ref.leaf for ref in iter_leaves(model) if firsts[id(ref.leaf)].path == ref.path]
        optimizer = out.root.get("optimizer")
        params = optimizer.get("param_groups").items[0].get("params").items
        assert [p.value for p in params] == list(range(len(distinct)))
        state = optimizer.get("state")
        for i, param in enumerate(distinct):
            assert state.get(i).get("exp_avg").shape == param.shape, i
        keys = [k for k, _ in model.items]
        assert (
            keys[2]
            == "model.encoder_embeddings.position_embed_helper.relative_attention_bias.weight"
        )


def test_reordering_rename_is_refused(tmp_path):
    with read_checkpoint(MODELS / "t5-2.0" / CKPT) as ckpt:
        root = ckpt.root
        model = root.get("model")
        i = next(i for i, (k, _) in enumerate(model.items) if k.startswith("model.decoder_emb"))
        enc = model.items[0][1]
        # untied decoder embeddings: 2.1's parameter order would differ from 2.0's
        untied = TensorLeaf(enc.dtype, enc.shape, MemoryData(enc.data.read().copy()))
        model.items[i] = (model.items[i][0], untied)
        model.items[-1] = ("model.lm_head.weight", untied)  # lm_head shares the decoder's
        src = tmp_path / CKPT
        write_checkpoint(root, src, "2.0")
    # the config says so too (with sharing on, the 2.x model would tie them: no reorder)
    text = (MODELS / "t5-2.0" / "params.yaml").read_text()
    config = tmp_path / "params.yaml"
    config.write_text(
        text.replace(
            "share_encoder_decoder_embedding: True", "share_encoder_decoder_embedding: False"
        )
    )
    proc = script(
        "convert", src, "--model", "t5", "--src-fmt", "cs-2.0", "--tgt-fmt", "cs-2.2",
        "--config", config, "--output-dir", tmp_path / "out",
    )  # fmt: skip
    one_line_error(proc, 2, "parameter order", "optimizer", skip_warnings=True)
    assert not list((tmp_path / "out").glob("*.mdl"))


def test_cs_auto_works_before_2_1_and_cs_current_is_the_newest(tmp_path):
    ckpt, config = copy_fixture(tmp_path, "llama-1.9")
    proc = script(
        "convert", ckpt, "--model", "llamaV2", "--src-fmt", "cs-auto", "--tgt-fmt", "cs-current",
        "--config", config, "--output-dir", tmp_path / "new" / "dir", "--drop-dataloader-state",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "cs-auto: release 1.9 (format 0.3)" in proc.stdout
    out = tmp_path / "new" / "dir" / "checkpoint_100_to_cs-2.10.mdl"
    assert model_of(out)[0] == "2.10"
    assert (tmp_path / "new" / "dir" / "params_to_cs-2.10.yaml").is_file()


def test_cs_2_1_is_not_cs_2_10(tmp_path):
    ckpt, config = copy_fixture(tmp_path, "bert-2.0")
    for fmt in ("cs-2.1", "cs-2.10"):
        proc = script(
            "convert", ckpt, "--model", "bert", "--src-fmt", "cs-2.0", "--tgt-fmt", fmt,
            "--config", config,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        release, keys = model_of(ckpt.parent / f"checkpoint_100_to_{fmt}.mdl")
        assert release == fmt.removeprefix("cs-")
        assert "model.bert_encoder.embedding_layer.position_embeddings.embed.weight" in keys


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--model", "gpt5"], 2, ("unknown model 'gpt5'", "known models")),
        (["--src-fmt", "cs-2.0"], 2, ("--src-fmt cs-2.0", "file says release 1.9")),
        (["--tgt-fmt", "cs-1.8"], 2, ("cannot downgrade from 1.9 to 1.8", "one way")),
        (["--src-fmt", "hf", "--tgt-fmt", "hf"], 2, ("nothing to convert",)),
        (["--config", "missing.yaml"], 2, ("missing.yaml",)),
    ],
)
def test_convert_errors_are_one_line(tmp_path, args, code, words):
    ckpt, config = copy_fixture(tmp_path, "gpt2-1.9")
    base = {"--model": "gpt2", "--src-fmt": "cs-1.9", "--tgt-fmt": "cs-2.3", "--config": config}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = tmp_path / value if flag == "--config" else value
    proc = script("convert", ckpt, *[x for kv in base.items() for x in kv])
    one_line_error(proc, code, *words, skip_warnings=True)
    assert sorted(p.name for p in ckpt.parent.iterdir()) == [CKPT, "params.yaml"]


def test_already_at_the_target_writes_nothing(tmp_path):
    ckpt, config = copy_fixture(tmp_path, "gpt2-2.0")
    proc = script(
        "convert", ckpt, "--model", "gpt2", "--src-fmt", "cs-2.0", "--tgt-fmt", "cs-2.0",
        "--config", config,
    )  # fmt: skip
    assert proc.returncode == 0 and "nothing to convert" in proc.stdout
    assert sorted(p.name for p in ckpt.parent.iterdir()) == [CKPT, "params.yaml"]


def _with_extra_key(tmp_path: Path, optimizer: bool) -> Path:
    with read_checkpoint(MODELS / "gpt2-2.0" / CKPT) as ckpt:
        root = ckpt.root
        model = root.get("model")
        model.items.append(("model.adapter.scale", model.items[-2][1]))
        gate = MemoryData(np.array(0.5, dtype="<f4"))
        model.items.append(("model.adapter.gate", TensorLeaf("float32", (), gate)))
        if not optimizer:
            root = DictNode([(k, v) for k, v in root.items if k != "optimizer"])
        src = tmp_path / f"extra-{optimizer}.mdl"
        write_checkpoint(root, src, "2.0")
    return src


def test_unmatched_keys_are_kept_and_listed_or_dropped_on_request(tmp_path):
    config = MODELS / "gpt2-2.0" / "params.yaml"
    src = _with_extra_key(tmp_path, optimizer=False)
    common = ["--model", "gpt2", "--src-fmt", "cs-2.0", "--tgt-fmt", "cs-2.1", "--config", config]
    proc = script("convert", src, *common, "--output-dir", tmp_path / "kept")
    assert proc.returncode == 0, proc.stderr
    assert "not in the gpt2 key tables, kept unchanged" in proc.stderr
    assert "model.adapter.scale" in model_of(tmp_path / "kept" / "extra-False_to_cs-2.1.mdl")[1]
    proc = script(
        "convert", src, *common, "--output-dir", tmp_path / "dropped", "--drop-unmatched-keys"
    )
    assert proc.returncode == 0, proc.stderr
    assert "model.model.adapter.scale: dropped (--drop-unmatched-keys" in proc.stdout
    keys = model_of(tmp_path / "dropped" / "extra-False_to_cs-2.1.mdl")[1]
    assert not [k for k in keys if "adapter" in k]
    # dropping a tensor while Adam keeps state by parameter index would misalign it
    src = _with_extra_key(tmp_path, optimizer=True)
    proc = script(
        "convert", src, *common, "--output-dir", tmp_path / "refused", "--drop-unmatched-keys"
    )
    one_line_error(proc, 2, "--drop-unmatched-keys", "parameter index", skip_warnings=True)


# --------------------------------------------------------------------------- other verbs


def test_convert_config(tmp_path):
    _, config = copy_fixture(tmp_path, "t5-1.9")
    proc = script(
        "convert-config", config, "--model", "t5", "--src-fmt", "cs-1.9", "--tgt-fmt", "cs-2.2"
    )
    assert proc.returncode == 0, proc.stderr
    out = config.parent / "params_to_cs-2.2.yaml"
    assert f"Config saved to {out}" in proc.stdout and out.is_file()
    proc = script(
        "convert-config", config, "--model", "t5", "--src-fmt", "cs-auto", "--tgt-fmt", "cs-2.2"
    )
    one_line_error(proc, 2, "cs-auto", "a config does not say its release", skip_warnings=True)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_convert_config_to_and_from_hf_is_the_checkpoint_conversions_config(tmp_path, family):
    """Model Zoo's ``convert-config`` takes ``hf`` on either side (``--src-fmt``/``--tgt-fmt``:
    'Can be "hf" for HuggingFace Models, or "cs-X.X"'); it was refused. A config converted
    alone is the one the checkpoint's conversion writes (but ``dtype``, which only the tensors
    tell), named as Model Zoo names it."""
    ckpt, config = copy_fixture(tmp_path, f"{family}-2.0")
    base = ["--model", family]
    proc = script("convert-config", config, *base, "--src-fmt", "cs-2.0", "--tgt-fmt", "hf")
    assert proc.returncode == 0, proc.stderr
    alone = json.loads((config.parent / "params_to_hf.json").read_text())
    with_ckpt = ["--config", config, "--src-fmt", "cs-auto", "--tgt-fmt", "hf"]
    assert script("convert", ckpt, *base, *with_ckpt).returncode == 0
    hf = ckpt.parent / "checkpoint_100_to_hf"
    exported = json.loads((hf / "config.json").read_text())
    assert alone == {k: v for k, v in exported.items() if k != "dtype"}

    back = ["--src-fmt", "hf", "--tgt-fmt", "cs-2.3"]
    proc = script("convert-config", hf / "config.json", *base, *back)
    assert proc.returncode == 0, proc.stderr
    alone_cs = (hf / "config_to_cs-2.3.yaml").read_text()
    (hf / "config_to_cs-2.3.yaml").unlink()
    proc = script("convert", hf, *base, "--config", hf / "config.json", *back)
    assert proc.returncode == 0, proc.stderr
    assert (hf / "config_to_cs-2.3.yaml").read_text() == alone_cs


def test_convert_config_from_a_transformers_config(tmp_path):
    """A ``config.json`` transformers wrote (not this tool): its model section, and errors for
    what a config alone cannot convert."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    cfg.save_pretrained(tmp_path)
    args = ["--model", "llama", "--src-fmt", "hf", "--tgt-fmt", "cs-2.10"]
    proc = script("convert-config", tmp_path / "config.json", *args)
    assert proc.returncode == 0, proc.stderr
    params = yaml.safe_load((tmp_path / "config_to_cs-2.10.yaml").read_text())
    model = params["trainer"]["init"]["model"]
    assert model["name"] == "llama" and model["num_hidden_layers"] == 2
    assert model["extra_attention_params"] == {"num_kv_groups": 2}
    proc = script("convert-config", tmp_path / "config.json", *args)  # (it exists now)
    one_line_error(proc, 2, "already exists", skip_warnings=True)
    both = ["--model", "llama", "--src-fmt", "hf", "--tgt-fmt", "hf"]
    one_line_error(script("convert-config", tmp_path / "config.json", *both), 2, "nothing")


def test_list_converters():
    proc = script("list-converters", "gpt2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("gpt2: gpt2 family; Model Zoo registry name gpt2\n")
    assert "cs-1.7 … cs-2.10" in proc.stdout and "(Model Zoo 2.10: from cs-1.8)" in proc.stdout
    assert (
        "2.0→2.1: embedding_layer.position_embeddings.weight → "
        "embedding_layer.position_embeddings.embed.weight" in proc.stdout
    )
    proc = script("list", "code-llama", "--hide-notes")
    assert proc.returncode == 0 and proc.stdout.startswith("code-llama: llama family;")
    assert "2.0→2.1" not in proc.stdout
    proc = script("list", "gpt3", "--hide-notes")  # one name table: gpt3 is gpt2
    assert proc.returncode == 0 and proc.stdout.startswith("gpt3: gpt2 family;")
    # (it said "export-hf and import-hf (GPT2LMHeadModel)", which refused --model gpt3)
    assert "  Hugging Face: not served under this name; --model gpt2 is" in proc.stdout
    proc = script("list", "bert/classifier", "--hide-notes")
    assert "not served under this name; --model bert-sequence-classifier is" in proc.stdout
    proc = script("list-converters")
    for family in ("gpt2", "gptj", "gpt-neox", "codegen", "llama", "bloom", "falcon", "bert"):
        assert f"\n{family}: {family} family" in "\n" + proc.stdout
    assert "transformer: t5 family; Model Zoo registry name transformer" in proc.stdout
    assert "  Hugging Face: export-hf and import-hf (CLIPVisionModelWithProjection)" in proc.stdout
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("bert-summarization:"))
    assert lines[at + 2] == "  Hugging Face: not served"  # Model Zoo has no HF converter
    one_line_error(script("list-converters", "gpt5"), 2, "unknown model", skip_warnings=True)


def test_diff(tmp_path):
    a = MODELS / "gpt2-2.0" / CKPT
    proc = script("diff", a, a)
    assert proc.returncode == 0 and "checkpoints are identical" in proc.stdout
    proc = script("diff", MODELS / "gpt2-1.9" / CKPT, a, "--tensor_comparison_op", "allclose")
    assert proc.returncode == 4
    assert "lr_scheduler._schedulers.0.last_epoch" in proc.stdout
    assert "tensors compared (allclose)" in proc.stdout
    proc = script("diff", a, a, "--tensor_comparison_op", "close")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_help_names_the_autoload_friendly_alternative():
    for args in (["--help"], ["convert", "--help"]):
        proc = script(*args)
        assert proc.returncode == 0
        text = " ".join(proc.stdout.split())
        assert "ckpt-migrate upgrade" in text and "autoload" in text


# Model Zoo's argparse surface of convert_checkpoint.py at each tag, read by building its parsers
# (``CheckpointConverterCLI``: ``_convert`` ... up to 2.3, ``add_*_args`` from 2.4): subcommand
# -> (option, a value it takes, the dest and value it parses to). Up to 2.3 the command ran
# ``"_" + command.replace("-", "_")``, so ``convert_config`` was ``convert-config``.
MZ_SURFACE = {
    "Release_1.8.0": ("convert", "convert-config", "convert_config", "list"),
    "Release_1.9.1": ("convert", "convert-config", "convert_config", "list", "diff"),
    "Release_2.3.1": ("convert", "convert-config", "convert_config", "list", "diff"),
    "Release_2.4.3": ("convert", "convert-config", "list", "diff"),
    "Release_2.10.0": ("convert", "convert-config", "list-converters", "list"),
}
MZ_OPTIONS = {
    "convert": [
        ("--output-dir", "out", "output_dir", "out"),
        ("--export-h5-checkpoint", None, "export_h5_checkpoint", True),  # 1.8.0, 1.9.1
        ("--hf-shard-size", "5GiB", "hf_shard_size", "5GiB"),  # 2.0.2 on
        ("--export-safetensors", None, "export_safetensors", True),  # 2.1.0 on
        ("--drop-unmatched-keys", None, "drop_unmatched_keys", True),
        ("--no-progress-bar", None, "no_progress_bar", True),
        ("--debug", None, "debug", True),
    ],
    "convert-config": [
        ("--output-dir", "out", "output_dir", "out"),
        ("--debug", None, "debug", True),
    ],
    "list": [("--hide-notes", None, "hide_notes", True)],
    "diff": [("--tensor_comparison_op", "allclose", "tensor_comparison_op", "allclose")],
}
MZ_REQUIRED = {
    "convert": [
        "ckpt.mdl",
        "--model",
        "gpt2",
        "--src-fmt",
        "cs-1.9",
        "--tgt-fmt",
        "cs-2.0",
        "--config",
        "p.yaml",
    ],
    "convert-config": ["p.yaml", "--model", "gpt2", "--src-fmt", "cs-1.9", "--tgt-fmt", "cs-2.0"],
    "list": ["gpt2"],
    "diff": ["left.mdl", "right.mdl"],
}


@pytest.mark.parametrize("tag", sorted(MZ_SURFACE))
def test_every_option_model_zoo_parsed_is_parsed_the_same(tag):
    """Each subcommand, flag and default of Model Zoo's parsers at ``tag``, spelled as there."""
    parser = cc.create_arg_parser()
    for command in MZ_SURFACE[tag]:
        kind = {"convert_config": "convert-config", "list-converters": "list"}.get(command, command)
        args = parser.parse_args([command, *MZ_REQUIRED[kind]])
        defaults = {"list": ("model", "gpt2"), "diff": ("tensor_comparison_op", "equal")}
        if kind == "convert":
            assert (args.hf_shard_size, args.output_dir) == ("10GB", None)
        if kind in defaults:
            assert getattr(args, defaults[kind][0]) == defaults[kind][1]
        for option, value, dest, parsed in MZ_OPTIONS[kind]:
            given = [option] if value is None else [option, value]
            args = parser.parse_args([command, *MZ_REQUIRED[kind], *given])
            assert getattr(args, dest) == parsed, (tag, command, option)
        if kind == "list":
            assert parser.parse_args([command]).model == "all"


# ---------------------------------------------------------------- dataloader side files (#20 C)

SIDE = ROOT / "fixtures" / "release-1.9-data-iter" / "good"


def _side_config(tmp_path: Path, processor: str, seed: int | None = 7) -> Path:
    train = {"data_processor": processor, "batch_size": 8}
    if seed is not None:
        train["shuffle_seed"] = seed
    doc = {
        "train_input": train,
        "model": {"hidden_size": 4},
        "optimizer": {"optimizer_type": "SGD", "learning_rate": 0.1},
        "runconfig": {"max_steps": 20},
        "cerebras": {"save_iter_state_path": str(SIDE)},
    }
    config = tmp_path / "params.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    return config


@pytest.mark.parametrize(
    ("processor", "kind"),
    [("GptHDF5MapDataProcessor", "map"), ("GptHDF5DataProcessor", "iterable")],
)
def test_convert_reads_the_dataloader_side_files_the_config_names(tmp_path, processor, kind):
    """Model Zoo's convert takes the 1.9 side files from ``cerebras.save_iter_state_path`` and
    the style from ``train_input.data_processor`` (tag Release_2.10.0,
    src/cerebras/modelzoo/tools/checkpoint_converters/base_converter.py lines 716-742)."""
    config = _side_config(tmp_path, processor)
    out = tmp_path / "out"
    src = ROOT / "fixtures" / "release-1.9.mdl"
    args = ["--model", "gpt2", "--src-fmt", "cs-1.9", "--tgt-fmt", "cs-2.0"]
    assert (
        cc.main(["convert", str(src), *args, "--config", str(config), "--output-dir", str(out)])
        == 0
    )
    with read_checkpoint(out / "release-1.9_to_cs-2.0.mdl") as ckpt:
        leaves = {r.name: r.leaf for r in iter_leaves(ckpt.root)}
    values = {n: int(leaf.value) for n, leaf in leaves.items() if n.startswith("dataloader.")}
    if kind == "map":
        assert values == {"dataloader.samples_streamed": 640 + 640 + 600, "dataloader.seed": 7}
    else:
        streamed = [v for n, v in values.items() if n.endswith(".samples_streamed")]
        assert sorted(streamed) == [600, 640, 640]
    done = yaml.safe_load((out / "params_to_cs-2.0.yaml").read_text())
    assert "cerebras" not in done  # 2.0 has no cerebras section (as Model Zoo pops it)


def test_convert_refuses_side_files_whose_style_the_config_does_not_say(tmp_path):
    config = _side_config(tmp_path, "BertCSVDataProcessor")
    src = ROOT / "fixtures" / "release-1.9.mdl"
    args = ["--model", "gpt2", "--src-fmt", "cs-1.9", "--tgt-fmt", "cs-2.0", "--config", config]
    proc = script("convert", src, *args, "--output-dir", tmp_path / "out")
    line = one_line_error(proc, 2, "train_input.data_processor", skip_warnings=True)
    assert "GptHDF5MapDataProcessor" in line and str(config) in line


def _model_tensors(path: Path) -> dict[str, bytes]:
    with read_checkpoint(path) as ckpt:
        return {
            r.name.removeprefix("model.").removeprefix("model."): np.ascontiguousarray(
                r.leaf.data.read()
            ).tobytes()
            for r in iter_leaves(ckpt.root.get("model"))
            if isinstance(r.leaf, TensorLeaf)
        }


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_convert_to_hf_and_back_as_model_zoo_names_them(tmp_path, family):
    """cs-1.9 -> hf -> cs-2.10 (issue #23): Model Zoo's directory and file names, and the model
    tensors of the result are the direct 1.9 -> 2.10 upgrade's, bit for bit."""
    ckpt, config = copy_fixture(tmp_path, f"{family}-1.9")
    base = ["--model", family, "--config", config]
    proc = script("convert", ckpt, *base, "--src-fmt", "cs-auto", "--tgt-fmt", "hf")
    assert proc.returncode == 0, proc.stderr
    hf = ckpt.parent / "checkpoint_100_to_hf"
    assert sorted(p.name for p in hf.iterdir()) == ["config.json", "model.safetensors"]
    assert f"Checkpoint saved to {hf}" in proc.stdout

    back = ["--model", family, "--config", hf / "config.json", "--output-dir", tmp_path / "cs"]
    proc = script("convert", hf, *back, "--src-fmt", "hf", "--tgt-fmt", "cs-2.10")
    assert proc.returncode == 0, proc.stderr
    result = tmp_path / "cs" / "checkpoint_100_to_hf_to_cs-2.10.mdl"
    assert release_of_file(result) == "2.10"
    params = yaml.safe_load((tmp_path / "cs" / "config_to_cs-2.10.yaml").read_text())
    assert params["trainer"]["init"]["model"]["name"] == family

    to_2_10 = ["--src-fmt", "cs-1.9", "--tgt-fmt", "cs-2.10", "--drop-dataloader-state"]
    direct = script("convert", ckpt, *base, *to_2_10)
    assert direct.returncode == 0, direct.stderr
    expected = _model_tensors(ckpt.parent / "checkpoint_100_to_cs-2.10.mdl")
    assert _model_tensors(result) == expected


def release_of_file(path: Path) -> str:
    with read_checkpoint(path) as ckpt:
        return ckpt.release.name


def _norm_keys(config: Path) -> dict:
    model = yaml.safe_load(config.read_text())["trainer"]["init"]["model"]
    return {k: v for k, v in model.items() if k in ("norm_type", "use_rms_norm")}


@pytest.mark.parametrize("src_fmt", ["cs-1.9", "cs-auto"])
def test_the_documented_fix_then_convert_workflow(tmp_path, src_fmt):
    """Release 2.0's documentation: ``fix_checkpoint_spec.py``, then "you still need to use
    the convert_checkpoint.py", from ``cs-1.9``. The fix (here an upgrade to 2.0) left a file
    that says 2.0, and ``--src-fmt cs-1.9`` was refused; ``cs-auto``, which the refusal
    suggested, converted the 1.9 config from 2.0 and kept ``use_rms_norm``, which 2.0 no
    longer reads (the Llama of the Model Zoo fixture became a LayerNorm model), saying
    nothing. The config now goes from 1.9 and the checkpoint from 2.0, and the checkpoint is
    the direct conversion's, tensor for tensor."""
    ckpt, config = copy_fixture(tmp_path, "llama-1.9")
    fixed = run_script("fix_checkpoint_spec.py", ckpt)
    assert fixed.returncode == 0, fixed.stderr
    fixed_ckpt = ckpt.with_name("checkpoint_100_fixed.mdl")
    to_2_3 = ["--model", "llama", "--tgt-fmt", "cs-2.3", "--config", config]
    proc = script("convert", fixed_ckpt, "--src-fmt", src_fmt, *to_2_3)
    assert proc.returncode == 0, proc.stderr
    assert "still 1.9's" in proc.stdout or "its config from 1.9" in proc.stdout, proc.stdout
    assert "config 1.9 → 2.3" in proc.stdout
    out = ckpt.parent / "params_to_cs-2.3.yaml"
    assert _norm_keys(out) == {"norm_type": "rmsnorm"}
    tensors = _model_tensors(ckpt.parent / "checkpoint_100_fixed_to_cs-2.3.mdl")
    out.rename(tmp_path / "first.yaml")
    direct = script("convert", ckpt, "--src-fmt", "cs-1.9", *to_2_3, "--drop-dataloader-state")
    assert direct.returncode == 0, direct.stderr
    assert _model_tensors(ckpt.parent / "checkpoint_100_to_cs-2.3.mdl") == tensors
    assert out.read_text() == (tmp_path / "first.yaml").read_text()


def test_a_fixed_checkpoint_at_the_target_has_its_config_converted(tmp_path):
    """``--tgt-fmt cs-2.0`` after the fix: the checkpoint is at 2.0 already, its 1.9 config is
    not (it said "nothing to convert" and wrote nothing)."""
    ckpt, config = copy_fixture(tmp_path, "llama-1.9")
    assert run_script("fix_checkpoint_spec.py", ckpt).returncode == 0
    fixed_ckpt = ckpt.with_name("checkpoint_100_fixed.mdl")
    args = ["--model", "llama", "--src-fmt", "cs-1.9", "--tgt-fmt", "cs-2.0", "--config", config]
    proc = script("convert", fixed_ckpt, *args)
    assert proc.returncode == 0, proc.stderr
    assert "already at release 2.0; only its config is converted" in proc.stdout
    model = yaml.safe_load((ckpt.parent / "params_to_cs-2.0.yaml").read_text())["model"]
    assert model["norm_type"] == "rmsnorm" and "use_rms_norm" not in model
    assert not ckpt.with_name("checkpoint_100_fixed_to_cs-2.0.mdl").exists()
    # a release the checkpoint was not upgraded from is still refused
    args[3] = "cs-1.8"
    one_line_error(script("convert", fixed_ckpt, *args), 2, "file says release 2.0")


def test_ckpt_migrate_upgrade_converts_a_fixed_checkpoints_config_from_its_release(tmp_path):
    """``ckpt-migrate upgrade --config`` of a checkpoint the fix upgraded without its config:
    the config is upgraded from 1.9, and the report says why."""
    ckpt, config = copy_fixture(tmp_path, "llama-1.9")
    assert run_script("fix_checkpoint_spec.py", ckpt).returncode == 0
    fixed_ckpt = ckpt.with_name("checkpoint_100_fixed.mdl")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_migrate", "upgrade", str(fixed_ckpt), "--config",
         str(config), "-o", str(out), "--progress", "none"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "config 1.9 → 2.10" in proc.stdout and "which is still 1.9's" in proc.stdout
    assert _norm_keys(out / "params.yaml") == {"norm_type": "rmsnorm"}


def test_hf_source_file_converts_into_its_own_directory(tmp_path):
    """``--src-fmt hf`` with a file of the HF directory and no ``--output-dir``: Model Zoo
    writes beside the input (``os.path.split(checkpoint_file)``); the checkpoint went one
    directory up."""
    ckpt, config = copy_fixture(tmp_path, "gpt2-2.0")
    base = ["--model", "gpt2", "--config", config, "--src-fmt", "cs-auto", "--tgt-fmt", "hf"]
    assert script("convert", ckpt, *base).returncode == 0
    hf = ckpt.parent / "checkpoint_100_to_hf"
    back = ["--model", "gpt2", "--config", hf / "config.json", "--src-fmt", "hf"]
    proc = script("convert", hf / "model.safetensors", *back, "--tgt-fmt", "cs-2.3")
    assert proc.returncode == 0, proc.stderr
    assert (hf / "model_to_cs-2.3.mdl").is_file() and (hf / "config_to_cs-2.3.yaml").is_file()
    assert not (ckpt.parent / "model_to_cs-2.3.mdl").exists()


def test_cs_auto_converts_from_the_release_it_names(tmp_path):
    """A format 0.5 file without ``__cstorch_version__`` (the real 2.9 library's Trainer file,
    that attribute deleted), dated 2.9 by its ``__metadata__``: ``cs-auto`` said "release 2.9"
    and the conversion went from 2.5, the format's first release (hops ``2.5→2.6`` …)."""
    import lzma

    import h5py

    src = tmp_path / "trainer.mdl"
    packed = FIXTURES / "real-cstorch-2.6-2.9" / "trainer-2.9.0.mdl.xz"
    src.write_bytes(lzma.decompress(packed.read_bytes()))
    with h5py.File(src, "r+") as f:
        del f.attrs["__cstorch_version__"]
    config = tmp_path / "params.yaml"
    config.write_text("trainer:\n  init:\n    model:\n      name: gpt2\n")
    args = ["--model", "gpt2", "--src-fmt", "cs-auto", "--config", config]
    proc = script("convert", src, *args, "--tgt-fmt", "cs-2.10")
    assert proc.returncode == 0, proc.stderr
    assert "cs-auto: release 2.9 (__metadata__ version" in proc.stdout
    with h5py.File(tmp_path / "trainer_to_cs-2.10.mdl", "r") as f:
        record = json.loads(f.attrs["__ckpt_migrate__"])[-1]
    assert record["source_release"] == "2.9" and record["hops"] == ["2.9→2.10"]
