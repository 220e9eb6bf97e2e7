"""Write a neutral tree as the checkpoint format of a chosen release, atomically.

Everything the target format cannot hold is refused *before* a byte is written (colliding
leaf names, data outside the file, ...). The file is written beside the target, closed,
re-read for a structural check, fsynced and only then moved into place.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h5py

from ckpt_migrate.atomic import atomic_output
from ckpt_migrate.errors import (
    CkptError,
    KeyCollisionError,
    MissingLeavesError,
    UnsupportedContentError,
)
from ckpt_migrate.format import dtypes, releases
from ckpt_migrate.format.compare import check_written
from ckpt_migrate.format.h5 import root as h5root
from ckpt_migrate.format.h5.metadata_cache import GroupNameRoom
from ckpt_migrate.format.h5.tensor import PlaceTensor, place_tensor
from ckpt_migrate.format.h5.writing import writing
from ckpt_migrate.format.legacy import write as write_legacy
from ckpt_migrate.format.legacy.names import stored_name
from ckpt_migrate.format.outline import sizes
from ckpt_migrate.format.pickled import legacy_numpy_scalars
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.releases import Release
from ckpt_migrate.format.space import new_checkpoint_bound
from ckpt_migrate.format.tree import (
    DictNode,
    ExternalLeaf,
    FullTensorLeaf,
    Leaf,
    MissingLeaf,
    NamedTupleNode,
    Node,
    OpaqueLeaf,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
    contains,
    format_path,
    iter_leaves,
    name_collisions,
    named_leaves,
)
from ckpt_migrate.format.v05 import treespec as treespec_json
from ckpt_migrate.format.v05 import write as write_v05

BARE_FIX = "save a dict of them, e.g. {'tensor': value}"


@dataclass
class WriteReport:
    path: Path
    release: Release
    leaves: int = 0
    tensors: int = 0
    tensor_bytes: int = 0
    notes: list[str] = field(default_factory=list)


def prepare(
    root: Node, release: Release, *, allow_missing: bool = False, path: Path | None = None
) -> tuple[Node, list[str]]:
    """Check that ``release``'s format can hold ``root``; return the tree to write and notes."""
    notes: list[str] = []
    # (a bare value's one leaf is named '', which was refused as "rename the key")
    if not isinstance(root, (DictNode, SeqNode, NamedTupleNode)):
        bare = "a checkpoint holds named values, and this is one bare value"
        raise UnsupportedContentError(path, bare, BARE_FIX)
    if release.legacy:
        root = legacy_numpy_scalars(root, release.format)
    if not release.legacy and contains(root, NamedTupleNode):
        root = treespec_json.as_tuples(root)
        notes.append("namedtuples written as tuples: format 0.5 cannot name their classes")
    # One walk: the first leaf a format cannot hold is named once the names are known not to
    # collide (a collision is named first): three walks took 0.5 s at 188k leaves (issue 33).
    missing: list[str] = []
    stored: dict[str, str] = {}
    names: set[str] = set()
    collide = False
    problem: CkptError | None = None
    for name, leaf in named_leaves(root):  # (no paths built: named again if refused)
        if name in names:
            collide = True
            break
        names.add(name)
        if problem is None:
            try:
                if not name.isascii() or "\x00" in name:
                    _check_name_text(name, release, path)
                if len(name) > _LONGEST_ATTRIBUTE_NAME // 4 and not release.legacy:
                    _check_attribute_name(name, path)
                if type(leaf) is TensorLeaf and not release.legacy:
                    _check_h5_name(name, stored, path)  # (most leaves: nothing else to check)
                else:
                    _check_leaf(root, name, leaf, release, stored, missing, path)
            except CkptError as exc:
                problem = exc
    del names, stored
    if collide:
        collisions = name_collisions(root)
        name, paths = sorted(collisions.items())[0]
        where = " and ".join(format_path(p) for p in paths[:3])
        raise KeyCollisionError(
            path,
            f"{len(collisions)} leaf name(s) would collide, e.g. {name!r} from {where}; the real "
            "library would save such a file and then fail to load it",
            "rename one of the keys",
        )
    if problem is not None:
        raise problem
    if missing and not allow_missing:
        raise MissingLeavesError(
            path,
            f"{len(missing)} leaf/leaves named by the spec have no data: {', '.join(missing[:5])}"
            + (" ..." if len(missing) > 5 else ""),
            "pass allow_missing (--allow-missing) to write them as None",
        )
    if missing and not release.legacy:
        notes.append(f"{len(missing)} missing leaf/leaves written as None")
    return root, notes


