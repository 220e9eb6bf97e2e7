"""``ckpt-migrate upgrade --config``: the run's params.yaml upgraded alongside its checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import pytest
import yaml
from conftest import CONFIGS, FIXTURES, MODELS, one_line_error, run_capped, run_cli, run_script

EXAMPLE = FIXTURES / "example"  # (a 1.9 model directory: checkpoint, params.yaml, side files)


def comments_kept(source: str, output: str, removed: set[str]) -> list[str]:
    """Comment texts of ``source`` missing from ``output``, except those on removed keys."""
    missing = []
    for line in source.splitlines():
        if "#" not in line:
            continue
        code, _, comment = line.partition("#")
        key = code.strip().rstrip(":").split(":")[0].strip()
        if key and key in removed:
            continue
        if comment.strip() and comment.strip() not in output:
            missing.append(comment.strip())
    return missing


def test_gpt2_fixture_and_its_config_go_from_2_0_to_2_10(tmp_path):
    src = MODELS / "gpt2-2.0"
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli(
        "upgrade", src / "checkpoint_100.mdl", "--output-dir", out, "--config", src / "params.yaml"
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "checkpoint_100.mdl").is_file()
    written = out / "params.yaml"  # --output-dir keeps the config's name, like the checkpoint's
    assert f"written to {written}" in proc.stdout
    text = written.read_text()
    got = yaml.safe_load(text)
    init = got["trainer"]["init"]
    assert init["model"]["name"] == "gpt2"  # the family the checkpoint's keys showed
    assert init["optimizer"]["AdamW"]["betas"] == [0.9, 0.95]
    assert init["precision"]["fp16_type"] == "bfloat16"
    assert got["trainer"]["fit"]["train_dataloader"]["batch_size"] == 8
    assert "model family gpt2 (checkpoint keys)" in proc.stdout
    # the key no converter knows is kept and reported
    assert init["model"]["local_fused_softmax"] == 0
    assert re.search(r"\[2\.2→2\.3\] unknown: model\.local_fused_softmax", proc.stdout)
    removed = {m.group(1).rsplit(".", 1)[-1] for m in re.finditer(r"removed: (\S+)", proc.stdout)}
    source = (src / "params.yaml").read_text()
    assert comments_kept(source, text, removed) == []
    assert text.startswith("# GPT-2 (tiny) as a Cerebras Model Zoo 2.0 run")
    assert (src / "params.yaml").read_text() == source  # the source is never touched


def test_t5_fixture_json_report_and_model_name(tmp_path):
    src = MODELS / "t5-2.0"
    out = tmp_path / "out"
    out.mkdir()
    base = ("upgrade", src / "checkpoint_100.mdl", "--output-dir", out, "--config")
    proc = run_cli(*base, src / "params.yaml", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    cfg = data["config"]
    assert cfg["from"] == "2.0" and cfg["to"] == "2.10" and cfg["family"] == "t5"
    assert cfg["output"] == str(out / "params.yaml")
    kinds = {e["kind"] for e in cfg["report"]}
    assert {"changed", "removed", "unknown"} <= kinds
    # T5 and Transformer share their keys: the name is asked for, not guessed
    ask = [e for e in cfg["report"] if e["key"] == "trainer.init.model.name"]
    assert ask and ask[0]["kind"] == "unknown" and ask[0]["hop"] == "2.3→2.4"
    assert (
        "name" not in yaml.safe_load((out / "params.yaml").read_text())["trainer"]["init"]["model"]
    )
    # with --model the name is written
    out2 = tmp_path / "out2"
    out2.mkdir()
    proc = run_cli(*base[:3], out2, "--config", src / "params.yaml", "--model", "t5")
    assert proc.returncode == 0, proc.stderr
    text = (out2 / "params.yaml").read_text()
    assert yaml.safe_load(text)["trainer"]["init"]["model"]["name"] == "t5"
    assert "# 2.0 replaced use_t5_layer_norm" in text
    assert "# global batch (1.9+), split across num_csx systems" in text


def test_dry_run_shows_the_config_report_and_writes_nothing(tmp_path):
    cfg = tmp_path / "params.yaml"
    shutil.copy(CONFIGS / "gpt2-2.0.yaml", cfg)
    proc = run_cli(
        "upgrade", FIXTURES / "release-2.0.mdl", "--dry-run", "--config", cfg, "--model", "gpt2"
    )
    assert proc.returncode == 0, proc.stderr
    assert "config 2.0 → 2.10, model family gpt2 (from --model)" in proc.stdout
    assert "removed: runconfig.save_losses" in proc.stdout
    assert f"not written (dry run): {tmp_path / 'params.2.10.yaml'}" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_an_existing_config_output_is_refused_before_anything_is_written(tmp_path):
    cfg = tmp_path / "params.yaml"
    shutil.copy(CONFIGS / "gpt2-2.0.yaml", cfg)
    out = tmp_path / "out"
    out.mkdir()
    (out / "params.yaml").write_text("mine: 1\n")
    src = tmp_path / "release-2.0.mdl"  # a private copy: an upgrade locks its source
    shutil.copyfile(FIXTURES / "release-2.0.mdl", src)
    proc = run_cli("upgrade", src, "--output-dir", out, "--config", cfg)
    one_line_error(proc, 2, str(out / "params.yaml"), "refusing to overwrite", "--config-out")
    assert sorted(p.name for p in out.iterdir()) == ["params.yaml"]
    assert (out / "params.yaml").read_text() == "mine: 1\n"
    proc = run_cli(
        "upgrade",
        src,
        "--output-dir",
        out,
        "--config",
        cfg,
        "--config-out",
        cfg,
    )
    one_line_error(proc, 2, "would overwrite the config itself")


def test_config_out_and_inplace_default_name(tmp_path):
    cfg = tmp_path / "params.yaml"
    shutil.copy(CONFIGS / "t5-2.0.yaml", cfg)
    ckpt = tmp_path / "checkpoint_5.mdl"
    shutil.copy(FIXTURES / "release-2.0.mdl", ckpt)
    proc = run_cli("upgrade", ckpt, "--inplace", "--to", "2.3", "--config", cfg, "--model", "t5")
    assert proc.returncode == 0, proc.stderr
    beside = tmp_path / "params.2.3.yaml"
    assert "trainer" in yaml.safe_load(beside.read_text())
    assert cfg.read_text() == (CONFIGS / "t5-2.0.yaml").read_text()
    custom = tmp_path / "sub" / "t5.yaml"
    custom.parent.mkdir()
    out = tmp_path / "o"
    out.mkdir()
    src = tmp_path / "release-2.0.mdl"  # a private copy: an upgrade locks its source
    shutil.copyfile(FIXTURES / "release-2.0.mdl", src)
    proc = run_cli(
        "upgrade",
        src,
        "--output-dir",
        out,
        "--to",
        "2.1",
        "--config",
        cfg,
        "--config-out",
        custom,
        "--model",
        "t5",
    )
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(custom.read_text())["optimizer"]["eps"] == [1e-30, 1e-3]
    assert not (out / "params.yaml").exists()


def test_num_csx_and_config_out_need_config():
    """Both verbs that upgrade a config alongside refuse its options without it."""
    for verb, path in [("upgrade", FIXTURES / "release-2.0.mdl"), ("upgrade-dir", EXAMPLE)]:
        for option, value in [("--num-csx", "2"), ("--config-out", "x.yaml")]:
            proc = run_cli(verb, path, "--dry-run", option, value)
            one_line_error(proc, 2, "--config-out and --num-csx apply to --config")


def test_num_csx_scales_a_1_8_batch_size(tmp_path):
    cfg = tmp_path / "params.yaml"
    cfg.write_text("train_input:\n  batch_size: 16 # per system\nmodel:\n  hidden_size: 4\n")
    out = tmp_path / "o"
    out.mkdir()
    proc = run_cli(
        "upgrade",
        FIXTURES / "release-1.8.mdl",
        "--output-dir",
        out,
        "--to",
        "1.9",
        "--config",
        cfg,
        "--num-csx",
        "4",
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "params.yaml").read_text() == (
        "train_input:\n  batch_size: 64 # per system\nmodel:\n  hidden_size: 4\n"
    )
    assert "train_input.batch_size: 16 → 64" in proc.stdout


def test_config_still_feeds_the_tie_rules_and_is_not_written_when_the_checkpoint_fails(tmp_path):
    cfg = tmp_path / "params.yaml"
    cfg.write_text("model:\n  share_embedding_weights: false\n")
    out = tmp_path / "o"
    out.mkdir()
    proc = run_cli("upgrade", FIXTURES / "release-1.9.mdl", "--output-dir", out, "--config", cfg)
    one_line_error(proc, 2, "model.lm_head.weight", "--allow-missing")
    assert list(out.iterdir()) == []


def _bomb(levels: int = 9) -> str:
    """YAML aliases, nine of the level below at each level: 9**levels values from 1 KiB."""
    lines = ["bomb_0: &b0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"bomb_{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


HOSTILE_CONFIGS = {
    "aliases": (_bomb(), "more than 100,000 values once its aliases are expanded"),
    "flow nesting": ("deep: " + "[" * 3000 + "]" * 3000 + "\n", "nested more than 64 deep"),
    "nesting": ("deep: " + "[" * 70 + "]" * 70 + "\n", "nested more than 64 deep"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_CONFIGS))
def test_a_hostile_config_is_one_line_quickly(tmp_path, case):
    """Model Zoo's own params.yaml with a few hostile lines appended: an alias bomb of 1 KiB
    (43 million values once expanded) took minutes; deep nesting was an internal error."""
    extra, words = HOSTILE_CONFIGS[case]
    config = tmp_path / "params.yaml"
    config.write_text((CONFIGS / "modelzoo-gpt2-small-2.2.yaml").read_text() + extra)
    start = time.monotonic()
    proc = run_cli(
        "upgrade", MODELS / "gpt2-2.0" / "checkpoint_100.mdl", "--config", config,
        "--output-dir", tmp_path, "--dry-run",
    )  # fmt: skip
    one_line_error(proc, 2, "params.yaml", words)
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("verb", ["upgrade", "export-hf", "convert_checkpoint.py"])
def test_a_file_that_is_not_a_config_is_one_line(tmp_path, verb):
    """A checkpoint passed as the config (bytes that are not UTF-8) was an internal error; a
    file over 1 MiB is not read."""
    ckpt = MODELS / "gpt2-2.0" / "checkpoint_100.mdl"
    huge = tmp_path / "huge.yaml"
    with huge.open("w") as f:
        f.truncate(2 << 20)
    for config, words in ((ckpt, "cannot read the config"), (huge, "not a config")):
        if verb == "convert_checkpoint.py":
            proc = run_script(
                verb, "convert", ckpt, "--model", "gpt2", "--src-fmt", "cs-2.0",
                "--tgt-fmt", "cs-2.3", "--config", config,
            )  # fmt: skip
        elif verb == "export-hf":
            proc = run_cli(verb, ckpt, tmp_path / "hf", "--config", config)
        else:
            proc = run_cli(verb, ckpt, "--config", config, "--output-dir", tmp_path, "--dry-run")
        one_line_error(proc, 2, config.name, words)


def test_a_shuffle_seed_that_is_not_an_integer_is_one_line(tmp_path):
    """The 1.9 example run's params.yaml with its seed edited: a string, a list or infinity
    was an internal error, and ``1.5`` or ``true`` became seed 1 silently."""
    text = (EXAMPLE / "params.yaml").read_text()
    assert "shuffle_seed: 1337" in text
    for value in ('"abc"', "[1]", "1.5", "true", "1e400"):
        config = tmp_path / "params.yaml"
        config.write_text(text.replace("shuffle_seed: 1337", f"shuffle_seed: {value}"))
        proc = run_cli(
            "upgrade", EXAMPLE / "checkpoint_100.mdl", "--config", config,
            "--data-iter-dir", EXAMPLE / "dataloader", "--dataloader-type", "map",
            "--output-dir", tmp_path / "out", "--dry-run",
        )  # fmt: skip
        one_line_error(proc, 2, "train_input.shuffle_seed is", "not an integer", "--shuffle-seed")


def test_a_config_saved_with_windows_line_endings_keeps_them(tmp_path):
    """Model Zoo's params.yaml with CRLF endings (and a byte order mark, as Windows editors
    write) came back with LF on every line (a diff of the whole file) and no mark; the
    upgraded config is the same text, with the source's endings and mark."""
    src = MODELS / "gpt2-2.0"
    crlf = tmp_path / "crlf" / "params.yaml"
    crlf.parent.mkdir()
    bom = b"\xef\xbb\xbf"
    crlf.write_bytes(bom + (src / "params.yaml").read_bytes().replace(b"\n", b"\r\n"))
    outs = {}
    for name, config in (("lf", src / "params.yaml"), ("crlf", crlf)):
        out = tmp_path / f"out-{name}"
        out.mkdir()
        proc = run_cli(
            "upgrade", src / "checkpoint_100.mdl", "--output-dir", out, "--config", config
        )
        assert proc.returncode == 0, proc.stderr
        outs[name] = (out / "params.yaml").read_bytes()
    assert outs["lf"].count(b"\n") > 50 and b"\r" not in outs["lf"]
    assert outs["crlf"] == bom + outs["lf"].replace(b"\n", b"\r\n")


