"""``verify``'s leaf-by-leaf comparison: every kind of difference, named the same both ways.

The comparison keeps the second tree's leaves by name and walks the first's (issue 33: at 188k
leaves the dicts of both trees' positions held 179 MiB more); what it reports is what it
reported when it kept both.
"""

from __future__ import annotations

import itertools
import lzma
import shutil
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES, REAL, run_cli

import ckpt_migrate as cm
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.format.compare import compare_trees
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import (
    DictNode,
    MemoryData,
    OpaqueLeaf,
    TensorLeaf,
    ValueLeaf,
    iter_leaves,
    tied_positions,
)

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
        there, n, _ = compare_trees(a.root, b.root)
        back, m, _ = compare_trees(b.root, a.root)
        itself, k, _ = compare_trees(a.root, a.root)
    assert [(d.name, d.what) for d in there] == [
        ("d", "float32[2] vs float64[2]"),
        ("e", "tensor data differs"),
        ("only_a", "only in the first"),
        ("only_b", "only in the second"),
        ("tied", "tied to 'w' vs 'tied'"),
        ("x", "1 vs 2"),
    ]
    assert [(d.name, d.what) for d in back] == [
        ("d", "float64[2] vs float32[2]"),
        ("e", "tensor data differs"),
        ("only_a", "only in the second"),
        ("only_b", "only in the first"),
        ("tied", "tied to 'tied' vs 'w'"),
        ("x", "2 vs 1"),
    ]
    assert n == m == 5 and itself == [] and k == 6  # tensors both sides hold


def test_a_name_the_first_tree_gives_twice_is_compared_and_reported_once():
    """Keys whose dotted forms collide (a legacy writer's ``"a.b"`` beside ``"a"`` -> ``"b"``)
    name one leaf twice: compared once where the second tree has it, one "only in the first"
    where it does not, and the second's other names are still reported."""
    from ckpt_migrate.format.tree import DictNode, ValueLeaf

    def twice(value: int) -> DictNode:
        return DictNode([("a.b", ValueLeaf(value)), ("a", DictNode([("b", ValueLeaf(value))]))])

    assert [r.name for r in iter_leaves(twice(1))] == ["a.b", "a.b"]
    same = compare_trees(twice(1), DictNode([("a.b", ValueLeaf(1)), ("c", ValueLeaf(2))]))
    assert [(d.name, d.what) for d in same.differences] == [("c", "only in the second")]
    other = compare_trees(twice(1), DictNode([("c", ValueLeaf(2))]))
    assert [(d.name, d.what) for d in other.differences] == [
        ("a.b", "only in the first"),
        ("c", "only in the second"),
    ]
    changed = compare_trees(twice(1), DictNode([("a.b", ValueLeaf(3))]))
    assert [d.name for d in changed.differences] == ["a.b"]


def test_trees_walked_side_by_side_then_by_name_find_every_difference():
    """The trees are compared place by place while they name the same leaves, by name from
    the first place where they part: a difference before and after that place is found, the
    places past it are matched by name, and a name both trees give twice, differing at both
    places, is reported once."""
    from ckpt_migrate.format.tree import DictNode, ValueLeaf

    def tree(first: int, extra: bool, last: int) -> DictNode:
        items = [("a", ValueLeaf(first)), ("b", ValueLeaf(0))]
        items += [("new", ValueLeaf(0))] if extra else []
        return DictNode([*items, ("c", ValueLeaf(0)), ("z", ValueLeaf(last))])

    found = compare_trees(tree(1, False, 1), tree(2, True, 2))
    assert [(d.name, d.what) for d in found.differences] == [
        ("a", "1 vs 2"),
        ("new", "only in the second"),
        ("z", "1 vs 2"),
    ]
    assert compare_trees(tree(1, True, 1), tree(1, True, 1)).differences == []

    def twice(value: int) -> DictNode:
        return DictNode([("a.b", ValueLeaf(value)), ("a", DictNode([("b", ValueLeaf(value))]))])

    assert [d.name for d in compare_trees(twice(1), twice(2)).differences] == ["a.b"]


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
            assert compare_trees(a.root, a.root)[:2] == ([], tensors)
            there, n, _ = compare_trees(a.root, b.root)
            back, m, _ = compare_trees(b.root, a.root)
        assert n == m == tensors > 0
        assert bool(there) == added
        assert all(d.name.startswith("__metadata__.") for d in there)
        assert {(d.name, d.what) for d in there} == {
            (d.name, d.what.replace("first", "second")) for d in back
        }
        assert {d.what for d in there} <= {"only in the second"}


