"""The 1.x → 2.0 release steps and the two script front ends, on the shipped fixtures."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import h5py
import pytest
from conftest import FIXTURES, one_line_error, run_cli, run_script

from ckpt_migrate.cli import commands
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import TensorLeaf, ValueLeaf, get_path, iter_leaves
from ckpt_migrate.models import ties

SIDE = FIXTURES / "release-1.9-data-iter"
EMBED = "model.embedding_layer.word_embeddings.weight"


def upgrade(src: Path, out: Path, *args: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    proc = run_cli("upgrade", str(src), "--output-dir", str(out), "--json", *args)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return json.loads(proc.stdout)


def leaves(path: Path) -> dict:
    with read_checkpoint(path) as ckpt:
        return {r.name: r.leaf for r in iter_leaves(ckpt.root)}


def value(leaf) -> int:
    if isinstance(leaf, TensorLeaf):
        return int(leaf.data.read())
    return leaf.value


@pytest.mark.parametrize("target", ["2.0", "2.10"])
def test_1_9_upgrade_restores_tie_scheduler_and_map_dataloader(tmp_path, target):
    src = FIXTURES / "release-1.9.mdl"
    res = upgrade(
        src,
        tmp_path,
        "--to",
        target,
        "--data-iter-dir",
        str(SIDE / "good"),
        "--dataloader-type",
        "map",
        "--shuffle-seed",
        "1234",
    )
    out = tmp_path / src.name
    got = leaves(out)
    assert got["model.lm_head.weight"] is got[EMBED]  # one stored tensor under both names
    assert value(got["lr_scheduler.last_epoch"]) == 10
    assert value(got["lr_scheduler._schedulers.0.last_epoch"]) == 10
    decay = got["lr_scheduler._schedulers.1.last_epoch"]  # max(10 - 5, 0), still an int64 tensor
    assert isinstance(decay, TensorLeaf) and decay.dtype == "int64" and value(decay) == 5
    assert value(got["dataloader.samples_streamed"]) == 640 + 640 + 600
    assert value(got["dataloader.seed"]) == 1234
    changed = {c.split("] ", 1)[1].split(":")[0] for c in res["changes"]}
    assert {"model.lm_head.weight", "lr_scheduler.last_epoch", "dataloader"} <= changed
    allowed = {
        "model.lm_head.weight",
        "lr_scheduler.last_epoch",
        "lr_scheduler._schedulers.0.last_epoch",
        "lr_scheduler._schedulers.1.last_epoch",
        "dataloader.samples_streamed",
        "dataloader.seed",
    }
    diffs = commands.verify(src, out)["differences"]
    assert {d["name"] for d in diffs} <= allowed, diffs


def test_1_9_iterable_dataloader_sorted_by_shard(tmp_path):
    res = upgrade(
        FIXTURES / "release-1.9.mdl",
        tmp_path,
        "--data-iter-dir",
        str(SIDE / "stray_notes"),
        "--dataloader-type",
        "iterable",
    )
    assert any("notes.txt" in w and "ignored" in w for w in res["warnings"])
    with read_checkpoint(tmp_path / "release-1.9.mdl") as ckpt:
        states = get_path(ckpt.root, ("dataloader", "all_worker_states"))
        got = [
            (get_path(s, ("shard_index",)).value, get_path(s, ("samples_streamed",)).value)
            for s in states.items
        ]
    assert got == [(0, 640), (1, 640), (2, 600)]


def test_1_7_spec_fix_and_scheduler(tmp_path):
    src = FIXTURES / "release-1.7.mdl"
    with read_checkpoint(src) as ckpt:
        assert ckpt.had_tensor_scalar_dict
        assert get_path(ckpt.root, ("lr_scheduler",)).origin == "TensorScalarDict"
    res = upgrade(src, tmp_path, "--to", "2.0")
    assert any("TensorScalarDict" in c for c in res["changes"])
    out = tmp_path / src.name
    with h5py.File(out, "r") as f:
        assert b"TensorScalarDict" not in bytes.fromhex(f.attrs["__spec__"])
    with read_checkpoint(out) as ckpt:
        assert not ckpt.had_tensor_scalar_dict
        sched = get_path(ckpt.root, ("lr_scheduler",))
        assert get_path(sched, ("last_epoch",)).value == 10
        assert get_path(sched, ("milestones", 5)).value == 1  # MultiStepLR's are not touched


@pytest.mark.parametrize(
    ("variant", "words"),
    [
        ("missing_worker", ["worker(s) 1", "step 10"]),
        ("duplicate_worker", ["worker 1 has 2 files", "worker_01_step_10"]),
        ("wrong_step", ["step 12", "at 10", "--allow-step-mismatch"]),
    ],
)
def test_broken_side_files_are_one_line_errors(tmp_path, variant, words):
    proc = run_cli(
        "upgrade",
        str(FIXTURES / "release-1.9.mdl"),
        "--output-dir",
        str(tmp_path),
        "--data-iter-dir",
        str(SIDE / variant),
        "--dataloader-type",
        "iterable",
    )
    one_line_error(proc, None, variant, *words, skip_warnings=True)
    assert list(tmp_path.iterdir()) == []
    proc = run_script(
        "data_iter_state_conversion.py",
        "-c",
        str(FIXTURES / "release-1.9.mdl"),
        "-w",
        str(SIDE / variant),
        "-o",
        str(tmp_path / "x.mdl"),
        "-d",
        "iterable",
    )
    one_line_error(proc, None, variant, skip_warnings=True)
    assert list(tmp_path.iterdir()) == []


def test_step_mismatch_can_be_allowed(tmp_path):
    res = upgrade(
        FIXTURES / "release-1.9.mdl",
        tmp_path,
        "--data-iter-dir",
        str(SIDE / "wrong_step"),
        "--dataloader-type",
        "iterable",
        "--allow-step-mismatch",
    )
    assert any("step 12" in w for w in res["warnings"])


def test_map_seed_is_never_guessed(tmp_path):
    src = str(FIXTURES / "release-1.9.mdl")
    base = [
        "upgrade",
        src,
        "--output-dir",
        str(tmp_path),
        "--data-iter-dir",
        str(SIDE / "good"),
        "--dataloader-type",
        "map",
    ]
    one_line_error(run_cli(*base), None, "shuffle seed", skip_warnings=True)
    cfg = tmp_path / "params.yaml"
    cfg.write_text("train_input:\n  shuffle: true\n  shuffle_seed: 77\n")
    out = tmp_path / "a"
    out.mkdir()
    base[3] = str(out)
    assert run_cli(*base, "--config", str(cfg)).returncode == 0
    assert value(leaves(out / "release-1.9.mdl")["dataloader.seed"]) == 77
    cfg.write_text("train_input:\n  shuffle: true\n")
    out_b = tmp_path / "b"
    out_b.mkdir()
    base[3] = str(out_b)
    one_line_error(run_cli(*base, "--config", str(cfg)), None, "shuffle seed", skip_warnings=True)


@pytest.mark.parametrize("release", ["1.8", "1.9"])
def test_without_side_files_it_refuses_unless_dropped_by_name(tmp_path, release):
    """1.8 and 1.9 kept the dataloader state in side files: losing it is an error (exit 2)
    naming --drop-dataloader-state, on upgrade and upgrade-dir. fix_checkpoint_spec.py, whose
    documented next step converts them, fixes the spec and names that step instead."""
    src = FIXTURES / f"release-{release}.mdl"
    out = tmp_path / "out"
    out.mkdir()
    for extra in ((), ("--strict",)):
        proc = run_cli("upgrade", str(src), "--output-dir", str(out), *extra)
        line = one_line_error(proc, 2, "restart from the first sample", skip_warnings=True)
        assert "--drop-dataloader-state" in line and "--data-iter-dir" in line
    assert list(out.iterdir()) == []
    model_dir = tmp_path / "model_dir"
    model_dir.mkdir()
    (model_dir / "checkpoint_10.mdl").write_bytes(src.read_bytes())
    proc = run_cli("upgrade-dir", str(model_dir), "--output-dir", str(tmp_path / "dir_out"))
    assert proc.returncode == 2 and "--drop-dataloader-state" in proc.stdout + proc.stderr
    fixed = tmp_path / "fixed.mdl"
    proc = run_script("fix_checkpoint_spec.py", str(src), "--fixed_checkpoint_path", str(fixed))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [line] = [line for line in proc.stdout.splitlines() if "dataloader state" in line]
    assert "not converted" in line and "data_iter_state_conversion.py" in line
    assert f"-c {fixed}" in line and "-w" in line and "--data-iter-dir" in line
    assert "dataloader" not in {n.split(".")[0] for n in leaves(fixed)}
    fixed.unlink()
    res = upgrade(src, out, "--drop-dataloader-state")
    assert any("dataloader state dropped (--drop-dataloader-state)" in c for c in res["changes"])
    assert "dataloader" not in {n.split(".")[0] for n in leaves(out / src.name)}
    proc = run_cli(
        "upgrade-dir",
        str(model_dir),
        "--output-dir",
        str(tmp_path / "d2"),
        "--drop-dataloader-state",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_script(
        "fix_checkpoint_spec.py",
        str(src),
        "--fixed_checkpoint_path",
        str(fixed),
        "--drop-dataloader-state",
    )
    assert proc.returncode == 0, proc.stderr


def test_a_1_7_file_had_no_side_files_and_is_neither_warned_nor_refused(tmp_path):
    res = upgrade(FIXTURES / "release-1.7.mdl", tmp_path)
    said = res["warnings"] + res["changes"]
    assert not any("dataloader" in line for line in said), said


def test_data_iter_script_takes_the_documented_defaults_and_says_so(tmp_path):
    """The documented defaults: without -d a map-style state, without -s (or a --config seed)
    seed 0, each said in one line; a config's seed wins over 0; --allow-step-mismatch is
    accepted as its message says."""
    src = str(FIXTURES / "release-1.9.mdl")
    base = ("data_iter_state_conversion.py", "-c", src, "-w", str(SIDE / "good"))
    proc = run_script(*base, "-o", str(tmp_path / "a.mdl"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "assuming a map-style dataloader" in proc.stdout
    [seed] = [line for line in proc.stderr.splitlines() if "seed 0 assumed" in line]
    assert seed.startswith("warning: ") and "documented default" in seed
    got = leaves(tmp_path / "a.mdl")
    assert value(got["dataloader.seed"]) == 0 and "dataloader.samples_streamed" in got
    cfg = tmp_path / "params.yaml"
    cfg.write_text("train_input:\n  shuffle: true\n  shuffle_seed: 77\n")
    proc = run_script(*base, "-o", str(tmp_path / "c.mdl"), "-d", "map", "--config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert "assumed" not in proc.stderr
    assert value(leaves(tmp_path / "c.mdl")["dataloader.seed"]) == 77
    wrong = ("data_iter_state_conversion.py", "-c", src, "-w", str(SIDE / "wrong_step"))
    proc = run_script(*wrong, "-o", str(tmp_path / "b.mdl"), "--dataloader-type", "iterable")
    line = one_line_error(proc, 2, "step 12", skip_warnings=True)
    assert "--allow-step-mismatch" in line
    proc = run_script(
        *wrong, "-o", str(tmp_path / "b.mdl"), "-d", "iterable", "--allow-step-mismatch"
    )
    assert proc.returncode == 0, proc.stderr
    # a file that has its state already: the fix said "omit --data-iter-dir", which this
    # script requires (-w)
    again = ("data_iter_state_conversion.py", "-c", tmp_path / "a.mdl", "-w", SIDE / "good")
    line = one_line_error(run_script(*again, "-o", tmp_path / "d.mdl"), 2, "already has")
    assert "use it as it is" in line and "omit" not in line


def test_config_can_turn_the_tie_off(tmp_path):
    cfg = tmp_path / "params.yaml"
    cfg.write_text("model:\n  share_embedding_weights: false\n")
    out = tmp_path / "o"
    out.mkdir()
    src = str(FIXTURES / "release-1.9.mdl")
    proc = run_cli("upgrade", src, "--output-dir", str(out), "--config", str(cfg))
    one_line_error(proc, None, "model.lm_head.weight", "--allow-missing", skip_warnings=True)
    res = upgrade(
        Path(src),
        out,
        "--config",
        str(cfg),
        "--allow-missing",
        "--to",
        "2.0",
        "--drop-dataloader-state",
    )
    assert any("model.lm_head.weight" in w and "None" in w for w in res["warnings"])
    got = leaves(out / "release-1.9.mdl")
    assert isinstance(got["model.lm_head.weight"], ValueLeaf)
    assert got["model.lm_head.weight"].value is None


def test_tie_rules_match_whole_segments_only():
    assert ties.partners("model.lm_head.weight")[0][0] == EMBED
    assert ties.partners("model.my_lm_head.weight") == []
    assert ties.partners("model.transformer_decoder.norm.bias")[0][0] == "model.ln_f.bias"
    bert = ties.partners("model.bert_mlm_head.classifier.ffn.0.linear_layer.weight")
    assert bert[0][0] == "model.bert_encoder.embedding_layer.word_embeddings.weight"
    t5 = dict(ties.partners("model.encoder_embeddings.word_embeddings.weight"))
    assert "model.decoder_embeddings.word_embeddings.weight" in t5
    off = {"share_encoder_decoder_embedding": False}
    assert ties.partners("model.encoder_embeddings.word_embeddings.weight", off) == []


def test_scripts_show_the_documented_flags():
    fix = run_script("fix_checkpoint_spec.py", "--help").stdout
    for flag in ("--fixed_checkpoint_path", "--fix_inplace", "checkpoint_path", "--yes"):
        assert flag in fix
    conv = run_script("data_iter_state_conversion.py", "--help").stdout
    for flag in (
        "--old_checkpoint",
        "-c",
        "--worker_data_iter_files_dir",
        "-w",
        "--output_file",
        "-o",
        "--dataloader_type",
        "{map,iterable}",
        "--shuffle_seed",
        "-s",
    ):
        assert flag in conv


def _same(a: Path, b: Path) -> None:
    assert commands.verify(a, b)["identical"]
    with read_checkpoint(a) as x, read_checkpoint(b) as y:
        from ckpt_migrate.format.compare import signature

        assert signature(x.root) == signature(y.root)
        assert (x.release.name, y.release.name) == ("2.0", "2.0")


def test_fix_checkpoint_spec_equals_upgrade_and_never_truncates(tmp_path):
    src = tmp_path / "checkpoint_100.mdl"
    src.write_bytes((FIXTURES / "release-1.7.mdl").read_bytes())
    proc = run_script("fix_checkpoint_spec.py", str(src))
    assert proc.returncode == 0, proc.stderr
    fixed = tmp_path / "checkpoint_100_fixed.mdl"
    upgrade(src, tmp_path / "up", "--to", "2.0")
    _same(fixed, tmp_path / "up" / src.name)
    before = fixed.read_bytes()
    one_line_error(
        run_script("fix_checkpoint_spec.py", str(src)), None, "already exists", skip_warnings=True
    )
    assert fixed.read_bytes() == before
    other = tmp_path / "other.mdl"
    proc = run_script("fix_checkpoint_spec.py", str(src), "--fixed_checkpoint_path", str(other))
    assert proc.returncode == 0 and other.is_file()


@pytest.mark.parametrize("how", ["the same path", "a hard link", "a symbolic link"])
@pytest.mark.parametrize("written_by", ["ours", "the 1.9 library's layout"])
def test_a_script_told_to_write_over_its_source_names_a_fix_it_has(
    tmp_path, how, written_by, real_layout_19
):
    """The engine's fix for an output that is the source, ``--inplace``, is ckpt-migrate's:
    data_iter_state_conversion.py has no in-place mode, fix_checkpoint_spec.py spells it
    ``--fix_inplace``. Their documented usage lines, with the source named as the output."""
    src = tmp_path / "checkpoint_100.mdl"
    shutil.copyfile(FIXTURES / "release-1.9.mdl" if written_by == "ours" else real_layout_19, src)
    before = src.read_bytes()
    out = {"the same path": src}.get(how, tmp_path / "out.mdl")
    if how == "a hard link":
        out.hardlink_to(src)
    elif how == "a symbolic link":
        out.symlink_to(src)
    side = ("--worker_data_iter_files_dir", SIDE / "good", "--dataloader_type", "map")
    for proc in (
        run_script("fix_checkpoint_spec.py", "--fixed_checkpoint_path", out, src),
        run_script(
            "data_iter_state_conversion.py",
            *("--old_checkpoint", src, "--output_file", out, *side, "--shuffle_seed", "5"),
        ),
    ):
        line = one_line_error(proc, 2, "the output would be the source itself")
        assert "--" not in line, line
    assert src.read_bytes() == before


def test_fix_inplace_keeps_a_backup_and_asks_only_on_a_terminal(tmp_path):
    src = tmp_path / "checkpoint_10.mdl"
    original = (FIXTURES / "release-1.9.mdl").read_bytes()
    src.write_bytes(original)
    proc = run_script(  # stdin is not a tty
        "fix_checkpoint_spec.py", str(src), "--fix_inplace", "--drop-dataloader-state"
    )
    assert proc.returncode == 0, proc.stderr
    assert "Are you sure" not in proc.stdout
    backup = tmp_path / "checkpoint_10.mdl.pre-1.9.bak"
    assert backup.read_bytes() == original
    got = leaves(src)
    assert got["model.lm_head.weight"] is got[EMBED]
    proc = run_script("fix_checkpoint_spec.py", str(src), "--fix_inplace", "--yes")
    assert proc.returncode == 0 and "nothing to fix" in proc.stdout


def test_data_iter_state_conversion_equals_upgrade(tmp_path):
    src = FIXTURES / "release-1.9.mdl"
    out = tmp_path / "converted.mdl"
    proc = run_script(
        "data_iter_state_conversion.py",
        "-c",
        str(src),
        "-w",
        str(SIDE / "good"),
        "-o",
        str(out),
        "-d",
        "map",
        "-s",
        "5",
    )
    assert proc.returncode == 0, proc.stderr
    upgrade(
        src,
        tmp_path / "up",
        "--to",
        "2.0",
        "--data-iter-dir",
        str(SIDE / "good"),
        "--dataloader-type",
        "map",
        "--shuffle-seed",
        "5",
    )
    _same(out, tmp_path / "up" / src.name)
    assert value(leaves(out)["dataloader.seed"]) == 5
    one_line_error(
        run_script(
            "data_iter_state_conversion.py",
            "-c",
            str(src),
            "-w",
            str(SIDE / "good"),
            "-o",
            str(out),
            "-d",
            "map",
            "-s",
            "5",
        ),
        None,
        "already exists",
        skip_warnings=True,
    )


def test_upgrade_dir_gives_each_checkpoint_the_side_files_of_its_own_step(tmp_path):
    """Worker files pile up, one set per checkpoint: an older checkpoint (step 5) takes the step-5
    files, the newest (step 10) the ones the global file names; one --data-iter-dir for both."""
    from ckpt_migrate.format.tree import ValueLeaf as Value
    from ckpt_migrate.format.write import write_checkpoint

    md = tmp_path / "model_dir"
    md.mkdir()
    (md / "checkpoint_10.mdl").write_bytes((FIXTURES / "release-1.9.mdl").read_bytes())
    with read_checkpoint(FIXTURES / "release-1.9.mdl") as ckpt:
        ckpt.root.set("global_step", Value(5))
        write_checkpoint(ckpt.root, md / "checkpoint_5.mdl", "1.9", allow_missing=True)
    out = tmp_path / "out"
    args = ["--data-iter-dir", str(SIDE / "good"), "--dataloader-type", "iterable"]
    proc = run_cli("upgrade-dir", str(md), "--output-dir", str(out), "--json", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    side = SIDE / "good"
    for step in (5, 10):
        got = leaves(out / f"checkpoint_{step}.mdl")
        for wid in range(3):
            text = (side / f"data_iter_state_file_worker_{wid}_step_{step}.txt").read_text()
            expected = int(text.splitlines()[0])
            assert value(got[f"dataloader.all_worker_states.{wid}.samples_streamed"]) == expected


def test_a_stray_worker_file_with_a_huge_id_is_one_line_quickly(tmp_path):
    """The 1.9 writer's side files with a stray copy named for worker 9,999,999,999: the
    missing workers were computed as a set of every id below it (the run grew until stopped),
    and every worker file was read whole for its first line."""
    side = tmp_path / "side"
    shutil.copytree(SIDE / "good", side)
    stray = side / "data_iter_state_file_worker_9999999999_step_10.txt"
    shutil.copyfile(side / "data_iter_state_file_worker_0_step_10.txt", stray)
    start = time.monotonic()
    proc = run_script(
        "data_iter_state_conversion.py", "-c", FIXTURES / "release-1.9.mdl", "-w", side,
        "-o", tmp_path / "x.mdl", "-d", "iterable",
    )  # fmt: skip
    one_line_error(
        proc,
        2,
        "worker(s) 3, 4, 5, 6, 7, 8, 9, 10 and 9,999,999,988 more",
        "found workers 0, 1, 2, 9999999999",
    )
    assert time.monotonic() - start < 30
    assert not (tmp_path / "x.mdl").exists()


@pytest.mark.parametrize("count", ["-5", str(1 << 63), "1e3", "12abc"])
def test_a_worker_file_whose_count_is_no_count_is_refused(tmp_path, count):
    """The 1.9 side files copied, one worker's count replaced: ``-5`` and a count past int64
    were written into the 2.0 state as they were (exit 0, ``samples_streamed: -5``)."""
    side = tmp_path / "side"
    shutil.copytree(SIDE / "good", side)
    worker = sorted(side.glob("data_iter_state_file_worker_*"))[0]
    worker.write_text(count + "\n")
    out = tmp_path / "out"
    args = ["--data-iter-dir", side, "--dataloader-type", "iterable"]
    proc = run_cli("upgrade", FIXTURES / "release-1.9.mdl", "-o", out, *args)
    one_line_error(proc, 2, worker.name, "is not a count", skip_warnings=True)
    assert not out.exists() or list(out.iterdir()) == []
