"""A dataset's storage read from its object header and chunk index (``h5.storedheader``, issue
33) is what HDF5 says of it: type, shape, chunk shape, filter pipeline, every chunk index entry
in HDF5's own order, a contiguous dataset's place and size. Checked on files this tool did not
write (the real 2.10 library's, Model Zoo's converter outputs, a 1.9 file laid out as the 1.9
library wrote it) and on the layouts it leaves to HDF5."""

from __future__ import annotations

import lzma
import os
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import FIXTURES, REAL

from ckpt_migrate.format.h5 import linktable
from ckpt_migrate.format.h5.headers import file_reader
from ckpt_migrate.format.h5.storagescan import Undecided
from ckpt_migrate.format.h5.storedheader import StoredLayout, read_layout

CONVERTED = FIXTURES / "modelzoo-2.10-converted"


def _layouts(path: Path) -> dict[str, StoredLayout]:
    """Every dataset of the root's, read from its header (a group is not a dataset)."""
    with h5py.File(path, "r") as f:
        links = linktable.of_root(f, path)
        assert links is not None
        links = {name: at for name, at in links.items() if isinstance(f[name], h5py.Dataset)}
    fd = os.open(path, os.O_RDONLY)
    try:
        read = file_reader(fd, os.fstat(fd).st_size, 0, window=64 << 10)
        types: dict = {}
        return {name: read_layout(read, at, types) for name, at in links.items()}
    finally:
        os.close(fd)


def _as_hdf5_says(path: Path) -> None:
    found = _layouts(path)
    with h5py.File(path, "r") as f:
        for name, got in found.items():
            ds = f[name]
            dcpl = ds.id.get_create_plist()
            assert got.dtype == ds.dtype, name
            assert got.shape == ds.shape, name
            assert got.chunks == ds.chunks, name
            pipeline = tuple(dcpl.get_filter(i)[:3] for i in range(dcpl.get_nfilters()))
            assert got.pipeline == pipeline, name
            assert got.compact == (dcpl.get_layout() == h5py.h5d.COMPACT), name
            if ds.chunks is not None:
                listed = _chunk_iter(ds)
                index = got.entries
                assert index is not None
                mine = [
                    (index.where(i), index.masks[i], index.offsets[i], index.sizes[i])
                    for i in range(len(index))
                ]
                assert mine == listed, name
            elif not got.compact:
                assert (got.at, got.size) == (ds.id.get_offset(), ds.id.get_storage_size()), name


def _chunk_iter(ds: h5py.Dataset) -> list[tuple]:
    listed: list[tuple] = []
    ds.id.chunk_iter(
        lambda c: listed.append((c.chunk_offset, c.filter_mask, c.byte_offset, c.size))
    )
    return listed


REAL_FILES = sorted(REAL.glob("*.mdl"))


@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: p.name)
def test_the_real_librarys_files(path):
    _as_hdf5_says(path)


@pytest.mark.parametrize("packed", sorted(CONVERTED.glob("*.mdl.xz")), ids=lambda p: p.name)
def test_model_zoos_converter_outputs(packed, tmp_path):
    path = tmp_path / packed.name.removesuffix(".xz")
    path.write_bytes(lzma.decompress(packed.read_bytes()))
    _as_hdf5_says(path)


def test_a_file_laid_out_as_the_19_library_wrote_it(real_layout_19):
    _as_hdf5_says(real_layout_19)