@pytest.mark.parametrize("name", ["nested", "dataloader_iterable", "scalars_misc", "tied"])
def test_the_real_librarys_files_through_torch_and_back_verify_equal(tmp_path, name):
    """The real 2.10 writer ties every position of one interned Python object (the ``1`` of a
    list and of a dict in ``nested.mdl``, a ``0`` of ``params`` and of a worker's
    ``shard_index``). A copy through ``to-torch`` and ``from-torch`` holds the same values,
    and ``verify`` said it differed (exit 4: ``tied to 'list.0' vs 'od.a'``). A tensor's tie is
    still compared (``tied.mdl``'s embedding)."""
    src = REAL / f"{name}.mdl"
    assert run_cli("to-torch", str(src), str(tmp_path / "x.pt")).returncode == 0
    assert run_cli("from-torch", str(tmp_path / "x.pt"), str(tmp_path / "x.mdl")).returncode == 0
    result = run_cli("verify", str(src), str(tmp_path / "x.mdl"))
    assert result.returncode == 0, result.stdout + result.stderr
    with read_checkpoint(src) as a, read_checkpoint(tmp_path / "x.mdl") as b:
        assert any(isinstance(r.leaf, ValueLeaf) for r in tied_positions(a.root).values()) == (
            name != "tied"
        )
        assert bool(tied_positions(b.root)) == (name == "tied")


def test_a_difference_is_said_as_inspect_shows_each_leaf():
    """``verify`` said ``('value', ('str', '2.4.0')) vs ('value', ('str', '2.5.0'))`` of two
    releases' version strings; now as ``inspect`` shows them. Leaves that read alike there
    are said in full (two pickled objects of one size)."""

    def tree(*leaves: Any) -> DictNode:
        return DictNode([(f"k{i}", leaf) for i, leaf in enumerate(leaves)])

    a = tree(ValueLeaf("2.4.0"), ValueLeaf(1), ValueLeaf(-0.0), OpaqueLeaf(b"ab"), ValueLeaf(1))
    b = tree(
        ValueLeaf("2.5.0"), ValueLeaf(True), ValueLeaf(0.0), OpaqueLeaf(b"ac"), ValueLeaf(None)
    )
    said = [d.what for d in compare_trees(a, b).differences]
    assert said[:3] == ["'2.4.0' vs '2.5.0'", "1 vs True", "-0.0 vs 0.0"]
    assert said[3].startswith("('opaque', '") and said[4] == "1 vs None"


def test_a_tensors_tie_against_a_value_tie():
    """Values tied in one tree and apart in the other are equal; tensors are not."""

    def tensor() -> TensorLeaf:
        return TensorLeaf("float32", (2,), MemoryData(np.zeros(2, np.float32)))

    value, w = ValueLeaf(1), tensor()
    tied = DictNode([("a", value), ("b", value), ("v", w), ("w", w)])
    apart = DictNode([("a", ValueLeaf(1)), ("b", ValueLeaf(1)), ("v", tensor()), ("w", tensor())])
    there, n, _ = compare_trees(tied, apart)
    assert [(d.name, d.what) for d in there] == [("w", "tied to 'v' vs 'w'")] and n == 2


def test_an_upgrades_tensors_are_equal_as_stored_and_not_decoded(tmp_path, monkeypatch):
    """An upgrade stores every tensor as its source does (a root edit keeps the source's
    datasets, a rewrite copies their chunks as stored): ``verify`` finds each equal by its
    stored bytes and decodes neither file, but where a tensor stores no bytes or the upgrade
    changed it. Sources the real library and the 1.9 writer made: a root edit (2.9 -> 2.10),
    a rewrite down (2.10 -> 2.0), and 1.9 -> 2.10, whose 2.0 hop sets a scheduler's
    ``last_epoch`` and whose fixture holds an empty (0, 3) tensor."""
    trainer = tmp_path / "trainer.mdl"
    trainer.write_bytes(lzma.decompress((REAL_2X / "trainer-2.9.0.mdl.xz").read_bytes()))
    tied = tmp_path / "tied.mdl"
    shutil.copyfile(REAL / "tied.mdl", tied)
    legacy = tmp_path / "release-1.9.mdl"
    shutil.copyfile(FIXTURES / "release-1.9.mdl", legacy)
    import ckpt_migrate.format.compare as compare

    real = compare.tensor_sha256
    for src, target in ((trainer, "2.10"), (tied, "2.0"), (legacy, "2.10")):
        out = tmp_path / target / src.name
        opts = UpgradeOptions(target=target, output_dir=out.parent)
        opts.inputs["drop_dataloader_state"] = True  # (1.9: its side files are not the point)
        result = upgrade(src, opts)
        assert result.status == "upgraded", result.error
        decoded: list[tuple[int, ...]] = []
        with monkeypatch.context() as m:
            m.setattr(
                compare,
                "tensor_sha256",
                lambda leaf, seen=decoded: seen.append(leaf.shape) or real(leaf),
            )
            with read_checkpoint(src) as a, read_checkpoint(out) as b:
                found = compare_trees(a.root, b.root)
        changed = [d.name for d in found.differences if d.what == "tensor data differs"]
        if src is legacy:
            assert changed == ["lr_scheduler._schedulers.1.last_epoch"]
            assert sorted(decoded) == [(), (), (0, 3), (0, 3)]
        else:
            assert decoded == [] and changed == []
        assert found.stored == found.tensors - len(decoded) // 2 > 0, (src.name, found)


