"""Checking that a written checkpoint holds what it should.

Three levels, cheapest first:
* ``signature``: structure, keys, leaf kinds, values, dtypes, shapes and ties (no tensor data);
* ``h5.io.object_addresses``: a dataset is the same stored object as in the file it was copied
  from (the links alone; proves bit-identity for data copied or cloned as file bytes);
* ``tensor_sha256``: the hash of a tensor's raw little-endian bytes (bf16 as its 16-bit pattern),
  the same hash cstorch-digest-v1 uses, computed in slabs so memory stays bounded.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import h5py
import numpy as np

from ckpt_migrate.errors import VerificationError
from ckpt_migrate.format import dtypes
from ckpt_migrate.format.h5.io import (
    COPY_BLOCK_BYTES,
    check_whole,
    iter_slabs,
    read_slab,
    read_whole,
)
from ckpt_migrate.format.h5.stored import SameBytes
from ckpt_migrate.format.outline import describe_leaf
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.releases import Release
from ckpt_migrate.format.tree import (
    DictNode,
    ExternalLeaf,
    FullTensorLeaf,
    H5Data,
    Leaf,
    LeafRef,
    MissingLeaf,
    NamedTupleNode,
    Node,
    OpaqueLeaf,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
    iter_leaves,
    map_leaves,
    tied_positions,
)


def _value(v: Any) -> Any:
    if isinstance(v, float):
        return ("float", repr(v), math.copysign(1.0, v) < 0)
    return (type(v).__name__, v)


def signature(root: Node, *, numpy_as_tensor: bool = False, hash_tensors: bool = False) -> Any:
    """Everything about a tree as comparable data; tensor bytes only with ``hash_tensors``."""
    return _signature(root, (), tied_positions(root), numpy_as_tensor, hash_tensors)


def _signature(
    n: Node, path: tuple, tied: dict[int, LeafRef], numpy_as_tensor: bool, hash_tensors: bool
) -> Any:
    # (a module function: a nested one calling itself holds itself, see ``tree.map_leaves``)
    rest = (tied, numpy_as_tensor, hash_tensors)
    if isinstance(n, DictNode):
        items = [(type(k).__name__, k, _signature(v, (*path, k), *rest)) for k, v in n.items]
        return ("dict", n.ordered, items)
    if isinstance(n, (SeqNode, NamedTupleNode)):
        subs = [_signature(v, (*path, i), *rest) for i, v in enumerate(n.items)]
        return (n.kind, subs) if isinstance(n, SeqNode) else ("namedtuple", n.name, subs)
    return _leaf_signature(n, path, *rest)


def same_signature(
    a: Node, b: Node, *, numpy_as_tensor: bool = False, b_ties: dict[int, LeafRef] | None = None
) -> bool:
    """``signature(a) == signature(b)``, compared while the two trees are walked: neither
    signature is built (at 188k leaves each was about 50 MB beside the trees, issue 33).
    ``b_ties``: ``tied_positions(b)``, where the caller has it."""
    b_ties = tied_positions(b) if b_ties is None else b_ties
    return _same(a, b, tied_positions(a), b_ties, numpy_as_tensor)


def _same(
    a: Node, b: Node, a_ties: dict[int, LeafRef], b_ties: dict[int, LeafRef], loose: bool
) -> bool:
    """The walk of ``same_signature``, the two trees side by side: each container is compared
    by its kind, its length and its keys as ``signature`` has them, each pair of leaves by its
    signature, unless it is one leaf, tied in neither tree (the read-back of a check gives the
    expected tree's own leaves where they are alike: the comparison of the deep 12 GB shape's
    check 16 -> 11 ms, of 7,646 leaves, issue 33). A stack of each open pair of containers'
    remaining children, taken one at a time: as deep as the trees, not as wide (every key of a
    150k-item dict pushed at once held about 90 B a leaf for each tree, issue 33)."""
    stack: list[Iterator[tuple[Node, Node, tuple]]] = [iter(((a, b, ()),))]
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
            continue
        x, y, path = entry
        if isinstance(x, DictNode):
            if not isinstance(y, DictNode) or x.ordered != y.ordered:
                return False
            if len(x.items) != len(y.items) or any(
                (type(kx).__name__, kx) != (type(ky).__name__, ky)
                for (kx, _), (ky, _) in zip(x.items, y.items, strict=True)
            ):
                return False
            stack.append(_dict_pairs(x.items, y.items, path))
        elif isinstance(x, (SeqNode, NamedTupleNode)):
            if _container_token(x) != _container_token(y):
                return False
            stack.append(_seq_pairs(x.items, y.items, path))  # type: ignore[union-attr]
        elif isinstance(y, (DictNode, SeqNode, NamedTupleNode)):
            return False
        elif x is y and id(x) not in a_ties and id(x) not in b_ties:
            continue
        elif _leaf_signature(x, path, a_ties, loose, False) != _leaf_signature(
            y, path, b_ties, loose, False
        ):
            return False
    return True


def _container_token(n: Node) -> tuple | None:
    """A sequence's or named tuple's kind and length, as ``signature`` tells them apart."""
    if isinstance(n, SeqNode):
        return (n.kind, len(n.items))
    if isinstance(n, NamedTupleNode):
        return ("namedtuple", n.name, len(n.items))
    return None


def _seq_pairs(xs: list, ys: list, path: tuple) -> Iterator[tuple[Node, Node, tuple]]:
    """Two sequences' children side by side, each pair with its path. (A generator expression
    there read ``path`` as the loop had last set it, each child's path its elder sibling's
    plus its index: quadratic in a long list, and a tie first placed after a list's first
    item was taken for a later place, its dtype and shape not compared.)"""
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        yield x, y, (*path, i)


def _dict_pairs(xs: list, ys: list, path: tuple) -> Iterator[tuple[Node, Node, tuple]]:
    """Two dicts' values side by side (their keys compared before), each pair with its path."""
    for (k, x), (_, y) in zip(xs, ys, strict=True):
        yield x, y, (*path, k)


