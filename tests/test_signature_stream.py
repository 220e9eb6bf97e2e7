"""``same_signature`` compares two trees' signatures while it walks them (issue 33: the
verification of a 150k-tensor upgrade built both whole): it must answer exactly what comparing
``signature`` answers, on the files the real libraries and our fixtures hold and on trees
whose flattened forms would agree but for the lengths of their containers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import shipped_checkpoints

from ckpt_migrate.errors import CkptError
from ckpt_migrate.format.compare import same_signature, signature
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import (
    DictNode,
    MemoryData,
    MissingLeaf,
    NamedTupleNode,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
)


def agree(a, b, numpy_as_tensor: bool = False) -> bool:
    want = signature(a, numpy_as_tensor=numpy_as_tensor) == signature(
        b, numpy_as_tensor=numpy_as_tensor
    )
    assert same_signature(a, b, numpy_as_tensor=numpy_as_tensor) is want
    assert same_signature(b, a, numpy_as_tensor=numpy_as_tensor) is want
    return want


def test_every_shipped_checkpoint_against_itself_and_its_neighbours(tmp_path):
    trees = []
    for path in shipped_checkpoints(tmp_path):
        try:
            with read_checkpoint(path) as ckpt, read_checkpoint(path) as again:
                trees.append(ckpt.root)
                assert agree(ckpt.root, again.root)  # equal trees that share no object
        except CkptError:  # the fixtures of files every reader refuses
            continue
    assert len(trees) > 20
    for a, b in zip(trees, trees[1:] + trees[:1], strict=True):
        assert agree(a, a, numpy_as_tensor=True)
        agree(a, b)


def one(v) -> ValueLeaf:
    return ValueLeaf(v)


def tied_in_a_list(dtype: str) -> DictNode:
    """A tensor tied at a list's second and third places: its first place is ``l.1``."""
    w = TensorLeaf(dtype, (2,), MemoryData(np.zeros(2, dtype)))
    return DictNode([("l", SeqNode("list", [one(1), w, w]))])


CASES = {
    # (the walk once gave each list item its elder sibling's path plus its index: the tie's
    # first place read as a later one, its dtype not compared)
    "a tie's dtype, first placed after a list's first item": (
        tied_in_a_list("float32"),
        tied_in_a_list("float64"),
    ),
    "lengths decide": (
        SeqNode("list", [SeqNode("list", [one(1)]), one(2)]),
        SeqNode("list", [SeqNode("list", [one(1), one(2)])]),
    ),
    "a key moved into the next dict": (
        DictNode([("a", DictNode([("b", one(1))])), ("c", one(2))]),
        DictNode([("a", DictNode([("b", one(1)), ("c", one(2))]))]),
    ),
    "a key's type": (DictNode([(1, one(0))]), DictNode([("1", one(0))])),
    "a value's type": (DictNode([("x", one(1))]), DictNode([("x", one(True))])),
    "a float's sign": (DictNode([("x", one(0.0))]), DictNode([("x", one(-0.0))])),
    "list or tuple": (SeqNode("list", [one(1)]), SeqNode("tuple", [one(1)])),
    "ordered or not": (DictNode([("x", one(1))], ordered=True), DictNode([("x", one(1))])),
    "a named tuple's name": (
        NamedTupleNode("A", ("f",), [one(1)]),
        NamedTupleNode("B", ("f",), [one(1)]),
    ),
    "a prefix": (DictNode([("x", one(1))]), DictNode([("x", one(1)), ("y", one(2))])),
    "empty against empty": (DictNode([]), SeqNode("list", [])),
    "a missing leaf's name": (
        DictNode([("x", MissingLeaf("p"))]),
        DictNode([("x", MissingLeaf("q"))]),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_trees_that_differ_only_in_their_shape(case):
    a, b = CASES[case]
    assert not agree(a, b)
    assert agree(a, a)


def test_a_tie_is_not_an_equal_copy():
    shared = one(3)
    tied = DictNode([("a", shared), ("b", shared)])
    copies = DictNode([("a", one(3)), ("b", one(3))])
    assert not agree(tied, copies)
    same = DictNode([("a", (s := one(3))), ("b", s)])
    assert agree(tied, same)
    # tied through a container met twice, and tied in another order
    inner = DictNode([("w", one(1))])
    twice = SeqNode("list", [inner, inner])
    assert agree(twice, SeqNode("list", [DictNode([("w", (w := one(1)))]), DictNode([("w", w)])]))
    assert not agree(twice, SeqNode("list", [inner, DictNode([("w", one(1))])]))


def test_one_leaf_object_in_both_trees_is_compared_where_either_ties_it():
    """The walk takes a leaf object met at the same place in both trees as alike without its
    signature, unless either tree ties it (a later place's signature names its first)."""
    s = one(3)
    tied = DictNode([("a", s), ("b", s)])
    assert not agree(tied, DictNode([("a", s), ("b", one(3))]))
    assert not agree(DictNode([("a", one(3)), ("b", s)]), tied)
    assert agree(tied, DictNode([("a", s), ("b", s)]))
    w = TensorLeaf("float32", (2,), MemoryData(np.zeros(2, np.float32)))
    assert agree(DictNode([("x", w)]), DictNode([("x", w)]))
    assert not agree(DictNode([("x", w)]), DictNode([("y", w)]))
    assert not agree(DictNode([("x", w)]), SeqNode("list", [w]))


def test_leaf_roots():
    assert agree(one(1), one(1))
    assert not agree(one(1), DictNode([]))
    for a, b in itertools.combinations([one(None), one("x"), one(2.5)], 2):
        assert not agree(a, b)


def test_a_wide_dict_is_walked_in_memory_as_deep_as_the_tree():
    """The walk keeps each open container's remaining children as an iterator: every key of a
    wide dict pushed at once held about 90 B a leaf for each of the two trees compared (at
    150k leaves, 27 MB of an import's peak, issue 33)."""
    import tracemalloc

    from ckpt_migrate.format import compare

    def wide() -> DictNode:
        return DictNode([(f"model.layers.{i}.weight", ValueLeaf(i)) for i in range(20_000)])

    a, b = wide(), wide()  # (equal, no object shared: every pair of leaves compared)
    tracemalloc.start()
    try:
        assert compare._same(a, b, {}, {}, False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 10, f"{peak / 2**20:.1f} MiB to walk two trees of 20,000 leaves"
