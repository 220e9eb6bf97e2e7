"""Worker processes forked from this one (the preflight's walk, the header scan): a fork that a
Ctrl-C cannot catch half made, and the anonymous files a parent and its children share.

A terminal's Ctrl-C reaches the whole process group. One that arrived in a child while
``os.fork`` was still running the interpreter's after-fork hooks there (``random`` reseeds
itself) was printed as "Exception ignored in: ... Traceback", beside the command's one line
``interrupted`` (``tests/test_interrupt.py``, once in CI under load). So SIGINT is held across
the fork, in both processes, until each calls :func:`release`: the child inside the ``try``
that ends it, the parent once it has recorded the child (a Ctrl-C raised before that would
leave a child that nobody ends).
"""

from __future__ import annotations

import os
import signal
import tempfile

_HELD = {signal.SIGINT}
_before: set[signal.Signals] = set()  # (the mask ``release`` restores)


def fork() -> int:
    """``os.fork()`` with SIGINT held, in both processes, until :func:`release`."""
    global _before
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        pid = os.fork()
    except BaseException:  # (no child made)
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        raise
    _before = before
    return pid


def release() -> None:
    """After :func:`fork`: SIGINT as it was before it (one held meanwhile is raised now, as
    ``KeyboardInterrupt``)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, _before)


def anonymous_file() -> int:
    """A file with no name, for a child to write what its parent reads."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("ckpt-migrate-facts")
    fd, name = tempfile.mkstemp(prefix="ckpt-migrate-facts-")
    os.unlink(name)
    return fd
