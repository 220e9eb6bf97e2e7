"""Read format 0.5 (releases 2.5–2.10) into the neutral tree. FORMAT.md §4 and §5.2.

Only root attributes and dataset attributes are read here; tensor data stays on disk.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ckpt_migrate import jsonfile
from ckpt_migrate.errors import (
    CkptError,
    CorruptCheckpointError,
    UnsupportedContentError,
)
from ckpt_migrate.format import dtypes
from ckpt_migrate.format.h5 import attrs as h5attrs
from ckpt_migrate.format.h5 import attrtable, heapblocks
from ckpt_migrate.format.h5.facts import Facts, OutlineTooShort, link_names
from ckpt_migrate.format.h5.io import (
    H5Handle,
    attr_bool,
    attr_text,
    open_dataset,
)
from ckpt_migrate.format.h5.unnamed import datasets_not_in
from ckpt_migrate.format.tree import (
    DictNode,
    ExternalLeaf,
    FullTensorLeaf,
    H5Data,
    Leaf,
    NamedTupleNode,
    Node,
    OpaqueLeaf,
    TensorLeaf,
    ValueLeaf,
    iter_leaves,
    map_leaves,
)
from ckpt_migrate.format.v05 import treespec as treespec_json
from ckpt_migrate.format.v05.spec import built, read_spec, refuse_collisions
from ckpt_migrate.format.v05.templates import Templates

_SUFFIX = ".__metadata__"
Typed = tuple[str, tuple[int, ...]]  # a tensor's dtype and shape, decoded from its metadata
# Serializers whose value lives outside this file (FORMAT.md §4.4); kept as references.
_TENSORS = {"TorchTensorSerializer", "NumpyArraySerializer"}
_EXTERNAL = {"DeferredObject", "DeferredNumpyArray", "DeferredSafeTensor", "DeferredFileTensor"}


def read(
    f: h5py.File, handle: H5Handle, facts: Facts | None = None
) -> tuple[Node, list[str], list[str]]:
    """Return (tree, datasets not named by the spec, warnings). ``facts``: what the preflight
    walk learnt of the datasets (a tensor's dataset is then checked without opening it), or,
    ``proven``, that the caller proves each tensor's dataset itself (the engine's read-back of
    its own output: by its address, or its hash): tensors are then taken from their metadata,
    and the datasets no leaf names are not looked for (none is returned)."""
    facts = facts or Facts()
    path = handle.path
    require_success(f, path)
    singles: Templates[_Pending] = Templates()
    digest = handle.root_digest

    def keep(key: str, text: str | None) -> Any:
        """A leaf's metadata parsed as the table is read (its text is not kept: 150k texts
        held 340 MB, issue 33), decoded once the spec names the leaf; other attributes' texts
        (the spec's among them) as they are. Every pair goes into the root's digest, if the
        caller asked for it."""
        pending = _pending(key, text, singles, path)
        if digest is not None:  # (an edit never takes a tensor's metadata out of it)
            digest.add(key, text, keep_pair=pending is None or not pending.tensor)
        if key == "__spec__" and text is not None:
            return treespec_json.Spec.of(text, path)
        return text if pending is None else pending

    blocks = None if digest is None else heapblocks.Recorded(digest)
    table = attrtable.root_texts(f, path, keep=keep, progress=handle.progress, blocks=blocks)
    if blocks is not None:
        blocks.end()
        digest.blocks = blocks
    if table is None:
        handle.root_digest = None  # (not every pair was seen)
        if facts.links is not None:
            raise OutlineTooShort("a root attrtable does not read")  # (by name after the walk)
    # (an outline's links, read by its preflight child meanwhile: ``read_outline``)
    names = None if facts.links is None else link_names(facts.links)
    reading = _Reading(f, handle, facts, names=names)

    def decode(name: str) -> Leaf:
        kept = None if table is None else table.pop(f"{name}{_SUFFIX}", None)
        if isinstance(kept, _Pending):
            leaf = kept.decode(reading, name)
        else:  # not in the table: read by name
            if facts.links is not None:
                raise OutlineTooShort(name)
            leaf = _decode_leaf(reading, name, _leaf_metadata(f, name, path))
        return leaf if facts.alike is None else facts.alike(name, leaf)

    # Each leaf is decoded as the spec names it, its text let go of by the table: the table
    # and the tree were both whole at once, 30 MB at 150k leaves (issue 33)
    root, shared = _parse_spec(handle, table, decode)
    if shared:
        refuse_collisions(root, path)
    if reading.links:
        root = _resolve_links(root, reading.links, path)
    if reading.names is not None:
        if not reading.names <= reading.used:  # only an open tells a dataset from a group
            raise OutlineTooShort("links that are no leaf's")
        return root, [], []
    if facts.proven:  # (the engine's read-back of its own output compares the tree alone: a
        # visit of every link, which reads each object's header, held 63 MB and took 3 of its
        # 6.6 s at 150k leaves, issue 33)
        return root, [], []
    unreferenced = datasets_not_in(f, reading.used, recursive=True, progress=handle.progress)
    return root, unreferenced, []


@dataclass(slots=True)
class _Reading:
    """What decoding the leaves reads (the file, its handle, what the walk found) and what it
    records: the datasets the leaves use, and each tie's target by its name. ``names``: an
    outline read's link names (``Facts.links``), taken once the root's attributes are read."""

    f: h5py.File
    handle: H5Handle
    facts: Facts
    used: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)
    names: AbstractSet[str] | None = None


@dataclass(slots=True)
class _Pending:
    """A ``<leaf>.__metadata__`` text as the table read it: parsed (a single leaf's metadata
    ``m``, or the whole document ``md_all``, or the error parsing met), decoded when the spec
    names the leaf (``decode``); an attribute no leaf is named by is never decoded."""

    m: dict[str, Any] | None = None
    md_all: dict[str, Any] | None = None
    error: CkptError | None = None
    # A tensor's dtype and shape from ``m``, decoded once for every leaf of its template
    typed: Typed | None = None

    @property
    def tensor(self) -> bool:
        return self.m is not None and self.m.get("__TYPE__") in _TENSORS

    def decode(self, reading: _Reading, name: str) -> Leaf:
        if self.typed is not None:  # (most leaves: a tensor of a template decoded before)
            return _tensor(reading, name, *self.typed)
        if self.error is not None:
            raise self.error
        if self.m is not None:
            if self.m.get("__TYPE__") == "TorchTensorSerializer":
                path = reading.handle.path
                self.typed = (_torch_dtype(self.m, path, name), _shape(self.m, path, name))
            return _decode_single(reading, name, self.m, self.typed)
        assert self.md_all is not None
        return _decode_leaf(reading, name, self.md_all)


def _pending(
    key: str, text: str | None, singles: Templates[_Pending], path: Path
) -> _Pending | None:
    """What the table keeps of the attribute ``key``'s ``text``: a ``_Pending`` for a leaf's
    metadata, None for any other attribute."""
    if text is None or not key.endswith(_SUFFIX):
        return None
    name = key[: -len(_SUFFIX)]
    template = singles.template(name, text)
    if template is not None:
        known = singles.known.get(template)
        if known is not None:
            return known
        number = singles.number(template) if singles.numbers else None
        if number is not None:
            return _Pending(m=number)
    try:
        md_all = _parse_metadata(text, key, path)
        spec = md_all["__spec__"]
        single = isinstance(spec, list) and len(spec) > 1
        if template is None or not single or spec[1] != treespec_json.single_leaf_spec(name):
            return _Pending(md_all=md_all)
        m = _interned(_meta(md_all, name, name, path))
        if singles.learn_number(template, m):  # (known by its template around its value)
            return _Pending(m=m)
        return singles.learn(template, _Pending(m=m))
    except CkptError as exc:
        return _Pending(error=exc)


def _interned(m: dict[str, Any]) -> dict[str, Any]:
    """``m`` with its keys and string values interned: a document decoded from JSON gives
    each leaf its own copies of the same few words."""
    return {sys.intern(k): sys.intern(v) if type(v) is str else v for k, v in m.items()}


def require_success(f: h5py.File, path: Path) -> None:
    """cstorch sets ``__SUCCESS__`` last: a file without it is a save that did not finish."""
    if not attr_bool(f.attrs.get("__SUCCESS__", False)):
        raise CorruptCheckpointError(
            path, "partially written checkpoint (no __SUCCESS__ marker)", "the save did not finish"
        )


def _parse_spec(
    handle: H5Handle, table: dict[str, Any] | None, leaf: Callable[[str], Leaf]
) -> tuple[Node, bool]:
    """The root's ``__spec__`` (from ``table``, else through h5py: five times its size in
    memory at once, 27 MB at 150k leaves) as a tree of ``leaf`` of each name, and whether two
    leaves share a name (``treespec.parse_named``); its size goes to the handle."""
    spec = None if table is None else table.pop("__spec__", None)
    if not isinstance(spec, treespec_json.Spec):
        spec = read_spec(handle.file(), handle.path)
    handle.spec_bytes = spec.nbytes
    return built(spec, handle.path, leaf)


def leaf_from_text(f: h5py.File, handle: H5Handle, name: str, text: str) -> Leaf | str:
    """The leaf ``name`` decoded from its ``__metadata__`` ``text`` alone, a tensor taken as the
    text declares it (no dataset opened), or the name of its first place for a tie: what a
    root edit wrote, read back (``engine.rootverify``)."""
    reading = _Reading(f, handle, Facts(proven=True))
    leaf = _decode_leaf(reading, name, _parse_metadata(text, f"{name}{_SUFFIX}", handle.path))
    return reading.links.get(name, leaf)


def _leaf_metadata(f: h5py.File, name: str, path: Path) -> dict[str, Any]:
    """The leaf's ``__metadata__`` document read by name (where the root's attribute table,
    read in one pass by ``attrtable``, does not have it)."""
    key = f"{name}{_SUFFIX}"
    text = h5attrs.get_text(f, key)
    if text is None:
        raise CorruptCheckpointError(path, f"leaf {name!r} has no {key} attribute")
    return _parse_metadata(text, key, path)


def _parse_metadata(text: Any, key: str, path: Path) -> dict[str, Any]:
    try:
        md = jsonfile.loads(attr_text(text))
    except ValueError:
        raise CorruptCheckpointError(path, f"attribute {key!r} is not valid JSON") from None
    if not isinstance(md, dict) or "__spec__" not in md or "__objects__" not in md:
        raise CorruptCheckpointError(path, f"attribute {key!r} lacks __spec__/__objects__")
    return md


def _decode_leaf(reading: _Reading, name: str, md_all: dict[str, Any]) -> Leaf:
    path = reading.handle.path
    objects = set(md_all["__objects__"])
    spec = md_all["__spec__"][1]
    # The spec cstorch writes for a plain leaf needs no parsing (a third of reading a leaf).
    if spec == treespec_json.single_leaf_spec(name) and name in objects:
        return _decode_single(reading, name, _meta(md_all, name, name, path))
    per_leaf = treespec_json.parse(spec, path)
    refs = list(iter_leaves(per_leaf))
    if len(refs) == 1 and refs[0].name == name and name in objects:
        return _decode_single(reading, name, _meta(md_all, name, name, path))

    def meta(sub: str) -> dict[str, Any]:
        return _meta(md_all, name, sub, path)

    # Nested serialization: NestedObject(object, metadata) records (§4.3).
    top = per_leaf.items[0][1] if isinstance(per_leaf, DictNode) and per_leaf.items else None
    if isinstance(top, NamedTupleNode) and len(top.items) == 2:
        outer = meta(f"{name}.1")
        kind = outer.get("__TYPE__", "")
        inner_names = [r.name for r in refs if r.name in objects]
        if kind == "TorchTensorSerializer" and inner_names == [f"{name}.0"]:
            inner = meta(f"{name}.0")
            if inner.get("__TYPE__") == "DeferredFullTensor":
                full = _full_tensor(inner, path, name)
                dtype = _torch_dtype(outer, path, name) if outer.get("dtypes") else full.dtype
                return FullTensorLeaf(dtype, full.shape, full.fill_value)
        return ExternalLeaf(kind or "nested", {"metadata": md_all})
    raise UnsupportedContentError(path, f"leaf {name!r} has a serialization layout not understood")


def _meta(md_all: dict[str, Any], name: str, sub: str, path: Path) -> dict[str, Any]:
    """The metadata of ``sub`` in leaf ``name``'s document."""
    try:
        m = md_all[f"{sub}.__metadata__"]
    except KeyError:
        raise CorruptCheckpointError(path, f"leaf {name!r}: no metadata for {sub!r}") from None
    if not isinstance(m, dict):
        raise CorruptCheckpointError(path, f"leaf {name!r}: metadata of {sub!r} is not a dict")
    return m