def _check_dtype(name: str, dtype: str, release: Release, path: Path | None) -> None:
    """A tensor dtype ``release``'s torch lacks (``DType.since``) is refused: the file would
    be written, and the release could not load it."""
    since = dtypes.by_name(dtype).since
    if since is not None and release.version < releases.get(since).version:
        raise UnsupportedContentError(
            path,
            f"tensor {name!r} is {dtype}, which release {release.name}'s torch does not have "
            f"(releases before {since} could not load the file)",
            f"cast it to a signed dtype wide enough for its values (int32 for uint16, int64 "
            f"for uint32) with the library that wrote it, or write release {since} or later",
        )


def _check_leaf(
    root: Node,
    name: str,
    leaf: Leaf,
    release: Release,
    stored: dict[str, str],
    missing: list[str],
    path: Path | None,
) -> None:
    """Raise if ``release``'s format cannot hold ``leaf``, named ``name`` in ``root``; a
    missing leaf's name goes to ``missing``, a dataset's to ``stored`` (``_check_h5_name``)."""
    if isinstance(leaf, FullTensorLeaf) or (
        # (a numpy array stays one at 0.4; the readers of 0.1-0.3 make every array a tensor)
        isinstance(leaf, TensorLeaf) and (release.format < 0.4 or not leaf.numpy)
    ):
        _check_dtype(name, leaf.dtype, release, path)
    if isinstance(leaf, ExternalLeaf):
        raise UnsupportedContentError(
            path,
            f"leaf {name!r} is a {leaf.kind} that refers to data outside the checkpoint; "
            "ckpt-migrate does not follow such references",
            "materialize it with the tool that made it",
        )
    if isinstance(leaf, MissingLeaf):
        missing.append(name)
    text = leaf.value if isinstance(leaf, ValueLeaf) and isinstance(leaf.value, str) else ""
    if release.legacy and "\x00" in text:
        raise UnsupportedContentError(  # (h5py: "VLEN strings do not support embedded NULLs")
            path,
            f"leaf {name!r} is a string with a NUL character, which format {release.format} "
            "cannot hold",
            "write release 2.5 or newer, or remove the character",
        )
    if release.format < 0.3 and isinstance(leaf, OpaqueLeaf):
        raise UnsupportedContentError(
            path,
            f"leaf {name!r} is a pickled object, which format {release.format} cannot hold",
        )
    if not release.legacy and _has_dataset(leaf):
        _check_h5_name(name, stored, path)
    if release.legacy and name == "" and not isinstance(leaf, MissingLeaf):
        where = next(r.path for r in iter_leaves(root) if r.leaf is leaf and r.name == "")
        raise UnsupportedContentError(
            path,
            f"an empty leaf name at {format_path(where)} cannot be a dataset name in format "
            f"{release.format}",
            "write release 2.5 or newer, or rename the key",
        )
    if release.legacy and name == "." and not isinstance(leaf, MissingLeaf):
        # (quote() keeps '.', and HDF5 takes a name '.' for the group itself)
        raise UnsupportedContentError(
            path,
            f"leaf name '.' cannot be a dataset name in format {release.format}, nor in any "
            "other format",
            "rename the key",
        )


