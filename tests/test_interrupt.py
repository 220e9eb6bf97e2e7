"""Ctrl-C at any moment of an upgrade: it stops within a second or two, prints one
``interrupted`` line, exits 130, removes its temporary, leaves the source as it was and never
publishes an output after the interrupt. The same for SIGTERM and SIGHUP, for the tasks of a
Dask cluster, and for a source that something writes to while it is upgraded.

The checkpoint (~150 MB) is generated at test time; the copy worker is slowed down
(``CKPT_MIGRATE_TEST_WRITE_DELAY``) so that the run lasts a few seconds, and SIGINT is sent at
moments spread over it, and at the moment each phase reports its first progress line.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REAL, sha256_file, written_to_after

import ckpt_migrate as cm
from ckpt_migrate.atomic import check_writable, publish
from ckpt_migrate.cli import console
from ckpt_migrate.cli.commands import verify
from ckpt_migrate.engine import upgrade as engine
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.interrupt import Interrupt

SLOW = {"CKPT_MIGRATE_TEST_WRITE_DELAY": "0.6", "CKPT_MIGRATE_PROGRESS_INTERVAL": "0"}


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 2.0 checkpoint of ~150 MB (36 float32 tensors of 4 MiB) and its sha256."""
    base = tmp_path_factory.mktemp("interrupt")
    rng = np.random.default_rng(0)
    state = {
        "model": {
            f"layer{i}.weight": rng.standard_normal((1024, 1024), np.float32) for i in range(36)
        },
        "global_step": 7,
    }
    path = base / "src" / "big.mdl"
    path.parent.mkdir()
    cm.save(state, path, "2.0")
    yield path, sha256_file(path)
    shutil.rmtree(base, ignore_errors=True)


def start(args: list[str | Path], env: dict[str, str]) -> subprocess.Popen[str]:
    # A test run started in the background by a shell inherits SIGINT ignored, and a child
    # would keep ignoring it: the command gets the default a terminal's foreground job has.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return subprocess.Popen(
        [sys.executable, "-m", "ckpt_migrate", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        start_new_session=True,  # Ctrl-C in a terminal reaches the whole process group
    )


def interrupt(proc: subprocess.Popen[str]) -> tuple[int, str, float]:
    """SIGINT to the process group, as a terminal's Ctrl-C; (exit code, stderr, seconds to exit)."""
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err, time.monotonic() - sent


def assert_clean_stop(code: int, err: str, took: float, out: Path, src: Path, digest: str):
    assert code == 130, err
    lines = err.splitlines()
    assert lines[-1] == "interrupted" and lines.count("interrupted") == 1, err
    assert "Traceback" not in err and "error" not in err, err
    assert took < 3, f"took {took:.2f}s to stop"
    assert list(out.iterdir()) == [], "an output or a temporary was left"
    assert sorted(p.name for p in src.parent.iterdir()) == [src.name]
    assert sha256_file(src) == digest


def test_sigint_at_moments_spread_over_the_run(big, tmp_path):
    src, digest = big
    out = tmp_path / "out"
    out.mkdir()
    runs = []
    for _ in range(2):  # (the quicker of two: a run slowed by other work spreads the moments
        start_at = time.monotonic()  # past the end of the next, which then finishes first)
        proc = start(["upgrade", src, "-o", out, "--verify", "full"], SLOW)
        assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
        runs.append(time.monotonic() - start_at)
        (out / src.name).unlink()
    total = min(runs)
    # From the moment the command's code runs: a Ctrl-C during the interpreter's own start
    # (site, before ckpt_migrate is imported) is Python's, a traceback we cannot intercept.
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", "import ckpt_migrate.cli"], check=True)
    first = max(0.1, time.monotonic() - began)
    outcomes = []
    for delay in np.linspace(first, 0.9 * total, 6):
        proc = start(["upgrade", src, "-o", out, "--verify", "full"], SLOW)
        time.sleep(delay)
        code, err, took = interrupt(proc)
        # Finished before the signal, or the signal landed as the output was moved into place
        # (it is raised once the output is there, and said): a complete, verified output.
        if code == 0 or f"complete before the interrupt: {out / src.name}" in err.splitlines():
            outcomes.append("done")
            with read_checkpoint(out / src.name) as ckpt:
                assert ckpt.release is not None and ckpt.release.name == "2.10"
            (out / src.name).unlink()
            continue
        assert_clean_stop(code, err, took, out, src, digest)
        outcomes.append("interrupted")
    assert outcomes.count("interrupted") >= 4, outcomes