def _decode_single(
    reading: _Reading, name: str, m: dict[str, Any], typed: Typed | None = None
) -> Leaf:
    """A leaf serialized alone (``m``: its metadata; ``typed``: a tensor's dtype and shape,
    if already decoded from it), or a placeholder for a tie's link."""
    if m.get("__TYPE__") == "LinkedObject":
        target = m.get("key")
        if not isinstance(target, str):
            raise CorruptCheckpointError(
                reading.handle.path, f"leaf {name!r}: LinkedObject without a key"
            )
        reading.links[name] = target
        return ValueLeaf(None)  # placeholder, replaced by the target leaf
    return _decode_object(reading, name, m, typed)


def _decode_object(
    reading: _Reading, name: str, m: dict[str, Any], typed: Typed | None = None
) -> Leaf:
    handle, facts, used = reading.handle, reading.facts, reading.used
    path = handle.path
    kind = m.get("__TYPE__")
    if kind is None:
        raise CorruptCheckpointError(path, f"leaf {name!r}: metadata without __TYPE__")
    if kind == "TorchTensorSerializer":
        return _tensor(
            reading, name, *(typed or (_torch_dtype(m, path, name), _shape(m, path, name)))
        )
    if kind == "NumpyArraySerializer":
        known = facts.take(name)
        default = m.get("is_bfloat16", False)
        if known is not None and known.shape is not None:
            used.add(name)
            stored, shape = known.dtype, known.shape
            is_bf16 = attr_bool(known.attrs.get("is_bfloat16", default))
        else:
            ds = _dataset(reading, name)
            stored, shape = ds.dtype, tuple(ds.shape)
            is_bf16 = attr_bool(h5attrs.get_value(ds, "is_bfloat16", default))
        try:
            dt = dtypes.from_storage(stored, is_bf16)
        except ValueError:
            raise _unsupported_array(path, name, np.dtype(stored)) from None
        return TensorLeaf(dt.name, shape, H5Data(handle, name), numpy=True)
    if kind == "ScalarSerializer":
        value = m.get("scalar_value")
        if type(value) not in (bool, int, float):
            raise CorruptCheckpointError(
                path, f"leaf {name!r}: scalar_value {value!r} is not a number"
            )
        return ValueLeaf(value)
    if kind == "StringSerializer":
        value = m.get("string_value")
        if not isinstance(value, str):
            raise CorruptCheckpointError(path, f"leaf {name!r}: string_value is not a string")
        return ValueLeaf(value)
    if kind == "NoneSerializer":
        return ValueLeaf(None)
    if kind == "ObjectSerializer":
        ds = _dataset(reading, name)
        raw = ds.attrs.get("__BYTES__")
        if raw is None:
            raise CorruptCheckpointError(path, f"object {name!r} has no __BYTES__ payload")
        return OpaqueLeaf(bytes(raw.tobytes() if hasattr(raw, "tobytes") else raw), "pickle")
    if kind == "DeferredFullTensor":
        return _full_tensor(m, path, name)
    if kind in _EXTERNAL:
        return ExternalLeaf(kind, dict(m))
    raise UnsupportedContentError(
        path, f"leaf {name!r} uses serializer {kind!r}, which ckpt-migrate does not know"
    )


