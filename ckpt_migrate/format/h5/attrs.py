"""Attribute writes through HDF5's low-level API, typed as h5py's ``attrs[...] = value`` types them,
and reads of string attributes the same way.

A 0.5 checkpoint has eight attributes per tensor and one root attribute per leaf; through
``h5py.AttributeManager`` each costs about 40 µs of Python on top of HDF5's own work, which made
attribute writing the largest part of an upgrade of a checkpoint with many tensors. Reading a
string attribute that way costs 61 µs, 23 µs through ``get_text``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np
from h5py import h5a, h5s, h5t

from ckpt_migrate.format.h5 import capi

_STR_DTYPE = h5py.string_dtype()
_STR_MEMTYPE = h5t.py_create(_STR_DTYPE)
_SCALAR = h5s.create(h5s.SCALAR)
_TYPES: dict[Any, h5t.TypeID] = {}


def hdf5_type(dtype: np.dtype) -> h5t.TypeID:
    """``h5t.py_create(dtype, logical=True)``, the type h5py stores a ``dtype`` as, made once."""
    key = (dtype.str, dtype.metadata and tuple(dtype.metadata.items()))
    tid = _TYPES.get(key)
    if tid is None:
        tid = _TYPES[key] = h5t.py_create(dtype, logical=True)
    return tid


_STR_TYPE = hdf5_type(_STR_DTYPE)


def as_array(value: Any) -> np.ndarray:
    """``value`` as the array h5py would store for it (str → variable-length UTF-8)."""
    if isinstance(value, str):
        return np.array(value, dtype=_STR_DTYPE)
    if isinstance(value, np.ndarray):
        return value
    return np.asarray(value)


@dataclass(frozen=True)
class Prepared:
    """An attribute ready to be created on many objects: its name, HDF5 type and space, and
    its value as the array h5py would write (``prepare``)."""

    name: bytes
    tid: h5t.TypeID
    space: h5s.SpaceID
    data: np.ndarray
    mtype: h5t.TypeID  # the type of ``data`` in memory (h5py makes it anew on every write)
    # Created by HDF5's calls directly (``capi``): then ``raw`` is ``data`` laid out for them
    # (None for an empty value, nothing to write)
    direct: bool
    raw: capi.Value | None


def prepare(name: str, value: Any) -> Prepared:
    data = as_array(value)
    if not data.flags.c_contiguous:  # (np.ascontiguousarray would make a scalar 1-d)
        data = data.copy(order="C")
    space = _SCALAR if data.shape == () else h5s.create_simple(data.shape)
    tid, mtype = hdf5_type(data.dtype), h5t.py_create(data.dtype)
    raw = capi.layout(data, mtype, tid) if data.size else None
    direct = capi.available() and (raw is not None or not data.size)
    return Prepared(name.encode(), tid, space, data, mtype, direct, raw)


def create(oid: h5py.h5o.ObjectID, name: str, value: Any) -> None:
    """Create attribute ``name`` (which must not exist) on the object ``oid``."""
    if isinstance(value, str):  # (a root's one per leaf: 13 µs this way, 19 through prepare)
        raw = capi.text(value, _STR_TYPE)
        if raw is not None and capi.create(oid, name.encode(), _STR_TYPE, _SCALAR, raw):
            return
        attr = h5a.create(oid, name.encode(), _STR_TYPE, _SCALAR)
        attr.write(np.array(value, dtype=_STR_DTYPE), mtype=_STR_MEMTYPE)
        return
    create_prepared(oid, prepare(name, value))


def create_text(oid: h5py.h5o.ObjectID, name: str, raw: bytes) -> None:
    """``create`` of a string attribute given as its UTF-8 bytes, which HDF5 is handed itself
    (``capi``): a 27 MB ``__spec__`` as a ``str`` and its encoding for HDF5 were 54 MB at
    once, the peak of a rewrite at 150k leaves (issue 33)."""
    value = capi.text(raw, _STR_TYPE)
    if value is None or not capi.create(oid, name.encode(), _STR_TYPE, _SCALAR, value):
        write_text(h5a.create(oid, name.encode(), _STR_TYPE, _SCALAR), raw)


def write_text(attr: h5a.AttrID, raw: bytes) -> None:
    """Write the UTF-8 text ``raw`` into the string attribute ``attr``: HDF5 is handed ``raw``
    itself (``capi``), else h5py writes it (and names the error HDF5 reports)."""
    if not capi.write(attr, capi.text(raw, attr.get_type())):
        attr.write(np.array(raw.decode("utf-8"), dtype=_STR_DTYPE), mtype=_STR_MEMTYPE)


def create_prepared(oid: h5py.h5o.ObjectID, p: Prepared) -> None:
    if p.direct and capi.create(oid, p.name, p.tid, p.space, p.raw):
        return
    attr = h5a.create(oid, p.name, p.tid, p.space)
    if p.data.size:
        attr.write(p.data, mtype=p.mtype)


def delete_all(oid: h5py.h5o.ObjectID) -> None:
    for _ in range(h5a.get_num_attrs(oid)):
        h5a.delete(oid, index=0, index_type=h5py.h5.INDEX_CRT_ORDER, order=h5py.h5.ITER_NATIVE)


def get_value(obj: h5py.HLObject, name: str, default: Any = None) -> Any:
    """``obj.attrs.get(name, default)`` for a numeric or boolean attribute (a numpy scalar or
    array) at a fifth of its cost; strings and anything unusual are read by h5py."""
    try:
        attr = h5a.open(obj.id, name.encode())
    except KeyError:
        return default
    dtype = attr.dtype
    if dtype.kind not in "biuf" or attr.get_space().get_simple_extent_type() == h5s.NULL:
        return obj.attrs[name]
    out = np.empty(attr.shape, dtype=dtype)
    attr.read(out)
    return out[()] if out.shape == () else out


def get_text(obj: h5py.HLObject, name: str, default: Any = None) -> Any:
    """``obj.attrs.get(name, default)``, fast for a scalar variable-length string (as ``str``);
    any other attribute is read by h5py."""
    try:
        attr = h5a.open(obj.id, name.encode())
    except KeyError:
        return default
    tid = attr.get_type()
    if attr.shape != () or tid.get_class() != h5t.STRING or not tid.is_variable_str():
        return obj.attrs[name]
    out = np.empty((), dtype=_STR_DTYPE)
    attr.read(out, mtype=_STR_MEMTYPE)
    value = out[()]
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