def test_a_named_pipe_as_the_config_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "params.yaml"
    os.mkfifo(fifo)
    ckpt = MODELS / "gpt2-2.0" / "checkpoint_100.mdl"
    proc, _ = run_capped("upgrade", ckpt, "--config", fifo, "--dry-run", seconds=60)
    one_line_error(proc, 2, "params.yaml", "not a regular file")


def test_a_config_downgrade_with_no_way_back_is_refused_before_the_checkpoint(tmp_path):
    """``upgrade --config --to 2.2`` of a file the real 2.9 library wrote: the config cannot
    go back across the 2.3 trainer layout. The dry run refused it; the real run published the
    2.2 checkpoint first, then said so (exit 2), and its rerun met "already exists"."""
    lzma = pytest.importorskip("lzma")
    src = tmp_path / "trainer-2.9.0.mdl"
    packed = FIXTURES / "real-cstorch-2.6-2.9" / "trainer-2.9.0.mdl.xz"
    src.write_bytes(lzma.decompress(packed.read_bytes()))
    config = tmp_path / "params.yaml"
    config.write_text("trainer:\n  init:\n    model:\n      name: gpt2\n")
    out = tmp_path / "out"
    for dry in ([], ["--dry-run"]):
        proc = run_cli("upgrade", src, "--config", config, "--to", "2.2", "-o", out, *dry)
        one_line_error(proc, 2, "cannot downgrade the config from 2.9 to 2.2")
        assert not out.exists(), list(out.iterdir())
    proc = run_cli("upgrade", src, "--to", "2.2", "-o", out)  # (the checkpoint alone goes)
    assert proc.returncode == 0, proc.stderr


def test_a_dry_run_refuses_the_config_output_the_run_refuses(tmp_path):
    """``--dry-run`` with a config output that exists, or in a directory that does not: the
    real run refused it (exit 2), its dry run said "not written (dry run)" and exit 0."""
    ckpt = FIXTURES / "release-2.0.mdl"
    config = CONFIGS / "gpt2-2.0.yaml"
    out = tmp_path / "out"
    out.mkdir()
    (out / config.name).write_text("precious\n")
    for dry in ([], ["-n"]):
        proc = run_cli("upgrade", ckpt, "-o", out, "--config", config, *dry)
        one_line_error(proc, 2, "already exists", "remove it or pass --config-out")
        given = ["--config-out", tmp_path / "nodir" / "x.yaml"]
        proc = run_cli("upgrade", ckpt, "-o", tmp_path / "o2", "--config", config, *given, *dry)
        one_line_error(proc, 2, "its directory does not exist")
    proc = run_cli(
        "upgrade", ckpt, "-o", out, "--config", config, "--config-out", out / config.name
    )
    one_line_error(proc, 2, "already exists", "pass another --config-out")
    assert (out / config.name).read_text() == "precious\n" and not (tmp_path / "o2").exists()