def _unsupported_array(path: Path, name: str, stored: np.dtype) -> UnsupportedContentError:
    """A numpy array the real writer stores and this tool does not read (fixed-length bytes,
    say: ``np.array([b"ab"])`` is ``|S2``), with what it is and the way out."""
    what = "fixed-length bytes" if stored.kind == "S" else f"dtype {stored}"
    return UnsupportedContentError(
        path,
        f"array {name!r} is a numpy array of {what} ({stored.str}), which ckpt-migrate does "
        "not read",
        "save it as a list (of bytes or str) or as a numeric array with the library that "
        "wrote the file, or leave it out",
    )


def _tensor(reading: _Reading, name: str, dtype: str, shape: tuple[int, ...]) -> TensorLeaf:
    """A ``TorchTensorSerializer`` leaf of ``dtype`` and ``shape`` (as its metadata declares
    them), its dataset found as the read requires (``Facts``)."""
    facts, used = reading.facts, reading.used
    if facts.proven:  # (no dataset is looked for by what the leaves use: 150k names kept
        pass  # for nothing were 8 MB of the read-back, issue 33)
    elif reading.names is not None:  # an outline read: the metadata, and a link of its name
        if name not in reading.names:  # (in a group, or missing: the full read says which)
            raise OutlineTooShort(name)
        used.add(name)
    elif (known := facts.take(name)) is not None:  # (each leaf's, let go of as it is made)
        used.add(name)
        check_storage(known.dtype, known.shape, dtype, shape, reading.handle.path, name)
    else:
        ds = _dataset(reading, name)
        check_storage(ds.dtype, ds.shape, dtype, shape, reading.handle.path, name)
    return TensorLeaf(dtype, shape, H5Data(reading.handle, name))


