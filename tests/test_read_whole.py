"""A whole tensor read by HDF5 straight into an array (``h5.io.read_whole``, issue 33) is what
``read_slab`` (h5py's ``Dataset``) gives: the same type, shape and bytes, on files the real
library wrote, on every shipped fixture and on types the project does not write itself, and
the same one-line refusal of a damaged chunk."""

from __future__ import annotations

import struct
from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import pytest
from conftest import shipped_checkpoints
from test_chunks import _index_entry, _patch

import ckpt_migrate as cm
from ckpt_migrate.errors import CkptError, CorruptCheckpointError
from ckpt_migrate.format.compare import dataset_sha256, tensor_sha256
from ckpt_migrate.format.h5.io import H5Handle, read_slab, read_whole
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import H5Data, TensorLeaf, iter_leaves


def _datasets(f: h5py.File) -> list[str]:
    names: list[str] = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    return names


def _same(f: h5py.File, path: Path, name: str) -> bool:
    """Whether ``read_whole`` gives ``read_slab``'s array, or declines (None)."""
    fast = read_whole(h5py.h5o.open(f.id, name.encode()), path, name)
    if fast is None:
        return False
    slow = np.asarray(read_slab(f[name], ()))
    assert fast.dtype == slow.dtype and fast.shape == slow.shape, name
    assert fast.tobytes() == slow.tobytes(), name
    return True


def test_every_shipped_dataset_reads_as_through_h5py(tmp_path):
    taken = 0
    for path in shipped_checkpoints(tmp_path):
        with h5py.File(path, "r", locking=False) as f:
            taken += sum(_same(f, path, name) for name in _datasets(f))
    assert taken > 500


def test_types_the_project_does_not_write(tmp_path):
    """Big-endian, bool, complex, enum and half floats, scalars, chunked with LZ4 and deflate:
    read directly; strings, compounds, no elements and the null dataspace are left to h5py."""
    path = tmp_path / "types.h5"
    rng = np.random.default_rng(0)
    enum = h5py.enum_dtype({"a": 0, "b": 1}, basetype="i1")
    with h5py.File(path, "w") as f:
        f["be"] = rng.random((3, 5)).astype(">f4")
        f["bool"] = rng.random(7) > 0.5
        f["complex"] = rng.random(4) + 1j * rng.random(4)
        f.create_dataset("enum", data=np.array([0, 1, 1], "i1"), dtype=enum)
        f["half"] = rng.random(9).astype(np.float16)
        f["scalar"] = np.int64(-3)
        f.create_dataset(
            "lz4", data=rng.random((64, 8), np.float32), chunks=(16, 8), **hdf5plugin.LZ4()
        )
        f.create_dataset(
            "deflate", data=np.arange(100, dtype="<u2"), chunks=(30,), compression="gzip"
        )
        f["text"] = "hello"
        f["pair"] = np.array([(1, 2.0)], dtype=[("i", "i4"), ("x", "f8")])
        f["none"] = np.zeros((0, 4), np.float32)
        f["empty"] = h5py.Empty("f4")
    with h5py.File(path, "r") as f:
        direct = {name for name in _datasets(f) if _same(f, path, name)}
    assert direct == {"be", "bool", "complex", "enum", "half", "scalar", "lz4", "deflate"}


def test_a_damaged_chunk_is_the_same_refusal(tmp_path):
    src = tmp_path / "c.mdl"
    rng = np.random.default_rng(0)
    cm.save({"model": {"w": rng.random((64, 64), dtype=np.float32)}}, src, "2.0")
    at, info = _index_entry(src, "model.w", 0)
    _patch(src, at, struct.pack("<I", info.size // 2))
    handle = H5Handle(src)
    with pytest.raises(CorruptCheckpointError, match=r"'model.w', chunk \(0, 0\): its LZ4") as e:
        handle.read_dataset("model.w")
    handle.close()
    with h5py.File(src, "r", locking=False) as f, pytest.raises(CorruptCheckpointError) as slow:
        read_slab(f["model.w"], ())
    assert str(e.value) == str(slow.value)


def test_a_tensors_hash_is_its_slabs_hash(tmp_path):
    """``verify``'s hash of a tensor read whole is the hash of its slabs (``dataset_sha256``),
    for every tensor of every shipped checkpoint, the real library's 2.6-2.9 files among them."""
    hashed = 0
    for path in shipped_checkpoints(tmp_path):
        try:
            ckpt = read_checkpoint(path)
        except CkptError:
            continue  # (fixtures of files the reader refuses)
        with ckpt:
            for ref in iter_leaves(ckpt.root):
                leaf = ref.leaf
                if isinstance(leaf, TensorLeaf) and isinstance(leaf.data, H5Data):
                    slabs = dataset_sha256(leaf.data.handle.dataset(leaf.data.name), leaf.dtype)
                    assert tensor_sha256(leaf) == slabs, (path, ref.name)
                    hashed += 1
    assert hashed > 500


def test_what_h5py_cannot_describe_or_is_too_large_is_left_to_read_slab(tmp_path):
    """A type h5py has no numpy type for (its error) and a tensor over ``max_bytes``: None,
    so that ``read_slab`` reads it, or names what is wrong, as before."""

    class Undescribed:
        shape = (2,)

        @property
        def dtype(self):
            raise TypeError("no conversion path for the dataset's type")

    assert read_whole(Undescribed(), tmp_path / "x.mdl", "x") is None
    path = tmp_path / "big.h5"
    with h5py.File(path, "w") as f:
        f["w"] = np.ones((4, 4), np.float32)
    with h5py.File(path, "r") as f:
        dsid = h5py.h5o.open(f.id, b"w")
        assert read_whole(dsid, path, "w", max_bytes=63) is None
        assert read_whole(dsid, path, "w", max_bytes=64).sum() == 16
