"""A new root group by a superblock edit (``h5root``), on files HDF5 itself wrote."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest
from h5py import h5f, h5p

from ckpt_migrate.format.h5 import capi
from ckpt_migrate.format.h5 import root as h5root


def _make(path: Path, superblock: int, userblock: int = 0) -> tuple[int, int, int]:
    """A file whose superblock has the given version, with an old root and a fresh one."""
    fapl = h5p.create(h5p.FILE_ACCESS)
    fcpl = h5p.create(h5p.FILE_CREATE)
    if userblock:
        fcpl.set_userblock(userblock)
    if superblock == 0:
        fapl.set_libver_bounds(h5f.LIBVER_EARLIEST, h5f.LIBVER_LATEST)
    else:
        fapl.set_libver_bounds(
            h5f.LIBVER_V18 if superblock == 2 else h5f.LIBVER_LATEST, h5f.LIBVER_LATEST
        )
    fid = h5f.create(str(path).encode(), h5f.ACC_EXCL, fapl=fapl, fcpl=fcpl)
    with h5py.File(fid) as f:
        f.attrs["old"] = "root"
        f["old_data"] = np.arange(3)
        g = h5root.create_fresh_root(f)
        for i in range(40):  # past the eight attributes a compact list holds
            g.attrs[f"leaf{i}.__metadata__"] = f"text {i}"
        g["w"] = np.arange(6, dtype=np.float32).reshape(2, 3)
        g.create_group("sub")["x"] = np.int64(7)
        sb, old, new = (
            h5root.superblock_offset(f),
            h5root.object_address(f),
            h5root.object_address(g),
        )
    return sb, old, new


# Version 1 differs from 0 only by a non-default chunk B-tree K, which h5py cannot set.
@pytest.mark.parametrize("superblock", [0, 2, 3])
@pytest.mark.parametrize("userblock", [0, 512])
def test_switch_root_makes_the_fresh_group_the_root(
    tmp_path: Path, superblock: int, userblock: int
):
    path = tmp_path / "f.h5"
    sb, old, new = _make(path, superblock, userblock)
    head = path.read_bytes()[sb : sb + 9]
    assert head[8] == superblock and sb == userblock
    h5root.switch_root(path, sb, old, new)
    for _ in range(2):  # also after HDF5 has opened it for writing and closed it again
        with h5py.File(path, "r") as f:
            assert sorted(f) == ["sub", "w"]
            assert "old" not in f.attrs
            assert [f.attrs[f"leaf{i}.__metadata__"] for i in range(40)] == [
                f"text {i}" for i in range(40)
            ]
            assert list(f.attrs)[:3] == [
                "leaf0.__metadata__",
                "leaf1.__metadata__",
                "leaf2.__metadata__",
            ]
            np.testing.assert_array_equal(f["w"][()], np.arange(6, dtype=np.float32).reshape(2, 3))
            assert f["sub/x"][()] == 7
        with h5py.File(path, "r+") as f:
            f.attrs["added"] = 1
    with h5py.File(path, "r") as f:
        assert f.attrs["added"] == 1


def test_switch_root_refuses_a_superblock_naming_another_root(tmp_path: Path):
    path = tmp_path / "f.h5"
    sb, old, new = _make(path, 0)
    before = path.read_bytes()
    with pytest.raises(ValueError, match="names root"):
        h5root.switch_root(path, sb, old + 8, new)
    with pytest.raises(ValueError, match="no HDF5 superblock"):
        h5root.switch_root(path, 512, old, new)
    assert path.read_bytes() == before


@pytest.mark.parametrize("superblock", [0, 3])
def test_switch_root_through_a_descriptor_it_is_given_leaves_it_open(
    tmp_path: Path, superblock: int
):
    """The engine hands it HDF5's own descriptor, kept past HDF5's close (``copypatch``)."""
    path = tmp_path / "f.h5"
    sb, old, new = _make(path, superblock)
    fd = os.open(path, os.O_RDWR)
    try:
        h5root.switch_root(path, sb, old, new, fd=fd)
        h5root.switch_root(path, sb, new, new, fd=fd)  # (still open: it names ``new`` now)
        with pytest.raises(ValueError, match="names root"):
            h5root.switch_root(path, sb, old, new, fd=fd)
    finally:
        os.close(fd)
    with h5py.File(path, "r") as f:
        assert sorted(f) == ["sub", "w"] and h5root.object_address(f) == new


@pytest.mark.parametrize("libver", ["v108", "latest"])
def test_lookup3_is_hdf5s_superblock_checksum(tmp_path: Path, libver: str):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w", libver=libver) as f:
        f["x"] = 1
    head = path.read_bytes()[:64]
    end = 12 + 4 * head[9]
    assert struct.unpack("<I", head[end : end + 4])[0] == h5root.lookup3(head[:end])


def test_lookup3_known_values():
    # lookup3.c's driver: hashlittle("", 0, 0) and "Four score and seven years ago" with seed 0.
    for lookup3 in (h5root.lookup3, h5root.lookup3_python):
        assert lookup3(b"") == 0xDEADBEEF
        assert lookup3(b"Four score and seven years ago") == 0x17770551


def test_hdf5s_lookup3_is_ours():
    """HDF5's exported function (``capi.lookup3``) and the Python one agree, seeds included."""
    rng = np.random.default_rng(5)
    for n in (0, 1, 11, 12, 13, 100, 4095, 65536):
        data = rng.bytes(n)
        for seed in (0, 1, 0xFFFFFFFF):
            assert capi.lookup3(data, seed) == h5root.lookup3_python(data, seed)
    assert capi.lookup3(bytearray(b"abc")) == h5root.lookup3_python(b"abc")
