"""``load``/``save`` shaped like ``torch.load``/``torch.save`` (and cstorch's load/save).

``load`` returns the nested state dict with lazy tensors that read their data on first use.
``save`` writes the format of a release (newest by default). ``to_torch``/``from_torch``
convert to and from a plain ``torch.save`` file. One tensor object under two names stays one
object (a tie) on every path; ties are found by identity for tensors and arrays only, never for
ints, strings or other immutable values (Python shares equal small ints, and two equal steps
are not one stored object).
"""

from __future__ import annotations

import collections
import dataclasses
import keyword
import os
import pickle
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# torch/lazy.py imports torch: it is reached through the room's lazy face, so that reading or
# saving a checkpoint of numpy arrays never loads torch.
import ckpt_migrate.torch as torch_room
from ckpt_migrate.atomic import atomic_output, path_exists, refuse_object_address
from ckpt_migrate.errors import (
    MissingLeavesError,
    NotACheckpointError,
    UnsupportedContentError,
)
from ckpt_migrate.format import dtypes
from ckpt_migrate.format import pickled as objects
from ckpt_migrate.format.budgets import MAX_DEPTH
from ckpt_migrate.format.h5.identity import watch
from ckpt_migrate.format.pickled import ObjectMode, OpaqueObject
from ckpt_migrate.format.progress import Count
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import (
    DictNode,
    ExternalLeaf,
    FullTensorLeaf,
    Leaf,
    MemoryData,
    MissingLeaf,
    NamedTupleNode,
    Node,
    OpaqueLeaf,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
)
from ckpt_migrate.format.write import BARE_FIX, WriteReport, write_checkpoint
from ckpt_migrate.torch import older_torch, weights_load


class ExternalReference:
    """A leaf whose data lives outside the checkpoint; ckpt-migrate does not follow it."""

    def __init__(self, kind: str, info: dict[str, Any]):
        self.kind, self.info = kind, info

    def __repr__(self) -> str:
        return f"ExternalReference({self.kind})"


# --------------------------------------------------------------------------- load


def load(
    path: str | Path,
    map_location: Any = None,
    *,
    allow_missing: bool = False,
    objects_mode: ObjectMode = "opaque",
    numpy_as_tensor: bool = False,
) -> Any:
    """Read a checkpoint of any release into nested Python containers.

    Tensors are ``LazyTensor`` objects (real ``torch.Tensor`` subclasses) that read their data on
    first use. Leaves the spec names but the file lacks raise ``MissingLeavesError`` unless
    ``allow_missing`` (then they are None, as in the real loader). Pickled objects come back as
    ``OpaqueObject`` unless ``objects_mode`` is ``"data"`` (plain-data pickles only) or
    ``"trusted"``. ``map_location`` as ``torch.load`` takes it (``torch/map_location.py``):
    other than None/"cpu", it reads every tensor and moves it.
    """
    # torch's first import keeps its callers' frames in reference cycles, until the collector
    # runs: imported here, where this frame holds no file (``_load`` reads it). A frame that
    # held the tree kept the first checkpoint a process loaded open, and h5py with HDF5 2.0
    # then refused another open of that file with default locking.
    torch_room.LazyTensor  # noqa: B018
    return _load(_a_path(path, "load"), map_location, allow_missing, objects_mode, numpy_as_tensor)


def _a_path(path: Any, verb: str) -> str | Path:
    """``path``, a file's name; a file object (``torch.save`` and ``torch.load`` take one) is
    refused in words. A checkpoint is an HDF5 file, read by its name (the preflight reads it
    in other processes) and written beside its name, then renamed into place."""
    if isinstance(path, (str, os.PathLike)):
        return path
    if isinstance(path, bytes):
        return os.fsdecode(path)
    raise TypeError(
        f"ckpt_migrate.{verb} takes the checkpoint file's path (str or os.PathLike), not a "
        f"{type(path).__name__}; for a file you opened, pass its name (f.name)"
    )


