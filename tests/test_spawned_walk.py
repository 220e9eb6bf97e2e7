"""The preflight's walk in a new interpreter (``children.spawn``), as a caller of
``children.SPAWN_RESIDENT`` or more has it, or one whose fork fails: it finds what a forked
walk finds, on files we did not write, and is judged, stopped and ended as a forked one is."""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import FIXTURES, walk_corpus
from test_fuzz import _fuzz_case

from ckpt_migrate import cli
from ckpt_migrate.cli import commands
from ckpt_migrate.errors import EXIT_IO, CkptIOError, CorruptCheckpointError
from ckpt_migrate.format.h5 import children, headerscan, linktable, preflight
from ckpt_migrate.format.h5.root import root_header


@pytest.fixture
def made(monkeypatch) -> dict[str, list[int]]:
    """The children made, by how: "fork" (in the parent), "spawn" (each checked to be a new
    interpreter, not a copy of this one)."""
    made: dict[str, list[int]] = {"fork": [], "spawn": []}
    real_fork, real_spawn = children.fork, children.spawn

    def fork() -> int:
        pid = real_fork()
        if pid:
            made["fork"].append(pid)
        return pid

    def spawn(*args, **kwargs) -> int:
        pid = real_spawn(*args, **kwargs)
        made["spawn"].append(pid)
        assert b"\0-c\0" in _command_line(pid)  # (a fresh interpreter's)
        return pid

    monkeypatch.setattr(children, "fork", fork)
    monkeypatch.setattr(children, "spawn", spawn)
    return made


def _command_line(pid: int) -> bytes:
    """``pid``'s command line, once the kernel shows it (empty for a moment after the exec)."""
    for _ in range(100):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            line = f.read()
        if line:
            return line
        time.sleep(0.01)
    return line


def _found(path: Path) -> tuple:
    walked = preflight.preflight(path)
    assert walked is not None, path
    links = walked.links
    return walked.stored, dict(walked.datasets), None if links is None else links()


def test_a_spawned_walk_finds_what_a_forked_one_does(tmp_path, monkeypatch, made, real_layout_19):
    """Every scope, one child and two: the same datasets, bytes and links as the fork's, and
    the same answers from ``inspect``, ``plan`` and ``check`` (outline, spec, root walks)."""
    for path in walk_corpus(tmp_path, real_layout_19):
        answers = {}
        for spawn_from in (1 << 62, 0):
            monkeypatch.setattr(children, "SPAWN_RESIDENT", spawn_from)
            for workers in (1, 2):
                monkeypatch.setattr(preflight, "WORKERS", workers)
                monkeypatch.setattr(preflight, "ONE_CHILD_RATIO", 1 << 62)
                answers[spawn_from, workers] = _found(path)
            answers[spawn_from, "commands"] = (
                commands.inspect(path),
                {**commands.plan(path, "2.10"), "free_available": None},  # (others write)
                commands.check(path, "2.10"),
            )
        assert answers[0, 1] == answers[1 << 62, 1], path
        assert answers[0, 2] == answers[1 << 62, 2] == answers[0, 1], path
        assert answers[0, "commands"] == answers[1 << 62, "commands"], path
        assert answers[0, 1][1], path
    assert made["fork"] and made["spawn"]


