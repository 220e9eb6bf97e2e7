"""The tree walks a 150k-leaf read relies on (issue 33): leaves decoded in place in flatten
order, ties found without a position kept per leaf, an ``inspect`` summary that leaves out
the per-leaf report but not its totals, and the checks before a write in one walk."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FIXTURES, REAL

from ckpt_migrate.cli import commands
from ckpt_migrate.errors import (
    CorruptCheckpointError,
    KeyCollisionError,
    MissingLeavesError,
    UnsupportedContentError,
)
from ckpt_migrate.format import budgets, releases
from ckpt_migrate.format.outline import outline_lines, report, sizes
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import (
    DictNode,
    ExternalLeaf,
    MemoryData,
    MissingLeaf,
    NamedTupleNode,
    OpaqueLeaf,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
    contains,
    fill_missing,
    first_positions,
    iter_leaves,
    leaf_objects,
    map_leaves,
    tied_positions,
)
from ckpt_migrate.format.v05 import treespec
from ckpt_migrate.format.write import prepare


def _spec_like():
    """Every container kind, nested, with leaves at several depths (as a parsed spec: each
    leaf a ``MissingLeaf`` of its own name)."""
    return DictNode(
        [
            ("a", MissingLeaf("a")),
            (
                "b",
                SeqNode(
                    "list",
                    [
                        MissingLeaf("b.0"),
                        DictNode([("c", MissingLeaf("b.1.c"))]),
                        MissingLeaf("b.2"),
                    ],
                ),
            ),
            ("t", NamedTupleNode("P", ("_0", "_1"), [MissingLeaf("t.0"), SeqNode("tuple", [])])),
            (7, MissingLeaf("7")),
        ]
    )


def test_fill_missing_decodes_in_flatten_order_in_place():
    order: list[str] = []

    def decode(name: str) -> ValueLeaf:
        order.append(name)
        return ValueLeaf(name)

    root = _spec_like()
    expected = map_leaves(_spec_like(), lambda ref: ValueLeaf(ref.name))
    filled = fill_missing(root, decode)
    assert filled is root  # (no second tree)
    assert (
        order
        == [ref.name for ref in iter_leaves(expected)]
        == ["a", "b.0", "b.1.c", "b.2", "t.0", "7"]
    )
    assert [(r.name, r.leaf.value) for r in iter_leaves(filled)] == [
        (r.name, r.leaf.value) for r in iter_leaves(expected)
    ]
    assert not any(isinstance(r.leaf, MissingLeaf) for r in iter_leaves(filled))
    assert fill_missing(MissingLeaf(""), decode).value == ""  # a root that is a leaf


def test_leaves_mapped_in_place_are_the_copys_in_the_trees_own_containers():
    """``map_leaves(in_place=True)`` (a legacy spec just decoded): the same leaves, names and
    paths as the copy, in the root's own containers; a leaf under two places (a tie) is mapped
    once and stays one object; a root that is a leaf is mapped too."""
    shared = MissingLeaf("a")
    root = _spec_like()
    root.items.append(("again", shared))
    root.items[0] = ("a", shared)
    containers = [id(root), id(root.items[1][1]), id(root.items[2][1])]
    seen: list[tuple[str, tuple]] = []

    def fn(ref):
        seen.append((ref.name, ref.path))
        return ValueLeaf(ref.name)

    copy = map_leaves(_spec_like(), lambda ref: ValueLeaf(ref.name))
    mapped = map_leaves(root, fn, in_place=True)
    assert mapped is root
    assert [id(root), id(root.items[1][1]), id(root.items[2][1])] == containers
    assert [(r.name, r.leaf.value) for r in iter_leaves(mapped)][:-1] == [
        (r.name, r.leaf.value) for r in iter_leaves(copy)
    ]
    assert root.items[0][1] is root.items[-1][1] and seen.count(("a", ("a",))) == 1
    assert ("again", ("again",)) not in seen  # (the tie: its first place's leaf)
    assert map_leaves(MissingLeaf(""), fn, in_place=True).value == ""


def test_tied_positions_are_the_first_positions_of_ties_only():
    shared, other = ValueLeaf(1), ValueLeaf(2)
    root = DictNode([("x", shared), ("y", SeqNode("list", [other, shared])), ("z", shared)])
    ties = tied_positions(root)
    assert list(ties) == [id(shared)]
    assert ties[id(shared)] == first_positions(root)[id(shared)]
    assert ties[id(shared)].name == "x"
    assert tied_positions(_spec_like()) == {}


def test_an_inspect_summary_keeps_the_totals_and_the_ties_without_every_leaf():
    path = REAL / "tied.mdl"
    with read_checkpoint(path) as ckpt:
        full, summary = report(ckpt), report(ckpt, leaves=False)
        lines = outline_lines(ckpt.root)
    assert "leaves" not in summary
    assert summary == {k: v for k, v in full.items() if k != "leaves"}
    assert summary["leaf_count"] == len(full["leaves"]) == 7
    assert any("(tied to model.embed.weight)" in line for line in lines)
    assert "leaves" not in commands.inspect(path, everything=False)
    assert len(commands.inspect(path)["leaves"]) == 7


def _sizes_by_names(root) -> tuple[int, int, int]:
    """``outline.sizes`` as its docstring defines it, from ``iter_leaves``' names."""
    distinct = {id(r.leaf): r.leaf for r in iter_leaves(root) if isinstance(r.leaf, TensorLeaf)}
    names = [ref.name for ref in iter_leaves(root)]
    return sum(t.nbytes for t in distinct.values()), len(names), sum(map(len, names))


