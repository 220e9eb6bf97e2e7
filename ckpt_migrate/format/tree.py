"""The neutral checkpoint tree: what every reader produces and every writer consumes.

Containers mirror torch pytree nodes (FORMAT.md §2.1). Leaves are immutable; a tie (one tensor
under two names, a hard-linked dataset, a 0.5 ``LinkedObject``) is the *same leaf object* standing
at two places, exactly as Python state dicts express it. Steps that change a value put a new leaf
in place instead of mutating one, so a tied partner is never changed by accident.

Leaf names follow ``recurse_spec`` (FORMAT.md §2.2): keys joined with ``.``, ``str(key)`` for dict
keys, positions for sequences and namedtuples, and no name at all for an empty container.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Literal

import numpy as np

from ckpt_migrate.format.dtypes import itemsize

Key = str | int


# --------------------------------------------------------------------------- containers


@dataclass(eq=False, slots=True)
class DictNode:
    items: list[tuple[Key, Node]] = field(default_factory=list)
    ordered: bool = False  # collections.OrderedDict rather than dict
    # A legacy spec class read as a dict: "TensorScalarDict" (1.7-era cerebras_pytorch), which
    # releases 2.0+ cannot unpickle. Only legacy specs record it; the 1.9→2.0 spec fix clears it.
    origin: str | None = None

    def keys(self) -> list[Key]:
        return [k for k, _ in self.items]

    def get(self, key: Key) -> Node | None:
        for k, v in self.items:
            if k == key and type(k) is type(key):
                return v
        return None

    def set(self, key: Key, value: Node) -> None:
        for i, (k, _) in enumerate(self.items):
            if k == key and type(k) is type(key):
                self.items[i] = (k, value)
                return
        self.items.append((key, value))

    def pop(self, key: Key) -> Node | None:
        for i, (k, v) in enumerate(self.items):
            if k == key and type(k) is type(key):
                del self.items[i]
                return v
        return None


@dataclass(eq=False, slots=True)
class SeqNode:
    kind: Literal["list", "tuple", "set"]
    items: list[Node] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class NamedTupleNode:
    """A namedtuple: only its class name and field names are kept, never the class itself."""

    name: str
    fields: tuple[str, ...]
    items: list[Node] = field(default_factory=list)


Container = DictNode | SeqNode | NamedTupleNode


# --------------------------------------------------------------------------- tensor data


class DataSource:
    """Where a tensor's bytes are. ``read()`` returns the array in its *storage* dtype."""

    __slots__ = ()  # (150k tensors' sources: no dictionary each)

    def read(self) -> np.ndarray:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, eq=False, slots=True)
class MemoryData(DataSource):
    array: np.ndarray

    def read(self) -> np.ndarray:
        return self.array

    def describe(self) -> str:
        return "in memory"


@dataclass(eq=False, slots=True)
class H5Data(DataSource):
    """A dataset in an HDF5 file, opened through a shared handle only when data is asked for."""

    handle: Any  # ckpt_migrate.format.h5.io.H5Handle
    name: str  # the dataset's path inside the file

    def read(self) -> np.ndarray:
        return self.handle.read_dataset(self.name)

    def describe(self) -> str:
        return f"{self.handle.path}:{self.name}"


# --------------------------------------------------------------------------- leaves


@dataclass(frozen=True, eq=False, slots=True)
class TensorLeaf:
    """A torch tensor, or a numpy array when ``numpy`` is true. No data is read until asked for."""

    dtype: str  # torch dtype name without "torch.", e.g. "float32", "bfloat16"
    shape: tuple[int, ...]
    data: DataSource
    numpy: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.dtype)


@dataclass(frozen=True, eq=False, slots=True)
class FullTensorLeaf:
    """A constant tensor (``DeferredFullTensor``): shape, dtype and one fill value, no data."""

    dtype: str
    shape: tuple[int, ...]
    fill_value: bool | int | float | None  # None: uninitialised


@dataclass(frozen=True, eq=False, slots=True)
class ValueLeaf:
    """A Python None, bool, int (any size), float (incl. nan, inf, -0.0) or str."""

    value: bool | int | float | str | None


