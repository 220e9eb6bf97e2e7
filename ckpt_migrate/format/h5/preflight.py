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
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
from pathlib import Path

import h5py
import numpy as np

from ckpt_migrate.errors import CorruptCheckpointError
from ckpt_migrate.format.h5.boundary import ALLOWED_TYPE_CLASSES, attribute_names
from ckpt_migrate.format.h5.io import forbid_plugin_loading

STALL_SECONDS = float(os.environ.get("CKPT_MIGRATE_STALL_SECONDS", "10"))
_TICK = b"."
_FIX = "the file is damaged; use another copy"


def preflight(path: Path) -> None:
    """Raise ``CorruptCheckpointError`` if reading ``path``'s metadata crashes or hangs HDF5."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: walk, report, and never return into the caller's code
        code = 0
        try:
            faulthandler.disable()  # a crash here is the finding, reported by the parent
            os.close(read_end)
            _walk(path, write_end)
        except BaseException:
            code = 1  # a Python-level error: the parent's own reading reports it properly
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        stalled = _follow(read_end)
    except BaseException:  # Ctrl-C: the child must not walk on after its parent has gone
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    finally:
        os.close(read_end)
    if stalled:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if stalled:
        raise CorruptCheckpointError(
            path,
            f"HDF5 made no progress reading the file's metadata for {STALL_SECONDS:.0f} s",
            _FIX,
        )
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        raise CorruptCheckpointError(
            path, f"HDF5 crashed ({name}) reading the file's metadata", _FIX
        )


def _follow(fd: int) -> bool:
    """Read progress ticks until the child closes the pipe; True if it stalled."""
    while True:
        ready, _, _ = select.select([fd], [], [], STALL_SECONDS)
        if not ready:
            return True
        if not os.read(fd, 65536):
            return False


def _walk(path: Path, tick: int) -> None:
    forbid_plugin_loading()
    with h5py.File(path, "r", locking=False, rdcc_nbytes=0) as f:
        _read_attributes(f.id, tick)

        def visit(name: bytes, info: h5py.h5l.LinkInfo) -> None:
            if info.type != h5py.h5l.TYPE_HARD:
                return None  # links to elsewhere are the boundary's to refuse, never followed
            obj = h5py.h5o.open(f.id, name)
            _read_attributes(obj, tick)
            if (
                isinstance(obj, h5py.h5d.DatasetID)
                and obj.get_create_plist().get_layout() == h5py.h5d.CHUNKED
            ):
                obj.chunk_iter(lambda _info: None)
            os.write(tick, _TICK)
            return None

        f.id.links.visit(visit, info=True)


def _read_attributes(obj: h5py.h5o.ObjectID, tick: int) -> None:
    for i, name in enumerate(attribute_names(obj)):
        attr = h5py.h5a.open(obj, name)
        if attr.get_type().get_class() not in ALLOWED_TYPE_CLASSES:
            continue  # never read: the boundary refuses it by its type
        if attr.get_space().get_simple_extent_type() != h5py.h5s.NULL:
            attr.read(np.empty(attr.shape, dtype=attr.dtype))
        if i % 1000 == 999:
            os.write(tick, _TICK)
