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
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ckpt_migrate.engine.upgrade import UpgradeResult
from ckpt_migrate.errors import EXIT_IO, CkptError, require
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
    with (
        distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


def run(
    client: Any,
    task: Callable[[Any], DirEntry],
    items: list[Any],
    failed: Callable[[Any, str], DirEntry],
    on_done: Done | None = None,
) -> Iterator[DirEntry]:
    """``task(item)`` for every item on the cluster; entries as they finish."""
    distributed = require("distributed", "distributed")
    futures = {client.submit(task, item, pure=False): item for item in items}
    for done, future in enumerate(distributed.as_completed(futures), 1):
        item = futures[future]
        try:
            entry = future.result()
        except Exception as exc:
            entry = failed(item, f"{type(exc).__name__}: {exc}")
        if on_done is not None:
            on_done(done, len(items))
        yield entry


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
    """Picklable: ``upgrade_one`` with the options."""

    def __init__(self, opts: DirOptions) -> None:
        self.opts = opts

    def __call__(self, path: Path) -> DirEntry:
        return upgrade_one(path, self.opts)


def failed_entry(source: Path, why: str) -> DirEntry:
    res = UpgradeResult(
        source, "failed", error=f"{source}: the task failed ({why})", exit_code=EXIT_IO
    )
    return DirEntry(source, "checkpoint", "failed", result=res)
