"""Helpers the test files share: the repository's paths, running the commands as a user does,
and the one-line error check every error path is held to."""

from __future__ import annotations

import hashlib
import lzma
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import forked_cli
import numpy as np
import pytest

import ckpt_migrate as cm
from ckpt_migrate.format.read import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
REAL = FIXTURES / "real-cstorch-2.10"  # files written by the real cerebras.pytorch 2.10
MODELS = FIXTURES / "models"
CONFIGS = FIXTURES / "configs"
CKPT = "checkpoint_100.mdl"  # the checkpoint name in every model fixture directory


def run_cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m ckpt_migrate ARGS`` in a fresh process."""
    done = forked_cli.run([str(a) for a in args], script=None, cwd=cwd, stdin_devnull=False)
    if done is not None:
        return done
    return subprocess.run(
        [sys.executable, "-m", "ckpt_migrate", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
    )


def run_capped(
    *args: str | Path, seconds: float = 30, script: str | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    """``run_cli`` (or ``run_script`` when ``script`` names one) killed after ``seconds``; also
    returns the process's own peak resident memory in MiB (from ``wait4``, not a sum)."""
    head = [str(ROOT / "scripts" / script)] if script else ["-m", "ckpt_migrate"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, *head, *map(str, args)],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
        timer = threading.Timer(seconds, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.returncode != -signal.SIGKILL, f"{args} ran for more than {seconds} s"
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(
            proc.args, proc.returncode, out.read().decode(), err.read().decode()
        )
    return done, usage.ru_maxrss / 1024


def run_script(
    name: str, *args: str | Path, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """``python scripts/NAME ARGS`` in a fresh process (in ``cwd``), with no standard input."""
    script = ROOT / "scripts" / name
    done = forked_cli.run([str(a) for a in args], script=script, cwd=cwd, stdin_devnull=True)
    if done is not None:
        return done
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *map(str, args)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


def written_to_after(monkeypatch, owner: object, name: str, path: Path) -> None:
    """``owner.name`` patched to run and then move ``path``'s modification time, as a job
    writing over the file does: the source of the output being made changed while it was
    read (``h5.identity.watch``)."""
    real = getattr(owner, name)

    def then_written_to(*args, **kwargs):
        done = real(*args, **kwargs)
        os.utime(path, ns=(0, path.stat().st_mtime_ns + 1))
        return done

    monkeypatch.setattr(owner, name, then_written_to)


def one_line_error(
    proc: subprocess.CompletedProcess,
    code: int | None,
    *words: str,
    skip_warnings: bool = False,
) -> str:
    """The process failed with exit ``code`` (None: any non-zero) and printed exactly one error
    line containing ``words``, and no traceback; returns the line. ``skip_warnings``: ``warning:``
    lines printed before it do not count."""
    if code is None:
        assert proc.returncode != 0, proc.stdout + proc.stderr
    else:
        assert proc.returncode == code, f"exit {proc.returncode}: {proc.stdout}{proc.stderr}"
    lines = proc.stderr.strip().splitlines()
    if skip_warnings:
        lines = [ln for ln in lines if not ln.startswith("warning:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def release_of(path: Path) -> str:
    """The release a checkpoint file is detected as."""
    with read_checkpoint(path) as ckpt:
        assert ckpt.release is not None
        return ckpt.release.name


def shipped_checkpoints(tmp_path: Path) -> list[Path]:
    """Every checkpoint under ``fixtures/``, and the real library's 2.6-2.9 files and Model
    Zoo's converter outputs and Trainer checkpoint decompressed into ``tmp_path``."""
    packed = _unpacked(FIXTURES / "modelzoo-2.10-converted", tmp_path)
    packed += _unpacked(FIXTURES / "modelzoo-2.10-trainer", tmp_path)
    return sorted(FIXTURES.rglob("*.mdl")) + real_2x_files(tmp_path) + packed


def real_2x_files(tmp_path: Path) -> list[Path]:
    """The real library's 2.6-2.9 files (``fixtures/real-cstorch-2.6-2.9``), decompressed into
    ``tmp_path``."""
    return _unpacked(FIXTURES / "real-cstorch-2.6-2.9", tmp_path)


def walk_corpus(tmp_path: Path, layout_19: Path) -> list[Path]:
    """Files for the preflight walk's tests, most not ours: the real 2.10 library's
    ``basic.mdl`` and ``tied.mdl`` and its 2.6-2.9 files, two of Model Zoo's converter outputs,
    ``layout_19`` (``real_layout_19``: a 1.9 file laid out as its library wrote it) and a
    checkpoint of ours; made under ``tmp_path``."""
    ours = tmp_path / "ours.mdl"
    cm.save({"model": {f"t{i}": np.full(1000, i, dtype=np.float32) for i in range(40)}}, ours)
    files = [ours, layout_19, REAL / "basic.mdl", REAL / "tied.mdl"]
    (tmp_path / "2x").mkdir()
    files += real_2x_files(tmp_path / "2x")
    for packed in sorted((FIXTURES / "modelzoo-2.10-converted").glob("*.mdl.xz"))[:2]:
        files.append(tmp_path / packed.name.removesuffix(".xz"))
        files[-1].write_bytes(lzma.decompress(packed.read_bytes()))
    return files


def _unpacked(directory: Path, tmp_path: Path) -> list[Path]:
    found = []
    for packed in sorted(directory.glob("*.mdl.xz")):
        found.append(tmp_path / packed.name[:-3])
        found[-1].write_bytes(lzma.decompress(packed.read_bytes()))
    return found


def sha256_file(path: Path) -> str:
    """The sha256 of a whole file (to show that a source was left byte for byte unchanged)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def same_bytes(path: Path) -> str:
    """The file's hash but for the times HDF5 stamps a new root's header with, in seconds (the
    one ``benchmarks/identical_outputs.py`` compares versions of the tool by): two files written
    alike a second apart hash the same."""
    bench = str(ROOT / "benchmarks")
    sys.path.insert(0, bench)
    try:
        from identical_outputs import sha256
    finally:
        sys.path.remove(bench)
    return sha256(path)


@pytest.fixture
def small_disk(tmp_path, request):
    """``small_disk(nbytes)``: a fresh tmpfs of that size, unmounted when the test ends."""

    def mount(nbytes: int) -> Path:
        where = tmp_path / f"disk{len(list(tmp_path.glob('disk*')))}"
        where.mkdir()
        try:
            proc = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={nbytes}", "tmpfs", str(where)],
                capture_output=True,
                text=True,
            )
        except FileNotFoundError:
            pytest.skip("no mount command: cannot make a small disk to fill up")
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs to fill up (needs root): {proc.stderr.strip()}")

        def unmount() -> None:
            if subprocess.run(["umount", str(where)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(where)], capture_output=True)

        request.addfinalizer(unmount)
        return where

    return mount


@pytest.fixture(scope="session")
def real_layout_19(tmp_path_factory) -> Path:
    """A 1.9 checkpoint laid out as the 1.9 library wrote it (``real_layout``), written once per
    session; copy or link it, never change it."""
    import real_layout

    return real_layout.write(tmp_path_factory.mktemp("real-layout") / "checkpoint_100.mdl")
