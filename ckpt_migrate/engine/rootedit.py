"""An upgrade that changes no dataset: the source's bytes, with its root attributes edited.

Releases 2.5-2.10 write one layout (format 0.5, FORMAT.md §4) that differs between them in the
root attribute ``__cstorch_version__`` alone; the hops between them change only root-level
values (the ``__metadata__`` list: ``hops.trainer_metadata``), which format 0.5 keeps in root
attributes (``__spec__`` and one ``<leaf>.__metadata__`` per leaf), never in a dataset. For
such a chain (``Plan.root_only``) the output is a clone of the source (or one copy of it,
``extents``) whose root attributes are edited: the structure (where it changed), the release,
the metadata of the leaves the hops added, changed or removed, and the provenance record.
Every dataset, its attributes, its chunk index and its bytes stay the source's, where they
were.

The copy-patch (``copypatch``) instead links every dataset into a new root group and rewrites
its attributes: about 0.15 ms per tensor, which made a 12k-tensor upgrade 2.4 → 2.10 cost 18
times a ``cp`` (issue 33). Here the cost is a clone and a few attribute writes, whatever the
tensor count. Whether the hops really left every dataset alone is checked on the result
(``plan_edit``), not taken from their declarations: otherwise the copy-patch runs.
"""

from __future__ import annotations

import json
import marshal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py import h5, h5a, h5g, h5o, h5p, h5s, h5t

from ckpt_migrate import heap
from ckpt_migrate.engine import extents as ext
from ckpt_migrate.engine.copypatch import Output, Written, finish, pending_provenance
from ckpt_migrate.engine.plan import Plan
from ckpt_migrate.engine.splitcopy import data_ranges
from ckpt_migrate.engine.writeback import start_writeback
from ckpt_migrate.format.checkpoint import Checkpoint
from ckpt_migrate.format.h5 import attrs as h5attrs
from ckpt_migrate.format.h5 import attrtable
from ckpt_migrate.format.h5 import root as h5root
from ckpt_migrate.format.h5.io import H5Handle
from ckpt_migrate.format.h5.rootdigest import RootDigest
from ckpt_migrate.format.h5.writing import writing
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.provenance import PROVENANCE_ATTR
from ckpt_migrate.format.releases import Release
from ckpt_migrate.format.tree import (
    H5Data,
    Leaf,
    Node,
    OpaqueLeaf,
    TensorLeaf,
    iter_leaves,
    named_leaves,
    tied_positions,
)
from ckpt_migrate.format.v05 import treespec as treespec_json
from ckpt_migrate.format.v05.write import metadata_text

STRATEGY = "root-edit"
SUCCESS = "__SUCCESS__"
# ``__spec__``'s value until ``_decide_spec`` decides it (a place in the order the attributes
# are written); ``edit_root`` refuses to write it
_UNDECIDED = b"\0 the spec is not decided"

# leaf name -> (the leaf, the name of its first place: itself unless it is a tie)
Leaves = dict[str, tuple[Leaf, str]]


@dataclass
class Snapshot:
    """The leaves of a tree by name, taken before the hops edit it (the leaf objects are kept,
    so an identity compared later is the same object's), and the first place of each tie.
    A tensor's name is its dataset's own string, not a copy: 150k of them (issue 33)."""

    leaves: dict[str, Leaf]
    firsts: dict[str, str]  # a tie's name -> the name of its first place

    def get(self, name: str) -> tuple[Leaf, str] | None:
        leaf = self.leaves.get(name)
        return None if leaf is None else (leaf, self.firsts.get(name, name))


