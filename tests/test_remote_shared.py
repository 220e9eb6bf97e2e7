"""Which bytes of an object-store upgrade the store copies from the source (remote/shared.py),
on local files: a sparse mirror of the source (its tensor data ranges left as holes, as
``remote.upgrade`` lays it from ranged GETs) upgraded by the engine into a sparse staging file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import pytest

from ckpt_migrate.engine.splitcopy import MIN_RANGE, complement
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.errors import VerificationError
from ckpt_migrate.remote.shared import layout, stored_data
from ckpt_migrate.remote.upgrade import _data_ranges


def mirror_of(src: Path, dst: Path) -> list[tuple[int, int]]:
    """``dst``: ``src`` with its tensor data ranges left as holes; returns them."""
    size = src.stat().st_size
    with open(src, "rb") as f:
        holes = _data_ranges(f, str(src), MIN_RANGE)
    with open(src, "rb") as f, open(dst, "wb") as out:
        out.truncate(size)
        for a, b in complement(holes, size):
            f.seek(a)
            out.seek(a)
            out.write(f.read(b - a))
    return holes


def test_the_real_writers_layout_is_shared_and_its_small_data_uploaded(real_layout_19, tmp_path):
    """The 1.9 writer's file: HDF5 put the ``step`` scalars' small-data block right before an
    Adam moment's chunks. The scalars are uploaded, every hole is copied (it used to be one
    range across both datasets, refused as 'not the source's bytes')."""
    src = real_layout_19
    mirror = tmp_path / "mirror" / src.name
    mirror.parent.mkdir()
    holes = mirror_of(src, mirror)
    with open(src, "rb") as f:
        small = [s for d in stored_data(f, "src").values() for s in d.spans]
    edges = {a for a, _ in holes} | {b for _, b in holes}
    outside = [s for s in small if not any(a <= s[0] and s[1] <= b for a, b in holes)]
    assert any(s[0] in edges or s[1] in edges for s in outside)  # what the old check refused
    opts = UpgradeOptions(
        target="2.10",
        output_dir=tmp_path / "staged",
        copy_method="sparse",
        inputs={"drop_dataloader_state": True},
    )
    res = upgrade(mirror, opts)
    assert res.status == "upgraded" and res.strategy == "copy-patch", res.error
    size = src.stat().st_size
    staged = tmp_path / "staged" / src.name
    found = layout(staged, mirror, holes, size)
    tensors = sum(b - a for a, b in holes)
    # the small datasets (the scalars, chunks of zeros, 32 KiB weights) go with the metadata
    assert 0 < found.own_data <= size - tensors
    assert sum(b - a for a, b in found.shared) >= tensors
    # the object: the staged file with the shared ranges from the source, equals a local upgrade
    local = upgrade(
        src,
        UpgradeOptions(
            target="2.10", output_dir=tmp_path / "local", inputs={"drop_dataloader_state": True}
        ),
    )
    obj = bytearray(staged.read_bytes())
    source = src.read_bytes()
    for a, b in found.shared:
        obj[a:b] = source[a:b]
    assert bytes(obj[:size]) == local.output.read_bytes()[:size]


@pytest.fixture
def lz4_file(tmp_path) -> Path:
    src = tmp_path / "src.h5"
    with h5py.File(src, "w") as f:
        data = np.random.default_rng(0).standard_normal((256, 256)).astype("<f4")
        f.create_dataset("a", data=data, **hdf5plugin.LZ4())
    return src


def test_data_copied_from_a_hole_is_refused(lz4_file, tmp_path):
    """A dataset the edit copied chunk by chunk from a hole holds zeros, not the tensor."""
    mirror = tmp_path / "mirror.h5"
    holes = mirror_of(lz4_file, mirror)
    assert holes
    staged = tmp_path / "staged.h5"
    shutil.copyfile(mirror, staged)
    with h5py.File(staged, "r+") as f:
        a = f["a"]
        b = f.create_dataset("b", shape=a.shape, dtype=a.dtype, chunks=a.chunks, **hdf5plugin.LZ4())
        for i in range(a.id.get_num_chunks()):
            info = a.id.get_chunk_info(i)
            mask, chunk = a.id.read_direct_chunk(info.chunk_offset)
            b.id.write_direct_chunk(info.chunk_offset, chunk, mask)
    with pytest.raises(VerificationError, match=r"b: stored data .* written anew"):
        layout(staged, mirror, holes, lz4_file.stat().st_size)


def test_an_edit_inside_a_hole_is_refused(lz4_file, tmp_path):
    mirror = tmp_path / "mirror.h5"
    holes = mirror_of(lz4_file, mirror)
    staged = tmp_path / "staged.h5"
    shutil.copyfile(mirror, staged)
    a, b = holes[0]
    with open(staged, "r+b") as f:
        f.seek((a + b) // 2)
        f.write(b"edit")
    with pytest.raises(VerificationError, match="wrote inside the source's tensor bytes"):
        layout(staged, mirror, holes, lz4_file.stat().st_size)