@pytest.mark.parametrize("phase", ["patch", "copy", "verify"])
def test_sigint_during_each_phase(big, tmp_path, phase):
    src, digest = big
    out = tmp_path / "out"
    out.mkdir()
    proc = start(["upgrade", src, "-o", out, "--verify", "full", "--progress", "plain"], SLOW)
    seen = until_line(proc, f"{phase}:")
    code, err, took = interrupt(proc)
    assert_clean_stop(code, "".join(seen[-1:]) + err, took, out, src, digest)


def until_line(proc: subprocess.Popen[str], start: str) -> list[str]:
    """The lines ``proc`` printed on stderr up to the first that starts with ``start``."""
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith(start):
            return seen
    pytest.fail(f"no line starts with {start!r}: {seen}")


def test_an_interrupt_lost_in_a_callback_still_stops_the_publish(big, tmp_path, monkeypatch):
    """Python runs the SIGINT handler between any two bytecodes; inside a destructor or an HDF5
    callback its KeyboardInterrupt is dropped. A real SIGINT is delivered right before the
    publish and its exception swallowed: the flag the handler set still stops the publish."""
    src, digest = big
    out = tmp_path / "out"
    out.mkdir()
    fsync = engine.fsync_path

    def fsync_then_lose_a_sigint(path: Path, **settle: bool) -> None:
        fsync(path, **settle)
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs here
        except KeyboardInterrupt:
            pass  # what a destructor or a C callback does to it

    monkeypatch.setattr(engine, "fsync_path", fsync_then_lose_a_sigint)
    monkeypatch.setattr(Interrupt, "pressed", False)
    previous = signal.signal(signal.SIGINT, console.on_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.upgrade(src, engine.UpgradeOptions(output_dir=out))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert Interrupt.pressed
    assert list(out.iterdir()) == []
    assert sha256_file(src) == digest


def sigint_after_the_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A temporary and its target, whose publish is sent SIGINT once the output is linked to
    its name, before the temporary is removed."""
    tmp, target = tmp_path / "a.mdl.0123abcd.tmp", tmp_path / "a.mdl"
    tmp.write_bytes(b"whole")
    link = os.link

    def link_then_sigint(src, dst):
        link(src, dst)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # (the handler runs here)

    monkeypatch.setattr(os, "link", link_then_sigint)
    monkeypatch.setattr(Interrupt, "pressed", False)
    return tmp, target


def test_an_interrupt_as_the_output_is_moved_into_place(tmp_path, monkeypatch, capsys):
    """SIGINT between the link of the output to its name and the removal of its temporary (CI
    once sent it there, as the run ended): the move is finished first, then the interrupt is
    raised; the command says which output was complete before it. The temporary was left
    beside a published output, and nothing said the output was whole."""
    tmp, target = sigint_after_the_link(tmp_path, monkeypatch)
    code = console.run_guarded(lambda: publish(tmp, target))
    assert code == 130
    assert capsys.readouterr().err.splitlines() == [
        f"complete before the interrupt: {target}",
        "interrupted",
    ]
    assert sorted(tmp_path.iterdir()) == [target] and target.read_bytes() == b"whole"


def test_a_library_callers_ctrl_c_as_the_output_is_moved_into_place(tmp_path, monkeypatch):
    """The library under Python's own SIGINT handler (a program, a notebook): the press lands
    between the link and the removal of the temporary, the move is finished, then the
    KeyboardInterrupt is raised. Python's handler is back after it, and the press does not
    stop the next call. The temporary was left beside the output."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    link = os.link
    tmp, target = sigint_after_the_link(tmp_path, monkeypatch)
    try:
        with pytest.raises(KeyboardInterrupt):
            publish(tmp, target)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sorted(tmp_path.iterdir()) == [target] and target.read_bytes() == b"whole"
    monkeypatch.setattr(os, "link", link)
    (tmp_path / "b.mdl.0123abcd.tmp").write_bytes(b"next")
    publish(tmp_path / "b.mdl.0123abcd.tmp", tmp_path / "b.mdl")
    assert (tmp_path / "b.mdl").read_bytes() == b"next" and not Interrupt.pressed


def test_an_interrupt_before_the_move_says_nothing_was_complete(tmp_path, monkeypatch, capsys):
    """A command that published an output in an earlier run in this process is not said to
    have written it when a later one is interrupted before its own."""
    first, tmp = tmp_path / "first.mdl.0123abcd.tmp", tmp_path / "b.mdl.0123abcd.tmp"
    first.write_bytes(b"1")
    tmp.write_bytes(b"2")
    monkeypatch.setattr(Interrupt, "pressed", False)
    assert console.run_guarded(lambda: publish(first, tmp_path / "first.mdl")) == 0

    def interrupted():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        publish(tmp, tmp_path / "b.mdl")

    assert console.run_guarded(interrupted) == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert not (tmp_path / "b.mdl").exists()


@pytest.mark.parametrize("at", [1, 2])
def test_an_interrupt_as_tensorflow_checkpoints_are_moved_into_place(
    tmp_path, monkeypatch, at, capsys
):
    """``h5-to-tf`` moves each checkpoint's data files, then each ``.index`` (by which a reader
    finds one). SIGINT during the move of the first index: nothing is left in place; during
    the last: all are, and said."""
    from types import SimpleNamespace

    from ckpt_migrate.tf.stage import Staged, publish_all

    staged = []
    for name in ("a", "b"):
        tmpdir = tmp_path / f"{name}.stage"
        tmpdir.mkdir()
        for part in (".data-00000-of-00001", ".index"):
            (tmpdir / f"t{part}").write_bytes(name.encode())
        prefix = str(tmp_path / "out" / name)
        staged.append(Staged(tmpdir, tmpdir / "t", SimpleNamespace(prefix=prefix)))
    (tmp_path / "out").mkdir()
    link, indexes = os.link, []

    def link_then_sigint(src, dst):
        link(src, dst)
        if str(dst).endswith(".index"):
            indexes.append(dst)
            if len(indexes) == at:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.5)

    monkeypatch.setattr(os, "link", link_then_sigint)
    monkeypatch.setattr(Interrupt, "pressed", False)
    assert console.run_guarded(lambda: publish_all(staged)) == 130
    left = sorted(p.name for p in (tmp_path / "out").iterdir())
    if at == 1:
        assert capsys.readouterr().err == "interrupted\n" and left == []
    else:
        assert capsys.readouterr().err.splitlines() == [
            f"complete before the interrupt: 2 outputs, the last {staged[1].output.prefix}",
            "interrupted",
        ]
        assert left == [f"{n}{part}" for n in "ab" for part in (".data-00000-of-00001", ".index")]