def _dataset(reading: _Reading, name: str) -> h5py.Dataset:
    if reading.facts.links is not None:
        raise OutlineTooShort(name)  # never opened before the full walk has tried it
    obj = open_dataset(reading.f, name)
    if obj is None:
        raise CorruptCheckpointError(
            reading.handle.path, f"leaf {name!r} has no dataset", "the file is incomplete"
        )
    reading.used.add(name)
    return obj


def _torch_dtype(m: dict[str, Any], path: Path, name: str) -> str:
    try:
        return dtypes.by_name(m["dtypes"][0]).name
    except (KeyError, IndexError, TypeError):
        raise CorruptCheckpointError(path, f"tensor {name!r} metadata has no dtypes") from None
    except ValueError as exc:
        raise UnsupportedContentError(path, f"tensor {name!r}: {exc}") from None


def _shape(m: dict[str, Any], path: Path, name: str) -> tuple[int, ...]:
    try:
        return tuple(map(int, m["shapes"][0]))
    except (KeyError, IndexError, TypeError, ValueError):
        raise CorruptCheckpointError(path, f"tensor {name!r} metadata has no shapes") from None


def stored_as_declared(
    stored_dtype: np.dtype, stored_shape: tuple[int, ...] | None, dtype: str, shape: tuple[int, ...]
) -> bool:
    """Whether a dataset of ``stored_dtype`` and ``stored_shape`` holds a tensor its metadata
    declares of ``dtype`` and ``shape`` (bfloat16 stored as int16, either byte order)."""
    want = dtypes.by_name(dtype).storage
    same_dtype = stored_dtype.newbyteorder("<") == want.newbyteorder("<") or (
        want.kind == "b" and stored_dtype.kind == "b"
    )
    return stored_shape == shape and same_dtype