def test_stored_bytes_that_differ_are_decoded_before_they_differ(tmp_path, monkeypatch):
    """Two tensors stored alike (same type, shape, chunks, sizes) whose bytes differ may still
    hold the same values (another LZ4 writer): both are decoded and hashed, and only then is
    it a difference. Tensors not stored alike (another chunk shape) are hashed too."""
    w = np.arange(64, dtype=np.float32)
    cm.save({"same": w, "other": w.copy(), "chunked": w.copy()}, tmp_path / "a.mdl")
    cm.save({"same": w, "other": w[::-1].copy(), "chunked": w.copy()}, tmp_path / "b.mdl")
    import h5py

    with h5py.File(tmp_path / "b.mdl", "r+") as f:  # the same values, other chunks
        attrs = dict(f["chunked"].attrs)
        del f["chunked"]
        f.create_dataset("chunked", data=w, chunks=(16,))
        f["chunked"].attrs.update(attrs)
    import ckpt_migrate.format.compare as compare

    hashed: list[str] = []
    real = compare.tensor_sha256
    monkeypatch.setattr(compare, "tensor_sha256", lambda leaf: hashed.append(leaf) or real(leaf))
    with read_checkpoint(tmp_path / "a.mdl") as a, read_checkpoint(tmp_path / "b.mdl") as b:
        found = compare_trees(a.root, b.root)
    assert [(d.name, d.what) for d in found.differences] == [("other", "tensor data differs")]
    assert (found.tensors, found.stored, len(hashed)) == (3, 1, 4)


def test_verify_says_which_tensors_it_compared_as_stored(tmp_path):
    """The real 2.10 library's ``tied.mdl`` against its rewrite down to 2.0."""
    src = tmp_path / "tied.mdl"
    shutil.copyfile(REAL / "tied.mdl", src)
    assert upgrade(src, UpgradeOptions(target="2.0", output_dir=tmp_path / "out")).error is None
    proc = run_cli("verify", src, tmp_path / "out" / src.name)
    assert proc.returncode == 0, proc.stderr
    with read_checkpoint(src) as a:
        n = sum(isinstance(r.leaf, TensorLeaf) for r in iter_leaves(a.root))  # (a tie: twice)
    assert f"{n} tensors compared ({n} equal as stored, not decoded): identical" in proc.stdout


def test_verify_begins_the_second_files_walk_before_it_reads_the_first(tmp_path, monkeypatch):
    """The second file's preflight children are forked before the first tree is built (forked
    after, they held it too: 311 MiB at 150k tensors, issue 33); its read collects that walk,
    and the answer is the same. The first file is made ready to read (its map of overlapping
    data) before the second tree is read, not beside it. (Where the headers do not answer:
    ``headercompare`` answers this pair without a walk.)"""
    from ckpt_migrate.cli import commands
    from ckpt_migrate.format.h5 import preflight
    from ckpt_migrate.format.h5.io import H5Handle

    monkeypatch.setattr(commands.headercompare, "compare", lambda *a, **k: None)
    src = tmp_path / "tied.mdl"
    shutil.copyfile(REAL / "tied.mdl", src)
    assert upgrade(src, UpgradeOptions(target="2.0", output_dir=tmp_path / "out")).error is None
    out = tmp_path / "out" / src.name
    plain = commands.verify(src, out)
    events: list[tuple[str, str]] = []
    begin, read = preflight._Walk.begin, commands.read_checkpoint
    monkeypatch.setattr(
        preflight._Walk,
        "begin",
        classmethod(lambda cls, p, *a: events.append(("walk", p.parent.name)) or begin(p, *a)),
    )
    monkeypatch.setattr(
        commands,
        "read_checkpoint",
        lambda p, **k: events.append(("read", p.parent.name)) or read(p, **k),
    )
    ready = H5Handle.ready_to_read
    monkeypatch.setattr(
        H5Handle,
        "ready_to_read",
        lambda self: events.append(("ready", self.path.parent.name)) or ready(self),
    )
    assert commands.verify(src, out) == plain and plain["identical"]
    name = src.parent.name
    assert events[:2] == [("walk", "out"), ("read", name)], events
    assert events.index(("ready", name)) < events.index(("read", "out")), events
    assert events.count(("walk", "out")) == 1, events  # (collected, not walked again)


