"""`ckpt-migrate upgrade` on real files: bit-identical results, safe against kills and full disks.

Every test works on real HDF5 files in ``tmp_path``; the CLI runs in real processes. The kill
tests upgrade a ~150 MB checkpoint and SIGKILL the process at moments spread over its run; the
full-disk tests mount a small tmpfs (root only; skipped otherwise).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import (
    FIXTURES,
    MODELS,
    REAL,
    one_line_error,
    real_2x_files,
    release_of,
    run_cli,
    run_script,
    sha256_file,
)

import ckpt_migrate as cm
from ckpt_migrate.atomic import create_temp
from ckpt_migrate.cli import commands
from ckpt_migrate.cli.main import main as cli_main
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.errors import VerificationError
from ckpt_migrate.format.provenance import PROVENANCE_ATTR
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import iter_leaves

PAGE = 4096


# --------------------------------------------------------------------------- helpers


def results(proc: subprocess.CompletedProcess) -> list[dict]:
    """The JSON objects `upgrade --json` printed, one per line."""
    lines = proc.stdout.strip().splitlines()
    return [json.loads(line) for line in lines]


def only_result(proc: subprocess.CompletedProcess) -> dict:
    (res,) = results(proc)
    return res


def xxh3_file(path: Path) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        while block := fh.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def fixture(release: str, dst_dir: Path, name: str | None = None) -> Path:
    """A private copy of a release fixture (tests may modify it)."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / (name or f"release-{release}.mdl")
    shutil.copyfile(FIXTURES / f"release-{release}.mdl", dst)
    return dst


def assert_identical(a: Path, b: Path, allowed: frozenset[str] = frozenset()) -> None:
    data = commands.verify(a, b)
    diffs = {d["name"]: d["what"] for d in data["differences"]}
    assert set(diffs) <= allowed, diffs
    assert data["tensors_compared"] > 0


def newer_than_tool(dst_dir: Path) -> Path:
    path = fixture("2.10", dst_dir, "newer.mdl")
    with h5py.File(path, "r+", locking=False) as f:
        f.attrs["__cstorch_version__"] = "2.11.0"
    return path


def hop_names(plan: dict) -> list[str]:
    return [f"{h['from']}→{h['to']}" for h in plan["hops"]]


def listing(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


# --------------------------------------------------------------------------- 1. bit-identical


SOURCES = {"2.0": ["1.7", "1.8", "1.9"], "2.10": ["1.7", "1.8", "1.9", "2.0", "2.3"]}
UPGRADES = [(src, tgt) for tgt, sources in SOURCES.items() for src in sources]


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory):
    """target -> (output dir, {source release: `upgrade --json` result}); one CLI run a target."""
    done = {}
    for target, sources in SOURCES.items():
        out = tmp_path_factory.mktemp(f"to-{target}")
        paths = [FIXTURES / f"release-{r}.mdl" for r in sources]
        proc = run_cli(
            "upgrade",
            "--drop-dataloader-state",
            *paths,
            "--to",
            target,
            "--output-dir",
            out,
            "--json",
            "--allow-missing",
        )
        assert proc.returncode == 0, proc.stderr
        got = results(proc)
        assert [r["source"] for r in got] == [str(p) for p in paths]  # one object per file
        done[target] = (out, dict(zip(sources, got)))
    return done


@pytest.mark.parametrize(("source", "target"), UPGRADES, ids=lambda v: v)
def test_upgrade_keeps_every_tensor_and_applies_the_planned_hops(source, target, upgraded, capsys):
    src = FIXTURES / f"release-{source}.mdl"
    assert cli_main(["plan", str(src), "--to", target, "--json"]) == 0
    planned = hop_names(json.loads(capsys.readouterr().out))

    out, by_source = upgraded[target]
    res = by_source[source]
    assert res["status"] == "upgraded" and res["exit_code"] == 0
    assert (res["from_release"], res["to_release"]) == (source, target)
    assert res["hops"] == planned and planned[0].startswith(f"{source}→")
    assert planned[-1].endswith(f"→{target}")

    result = out / src.name
    assert res["output"] == str(result)
    assert release_of(result) == target
    # The 1.9 → 2.0 steps change declared values only: the restored tie and stale last_epochs.
    changed = {line.split("] ", 1)[1].split(":", 1)[0] for line in res["changes"]}
    expected = {
        "1.7": {"lr_scheduler.last_epoch", "['lr_scheduler']"},
        "1.8": {"dataloader state dropped (--drop-dataloader-state)"},
        "1.9": {
            "model.lm_head.weight",
            "lr_scheduler.last_epoch",
            "lr_scheduler._schedulers.0.last_epoch",
            "lr_scheduler._schedulers.1.last_epoch",
            "dataloader state dropped (--drop-dataloader-state)",  # said, and nothing to drop
        },
    }.get(source, set())
    assert {c for c in changed if not c.startswith("misc.step")} == expected
    assert_identical(src, result, frozenset(e for e in expected if "dataloader" not in e))


def test_nothing_but_the_upgraded_files_is_written(upgraded):
    for target, (out, _) in upgraded.items():
        assert listing(out) == {f"release-{r}.mdl" for r in SOURCES[target]}


# --------------------------------------------------------------------------- 2. SIGKILL


BIG_TENSORS = 36  # x 4 MiB of float32: a ~150 MB checkpoint


@pytest.fixture(scope="module")
def big_checkpoint(tmp_path_factory):
    """A 2.0 checkpoint of ~150 MB whose upgrade to 2.10 takes a measurable time."""
    import torch

    base = tmp_path_factory.mktemp("big")
    gen = torch.Generator().manual_seed(0)
    state = {
        "model": {
            f"layer{i}.weight": torch.randn(1024, 1024, generator=gen) for i in range(BIG_TENSORS)
        },
        "global_step": 7,
    }
    path = base / "pristine" / "big.mdl"
    path.parent.mkdir()
    cm.save(state, path, "2.0")
    del state
    yield path, sha256_file(path)
    shutil.rmtree(base, ignore_errors=True)  # do not keep GBs in pytest's retained tmp dirs


def start_and_kill(args: list[str | Path], delay: float) -> int:
    """Start `ckpt-migrate ARGS`, SIGKILL it after ``delay`` s; the exit status (-9 if killed)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckpt_migrate", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if delay:
        time.sleep(delay)
    proc.send_signal(signal.SIGKILL)  # a no-op if it has already exited
    return proc.wait()


def measure(args: list[str | Path], watch: Path) -> tuple[float, float]:
    """Run `ckpt-migrate ARGS` to the end: (seconds until a *.tmp appears in watch, total)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckpt_migrate", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    writing = None
    while proc.poll() is None:
        if writing is None and any(p.suffix == ".tmp" for p in watch.iterdir()):
            writing = time.monotonic() - start
        time.sleep(0.002)
    total = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr.read()
    assert writing is not None, "the upgrade wrote no temporary file"
    return writing, total


def kill_delays(writing: float, total: float) -> list[float]:
    """Right after start, once while reading, then 7 moments spread over the writing (which
    starts at ``writing`` s: copying, patching, verifying, fsyncing, publishing)."""
    return [0.0, writing / 2, *np.linspace(writing, 0.97 * total, 7)]