def _tensor(dtype: str, *shape: int) -> TensorLeaf:
    return TensorLeaf(dtype, shape, MemoryData(np.zeros(0, np.float32)))


@pytest.mark.parametrize(
    "path",
    # (but the two the reader refuses: their leaf names collide)
    [
        p
        for p in [*sorted(REAL.glob("*.mdl")), *sorted(FIXTURES.glob("*.mdl"))]
        if "collision" not in p.name
    ],
    ids=lambda p: p.name,
)
def test_sizes_counts_what_the_leaves_names_count(path, tmp_path):
    """The plan's totals without building the names: the real library's files (ties, nested
    and integer keys, empty trees) and the legacy fixtures, read in full and from the outline."""
    for outline in (False, True):
        with read_checkpoint(path, outline=outline) as ckpt:
            assert sizes(ckpt.root) == _sizes_by_names(ckpt.root)
    shared = _tensor("bfloat16", 3, 5)
    root = DictNode(
        [
            ("w", shared),
            (12, SeqNode("list", [_tensor("float32", 2), DictNode([("ab", shared)])] * 6)),
            ("t", NamedTupleNode("P", ("_0", "_1"), [ValueLeaf(1), SeqNode("tuple", [])])),
            ("é", DictNode([])),
        ]
    )
    assert sizes(root) == _sizes_by_names(root)
    assert sizes(_spec_like()) == _sizes_by_names(_spec_like()) == (0, 6, 16)
    assert sizes(shared) == _sizes_by_names(shared) == (30, 1, 0)
    assert sizes(DictNode([])) == (0, 0, 0)