def snapshot(root: Node) -> Snapshot:
    """``Snapshot`` of ``root``."""
    ties = tied_positions(root)
    leaves: dict[str, Leaf] = {}
    firsts: dict[str, str] = {}
    met: set[int] = set()  # (the ties' first places passed: in flatten order, the first met)
    for name, leaf in named_leaves(root):
        first = ties.get(id(leaf))
        if first is not None and id(leaf) in met:
            firsts[name] = first.name
        else:
            if first is not None:
                met.add(id(leaf))
            if isinstance(leaf, TensorLeaf) and isinstance(leaf.data, H5Data):
                name = leaf.data.name if leaf.data.name == name else name
        leaves[name] = leaf
    return Snapshot(leaves, firsts)


@dataclass
class Edit:
    """What the output's root needs: attributes to set (name -> its text, as the UTF-8 bytes
    HDF5 stores: ``__spec__`` is 27 MB at 150k leaves, held once, issue 33), attributes to
    remove, and every tensor of ``root`` (``tensors`` of them), which stays the source's
    dataset of the same name."""

    set: dict[str, bytes]
    removed: list[str]
    root: Node | None  # (None once let go of: ``let_go``)
    tensors: int = 0
    # the leaves whose metadata is set: name -> (the leaf, the name of its first place)
    leaves: Leaves = field(default_factory=dict)
    # ``Written.linked`` of the output, made only where a check needs it (``place_all``): its
    # 150k entries were 29 MB a root edit held for nothing but their count (issue 33)
    linked: set[int] = field(default_factory=set)
    # The source's root digest without the edited pairs, once taken (``let_go``): None where
    # they cannot be taken out of it (``RootDigest.without``)
    source_digest: RootDigest | None = None
    # The source root's links (name -> address), once let go of, as ``marshal`` bytes: 5.7 MB
    # against the dictionary's 20 MiB at 150k links, read back in 0.04 s (``let_go``)
    source_links: bytes | None = None

    @property
    def let_go_of(self) -> bool:
        """Whether ``let_go`` ran (it alone lets go of the tree)."""
        return self.root is None

    @property
    def edited(self) -> set[str]:
        """The root attributes the edit writes or removes: those the check compares with
        what was written, not with the source."""
        return {*self.set, *self.removed, SUCCESS}

    def let_go(self, source: H5Handle) -> None:
        """Let go of what the edit's check (``rootverify.verify_edit``) does not need, before
        HDF5 rewrites the spec, the command's peak (issue 33: 282 MiB at 150k leaves): the tree
        (22 MiB; the caller drops its own references), the source's root digest, of which the
        check needs only the pairs not edited (9 MiB of names' hashes), and the source's links,
        kept as bytes (``source_links``). Where the check cannot read a root, the caller plans
        the edit again to read the tree back."""
        self.root = None
        digest = source.root_digest
        self.source_digest = None if digest is None else digest.without(self.edited)
        if source.knows_addresses:
            self.source_links = marshal.dumps(source.root_addresses())
        source.root_digest = None
        source.forget_addresses()

    def place_all(self) -> list[str]:
        """Fill ``linked``: every tensor at its first place, at its own name (``plan_edit``
        proved each is the source's dataset of that name); their names."""
        assert self.root is not None, "the tree was let go of (``let_go``)"
        names = []
        ties = tied_positions(self.root)
        for ref in iter_leaves(self.root):
            tie = ties.get(id(ref.leaf))
            if isinstance(ref.leaf, TensorLeaf) and (tie is None or tie.name == ref.name):
                self.linked.add(id(ref.leaf))
                names.append(ref.name)
        return names


def _has_dataset(leaf: Leaf, name: str, first: str) -> bool:
    return isinstance(leaf, (TensorLeaf, OpaqueLeaf)) and first == name