def _load(
    path: str | Path,
    map_location: Any,
    allow_missing: bool,
    objects_mode: ObjectMode,
    numpy_as_tensor: bool,
    progress: Callable[[str, int, int], None] | None = None,
) -> Any:
    ckpt = read_checkpoint(path, progress=progress)
    if progress is not None:  # (a lazy ``load`` does not wait for the walk)
        ckpt.ready_to_read()
    missing = ckpt.missing
    if missing and not allow_missing:
        raise MissingLeavesError(
            path,
            f"{len(missing)} leaf/leaves named by the spec have no data: "
            + ", ".join(missing[:5])
            + (" ..." if len(missing) > 5 else ""),
            "pass --allow-missing (allow_missing=True in Python) to get None for them, or "
            "upgrade the file to restore ties",
        )
    state = to_python(ckpt.root, objects_mode=objects_mode, numpy_as_tensor=numpy_as_tensor)
    if map_location is None:  # (torch/map_location.py imports torch: only where asked)
        return state
    return torch_room.moved(state, map_location)


def to_python(
    root: Node,
    *,
    objects_mode: ObjectMode = "opaque",
    lazy: bool = True,
    numpy_as_tensor: bool = False,
) -> Any:
    """Build Python containers from the tree; a tied leaf becomes one shared object.

    ``numpy_as_tensor``: numpy arrays stored in the file come back as torch tensors (bf16 kept)
    and numpy scalars as Python numbers, as a weights-only ``torch.save`` file needs."""
    memo: dict[int, Any] = {}

    def leaf_value(leaf: Leaf) -> Any:
        if isinstance(leaf, TensorLeaf):
            if numpy_as_tensor and leaf.numpy:
                return _tensor(dataclasses.replace(leaf, numpy=False), lazy=False)
            return _tensor(leaf, lazy)
        if isinstance(leaf, ValueLeaf):
            return leaf.value
        if isinstance(leaf, FullTensorLeaf):
            return _full_tensor(leaf)
        if isinstance(leaf, OpaqueLeaf):
            return objects.decode(leaf.payload, objects_mode, leaf.type_hint)
        if isinstance(leaf, MissingLeaf):
            return None
        assert isinstance(leaf, ExternalLeaf)
        return ExternalReference(leaf.kind, leaf.info)

    def build(node: Node) -> Any:
        if isinstance(node, DictNode):
            cls = collections.OrderedDict if node.ordered else dict
            return cls((k, build(v)) for k, v in node.items)
        if isinstance(node, SeqNode):
            values = [build(v) for v in node.items]
            return {"list": list, "tuple": tuple, "set": set}[node.kind](values)
        if isinstance(node, NamedTupleNode):
            return _namedtuple_class(node)(*[build(v) for v in node.items])
        if id(node) not in memo:
            memo[id(node)] = leaf_value(node)
        return memo[id(node)]

    try:
        return build(root)
    finally:  # (``build`` refers to itself: only the collector would let go of the tensors,
        memo.clear()  # their file open until then)


def _namedtuple_class(node: NamedTupleNode) -> type:
    """A fresh namedtuple class with the recorded name and fields; nothing is imported."""
    name = node.name if node.name.isidentifier() and not keyword.iskeyword(node.name) else "Record"
    return collections.namedtuple(name, node.fields, rename=True)  # type: ignore[misc]


def _tensor(leaf: TensorLeaf, lazy: bool) -> Any:
    if leaf.numpy:
        array = leaf.data.read()
        if leaf.dtype == "bfloat16":  # numpy has no bf16: keep the bit pattern
            return array
        return np.array(array, copy=True)

    def loader() -> Any:
        return torch_room.storage_to_tensor(leaf.data.read(), leaf.dtype)

    if not lazy:
        return loader()
    t = torch_room.LazyTensor.create(leaf.shape, leaf.dtype, loader, leaf.data.describe())
    t._ckpt_leaf = leaf  # lets save() copy unread data straight from the file
    return t


def _full_tensor(leaf: FullTensorLeaf) -> Any:
    import torch

    fill = 0 if leaf.fill_value is None else leaf.fill_value
    t = torch.full(leaf.shape, fill, dtype=torch_room.torch_dtype(leaf.dtype))
    key = id(t)
    _FULL[key] = (weakref.ref(t, lambda _ref: _FULL.pop(key, None)), leaf, t._version)
    return t


