"""What a preflight child reads and says (``preflight``, ``preflight_outline``): attribute
values read as HDF5 stores them, the words a child writes to its parent, and the exception
that ends a walk the parent's own checks will refuse."""

from __future__ import annotations

import os
from typing import Any

import h5py
import numpy as np

from ckpt_migrate.format.h5.boundary import ALLOWED_TYPE_CLASSES, attribute_names

TICK = b"."
FIRST = b"M"  # the first part is done: "M<stored>,<declared>;" (see preflight._walk)
SECOND = b"="  # the second part is done: "=<stored>;"
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
    facts a reader looks for)."""
    for i, name in enumerate(attribute_names(obj) if names is None else names):
        if i % 1000 == 999:
            os.write(tick, TICK)
        attr = h5py.h5a.open(obj, name)
        tid = attr.get_type()
        kind = tid.get_class()
        if kind not in ALLOWED_TYPE_CLASSES:
            raise Refused  # never read: the boundary refuses it by its type
        space = attr.get_space()
        extent = space.get_simple_extent_type()
        if extent == h5py.h5s.NULL:
            continue
        if kind == h5py.h5t.STRING and tid.is_variable_str():
            out = np.empty(space.shape, dtype=object)
            attr.read(out, mtype=VLEN_STR)
        elif scalars is not None and extent == h5py.h5s.SCALAR and kind in NUMBERS:
            out = np.empty((), dtype=numpy_type(tid))
            attr.read(out)
        else:
            attr.read(np.empty(space.shape, dtype=f"V{tid.get_size()}"), mtype=tid)
            out = None
        if scalars is not None and out is not None and out.shape == ():
            value = out[()]
            if isinstance(value, bytes):
                value = value.decode("utf-8", "surrogateescape")
            if isinstance(value, (str, np.bool_, np.integer, np.floating)):
                scalars[name.decode("utf-8", "surrogateescape")] = (
                    value if isinstance(value, str) else value.item()
                )


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