def test_the_callers_size_decides(tmp_path, monkeypatch, made):
    """A caller below ``SPAWN_RESIDENT`` forks its children, one at or above it spawns them."""
    src = tmp_path / "small.h5"
    with h5py.File(src, "w") as f:
        f["w"] = np.arange(10.0)
    resident = children.resident()
    for spawn_from, how in ((resident * 2, "fork"), (resident // 2, "spawn")):
        monkeypatch.setattr(children, "SPAWN_RESIDENT", spawn_from)
        made["fork"].clear()
        made["spawn"].clear()
        assert preflight.preflight(src) is not None
        assert made[how] and not made["fork" if how == "spawn" else "spawn"], how


def test_a_fork_that_fails_is_a_spawned_walk(tmp_path, monkeypatch, made, real_layout_19):
    """Where the kernel will not copy the caller (no memory to commit: ENOMEM), the walk runs
    in a new interpreter and finds the same."""
    path = real_layout_19
    forked = _found(path)

    def no_memory() -> int:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(os, "fork", no_memory)
    made["spawn"].clear()
    assert _found(path) == forked
    assert made["spawn"]


@pytest.mark.parametrize("code", [errno.ENOMEM, errno.EAGAIN])
def test_a_read_no_process_can_be_started_for_is_one_line(monkeypatch, real_layout_19, code):
    """Neither a fork nor a new interpreter (no memory to commit, no process left under the
    user's limit): the read is refused in one line naming the file, the problem and the fix,
    with the exit code of an operating-system failure, not an internal error."""

    def refused(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fork", refused)
    monkeypatch.setattr(os, "posix_spawn", refused)
    with pytest.raises(CkptIOError) as caught:
        commands.inspect(real_layout_19)
    line = str(caught.value)
    assert line.startswith(f"{real_layout_19}: no process could be started"), line
    assert os.strerror(code) in line and "ulimit -u" in line and "\n" not in line
    assert caught.value.exit_code == EXIT_IO


def test_an_upgrade_no_process_can_be_started_for_says_so_in_one_line(
    tmp_path, monkeypatch, capsys, real_layout_19
):
    """The command line begins the walk of an upgrade's file before it parses its options
    (``cli.begin_reading``): no process to start there leaves it to the command, which says
    so in one line and exit 5, with no traceback, and writes nothing."""

    def refused(*args, **kwargs):
        raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))

    monkeypatch.setattr(os, "fork", refused)
    monkeypatch.setattr(os, "posix_spawn", refused)
    out = tmp_path / "out"
    code = cli.entry(["upgrade", str(real_layout_19), "--to", "2.10", "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert code == EXIT_IO, err
    assert err.startswith(f"error: {real_layout_19}: no process could be started"), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())


def _begun(path: Path, monkeypatch) -> preflight._Walk:
    monkeypatch.setattr(children, "SPAWN_RESIDENT", 0)
    monkeypatch.setattr(preflight, "WORKERS", 1)
    return preflight._Walk.begin(path, "full")


def _looping(tmp_path: Path) -> Path:
    """Fuzz seed 5, case 63: a flipped byte in a global-heap reference sends HDF5's read of a
    string attribute into an endless loop."""
    case = tmp_path / "case63.mdl"
    case.write_bytes(_fuzz_case(5, 63)[1])
    return case


def test_a_spawned_child_says_nothing_of_its_crash(tmp_path, monkeypatch, capfd):
    """A crash is the parent's to report in one line: a spawned child prints no traceback of
    it, even where ``PYTHONFAULTHANDLER`` asks every interpreter for one (killed by SIGSEGV
    inside HDF5, as it loops on a damaged file)."""
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")
    case = _looping(tmp_path)
    walk = _begun(case, monkeypatch)
    try:
        time.sleep(1.0)  # (well inside HDF5's loop by now)
        os.kill(walk.pids[0], signal.SIGSEGV)
        with pytest.raises(CorruptCheckpointError, match=r"HDF5 crashed \(SIGSEGV\)"):
            walk.conclude(case)
    finally:
        walk.cancel()
    assert capfd.readouterr().err == ""


def test_a_spawned_child_killed_by_a_signal_is_a_crash(tmp_path, monkeypatch, real_layout_19):
    """A spawned child that dies by a signal (as HDF5's SIGSEGV kills it) is named a crash."""
    walk = _begun(real_layout_19, monkeypatch)
    try:
        os.kill(walk.pids[0], signal.SIGSEGV)
        with pytest.raises(CorruptCheckpointError, match=r"HDF5 crashed \(SIGSEGV\)"):
            walk.conclude(real_layout_19)
    finally:
        walk.cancel()


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    """A file of 20,000 datasets: a walk of about a second."""
    src = tmp_path_factory.mktemp("many") / "many.h5"
    with h5py.File(src, "w") as f:
        for i in range(20_000):
            f[f"t{i}"] = np.float32(i)
    return src


@pytest.mark.parametrize("when", ["as it starts", "as it imports", "as it walks"])
def test_a_spawned_child_ends_quietly_on_a_ctrl_c(monkeypatch, capfd, many, when):
    """A terminal's Ctrl-C reaches the children too: a spawned one ends with status 1 and says
    nothing, whether it arrives as the interpreter starts, imports or walks (a forked child
    does the same: ``children.end_child``)."""
    walk = _begun(many, monkeypatch)
    pid = walk.pids[0]
    try:
        if when == "as it imports":
            time.sleep(0.05)  # (its interpreter takes about 0.13 s to start and import)
        elif when == "as it walks":
            select.select([walk.read_end], [], [], 30)  # (its first word: walking)
        os.kill(pid, signal.SIGINT)
        _, status = os.waitpid(pid, 0)
        walk.pids = []
    finally:
        walk.cancel()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 1, status
    assert capfd.readouterr().err == ""


def test_a_spawned_walk_that_makes_no_progress_is_refused_and_ended(tmp_path, monkeypatch):
    """Fuzz seed 5, case 63 sends HDF5 into an endless loop: the spawned child stalls, the
    file is refused, and no child is left looping."""
    case = _looping(tmp_path)
    monkeypatch.setattr(preflight, "STALL_SECONDS", 2.0)
    walk = _begun(case, monkeypatch)
    pid = walk.pids[0]
    try:
        with pytest.raises(CorruptCheckpointError, match="made no progress"):
            walk.conclude(case)
    finally:
        walk.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_a_spawned_header_scan_is_the_sequential_one(tmp_path, monkeypatch, made, real_layout_19):
    """The legacy header scan's second process (``headerscan.Scan``) spawned: its part, handed
    over unnamed, completes the same facts as one process scanning them all, on a 1.9 file as
    its library wrote it and the legacy fixtures; ``inspect`` (an outline read, which scans
    them) answers the same."""
    legacy = [real_layout_19, *sorted(FIXTURES.glob("release-1.*.mdl"))]
    legacy += sorted(FIXTURES.glob("release-2.[0-4].mdl"))
    monkeypatch.setattr(children, "SPAWN_RESIDENT", 0)
    for path in legacy:
        with h5py.File(path, "r") as f:
            at = root_header(f)
            links = linktable.of_root(f, path)
        assert at is not None and links is not None, path
        monkeypatch.setattr(headerscan, "WORKERS", 1)
        alone = headerscan.scan(path, links, at[1])
        inspected = commands.inspect(path)
        monkeypatch.setattr(headerscan, "WORKERS", 2)
        monkeypatch.setattr(headerscan, "PARALLEL", 1)
        made["spawn"].clear()
        shared = headerscan.scan(path, links, at[1])
        # (as the forked scan's test compares them: the child's part comes back by ``marshal``)
        assert json.dumps(shared, sort_keys=True) == json.dumps(alone, sort_keys=True), path
        assert made["spawn"], path
        assert commands.inspect(path) == inspected, path
