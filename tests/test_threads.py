"""HDF5, not built thread-safe, is entered by one thread at a time while an upgrade runs in one
thread and h5py is used in another: a Dask worker runs its task in a thread beside its event
loop, which frees objects and runs other code (``test_s3_corpus``'s cluster case refused the
shipped 1.9 checkpoint now and then, "cannot copy the chunks of dataset ... (no VOL object wrap
context?)": h5py before 3.16 let ``read_direct_chunk``/``write_direct_chunk`` run in HDF5 beside
another thread's call)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import h5py
import numpy as np
from conftest import FIXTURES

from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade

EXAMPLE = FIXTURES / "example" / "checkpoint_100.mdl"  # the shipped 1.9 example


def _contents(path: Path) -> dict[str, tuple]:
    """Every object's attributes and data, but for the provenance record (it has the time)."""
    found: dict[str, tuple] = {}

    def visit(name: str, obj) -> None:
        data = obj[()].tobytes() if isinstance(obj, h5py.Dataset) else None
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


def test_an_upgrade_beside_a_thread_using_h5py(tmp_path):
    """The shipped 1.9 example is rewritten, its chunks copied as stored (``_copy_chunks``)."""
    source = tmp_path / "src" / EXAMPLE.name
    source.parent.mkdir()
    shutil.copyfile(EXAMPLE, source)
    inputs = {"drop_dataloader_state": True}  # (as test_s3_corpus: the state is elsewhere)

    def run(n: int):
        out = tmp_path / f"out{n}"
        opts = UpgradeOptions(target="2.10", output_dir=out, inputs=inputs)
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