# Constant tensors load() made, by id: save() writes one back as the same constant unless it
# was changed in place since (its _version moved). Kept off the tensor, which torch.save pickles.
_FULL: dict[int, tuple[weakref.ref, FullTensorLeaf, int]] = {}


def _unchanged_full(t: Any) -> FullTensorLeaf | None:
    entry = _FULL.get(id(t))
    if entry is None or entry[0]() is not t or entry[2] != t._version:
        return None
    return entry[1]


# --------------------------------------------------------------------------- save


def from_python(state: Any, *, pickle_objects: bool = False) -> Node:
    """The neutral tree of a Python state dict; one object under several names stays tied."""
    memo: dict[int, Leaf] = {}
    keep_alive: list[Any] = []  # ids stay unique only while the objects live

    def leaf(obj: Any, where: str) -> Leaf:
        if not _tieable(obj):  # equal ints, strings, ... are never one stored object
            return _leaf_of(obj, where, pickle_objects)
        if id(obj) not in memo:
            keep_alive.append(obj)
            memo[id(obj)] = _leaf_of(obj, where, pickle_objects)
        return memo[id(obj)]

    def build(obj: Any, where: str, depth: int = 0) -> Node:
        if depth > MAX_DEPTH:  # (what the readers refuse as damage; a state holding itself)
            raise UnsupportedContentError(
                None, f"the state is nested more than {MAX_DEPTH} deep at {where}", "flatten it"
            )
        t = type(obj)
        depth += 1
        if t is dict or t is collections.OrderedDict:
            items = []
            for k, v in obj.items():
                if type(k) not in (str, int):
                    raise UnsupportedContentError(
                        None,
                        f"key {k!r} at {where or '<root>'} is a {type(k).__name__}; "
                        "checkpoint keys must be str or int",
                    )
                items.append((k, build(v, f"{where}.{k}" if where else str(k), depth)))
            return DictNode(items, ordered=t is collections.OrderedDict)
        if t in (list, tuple, set):
            kind = {list: "list", tuple: "tuple", set: "set"}[t]
            return SeqNode(kind, [build(v, f"{where}.{i}", depth) for i, v in enumerate(obj)])
        if isinstance(obj, tuple) and hasattr(t, "_fields"):
            return NamedTupleNode(
                t.__name__,
                tuple(t._fields),
                [build(v, f"{where}.{i}", depth) for i, v in enumerate(obj)],
            )
        if isinstance(obj, dict):
            raise UnsupportedContentError(
                None,
                f"{where or '<root>'} is a {t.__name__}; only dict and OrderedDict are "
                "containers in a checkpoint",
                "convert it with dict(...)",
            )
        return leaf(obj, where)

    try:
        return build(state, "")
    finally:  # build is a self-referencing closure: do not let the cycle keep tensors alive
        keep_alive.clear()
        memo.clear()


def _tieable(obj: Any) -> bool:
    """Whether ``obj`` under two names is one stored object (a tie): tensors and arrays, and the
    opaque objects ``load`` makes one per stored leaf (the same one twice is the file's tie).
    Never ints, strings or other plain values, which Python shares when equal."""
    if isinstance(obj, (np.ndarray, OpaqueObject, ExternalReference)):
        return True
    torch = _torch_if_loaded()
    return torch is not None and isinstance(obj, torch.Tensor)


PICKLE_FIX = "pass pickle_objects=True to store it pickled"
# (from-torch has no such option: it says what does the same)
FROM_TORCH_PICKLE_FIX = (
    "make it plain data (a list, a str) before torch.save, or store it pickled by saving the "
    "state in Python with ckpt_migrate.save(state, path, pickle_objects=True)"
)


