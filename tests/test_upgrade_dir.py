"""`ckpt-migrate upgrade-dir` on real model directories, in real processes, with SIGKILLs.

The small tests build a directory from the release fixtures (1.9, 2.0, 2.10 and a stray file);
the kill tests use ~150 MB and ~50 MB checkpoints so that a kill lands in the middle of a write.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, one_line_error, release_of, run_cli, sha256_file

import ckpt_migrate as cm
from ckpt_migrate import CheckpointManager
from ckpt_migrate.cli import commands
from ckpt_migrate.cli.main import main as cli_main
from ckpt_migrate.model_dir.upgrade_dir import DirOptions, upgrade_dir

SOURCES = {"checkpoint_100.mdl": "1.9", "checkpoint_200.mdl": "2.0", "checkpoint_300.mdl": "2.10"}


# --------------------------------------------------------------------------- helpers


def entries(proc: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in proc.stdout.strip().splitlines()]


def by_name(got: list[dict]) -> dict[str, dict]:
    return {Path(e["source"]).name: e for e in got}


def statuses(got: list[dict]) -> list[tuple[str, str]]:
    return [(Path(e["source"]).name, e["status"]) for e in got]


def model_dir(base: Path) -> Path:
    """checkpoint_100 (1.9), checkpoint_200 (2.0), checkpoint_300 (2.10) and a stray file."""
    md = base / "model_dir"
    md.mkdir(parents=True)
    for name, release in SOURCES.items():
        shutil.copyfile(FIXTURES / f"release-{release}.mdl", md / name)
    (md / "notes.txt").write_text("not a checkpoint\n")
    return md


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in directory.iterdir() if p.is_file()}


def direct_upgrade(src: Path, out: Path) -> Path:
    out.mkdir(exist_ok=True)
    proc = run_cli("upgrade", "--drop-dataloader-state", src, "--output-dir", out)
    assert proc.returncode == 0, proc.stderr
    return out / src.name


def assert_same_contents(a: Path, b: Path) -> None:
    data = commands.verify(a, b)
    assert data["identical"], data["differences"]
    assert data["tensors_compared"] > 0


# --------------------------------------------------------------------------- the directory


def test_upgrades_the_old_skips_the_current_and_lists_the_stray(tmp_path):
    md = model_dir(tmp_path)
    before = snapshot(md)
    out = tmp_path / "out"  # created by the command
    proc = run_cli("upgrade-dir", "--drop-dataloader-state", md, "--output-dir", out, "--json")
    assert proc.returncode == 0, proc.stderr
    got = entries(proc)
    assert statuses(got) == [  # newest first, then the other files
        ("checkpoint_300.mdl", "current"),
        ("checkpoint_200.mdl", "upgraded"),
        ("checkpoint_100.mdl", "upgraded"),
        ("notes.txt", "left-alone"),
    ]
    info = by_name(got)
    assert (
        info["notes.txt"]["kind"] == "other" and "not a checkpoint" in info["notes.txt"]["reason"]
    )
    assert info["checkpoint_200.mdl"]["from_release"] == "2.0"
    assert info["checkpoint_100.mdl"]["from_release"] == "1.9"
    assert info["checkpoint_300.mdl"]["action"] == "linked"
    assert snapshot(md) == before  # the sources are untouched, nothing was added beside them

    assert sorted(p.name for p in out.iterdir()) == sorted(SOURCES)  # names kept
    for name in SOURCES:
        assert release_of(out / name) == "2.10"
    assert os.path.samefile(out / "checkpoint_300.mdl", md / "checkpoint_300.mdl")
    for name in ("checkpoint_100.mdl", "checkpoint_200.mdl"):  # as `upgrade` writes them
        assert_same_contents(out / name, direct_upgrade(md / name, tmp_path / "direct"))
    assert CheckpointManager(out).latest() == out / "checkpoint_300.mdl"  # autoload unchanged


def test_text_output_has_a_line_per_file_and_a_summary_table(tmp_path):
    md = model_dir(tmp_path)
    proc = run_cli("upgrade-dir", "--drop-dataloader-state", md, "--output-dir", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "checkpoint_300.mdl: already at 2.10; linked into" in text
    assert "checkpoint_200.mdl: 2.0 → 2.10 written to" in text
    assert "notes.txt: other, left alone (not a checkpoint)" in text
    assert "upgrade-dir summary" in text
    for row in ("current (linked)", "2.0 → 2.10", "1.9 → 2.10", "left-alone"):
        assert row in text
    assert text.rstrip().endswith("1 current, 2 upgraded, 1 left-alone; exit 0")


def test_text_output_of_an_inplace_run_over_current_files(tmp_path):
    """--inplace leaves a current file where it is: nothing is placed anywhere."""
    md = tmp_path / "md"
    md.mkdir()
    shutil.copyfile(FIXTURES / "release-2.10.mdl", md / "checkpoint_5.mdl")
    proc = run_cli("upgrade-dir", "--drop-dataloader-state", md, "--inplace")
    assert proc.returncode == 0, proc.stderr
    assert "checkpoint_5.mdl: already at 2.10; left alone" in proc.stdout
    assert proc.stdout.rstrip().endswith("1 current; exit 0")


def test_a_rerun_does_nothing_that_is_done(tmp_path):
    md = model_dir(tmp_path)
    out = tmp_path / "out"
    assert (
        run_cli("upgrade-dir", "--drop-dataloader-state", md, "--output-dir", out).returncode == 0
    )
    stats = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()}
    proc = run_cli("upgrade-dir", "--drop-dataloader-state", md, "--output-dir", out, "--json")
    assert proc.returncode == 0, proc.stderr
    got = entries(proc)
    assert statuses(got) == [
        ("checkpoint_300.mdl", "current"),
        ("checkpoint_200.mdl", "already-upgraded"),
        ("checkpoint_100.mdl", "already-upgraded"),
        ("notes.txt", "left-alone"),
    ]
    assert by_name(got)["checkpoint_100.mdl"]["hops"][0] == "1.9→2.0"  # from the provenance
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()} == stats


def test_a_current_file_is_skipped_without_reading_tensors(tmp_path, monkeypatch):
    md = tmp_path / "model_dir"
    md.mkdir()
    shutil.copyfile(FIXTURES / "release-2.10.mdl", md / "checkpoint_5.mdl")
    shutil.copyfile(FIXTURES / "release-2.10.mdl", md / "model_checkpoint_5.mdl")

    def no_reading(*args, **kwargs):
        raise AssertionError("tensor data was read")

    monkeypatch.setattr("ckpt_migrate.format.h5.io.H5Handle.read_dataset", no_reading)
    monkeypatch.setattr("ckpt_migrate.engine.copypatch.file_digest", no_reading)
    monkeypatch.setattr("ckpt_migrate.model_dir.upgrade_dir.file_digest", no_reading)
    for opts in (DirOptions(inplace=True), DirOptions(output_dir=tmp_path / "out")):
        got = upgrade_dir(md, opts)
        assert [(e.path.name, e.status) for e in got] == [
            ("checkpoint_5.mdl", "current"),
            ("model_checkpoint_5.mdl", "current"),  # a checkpoint not named by the pattern
        ]


def test_an_existing_output_that_is_not_this_sources_upgrade_is_never_overwritten(tmp_path):
    md = model_dir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    other = direct_upgrade(FIXTURES / "release-2.3.mdl", tmp_path / "other")
    shutil.copyfile(other, out / "checkpoint_200.mdl")  # a 2.10 file, but another source's
    shutil.copyfile(FIXTURES / "release-2.0.mdl", out / "checkpoint_100.mdl")  # not at 2.10
    before = snapshot(out)
    proc = run_cli("upgrade-dir", "--drop-dataloader-state", md, "--output-dir", out, "--json")
    assert proc.returncode == 2, proc.stderr
    info = by_name(entries(proc))
    assert info["checkpoint_200.mdl"]["status"] == "failed"
    assert "is not an upgrade of" in info["checkpoint_200.mdl"]["error"]
    assert info["checkpoint_100.mdl"]["status"] == "failed"
    assert "at release 2.0, not 2.10" in info["checkpoint_100.mdl"]["error"]
    assert info["checkpoint_300.mdl"]["status"] == "current"  # the rest still goes on
    after = snapshot(out)
    assert {k: after[k] for k in before} == before


def test_the_exit_code_is_that_of_the_worst_outcome(tmp_path):
    md = model_dir(tmp_path)
    data = (md / "checkpoint_300.mdl").read_bytes()
    (md / "checkpoint_250.mdl").write_bytes(data[: len(data) // 2])  # truncated: exit 2
    newer = md / "checkpoint_400.mdl"
    shutil.copyfile(FIXTURES / "release-2.10.mdl", newer)
    import h5py

    with h5py.File(newer, "r+") as f:
        f.attrs["__cstorch_version__"] = "2.11.0"  # exit 3
    proc = run_cli(
        "upgrade-dir", "--drop-dataloader-state", md, "--output-dir", tmp_path / "out", "--json"
    )
    assert proc.returncode == 3, proc.stderr
    info = by_name(entries(proc))
    assert info["checkpoint_400.mdl"]["exit_code"] == 3
    assert info["checkpoint_250.mdl"]["exit_code"] == 2
    assert (
        info["checkpoint_200.mdl"]["status"] == info["checkpoint_100.mdl"]["status"] == ("upgraded")
    )


def test_only_latest_upgrades_the_checkpoint_autoload_takes(tmp_path):
    md = model_dir(tmp_path)
    (md / "checkpoint_300.mdl").unlink()
    data = (md / "checkpoint_200.mdl").read_bytes()
    (md / "checkpoint_250.mdl").write_bytes(data[: len(data) // 2])  # incomplete: not autoloaded
    out = tmp_path / "out"
    proc = run_cli(
        "upgrade-dir", "--drop-dataloader-state", md, "--output-dir", out, "--only-latest", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    assert statuses(entries(proc)) == [
        ("checkpoint_250.mdl", "not-selected"),
        ("checkpoint_200.mdl", "upgraded"),
        ("checkpoint_100.mdl", "not-selected"),
        ("notes.txt", "left-alone"),
    ]
    assert [p.name for p in out.iterdir()] == ["checkpoint_200.mdl"]


def test_inplace_upgrades_in_place_and_lists_backups_and_foreign_temporaries(tmp_path):
    md = model_dir(tmp_path)
    before = snapshot(md)
    (md / "checkpoint_999.mdl.deadbeef.tmp").write_bytes(b"a save in progress")
    (md / "events").mkdir()
    proc = run_cli("upgrade-dir", "--drop-dataloader-state", md, "--inplace", "--json")
    assert proc.returncode == 0, proc.stderr
    assert statuses(entries(proc)) == [
        ("checkpoint_300.mdl", "current"),
        ("checkpoint_200.mdl", "upgraded"),
        ("checkpoint_100.mdl", "upgraded"),
        ("checkpoint_999.mdl.deadbeef.tmp", "left-alone"),
        ("events", "left-alone"),
        ("notes.txt", "left-alone"),
    ]
    for name in SOURCES:
        assert release_of(md / name) == "2.10"
    assert sha256_file(md / "checkpoint_200.mdl.pre-2.0.bak") == before["checkpoint_200.mdl"]
    assert sha256_file(md / "checkpoint_100.mdl.pre-1.9.bak") == before["checkpoint_100.mdl"]
    again = entries(run_cli("upgrade-dir", "--drop-dataloader-state", md, "--inplace", "--json"))
    info = by_name(again)
    assert [info[n]["status"] for n in SOURCES] == ["current"] * 3
    assert info["checkpoint_200.mdl.pre-2.0.bak"]["kind"] == "backup"
    assert info["checkpoint_200.mdl.pre-2.0.bak"]["status"] == "left-alone"
    assert (md / "checkpoint_999.mdl.deadbeef.tmp").read_bytes() == b"a save in progress"


def test_leftover_temporaries_are_removed_unless_a_live_writer_holds_them(tmp_path):
    """A running upgrade locks its source and its temporary file; the temporary of a killed one
    is unlocked. A live writer of another source with the same name (``held_elsewhere``: e.g.
    ``upgrade other/checkpoint_200.mdl --output-dir out``) keeps its file too."""
    md = model_dir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    stale = out / "checkpoint_200.mdl.0123abcd.tmp"
    stale.write_bytes(b"left by a killed upgrade")
    unrelated = out / "something.mdl.0123abcd.tmp"
    unrelated.write_bytes(b"not ours")
    held = out / "checkpoint_100.mdl.89abcdef.tmp"
    held.write_bytes(b"an upgrade is running")
    held_elsewhere = out / "checkpoint_200.mdl.fedcba98.tmp"
    held_elsewhere.write_bytes(b"an upgrade of another checkpoint_200.mdl is running")
    fds = [os.open(p, os.O_RDONLY) for p in (md / "checkpoint_100.mdl", held, held_elsewhere)]
    try:
        for fd in fds:  # what running upgrades hold
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = run_cli("upgrade-dir", "--drop-dataloader-state", md, "--output-dir", out, "--json")
    finally:
        for fd in fds:
            os.close(fd)
    got = entries(proc)
    assert ("checkpoint_200.mdl.0123abcd.tmp", "removed") in statuses(got)
    assert not stale.exists()
    assert unrelated.exists() and held.exists() and held_elsewhere.exists()
    info = by_name(got)
    assert info["checkpoint_100.mdl"]["status"] == "failed"
    assert "another ckpt-migrate process" in info["checkpoint_100.mdl"]["error"]
    assert proc.returncode == 2


def test_two_runs_into_one_directory_are_refused(tmp_path):
    md = model_dir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = run_cli("upgrade-dir", "--drop-dataloader-state", md, "--output-dir", out)
    finally:
        os.close(fd)
    one_line_error(proc, 2, "another ckpt-migrate upgrade-dir", str(out))
    assert list(out.iterdir()) == []


def test_dry_run_writes_nothing(tmp_path):
    md = model_dir(tmp_path)
    before = snapshot(md)
    out = tmp_path / "out"
    proc = run_cli(
        "upgrade-dir", "--drop-dataloader-state", md, "--output-dir", out, "--dry-run", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    assert statuses(entries(proc))[:3] == [
        ("checkpoint_300.mdl", "current"),
        ("checkpoint_200.mdl", "planned"),
        ("checkpoint_100.mdl", "planned"),
    ]
    assert not out.exists() and snapshot(md) == before


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--inplace", "--output-dir", "OUT"], ["exclude each other"]),
        ([], ["--output-dir DIR or --inplace"]),
        (["--output-dir", "MD"], ["model directory itself", "--inplace"]),
        (["--inplace", "--name", "ckpt.mdl"], ["{step}"]),
        (["--inplace", "--to", "9.9"], ["newer than this ckpt-migrate knows"]),
        (["--inplace", "--to", "1.5"], ["unknown release"]),
        (["--inplace", "--verify", "most"], ["--verify"]),
    ],
)
def test_usage_errors_are_one_line(tmp_path, extra, words):
    md = model_dir(tmp_path)
    args = [str(md) if a == "MD" else str(tmp_path / "o") if a == "OUT" else a for a in extra]
    one_line_error(run_cli("upgrade-dir", "--drop-dataloader-state", md, *args), 2, *words)


def test_a_missing_directory_is_a_one_line_error(tmp_path):
    one_line_error(
        run_cli("upgrade-dir", "--drop-dataloader-state", tmp_path / "nope", "--inplace"),
        2,
        "nope",
        "no such directory",
    )


def test_upgrade_dir_does_not_import_torch(tmp_path):
    md = model_dir(tmp_path)
    code = textwrap.dedent(
        f"""
        import sys
        from ckpt_migrate.cli.main import main
        code = main(["upgrade-dir", "--drop-dataloader-state", {str(md)!r},
                     "--output-dir", {str(tmp_path / "out")!r}])
        print("exit", code, "TORCH" if "torch" in sys.modules else "NO-TORCH")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip().endswith("exit 0 NO-TORCH"), proc.stdout + proc.stderr