def _leaf_signature(
    n: Node, path: tuple, tied: dict[int, LeafRef], numpy_as_tensor: bool, hash_tensors: bool
) -> Any:
    first = tied.get(id(n))
    if first is not None and first.path != path:
        return ("tied", first.name)
    if isinstance(n, TensorLeaf):
        data = tensor_sha256(n) if hash_tensors else None
        return ("tensor", n.dtype, n.shape, n.numpy and not numpy_as_tensor, data)
    if isinstance(n, ValueLeaf):
        return ("value", _value(n.value))
    if isinstance(n, MissingLeaf):
        return ("missing", n.name)
    if isinstance(n, FullTensorLeaf):
        return ("full", n.dtype, n.shape, _value(n.fill_value))
    if isinstance(n, OpaqueLeaf):
        return ("opaque", hashlib.sha256(n.payload).hexdigest())
    assert isinstance(n, ExternalLeaf)
    return ("external", n.kind)


def tensor_sha256(leaf: TensorLeaf) -> str:
    """sha256 of the tensor's raw little-endian bytes, read in bounded slabs (a tensor of one
    slab or less in one read by HDF5 straight into an array, ``read_whole``: h5py's
    ``Dataset`` and its reader took a fifth of a 12k-tensor ``verify``)."""
    src = leaf.data
    storage = dtypes.by_name(leaf.dtype).storage
    if isinstance(src, H5Data):
        dsid = src.handle.dataset_id(src.name)
        whole = read_whole(dsid, src.handle.path, src.name, max_bytes=COPY_BLOCK_BYTES)
        if whole is None:
            return dataset_sha256(src.handle.dataset(src.name), leaf.dtype)
        return hashlib.sha256(_le_bytes(whole, storage)).hexdigest()
    return hashlib.sha256(_le_bytes(np.ascontiguousarray(src.read()), storage)).hexdigest()


def dataset_sha256(ds: h5py.Dataset, dtype: str) -> str:
    """``tensor_sha256`` of a dataset holding a tensor of torch dtype ``dtype``."""
    h = hashlib.sha256()
    storage = dtypes.by_name(dtype).storage
    for sl in iter_slabs(tuple(ds.shape), storage.itemsize):
        h.update(_le_bytes(np.ascontiguousarray(read_slab(ds, sl)), storage))
    return h.hexdigest()


