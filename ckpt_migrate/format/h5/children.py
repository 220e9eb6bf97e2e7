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

A fork copies the caller's page tables, and its child's exit tears them down: from a process
that holds gigabytes (a training job that loads a checkpoint) a fork costs more than a new
interpreter, which starts and imports h5py in about 0.13 s here whatever the caller's size, and
where the kernel does not overcommit memory the fork of a large process may fail outright.
From :data:`SPAWN_RESIDENT` on, or where a fork fails, :func:`spawn` starts the child as a new
interpreter instead (``posix_spawn``, which copies no page table), handing it its files by
number; it is waited for, killed and judged as a forked child is.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from ckpt_migrate.errors import CkptIOError, system_words
from ckpt_migrate.format.h5 import capi
from ckpt_migrate.format.h5.plugins import register_lz4
from ckpt_migrate.interrupt import STOP_SIGNALS

_HELD = set(STOP_SIGNALS)
# From this resident size a new interpreter walks a small file sooner than a forked child: about
# 0.13-0.15 s whatever the caller's size, against 0.18-0.20 s forked from 4 GiB and 0.32-0.38 s
# from 8 GiB, 0.15-0.17 s either way from 3 GiB (``benchmarks/bench_caller_size.py``).
SPAWN_RESIDENT = 4 << 30
# A spawned child's first words: the caller's import path, then ``_spawned``; whatever fails
# ends it with status 1 and no traceback, as a forked child's failure does.
_BOOT = """import os, sys
code = 1
try:
    sys.path[:] = __import__("json").loads(sys.argv[1])
    from ckpt_migrate.format.h5.children import _spawned
    _spawned(sys.argv[2:])
    code = 0
finally:
    os._exit(code)
"""


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

    def make() -> int:
        # h5py's lock held across the fork: no other thread of this process is inside HDF5
        # then, so the child inherits neither that lock taken nor HDF5 half way through a call
        # (a child forked while another thread read a file waited for the lock for ever, and
        # the walk's stall refused a sound file as damaged).
        with capi.LOCK:
            return os.fork()

    return _held(make)


def start(
    function: Callable[..., None], path: Path, args: Sequence[Any], fds: Sequence[int]
) -> int:
    """A child for ``function(path, *args, *fds)``: forked (0 in the child, which then runs it),
    or, from :data:`SPAWN_RESIDENT` on or where a fork fails, a new interpreter that runs it
    (:func:`spawn`). Its pid to the parent, with ``interrupt.STOP_SIGNALS`` held until
    :func:`release`. ``CkptIOError`` where neither can be made (no memory, no process left)."""
    if not spawns():
        with contextlib.suppress(OSError):  # (no memory to copy this process: spawned)
            return fork()
    try:
        return spawn(function, path, args, fds)
    except OSError as exc:
        raise CkptIOError(
            path,
            f"no process could be started to read its metadata ({system_words(exc)})",
            "free memory, or raise the limit on processes (ulimit -u), and run it again",
        ) from None


def spawns() -> bool:
    """Whether this process is large enough (:data:`SPAWN_RESIDENT`) for :func:`start` to
    spawn its children."""
    return resident() >= SPAWN_RESIDENT


def spawn(
    function: Callable[..., None], path: Path, args: Sequence[Any], fds: Sequence[int]
) -> int:
    """``function(path, *args, *fds)`` in a new interpreter (this one's executable, import path
    and environment), ``fds`` handed to it under other numbers (-1 stays -1); its pid, to wait
    for and end as a forked child's. As :func:`fork`, with ``interrupt.STOP_SIGNALS`` held
    until :func:`release` (the child holds them until it can end quietly on one)."""
    base = max(2, *fds) + 1
    actions = [(os.POSIX_SPAWN_DUP2, fd, base + i) for i, fd in enumerate(fds) if fd >= 0]
    numbers = [base + i if fd >= 0 else -1 for i, fd in enumerate(fds)]
    where = [function.__module__, function.__qualname__]
    argv = [sys.executable, "-c", _BOOT, json.dumps(sys.path), json.dumps(where)]
    argv += [os.fsencode(path), json.dumps([*args, *numbers])]
    return _held(
        lambda: os.posix_spawn(
            sys.executable, argv, os.environ, file_actions=actions, setsigmask=_HELD
        )
    )


def _spawned(argv: list[str]) -> None:
    """A spawned child's work (``_BOOT``): a stop signal ends it quietly, as it ends a forked
    one (one held since the spawn, here)."""
    where, path, args = argv
    for signum in _HELD:
        signal.signal(signum, lambda signum, frame: os._exit(1))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)
    faulthandler.disable()  # (``PYTHONFAULTHANDLER``: a crash here is the parent's to report)
    module, name = json.loads(where)
    function = getattr(importlib.import_module(module), name)
    register_lz4()  # (as its parent has it: registered, and no plugin from the environment)
    function(Path(path), *json.loads(args))


def end_child(work: Callable[[], None], close: Sequence[int] = ()) -> NoReturn:
    """In a forked child: :func:`release`, close the parent's ``close`` (-1: none), then
    ``work``; exit 0 after it, 1 on any error or stop signal (the parent's own reading names a
    problem), never returning into the caller's code."""
    code = 0
    try:
        release()  # (a Ctrl-C ends it here, quietly)
        faulthandler.disable()  # a crash here is the finding, which the parent reports
        for fd in close:
            if fd >= 0:
                os.close(fd)
        work()
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _held(make: Callable[[], int]) -> int:
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
        pid = make()
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