def test_cli_in_process_exit_code(tmp_path, capsys):
    md = model_dir(tmp_path)
    assert cli_main(["upgrade-dir", "--drop-dataloader-state", str(md), "--inplace", "--json"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 4


# --------------------------------------------------------------------------- SIGKILL


def big_state(tensors: int, seed: int) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return {
        "model": {
            f"layer{i}.weight": torch.randn(1024, 1024, generator=gen) for i in range(tensors)
        },
        "global_step": 7,
    }


@pytest.fixture(scope="module")
def big_model_dir(tmp_path_factory):
    """A ~150 MB 1.9 checkpoint, a ~50 MB 2.0 one, the 2.10 fixture and a stray file."""
    base = tmp_path_factory.mktemp("bigdir")
    md = base / "model_dir"
    md.mkdir()
    cm.save(big_state(36, 0), md / "checkpoint_100.mdl", "1.9")
    cm.save(big_state(12, 1), md / "checkpoint_200.mdl", "2.0")
    shutil.copyfile(FIXTURES / "release-2.10.mdl", md / "checkpoint_300.mdl")
    (md / "notes.txt").write_text("not a checkpoint\n")
    yield md, snapshot(md)
    shutil.rmtree(base, ignore_errors=True)  # do not keep 200 MB in pytest's retained tmp dirs


def assert_out_is_consistent(md: Path, out: Path) -> list[Path]:
    """Every file at a final name in ``out`` is a complete 2.10 checkpoint; the rest are the
    engine's temporary files. Returns those."""
    temporaries = []
    for p in out.iterdir():
        if p.name in SOURCES:
            assert release_of(p) == "2.10", p
        else:
            stem = next((n for n in SOURCES if p.name.startswith(f"{n}.")), None)
            assert stem is not None and p.name.endswith(".tmp"), p.name
            temporaries.append(p)
    return temporaries


def assert_finished(md: Path, out: Path, got: list[dict]) -> None:
    assert sorted(p.name for p in out.iterdir()) == sorted(SOURCES)  # no temporary file left
    for name in ("checkpoint_100.mdl", "checkpoint_200.mdl"):
        assert_same_contents(md / name, out / name)
    assert os.path.samefile(md / "checkpoint_300.mdl", out / "checkpoint_300.mdl")
    assert by_name(got)["notes.txt"]["status"] == "left-alone"


def start(args: list) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ckpt_migrate", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def kill_after_first_upgrade(args: list) -> list[dict]:
    """Run `upgrade-dir ARGS --json`; SIGKILL it as soon as it reports its first upgraded file."""
    proc = start([*args, "--json"])
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(json.loads(line))
        if seen[-1]["status"] == "upgraded":
            proc.send_signal(signal.SIGKILL)
            break
    assert proc.wait() == -signal.SIGKILL
    return seen


def test_sigkill_mid_run_then_a_rerun_finishes_the_rest(big_model_dir, tmp_path):
    md, before = big_model_dir
    out = tmp_path / "out"
    seen = kill_after_first_upgrade(
        ["upgrade-dir", "--drop-dataloader-state", md, "--output-dir", out]
    )
    assert statuses(seen) == [("checkpoint_300.mdl", "current"), ("checkpoint_200.mdl", "upgraded")]
    done = out / "checkpoint_200.mdl"
    stat = (done.stat().st_ino, done.stat().st_mtime_ns)
    leftovers = assert_out_is_consistent(md, out)
    killed_mid_write = not (out / "checkpoint_100.mdl").exists()

    proc = run_cli("upgrade-dir", "--drop-dataloader-state", md, "--output-dir", out, "--json")
    assert proc.returncode == 0, proc.stderr
    got = entries(proc)
    info = by_name(got)
    assert info["checkpoint_300.mdl"]["status"] == "current"
    assert info["checkpoint_200.mdl"]["status"] == "already-upgraded"  # not redone
    assert (done.stat().st_ino, done.stat().st_mtime_ns) == stat
    assert info["checkpoint_100.mdl"]["status"] == (
        "upgraded" if killed_mid_write else "already-upgraded"
    )
    assert {p.name for p in leftovers} <= {n for n, s in statuses(got) if s == "removed"}
    assert_finished(md, out, got)
    assert snapshot(md) == before
    shutil.rmtree(out)


def measure(args: list, watch: Path) -> tuple[float, float]:
    """Run `ckpt-migrate ARGS` to the end: (seconds until a *.tmp appears in watch, total)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckpt_migrate", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    writing = None
    while proc.poll() is None:
        if writing is None and watch.is_dir() and any(p.suffix == ".tmp" for p in watch.iterdir()):
            writing = time.monotonic() - t0
        time.sleep(0.002)
    assert proc.returncode == 0 and writing is not None
    return writing, time.monotonic() - t0


def stats(directory: Path) -> dict[str, tuple[int, int, int]]:
    return {
        p.name: (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns)
        for p in directory.iterdir()
    }


def test_sigkill_at_any_moment_then_a_rerun_finishes(big_model_dir, tmp_path):
    md, before = big_model_dir
    untouched = stats(md)
    out = tmp_path / "out"
    writing, total = measure(
        ["upgrade-dir", "--drop-dataloader-state", md, "--output-dir", out], out
    )
    seen = []
    for delay in [writing / 2, *np.linspace(writing, 0.97 * total, 7)]:
        shutil.rmtree(out, ignore_errors=True)  # each kill on a fresh run; the last one stays
        proc = start(["upgrade-dir", "--drop-dataloader-state", md, "--output-dir", out, "--json"])
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        assert stats(md) == untouched  # nothing beside the sources, the sources unchanged
        if out.exists():
            leftovers = assert_out_is_consistent(md, out)
            done = sorted(p.name for p in out.iterdir() if p.name in SOURCES)
            seen.append((len(done), len(leftovers)))
    assert any(tmp for _, tmp in seen), f"no kill hit a write: {seen}, {writing=:.2f} {total=:.2f}"

    proc = run_cli("upgrade-dir", "--drop-dataloader-state", md, "--output-dir", out, "--json")
    assert proc.returncode == 0, proc.stderr
    got = entries(proc)
    assert {e["status"] for e in got if e["kind"] == "checkpoint"} <= {
        "current",
        "already-upgraded",
        "upgraded",
    }
    assert_finished(md, out, got)
    assert snapshot(md) == before
    shutil.rmtree(out)


def test_sigkill_of_an_inplace_run_then_a_rerun_finishes_the_rest(big_model_dir, tmp_path):
    pristine, before = big_model_dir
    md = tmp_path / "model_dir"
    shutil.copytree(pristine, md)
    seen = kill_after_first_upgrade(["upgrade-dir", "--drop-dataloader-state", md, "--inplace"])
    assert statuses(seen) == [("checkpoint_300.mdl", "current"), ("checkpoint_200.mdl", "upgraded")]
    assert (
        sha256_file(md / "checkpoint_100.mdl") == before["checkpoint_100.mdl"]
    )  # not yet replaced

    proc = run_cli("upgrade-dir", "--drop-dataloader-state", md, "--inplace", "--json")
    assert proc.returncode == 0, proc.stderr
    got = entries(proc)
    info = by_name(got)
    assert info["checkpoint_200.mdl"]["status"] == "current"  # upgraded before the kill
    assert info["checkpoint_100.mdl"]["status"] == "upgraded"
    assert info["checkpoint_200.mdl.pre-2.0.bak"]["kind"] == "backup"  # left by the first run
    for name in SOURCES:
        assert release_of(md / name) == "2.10"
    assert sha256_file(md / "checkpoint_100.mdl.pre-1.9.bak") == before["checkpoint_100.mdl"]
    assert sha256_file(md / "checkpoint_200.mdl.pre-2.0.bak") == before["checkpoint_200.mdl"]
    assert_same_contents(md / "checkpoint_100.mdl.pre-1.9.bak", md / "checkpoint_100.mdl")
    assert not [p for p in md.iterdir() if p.name.endswith(".tmp")]
    shutil.rmtree(md)


def test_the_model_option_its_warning_suggests_exists(tmp_path):
    """The unknown-family warning says "pass --model NAME" (only when a rename may be missed:
    the fixtures' keys match no family's rules, so nothing is said); upgrade-dir takes that
    option, and with it the family is named in every result."""
    md = model_dir(tmp_path)
    plain = run_cli(
        "upgrade-dir", "--drop-dataloader-state", md, "--output-dir", tmp_path / "a", "--json"
    )
    assert plain.returncode == 0, plain.stderr
    assert "model family unknown" not in plain.stdout + plain.stderr
    named = run_cli(
        "upgrade-dir",
        "--drop-dataloader-state",
        md,
        "--output-dir",
        tmp_path / "b",
        "--json",
        "--model",
        "gpt2",
    )
    assert named.returncode == 0, named.stderr
    upgraded = [e for e in entries(named) if e.get("status") == "upgraded"]
    assert upgraded and all(e["family"] == "gpt2" for e in upgraded), upgraded


def test_config_is_upgraded_into_the_output_directory_which_is_complete(tmp_path):
    """--config upgrades params.yaml with the newest checkpoint into --output-dir, as upgrade
    --config does; a rerun accepts its own output, never overwrites another; a directory already
    at the target gets its config too."""
    md = tmp_path / "model_dir"
    shutil.copytree(FIXTURES / "models" / "gpt2-1.9", md)
    config = md / "params.yaml"
    out = tmp_path / "out"
    args = ["--config", config, "--drop-dataloader-state", "--json"]
    proc = run_cli("upgrade-dir", md, "--output-dir", out, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg = [e for e in entries(proc) if e.get("kind") == "config"]
    assert len(cfg) == 1 and cfg[0]["output"] == str(out / "params.yaml")
    assert (cfg[0]["from"], cfg[0]["to"]) == ("1.9", "2.10")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint_100.mdl", "params.yaml"]
    single = tmp_path / "single"
    single.mkdir()
    one = run_cli("upgrade", md / "checkpoint_100.mdl", "--output-dir", single, *args)
    assert one.returncode == 0, one.stdout + one.stderr
    assert (out / "params.yaml").read_text() == (single / "params.yaml").read_text()
    assert config.read_text() == (FIXTURES / "models" / "gpt2-1.9" / "params.yaml").read_text()

    upgraded = (out / "params.yaml").read_bytes()
    again = run_cli("upgrade-dir", md, "--output-dir", out, *args)  # a rerun: all there
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already there" in again.stdout and (out / "params.yaml").read_bytes() == upgraded
    (out / "params.yaml").write_text("edited: by hand\n")
    clash = run_cli("upgrade-dir", md, "--output-dir", out, *args)
    assert clash.returncode == 2 and "--config-out" in clash.stdout + clash.stderr
    assert (out / "params.yaml").read_text() == "edited: by hand\n"

    current = tmp_path / "current"  # already at the target: the config is copied unchanged
    proc = run_cli("upgrade-dir", out, "--output-dir", current, "--config", config, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in current.iterdir()) == ["checkpoint_100.mdl", "params.yaml"]


@pytest.mark.parametrize("where", ["output-dir", "inplace"])
def test_the_bytes_read_are_the_sources_in_place_too(tmp_path, where):
    """``upgrade-dir --inplace --json``: ``bytes_read`` was the new file's size (the source's
    name holds the output once it is published), equal to ``bytes_sent``; with ``-o`` the same
    file gave the source's. A file the real 2.10 library wrote, taken down to 2.0."""
    real = FIXTURES / "real-cstorch-2.10" / "basic.mdl"
    md = tmp_path / "md"
    md.mkdir()
    shutil.copyfile(real, md / "checkpoint_1.mdl")
    dest = ["--inplace"] if where == "inplace" else ["-o", tmp_path / "out"]
    proc = run_cli("upgrade-dir", md, *dest, "--to", "2.0", "--json")
    assert proc.returncode == 0, proc.stderr
    [entry] = [json.loads(line) for line in proc.stdout.splitlines() if '"bytes_read"' in line]
    assert entry["bytes_read"] == real.stat().st_size != entry["bytes_sent"]


@pytest.mark.parametrize("only_latest", [False, True])
def test_a_newest_checkpoint_that_is_a_link_is_refused_not_passed_over(tmp_path, only_latest):
    """Links are left alone; when the newest checkpoint was one, --only-latest upgraded an
    older file and exited 0, and the output's newest (what a resumed run loads) was 100 steps
    behind the original's."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    shutil.copy(FIXTURES / "release-2.0.mdl", run / "checkpoint_100.mdl")
    shutil.copy(FIXTURES / "release-2.3.mdl", run / "checkpoint_200.mdl")
    shutil.copy(FIXTURES / "release-2.0.mdl", elsewhere / "ckpt300.mdl")
    (run / "checkpoint_300.mdl").symlink_to(elsewhere / "ckpt300.mdl")
    assert CheckpointManager(run).latest() == run / "checkpoint_300.mdl"
    out = tmp_path / "out"
    args = ["--only-latest"] if only_latest else []
    proc = run_cli("upgrade-dir", run, "--output-dir", out, *args)
    one_line_error(proc, 2, "checkpoint_300.mdl", "symbolic link", "ckpt300.mdl")
    assert not out.exists()
    # An older link is left alone, as before: the newest is a file.
    (run / "checkpoint_300.mdl").unlink()
    (run / "checkpoint_150.mdl").symlink_to(elsewhere / "ckpt300.mdl")
    proc = run_cli("upgrade-dir", run, "--output-dir", out, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert CheckpointManager(out).latest() == out / "checkpoint_200.mdl"


def test_a_dataloader_step_mismatch_names_the_checkpoint_and_a_fix(tmp_path):
    """One checkpoint of the run has no side files of its step: the line named the dataloader
    directory, not the checkpoint, and offered --allow-step-mismatch as if for it alone."""
    md = tmp_path / "run"
    shutil.copytree(FIXTURES / "example", md)
    shutil.copyfile(FIXTURES / "release-1.9.mdl", md / "checkpoint_300.mdl")  # step 10
    args = ["upgrade-dir", md, "-o", tmp_path / "out", "--data-iter-dir", md / "dataloader"]
    proc = run_cli(*args, "--dataloader-type", "iterable", "-q")
    line = one_line_error(proc, 2, "--allow-step-mismatch", skip_warnings=True)
    want = f"error: {md / 'checkpoint_300.mdl'}: the dataloader side files in {md / 'dataloader'}"
    assert line.startswith(want), line
    assert "are for step 100, the checkpoint is at 10" in line, line
    assert "every checkpoint" in line, line
    assert release_of(tmp_path / "out" / "checkpoint_100.mdl") == "2.10"