def plan_edit(before: Snapshot, ckpt: Checkpoint, root: Node, release: Release) -> Edit | None:
    """The root edit that turns the source into ``root`` as ``release`` writes it, or None
    when the hops changed a dataset after all (one added, removed, renamed or replaced, a tie
    moved to another first place), the source holds datasets no leaf names (the copy-patch
    leaves those behind; a root edit would keep them) or the source's root has no room left in
    its attributes' creation order (``h5root.tracks_order``). Whether ``__spec__`` is set is
    decided as the source is copied (``_decide_spec``)."""
    if ckpt.unreferenced:
        return None
    ties = tied_positions(root)
    edit = Edit({}, [], root)
    # The leaves of ``before`` still named (each once: ``prepare`` refused colliding names).
    kept = 0
    for name, leaf in named_leaves(root):
        tie = ties.get(id(leaf))
        first = name if tie is None else tie.name
        old = before.get(name)
        kept += old is not None
        same = old is not None and old[0] is leaf and old[1] == first
        if _has_dataset(leaf, name, first):
            if not same:
                return None
            if isinstance(leaf, TensorLeaf):
                data = leaf.data
                if not (
                    isinstance(data, H5Data) and data.handle is ckpt.handle and data.name == name
                ):
                    return None
                edit.tensors += 1
        elif not same:
            text = metadata_text(name, leaf, None if first == name else first)
            edit.set[f"{name}.__metadata__"] = _utf8(text)
            edit.leaves[name] = (leaf, first)
    if kept != len(before.leaves):  # some were removed: those with a dataset must stay
        after = {name for name, _ in named_leaves(root)}
        for name in before.leaves:
            if name not in after:
                leaf, first = before.get(name)  # type: ignore[misc]
                if _has_dataset(leaf, name, first):
                    return None
                edit.removed.append(f"{name}.__metadata__")
    edit.set["__spec__"] = _UNDECIDED  # (its place in the order they are written)
    edit.set["__cstorch_version__"] = _utf8(release.cstorch_version or f"{release.name}.0")
    # Every attribute set may be a new one, and the provenance record and __SUCCESS__ are.
    handle = ckpt.handle
    return edit if _order_room(handle.file(), handle.path, len(edit.set) + 2) else None


def _order_room(f: h5py.File, path: Path, creates: int) -> bool:
    """Whether the root of ``f`` (open on ``path``) can take ``creates`` more attributes: a
    root that tracks their creation order numbers them with 16 bits, and deleted ones keep
    their numbers taken (the next number is the root's, ``attrtable.next_creation_index``;
    else one past the last attribute's, as HDF5 finds it)."""
    root = h5g.open(f.id, b"/")  # its own flags (a copy-patched file's root is not the first)
    if not root.get_create_plist().get_attr_creation_order() & h5p.CRT_ORDER_TRACKED:
        return True
    info = h5o.get_info(root)
    if info.num_attrs == 0:
        return True
    after = None
    if info.addr == h5o.get_info(f.id).addr:  # (the one ``root_header`` reads)
        after = attrtable.next_creation_index(f, path)
    if after is None:
        last = h5a.get_info(root, index=0, index_type=h5.INDEX_CRT_ORDER, order=h5.ITER_DEC)
        after = last.corder + 1
    return after - 1 + creates < h5root.MAX_TRACKED_ATTRIBUTES