def _le_bytes(block: np.ndarray, storage: np.dtype) -> bytes | memoryview:
    if block.dtype.byteorder == ">":
        block = block.astype(block.dtype.newbyteorder("<"))
    if storage.kind == "b":
        block = block.astype(np.uint8)
    return memoryview(np.ascontiguousarray(block).reshape(-1).view(np.uint8))  # 0 in shape too


@dataclass
class Difference:
    name: str
    what: str

    def __str__(self) -> str:
        return f"{self.name}: {self.what}"


class Comparison(NamedTuple):
    differences: list[Difference]
    tensors: int  # compared
    stored: int  # of them, found equal by their stored bytes, neither decoded


def compare_trees(
    a: Node,
    b: Node,
    *,
    allclose: bool = False,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    progress: Callable[[str, int, int], None] | None = None,
    stored: StoredAlike | None = None,
) -> Comparison:
    """Leaf-by-leaf comparison of two checkpoints (tensors by value with allclose; else by their
    stored bytes where both files store a tensor alike, ``h5.stored``, and by hash otherwise).
    ``stored``: what tells two tensors stored alike with the same bytes (``StoredAlike``;
    by default through HDF5, each tensor's chunks checked first).

    Returns the differences and the number of tensors compared, and of those found equal
    by their stored bytes. ``progress`` hears of the first checkpoint's tensor bytes compared
    so far (phase ``verify``).

    Two tensors stored alike (type, shape, filters, the same chunks listed, the whole grid)
    with the same stored bytes decode to the same values, so neither is decoded: an upgrade's
    output is stored as its source is (its datasets the source's, or their chunks copied as
    stored), and decoding and hashing both files was most of a 12k-tensor ``verify`` (issue
    33). Stored bytes that differ are not a difference yet: another LZ4 writer stores the same
    values otherwise, so then both are decoded and hashed.

    The two trees are walked side by side while they name the same leaves in the same order
    (an upgrade's output and its source, a file and its copy), each place with its peer, and
    nothing is kept (a dict of the second's 188k leaves by name was 8 MiB of ``verify``'s
    peak, issue 33). From the first place where they part, the second's leaves from there on
    are kept by name (None once its name is seen in the first) and the first's walked, not
    kept (``_parted``): there a name a tree gives twice is compared once.
    A tie of plain values (an int, a str) is no difference: a value has no identity a load
    could show, and the real library's writer ties every position of one interned object (the
    ``1`` of a list and of a dict, in its 2.10 ``nested.mdl``), which no copy through torch
    or ``save`` keeps. A tie is known by the tied leaves' first positions alone (issue 33:
    with a dict of each tree's positions and a first position for every leaf, ``verify``'s
    peak at 188k leaves was 654 MiB, now 475).
    """
    ta, tb = tied_positions(a), tied_positions(b)
    total = sum(ref.leaf.nbytes for ref in iter_leaves(a) if isinstance(ref.leaf, TensorLeaf))
    diffs: list[Difference] = []
    compared = done = 0
    same_bytes = ThroughHDF5() if stored is None else stored

    def pair(name: str, x: Leaf, y: Leaf) -> None:
        nonlocal compared, done
        if progress is not None and isinstance(x, TensorLeaf):
            progress("verify", done, total)
            done += x.nbytes
        tx = ta[id(x)].name if id(x) in ta else name
        ty = tb[id(y)].name if id(y) in tb else name
        tie_differs = (tx != name) != (ty != name) or (tx != name and tx != ty)
        if tie_differs and not isinstance(x, ValueLeaf) and not isinstance(y, ValueLeaf):
            diffs.append(Difference(name, f"tied to {tx!r} vs {ty!r}"))
        if isinstance(x, TensorLeaf) and isinstance(y, TensorLeaf):
            compared += 1
            what = _tensor_difference(x, y, same_bytes, allclose, rtol, atol)
        else:
            what = _value_difference(x, y)
        if what is not None:
            diffs.append(Difference(name, what))

    with contextlib.closing(same_bytes):
        side_by_side = 0
        for ra, rb in itertools.zip_longest(iter_leaves(a), iter_leaves(b)):
            if ra is None or rb is None or ra.name != rb.name:
                break
            pair(ra.name, ra.leaf, rb.leaf)
            side_by_side += 1
        else:
            side_by_side = -1  # (every place walked side by side)
        if side_by_side >= 0:
            lb, again = _parted(a, b, side_by_side)
            for ref in itertools.islice(iter_leaves(a), side_by_side, None):
                name, x = ref.name, ref.leaf
                y = lb.get(name, _ABSENT)
                if y is None or name in again:  # a name seen in the first already: once
                    continue
                lb[name] = None
                if y is _ABSENT:
                    diffs.append(Difference(name, "only in the first"))
                    if isinstance(x, TensorLeaf):
                        done += x.nbytes
                    continue
                pair(name, x, y)
            diffs.extend(
                Difference(n, "only in the second") for n, y in lb.items() if y is not None
            )
    if progress is not None:
        progress("verify", done, total)
    once = {(d.name, d.what): d for d in diffs}  # (a name given twice by both, side by side)
    return Comparison(sorted(once.values(), key=lambda d: d.name), compared, same_bytes.matched)