@dataclass(frozen=True, eq=False, slots=True)
class OpaqueLeaf:
    """A pickled object, kept as its bytes: never unpickled unless the caller opts in."""

    payload: bytes
    type_hint: str = ""  # what the file says it is, if anything


@dataclass(frozen=True, eq=False, slots=True)
class MissingLeaf:
    """The spec names this leaf but the file has no data (1.x tied weights, crashed saves)."""

    name: str


@dataclass(frozen=True, eq=False, slots=True)
class ExternalLeaf:
    """A reference to data outside this file (another checkpoint, a raw file, a graph).

    Never followed unless the caller opts in; ``info`` holds what the file says about it.
    """

    kind: str
    info: dict[str, Any]


Leaf = TensorLeaf | FullTensorLeaf | ValueLeaf | OpaqueLeaf | MissingLeaf | ExternalLeaf
Node = DictNode | SeqNode | NamedTupleNode | Leaf
LEAF_TYPES = (TensorLeaf, FullTensorLeaf, ValueLeaf, OpaqueLeaf, MissingLeaf, ExternalLeaf)
CONTAINER_TYPES = (DictNode, SeqNode, NamedTupleNode)


def is_leaf(node: Node) -> bool:
    return isinstance(node, LEAF_TYPES)


def contains(node: Node, kind: type | tuple[type, ...]) -> bool:
    """Whether ``node`` or anything below it is an instance of ``kind``."""
    stack = [node]  # (a stack, not a generator per container: 0.06 s at 188k leaves)
    while stack:
        node = stack.pop()
        if isinstance(node, kind):
            return True
        if isinstance(node, DictNode):
            stack.extend(value for _, value in node.items)
        elif isinstance(node, (SeqNode, NamedTupleNode)):
            stack.extend(node.items)
    return False


def children(node: Container) -> list[tuple[Key, Node]]:
    """(key, child) pairs: dict keys, or positions for sequences and namedtuples."""
    if isinstance(node, DictNode):
        return list(node.items)
    return list(enumerate(node.items))


# --------------------------------------------------------------------------- walking and names


@dataclass(frozen=True, slots=True)
class LeafRef:
    name: str  # dotted leaf name (recurse_spec)
    path: tuple[Key, ...]  # keys from the root
    leaf: Leaf


def iter_leaves(root: Node) -> Iterator[LeafRef]:
    """Every leaf position in flatten order (a tied leaf is yielded once per position).

    With a stack of the containers entered rather than a generator per level (which passes
    each leaf up through every level above it), and names built from their parent's."""
    if is_leaf(root):
        yield LeafRef("", (), root)  # type: ignore[arg-type]
        return
    stack = [(iter(children(root)), (), "")]  # type: ignore[arg-type]
    while stack:
        entries, path, name = stack[-1]
        for key, child in entries:
            at: tuple[Key, ...] = (*path, key)
            child_name = f"{name}.{key!s}" if path else str(key)
            if isinstance(child, LEAF_TYPES):
                yield LeafRef(child_name, at, child)
            else:
                stack.append((iter(children(child)), at, child_name))  # type: ignore[arg-type]
                break
        else:
            stack.pop()


def named_leaves(root: Node) -> Iterator[tuple[str, Leaf]]:
    """``iter_leaves``' names and leaves, in its order, without the paths and references it
    builds: for a question of the names alone (0.2 s of a walk at 188k leaves, issue 33)."""
    if is_leaf(root):
        yield "", root  # type: ignore[misc]
        return
    stack = [(iter(children(root)), "")]  # type: ignore[arg-type]
    while stack:
        entries, name = stack[-1]
        for key, child in entries:
            child_name = f"{name}.{key!s}" if len(stack) > 1 else str(key)
            if isinstance(child, LEAF_TYPES):
                yield child_name, child
            else:
                stack.append((iter(children(child)), child_name))  # type: ignore[arg-type]
                break
        else:
            stack.pop()