def test_a_first_file_refused_leaves_no_walk_of_the_second(tmp_path, monkeypatch):
    """``verify`` begins the second file's walk before it reads the first; when the first is
    refused (not a checkpoint, damaged), that walk is ended with the command, not left to
    run in a process that goes on (a library caller's): the real 2.10 library's file second."""
    from ckpt_migrate.cli import commands
    from ckpt_migrate.errors import NotACheckpointError
    from ckpt_migrate.format.h5 import preflight

    bad = tmp_path / "notes.mdl"
    bad.write_bytes(b"not an HDF5 file")
    good = tmp_path / "tied.mdl"
    shutil.copyfile(REAL / "tied.mdl", good)
    begun: list = []
    start = preflight.start
    monkeypatch.setattr(preflight, "start", lambda p: begun.append(start(p)) or begun[-1])
    with pytest.raises(NotACheckpointError):
        commands.verify(bad, good)
    assert begun and begun[0] is not None  # (a walk was begun)
    assert begun[0] not in preflight._early
    proc = run_cli("verify", bad, good)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr


def test_a_read_that_fails_while_comparing_stored_bytes_is_one_error_naming_the_files(
    tmp_path, monkeypatch
):
    """An I/O error reading the stored bytes (a failing disk) is the command's I/O error,
    naming both files, not an internal one."""
    src = tmp_path / "tied.mdl"
    shutil.copyfile(REAL / "tied.mdl", src)
    assert upgrade(src, UpgradeOptions(target="2.0", output_dir=tmp_path / "out")).error is None
    import errno

    from ckpt_migrate.errors import CkptIOError
    from ckpt_migrate.format.h5 import stored

    def failing(*args):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(stored, "first_difference", failing)  # (the chunk checks read first)
    expected = r"tied\.mdl failed \(Input/output error\)"
    with (
        read_checkpoint(src) as a,
        read_checkpoint(tmp_path / "out" / src.name) as b,
        pytest.raises(CkptIOError, match=expected),
    ):
        compare_trees(a.root, b.root)


def test_where_the_trees_part_the_answer_is_that_of_an_index_of_the_whole_second_tree(
    monkeypatch,
):
    """Where two trees part, only the smaller side is indexed by name (issue 33: the second
    tree's 188k leaves were 10 MiB of ``verify``'s peak where an output's provenance leaves
    are its only difference): on 600 random pairs of flat trees (names given twice, leaves
    inserted, dropped, moved, changed), the differences are those found indexing the whole
    second tree, as the comparison did before."""
    from ckpt_migrate.format import compare
    from ckpt_migrate.format.tree import DictNode, ValueLeaf

    def whole(a, b, k):  # (the index before: every leaf of the second, its first k let go)
        lb = {r.name: r.leaf for r in iter_leaves(b)}
        for ref in itertools.islice(iter_leaves(a), k):
            lb[ref.name] = None
        return lb, frozenset()

    rng = np.random.default_rng(7)
    for _ in range(600):
        n = int(rng.integers(0, 12))
        names = [f"k{int(rng.integers(0, 9))}" for _ in range(n)]
        a = [(name, int(rng.integers(0, 3))) for name in names]
        b = list(a)
        for _ in range(int(rng.integers(0, 4))):
            edit = rng.integers(0, 4)
            at = int(rng.integers(0, len(b) + 1))
            if edit == 0:  # inserted
                b.insert(at, (f"k{int(rng.integers(0, 12))}", int(rng.integers(0, 3))))
            elif edit == 1 and b:  # dropped
                b.pop(min(at, len(b) - 1))
            elif edit == 2 and b:  # changed
                name, _ = b[min(at, len(b) - 1)]
                b[min(at, len(b) - 1)] = (name, int(rng.integers(3, 5)))
            elif b:  # moved to the end
                b.append(b.pop(min(at, len(b) - 1)))
        trees = [DictNode([(k, ValueLeaf(v)) for k, v in side]) for side in (a, b)]
        found = compare_trees(*trees)
        with monkeypatch.context() as m:
            m.setattr(compare, "_parted", whole)
            want = compare_trees(*trees)
        assert found == want, (a, b)
