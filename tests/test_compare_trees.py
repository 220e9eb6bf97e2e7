"""``verify``'s leaf-by-leaf comparison: every kind of difference, named the same both ways.

The comparison keeps the second tree's leaves by name and walks the first's (issue 33: at 188k
leaves the dicts of both trees' positions held 179 MiB more); what it reports is what it
reported when it kept both.
"""

from __future__ import annotations

import lzma
import shutil

import numpy as np
from conftest import FIXTURES, REAL

import ckpt_migrate as cm
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.format.compare import compare_trees
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import TensorLeaf, iter_leaves, tied_positions

REAL_2X = FIXTURES / "real-cstorch-2.6-2.9"


def test_every_kind_of_difference_both_ways(tmp_path):
    w = np.arange(4, dtype=np.float32)
    first = {
        "w": w,
        "tied": w,  # the same tensor twice: a tie
        "only_a": w + 1,
        "x": 1,
        "d": np.zeros(2, np.float32),
        "e": np.ones(3, np.float32),
        "same": {"deep": np.full(5, 7, np.int64)},
    }
    second = {
        "w": w,
        "tied": w.copy(),
        "only_b": w + 1,
        "x": 2,
        "d": np.zeros(2, np.float64),
        "e": np.ones(3, np.float32) * 2,
        "same": {"deep": np.full(5, 7, np.int64)},
    }
    cm.save(first, tmp_path / "a.mdl")
    cm.save(second, tmp_path / "b.mdl")
    with read_checkpoint(tmp_path / "a.mdl") as a, read_checkpoint(tmp_path / "b.mdl") as b:
        there, n = compare_trees(a.root, b.root)
        back, m = compare_trees(b.root, a.root)
        itself, k = compare_trees(a.root, a.root)
    assert [(d.name, d.what) for d in there] == [
        ("d", "float32[2] vs float64[2]"),
        ("e", "tensor data differs"),
        ("only_a", "only in the first"),
        ("only_b", "only in the second"),
        ("tied", "tied to 'w' vs 'tied'"),
        ("x", "('value', ('int', 1)) vs ('value', ('int', 2))"),
    ]
    assert [(d.name, d.what) for d in back] == [
        ("d", "float64[2] vs float32[2]"),
        ("e", "tensor data differs"),
        ("only_a", "only in the second"),
        ("only_b", "only in the first"),
        ("tied", "tied to 'tied' vs 'w'"),
        ("x", "('value', ('int', 2)) vs ('value', ('int', 1))"),
    ]
    assert n == m == 5 and itself == [] and k == 6  # tensors both sides hold


def test_the_real_librarys_files_against_their_upgrades(tmp_path):
    """Files the real cerebras.pytorch wrote, whose ties are its own ``LinkedObject`` entries
    (the 2.9 trainer's: 44, scalars among them; 2.10's ``tied.mdl``: a tied embedding): each
    against itself and against its upgrade (2.9 -> 2.10, a root edit) or downgrade (2.10 ->
    2.0, a rewrite). Ties are kept, every tensor is compared, and the only differences are the
    upgrade's own ``__metadata__`` record, named the other way round when the order is."""
    trainer = tmp_path / "trainer.mdl"
    trainer.write_bytes(lzma.decompress((REAL_2X / "trainer-2.9.0.mdl.xz").read_bytes()))
    tied = tmp_path / "tied.mdl"
    shutil.copyfile(REAL / "tied.mdl", tied)
    for src, target, added in ((trainer, "2.10", True), (tied, "2.0", False)):
        out = tmp_path / target
        assert upgrade(src, UpgradeOptions(target=target, output_dir=out)).status == "upgraded"
        with read_checkpoint(src) as a, read_checkpoint(out / src.name) as b:
            tensors = sum(isinstance(r.leaf, TensorLeaf) for r in iter_leaves(a.root))
            assert len(tied_positions(a.root)) == len(tied_positions(b.root)) > 0
            assert compare_trees(a.root, a.root) == ([], tensors)
            there, n = compare_trees(a.root, b.root)
            back, m = compare_trees(b.root, a.root)
        assert n == m == tensors > 0
        assert bool(there) == added
        assert all(d.name.startswith("__metadata__.") for d in there)
        assert {(d.name, d.what) for d in there} == {
            (d.name, d.what.replace("first", "second")) for d in back
        }
        assert {d.what for d in there} <= {"only in the second"}
