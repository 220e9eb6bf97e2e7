"""One task per checkpoint on a dask.distributed cluster: an existing one (``--scheduler
tcp://HOST:PORT``) or a LocalCluster of N worker processes started here (``--workers N``).

A task upgrades one checkpoint on whichever worker runs it and returns its entry; a task that
raises, or whose workers keep dying (Dask's ``KilledWorker`` after its allowed failures),
becomes a failed entry of its own and the others go on. A task killed mid-write leaves no
output: the local engine publishes by rename, the object store by CompleteMultipartUpload, and
the task's retry (or the next run) removes what was left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

from ckpt_migrate.engine.upgrade import UpgradeResult
from ckpt_migrate.errors import EXIT_IO, CkptError, require
from ckpt_migrate.interrupt import STOP_SIGNALS, Interrupt
from ckpt_migrate.model_dir.upgrade_dir import DirEntry, DirOptions, upgrade_one

Done = Callable[[int, int], None]  # (files done, files in all)


@contextlib.contextmanager
def connect(scheduler: str | None, workers: int | None) -> Iterator[Any]:
    """A Dask client of the named scheduler, or of a LocalCluster with ``workers`` processes."""
    distributed = require("distributed", "distributed")
    if scheduler is not None:
        try:
            client = distributed.Client(scheduler, timeout="20s")
        except OSError as exc:
            raise CkptError(
                scheduler, f"no Dask scheduler answers ({exc})", "check --scheduler tcp://HOST:PORT"
            ) from None
        with client:
            yield client
        return
    with contextlib.ExitStack() as stack:
        with _interrupts_held():  # (see there)
            cluster = stack.enter_context(
                distributed.LocalCluster(
                    n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
                )
            )
            client = stack.enter_context(distributed.Client(cluster))
            pids = client.run(_note_interrupts)
        try:
            yield client
        except BaseException:  # (Ctrl-C, SIGTERM, SIGHUP: the run ends, its tasks with it)
            for pid in pids.values():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGINT)
            raise


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """``interrupt.STOP_SIGNALS`` noted, and raised again once the block ends. A cluster interrupted
    while it started was left half made, and Dask's own attempt to close it as the process
    exited printed a traceback ("AssertionError: Status.init") after ``interrupted``: started
    whole (a second or two), it is closed as any other.

    SIGINT is blocked meanwhile, not only noted: a terminal's Ctrl-C reaches the whole process
    group, and a worker process still importing Dask printed a ``KeyboardInterrupt`` traceback
    each. The processes started here (and the threads that may start more) inherit the blocked
    SIGINT; ``_note_interrupts`` unblocks it in each worker once its handler is set, and a
    Ctrl-C pressed meanwhile reaches it then."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    held = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    held = {s: handler for s, handler in held.items() if callable(handler)}
    for signum in held:
        signal.signal(signum, lambda signum, frame: noted.append(signum))
    # (multiprocessing unblocks SIGINT as it starts its resource tracker: started first)
    resource_tracker.ensure_running()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # (a pending SIGINT is noted here)
        for signum, handler in held.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(noted):
            signal.raise_signal(signum)


def _note_interrupts() -> int:
    """In a worker process of a LocalCluster started here: a SIGINT (a terminal's Ctrl-C
    reaches the whole process group, or ``connect`` sends one when the run ends early) notes
    the interrupt, which the task then meets (``_LocalTask``). Without it the worker's
    event loop stopped with a traceback and its task went on: outputs were published seconds
    after the command said ``interrupted``. Returns the worker's pid."""
    signal.signal(signal.SIGINT, lambda signum, frame: Interrupt.press())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # (see ``_interrupts_held``)
    return os.getpid()


class Stop:
    """Whether the run that submitted a task has stopped, asked in the task: its worker noted
    an interrupt (a LocalCluster started here: ``_note_interrupts``), or the run set its event
    (any cluster: ``run``; asked of the scheduler at most once a second). A task on a cluster
    of someone else's went on after the command's Ctrl-C and published its output. Called
    as a progress hook too. Picklable: the event goes by name."""

    def __init__(self, name: str | None = None) -> None:
        self.name, self.asked = name, 0.0

    def check(self) -> None:
        """Raise KeyboardInterrupt if the run has stopped."""
        Interrupt.check()
        if self.name is None or time.monotonic() - self.asked < 1:
            return
        self.asked = time.monotonic()
        if require("distributed", "distributed").Event(self.name).is_set():
            raise KeyboardInterrupt

    def __call__(self, phase: str, done: int, total: int) -> None:
        self.check()


def run(
    client: Any,
    task: Callable[[Any, Stop], DirEntry],
    items: list[Any],
    failed: Callable[[Any, str], DirEntry],
    on_done: Done | None = None,
) -> Iterator[DirEntry]:
    """``task(item, stop)`` for every item on the cluster; entries as they finish. A run that
    ends before its last (an interrupt, an error) tells its tasks to stop (``Stop``)."""
    distributed = require("distributed", "distributed")
    stop = Stop(f"ckpt-migrate-stop-{uuid.uuid4().hex}")
    futures = {client.submit(task, item, stop, pure=False): item for item in items}
    finished = False
    try:
        for done, future in enumerate(distributed.as_completed(futures), 1):
            item = futures[future]
            try:
                entry = future.result()
            except Exception as exc:
                entry = failed(item, f"{type(exc).__name__}: {exc}")
            if on_done is not None:
                on_done(done, len(items))
            yield entry
        finished = True
    finally:
        if not finished:  # (each on its own: a scheduler gone takes neither, and runs nothing)
            with contextlib.suppress(Exception):
                distributed.Event(stop.name, client=client).set()
            with contextlib.suppress(Exception):
                client.cancel(list(futures))


def local_runner(client: Any, on_done: Done | None = None):
    """A ``DirOptions.runner`` that upgrades a local or NFS directory's checkpoints on the
    cluster (every worker must see the same paths)."""

    def runner(paths: list[Path], opts: DirOptions) -> Iterator[DirEntry]:
        plain = replace(opts, runner=None)
        yield from run(
            client,
            _LocalTask(plain),
            paths,
            lambda path, why: failed_entry(Path(path), why),
            on_done,
        )

    return runner


class _LocalTask:
    """Picklable: ``upgrade_one`` with the options. A stopped run (``Stop``) stops it at its
    next step (each reports its progress often), as a Ctrl-C stops ``upgrade``: its temporary
    removed, nothing published."""

    def __init__(self, opts: DirOptions) -> None:
        self.opts = opts

    def __call__(self, path: Path, stop: Stop) -> DirEntry:
        try:
            return upgrade_one(path, self.opts, progress=stop)
        except KeyboardInterrupt:
            return failed_entry(path, "interrupted")


def failed_entry(source: Path, why: str) -> DirEntry:
    res = UpgradeResult(
        source, "failed", error=f"{source}: the task failed ({why})", exit_code=EXIT_IO
    )
    return DirEntry(source, "checkpoint", "failed", result=res)
