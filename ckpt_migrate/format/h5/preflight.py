"""Read a file's HDF5 metadata once in a forked child before this process touches it.

Python checks stop most damaged files with one line (``boundary``, ``budgets``, ``io.damaged``),
but some damage makes HDF5 itself crash or loop inside its C code, where no exception or budget
can reach: a flipped byte in a global-heap reference sent ``H5Aread`` of a variable-length string
into an endless loop (fuzz seed 5), a damaged attribute crashed it with SIGSEGV (seed 24). So the
metadata walk every reader needs anyway (every link, every attribute value, every chunk index) is
done first in a child process. The child reports progress through a pipe; the parent refuses
the file (exit 2) if the child dies by a signal or makes no progress for
:data:`STALL_SECONDS` (10, or ``CKPT_MIGRATE_STALL_SECONDS``: raise it for metadata on a
filesystem that can pause for longer). A legitimate file costs one extra pass over its
metadata (measured in benchmarks/README.md); its data is never read.

The children also take the boundary's checks (``boundary``: links, types, storage
descriptions) and walk the chunk indexes, measuring what each dataset stores (the
decompression budget, and stored bytes inside the file). A clean walk hands the total to the
parent, which then neither repeats those checks nor walks a chunk index to read or upgrade the
file (an upgrade by clone reads no chunk index at all: its cost stays the metadata's); a walk
that met a problem leaves naming it to the parent's own ``check_self_contained``.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import os
import select
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ckpt_migrate.errors import CorruptCheckpointError
from ckpt_migrate.format.h5.boundary import (
    ALLOWED_TYPE_CLASSES,
    attribute_names,
    dataset_problem,
    dataset_storage,
    link_problem,
    storage_problem,
)
from ckpt_migrate.format.h5.io import forbid_plugin_loading

STALL_SECONDS = float(os.environ.get("CKPT_MIGRATE_STALL_SECONDS", "10"))
_TICK = b"."
_STORED = b"="  # then the stored bytes in decimal: the child's last words
_FIX = "the file is damaged; use another copy"


@dataclass(frozen=True)
class Findings:
    """What a clean walk learnt: the bytes the datasets store, and each dataset's facts (by
    its name from the root: ``{"u": address, "d": numpy dtype string, "s": shape or None,
    "a": {attribute: scalar value}}``) for the readers, which then need not open it."""

    stored: int
    datasets: dict[str, dict[str, Any]]


def preflight(path: Path) -> Findings | None:
    """Raise ``CorruptCheckpointError`` if reading ``path``'s metadata crashes or hangs HDF5.

    Returns what the walk found (``Findings``), or None when a child met a problem it does
    not name (a damaged structure, a budget exceeded): the parent's own checks, which are safe
    to run once the children survived the same walk, then say what it is.

    The objects are dealt out to :data:`WORKERS` children (one per core, at most two): the
    walk is HDF5 work on one object at a time, and the parent waits for it. A walk begun
    earlier by :func:`start` for the same, unchanged file is collected instead."""
    try:
        walk = _early.pop(_identity(path), None)
    except OSError:  # gone: the reader names it
        walk = None
    return (walk or _Walk.begin(path)).collect(path)


def start(path: Path) -> None:
    """Begin ``preflight(path)`` now, for a caller that has other work (its imports) to do
    before it reads ``path``; a file that cannot be opened is left to the reader to name."""
    try:
        identity = _identity(path)
        if not h5py.is_hdf5(str(path)):
            return
    except OSError:
        return
    if identity not in _early:
        _early[identity] = _Walk.begin(path)


def _identity(path: Path) -> tuple[int, ...]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class _Walk:
    """The children walking one file, and the pipe they report through."""

    pids: list[int]
    read_end: int
    facts: list[int]  # one anonymous file per child, where it writes its datasets' facts

    @classmethod
    def begin(cls, path: Path) -> _Walk:
        read_end, write_end = os.pipe()
        walk = cls([], read_end, [])
        try:
            for part in range(WORKERS):
                walk.facts.append(_anonymous_file())
                pid = os.fork()
                if pid == 0:  # a child: walk, report, and never return into the caller's code
                    code = 0
                    try:
                        faulthandler.disable()  # a crash here is the finding, reported above
                        os.close(read_end)
                        _walk(path, write_end, part, WORKERS, walk.facts[part])
                    except BaseException:
                        code = 1  # a Python-level error: the parent's own reading reports it
                    finally:
                        os._exit(code)
                walk.pids.append(pid)
        except BaseException:
            walk.cancel()
            raise
        finally:
            os.close(write_end)
        return walk

    def cancel(self) -> None:
        """No child may walk on after its parent has gone (Ctrl-C) or given up on it."""
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in self.pids:
            os.waitpid(pid, 0)
        self.pids = []
        for fd in [self.read_end, *self.facts]:
            with contextlib.suppress(OSError):
                os.close(fd)

    def collect(self, path: Path) -> Findings | None:
        try:
            stalled, words = _follow(self.read_end)
            return self._verdict(path, stalled, words)
        finally:
            self.cancel()  # idempotent: the children are waited for, every descriptor closed

    def _verdict(self, path: Path, stalled: bool, words: bytes) -> Findings | None:
        if stalled:
            raise CorruptCheckpointError(
                path,
                f"HDF5 made no progress reading the file's metadata for {STALL_SECONDS:.0f} s",
                _FIX,
            )
        statuses = [os.waitpid(pid, 0)[1] for pid in self.pids]
        self.pids = []
        for status in statuses:
            if os.WIFSIGNALED(status):
                name = signal.Signals(os.WTERMSIG(status)).name
                raise CorruptCheckpointError(
                    path, f"HDF5 crashed ({name}) reading the file's metadata", _FIX
                )
        stored = words.split(_STORED)[1:]
        if any(os.WEXITSTATUS(status) for status in statuses) or len(stored) != len(statuses):
            return None
        datasets: dict[str, dict[str, Any]] = {}
        for fd in self.facts:
            with os.fdopen(os.dup(fd), "rb") as fh:
                fh.seek(0)
                datasets.update(json.loads(fh.read() or b"{}"))
        return Findings(sum(int(n) for n in stored), datasets)


def _anonymous_file() -> int:
    if hasattr(os, "memfd_create"):
        return os.memfd_create("ckpt-migrate-facts")
    fd, name = tempfile.mkstemp(prefix="ckpt-migrate-facts-")
    os.unlink(name)
    return fd


_early: dict[tuple[int, ...], _Walk] = {}  # by the file's identity: a changed file is walked anew


@atexit.register
def _cancel_early() -> None:
    for walk in _early.values():
        walk.cancel()
    _early.clear()


WORKERS = max(1, min(2, len(os.sched_getaffinity(0))))


def _follow(fd: int) -> tuple[bool, bytes]:
    """Read progress ticks until every child has closed the pipe: (whether they stalled, what
    they said besides ticks)."""
    words = b""
    while True:
        ready, _, _ = select.select([fd], [], [], STALL_SECONDS)
        if not ready:
            return True, words
        data = os.read(fd, 65536)
        if not data:
            return False, words
        if len(words) < 4096:  # a child says a few bytes; more is not worth keeping
            words += data.replace(_TICK, b"")


class _Refused(Exception):
    """A dataset the parent's checks will refuse: the child stops walking."""


