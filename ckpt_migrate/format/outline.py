"""What ``ckpt-migrate inspect`` reports about a checkpoint, as plain data."""

from __future__ import annotations

from typing import Any

from ckpt_migrate.format.checkpoint import Checkpoint
from ckpt_migrate.format.pickled import numpy_scalar_payload
from ckpt_migrate.format.tree import (
    LEAF_TYPES,
    DictNode,
    ExternalLeaf,
    FullTensorLeaf,
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
    leaf_objects,
    named_leaves,
    tied_positions,
)


def describe_leaf(leaf: Leaf) -> str:
    if isinstance(leaf, TensorLeaf):
        kind = "ndarray" if leaf.numpy else "tensor"
        return f"{kind} {leaf.dtype}{list(leaf.shape)}"
    if isinstance(leaf, FullTensorLeaf):
        return f"full {leaf.dtype}{list(leaf.shape)} = {leaf.fill_value!r}"
    if isinstance(leaf, ValueLeaf):
        text = repr(leaf.value)
        return text if len(text) <= 60 else text[:57] + "..."
    if isinstance(leaf, OpaqueLeaf):
        number = numpy_scalar_payload(leaf.payload) if len(leaf.payload) < 256 else None
        if number is not None:
            return f"{number!r} (a pickled numpy scalar)"
        return f"pickled object ({len(leaf.payload)} bytes, not unpickled)"
    if isinstance(leaf, MissingLeaf):
        return "MISSING (named by the spec, no data in the file)"
    assert isinstance(leaf, ExternalLeaf)
    return f"external reference ({leaf.kind}, not followed)"


def container_label(node: Node) -> str:
    if isinstance(node, DictNode):
        return f"{'OrderedDict' if node.ordered else 'dict'} ({len(node.items)})"
    if isinstance(node, SeqNode):
        return f"{node.kind} ({len(node.items)})"
    assert isinstance(node, NamedTupleNode)
    return f"namedtuple {node.name} ({len(node.items)})"


def outline_lines(
    root: Node,
    max_lines: int | None = None,
    *,
    max_depth: int | None = None,
    max_children: int | None = None,
    ties: dict[int, LeafRef] | None = None,
) -> list[str]:
    """An indented outline; a tie shows the name it is tied to. ``max_depth`` (the root is
    depth 0) and ``max_children`` (per container) shorten it to a summary: what is left out is
    counted on a ``…`` line. ``ties``: ``tied_positions(root)``, if the caller has it."""
    if ties is None:
        ties = tied_positions(root)
    lines: list[str] = []

    def walk(node: Node, label: str, depth: int, path: tuple) -> None:
        if max_lines is not None and len(lines) >= max_lines:
            return
        pad = "  " * depth
        if isinstance(node, (DictNode, SeqNode, NamedTupleNode)):
            lines.append(f"{pad}{label}: {container_label(node)}")
            kids = node.items if isinstance(node, DictNode) else list(enumerate(node.items))
            if max_depth is not None and depth >= max_depth:
                return
            shown = kids if max_children is None else kids[:max_children]
            for key, child in shown:
                walk(
                    child, repr(key) if isinstance(key, str) else str(key), depth + 1, (*path, key)
                )
            if len(shown) < len(kids):
                lines.append(f"{pad}  … {len(kids) - len(shown)} more")
            return
        first = ties.get(id(node))
        tie = "" if first is None or first.path == path else f"  (tied to {first.name})"
        lines.append(f"{pad}{label}: {describe_leaf(node)}{tie}")  # type: ignore[arg-type]

    walk(root, "<root>", 0, ())
    return lines


def sizes(root: Node) -> tuple[int, int, int]:
    """(the bytes of the tree's tensors, a tensor under several names (a tie) counted once:
    ``report``'s ``tensor_bytes`` without describing every leaf; how many leaves; the
    characters of their names, ``iter_leaves``' names), in one pass that builds none of the
    names, only their lengths (with the names and their paths it took 0.20 s at 188k leaves,
    issue 33)."""
    if isinstance(root, LEAF_TYPES):
        return (root.nbytes if isinstance(root, TensorLeaf) else 0), 1, 0
    distinct: dict[int, TensorLeaf] = {}
    leaves = names = 0
    stack: list[tuple[Node, int]] = [(root, 0)]  # (a container, its children's name prefix)
    while stack:
        node, prefix = stack.pop()
        items = node.items if type(node) is DictNode else enumerate(node.items)  # type: ignore[union-attr]
        for key, child in items:
            n = prefix + (len(key) if type(key) is str else len(str(key)))
            if isinstance(child, LEAF_TYPES):
                leaves, names = leaves + 1, names + n
                if isinstance(child, TensorLeaf):
                    distinct[id(child)] = child
            else:
                stack.append((child, n + 1))  # (its children's names: this one's and a dot)
    return sum(leaf.nbytes for leaf in distinct.values()), leaves, names


