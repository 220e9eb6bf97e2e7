"""Worker processes forked from this one (the preflight's walk, the header scan): a fork that a
Ctrl-C cannot catch half made, and the anonymous files a parent and its children share.

A terminal's Ctrl-C reaches the whole process group. One that arrived in a child while
``os.fork`` was still running the interpreter's after-fork hooks there (``random`` reseeds
itself) was printed as "Exception ignored in: ... Traceback", beside the command's one line
``interrupted`` (``tests/test_interrupt.py``, once in CI under load). So SIGINT (and SIGTERM and
SIGHUP, which the command line takes as it takes a Ctrl-C) is held across the fork, in both
processes, until each calls :func:`release`: the child inside the ``try`` that ends it, the
parent once it has recorded the child (a Ctrl-C raised before that would leave a child that
nobody ends).

Held twice over: blocked in the forking thread, and, where that is the main thread, its Python
handler replaced by one that only records it. The kernel hands a signal the forking thread
blocks to another thread (OpenBLAS starts some), and Python then runs the handler in the main
thread all the same, at its next instruction (seen in CI). :func:`release` puts both back and
raises a recorded signal again, to the handler it was meant for.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

from ckpt_migrate.format.h5 import capi
from ckpt_migrate.interrupt import STOP_SIGNALS

_HELD = set(STOP_SIGNALS)


@dataclass(frozen=True)
class _Hold:
    mask: set[signal.Signals]  # the forking thread's, before the fork
    handlers: dict[int, Any]  # each held signal's Python handler to put back


_hold: _Hold | None = None
# Held by a parent from making the pipes its children write to until it has closed its own
# ends of them: a child that another thread of this process forked meanwhile would hold copies,
# and whoever waits for a pipe's end would wait for that child too (threads loading checkpoints
# side by side: the walks' children waited on each other, and the stall refused sound files).
forking = threading.RLock()
_pressed: list[tuple[int, int]] = []  # (pid, signal) of each held signal that arrived


def fork() -> int:
    """``os.fork()`` with ``interrupt.STOP_SIGNALS`` held, in both processes, until :func:`release`;
    called, and released, with :data:`forking` held (what is held is kept here, one fork at a
    time)."""
    global _hold
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _HELD:
            handler = signal.getsignal(signum)
            if handler is not None:  # (set outside Python, which could not be put back)
                handlers[signum] = handler
                signal.signal(signum, _record)
    hold = _Hold(signal.pthread_sigmask(signal.SIG_BLOCK, _HELD), handlers)
    try:
        # h5py's lock held across the fork: no other thread of this process is inside HDF5
        # then, so the child inherits neither that lock taken nor HDF5 half way through a call
        # (a child forked while another thread read a file waited for the lock for ever, and
        # the walk's stall refused a sound file as damaged).
        with capi.LOCK:
            pid = os.fork()
    except BaseException:  # (no child made)
        _release(hold)
        raise
    _hold = hold
    return pid


def release() -> None:
    """After :func:`fork`: ``interrupt.STOP_SIGNALS`` as they were before it (one held meanwhile is
    raised now)."""
    global _hold
    hold, _hold = _hold, None
    if hold is not None:
        _release(hold)


def _record(signum: int, frame: Any) -> None:
    _pressed.append((os.getpid(), signum))


def _release(hold: _Hold) -> None:
    signal.pthread_sigmask(signal.SIG_SETMASK, hold.mask)
    for signum, handler in hold.handlers.items():
        signal.signal(signum, handler)
    pid = os.getpid()
    arrived = [signum for who, signum in _pressed if who == pid]
    _pressed.clear()
    for signum in dict.fromkeys(arrived):
        signal.raise_signal(signum)


def anonymous_file() -> int:
    """A file with no name, for a child to write what its parent reads."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("ckpt-migrate-facts")
    fd, name = tempfile.mkstemp(prefix="ckpt-migrate-facts-")
    os.unlink(name)
    return fd


def resident() -> int:
    """This process's resident memory in bytes (what a fork copies the page tables of); 0
    where the system does not say."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