def _leaf_of(obj: Any, where: str, pickle_objects: bool) -> Leaf:
    if obj is None or type(obj) in (bool, int, float, str):
        return ValueLeaf(obj)
    if type(obj) is np.float64:  # a float subclass: the real writer stores it as a scalar
        return ValueLeaf(float(obj))
    if isinstance(obj, np.str_):  # a str subclass: so does it
        return ValueLeaf(str(obj))
    if isinstance(obj, np.generic) and obj.dtype.kind in "biufc":  # it pickles the others
        return OpaqueLeaf(objects.numpy_scalar_pickle(obj), objects.NUMPY_SCALAR)
    if isinstance(obj, OpaqueObject):
        return OpaqueLeaf(obj.payload, obj.type_hint)
    if isinstance(obj, bytes):
        return OpaqueLeaf(pickle.dumps(obj, protocol=4), "pickle")
    if isinstance(obj, (np.ndarray, np.generic)):
        array = np.asarray(obj, order="C")
        try:
            dt = dtypes.from_storage(array.dtype)
        except ValueError:
            raise UnsupportedContentError(
                None, f"{where}: numpy dtype {array.dtype} cannot be stored in a checkpoint"
            ) from None
        return TensorLeaf(dt.name, tuple(array.shape), MemoryData(array), numpy=True)
    torch = _torch_if_loaded()
    if torch is not None and isinstance(obj, torch.Tensor):
        source = getattr(obj, "_ckpt_leaf", None)
        if source is not None and not getattr(obj, "is_loaded", True):
            return source  # unread data: copy it from the file, not through memory
        full = _unchanged_full(obj)
        if full is not None:
            return full  # a constant tensor of the file, unchanged: stays a constant
        try:
            array, dtype = torch_room.tensor_to_storage(obj)
        except UnsupportedContentError as exc:  # (said of the tensor: which one?)
            problem = f"{where or '<root>'}: {exc.problem}"
            raise UnsupportedContentError(None, problem, exc.fix) from None
        return TensorLeaf(dtype, tuple(array.shape), MemoryData(array))
    if isinstance(obj, ExternalReference):
        return ExternalLeaf(obj.kind, obj.info)
    if pickle_objects:
        return OpaqueLeaf(
            pickle.dumps(obj, protocol=4), f"{type(obj).__module__}.{type(obj).__qualname__}"
        )
    raise UnsupportedContentError(
        None,
        f"{where or '<root>'} is a {type(obj).__module__}.{type(obj).__qualname__}, which is "
        "not a tensor, array, scalar, string or container",
        PICKLE_FIX,
    )


def _torch_if_loaded() -> Any:
    import sys

    return sys.modules.get("torch")


def save(
    state_dict: Any,
    path: str | Path,
    release: str | None = None,
    *,
    allow_missing: bool = False,
    pickle_objects: bool = False,
) -> WriteReport:
    """Write ``state_dict`` as a checkpoint of ``release`` (newest by default), atomically.

    Refuses to overwrite an existing file. Tensors are written one at a time.
    """
    path = _a_path(path, "save")
    tree = from_python(state_dict, pickle_objects=pickle_objects)
    return write_checkpoint(tree, path, release, allow_missing=allow_missing)


def _save_from(
    src: Path,
    state_dict: Any,
    path: str | Path,
    release: str | None,
    progress: Callable[[str, int, int], None] | None = None,
    unchanged: Callable[[], None] | None = None,
) -> WriteReport:
    """``save``, for the state of the file ``src``: no more readable than ``src``;
    ``progress`` and ``unchanged``: ``write_checkpoint``'s (``converting``, as ``to_torch``).
    What the state holds that a checkpoint cannot is said of ``src``."""
    try:
        tree = from_python(state_dict)
    except UnsupportedContentError as exc:
        if exc.path is not None:
            raise
        fix = FROM_TORCH_PICKLE_FIX if exc.fix == PICKLE_FIX else exc.fix
        raise UnsupportedContentError(src, exc.problem, fix) from None
    return write_checkpoint(tree, path, release, like=src, unchanged=unchanged, progress=progress)