def test_every_shape_of_layout_h5py_writes(tmp_path):
    """Chunk B-trees of several levels (thousands of chunks, HDF5's order kept), partial edge
    chunks, no filter, gzip with shuffle, a contiguous dataset, a scalar, one with nothing
    stored, a compact one, a null dataspace, a bool and big-endian numbers."""
    path = tmp_path / "shapes.mdl"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "many", data=np.arange(3000 * 4, dtype="<f4").reshape(3000, 4), chunks=(1, 4)
        )
        f.create_dataset("edges", data=np.ones((5, 7), "<i2"), chunks=(2, 3))
        f.create_dataset(
            "gzip", data=np.ones((64, 8), "<f8"), chunks=(16, 8), compression="gzip", shuffle=True
        )
        f.create_dataset("plain", data=np.arange(10, dtype=">i8"))
        f.create_dataset("scalar", data=np.float32(3))
        f.create_dataset("unwritten", shape=(4,), dtype="<u1")
        f.create_dataset("flags", data=np.array([True, False]))
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        space = h5py.h5s.create_simple((3,))
        h5py.h5d.create(f.id, b"compact", h5py.h5t.NATIVE_INT32, space, dcpl=dcpl)
        f.create_dataset("null", data=h5py.Empty("f4"))
    _as_hdf5_says(path)
    found = _layouts(path)
    assert found["null"].shape is None
    assert found["compact"].compact
    assert found["unwritten"].at is None
    entries = found["many"].entries
    assert entries is not None and len(entries) == 3000


def test_what_it_does_not_read_is_left_to_hdf5(tmp_path):
    """External storage and a virtual dataset are not answered (``Undecided``), nor is a
    group; a dataset beside them is."""
    path = tmp_path / "others.mdl"
    (tmp_path / "raw.bin").write_bytes(bytes(16))
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "external", shape=(4,), dtype="<f4", external=[(str(tmp_path / "raw.bin"), 0, 16)]
        )
        layout = h5py.VirtualLayout(shape=(4,), dtype="<f4")
        layout[:] = h5py.VirtualSource(str(tmp_path / "raw.h5"), "x", shape=(4,))
        f.create_virtual_dataset("virtual", layout)
        f.create_group("group")
        f.create_dataset("beside", data=np.ones((8, 2), "<f4"), chunks=(1, 2))
    with h5py.File(path, "r") as f:
        links = linktable.of_root(f, path)
    assert links is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        read = file_reader(fd, os.fstat(fd).st_size, 0)
        for name in ("external", "virtual", "group"):
            with pytest.raises(Undecided):
                read_layout(read, links[name], {})
        found = read_layout(read, links["beside"], {})
    finally:
        os.close(fd)
    assert found.entries is not None and len(found.entries) == 8


def _v1_header(*messages: tuple[int, bytes]) -> bytes:
    """A version-1 object header at byte 0 holding ``messages`` (type, body), each body
    padded to 8 bytes, as HDF5 lays them out."""
    body = b"".join(
        struct.pack("<HHB3x", kind, len(m) + (-len(m) % 8), 0) + m + bytes(-len(m) % 8)
        for kind, m in messages
    )
    return struct.pack("<BxHII4x", 1, len(messages), 1, len(body)) + body


def test_a_chunked_scalar_is_left_to_hdf5():
    """A header no writer makes (HDF5 refuses to chunk a scalar): a scalar dataspace with a
    chunked layout of dimensionality 1. Not answered, rather than a chunk index of no
    dimensions for the comparison to trip over."""
    f4 = h5py.h5t.py_create(np.dtype("<f4")).encode()[2:]
    scalar = struct.pack("<BBBx4x", 1, 0, 0)
    chunked = struct.pack("<BBBQI", 3, 2, 1, (1 << 64) - 1, 4)
    data = _v1_header((0x01, scalar), (0x03, f4), (0x08, chunked))
    with pytest.raises(Undecided):
        read_layout(lambda at, n: data[at : at + n], 0, {})
    contiguous = struct.pack("<BBQQ", 3, 1, (1 << 64) - 1, 0)
    read = _v1_header((0x01, scalar), (0x03, f4), (0x08, contiguous))
    found = read_layout(lambda at, n: read[at : at + n], 0, {})
    assert (found.shape, found.dtype, found.at, found.chunks) == ((), np.dtype("<f4"), None, None)