def test_an_interrupt_as_an_export_replaces_the_old_one(tmp_path, monkeypatch, capsys):
    """``export-hf --force`` moves the old directory aside, then the new one into place. SIGINT
    between the two renames left no directory at the target's name and the old one under a
    hidden name; the replacement is finished first now, and said."""
    from ckpt_migrate.hf.outdir import atomic_dir

    target = tmp_path / "hf"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"old")
    rename, renames = os.rename, []

    def rename_then_sigint(src, dst):
        rename(src, dst)
        renames.append(dst)
        if len(renames) == 1:  # the old one, moved aside
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)

    def export() -> None:
        with atomic_dir(target, force=True) as tmp:
            (tmp / "model.safetensors").write_bytes(b"new")

    monkeypatch.setattr(os, "rename", rename_then_sigint)
    monkeypatch.setattr(Interrupt, "pressed", False)
    assert console.run_guarded(export) == 130
    assert capsys.readouterr().err.splitlines() == [
        f"complete before the interrupt: {target}",
        "interrupted",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]
    assert (target / "model.safetensors").read_bytes() == b"new"


def test_sigint_in_upgrade_dir_stops_the_whole_run(big, tmp_path):
    """Ctrl-C while the first of two checkpoints is copied: no file of the directory is
    published, the second is never started."""
    src, digest = big
    md = tmp_path / "md"
    md.mkdir()
    for step in (1, 2):
        os.link(src, md / f"checkpoint_{step}.mdl")  # the same bytes, no extra disk
    out = tmp_path / "out"
    proc = start(["upgrade-dir", md, "-o", out, "--progress", "plain"], SLOW)
    until_line(proc, "file 1 of 2: copy:")
    code, err, took = interrupt(proc)
    assert code == 130 and err.splitlines()[-1] == "interrupted", err
    assert "file 2 of 2" not in err and took < 3
    assert not out.exists()  # (made by the run, and removed again empty)
    assert sha256_file(src) == digest


