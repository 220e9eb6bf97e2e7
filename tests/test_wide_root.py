"""Roots of more attributes than HDF5 can number in creation order (issue 33).

An object that tracks its attributes' creation order numbers them with 16 bits: the 65,536th
fails ("attribute creation index can't be incremented"). Format 0.5 has one root attribute per
leaf, so the roots this tool writes for checkpoints of more leaves (a 150k-tensor MoE) are
created without that tracking, still with version-2 headers (dense, indexed attributes)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from test_rootedit import _logical, _source, _upgrade

from ckpt_migrate.format.h5 import attrs as h5attrs
from ckpt_migrate.format.h5 import root as h5root
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import DictNode, MemoryData, TensorLeaf, ValueLeaf, iter_leaves
from ckpt_migrate.format.write import write_checkpoint

ROOT = Path(__file__).resolve().parents[1]
PAST_THE_CAP = h5root.MAX_TRACKED_ATTRIBUTES + 2


def _root_facts(path: Path) -> tuple[int, bool, int]:
    """The root's object header version, whether it tracks attribute creation order, and the
    superblock version."""
    with h5py.File(path, "r") as f:
        root = h5py.h5g.open(f.id, b"/")
        tracked = bool(root.get_create_plist().get_attr_creation_order())
        version = h5py.h5o.get_info(root).hdr.version
    return version, tracked, path.read_bytes()[8]


def _fill(oid: h5py.h5o.ObjectID, n: int) -> None:
    for i in range(n):
        h5attrs.create(oid, f"l{i}.__metadata__", "{}")


@pytest.mark.parametrize("how", ["new file", "new root"])
def test_a_root_takes_more_attributes_than_creation_order_can_number(tmp_path, how):
    """Both ways this tool makes a root (a new file; a fresh root switched into a copied one)
    take 65,537 attributes when told they will hold that many."""
    path = tmp_path / "f.h5"
    if how == "new file":
        with h5root.create_file(path, exclusive=True, attributes=PAST_THE_CAP) as f:
            _fill(f.id, PAST_THE_CAP)
    else:
        with h5py.File(path, "w") as f:
            f.attrs["old"] = 1
        h5root.create_wide_root(path)
        with h5py.File(path, "r+") as f:
            sb, old = h5root.superblock_offset(f), h5root.object_address(f)
            g = h5root.create_fresh_root(f, PAST_THE_CAP)
            _fill(g.id, PAST_THE_CAP)
            new = h5root.object_address(g)
        h5root.switch_root(path, sb, old, new)
    version, tracked, superblock = _root_facts(path)
    assert (version, tracked) == (2, False)
    assert superblock == (2 if how == "new file" else 0)
    with h5py.File(path, "r") as f:
        assert len(f.attrs) == PAST_THE_CAP and "old" not in f.attrs
        assert f.attrs[f"l{PAST_THE_CAP - 1}.__metadata__"] == "{}"


def test_ordinary_roots_still_track_creation_order(tmp_path):
    src = _source(tmp_path / "src.mdl", 20)
    assert _root_facts(src) == (2, True, 0)
    assert h5root.tracks_order(60_000) and not h5root.tracks_order(65_000)


@pytest.fixture
def low_cap(monkeypatch):
    """A cap of 60 attributes, so that a checkpoint of a few dozen leaves is past it."""
    monkeypatch.setattr(h5root, "MAX_TRACKED_ATTRIBUTES", 60)
    monkeypatch.setattr(h5root, "ORDER_HEADROOM", 0)


def test_a_checkpoint_past_the_cap_is_written_read_and_upgraded_as_below_it(
    tmp_path, monkeypatch, low_cap
):
    """Written and rewritten (2.5 -> 2.9 from a source whose tracked root has no room left for
    a root edit) past the cap: the same objects and values as below it, and the reader gives
    back the same tree."""
    src = _source(tmp_path / "src.mdl", 20)  # 20 experts: 80 tensors, 86 leaves
    assert _root_facts(src) == (2, False, 2)
    with monkeypatch.context() as m:
        m.setattr(h5root, "MAX_TRACKED_ATTRIBUTES", 65_535)
        m.setattr(h5root, "ORDER_HEADROOM", 1_024)
        tracked = _source(tmp_path / "tracked.mdl", 20)
        _, tracked_out = _upgrade(tracked, tmp_path / "tracked-out", "2.9")
    assert _logical(src) == _logical(tracked)
    with read_checkpoint(src) as a, read_checkpoint(tracked) as b:
        names = [r.name for r in iter_leaves(a.root)]
        assert names == [r.name for r in iter_leaves(b.root)] and len(names) == 86

    # A source whose root tracks creation order and has no room left: no root edit.
    result, out = _upgrade(tracked, tmp_path / "out", "2.9")
    assert result.strategy == "rewrite"
    assert _root_facts(out) == (2, False, 2)
    assert _logical(out) == _logical(tracked_out)


def _big_tensors(path: Path) -> Path:
    """A 2.4 file of 40 tensors of 64 KiB and 40 ints: the upgrade patches it."""
    leaves = [
        (f"w{i}", TensorLeaf("float32", (128, 128), MemoryData(np.full((128, 128), i, "f4"))))
        for i in range(40)
    ]
    write_checkpoint(DictNode(leaves + [(f"n{i}", ValueLeaf(i)) for i in range(40)]), path, "2.4")
    return path


def test_a_copy_patch_past_the_cap_gives_what_it_gives_below_it(tmp_path, monkeypatch):
    src = _big_tensors(tmp_path / "src.mdl")
    result, below = _upgrade(src, tmp_path / "below")
    assert result.strategy == "copy-patch" and _root_facts(below) == (2, True, 0)
    monkeypatch.setattr(h5root, "MAX_TRACKED_ATTRIBUTES", 60)
    monkeypatch.setattr(h5root, "ORDER_HEADROOM", 0)
    result, past = _upgrade(src, tmp_path / "past")
    assert result.strategy == "copy-patch" and _root_facts(past) == (2, False, 0)
    assert _logical(past) == _logical(below)
