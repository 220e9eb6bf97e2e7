"""Start writing a file's dirty pages to disk without waiting for them (Linux's
``sync_file_range``), so that the fsync before publishing finds them on their way."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(file: Path | int) -> None:
    """Start writing ``file``'s dirty pages to disk without waiting for them
    (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, Linux), on a thread of its own: the call
    itself blocks while the filesystem allocates (40-90 ms for the 11 MB a clone's edit leaves
    on XFS), which the caller's next step need not wait for. A later fsync finds the pages on
    their way. Only a hint: nothing is raised. ``file``: a path, or a descriptor open on the
    file, which the thread closes once the writeback is started."""
    thread = threading.Thread(
        target=_write_back, args=(file,), name="ckpt-migrate writeback", daemon=True
    )
    try:
        thread.start()
    except RuntimeError:  # (no thread to be had: the fsync writes the pages instead)
        if isinstance(file, int):
            os.close(file)


def _write_back(file: Path | int) -> None:
    try:
        fd = file if isinstance(file, int) else os.open(file, os.O_RDONLY)
    except OSError:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        sync_file_range = getattr(libc, "sync_file_range", None)
        if sync_file_range is None:
            return
        sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
    finally:
        os.close(fd)
