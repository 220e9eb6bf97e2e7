"""The engine and the library used from several threads of one process, as a Dask worker runs
its task in a thread beside its event loop, or a program loads checkpoints in a thread pool."""

from __future__ import annotations

import shutil
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import FIXTURES, REAL, real_2x_files
from digest import digest

import ckpt_migrate
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade

EXAMPLE = FIXTURES / "example" / "checkpoint_100.mdl"  # the shipped 1.9 example


def _contents(path: Path) -> dict[str, tuple]:
    """Every object's attributes and data, but for the provenance record (it has the time)."""
    found: dict[str, tuple] = {}

    def visit(name: str, obj) -> None:
        data = obj[()] if isinstance(obj, h5py.Dataset) else None
        data = data.tobytes() if isinstance(data, np.ndarray | np.generic) else repr(data)
        found[name] = (sorted((k, repr(v)) for k, v in obj.attrs.items()), data)

    with h5py.File(path, "r") as f:
        visit("/", f)
        f.visititems(visit)
    del found["/"][0][[k for k, _ in found["/"][0]].index("__ckpt_migrate__")]
    return found


class _Busy(threading.Thread):
    """Makes, attributes and drops small datasets until told to stop; keeps what it raised."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.stop, self.errors, self.rounds = path, threading.Event(), [], 0

    def run(self) -> None:
        try:
            with h5py.File(self.path, "w") as f:
                while not self.stop.is_set():
                    ds = f.create_dataset(f"d{self.rounds}", data=np.arange(4))
                    ds.attrs["n"] = self.rounds
                    del ds
                    self.rounds += 1
        except Exception as exc:  # the failure this test looks for, reported by the test
            self.errors.append(repr(exc))


@pytest.mark.parametrize(
    ("source", "target"),
    [(EXAMPLE, "2.10"), (REAL / "basic.mdl", "2.0"), (REAL / "dtypes.mdl", "2.3")],
    ids=["shipped-1.9-up", "real-2.10-basic-down", "real-2.10-dtypes-down"],
)
def test_an_upgrade_beside_a_thread_using_h5py(tmp_path, source, target):
    """HDF5, not built thread-safe, is entered by one thread at a time. ``test_s3_corpus``'s
    cluster case refused the shipped 1.9 checkpoint now and then, "cannot copy the chunks of
    dataset ... (no VOL object wrap context?)": h5py before 3.16 let ``read_direct_chunk`` and
    ``write_direct_chunk`` run in HDF5 beside another thread's call. Each file is rewritten,
    its chunks copied as stored (``_copy_chunks``): the shipped 1.9 example upgraded, files the
    real 2.10 library wrote taken down to 2.0."""
    original = source
    source = tmp_path / "src" / original.name
    source.parent.mkdir()
    shutil.copyfile(original, source)
    inputs = {"drop_dataloader_state": True}  # (as test_s3_corpus: the state is elsewhere)

    def run(n: int):
        out = tmp_path / f"out{n}"
        opts = UpgradeOptions(target=target, output_dir=out, inputs=inputs)
        res = upgrade(source, opts)
        assert res.status == "upgraded", res.error
        assert res.strategy == "rewrite" and res.verified
        return _contents(out / source.name)

    alone = run(0)
    busy = _Busy(tmp_path / "other.h5")
    busy.start()
    try:
        beside = [run(n) for n in range(1, 4)]
    finally:
        busy.stop.set()
        busy.join()
    assert busy.errors == []
    assert busy.rounds > 0
    assert beside == [alone] * 3


def test_checkpoints_loaded_from_threads_at_once_read_as_loaded_alone(tmp_path):
    """``ckpt_migrate.load`` from four threads at once: each read forks the children that walk
    the file first, and a child forked by one thread kept copies of the pipes another thread's
    children were writing, so a walk waited for another's children to end, and its stall
    refused sound files as damaged ("HDF5 made no progress reading the file's metadata for
    10 s"). The files the real 2.6-2.10 libraries wrote."""
    files = [p for p in sorted(REAL.glob("*.mdl")) if "collision" not in p.name]
    files += real_2x_files(tmp_path)
    alone = {p: digest(ckpt_migrate.load(p)) for p in files}

    def read_all(_: int) -> list[bool]:
        return [digest(ckpt_migrate.load(p)) == alone[p] for p in files]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(read_all, range(4)))
    assert results == [[True] * len(files)] * 4


def test_what_is_kept_of_each_file_is_kept_from_threads_at_once():
    """What is learnt of a file is kept for the next read, the oldest of a few let go first
    (``overlaps._keep``). Two threads letting go of the same oldest one at once raised a
    ``KeyError`` in one of them (threads switching every microsecond, as a busy machine may)."""
    from ckpt_migrate.format.h5 import overlaps

    errors: list[str] = []

    def keep(thread: int) -> None:
        try:
            for i in range(30_000):
                overlaps._keep((thread, i), np.empty(0, np.uint64))
        except Exception as exc:  # the failure this test looks for, reported by the test
            errors.append(repr(exc))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=keep, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
        overlaps._SHARED.clear()
    assert errors == []