def assert_only_temporaries(directory: Path, keep: set[str], stem: str) -> list[Path]:
    """Everything in ``directory`` but ``keep`` is a ``<stem>.*.tmp`` leftover; returns them."""
    extra = [p for p in directory.iterdir() if p.name not in keep]
    for p in extra:
        assert p.name.startswith(f"{stem}.") and p.name.endswith(".tmp"), p.name
    return extra


def test_kill_at_any_moment_leaves_the_source_and_no_partial_output(big_checkpoint, tmp_path):
    pristine, digest = big_checkpoint
    src = pristine  # --output-dir never writes beside the source
    scratch = tmp_path / "scratch"
    runs = []
    for _ in range(2):  # the faster of two: kills spread over a slow run's window can all miss
        scratch.mkdir()
        runs.append(
            measure(["upgrade", "--drop-dataloader-state", src, "--output-dir", scratch], scratch)
        )
        shutil.rmtree(scratch)
    writing, total = min(w for w, _ in runs), min(t for _, t in runs)

    out = tmp_path / "out"
    out.mkdir()
    target = out / src.name
    seen = []
    leftovers: list[Path] = []
    for delay in kill_delays(writing, total):
        for p in leftovers:  # keep only the last run's leftovers for the final rerun
            p.unlink()
        status = start_and_kill(
            ["upgrade", "--drop-dataloader-state", src, "--output-dir", out], delay
        )
        assert sha256_file(src) == digest, f"source changed (kill after {delay:.2f}s)"
        leftovers = assert_only_temporaries(out, {target.name}, src.name)
        if target.exists():  # published before the kill: must be complete and identical
            assert release_of(target) == "2.10"
            assert_identical(src, target)
            target.unlink()
            seen.append("done")
        else:
            seen.append("partial" if leftovers else ("killed" if status < 0 else "?"))
        assert assert_only_temporaries(src.parent, {src.name}, src.name) == []
    assert "partial" in seen, f"no kill hit the writing: {seen}, {writing=:.2f} {total=:.2f}"

    proc = run_cli(
        "upgrade", "--drop-dataloader-state", src, "--output-dir", out, "--json"
    )  # a rerun after a kill
    assert proc.returncode == 0, proc.stderr
    res = only_result(proc)
    assert res["status"] == "upgraded"
    assert assert_only_temporaries(out, {target.name}, src.name) == []  # the rerun cleaned up
    removed = [w for w in res["warnings"] if "a temporary file an interrupted run left" in w]
    assert len(removed) == len(leftovers)
    assert release_of(target) == "2.10"
    assert_identical(src, target)
    assert sha256_file(src) == digest
    shutil.rmtree(out)  # passed: do not keep 150 MB files in pytest's retained tmp dirs


def test_kill_at_any_moment_of_an_inplace_upgrade(big_checkpoint, tmp_path):
    pristine, digest = big_checkpoint
    scratch = tmp_path / "scratch"
    runs = []
    for _ in range(2):  # the faster of two, as above
        scratch.mkdir()
        shutil.copyfile(pristine, scratch / pristine.name)
        args = ["upgrade", "--drop-dataloader-state", scratch / pristine.name, "--inplace"]
        runs.append(measure(args, scratch))
        shutil.rmtree(scratch)
    writing, total = min(w for w, _ in runs), min(t for _, t in runs)

    work = tmp_path / "work"
    work.mkdir()
    src = work / pristine.name
    backup = work / f"{src.name}.pre-2.0.bak"
    shutil.copyfile(pristine, src)
    seen = []
    leftovers: list[Path] = []
    for delay in kill_delays(writing, total):
        for p in leftovers:
            p.unlink()
        status = start_and_kill(["upgrade", "--drop-dataloader-state", src, "--inplace"], delay)
        leftovers = assert_only_temporaries(work, {src.name, backup.name}, src.name)
        if sha256_file(src) == digest:  # not yet replaced; a backup is the same file if present
            assert not backup.exists() or os.path.samefile(backup, src)
            seen.append("partial" if leftovers else ("killed" if status < 0 else "?"))
        else:  # replaced before the kill: a complete upgraded file, the original in the backup
            assert sha256_file(backup) == digest
            assert release_of(src) == "2.10"
            assert_identical(backup, src)
            seen.append("done")
            backup.unlink()
            shutil.copyfile(pristine, src)
    assert "partial" in seen, f"no kill hit the writing: {seen}, {writing=:.2f} {total=:.2f}"

    proc = run_cli(
        "upgrade", "--drop-dataloader-state", src, "--inplace", "--json"
    )  # a rerun after a kill
    assert proc.returncode == 0, proc.stderr
    res = only_result(proc)
    assert res["status"] == "upgraded" and res["backup"] == str(backup)
    assert assert_only_temporaries(work, {src.name, backup.name}, src.name) == []
    assert sha256_file(backup) == digest
    assert release_of(src) == "2.10"
    assert_identical(backup, src)
    shutil.rmtree(work)


# --------------------------------------------------------------------------- 3. full disk