def _check_name_text(name: str, release: Release, path: Path | None) -> None:
    """Raise if HDF5 cannot name ``name``'s leaf: its names are UTF-8 (a lone surrogate has
    no encoding) and end at a NUL, which 0.5's verbatim names would cut short (0.4 quotes it)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsupportedContentError(
            path,
            f"leaf name {name!r} holds a lone surrogate, which is no Unicode character and "
            "cannot be in an HDF5 name",
            "rename the key",
        ) from None
    if "\x00" in name and not release.legacy:
        raise UnsupportedContentError(
            path,
            f"leaf name {name!r} holds a NUL character, where an HDF5 name ends; format "
            f"{release.format} names datasets by the key verbatim",
            "rename the key, or write release 2.4 or older (format 0.4 quotes names)",
        )


def _has_dataset(leaf: Leaf) -> bool:
    return isinstance(leaf, (TensorLeaf, OpaqueLeaf))


# Format 0.5 keeps each leaf's metadata in a root attribute named by the leaf; HDF5 holds an
# attribute message (name, type, shape and the text's reference) to 65,535 bytes, which leaves
# 65,521 for the name in UTF-8 (measured: one byte more and h5py raised "KeyError: Unable to
# delete attribute (bad version number for datatype message)" from the writer).
_LONGEST_ATTRIBUTE_NAME = 65_521


def _check_attribute_name(name: str, path) -> None:
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > _LONGEST_ATTRIBUTE_NAME:
        raise UnsupportedContentError(
            path,
            f"leaf name {name[:40]!r}… is {size:,} bytes long; format 0.5 names a root "
            f"attribute by each leaf, which HDF5 holds to {_LONGEST_ATTRIBUTE_NAME:,} bytes",
            "shorten the key, or write release 2.4 or older",
        )


def _check_h5_name(name: str, stored: dict[str, str], path) -> None:
    """0.5 datasets use the leaf name verbatim, so ``/`` makes groups; names must not clash."""
    if "/" not in name and name and name != ".":  # (most names: no group to make)
        if stored.get(name) == "group":
            raise KeyCollisionError(path, f"tensor {name!r} clashes with a group of the same name")
        stored[name] = "dataset"
        return
    parts = name.split("/")
    if not name or "" in parts or "." in parts:
        raise UnsupportedContentError(
            path,
            f"leaf name {name!r} cannot be an HDF5 dataset name in format 0.5",
            "rename the key",
        )
    for i in range(1, len(parts)):
        prefix = "/".join(parts[:i])
        if stored.get(prefix) == "dataset":
            raise KeyCollisionError(
                path, f"leaf {name!r} needs group {prefix!r}, which is a tensor"
            )
        stored[prefix] = "group"
    if stored.get(name) == "group":
        raise KeyCollisionError(path, f"tensor {name!r} clashes with a group of the same name")
    stored[name] = "dataset"


def write_tree(
    f: h5py.Group,
    root: Node,
    release: Release,
    extra_attrs: dict[str, str] | None = None,
    on_leaf: Callable[[str, Leaf], None] | None = None,
    place: PlaceTensor = place_tensor,
    room: GroupNameRoom | None = None,
) -> None:
    """Write an already prepared tree into ``f``, the root group to be (no checks, no atomicity).
    ``room`` is told of every link the writing adds to ``f``, before it is added, so that the
    heap of an old-style root's names stays in the metadata cache as it grows past it (issue
    33); by default the room of a root ``h5root`` made for the tree (``h5root.names_room``)."""
    extra = extra_attrs or {}
    if room is None:
        room = h5root.names_room(f.file, root_attributes(root, release, extra))
    module = write_legacy if release.legacy else write_v05
    module.write(f, root, release, extra, on_leaf, place, added=room.added)


def dataset_name(release: Release, name: str) -> str:
    """The dataset ``write_tree`` gives the tensor of leaf ``name`` (at its first place)."""
    return stored_name(name) if release.legacy else name


def root_attributes(root: Node, release: Release, extra_attrs: dict[str, str]) -> int:
    """How many attributes ``write_tree`` gives the root: a few of its own, the extra ones and,
    in format 0.5, one ``<leaf>.__metadata__`` per leaf (``h5root.tracks_order``)."""
    leaves = 0 if release.legacy else sum(1 for _ in iter_leaves(root))
    return leaves + len(extra_attrs) + 4


def resolve_release(release: str | Release | None) -> Release:
    if isinstance(release, Release):
        return release
    return releases.LATEST if release is None else releases.get(release)


def written_bound(root: Node, release: Release) -> int:
    """An upper bound of the bytes ``root`` takes written in ``release``'s format."""
    tensor_bytes, leaves, name_chars = sizes(root)
    return new_checkpoint_bound(tensor_bytes, leaves, name_chars, release.format >= 0.5)


def write_checkpoint(
    root: Node,
    path: str | Path,
    release: str | Release | None = None,
    *,
    allow_missing: bool = False,
    extra_attrs: dict[str, str] | None = None,
    replace: bool = False,
    like: Path | None = None,
    unchanged: Callable[[], None] | None = None,
    progress: Progress | None = None,
    phase: str = "converting",
) -> WriteReport:
    """Write ``root`` to ``path`` in the format of ``release`` (default: the newest); ``like``:
    the file it is made from, whose permission bits it never exceeds (``atomic.create_temp``);
    ``unchanged``: raises if the files it reads changed meanwhile (``h5.identity.watch``);
    ``progress`` hears of the tensors' bytes written, as ``phase``."""
    rel = resolve_release(release)
    target = Path(path)
    to_write, notes = prepare(root, rel, allow_missing=allow_missing, path=target)
    for note in notes:
        warnings.warn(f"{target}: {note}", stacklevel=2)
    report = WriteReport(target, rel, notes=notes)
    seen: set[int] = set()
    total, leaves, name_chars = sizes(to_write)  # (the progress's total and the room to take)
    room = new_checkpoint_bound(total, leaves, name_chars, rel.format >= 0.5)

    def count(name: str, leaf: Leaf) -> None:
        report.leaves += 1
        if isinstance(leaf, TensorLeaf) and id(leaf) not in seen:
            seen.add(id(leaf))
            report.tensors += 1
            report.tensor_bytes += leaf.nbytes
            if progress is not None:
                progress(phase, report.tensor_bytes, total)

    with atomic_output(target, replace=replace, like=like) as tmp:
        attributes = root_attributes(to_write, rel, extra_attrs or {})
        made = h5root.create_file(tmp, exclusive=False, attributes=attributes)
        with writing(tmp, made, reserve=room) as f:
            write_tree(f, to_write, rel, extra_attrs, count)
        seen.clear()  # (8 MB at 150k tensors, not held through the read-back: issue 33)
        check_written(tmp, to_write, rel)
        if unchanged is not None:
            unchanged()
    return report