def to_torch(
    src: str | Path,
    dst: str | Path,
    *,
    allow_missing: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    notes: list[str] | None = None,
) -> Path:
    """Write ``src`` as a plain ``torch.save`` file that ``torch.load(weights_only=True)`` reads,
    one tensor at a time (``torch/stream.py``); ``progress`` hears of the bytes written, and
    ``notes`` of what an older torch would refuse (``torch/older_torch.py``).

    Only what a weights-only load accepts goes in: numpy arrays stored in the checkpoint become
    torch tensors (bf16 kept) and numpy scalars Python numbers, namedtuples plain tuples,
    constant tensors full tensors, and pickled objects their plain data (any other pickled
    object is refused). The file is loaded back with ``weights_only=True`` before it is put in
    place. ``from_torch`` reads it back; the numpy leaves then are torch tensors.
    """
    state = _load(_a_path(src, "to_torch"), None, allow_missing, "data", True, progress)
    import torch  # (after the read, which says its progress: its import takes seconds)

    unchanged = watch(Path(src))  # (called before publishing: the tensors are read lazily)
    memo: dict[int, Any] = {}
    sources: dict[int, Any] = {}  # id(placeholder) -> the tensor whose data goes there

    def plain(obj: Any, where: str) -> Any:
        if isinstance(obj, torch.Tensor):  # its data is written later, one tensor at a time
            if id(obj) not in memo:
                memo[id(obj)] = torch_room.placeholder(obj)
                sources[id(memo[id(obj)])] = obj
            return memo[id(obj)]
        if isinstance(obj, (OpaqueObject, ExternalReference)):
            raise UnsupportedContentError(
                src,
                f"{where}: holds {obj!r}, which a weights-only torch.save file cannot carry",
                _CARRY_FIX[type(obj)],
            )
        if isinstance(obj, dict):
            return type(obj)(
                (k, plain(v, f"{where}.{k}" if where else str(k))) for k, v in obj.items()
            )
        if isinstance(obj, (list, tuple, set)) and not hasattr(obj, "_fields"):
            return type(obj)(plain(v, f"{where}.{i}") for i, v in enumerate(obj))
        if isinstance(obj, tuple):  # namedtuple: weights_only loading cannot rebuild the class
            return tuple(plain(v, f"{where}.{i}") for i, v in enumerate(obj))
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):  # from a decoded plain-data pickle
            return torch.from_numpy(np.array(obj, copy=True))
        return obj

    out = Path(dst)
    tree = plain(state, "")
    refused = older_torch.note(older_torch.refused_by_torch_2_4(tree))
    if refused is not None and notes is not None:
        notes.append(refused)
    with atomic_output(out, like=Path(src)) as tmp:
        stored = torch_room.save_streaming(tree, tmp, sources, progress)
        loaded = Count(progress, "load back", stored, 64)
        try:
            weights_load.load(tmp, loaded if progress else None)
            loaded.end()
        except (weights_load.Refused, weights_load.Unreadable) as exc:
            raise UnsupportedContentError(
                src, f"holds a value a weights-only torch.load refuses ({exc})"
            ) from None
        unchanged()
    return out


_CARRY_FIX = {
    OpaqueObject: "make it plain data in Python: ckpt_migrate.load(path, objects_mode='trusted') "
    "unpickles it (a file you trust only); save the state with torch.save",
    ExternalReference: "materialize it with the tool that made it",
}


def from_torch(
    src: str | Path,
    dst: str | Path,
    release: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> WriteReport:
    """Write a ``torch.save`` file as a checkpoint; loaded with ``weights_only=True``."""
    src_path = Path(src)
    if not path_exists(src_path):
        refuse_object_address(src_path)
        raise NotACheckpointError(src_path, "no such file", "check the path")
    unchanged = watch(src_path)  # (torch maps its zip format: the tensors are read later)
    try:
        state = weights_load.load(src_path)
    except (weights_load.Refused, weights_load.Unreadable) as exc:
        raise weights_load.refusal(src_path, exc) from None
    if not isinstance(state, (dict, list, tuple)):  # (the writer would name the output)
        what = f"one bare {type(state).__name__}"
        raise UnsupportedContentError(src_path, f"holds {what}, not named values", BARE_FIX)
    return _save_from(src_path, state, dst, release, progress, unchanged)
