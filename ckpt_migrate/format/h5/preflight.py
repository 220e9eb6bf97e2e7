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

import contextlib
import faulthandler
import os
import select
import signal
from pathlib import Path

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


def preflight(path: Path) -> int | None:
    """Raise ``CorruptCheckpointError`` if reading ``path``'s metadata crashes or hangs HDF5.

    Returns the bytes the file's datasets store, or None when a child met a problem it does
    not name (a damaged structure, a budget exceeded): the parent's own checks, which are safe
    to run once the children survived the same walk, then say what it is.

    The objects are dealt out to :data:`WORKERS` children (one per core, at most two): the
    walk is HDF5 work on one object at a time, and the parent waits for it."""
    read_end, write_end = os.pipe()
    pids: list[int] = []
    try:
        for part in range(WORKERS):
            pid = os.fork()
            if pid == 0:  # a child: walk, report, and never return into the caller's code
                code = 0
                try:
                    faulthandler.disable()  # a crash here is the finding, reported by the parent
                    os.close(read_end)
                    _walk(path, write_end, part, WORKERS)
                except BaseException:
                    code = 1  # a Python-level error: the parent's own reading reports it
                finally:
                    os._exit(code)
            pids.append(pid)
        os.close(write_end)
        stalled, words = _follow(read_end)
    except BaseException:  # Ctrl-C: no child may walk on after its parent has gone
        _stop(pids)
        raise
    finally:
        os.close(read_end)
    if stalled:
        _stop(pids)
        raise CorruptCheckpointError(
            path,
            f"HDF5 made no progress reading the file's metadata for {STALL_SECONDS:.0f} s",
            _FIX,
        )
    statuses = [os.waitpid(pid, 0)[1] for pid in pids]
    for status in statuses:
        if os.WIFSIGNALED(status):
            name = signal.Signals(os.WTERMSIG(status)).name
            raise CorruptCheckpointError(
                path, f"HDF5 crashed ({name}) reading the file's metadata", _FIX
            )
    stored = words.split(_STORED)[1:]
    if any(os.WEXITSTATUS(status) for status in statuses) or len(stored) != len(pids):
        return None
    return sum(int(n) for n in stored)


WORKERS = max(1, min(2, len(os.sched_getaffinity(0))))


def _stop(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        os.waitpid(pid, 0)


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


def _walk(path: Path, tick: int, part: int, parts: int) -> None:
    """Read the metadata of every ``parts``-th object from the ``part``-th (the root's
    attributes in part 0), then say what the datasets among them store."""
    forbid_plugin_loading()
    file_bytes = os.stat(path).st_size
    stored = 0
    seen = 0
    objects: set[int] = set()
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
            _read_attributes(obj, tick)
            if isinstance(obj, h5py.h5d.DatasetID):
                if dataset_problem(obj, path, "") is not None:
                    raise _Refused  # before its storage is looked at
                size, end = dataset_storage(obj)
                if storage_problem(obj, size, end, file_bytes) is not None:
                    raise _Refused
                stored += size
            os.write(tick, _TICK)
            return None

        f.id.links.visit(visit, info=True)
    os.write(tick, _STORED + str(stored).encode())


_VLEN_STR = h5py.h5t.py_create(h5py.string_dtype())


def _read_attributes(obj: h5py.h5o.ObjectID, tick: int) -> None:
    """Read every attribute's value as HDF5 stores it: variable-length strings through their
    heap (where damage made HDF5 loop or crash), anything else as raw bytes (no conversion to
    numpy types, which is h5py's work and half the cost)."""
    for i, name in enumerate(attribute_names(obj)):
        attr = h5py.h5a.open(obj, name)
        tid = attr.get_type()
        kind = tid.get_class()
        if kind not in ALLOWED_TYPE_CLASSES:
            raise _Refused  # never read: the boundary refuses it by its type
        space = attr.get_space()
        if space.get_simple_extent_type() == h5py.h5s.NULL:
            continue
        if kind == h5py.h5t.STRING and tid.is_variable_str():
            attr.read(np.empty(space.shape, dtype=object), mtype=_VLEN_STR)
        else:
            attr.read(np.empty(space.shape, dtype=f"V{tid.get_size()}"), mtype=tid)
        if i % 1000 == 999:
            os.write(tick, _TICK)
