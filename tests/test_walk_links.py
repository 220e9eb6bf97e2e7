"""The preflight walk's links (issue 33): its children iterate the root's links, not HDF5's
recursive walk of every link (which reads each object's header to know whether it is a
group), walk every object inside a group they meet, and hand the root's hard links to the
parent, whose ``H5Handle.addresses`` then walks none itself."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import REAL, real_2x_files
from test_upgrade import fixture

from ckpt_migrate.format.h5 import io, overlaps, preflight
from ckpt_migrate.format.read import read_checkpoint


def _sources(tmp_path: Path, real_layout_19: Path) -> list[Path]:
    """Files the project did not write (the real 2.6-2.10 libraries', one laid out as the 1.9
    library wrote it) and our own 1.9 fixture: all their datasets at the root."""
    return [
        fixture("1.9", tmp_path),
        real_layout_19,
        REAL / "basic.mdl",
        REAL / "tied.mdl",
        REAL / "dtypes.mdl",
        *real_2x_files(tmp_path),
    ]


def test_the_walk_hands_over_every_hard_link_as_hdf5s_walk_finds_them(tmp_path, real_layout_19):
    for src in _sources(tmp_path, real_layout_19):
        with h5py.File(src, "r") as f:
            want = io.object_addresses(f)
        found = preflight.preflight(src)
        assert found is not None and found.links is not None, src
        links = found.links()
        assert links == want and list(links) == list(want), src
        for scope in ("outline", "root"):  # (their children hand over no such links)
            other = preflight.preflight(src, scope=scope)
            assert other is None or other.links is None, (src, scope)


def test_an_upgrade_reads_the_addresses_from_the_walk_not_from_hdf5(
    tmp_path, real_layout_19, monkeypatch
):
    """The edit of a copy and its check both ask ``H5Handle.addresses``: taken from the walk,
    HDF5's walk of 188k links (1.8 s) is not made again."""
    for src in _sources(tmp_path, real_layout_19):
        with h5py.File(src, "r") as f:
            want = io.object_addresses(f)
        with monkeypatch.context() as m:
            m.setattr(io, "object_addresses", _never)
            for defer in (False, True):
                with read_checkpoint(src, defer_chunks=defer) as ckpt:
                    assert ckpt.handle.addresses() == want, src
                    ckpt.handle.forget_addresses()  # (asked again: HDF5's walk, refused here)
                    with pytest.raises(AssertionError, match="walked the links"):
                        ckpt.handle.addresses()


def _never(group: h5py.Group) -> dict[str, int]:
    raise AssertionError("walked the links again")


def _grouped(path: Path) -> Path:
    """Datasets at the root and in groups two deep, one dataset linked from the root and from
    a group, a group linked twice, an attribute on a group."""
    with h5py.File(path, "w") as f:
        for name in ("a", "b", "c", "d"):
            f[name] = np.arange(4, dtype=np.float32)
        f["g/x"] = np.ones(3)
        f["g/y"] = np.zeros(2, dtype=np.int64)
        f["g/s/z"] = np.int64(7)
        f["g/s/t/deep"] = np.float32(1.5)
        f["g"].attrs["note"] = "a group's attribute"
        f["g/a2"] = f["a"]  # one dataset, two names
        f["h"] = f["g"]  # one group, two names
        f["k/only"] = np.ones(2)
    return path


def test_a_walk_that_meets_groups_walks_every_object_in_them_once(tmp_path, monkeypatch):
    """Each group's objects are walked by the child that meets the group, each object once
    under its first name (as HDF5's walk of every link named them); a walk that met a group
    hands over no links (the parent walks them itself)."""
    src = _grouped(tmp_path / "grouped.h5")
    for workers in (1, 2):
        monkeypatch.setattr(preflight, "WORKERS", workers)
        monkeypatch.setattr(preflight, "ONE_CHILD_RATIO", 1 << 62)  # (this small file too)
        found = preflight.preflight(src)
        assert found is not None
        assert sorted(found.datasets) == [
            "a",
            "b",
            "c",
            "d",
            "g/s/t/deep",
            "g/s/z",
            "g/x",
            "g/y",
            "k/only",
        ]
        assert found.stored == 4 * 16 + 24 + 16 + 8 + 4 + 16
        assert found.links is not None and found.links() is None


def test_an_object_in_two_groups_that_two_children_meet_is_walked_once(tmp_path, monkeypatch):
    """The first child walks every group's objects (the others name the groups they meet):
    one dataset in two groups, dealt to two children, is counted and its chunks placed once
    (twice, its chunks would overlap themselves and be refused as damage)."""
    src = tmp_path / "shared.h5"
    with h5py.File(src, "w") as f:
        f.create_dataset("g/x", data=np.arange(4096, dtype=np.float32), chunks=(1024,))
        f["g/s/y"] = np.ones(8)
        f["h/x2"] = f["g/x"]  # the same dataset, in the other child's group
        f["h/z"] = np.zeros(3, dtype=np.int32)
    monkeypatch.setattr(preflight, "WORKERS", 2)
    monkeypatch.setattr(preflight, "ONE_CHILD_RATIO", 1 << 62)
    found = preflight.preflight(src)
    assert found is not None
    assert sorted(found.datasets) in (["g/s/y", "g/x", "h/z"], ["g/s/y", "h/x2", "h/z"])
    assert found.stored == 4096 * 4 + 8 * 8 + 3 * 4
    with h5py.File(src, "r") as f:
        assert len(overlaps.shared_starts(f)) == 0
        assert f["h/x2"][-1] == 4095


def test_a_link_out_of_the_file_inside_a_group_is_refused_by_the_walk(tmp_path):
    src = _grouped(tmp_path / "grouped.h5")
    with h5py.File(src, "a") as f:
        f["g/s/out"] = h5py.ExternalLink(os.devnull, "/x")
    assert preflight.preflight(src) is None  # (the parent's own checks name it)