_ABSENT = ValueLeaf("a name the second tree lacks")


def _parted(a: Node, b: Node, k: int) -> tuple[dict[str, Leaf | None], AbstractSet[str]]:
    """Where two trees part after ``k`` places walked side by side: the second's leaves from
    there on by name (the last of a name), None for a name of the first ``k`` places (compared
    there), and the set of those names that the rest of the first tree may give again. The
    smaller side is kept by name: the first ``k`` places' names, or the rest of the first
    tree's. Where only the end differs (an upgrade's output: its provenance leaves) neither
    tree is indexed whole (the second's 188k leaves by name were 10 MiB of ``verify``'s peak,
    issue 33)."""
    lb: dict[str, Leaf | None] = {r.name: r.leaf for r in itertools.islice(iter_leaves(b), k, None)}
    if k <= len(lb):
        again: AbstractSet[str] = {r.name for r in itertools.islice(iter_leaves(a), k)}
    else:
        rest = {r.name for r in itertools.islice(iter_leaves(a), k, None)}
        again = {
            r.name for r in itertools.islice(iter_leaves(a), k) if r.name in lb or r.name in rest
        }
    for name in lb:
        if name in again:
            lb[name] = None
    return lb, again


class StoredAlike(Protocol):
    """Whether two tensors are stored alike with the same stored bytes (``equal``), and how
    many were (``matched``); ``close`` lets go of what it opened."""

    @property
    def matched(self) -> int: ...

    def equal(self, x: TensorLeaf, y: TensorLeaf) -> bool: ...

    def close(self) -> None: ...


def _tensor_difference(
    x: TensorLeaf, y: TensorLeaf, same_bytes: StoredAlike, allclose: bool, rtol: float, atol: float
) -> str | None:
    """What differs between two tensors, None if nothing: by value (``allclose``), else by
    their stored bytes where both files store them alike, else by their data's hash."""
    if (x.dtype, x.shape) != (y.dtype, y.shape):
        return f"{x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
    if allclose:
        return None if _allclose(x, y, rtol, atol) else "values differ beyond tolerance"
    if same_bytes.equal(x, y) or tensor_sha256(x) == tensor_sha256(y):
        return None
    return "tensor data differs"


def _value_difference(x: Leaf, y: Leaf) -> str | None:
    """How two leaves differ, as ``inspect`` shows each (``'2.4.0' vs '2.5.0'``), or in full
    where those read alike (two pickled objects of one size)."""
    one = signature(DictNode([("x", x)]))[2][0][2]
    two = signature(DictNode([("x", y)]))[2][0][2]
    if one == two:
        return None
    shown = describe_leaf(x), describe_leaf(y)
    return f"{shown[0]} vs {shown[1]}" if shown[0] != shown[1] else f"{one} vs {two}"


class ThroughHDF5:
    """``StoredAlike`` through HDF5: each dataset opened, the first's chunks checked."""

    def __init__(self) -> None:
        self.same_bytes = SameBytes()

    @property
    def matched(self) -> int:
        return self.same_bytes.matched

    def equal(self, x: TensorLeaf, y: TensorLeaf) -> bool:
        """Whether both tensors are datasets stored alike with the same stored bytes. The
        first's chunks are checked first, as its decoding would check them (``h5.chunks``): a
        damaged chunk is an error here too, not a match with a copy of it (the second's,
        listed alike, hold the same bytes)."""
        a, b = x.data, y.data
        if not isinstance(a, H5Data) or not isinstance(b, H5Data):
            return False
        one, two = a.handle.dataset_id(a.name), b.handle.dataset_id(b.name)
        check_whole(one, a.handle.path, a.name)
        return bool(self.same_bytes.equal(one, a.handle.path, two, b.handle.path))

    def close(self) -> None:
        self.same_bytes.close()