def check_storage(
    stored_dtype: np.dtype,
    stored_shape: tuple[int, ...] | None,
    dtype: str,
    shape: tuple[int, ...],
    path: Path,
    name: str,
) -> None:
    """``CorruptCheckpointError`` unless ``stored_as_declared``."""
    if not stored_as_declared(stored_dtype, stored_shape, dtype, shape):
        raise CorruptCheckpointError(
            path,
            f"tensor {name!r}: dataset is {stored_dtype}{list(stored_shape or ())}, "
            f"metadata says {dtype}{list(shape)}",
        )


def _full_tensor(m: dict[str, Any], path: Path, name: str) -> FullTensorLeaf:
    try:
        dtype = dtypes.by_name(m["dtype"]).name
        shape = tuple(int(d) for d in m["shape"])
    except (KeyError, TypeError, ValueError):
        raise CorruptCheckpointError(path, f"full tensor {name!r} lacks shape/dtype") from None
    return FullTensorLeaf(dtype, shape, m.get("fill_value"))


def _resolve_links(root: Node, links: dict[str, str], path: Path) -> Node:
    """Each tie's link replaced by the leaf it names (looked for by name among the leaves once
    there are links: every leaf's name kept while decoding was 6 MB at 150k, issue 33)."""
    targets = set(links.values())
    first = {ref.name: ref.leaf for ref in iter_leaves(root) if ref.name in targets}
    for name, target in links.items():
        if target not in first or target in links:
            raise CorruptCheckpointError(
                path, f"leaf {name!r} links to {target!r}, not a stored leaf"
            )
    return map_leaves(root, lambda ref: first[links[ref.name]] if ref.name in links else ref.leaf)