def _walk(path: Path, tick: int, part: int, parts: int, facts_fd: int) -> None:
    """Read the metadata of every ``parts``-th object from the ``part``-th (the root's
    attributes in part 0), then say what the datasets among them store, and write their facts
    (``Findings.datasets``) to ``facts_fd``."""
    forbid_plugin_loading()
    file_bytes = os.stat(path).st_size
    stored = 0
    seen = 0
    objects: set[int] = set()
    facts: dict[str, dict[str, Any]] = {}
    with h5py.File(path, "r", locking=False, rdcc_nbytes=0) as f:
        if part == 0:
            _read_attributes(f.id, tick)

        def visit(name: bytes, info: h5py.h5l.LinkInfo) -> None:
            nonlocal stored, seen
            if link_problem(path, "", info) is not None:
                raise _Refused  # a link out of the file: never followed
            if info.type != h5py.h5l.TYPE_HARD or info.u in objects:
                return None
            objects.add(info.u)  # an object under several names (a tie) counts once
            seen += 1
            if seen % parts != part:
                return None
            obj = h5py.h5o.open(f.id, name)
            if not isinstance(obj, h5py.h5d.DatasetID):
                _read_attributes(obj, tick)
            else:
                scalars: dict[str, Any] = {}
                _read_attributes(obj, tick, scalars)
                if dataset_problem(obj, path, "") is not None:
                    raise _Refused  # before its storage is looked at
                size, end = dataset_storage(obj)
                if storage_problem(obj, size, end, file_bytes) is not None:
                    raise _Refused
                stored += size
                facts[name.decode("utf-8", "surrogateescape")] = {
                    "u": info.u,
                    "d": obj.dtype.str,
                    "s": None if obj.shape is None else list(obj.shape),
                    "a": scalars,
                }
            if seen % (8 * parts) == part:  # progress, every eighth object of this child
                os.write(tick, _TICK)
            return None

        f.id.links.visit(visit, info=True)
    with os.fdopen(os.dup(facts_fd), "w") as fh:
        fh.write(json.dumps(facts))  # (json.dump encodes in Python, dumps in C)
    os.write(tick, _STORED + str(stored).encode())


_VLEN_STR = h5py.h5t.py_create(h5py.string_dtype())


def _read_attributes(
    obj: h5py.h5o.ObjectID, tick: int, scalars: dict[str, Any] | None = None
) -> None:
    """Read every attribute's value as HDF5 stores it: variable-length strings through their
    heap (where damage made HDF5 loop or crash), anything else as raw bytes (no conversion to
    numpy types, which is h5py's work and half the cost). ``scalars`` collects the scalar
    strings, numbers and booleans as Python values (the facts a reader looks for)."""
    for i, name in enumerate(attribute_names(obj)):
        attr = h5py.h5a.open(obj, name)
        tid = attr.get_type()
        kind = tid.get_class()
        if kind not in ALLOWED_TYPE_CLASSES:
            raise _Refused  # never read: the boundary refuses it by its type
        space = attr.get_space()
        extent = space.get_simple_extent_type()
        if extent == h5py.h5s.NULL:
            continue
        if kind == h5py.h5t.STRING and tid.is_variable_str():
            out = np.empty(space.shape, dtype=object)
            attr.read(out, mtype=_VLEN_STR)
        elif scalars is not None and extent == h5py.h5s.SCALAR and kind in _NUMBERS:
            out = np.empty((), dtype=attr.dtype)
            attr.read(out)
        else:
            attr.read(np.empty(space.shape, dtype=f"V{tid.get_size()}"), mtype=tid)
            out = None
        if scalars is not None and out is not None and out.shape == ():
            value = out[()]
            if isinstance(value, bytes):
                value = value.decode("utf-8", "surrogateescape")
            if isinstance(value, (str, np.bool_, np.integer, np.floating)):
                scalars[name.decode("utf-8", "surrogateescape")] = (
                    value if isinstance(value, str) else value.item()
                )
        if i % 1000 == 999:
            os.write(tick, _TICK)


_NUMBERS = frozenset({h5py.h5t.INTEGER, h5py.h5t.FLOAT, h5py.h5t.ENUM})