def leaf_objects(root: Node) -> Iterator[Leaf]:
    """Every leaf position's leaf, in ``iter_leaves``' (flatten) order, without its name (a
    tied leaf once per position): for a question of the leaves alone, a walk that does not
    build 188k names and paths (issue 33)."""
    if is_leaf(root):
        yield root  # type: ignore[misc]
        return
    stack = [_values(root)]  # type: ignore[arg-type]
    while stack:
        for child in stack[-1]:
            if isinstance(child, LEAF_TYPES):
                yield child
            else:
                stack.append(_values(child))  # type: ignore[arg-type]
                break
        else:
            stack.pop()


def _values(node: Container) -> Iterator[Node]:
    """A container's children, without their keys."""
    return map(itemgetter(1), node.items) if type(node) is DictNode else iter(node.items)


def first_positions(root: Node) -> dict[int, LeafRef]:
    """For each distinct leaf object, its first position: the target of every later tie."""
    seen: dict[int, LeafRef] = {}
    for ref in iter_leaves(root):
        seen.setdefault(id(ref.leaf), ref)
    return seen


def tied_positions(root: Node) -> dict[int, LeafRef]:
    """``first_positions`` of the leaves found at more than one position (a tie) only: what an
    outline or a report needs to say "tied to", without a position kept for each of 188k
    leaves (issue 33)."""
    seen: set[int] = set()
    tied: set[int] = set()
    for leaf in leaf_objects(root):
        if id(leaf) in seen:
            tied.add(id(leaf))
        else:
            seen.add(id(leaf))
    del seen
    firsts: dict[int, LeafRef] = {}
    if tied:
        for ref in iter_leaves(root):
            if id(ref.leaf) in tied:
                firsts.setdefault(id(ref.leaf), ref)
    return firsts


def name_collisions(root: Node) -> dict[str, list[tuple[Key, ...]]]:
    """Names more than one position would get (``"a.b"`` vs ``a -> b``, ``1`` vs ``"1"``)."""
    names: set[str] = set()
    for ref in iter_leaves(root):  # (most trees have none: no list of paths per name)
        if ref.name in names:
            break
        names.add(ref.name)
    else:
        return {}
    names.clear()
    by_name: dict[str, list[tuple[Key, ...]]] = {}
    for ref in iter_leaves(root):
        by_name.setdefault(ref.name, []).append(ref.path)
    return {n: paths for n, paths in by_name.items() if len(paths) > 1}


def format_path(path: tuple[Key, ...]) -> str:
    return "".join(f"[{k!r}]" for k in path) or "<root>"


def get_path(root: Node, path: tuple[Key, ...]) -> Node:
    node = root
    for key in path:
        if isinstance(node, DictNode):
            child = node.get(key)
            if child is None:
                raise KeyError(format_path(path))
            node = child
        elif isinstance(node, (SeqNode, NamedTupleNode)):
            node = node.items[int(key)]
        else:
            raise KeyError(format_path(path))
    return node


def set_path(root: Node, path: tuple[Key, ...], value: Node) -> None:
    if not path:
        raise ValueError("cannot replace the root")
    parent = get_path(root, path[:-1])
    key = path[-1]
    if isinstance(parent, DictNode):
        parent.set(key, value)
    elif isinstance(parent, (SeqNode, NamedTupleNode)):
        parent.items[int(key)] = value
    else:
        raise KeyError(format_path(path))


def map_leaves(root: Node, fn: Callable[[LeafRef], Leaf], *, in_place: bool = False) -> Node:
    """A new tree with ``fn`` applied to every distinct leaf once; ties stay ties.
    ``in_place``: ``root``'s own containers take the new leaves, a container's old entries let
    go as soon as it is done (a tree just decoded, which nobody else holds: at 150k leaves its
    copy held 25 MB more at once)."""
    return _mapped(root, (), "", fn, {}, in_place)