def _allclose(x: TensorLeaf, y: TensorLeaf, rtol: float, atol: float) -> bool:
    def as_float(leaf: TensorLeaf, block: np.ndarray) -> np.ndarray:
        if leaf.dtype == "bfloat16":
            return (block.astype("<i2").view("<u2").astype("<u4") << 16).view("<f4")
        return block.astype(np.float64) if block.dtype.kind in "fiub" else block

    if not isinstance(x.data, H5Data) or not isinstance(y.data, H5Data):
        a, b = as_float(x, x.data.read()), as_float(y, y.data.read())
        return bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))
    dx = x.data.handle.dataset(x.data.name)
    dy = y.data.handle.dataset(y.data.name)
    itemsize = dtypes.by_name(x.dtype).storage.itemsize
    for sl in iter_slabs(tuple(x.shape), itemsize):
        a = as_float(x, np.asarray(read_slab(dx, sl)))
        b = as_float(y, np.asarray(read_slab(dy, sl)))
        if not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            return False
    return True


def missing_as_none(root: Node) -> Node:
    """Format 0.5 writes missing leaves as None; compare them as such. ``root`` itself where
    it has none (most trees: a copy of 150k leaves' containers is 36 MB)."""
    if not any(isinstance(ref.leaf, MissingLeaf) for ref in iter_leaves(root)):
        return root
    return map_leaves(
        root, lambda r: ValueLeaf(None) if isinstance(r.leaf, MissingLeaf) else r.leaf
    )


def check_written(
    path: Path,
    expected: Node,
    release: Release,
    *,
    tensors_proven: bool = False,
    ties: dict[int, LeafRef] | None = None,
    progress: Progress | None = None,
) -> None:
    """Re-read ``path`` and compare its signature with ``expected`` (raises VerificationError).

    What the format cannot tell apart is compared as it reads back: 0.5 writes missing leaves as
    None, and 0.1–0.3 store numpy arrays like tensors. ``tensors_proven``: the caller proves
    every tensor's dataset itself (by address or hash), so 0.5 tensors are read back from
    their metadata alone (``read_checkpoint``). ``ties``: ``tied_positions(expected)``, where
    the caller has it. ``progress``: the read's (``read root``).
    """
    want = expected if release.legacy else missing_as_none(expected)
    ties = tied_positions(want) if ties is None or want is not expected else ties
    loose = release.format < 0.4
    alike = _Alike(want, loose, ties)
    with read_checkpoint(
        path, isolate=False, tensors_proven=tensors_proven, alike=alike, progress=progress
    ) as back:
        if not same_signature(back.root, want, numpy_as_tensor=loose, b_ties=ties):
            raise VerificationError(path, "the written file does not hold the expected tree")


class _Alike:
    """A leaf read back at the place ``want`` holds a leaf of the same signature, given back as
    ``want``'s own: the read-back then holds one tree's leaves, not two (a tensor, its data's
    handle and its name, 29 MB at 150k leaves, issue 33). Called in flatten order, each call
    takes ``want``'s next place; a name out of step is kept as read, and the comparison that
    follows finds the difference. A tied leaf is given back at its first place only: a later
    place is as the file's link makes it, the same leaf, or not."""

    def __init__(self, want: Node, numpy_as_tensor: bool, tied: dict[int, LeafRef]) -> None:
        self.places = iter_leaves(want)
        self.tied = tied
        self.numpy_as_tensor = numpy_as_tensor

    def __call__(self, name: str, leaf: Leaf) -> Leaf:
        ref = next(self.places, None)
        if ref is None or ref.name != name:
            return leaf
        first = self.tied.get(id(ref.leaf))
        if first is not None and first.path != ref.path:
            return leaf
        args = (ref.path, {}, self.numpy_as_tensor, False)
        same = _leaf_signature(leaf, *args) == _leaf_signature(ref.leaf, *args)
        return ref.leaf if same else leaf
