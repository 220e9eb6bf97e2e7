"""A format 0.5 root's ``__spec__``, read and built as a tree: the tree every read of the
file starts from (``read``), and the one a plan of root edits needs alone (``spec_outline``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import h5py

from ckpt_migrate.errors import KeyCollisionError
from ckpt_migrate.format.h5.io import attr_text
from ckpt_migrate.format.tree import Leaf, MissingLeaf, Node, name_collisions
from ckpt_migrate.format.v05 import treespec as treespec_json


def spec_outline(f: h5py.File, path: Path) -> tuple[Node, int]:
    """The tree the root's ``__spec__`` names, each leaf a ``MissingLeaf`` (no leaf's
    metadata is read), and the spec's size: what ``plan`` needs where the hops edit only the
    root (``format.read.read_root_outline``; a read of every leaf's metadata took 1.1 of its
    2.2 s at 150k leaves, issue 33)."""
    spec = read_spec(f, path)
    root, shared = built(spec, path, MissingLeaf)
    if shared:
        refuse_collisions(root, path)
    return root, spec.nbytes


def refuse_collisions(root: Node, path: Path) -> None:
    """A tree two of whose keys have one leaf name: the writer kept one value for both."""
    collisions = name_collisions(root)
    if collisions:
        name = sorted(collisions)[0]
        raise KeyCollisionError(
            path,
            f"{len(collisions)} leaf name(s) are shared by several keys, e.g. {name!r}; "
            "the writer kept only one value for each, so the file cannot be read faithfully",
            "re-save the state dict from its source without keys whose dotted forms collide",
        )


def read_spec(f: h5py.File, path: Path) -> treespec_json.Spec:
    """The root's ``__spec__`` through h5py (five times its size in memory at once)."""
    try:
        return treespec_json.Spec.of(attr_text(f.attrs["__spec__"]), path)
    except (KeyError, TypeError):  # (as an unreadable text)
        return treespec_json.Spec(0, error=treespec_json.Spec.unreadable(path))


def built(spec: treespec_json.Spec, path: Path, leaf: Callable[[str], Leaf]) -> tuple[Node, bool]:
    """The tree of ``spec``, each leaf ``leaf`` of its name, and whether two share a name."""
    if spec.error is not None:
        raise spec.error
    decoded = treespec_json.decode(spec.treespec, path)
    spec.treespec = None
    return treespec_json.build(decoded, path, leaf)