@pytest.mark.parametrize(
    "path",
    [
        p
        for p in [*sorted(REAL.glob("*.mdl")), *sorted(FIXTURES.glob("*.mdl"))]
        if "collision" not in p.name
    ],
    ids=lambda p: p.name,
)
def test_a_summary_counts_what_the_full_report_counts(path):
    """The summary's totals are walked without the leaves' names: the same counts, bytes by
    dtype (in the same order, a tie once), missing leaves, as the full report's."""
    with read_checkpoint(path, outline=True) as ckpt:
        full, summary = report(ckpt), report(ckpt, leaves=False)
        assert summary == {k: v for k, v in full.items() if k != "leaves"}
        assert list(summary["bytes_by_dtype"]) == list(full["bytes_by_dtype"])
        shared = _tensor("bfloat16", 3, 5)
        ckpt.root = DictNode(
            [
                ("a", MissingLeaf("a")),
                ("w", shared),
                ("s", SeqNode("list", [_tensor("float32", 2), shared, MissingLeaf("s.2")])),
                ("i", _tensor("int64", 4)),
            ]
        )
        full, summary = report(ckpt), report(ckpt, leaves=False)
    assert summary == {k: v for k, v in full.items() if k != "leaves"}
    assert summary["missing"] == ["a", "s.2"] and summary["leaf_count"] == 6
    firsts = first_positions(ckpt.root)
    assert [e.get("tied_to") for e in full["leaves"]] == [
        None if firsts[id(r.leaf)].path == r.path else firsts[id(r.leaf)].name
        for r in iter_leaves(ckpt.root)
    ]
    assert [e["name"] for e in full["leaves"]] == [r.name for r in iter_leaves(ckpt.root)]
    assert list(summary["bytes_by_dtype"]) == ["bfloat16", "float32", "int64"]
    assert summary["bytes_by_dtype"]["bfloat16"] == {"tensors": 1, "bytes": 30}