def pages(nbytes: int) -> int:
    return -(-nbytes // PAGE)


def test_disk_smaller_than_the_file_is_refused_before_writing(small_disk, tmp_path):
    src = fixture("2.0", tmp_path / "src")
    before = sha256_file(src)
    disk = small_disk(pages(src.stat().st_size) // 2 * PAGE)
    proc = run_cli("upgrade", "--drop-dataloader-state", src, "--output-dir", disk, "--json")
    res = only_result(proc)
    assert res["status"] == "failed" and res["exit_code"] == 5
    assert "bytes free" in res["error"]
    assert listing(disk) == set()
    assert sha256_file(src) == before
    assert proc.returncode == 5, proc.stderr


def test_a_script_short_of_space_names_no_option_it_lacks(small_disk, tmp_path):
    """A script names its output file: the fix is not ckpt-migrate's ``--output-dir``."""
    src = fixture("1.9", tmp_path / "src")
    disk = small_disk(pages(src.stat().st_size) // 2 * PAGE)
    proc = run_script(
        "fix_checkpoint_spec.py",
        *("--fixed_checkpoint_path", disk / "fixed.mdl", src, "--drop_dataloader_state"),
    )
    line = one_line_error(proc, 5, "bytes free", "free disk space or write elsewhere")
    assert "--" not in line, line
    assert listing(disk) == set()


def big_tensor_checkpoint(path: Path) -> Path:
    """~1 MB of tensors, so the upgrade copies the file and patches it (copy-patch)."""
    import torch

    gen = torch.Generator().manual_seed(1)
    cm.save(
        {"model": {f"w{i}": torch.randn(256, 256, generator=gen) for i in range(4)}}, path, "2.0"
    )
    return path


@pytest.mark.parametrize("strategy", ["copy-patch", "rewrite"])
def test_room_for_the_source_but_not_the_output_is_refused_before_writing(
    strategy, small_disk, tmp_path
):
    """The free-space check uses the plan's estimate of the output, which is larger than the
    source (the new metadata is written beside the old), not the source's size."""
    if strategy == "copy-patch":
        src = big_tensor_checkpoint(tmp_path / "src.mdl")
    else:  # the small fixtures are rewritten: the result is larger than the source
        src = fixture("2.0", tmp_path)
    before = sha256_file(src)
    probe = tmp_path / "probe"
    probe.mkdir()
    done = upgrade(src, UpgradeOptions(target="2.10", output_dir=probe))
    assert done.status == "upgraded" and done.strategy == strategy
    need, size = pages(done.bytes_written), pages(src.stat().st_size)
    assert need - size >= 2, "the upgrade does not grow the file; cannot test a disk filling up"

    # Free space above the source's size but below what the output needs.
    free = (size + (need - size) // 2) * PAGE
    disk = small_disk((need + 8) * PAGE)
    with open(disk / "filler", "wb") as fh:
        fh.write(bytes(shutil.disk_usage(disk).free - free))
    assert src.stat().st_size <= shutil.disk_usage(disk).free < done.bytes_written

    proc = run_cli("upgrade", "--drop-dataloader-state", src, "--output-dir", disk)
    one_line_error(proc, 5, "bytes free", "free disk space")
    assert listing(disk) == {"filler"}  # no output, no *.tmp
    assert sha256_file(src) == before


@pytest.mark.parametrize("strategy", ["copy-patch", "rewrite"])
def test_a_disk_filling_up_while_upgrading_is_an_ordinary_error(strategy, small_disk, tmp_path):
    """A filler races each upgrade for the last bytes of a small disk, starting at a random
    moment (half of them once the temporary file exists): before the free-space check, during
    the copy or the metadata edit, or after. Every
    run ends as a correct output (exit 0) or one line with exit 5, never a signal or an
    internal error, and leaves no temporary file; the source never changes."""
    src = big_tensor_checkpoint(tmp_path / "src.mdl") if strategy == "copy-patch" else None
    src = src or fixture("2.0", tmp_path)
    before = sha256_file(src)
    disk = small_disk(4 * src.stat().st_size + (1 << 20))
    rng = np.random.default_rng(7)
    outcomes = {0: 0, 5: 0}
    for trial in range(16):
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckpt_migrate", "upgrade", str(src), "--output-dir", str(disk)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if trial % 2:  # from the moment the temporary file appears: during the write
            while not any(disk.glob("*.tmp")) and proc.poll() is None:
                time.sleep(0.0002)
            time.sleep(float(rng.uniform(0, 0.03)))
        else:  # at any moment, the first one before the upgrade has started
            time.sleep(0 if trial == 0 else float(rng.uniform(0, 1.5)))
        # Unbuffered: a last write cut short leaves nothing for close() to flush (and fail on).
        with open(disk / "filler", "wb", buffering=0) as fh, contextlib.suppress(OSError):
            while True:
                fh.write(bytes(64 << 10))
                fh.flush()
        out, err = proc.communicate(timeout=60)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        assert done.returncode in outcomes, f"trial {trial}: exit {done.returncode}: {err}"
        outcomes[done.returncode] += 1
        if done.returncode == 5:
            one_line_error(done, 5, "free disk space", skip_warnings=True)
            assert listing(disk) == {"filler"}
        else:
            assert listing(disk) == {"filler", src.name}
            assert release_of(disk / src.name) == "2.10"
            (disk / src.name).unlink()
        (disk / "filler").unlink()
        assert sha256_file(src) == before
    assert outcomes[5] >= 1  # the first filler always wins


# --------------------------------------------------------------------------- 4. locking


def test_a_second_upgrade_of_the_same_file_is_refused(tmp_path):
    src = fixture("2.0", tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(src, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as an in-place upgrade holds it
        proc = run_cli("upgrade", "--drop-dataloader-state", src, "--output-dir", out)
        one_line_error(proc, 2, "another ckpt-migrate process", str(src))
        assert listing(out) == set()
    finally:
        os.close(fd)
    assert run_cli("upgrade", "--drop-dataloader-state", src, "--output-dir", out).returncode == 0


def test_upgrades_that_only_read_the_file_run_side_by_side(tmp_path):
    """An upgrade to an output of its own holds a shared lock on the source: another such
    upgrade proceeds (each output is published without replacing anything), an in-place
    upgrade of the same file is refused."""
    src = fixture("2.0", tmp_path / "src")
    before = sha256_file(src)
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(src, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # as an upgrade to another output holds it
        proc = run_cli("upgrade", "--drop-dataloader-state", src, "--output-dir", out)
        assert proc.returncode == 0, proc.stderr
        assert release_of(out / src.name) == "2.10"
        inplace = run_cli("upgrade", "--drop-dataloader-state", src, "--inplace")
        one_line_error(inplace, 2, "another ckpt-migrate process", str(src))
    finally:
        os.close(fd)
    assert sha256_file(src) == before and listing(src.parent) == {src.name}


# --------------------------------------------------------------------------- 5. --inplace


@pytest.mark.parametrize("spelling", ["--inplace", "--in-place"])
def test_inplace_keeps_the_original_as_backup(spelling, tmp_path):
    src = fixture("2.0", tmp_path, "ckpt.mdl")
    original = src.read_bytes()
    proc = run_cli("upgrade", "--drop-dataloader-state", src, spelling, "--json")
    assert proc.returncode == 0, proc.stderr
    res = only_result(proc)
    backup = tmp_path / "ckpt.mdl.pre-2.0.bak"
    assert res["status"] == "upgraded" and res["backup"] == str(backup)
    assert res["output"] == str(src)
    assert listing(tmp_path) == {"ckpt.mdl", backup.name}
    assert backup.read_bytes() == original
    assert release_of(src) == "2.10"
    assert_identical(backup, src)


def test_inplace_through_a_symlink_upgrades_its_target_and_keeps_the_link(tmp_path):
    real = fixture("2.0", tmp_path / "store", "ckpt.mdl")
    original = real.read_bytes()
    link = tmp_path / "run" / "checkpoint_1.mdl"
    link.parent.mkdir()
    link.symlink_to(real)
    proc = run_cli("upgrade", "--drop-dataloader-state", link, "--inplace", "--json")
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and link.resolve() == real
    assert release_of(real) == "2.10"
    backup = real.with_name("ckpt.mdl.pre-2.0.bak")
    assert backup.read_bytes() == original
    assert listing(tmp_path / "run") == {"checkpoint_1.mdl"}
    assert listing(tmp_path / "store") == {"ckpt.mdl", backup.name}


@pytest.mark.parametrize("there", ["a file", "a dangling symbolic link"])
def test_inplace_refuses_a_different_file_at_the_backup_name(tmp_path, there):
    """A dangling link was taken for no backup: the dry run said yes, and the run upgraded the
    file and only then failed, with no fix, to link the backup."""
    src = fixture("2.0", tmp_path, "ckpt.mdl")
    original = src.read_bytes()
    backup = tmp_path / "ckpt.mdl.pre-2.0.bak"
    if there == "a file":
        backup.write_bytes(b"someone else's file")
    else:
        backup.symlink_to(tmp_path / "nowhere")
    for dry in (("--dry-run",), ()):
        proc = run_cli("upgrade", "--drop-dataloader-state", src, "--inplace", *dry)
        one_line_error(proc, 2, str(backup), "backup already exists; move it away, then retry")
    assert src.read_bytes() == original
    if there == "a file":
        assert backup.read_bytes() == b"someone else's file"
    assert listing(tmp_path) == {"ckpt.mdl", backup.name}


def test_inplace_accepts_the_backup_link_left_by_an_interrupted_run(tmp_path):
    src = fixture("2.0", tmp_path, "ckpt.mdl")
    original = src.read_bytes()
    backup = tmp_path / "ckpt.mdl.pre-2.0.bak"
    os.link(src, backup)  # what a run killed between linking and replacing leaves
    proc = run_cli("upgrade", "--drop-dataloader-state", src, "--inplace", "--json")
    assert proc.returncode == 0, proc.stderr
    assert only_result(proc)["status"] == "upgraded"
    assert backup.read_bytes() == original
    assert not os.path.samefile(src, backup)
    assert release_of(src) == "2.10"


def test_inplace_and_output_dir_exclude_each_other(tmp_path):
    src = fixture("2.0", tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("upgrade", "--drop-dataloader-state", src, "--inplace", "--output-dir", out)
    one_line_error(proc, 2, "--inplace", "--output-dir")
    assert listing(out) == set() and listing(src.parent) == {src.name}


# --------------------------------------------------------------------------- 6. what is written


def test_a_file_at_the_target_is_reported_current_and_put_into_the_output_dir(tmp_path):
    """Left alone in place (--inplace); linked into --output-dir, as upgrade-dir does, so that
    the output directory holds every checkpoint asked for."""
    src = fixture("2.10", tmp_path / "src")
    stat, data = src.stat(), src.read_bytes()
    out = tmp_path / "out"
    for where, placed in ((["--inplace"], None), (["--output-dir", out], "linked")):
        proc = run_cli("upgrade", src, "--to", "2.10", *where, "--json")
        assert proc.returncode == 0, proc.stderr
        res = only_result(proc)
        assert res["status"] == "current" and res["hops"] == []
        assert res.get("placed") == placed
    assert listing(out) == {src.name} and os.path.samefile(out / src.name, src)
    assert listing(src.parent) == {src.name}
    assert src.stat().st_mtime_ns == stat.st_mtime_ns and src.read_bytes() == data
    proc = run_cli("upgrade", src, "--to", "2.10", "--output-dir", tmp_path / "text")
    assert f"already at 2.10; linked into {tmp_path / 'text'}" in proc.stdout


def test_an_existing_output_is_never_overwritten(tmp_path):
    src = fixture("2.0", tmp_path / "src")  # (the shared fixture is locked by other tests' runs)
    out = tmp_path / "out"
    out.mkdir()
    existing = out / src.name
    existing.write_bytes(b"precious")
    proc = run_cli("upgrade", "--drop-dataloader-state", src, "--output-dir", out, "--json")
    res = only_result(proc)
    assert res["status"] == "failed" and res["exit_code"] == 2
    assert "already exists" in res["error"]
    assert existing.read_bytes() == b"precious" and listing(out) == {src.name}
    assert proc.returncode == 2, proc.stderr


def test_dry_run_writes_nothing_and_prints_the_plan(tmp_path):
    src = fixture("1.8", tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("upgrade", "--drop-dataloader-state", src, "--output-dir", out, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "1.8 → 2.10 in 12 hop(s)" in proc.stdout
    assert "  1.8 → 1.9" in proc.stdout and "  2.9 → 2.10" in proc.stdout
    proc = run_cli(
        "upgrade", "--drop-dataloader-state", src, "--dry-run", "--json"
    )  # no --output-dir needed to plan
    assert proc.returncode == 0, proc.stderr
    res = only_result(proc)
    assert res["status"] == "planned" and hop_names(res["plan"]) == res["hops"]
    assert listing(out) == set() and listing(src.parent) == {src.name}


def test_several_files_print_one_json_object_each_and_exit_with_the_worst(tmp_path):
    srcs = tmp_path / "src"
    ok = fixture("1.8", srcs)
    current = fixture("2.10", srcs)
    exists = fixture("2.3", srcs)
    newer = newer_than_tool(srcs)
    out = tmp_path / "out"
    out.mkdir()
    (out / exists.name).write_bytes(b"precious")
    proc = run_cli(
        "upgrade",
        "--drop-dataloader-state",
        ok,
        current,
        exists,
        newer,
        "--output-dir",
        out,
        "--json",
    )
    got = [(r["source"], r["status"], r["exit_code"]) for r in results(proc)]
    assert got == [
        (str(ok), "upgraded", 0),
        (str(current), "current", 0),
        (str(exists), "failed", 2),
        (str(newer), "failed", 3),
    ]
    assert listing(out) == {ok.name, current.name, exists.name}
    assert proc.returncode == 3, proc.stderr


# --------------------------------------------------------------------------- 7. check, verify


def test_check_exit_codes(tmp_path):
    newer = newer_than_tool(tmp_path)
    assert run_cli("check", FIXTURES / "release-2.10.mdl").returncode == 0
    assert run_cli("check", FIXTURES / "release-2.0.mdl", "--to", "2.0").returncode == 0
    proc = run_cli("check", FIXTURES / "release-2.0.mdl", "--to", "2.3")
    assert "2.0 needs upgrading to 2.3" in proc.stdout
    assert proc.returncode == 10
    one_line_error(run_cli("check", newer), 3, str(newer), "2.11.0", "newer than this tool")
    # (a plan reads the release before the spec: said alike, its preflight child let go of)
    one_line_error(run_cli("plan", newer), 3, str(newer), "2.11.0", "newer than this tool")


def changed_copy(dst: Path, change) -> Path:
    """A copy of the 2.10 fixture with one element of model.fc.weight changed by ``change``."""
    shutil.copyfile(FIXTURES / "release-2.10.mdl", dst)
    with h5py.File(dst, "r+", locking=False) as f:
        ds = f["model.fc.weight"]
        data = ds[()]
        assert data.dtype == np.float32 and data[0, 0] != 0
        data[0, 0] = change(data[0, 0])
        ds[...] = data
    return dst


def test_verify_exit_codes(tmp_path):
    a = FIXTURES / "release-2.10.mdl"
    same = tmp_path / "same.mdl"
    shutil.copyfile(a, same)
    proc = run_cli("verify", a, same)
    assert proc.returncode == 0, proc.stderr
    assert "identical" in proc.stdout
    flipped = changed_copy(tmp_path / "flipped.mdl", lambda x: -x)
    proc = run_cli("verify", a, flipped)
    assert "model.fc.weight: tensor data differs" in proc.stdout
    assert "1 difference(s)" in proc.stdout
    assert proc.returncode == 4


def test_verify_allclose_accepts_a_tiny_float_difference(tmp_path):
    a = FIXTURES / "release-2.10.mdl"
    ulp = changed_copy(tmp_path / "ulp.mdl", lambda x: np.nextafter(x, np.float32(np.inf)))
    proc = run_cli("verify", a, ulp, "--allclose")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_cli("verify", a, ulp)
    assert "model.fc.weight: tensor data differs" in proc.stdout
    assert proc.returncode == 4


def _tensors_checkpoint(path: Path, release: str = "2.0") -> Path:
    """Six 1 MiB tensors and two small ones (LZ4-compressed chunks in 2.x formats)."""
    import torch

    gen = torch.Generator().manual_seed(5)
    state = {
        "model": {f"w{i}": torch.randn(512, 512, generator=gen) for i in range(6)},
        "small": torch.arange(10.0),  # small datasets beside the large ones
        "count": torch.tensor(3),
        "global_step": 5,
    }
    cm.save(state, path, release)
    return path


def _last_data_range(path: Path) -> tuple[int, int]:
    from ckpt_migrate.engine.splitcopy import data_ranges

    with h5py.File(path, "r") as f:
        datasets: list[h5py.Dataset] = []
        f.visititems(lambda _, obj: datasets.append(obj) if isinstance(obj, h5py.Dataset) else None)
        return data_ranges(datasets)[-1]


@pytest.mark.parametrize(("source", "target"), [("1.7", "1.9"), ("2.0", "2.10")])
def test_a_copy_is_verified_while_its_tensor_data_is_still_being_copied(
    tmp_path, monkeypatch, source, target
):
    """The index verification reads no data range of a copy (a small dataset travels with the
    metadata: ``splitcopy.data_ranges``), so it runs while the worker still copies them. The
    worker is slowed down here: when the verification runs, the last tensor bytes are not on
    file yet; the published output holds them all."""
    from ckpt_migrate.engine import splitcopy
    from ckpt_migrate.engine import upgrade as engine

    src = _tensors_checkpoint(tmp_path / "src.mdl", source)
    _, end = _last_data_range(src)
    want = src.read_bytes()[end - 4096 : end]
    assert want.strip(b"\0")
    seen: dict[str, bool] = {}
    real = engine.verify_index

    def spy(ckpt, root, release, tmp, written, **kw):
        with open(tmp, "rb") as fh:
            fh.seek(end - 4096)
            seen["landed"] = fh.read(4096) == want
        real(ckpt, root, release, tmp, written, **kw)

    monkeypatch.setattr(engine, "verify_index", spy)
    monkeypatch.setattr(splitcopy, "BLOCK", 1 << 20)
    monkeypatch.setenv("CKPT_MIGRATE_TEST_WRITE_DELAY", "0.4")
    opts = UpgradeOptions(target=target, output_dir=tmp_path / "out", copy_method="copy")
    result = upgrade(src, opts)
    assert result.status == "upgraded", result.error
    assert (result.strategy, result.copy_method, result.verified) == ("copy-patch", "copy", "index")
    assert seen == {"landed": False}
    assert_identical(src, tmp_path / "out" / "src.mdl")


def _hashed_datasets(monkeypatch) -> list[str]:
    """The names of the datasets ``verify`` decodes and hashes from now on, in order."""
    from ckpt_migrate.engine import verify

    hashed: list[str] = []
    real = verify.dataset_sha256

    def counted(ds: h5py.Dataset, dtype: str) -> str:
        hashed.append(ds.name)
        return real(ds, dtype)

    monkeypatch.setattr(verify, "dataset_sha256", counted)
    return hashed


def test_verify_full_compares_reused_tensors_as_stored_bytes(tmp_path, monkeypatch):
    """Reused tensors are compared chunk index and stored bytes against the source, not
    decoded and hashed; tensors written anew still are."""
    src = _tensors_checkpoint(tmp_path / "src.mdl")
    hashed = _hashed_datasets(monkeypatch)
    opts = UpgradeOptions(target="2.10", output_dir=tmp_path / "out", verify="full")
    result = upgrade(src, opts)
    assert (result.status, result.verified) == ("upgraded", "full"), result.error
    with h5py.File(tmp_path / "out" / "src.mdl", "r") as f:
        written_anew = [name for name in hashed if name in f]
    assert len(hashed) == len(written_anew) < result.tensors  # reused ones were not decoded
    assert_identical(src, tmp_path / "out" / "src.mdl")


@pytest.mark.parametrize("manifest", [False, True], ids=["stored-bytes", "hashed"])
def test_verify_full_finds_a_changed_byte_of_a_reused_tensor(tmp_path, monkeypatch, manifest):
    """A stored byte of a reused tensor changed between the copy and the verification: the
    upgrade fails naming the tensor, and nothing is published. With a manifest too: its hash
    is the source's, which the stored comparison proves is the output's."""
    from ckpt_migrate.engine import upgrade as engine

    src = _tensors_checkpoint(tmp_path / "src.mdl")
    _, end = _last_data_range(src)
    real = engine.write

    def write_then_flip(ckpt, root, plan, out, *args, **kwargs):
        written = real(ckpt, root, plan, out, *args, **kwargs)
        with open(out.tmp, "r+b") as fh:
            fh.seek(end - 100)
            byte = fh.read(1)
            fh.seek(end - 100)
            fh.write(bytes([byte[0] ^ 1]))
        return written

    monkeypatch.setattr(engine, "write", write_then_flip)
    out = tmp_path / "out"
    opts = UpgradeOptions(
        target="2.10",
        output_dir=out,
        verify="full",
        manifest=tmp_path / "manifest.json" if manifest else None,
    )
    result = upgrade(src, opts)
    assert result.status == "failed"
    assert re.search(r"tensor 'model\.w\d' differs from its source", result.error), result.error
    assert "stored byte at" in result.error
    assert result.exit_code == VerificationError(src, "").exit_code
    assert not (out / "src.mdl").exists() and not (tmp_path / "manifest.json").exists()


def test_verify_full_reads_a_tied_tensor_once_and_the_manifest_lists_every_name(
    tmp_path, monkeypatch
):
    import torch

    tied = torch.randn(256, 256, generator=torch.Generator().manual_seed(2))
    src = tmp_path / "src.mdl"
    state = {"model": {"a.weight": tied, "b.weight": tied, "c": torch.ones(300, 300)}}
    cm.save({**state, "global_step": 1}, src, "2.0")
    out = tmp_path / "out"
    hashed = _hashed_datasets(monkeypatch)
    opts = UpgradeOptions(target="2.10", output_dir=out, manifest=tmp_path / "m.json")
    result = upgrade(src, opts)
    assert (result.status, result.verified, result.tensors) == ("upgraded", "full", 2)
    assert hashed == []  # (compared as stored: the output is not decoded)
    listed = json.loads((tmp_path / "m.json").read_text())["tensors"]
    assert set(listed) == {"model.a.weight", "model.b.weight", "model.c"}
    assert listed["model.a.weight"] == listed["model.b.weight"] != listed["model.c"]
    for name, t in (("model.a.weight", tied), ("model.c", torch.ones(300, 300))):
        assert listed[name] == hashlib.sha256(t.numpy().tobytes()).hexdigest(), name


# --------------------------------------------------------------------------- 8. manifest


def flatten(obj, prefix: str = "") -> dict:
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return {prefix: obj}
    out = {}
    for k, v in items:
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


@pytest.mark.parametrize(
    "names",
    ["the source", "a hard link to the source", "the output", "the config", "the backup"],
)
def test_a_manifest_replaces_no_input_and_no_output(tmp_path, names):
    """``--manifest PATH`` was written over whatever PATH was, once the upgrade was done:
    naming the source, it replaced the 1.9 checkpoint with the JSON manifest, with success.
    The shipped example (checkpoint, its Model Zoo-style params.yaml) under each name."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "example", run)
    src, params, out = run / "checkpoint_100.mdl", run / "params.yaml", tmp_path / "out"
    before = {p: p.read_bytes() for p in (src, params)}
    where = ("--output-dir", out)
    manifest = {
        "the source": src,
        "a hard link to the source": tmp_path / "link.mdl",
        "the output": out / src.name,
        "the config": params,
        "the backup": run / "checkpoint_100.mdl.pre-1.9.bak",
    }[names]
    if names == "a hard link to the source":
        manifest.hardlink_to(src)
    elif names == "the backup":
        where = ("--inplace",)
    proc = run_cli(
        "upgrade",
        src,
        *where,
        "--config",
        params,
        "--drop-dataloader-state",
        "--manifest",
        manifest,
    )
    what = "the source" if names.startswith("a hard link") else names
    one_line_error(proc, 2, f"--manifest names {what}")
    assert {p: p.read_bytes() for p in (src, params)} == before
    assert not out.exists() or listing(out) == set()
    assert sorted(p.name for p in run.iterdir()) == [
        "checkpoint_100.mdl",
        "dataloader",
        "params.yaml",
    ]


@pytest.mark.parametrize("force", [False, True])
def test_two_checkpoints_of_one_name_are_refused_before_either(tmp_path, force):
    """``upgrade x/ckpt.mdl y/ckpt.mdl --output-dir OUT``: the second was refused once the
    first was written; with ``--force`` it replaced the first, both reported as written. The
    real 2.6 and 2.9 libraries' files."""
    x, y = tmp_path / "x" / "ckpt.mdl", tmp_path / "y" / "ckpt.mdl"
    for real, path in zip(real_2x_files(tmp_path), (x, y), strict=True):
        path.parent.mkdir()
        real.rename(path)
    out = tmp_path / "out"
    force_args = ("--force",) if force else ()
    proc = run_cli("upgrade", x, y, "--output-dir", out, "--drop-dataloader-state", *force_args)
    one_line_error(proc, 2, f"would both be written to {out / 'ckpt.mdl'}")
    assert not out.exists()


def test_one_checkpoint_named_twice_is_said_so(tmp_path):
    """``upgrade ckpt.mdl ./ckpt.mdl`` (or a hard link of it) was told to use two output
    directories, as if they were two checkpoints."""
    src = tmp_path / "ckpt.mdl"
    shutil.copyfile(REAL / "basic.mdl", src)
    (tmp_path / "link").mkdir()
    os.link(src, tmp_path / "link" / "ckpt.mdl")
    for second in (src, tmp_path / "." / "ckpt.mdl", tmp_path / "link" / "ckpt.mdl"):
        proc = run_cli("upgrade", src, second, "--to", "2.6", "--output-dir", tmp_path / "out")
        one_line_error(proc, 2, f"{second}: is named twice; name each checkpoint once")
    assert not (tmp_path / "out").exists()
    # objects, said as the addresses they are (``pathlib`` folds ``s3://`` into ``s3:/``)
    twice = run_cli("upgrade", "s3://b/ckpt.mdl", "s3://b/ckpt.mdl", "--output-dir", "s3://b/o")
    one_line_error(twice, 2, "s3://b/ckpt.mdl: is named twice")
    two = run_cli("upgrade", "s3://b/x/ckpt.mdl", "s3://b/y/ckpt.mdl", "--output-dir", "s3://b/o")
    one_line_error(two, 2, "s3://b/x/ckpt.mdl and s3://b/y/ckpt.mdl would both be written to ")
    assert "to s3://b/o/ckpt.mdl;" in two.stderr


def test_a_config_out_naming_the_upgraded_checkpoint_is_refused_before_any_work(tmp_path):
    """It was refused only once the checkpoint had been written (exit 2, half a run)."""
    src, params = FIXTURES / "example" / "checkpoint_100.mdl", FIXTURES / "example" / "params.yaml"
    out = tmp_path / "out"
    proc = run_cli(
        "upgrade", src, "--output-dir", out, "--config", params,
        "--config-out", out / src.name, "--drop-dataloader-state",
    )  # fmt: skip
    one_line_error(proc, 2, "--config-out names the upgrade of")
    assert not out.exists()


def test_an_existing_manifest_is_replaced_only_with_force(tmp_path):
    src = real_2x_files(tmp_path)[0]  # the real 2.6 library's
    manifest = tmp_path / "notes.json"
    manifest.write_text("mine\n")
    args = ("upgrade", "--drop-dataloader-state", src, "--manifest", manifest)
    one_line_error(run_cli(*args, "--output-dir", tmp_path / "a"), 2, "already exists")
    assert manifest.read_text() == "mine\n" and not (tmp_path / "a" / src.name).exists()
    assert run_cli(*args, "--output-dir", tmp_path / "b", "--force").returncode == 0
    assert json.loads(manifest.read_text())["to"] == "2.10"


def test_manifest_holds_the_sha256_of_each_tensors_raw_bytes(tmp_path):
    import torch

    src = fixture("2.0", tmp_path / "src")
    manifest = tmp_path / "manifest.json"
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli(
        "upgrade",
        "--drop-dataloader-state",
        src,
        "--output-dir",
        out,
        "--manifest",
        manifest,
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert only_result(proc)["verified"] == "full"
    doc = json.loads(manifest.read_text())
    assert doc["source_xxh3_128"] == xxh3_file(src) and (doc["from"], doc["to"]) == ("2.0", "2.10")

    state = flatten(cm.load(out / src.name))
    arrays = {k: v for k, v in state.items() if isinstance(v, (torch.Tensor, np.ndarray))}
    assert set(doc["tensors"]) <= set(arrays) and len(doc["tensors"]) >= 15
    checked = ["model.fc.weight", "model.fc.bias", "model.norm.scale", "model.ids", "misc.array"]
    for name in checked:
        t = arrays[name]
        if isinstance(t, torch.Tensor):
            t = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
            t = t.contiguous().numpy()
        raw = np.ascontiguousarray(t).astype(t.dtype.newbyteorder("<")).tobytes()
        assert hashlib.sha256(raw).hexdigest() == doc["tensors"][name], name
    assert arrays["model.fc.bias"].dtype == torch.bfloat16


def _raw_sha256(t) -> str:
    """The manifest's hash of a loaded tensor: its little-endian bytes (bf16 as int16)."""
    import torch

    if isinstance(t, torch.Tensor):
        t = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        t = t.contiguous().numpy()
    return hashlib.sha256(np.ascontiguousarray(t).astype(t.dtype.newbyteorder("<"))).hexdigest()


@pytest.mark.parametrize("placed", [True, False], ids=["output-dir", "inplace"])
def test_a_file_already_at_its_target_gets_the_manifest_asked_for(tmp_path, placed):
    """``--manifest`` of a file already at the target wrote nothing and said nothing (exit 0).
    It now lists every tensor of the file it leaves (the source's hard link in the output
    directory, or the source itself in place), no hop; the real 2.10 library's file, a tie in
    it."""
    import torch

    src = tmp_path / "tied.mdl"
    shutil.copyfile(REAL / "tied.mdl", src)
    manifest, out = tmp_path / "m.json", tmp_path / "out"
    where = ("--output-dir", out) if placed else ("--inplace",)
    proc = run_cli("upgrade", src, *where, "--manifest", manifest, "--json")
    assert proc.returncode == 0, proc.stderr
    assert only_result(proc)["tensor_data"] == "decoded"
    doc = json.loads(manifest.read_text())
    output = out / src.name if placed else src
    assert (doc["output"], doc["from"], doc["to"], doc["hops"]) == (str(output), "2.10", "2.10", [])
    assert doc["source_xxh3_128"] == xxh3_file(src)
    state = flatten(cm.load(output))
    tensors = {k: v for k, v in state.items() if isinstance(v, (torch.Tensor, np.ndarray))}
    assert doc["tensors"] == {k: _raw_sha256(v) for k, v in tensors.items()}


def test_the_manifests_of_files_we_did_not_write_are_their_outputs_hashes(tmp_path):
    """The real 2.6-2.9 libraries' files up to 2.10 (root edits: hashed at the source, their
    stored bytes compared), Model Zoo's 2.1 converter outputs up to 2.10, the real 2.10
    library's tied file down to 2.3: every name the output loads with is listed, with the
    sha256 of the bytes it loads as."""
    import torch

    (tmp_path / "2x").mkdir()
    sources = [(p, "2.10") for p in real_2x_files(tmp_path / "2x")]
    for packed in sorted((FIXTURES / "modelzoo-2.10-converted").glob("*.mdl.xz")):
        sources.append((tmp_path / packed.name.removesuffix(".xz"), "2.10"))
        sources[-1][0].write_bytes(lzma.decompress(packed.read_bytes()))
    sources.append((REAL / "tied.mdl", "2.3"))
    strategies = set()
    for n, (src, target) in enumerate(sources):
        manifest, out = tmp_path / f"m{n}.json", tmp_path / f"out{n}"
        options = UpgradeOptions(
            target=target,
            output_dir=out,
            manifest=manifest,
            inputs={"drop_dataloader_state": True},
        )
        result = upgrade(src, options)
        assert result.error is None, (src.name, result.error)
        strategies.add(result.strategy)
        state = flatten(cm.load(out / src.name))
        loaded = {k: v for k, v in state.items() if isinstance(v, (torch.Tensor, np.ndarray))}
        listed = json.loads(manifest.read_text())["tensors"]
        assert listed == {k: _raw_sha256(v) for k, v in loaded.items()}, src.name
    assert "root-edit" in strategies


def test_a_dry_run_of_a_file_already_at_its_target_checks_the_manifest_and_writes_none(tmp_path):
    src = tmp_path / "basic.mdl"
    shutil.copyfile(REAL / "basic.mdl", src)
    proc = run_cli("upgrade", src, "--dry-run", "--manifest", tmp_path / "m.json")
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "m.json").exists()
    proc = run_cli("upgrade", src, "--dry-run", "--manifest", src)
    one_line_error(proc, 2, "--manifest names the source")


# --------------------------------------------------------------------------- 9. provenance


def provenance(path: Path) -> list[dict]:
    with h5py.File(path, "r", locking=False) as f:
        return json.loads(f.attrs[PROVENANCE_ATTR])


def test_provenance_records_every_upgrade(tmp_path):
    src = FIXTURES / "release-1.7.mdl"
    mid, final = tmp_path / "mid", tmp_path / "final"
    mid.mkdir()
    final.mkdir()
    first = only_result(
        run_cli(
            "upgrade", "--drop-dataloader-state", src, "--to", "2.0", "--output-dir", mid, "--json"
        )
    )
    assert first["status"] == "upgraded"
    (entry,) = provenance(mid / src.name)
    assert entry["source_release"] == "1.7" and entry["target_release"] == "2.0"
    assert entry["hops"] == first["hops"] == ["1.7→1.8", "1.8→1.9", "1.9→2.0"]
    assert entry["source_xxh3_128"] == xxh3_file(src)

    second = only_result(
        run_cli(
            "upgrade", "--drop-dataloader-state", mid / src.name, "--output-dir", final, "--json"
        )
    )
    assert second["status"] == "upgraded"
    entries = provenance(final / src.name)
    assert len(entries) == 2 and entries[0] == entry
    assert entries[1]["source_release"] == "2.0" and entries[1]["target_release"] == "2.10"
    assert entries[1]["hops"] == second["hops"]
    assert entries[1]["source_xxh3_128"] == xxh3_file(mid / src.name)


# --------------------------------------------------------------------------- 10. --from, --to


SAYS_23 = (
    "the file says it is release 2.3 (__cstorch_version__ 2.3.0); it is read as 2.1, as --from "
    "says, and the hops start there"
)


def test_from_overrides_the_release_the_file_claims(tmp_path):
    """``--from`` wins, and the release the file names is said beside it (it was not: a
    2.0 → 2.3 hop skipped, or done again, without a word)."""
    src = FIXTURES / "release-2.3.mdl"
    proc = run_cli("plan", src, "--from", "2.1", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["from"] == "2.1" and hop_names(plan)[0] == "2.1→2.2"
    assert plan["warnings"] == [SAYS_23]
    assert run_cli("plan", src, "--from", "2.1").stderr == f"warning: {SAYS_23}\n"
    assert json.loads(run_cli("plan", src, "--from", "2.3", "--json").stdout)["warnings"] == []
    proc = run_cli(
        "upgrade",
        "--drop-dataloader-state",
        src,
        "--from",
        "2.1",
        "--output-dir",
        tmp_path,
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    res = only_result(proc)
    assert res["from_release"] == "2.1" and res["hops"] == hop_names(plan)
    assert SAYS_23 in res["warnings"]
    assert provenance(tmp_path / src.name)[-1]["source_release"] == "2.1"


def test_from_beside_the_real_librarys_word(tmp_path):
    """The real 2.6.0 library's file, read as 2.8: upgraded from there, and said so."""
    src = next(p for p in real_2x_files(tmp_path) if p.name == "gpt2-2.6.0.mdl")
    proc = run_cli("upgrade", src, "--from", "2.8", "-o", tmp_path / "out", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "says it is release 2.6 (__cstorch_version__ 2.6.0); it is read as 2.8" in proc.stderr
    assert "2.8 → 2.10 written to" in proc.stdout
    proc = run_cli("upgrade", src, "-o", tmp_path / "plain", "-q")
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr


def test_a_hop_option_no_hop_took_is_said(tmp_path):
    """``--data-iter-dir`` (and the other 1.9 → 2.0 options) given for a 2.0 checkpoint did
    nothing, without a word: the user believed the dataloader state was carried over. Each
    option no run's hop took is now a warning; a run where one checkpoint needed it says
    nothing. Model Zoo's GPT-2 fixtures and the 1.9 side files as the release wrote them."""
    side = FIXTURES / "release-1.9-data-iter" / "good"
    given = ["--data-iter-dir", side, "--dataloader-type", "map", "--shuffle-seed", "0"]
    at_20 = MODELS / "gpt2-2.0" / "checkpoint_100.mdl"
    proc = run_cli("upgrade", at_20, "-o", tmp_path / "a", "-q", *given)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"warning: {flag} was not used: it is for the 1.9 → 2.0 hop, which no checkpoint here "
        "needed"
        for flag in ("--data-iter-dir", "--dataloader-type", "--shuffle-seed")
    ]
    proc = run_cli("plan", at_20, "--drop-dataloader-state")
    assert "warning: --drop-dataloader-state was not used" in proc.stderr, proc.stderr
    at_19 = tmp_path / "run" / "checkpoint_10.mdl"
    at_19.parent.mkdir()
    shutil.copyfile(FIXTURES / "release-1.9.mdl", at_19)
    shutil.copyfile(at_20, tmp_path / "run" / "checkpoint_100.mdl")
    for command in ("upgrade-dir", "upgrade"):
        where = [tmp_path / "run"] if command == "upgrade-dir" else sorted(at_19.parent.iterdir())
        proc = run_cli(command, *where, "-o", tmp_path / command, "-q", *given)
        assert proc.returncode == 0, proc.stderr
        assert "warning" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", ["plan", "upgrade"])
def test_from_a_release_of_another_format_is_refused(command, tmp_path):
    src = FIXTURES / "release-2.3.mdl"
    extra = ["--output-dir", tmp_path] if command == "upgrade" else []
    proc = run_cli(command, src, "--from", "2.5", *extra)
    one_line_error(proc, 2, str(src), "--from 2.5", "format 0.4")
    assert listing(tmp_path) == set()


@pytest.mark.parametrize(
    ("to", "words"),
    [
        ("1.5", ["unknown release '1.5'", "1.7, 1.8", "2.10"]),
        ("9.9", ["release '9.9' is newer than this ckpt-migrate knows", "upgrade ckpt-migrate"]),
        ("1.9", ["cannot downgrade from 2.3 to 1.9", "2.0 → 1.9", "release 2.0 or a later one"]),
    ],
)
def test_unknown_or_older_target_is_refused(to, words, tmp_path):
    src = FIXTURES / "release-2.3.mdl"
    proc = run_cli("upgrade", "--drop-dataloader-state", src, "--to", to, "--output-dir", tmp_path)
    one_line_error(proc, 2, *words)
    assert listing(tmp_path) == set()


def test_copy_patch_leaves_no_stray_datasets(tmp_path):
    """Every name of a hard-linked legacy tie is unlinked; the output holds only its leaves."""
    import torch

    w = torch.randn(256, 256)
    state = {"model": {"a.weight": w, "b.weight": w}, "global_step": 3}
    state["model"].update({f"l{i}": torch.randn(128, 128) for i in range(8)})
    src = tmp_path / "c.mdl"
    cm.save(state, src, "2.0")
    out = tmp_path / "o"
    out.mkdir()
    proc = run_cli("upgrade", "--drop-dataloader-state", src, "--output-dir", out, "--json")
    assert json.loads(proc.stdout)["strategy"] == "copy-patch", proc.stdout + proc.stderr
    with read_checkpoint(out / src.name) as ckpt:
        assert ckpt.unreferenced == []
        leaves = {r.name: r.leaf for r in iter_leaves(ckpt.root)}
        assert leaves["model.a.weight"] is leaves["model.b.weight"]
    assert_identical(src, out / src.name)


def test_a_filesystem_that_reports_no_size_is_not_full(tmp_path, monkeypatch):
    """ramfs (and some network filesystems) report 0 bytes in all; writes succeed anyway, so the
    free space is unknown, not zero."""

    def ramfs_usage(path):
        return types.SimpleNamespace(total=0, used=0, free=0)

    monkeypatch.setattr("ckpt_migrate.engine.plan.shutil.disk_usage", ramfs_usage)
    res = upgrade(fixture("2.0", tmp_path / "in"), UpgradeOptions(output_dir=tmp_path))
    assert res.status == "upgraded", res.error
    assert commands.plan(tmp_path / "in" / "release-2.0.mdl")["free_available"] is None


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a ramfs needs root")
def test_upgrade_onto_a_real_ramfs(tmp_path):
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "ramfs", "none", str(mnt)]).returncode != 0:
        pytest.skip("this machine does not allow mounting a ramfs")
    try:
        proc = run_cli(
            "upgrade",
            "--drop-dataloader-state",
            fixture("2.0", tmp_path / "in"),
            "--output-dir",
            mnt,
            "--json",
        )
        assert proc.returncode == 0, proc.stderr
        assert only_result(proc)["status"] == "upgraded"
    finally:
        subprocess.run(["umount", str(mnt)])


def test_a_rerun_removes_only_the_temporaries_no_live_writer_holds(tmp_path):
    """A killed run's temporary (unlocked) is removed by the next upgrade of the same file; the
    locked temporary of a live writer, and a file being created (empty, young), stay."""
    src = fixture("2.0", tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    killed = out / f"{src.name}.0123abcd.tmp"
    killed.write_bytes(b"half an upgrade")
    killed_backup = out / f"{src.name}.pre-2.0.bak.4567cdef.tmp"
    killed_backup.write_bytes(b"half a backup copy")
    creating = out / f"{src.name}.89abcdef.tmp"
    creating.touch()
    live, fd = create_temp(out / src.name)
    os.write(fd, b"a live upgrade")
    try:
        proc = run_cli("upgrade", "--drop-dataloader-state", src, "--output-dir", out, "--json")
    finally:
        os.close(fd)
    res = only_result(proc)
    assert res["status"] == "upgraded", res
    assert sorted(w.split(",")[0] for w in res["warnings"] if "interrupted run" in w) == sorted(
        f"removed {p.name}" for p in (killed, killed_backup)
    )
    assert listing(out) == {src.name, creating.name, live.name}


@pytest.mark.parametrize("stamp", ["1.0.0", "abc"])
def test_from_names_the_release_of_a_file_whose_cstorch_version_is_wrong(tmp_path, stamp):
    """A file of the real 2.10 library whose ``__cstorch_version__`` is wrong or no version:
    the error says "name the release with --from R (upgrade, plan, check)", and only ``plan``
    took it; ``upgrade`` and ``check`` gave the same error again with ``--from 2.10``."""
    src = tmp_path / "stamped.mdl"
    shutil.copyfile(REAL / "basic.mdl", src)
    with h5py.File(src, "r+") as f:
        f.attrs["__cstorch_version__"] = stamp
    one_line_error(run_cli("check", src), 2, "--from R")
    assert run_cli("check", src, "--from", "2.10").stdout == f"{src}: at 2.10\n"
    assert run_cli("plan", src, "--from", "2.10").returncode == 0
    out = tmp_path / "out"
    proc = run_cli("upgrade", src, "--from", "2.10", "--to", "2.8", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert cm.load(out / src.name, allow_missing=True).keys() == cm.load(REAL / "basic.mdl").keys()


def test_from_the_target_release_still_says_what_the_file_says(tmp_path):
    """``--from 2.10`` of a file the real 2.6 library wrote, to 2.10: nothing to do, and the
    warning every other ``--from`` gives ("the file says it is release 2.6 …") was not said."""
    src = next(p for p in real_2x_files(tmp_path) if p.name.startswith("gpt2-2.6"))
    proc = run_cli("upgrade", src, "--from", "2.10", "-o", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert "the file says it is release 2.6" in proc.stderr and "as --from says" in proc.stderr


def test_datasets_no_leaf_names_are_said_to_be_left_out(tmp_path):
    """A file of the real 2.10 library with a dataset its spec does not name (``inspect``
    lists it): an upgrade writes what the leaves name, and left it out without a word."""
    src = tmp_path / "stray.mdl"
    shutil.copyfile(REAL / "basic.mdl", src)
    with h5py.File(src, "r+") as f:
        f["stray"] = np.arange(3)
    for dry in (["-n"], []):
        proc = run_cli("upgrade", src, "--to", "2.8", "-o", tmp_path / "out", *dry)
        assert proc.returncode == 0, proc.stderr
        assert "1 dataset(s) no leaf names: not carried over" in proc.stderr
    with h5py.File(tmp_path / "out" / src.name, "r") as f:
        assert "stray" not in f