def _terminate(proc: subprocess.Popen[str], signum: int = signal.SIGTERM) -> tuple[int, str, float]:
    """``signum`` to the process alone, as ``kill``, ``timeout`` or a scheduler's limit sends
    SIGTERM, and a closed terminal SIGHUP."""
    sent = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err, time.monotonic() - sent


@pytest.mark.parametrize(
    ("signum", "phase", "sigint"),
    [
        (signal.SIGTERM, "patch", "default"),
        (signal.SIGTERM, "copy", "ignored"),
        (signal.SIGHUP, "copy", "default"),
    ],
    ids=["sigterm-patch", "sigterm-copy-sigint-ignored", "sighup-copy"],
)
def test_sigterm_and_sighup_stop_the_run_as_ctrl_c_does(big, tmp_path, signum, phase, sigint):
    """SIGTERM and SIGHUP killed the process where it stood: its temporary, as large as the
    output, stayed beside the target until the next run of the same target, and nothing was
    said. Each now stops the run as Ctrl-C does, and says ``terminated`` (exit 143) or ``hung
    up`` (129); also in a job started with ``&``, whose SIGINT is ignored, when a ``kill`` is
    the way to stop it."""
    src, digest = big
    out = tmp_path / "out"
    out.mkdir()
    args = ["upgrade", src, "-o", out, "--verify", "full", "--progress", "plain"]
    if sigint == "ignored":
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckpt_migrate", *map(str, args)],
            stderr=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **SLOW},
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    else:
        proc = start(args, SLOW)
    until_line(proc, f"{phase}:")
    code, err, took = _terminate(proc, signum)
    assert code == 128 + signum, err
    said = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}[signum]
    assert err.splitlines()[-1] == said and "interrupted" not in err, err
    assert "Traceback" not in err and "error" not in err, err
    assert took < 3, f"took {took:.2f}s to stop"
    assert list(out.iterdir()) == [], "an output or a temporary was left"
    assert sha256_file(src) == digest


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_stopped_run_of_workers_publishes_nothing_after(big, tmp_path, how):
    """``upgrade-dir --workers 2``: Ctrl-C reached the workers' processes, whose event loops
    stopped with a traceback each while their tasks went on and published their outputs
    seconds after the command said ``interrupted``; a SIGTERM to the command left them to
    finish too. The workers now note the interrupt (Ctrl-C reaches them; the command sends
    it on a SIGTERM), and their tasks stop as ``upgrade`` does, their temporaries removed."""
    pytest.importorskip("distributed")
    src, digest = big
    md = tmp_path / "md"
    md.mkdir()
    for step in (1, 2):
        os.link(src, md / f"checkpoint_{step}.mdl")
    out = tmp_path / "out"
    proc = start(["upgrade-dir", md, "-o", out, "--workers", "2", "--progress", "none"], SLOW)
    deadline = time.monotonic() + 60
    while not (out.is_dir() and any(p.suffix == ".tmp" for p in out.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, "no task began to write"
        time.sleep(0.05)
    code, err, took = interrupt(proc) if how == "ctrl-c" else _terminate(proc)
    word = {"ctrl-c": "interrupted", "sigterm": "terminated"}[how]
    assert code == {"ctrl-c": 130, "sigterm": 143}[how], err
    assert err.splitlines()[-1] == word and "Traceback" not in err, err
    assert took < 5, f"took {took:.2f}s to stop"
    time.sleep(3)  # (a task that went on would publish meanwhile)
    assert not out.exists() or list(out.iterdir()) == [], list(out.iterdir())
    assert sha256_file(src) == digest


def _starting_workers(pid: int) -> list[int]:
    """The processes of the group ``pid`` leads that are a Dask worker's spawned interpreter
    and catch SIGINT: Python has set its handler, and the worker is importing."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
            caught = (entry / "status").read_text().split("SigCgt:")[1].split()[0]
        except (OSError, ValueError, IndexError):
            continue
        pgrp = int(stat.rsplit(")", 1)[1].split()[2])
        ours = pgrp == pid and int(entry.name) != pid and b"spawn_main" in cmdline
        if ours and int(caught, 16) & 1 << (signal.SIGINT - 1):
            found.append(int(entry.name))
    return found


def test_ctrl_c_while_the_workers_start_prints_no_traceback(tmp_path):
    """``upgrade-dir --workers 2`` interrupted while its workers' interpreters were still
    importing Dask: a terminal's Ctrl-C reaches the whole process group, and each worker
    printed a ``KeyboardInterrupt`` traceback of its imports before the command's
    ``interrupted``. The workers now start with SIGINT blocked until their handler is set."""
    pytest.importorskip("distributed")
    md = tmp_path / "md"
    md.mkdir()
    for step in (1, 2):
        shutil.copyfile(REAL / "tied.mdl", md / f"checkpoint_{step}.mdl")
    out = tmp_path / "out"
    proc = start(["upgrade-dir", md, "-o", out, "--workers", "2", "--progress", "none"], {})
    deadline = time.monotonic() + 60
    while len(_starting_workers(proc.pid)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "no worker started"
        time.sleep(0.01)
    code, err, _ = interrupt(proc)
    assert code == 130 and err.splitlines()[-1] == "interrupted", err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_a_stopped_run_on_someone_elses_cluster_publishes_nothing_after(big, tmp_path, monkeypatch):
    """``upgrade-dir --scheduler``: the cluster is not the command's, its workers hear no
    Ctrl-C of the command's. Their tasks went on after the command said ``interrupted`` and
    published their outputs. The run now sets an event its tasks ask about (``fleet.Stop``):
    each stops at its next step, its temporary removed, and a task not yet begun never is."""
    distributed = pytest.importorskip("distributed")
    src, digest = big
    md = tmp_path / "md"
    md.mkdir()
    for step in (1, 2, 3):
        os.link(src, md / f"checkpoint_{step}.mdl")
    out = tmp_path / "out"
    for name, value in SLOW.items():  # (the workers' processes take this environment)
        monkeypatch.setenv(name, value)
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None
    ) as cluster:
        args = ["upgrade-dir", md, "-o", out, "--scheduler", cluster.scheduler_address]
        proc = start([*args, "--progress", "none"], {})
        deadline = time.monotonic() + 60
        while not (out.is_dir() and any(p.suffix == ".tmp" for p in out.iterdir())):
            assert proc.poll() is None and time.monotonic() < deadline, "no task began to write"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # (the command's own: the workers are not its children)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and err.splitlines()[-1] == "interrupted", err
        time.sleep(4)  # (a task that went on would publish meanwhile; one stops within ~1 s)
        assert not out.exists() or list(out.iterdir()) == [], list(out.iterdir())
    assert sha256_file(src) == digest


@pytest.mark.parametrize("where", ["output-dir", "inplace"])
def test_a_source_written_to_while_it_is_upgraded_publishes_nothing(big, tmp_path, where):
    """A job writing over the checkpoint while it was upgraded (``rsync --inplace``, a save
    to the same name): the part of the file copied before the write was the old one, the rest
    the new, and the output was published "verified", equal to neither (``verify`` then found
    a tensor that differs). Now the source's size and modification time are compared before
    publishing: exit 4, nothing published, nothing replaced."""
    src = tmp_path / "src" / "ckpt.mdl"
    src.parent.mkdir()
    shutil.copyfile(big[0], src)
    out = tmp_path / "out"
    dest = ["--inplace"] if where == "inplace" else ["-o", out]
    proc = start(["upgrade", src, *dest, "--progress", "plain"], SLOW)
    until_line(proc, "copy:")  # (its first block copied)
    with open(src, "r+b") as f:
        f.seek(10 << 20)
        f.write(b"\xff" * 16)
    written = sha256_file(src)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 4, err
    assert err.splitlines()[-1] == (
        f"error: {src}: was written to while it was read; nothing was published; "
        "run again once nothing writes to it"
    ), err
    assert sorted(p.name for p in src.parent.iterdir()) == [src.name]  # (no backup, no temp)
    assert not out.exists() or list(out.iterdir()) == []
    assert sha256_file(src) == written


@pytest.mark.parametrize("to", ["2.6", "2.3"], ids=["root-edit", "rewrite"])
@pytest.mark.parametrize("change", ["written-to", "removed"])
def test_a_real_librarys_file_changed_before_the_publish(tmp_path, monkeypatch, to, change):
    """The real 2.10 library's file, written to or removed once the output is made and
    fsynced, the moment before it would be published, in a root edit and in a rewrite.
    Written to: nothing is published (exit 4). Removed (or moved away): the file read, still
    open, was whole, and its output is published as it was before the check; the first
    form of the check took the missing name for "<the output>: write failed"."""
    src = tmp_path / "src" / "basic.mdl"
    src.parent.mkdir()
    shutil.copyfile(REAL / "basic.mdl", src)
    if change == "written-to":
        written_to_after(monkeypatch, engine, "fsync_path", src)
    else:
        fsync = engine.fsync_path
        monkeypatch.setattr(
            engine, "fsync_path", lambda path, **kw: (fsync(path, **kw), src.unlink())
        )
    out = tmp_path / "out"
    result = engine.upgrade(src, engine.UpgradeOptions(target=to, output_dir=out))
    if change == "written-to":
        assert (result.status, result.exit_code) == ("failed", 4), result.error
        said = "was written to while it was read; nothing was published; "
        assert result.error is not None and result.error.startswith(f"{src}: {said}")
        assert not out.exists() or list(out.iterdir()) == []
    else:
        assert result.status == "upgraded", result.error
        assert verify(REAL / "basic.mdl", out / "basic.mdl")["identical"]


def test_a_sigterm_is_said_for_its_own_run_only(monkeypatch, capsys):
    """Commands run one after another in one process (a test, a library user): a SIGTERM
    that stopped one left the next one's Ctrl-C said as ``terminated``, exit 143."""

    def terminated() -> None:
        console.on_terminate(signal.SIGTERM, None)

    def pressed() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Interrupt, "pressed", False)
    assert console.run_guarded(terminated) == 143
    monkeypatch.setattr(Interrupt, "pressed", False)
    assert console.run_guarded(pressed) == 130
    assert capsys.readouterr().err == "terminated\ninterrupted\n"


def test_the_writability_probe_leaves_no_name_a_kill_could_strand(tmp_path, monkeypatch):
    """A SIGKILL between creating the probe and removing it must leave nothing in the output
    directory (a run of upgrade-dir killed there left a ``.ckpt-migrate-probe.*`` file). The
    probe is an unnamed O_TMPFILE file, so even a removal that never happens leaves none."""
    if not getattr(os, "O_TMPFILE", 0):
        pytest.skip("this platform has no O_TMPFILE; the probe is a named temporary there")

    def never(path, *args, **kwargs):
        raise AssertionError(f"the probe was named ({path}); a kill here would strand it")

    monkeypatch.setattr(os, "unlink", never)
    check_writable(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_line_and_its_end_are_one_write(monkeypatch):
    """A progress line is written with its newline in one call: a Ctrl-C between two writes
    left ``patch: 28 of 37 tensors (75%)interrupted`` on one line (seen under load)."""
    from ckpt_migrate.cli.console import PlainProgress, echo

    writes: list[str] = []

    class Stream:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Stream())
    PlainProgress(0)("patch", 28, 37)
    echo("interrupted", err=True)
    assert writes == ["patch: 28 of 37 tensors (75%)\n", "interrupted\n"]


@pytest.fixture
def entry_in_process(monkeypatch):
    """``cli.entry`` run in this process, its startup step replaced; SIGINT's handler restored
    after (the console script ignores SIGINT once its outcome is printed)."""
    import ckpt_migrate.cli as cli

    monkeypatch.setattr(cli, "_PRESSED", [])
    handler = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def run(starting) -> int:
        monkeypatch.setattr(cli, "_begin_upgrade_reading", starting)
        return cli.entry(["upgrade", "x.mdl"])

    yield run
    signal.signal(signal.SIGINT, handler)


def test_ctrl_c_while_a_class_is_created_at_startup(entry_in_process, capsys):
    """Ctrl-C during the startup imports can land in a ``__set_name__`` (``platform`` defines a
    class with a cached_property while numpy loads; CI caught it there), which Python 3.11
    reports as a RuntimeError caused by the KeyboardInterrupt: still one line and 130."""

    class Pressed:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    def starting(args):
        type("uname_result", (), {"processor": Pressed()})

    assert entry_in_process(starting) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_ctrl_c_at_startup_that_a_library_turned_into_its_own_error(entry_in_process, capsys):
    """numpy's import, interrupted, raises an ImportError that no longer names the
    KeyboardInterrupt (seen when SIGINT was sent 50 ms after the start): the press is noted."""

    def starting(args):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            pass  # (C code clears it, no context kept)
        raise ImportError("PyCapsule_Import could not import module")

    assert entry_in_process(starting) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_an_error_at_startup_is_no_interrupt(entry_in_process):
    def starting(args):
        raise RuntimeError("not an interrupt")

    with pytest.raises(RuntimeError, match="not an interrupt"):
        entry_in_process(starting)