def test_reading_leaves_no_cycle_for_the_collector():
    """``cli.run``'s collector thresholds leave the cycles of a command's long-lived heap for
    the exit; a recursive walk nested in ``map_leaves`` held itself, and through the reader's
    ``decode`` the facts of every dataset: 170 MB of a 150k-tensor upgrade, all its write and
    verification long. Reading a legacy and a format 0.5 file and mapping their trees leave
    nothing behind that only the cycle collector would free."""
    import gc

    paths = [FIXTURES / "release-1.9.mdl", FIXTURES / "release-2.3.mdl", REAL / "basic.mdl"]

    def read_all() -> None:
        for path in paths:
            with read_checkpoint(path) as ckpt:
                map_leaves(ckpt.root, lambda ref: ref.leaf)

    read_all()  # (what a first read creates once, types and caches, is not counted)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        read_all()
        found = gc.collect()
        left = sorted({type(o).__qualname__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert found == 0, left


def test_leaf_objects_and_contains_see_every_position():
    shared = ValueLeaf(1)
    inner = NamedTupleNode("P", ("_0",), [shared])
    root = DictNode([("x", shared), ("y", SeqNode("tuple", [DictNode([("n", inner)])]))])
    assert sorted(map(id, leaf_objects(root))) == sorted([id(shared)] * 2)
    assert contains(root, NamedTupleNode) and contains(root, ValueLeaf)
    assert not contains(root, MissingLeaf)
    assert list(leaf_objects(shared)) == [shared]


def test_one_walk_of_prepare_names_what_the_walks_named_first():
    """``prepare`` checks names, leaves and datasets in one walk: a collision is still named
    before any leaf's problem, and of the leaves' problems the first in flatten order."""
    external = ExternalLeaf("DeferredSafeTensor", {})
    pickled = OpaqueLeaf(b"x")
    collide = DictNode([("a.b", ValueLeaf(1)), ("z", external), ("a", DictNode([("b", pickled)]))])
    with pytest.raises(KeyCollisionError, match=r"1 leaf name\(s\) would collide, e.g. 'a.b'"):
        prepare(collide, releases.get("2.10"))
    both = DictNode([("p", pickled), ("z", external)])
    with pytest.raises(UnsupportedContentError, match="'p' is a pickled object"):
        prepare(both, releases.get("1.7"))
    with pytest.raises(UnsupportedContentError, match="'z' is a DeferredSafeTensor"):
        prepare(both, releases.get("2.10"))
    tensor = TensorLeaf("float32", (2,), MemoryData(np.zeros(2, np.float32)))
    clash = DictNode([("w", tensor), ("w/x", tensor), ("m", MissingLeaf("m"))])
    with pytest.raises(KeyCollisionError, match="needs group 'w', which is a tensor"):
        prepare(clash, releases.get("2.10"))
    with pytest.raises(MissingLeavesError, match="1 leaf/leaves named by the spec have no data: m"):
        prepare(DictNode([("w", tensor), ("m", MissingLeaf("m"))]), releases.get("2.10"))
    later = DictNode([("w/x", tensor), ("w", tensor)])
    with pytest.raises(KeyCollisionError, match="tensor 'w' clashes with a group of the same"):
        prepare(later, releases.get("2.10"))
    for bad in ("", ".", "a//b", "./b"):
        with pytest.raises(UnsupportedContentError, match=f"name {bad!r} cannot be an HDF5"):
            prepare(DictNode([("ok", tensor), (bad, tensor)]), releases.get("2.10"))
    empty = r"an empty leaf name at \[''\] cannot be a dataset name in format 0.4"
    with pytest.raises(UnsupportedContentError, match=empty):
        prepare(DictNode([("ok", tensor), ("", tensor)]), releases.get("2.4"))
    prepare(DictNode([("m", DictNode([("", tensor)]))]), releases.get("2.4"))  # ('m.')


def test_declared_sizes_name_a_negative_dimension_and_count_a_tie_once():
    # 160 MiB of bfloat16 declared: under the slack once, over it counted twice
    big = TensorLeaf("bfloat16", (80, 1 << 20), MemoryData(np.zeros(0, np.int16)))
    budgets.check_declared(DictNode([("a", big), ("b", big)]), "f.mdl", 0)
    other = TensorLeaf("bfloat16", (80, 1 << 20), MemoryData(np.zeros(0, np.int16)))
    with pytest.raises(CorruptCheckpointError, match=r"320\.0 MiB in all"):
        budgets.check_declared(DictNode([("a", big), ("b", other)]), "f.mdl", 0)
    bad = TensorLeaf("float32", (2, -1), MemoryData(np.zeros(0, np.float32)))
    with pytest.raises(CorruptCheckpointError, match=r"'b\.0' has a negative dimension \[2, -1\]"):
        budgets.check_declared(DictNode([("a", big), ("b", SeqNode("list", [bad]))]), "f", 0)


def test_a_format_05_read_keeps_one_object_per_distinct_key():
    """Each dict of a format 0.5 spec names its keys in its own JSON context: 150k leaves'
    keys were 150k strings of a few dozen words (15 MB) until they were interned."""
    layer = [("weight", ValueLeaf(1)), ("exp_avg_sq", ValueLeaf(2))]
    tree = DictNode([(f"layer{i}", DictNode(list(layer))) for i in range(3)])
    root = treespec.parse(treespec.dumps(tree))
    layers = [node for _, node in root.items]
    for at in (0, 1):
        assert len({id(node.items[at][0]) for node in layers}) == 1
    assert [k for k, _ in layers[2].items] == ["weight", "exp_avg_sq"]
    # the real 2.10 library's file: each optimizer state's "step" and "exp_avg", one object
    for name in ("dataloader_map.mdl", "nested.mdl"):
        with read_checkpoint(REAL / name) as ckpt:
            found: dict[str, set[int]] = {}
            for node in _dicts(ckpt.root):
                for key, _ in node.items:
                    found.setdefault(key, set()).add(id(key))
        assert len(found["step"]) == 1, name
        assert all(len(ids) == 1 for ids in found.values())


def _dicts(node):
    if isinstance(node, DictNode):
        yield node
        for _, value in node.items:
            yield from _dicts(value)
    elif isinstance(node, (SeqNode, NamedTupleNode)):
        for value in node.items:
            yield from _dicts(value)