def write(
    ckpt: Checkpoint,
    edit: Edit,
    plan: Plan,
    out: Output,
    record: dict[str, Any],
    progress: Progress | None,
    check_metadata: Callable[[Written], None],
    *,
    read_back: bool = False,
    copy_method: ext.Choice = "auto",
    let_go: bool = False,
) -> Written:
    """Make ``out.tmp`` the source (a clone, else one copy: ``extents``), edit its root as
    ``edit`` says and run ``check_metadata`` on it (``copypatch.write``'s contract);
    ``let_go``: before the edit, of what its check does not need (``Edit.let_go``)."""
    entries = pending_provenance(ckpt, record)
    edit.set[PROVENANCE_ATTR] = _utf8(json.dumps(entries))
    ranges = None
    if copy_method == "sparse":  # the object store's staging: all but the data, which it shares
        names = sorted(edit.place_all())
        ranges = data_ranges(ckpt.handle.dataset(name) for name in names)
    shared = out.share(plan, copy_method, ranges)
    copier = None
    if shared is None:
        copier = out.start_copy(direct=not read_back, reserve=plan.output_bytes, choice=copy_method)
    _decide_spec(edit, ckpt.handle.root_digest)  # (while the copy runs: 0.3 s at 150k leaves)
    digest: str | None = None
    if copier is not None:
        digest = copier.finish(progress)
        written = Written(STRATEGY, plan.target_release, copy_method="copy")
        written.linked, written.bytes_own = edit.linked, plan.file_bytes
    else:
        written = shared
        written.strategy, written.linked = STRATEGY, edit.linked
        if progress is not None:
            progress("copy", plan.file_bytes, plan.file_bytes)
    written.tensors = edit.tensors
    # HDF5's rewrite of the spec is the edit's largest allocation: to free the old text it loads
    # its heap collection, read whole and copied into a block half as large again (90 MB for a
    # moment at 150k leaves), on top of what the read freed in blocks too small to be their own
    # mappings (33 MB, issue 33)
    if let_go:
        edit.let_go(ckpt.handle)
    heap.give_back_freed()
    edit_root(out.tmp, edit)
    if written.copy_method == "clone":
        start_writeback(out.tmp)
    check_metadata(written)
    finish(out.tmp, plan, written, entries, digest)
    return written


def _decide_spec(edit: Edit, digest: RootDigest | None) -> None:
    """``__spec__`` is set only where the structure changed: the source's text is known by its
    pair in the reader's digest."""
    assert edit.root is not None
    spec = treespec_json.root_spec_bytes(edit.root)
    if digest is not None and digest.holds("__spec__", spec):
        del edit.set["__spec__"]
    else:
        edit.set["__spec__"] = spec


def edit_root(path: Path, edit: Edit) -> None:
    """Apply ``edit`` to the root attributes of ``path``; ``__SUCCESS__`` is written last, as
    the real writer does (FORMAT.md §4.7): in place where the source has it (it must, to be
    read), so that no attribute is deleted but those the edit removes (a deleted attribute
    stays in a dense root's heap, which the one-pass reader of ``rootverify`` cannot tell
    from a live one)."""
    if edit.set.get("__spec__") is _UNDECIDED:
        raise RuntimeError("the root edit's __spec__ was not decided (``_decide_spec``)")
    with writing(path, h5py.File(path, "r+", locking=False)) as f:
        oid = f.id
        for name in edit.removed:
            h5a.delete(oid, name.encode())
        for name, text in edit.set.items():
            _put_text(oid, name, text)
        success = np.bool_(True)
        if h5a.exists(oid, SUCCESS.encode()):
            attr = h5a.open(oid, SUCCESS.encode())
            if attr.get_space().get_simple_extent_type() == h5s.SCALAR:
                attr.write(np.asarray(success, dtype=attr.dtype))
                return
            del attr
            h5a.delete(oid, SUCCESS.encode())
        h5attrs.create(oid, SUCCESS, success)


def _put_text(oid: h5py.h5o.ObjectID, name: str, raw: bytes) -> None:
    """Set the string attribute ``name`` to the UTF-8 text ``raw``: a variable-length string
    is rewritten in place (it keeps its place in the creation order), anything else replaced.
    HDF5 is handed ``raw`` itself (``capi``): through h5py, a copy of it (27 MB for the spec
    at 150k leaves) was made first."""
    key = name.encode()
    if h5a.exists(oid, key):
        attr = h5a.open(oid, key)
        tid = attr.get_type()
        is_text = tid.get_class() == h5t.STRING and tid.is_variable_str()
        if is_text and attr.get_space().get_simple_extent_type() == h5s.SCALAR:
            h5attrs.write_text(attr, raw)
            return
        del attr
        h5a.delete(oid, key)
    h5attrs.create_text(oid, name, raw)


def _utf8(text: str) -> bytes:
    """As h5py stores a ``str`` (strictly: it refuses a lone surrogate, which JSON escapes)."""
    return text.encode("utf-8")
