"""What a preflight child reads and says (``preflight``, ``preflight_outline``): attribute
values read as HDF5 stores them, the words a child writes to its parent, and the exception
that ends a walk the parent's own checks will refuse."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np

from ckpt_migrate.format.h5.boundary import ALLOWED_TYPE_CLASSES, attribute_names, type_problem

TICK = b"."
FIRST = b"M"  # the first part is done: "M<stored>,<declared>;" (see preflight._walk)
SECOND = b"="  # the second part is done: "=<stored>;"
LINKS = b"L"  # an outline child read the root's links: "L<count>;" (-1: it read none)
END = b";"


class Refused(Exception):
    """A dataset the parent's checks will refuse: the child stops walking."""


VLEN_STR = h5py.h5t.py_create(h5py.string_dtype())


def read_attributes(
    obj: h5py.h5o.ObjectID,
    tick: int,
    scalars: dict[str, Any] | None = None,
    names: list[bytes] | None = None,
) -> None:
    """Read every attribute's value (or those in ``names``) as HDF5 stores it:
    variable-length strings through their heap (where damage made HDF5 loop or crash),
    anything else as raw bytes (no conversion to numpy types, which is h5py's work and half the
    cost). ``scalars`` collects the scalar strings, numbers and booleans as Python values (the
    facts a reader looks for), and a full tensor's ``shape``, a short vector of integers
    (``is_shape``), as a list."""
    for i, name in enumerate(attribute_names(obj) if names is None else names):
        if i % 1000 == 999:
            os.write(tick, TICK)
        attr = h5py.h5a.open(obj, name)
        tid = attr.get_type()
        kind = type_facts(tid)
        if not kind.allowed:
            raise Refused  # never read: the boundary refuses it by its type
        space = attr.get_space()
        extent = space.get_simple_extent_type()
        if extent == h5py.h5s.NULL:
            continue
        shape = () if extent == h5py.h5s.SCALAR else space.shape
        if kind.vlen_str:
            out = np.empty(shape, dtype=object)
            attr.read(out, mtype=VLEN_STR)
        elif scalars is not None and extent == h5py.h5s.SCALAR and kind.number is not None:
            out = np.empty((), dtype=kind.number)
            attr.read(out)
        elif scalars is not None and name == SHAPE and is_shape(kind.number, shape):
            out = np.empty(shape, dtype=kind.number)
            attr.read(out)
            scalars["shape"] = out.tolist()
            continue
        else:
            attr.read(np.empty(shape, dtype=f"V{kind.size}"), mtype=tid)
            out = None
        if scalars is not None and out is not None and out.shape == ():
            value = out[()]
            if isinstance(value, bytes):
                value = value.decode("utf-8", "surrogateescape")
            if isinstance(value, (str, np.bool_, np.integer, np.floating)):
                scalars[name.decode("utf-8", "surrogateescape")] = (
                    value if isinstance(value, str) else value.item()
                )


SHAPE = b"shape"  # a full tensor's shape (``DeferredFullTensor``, FORMAT.md §3.3)
MAX_RANK = 64


def is_shape(number: np.dtype | None, shape: tuple[int, ...]) -> bool:
    """Whether an attribute of ``number`` type and ``shape`` can be a tensor's shape."""
    return number is not None and number.kind in "iu" and len(shape) == 1 and shape[0] <= MAX_RANK


class TypeFacts(NamedTuple):
    """What a walk needs to know of an HDF5 type, found once per type (``type_facts``)."""

    allowed: bool  # a class in ALLOWED_TYPE_CLASSES
    vlen_str: bool  # a variable-length string
    number: np.dtype | None  # h5py's numpy dtype of a number or bool (a class in NUMBERS)
    size: int  # bytes an element takes
    refused: bool  # a dataset of this type is refused (``boundary.type_problem``)


_TYPE_FACTS: dict[bytes, TypeFacts] = {}


def type_facts(tid: h5py.h5t.TypeID) -> TypeFacts:
    """The facts of ``tid``, remembered by the type's encoding (``H5Tencode``, 1 µs): a
    checkpoint has a handful of types, and asking HDF5 about each again (its class, size,
    string kind, ``H5Tequal`` against the standard number types and h5py's dtypes) cost
    30-40 µs a dataset in the preflight walk (issue 33). Two types with the same encoding are
    the same type; a type HDF5 cannot encode is looked at every time."""
    try:
        key: bytes | None = tid.encode()
    except Exception:  # (nothing to remember it by)
        key = None
    known = _TYPE_FACTS.get(key) if key is not None else None
    if known is not None:
        return known
    kind = tid.get_class()
    allowed = kind in ALLOWED_TYPE_CLASSES
    known = TypeFacts(
        allowed,
        allowed and kind == h5py.h5t.STRING and tid.is_variable_str(),
        numpy_type(tid) if allowed and kind in NUMBERS else None,
        tid.get_size(),
        type_problem(tid, _NOWHERE, "") is not None,
    )
    if key is not None and len(_TYPE_FACTS) < 256:
        _TYPE_FACTS[key] = known
    return known


_NOWHERE = Path()


NUMBERS = frozenset({h5py.h5t.INTEGER, h5py.h5t.FLOAT, h5py.h5t.ENUM})
_NUMPY_TYPES: list[tuple[h5py.h5t.TypeID, np.dtype]] = []


def numpy_type(tid: h5py.h5t.TypeID) -> np.dtype:
    """h5py's numpy dtype for an HDF5 type: a checkpoint has a handful of types, and the
    conversion costs more than comparing types (``H5Tequal``)."""
    for known, dtype in _NUMPY_TYPES:
        if known == tid:
            return dtype
    dtype = tid.dtype
    if len(_NUMPY_TYPES) < 64:
        _NUMPY_TYPES.append((tid, dtype))
    return dtype
