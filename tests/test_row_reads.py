"""A tensor a script stored in tiny chunks (``chunks=(1, 1)``) is read in pieces of at most
``rowreads.MAX_CHUNKS`` chunks: HDF5 keeps about 4 KiB for every chunk one read touches, so one
read of 262,144 such chunks (a 15 MB file) took 1 GiB in every command (``format/h5/rowreads.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from ckpt_migrate.format.h5 import rowreads
from ckpt_migrate.format.h5.io import iter_slabs, read_slab, read_whole

# The process's own peak (VmHWM: ru_maxrss would count the forking test process's size too).
PEAK = """
import sys, h5py
from ckpt_migrate.format.h5.io import read_slab
def peak():
    line = next(x for x in open("/proc/self/status") if x.startswith("VmHWM:"))
    return int(line.split()[1])
with h5py.File(sys.argv[1], "r", locking=False) as f:
    before = peak()
    data = read_slab(f["w"], ())
    grew = peak() - before
print(grew // 1024, int(data[-1, -1]))
"""


def test_a_tensor_in_tens_of_thousands_of_chunks_is_read_in_bounded_memory(tmp_path):
    path = tmp_path / "tiny_chunks.mdl"
    data = np.arange(64 * 512, dtype=np.float32).reshape(64, 512)
    with h5py.File(path, "w") as f:
        f.create_dataset("w", data=data, chunks=(1, 1))  # 32,768 chunks of 4 bytes
    out = subprocess.run(
        [sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert int(out[1]) == 64 * 512 - 1
    assert int(out[0]) < 80, f"read_slab grew the process by {out[0]} MiB for 128 KiB of data"


@pytest.mark.parametrize(
    ("dtype", "shape", "chunks"),
    [
        ("<f4", (7, 5), (1, 2)),
        (">i2", (9, 3, 2), (2, 1, 1)),
        ("?", (11,), (1,)),
        ("<u8", (5, 4), (1, 4)),
        ("<f8", (4, 10), (1, 1)),
    ],
)
def test_reads_in_pieces_give_h5pys_values(tmp_path, monkeypatch, dtype, shape, chunks):
    monkeypatch.setattr(rowreads, "MAX_CHUNKS", 3)
    path = Path(tmp_path) / "x.h5"
    rng = np.random.default_rng(1)
    data = (rng.random(shape) * 1000).astype(dtype)
    with h5py.File(path, "w") as f:
        f.create_dataset("w", data=data, chunks=chunks)
    with h5py.File(path, "r") as f:
        ds = f["w"]
        assert rowreads.rows_per_read(ds.id) is not None
        whole = read_slab(ds, ())
        assert whole.dtype == ds.dtype and whole.tobytes() == ds[()].tobytes()
        got = read_whole(ds.id, path, "w")
        assert got is not None and got.tobytes() == ds[()].tobytes()
        for sl in [*iter_slabs(shape, 1 << 30), (slice(1, shape[0] - 1),), (slice(3, 3),)]:
            assert read_slab(ds, sl).tobytes() == ds[sl].tobytes()