def _mapped(
    node: Node,
    path: tuple[Key, ...],
    name: str,
    fn: Callable[[LeafRef], Leaf],
    done: dict,
    in_place: bool,
) -> Node:
    # (a module function, not one nested in ``map_leaves``: a nested one calling itself holds
    # itself, a cycle that kept ``fn``'s closure, a reader's facts of every dataset, until a
    # full collection, which ``cli.run``'s thresholds leave for the exit: 170 MB at 150k)
    if is_leaf(node):
        if id(node) not in done:
            done[id(node)] = fn(LeafRef(name, path, node))  # type: ignore[arg-type]
        return done[id(node)]
    prefix = f"{name}." if path else ""
    items: list[Any]
    if isinstance(node, DictNode):
        items = [
            (k, _mapped(v, (*path, k), f"{prefix}{k!s}", fn, done, in_place)) for k, v in node.items
        ]
    else:
        items = [
            _mapped(v, (*path, i), f"{prefix}{i}", fn, done, in_place)
            for i, v in enumerate(node.items)
        ]
    if in_place:
        node.items[:] = items
        return node
    if isinstance(node, DictNode):
        return DictNode(items, node.ordered, node.origin)
    if isinstance(node, SeqNode):
        return SeqNode(node.kind, items)
    assert isinstance(node, NamedTupleNode)
    return NamedTupleNode(node.name, node.fields, items)


def fill_missing(root: Node, fn: Callable[[str], Leaf]) -> Node:
    """``root`` with every ``MissingLeaf`` replaced by ``fn`` of its name, in place and in
    flatten order: a parsed spec's leaves decoded without building a second tree (``map_leaves``
    held two trees of 188k leaves at once, issue 33)."""
    if isinstance(root, MissingLeaf):
        return fn(root.name)
    if isinstance(root, DictNode):
        entries = root.items
        for i, (key, value) in enumerate(entries):
            if isinstance(value, MissingLeaf):
                entries[i] = (key, fn(value.name))
            elif not isinstance(value, LEAF_TYPES):
                fill_missing(value, fn)
    elif isinstance(root, (SeqNode, NamedTupleNode)):
        kids = root.items
        for i, value in enumerate(kids):
            if isinstance(value, MissingLeaf):
                kids[i] = fn(value.name)
            elif not isinstance(value, LEAF_TYPES):
                fill_missing(value, fn)
    return root


def plain_dicts(node: Node) -> Node:
    """A copy of the containers with every legacy ``origin`` (TensorScalarDict) dropped."""
    if isinstance(node, DictNode):
        return DictNode([(k, plain_dicts(v)) for k, v in node.items], node.ordered)
    if isinstance(node, SeqNode):
        return SeqNode(node.kind, [plain_dicts(v) for v in node.items])
    if isinstance(node, NamedTupleNode):
        return NamedTupleNode(node.name, node.fields, [plain_dicts(v) for v in node.items])
    return node


def structure_equal(a: Node, b: Node) -> bool:
    """Same containers, keys (with their types) and leaf kinds; leaf values are not compared."""
    if type(a) is not type(b):
        return False
    if isinstance(a, DictNode):
        assert isinstance(b, DictNode)
        if a.ordered != b.ordered or len(a.items) != len(b.items):
            return False
        return all(
            type(ka) is type(kb) and ka == kb and structure_equal(va, vb)
            for (ka, va), (kb, vb) in zip(a.items, b.items)
        )
    if isinstance(a, SeqNode):
        assert isinstance(b, SeqNode)
        return (
            a.kind == b.kind
            and len(a.items) == len(b.items)
            and all(structure_equal(x, y) for x, y in zip(a.items, b.items))
        )
    if isinstance(a, NamedTupleNode):
        assert isinstance(b, NamedTupleNode)
        return (a.name, a.fields, len(a.items)) == (b.name, b.fields, len(b.items)) and all(
            structure_equal(x, y) for x, y in zip(a.items, b.items)
        )
    return True


def int_value(leaf: Node | None) -> int | None:
    """An integer leaf's value (a Python int, or a 0-d integer tensor, read); else None."""
    if isinstance(leaf, ValueLeaf) and type(leaf.value) is int:
        return leaf.value
    if isinstance(leaf, TensorLeaf) and leaf.shape == () and leaf.dtype.startswith(("int", "uint")):
        return int(leaf.data.read().reshape(()).item())
    return None
