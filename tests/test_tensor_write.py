"""``h5.tensor``: the datasets it makes through HDF5's low-level calls are the ones h5py's
``create_dataset`` makes, byte for byte (the outputs of every release hop stay bit-identical)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from ckpt_migrate.format import dtypes
from ckpt_migrate.format.h5 import tensor
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import TensorLeaf, iter_leaves

# A step count of each storage type the writers use (bf16 as its uint16 and int16 patterns,
# 1.x's and 2.x's), a boolean, and a name in a group the write makes
SCALARS = {
    "optimizer.state.0.step": np.asarray(np.int64(3000)),
    "lr": np.asarray(np.float32(1e-4)),
    "ema": np.asarray(np.float64(0.999)),
    "half": np.asarray(np.float16(0.5)),
    "bf16_2x": np.asarray(np.uint16(0x3F80)),
    "bf16_1x": np.asarray(np.int16(0x3F80)),
    "flag": np.asarray(np.bool_(True)),
    "group/inner/step": np.asarray(np.int32(7)),
}


def _written(path: Path, make) -> bytes:
    with h5py.File(path, "w") as f:
        for name, value in SCALARS.items():
            make(f, name, value)
    return path.read_bytes()


def test_a_scalar_is_the_file_create_dataset_makes(tmp_path):
    mine = _written(tmp_path / "mine.h5", tensor._scalar)
    theirs = _written(tmp_path / "h5py.h5", lambda f, n, v: f.create_dataset(n, data=v))
    assert mine == theirs
    with h5py.File(tmp_path / "mine.h5") as f:
        for name, value in SCALARS.items():
            assert f[name].shape == () and f[name].dtype == value.dtype, name
            assert f[name][()] == value[()], name


def test_the_legacy_writers_step_counts_are_copied_as_create_dataset_copied_them(
    tmp_path, real_layout_19
):
    """Every 0-d tensor of a checkpoint laid out as the 1.9 library wrote it (torch 1.13's
    Adam ``step`` scalars, packed among the small datasets), copied by ``place_tensor``: the
    file h5py's ``create_dataset`` of its value made before."""
    with read_checkpoint(real_layout_19) as ckpt:
        steps = [
            (r.name, r.leaf)
            for r in iter_leaves(ckpt.root)
            if isinstance(r.leaf, TensorLeaf) and r.leaf.shape == ()
        ]
        assert len(steps) > 5
        with h5py.File(tmp_path / "mine.h5", "w") as mine:
            for name, leaf in steps:
                tensor.place_tensor(mine, name, leaf)
        with h5py.File(tmp_path / "h5py.h5", "w") as theirs:
            for name, leaf in steps:
                storage = dtypes.by_name(leaf.dtype).storage
                value = ckpt.handle.dataset(leaf.data.name)[()]
                theirs.create_dataset(name, data=tensor._as_storage(value, storage))
    assert (tmp_path / "mine.h5").read_bytes() == (tmp_path / "h5py.h5").read_bytes()