def report(
    ckpt: Checkpoint, *, leaves: bool = True, ties: dict[int, LeafRef] | None = None
) -> dict[str, Any]:
    """The release, the bytes by dtype and, with ``leaves``, a description of every leaf
    (``inspect --json``; a summary leaves them out: 188k of them at 150k tensors). ``ties``:
    ``tied_positions`` of the tree, if the caller has it."""
    if ties is None:
        ties = tied_positions(ckpt.root)
    if leaves:
        count, by_dtype, missing, entries = _described(ckpt.root, ties)
    else:
        count, by_dtype, missing = _totals(ckpt.root, ties)
    return {
        "path": str(ckpt.path),
        "release": ckpt.release.name if ckpt.release else None,
        "release_label": ckpt.detected.label,
        "format": ckpt.format,
        "cstorch_version": ckpt.detected.cstorch_version,
        "leaf_count": count,
        "bytes_by_dtype": by_dtype,
        "tensor_bytes": sum(d["bytes"] for d in by_dtype.values()),
        "missing": missing,
        "unreferenced_datasets": ckpt.unreferenced,
        "had_tensor_scalar_dict": ckpt.had_tensor_scalar_dict,
        "provenance": ckpt.provenance,
        **({"note": ckpt.detected.reading} if ckpt.detected.reading else {}),
        **({"leaves": entries} if leaves else {}),
    }


ByDtype = dict[str, dict[str, int]]


def _described(
    root: Node, ties: dict[int, LeafRef]
) -> tuple[int, ByDtype, list[str], list[dict[str, Any]]]:
    """``report``'s leaf count, tensors and bytes by dtype (a tie counted at its first
    position), missing leaves' names, and every leaf's entry."""
    by_dtype: ByDtype = {}
    entries: list[dict[str, Any]] = []
    missing: list[str] = []
    # (a tensor's description by its kind, dtype and shape: a few distinct ones at 150k)
    described: dict[tuple[bool, str, tuple[int, ...]], str] = {}
    count = 0
    met: set[int] = set()  # (the ties' first places passed: in flatten order, the first met)
    for name, leaf in named_leaves(root):
        count += 1
        first = ties.get(id(leaf))
        tied = first is not None and id(leaf) in met
        if first is not None:
            met.add(id(leaf))
        if type(leaf) is TensorLeaf:
            if not tied:
                d = by_dtype.setdefault(leaf.dtype, {"tensors": 0, "bytes": 0})
                d["tensors"] += 1
                d["bytes"] += leaf.nbytes
            key = (leaf.numpy, leaf.dtype, leaf.shape)
            value = described.get(key)
            if value is None:
                value = described[key] = describe_leaf(leaf)
        else:
            value = describe_leaf(leaf)
        if type(leaf) is MissingLeaf:
            missing.append(name)
        entry: dict[str, Any] = {"name": name, "value": value}
        if tied:
            entry["tied_to"] = first.name  # type: ignore[union-attr]
        entries.append(entry)
    return count, by_dtype, missing, entries


def _totals(root: Node, ties: dict[int, LeafRef]) -> tuple[int, ByDtype, list[str]]:
    """``_described``'s counts for a summary, in flatten order but with no leaf's name or
    path built (0.21 -> 0.07 s at 188k leaves, issue 33); the missing leaves' names are
    looked for only when there is one."""
    by_dtype: ByDtype = {}
    met: set[int] = set()  # (the tied tensors counted: at their first position)
    count, any_missing = 0, False
    for leaf in leaf_objects(root):
        count += 1
        kind = type(leaf)
        if kind is TensorLeaf:
            if id(leaf) in ties:
                if id(leaf) in met:
                    continue
                met.add(id(leaf))
            d = by_dtype.get(leaf.dtype)  # type: ignore[union-attr]
            if d is None:
                d = by_dtype[leaf.dtype] = {"tensors": 0, "bytes": 0}  # type: ignore[union-attr]
            d["tensors"] += 1
            d["bytes"] += leaf.nbytes  # type: ignore[union-attr]
        elif kind is MissingLeaf:
            any_missing = True
    if not any_missing:
        return count, by_dtype, []
    return count, by_dtype, [r.name for r in iter_leaves(root) if type(r.leaf) is MissingLeaf]
