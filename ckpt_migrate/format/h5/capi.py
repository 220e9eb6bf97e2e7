"""HDF5's own C calls for the attributes written on every dataset, through ``ctypes`` into the
library h5py itself loaded (issue #33).

A format 0.5 dataset carries seven attributes, and an upgrade from a 1.x release writes them on
every tensor (6,096 in the deep benchmark, 150k in a fine-grained MoE). Through h5py each
attribute costs about 16 µs, a good part of it h5py's objects around HDF5's work (an ``AttrID``
registered in its weak registry, the attribute's type and space fetched again to decide on a
conversion buffer). Here the same three calls that ``h5a.create``
and ``AttrID.write`` make, with the same arguments (``H5Acreate_by_name(loc, ".", name, type,
space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)``, ``H5Awrite``, ``H5Aclose``), under h5py's own
lock: the file's bytes are the same (``benchmarks/identical_outputs.py``), and the seven
attributes of a dataset cost 43-70 µs less CPU so (about 40 %; a clone of the deep benchmark's
6,096 datasets re-attributed as an upgrade does, runs interleaved on a shared 2-core machine).

And the checksum of HDF5's version-2 metadata, Bob Jenkins' lookup3 (``H5_checksum_lookup3``,
H5checksum.c, which the library exports): a reader of a root of 7,652 attributes verified its
heap's blocks (0.5 MB) in 0.27-0.41 s with numpy (``lookup3.lookup3_many``) and pure Python; in C
that is under a millisecond. Where the library does not export it, the Python stays.

And ``H5Oget_native_info``'s header fields (``unknown_messages``): which message types an
object header holds, so that a message HDF5 skips for not knowing its type is seen (h5py's
``h5o.get_info`` asks for every field, 47 µs a dataset; the header's alone cost 8 µs).

Only values whose memory layout is plain are written so: numbers and booleans (numpy's bytes,
in the memory type h5py would pass), and variable-length UTF-8 strings (``char *`` pointers, in
the attribute's own type, which is what h5py's conversion hands to ``H5Awrite``). Anything else,
and any call that fails, goes through h5py, which then names the error as before.
"""

from __future__ import annotations

import ctypes
from typing import Any

import h5py
import numpy as np
from h5py import h5a

_HID = ctypes.c_int64
# h5py's lock around every call into HDF5 (its ``phil``), which is not built thread-safe. Calls
# made here, and h5py's own ``read_direct_chunk``/``write_direct_chunk`` before h5py 3.16 (h5py
# pull request #2764), do not take it themselves: HDF5 releases the GIL inside them, and another
# thread's h5py call (a Dask worker's event loop freeing an object) ran in HDF5 beside them.
LOCK = h5py._objects.phil


def _bind() -> tuple[Any, Any, Any] | None:
    """H5Acreate_by_name, H5Awrite and H5Aclose of the HDF5 library h5py's own extension
    modules are linked with (a look-up through an extension's handle searches the libraries it
    needs), or None where that cannot be found: then every write goes through h5py."""
    try:
        lib = ctypes.CDLL(h5a.__file__)
        create, write, close = lib.H5Acreate_by_name, lib.H5Awrite, lib.H5Aclose
    except (OSError, AttributeError):
        return None
    create.restype, write.restype, close.restype = _HID, ctypes.c_int, ctypes.c_int
    create.argtypes = [_HID, ctypes.c_char_p, ctypes.c_char_p, _HID, _HID, _HID, _HID, _HID]
    write.argtypes = [_HID, _HID, ctypes.c_void_p]
    close.argtypes = [_HID]
    return create, write, close


_CALLS = _bind()


def _symbol(name: str, restype: Any, argtypes: list[Any]) -> Any:
    """The function ``name`` of the HDF5 library h5py loaded, typed; None where it is not
    exported."""
    try:
        function = getattr(ctypes.CDLL(h5a.__file__), name)
    except (OSError, AttributeError):
        return None
    function.restype, function.argtypes = restype, argtypes
    return function


class _Space(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("total", "meta", "mesg", "free")]


class _Messages(ctypes.Structure):
    _fields_ = [("present", ctypes.c_uint64), ("shared", ctypes.c_uint64)]


class _Header(ctypes.Structure):  # H5O_hdr_info_t
    _fields_ = [
        *((n, ctypes.c_uint) for n in ("version", "nmesgs", "nchunks", "flags")),
        ("space", _Space),
        ("mesg", _Messages),
    ]


class _NativeInfo(ctypes.Structure):  # H5O_native_info_t
    _fields_ = [("hdr", _Header), ("meta_size", ctypes.c_uint64 * 4)]


_NATIVE_INFO = _symbol("H5Oget_native_info", ctypes.c_int, [_HID, ctypes.c_void_p, ctypes.c_uint])
_INFO_HDR = 0x0008  # H5O_NATIVE_INFO_HDR
_UNKNOWN_ID = 25  # H5O_UNKNOWN_ID: what HDF5 makes of a message type it does not know


def unknown_messages(obj: h5py.h5o.ObjectID) -> bool:
    """Whether ``obj``'s object header holds a message of a type HDF5 does not know, which it
    skips (one changed byte of an unchecksummed version-1 header can make a flag attribute's
    message so): the header's message-type bits, ``H5Oget_native_info``, about 8 µs. False
    where the call is not exported or fails."""
    if _NATIVE_INFO is None:
        return False
    info = _NativeInfo()
    with LOCK:
        if _NATIVE_INFO(obj.id, ctypes.byref(info), _INFO_HDR) < 0:
            return False
    return bool(info.hdr.mesg.present >> _UNKNOWN_ID)


_LOOKUP3 = _symbol(
    "H5_checksum_lookup3", ctypes.c_uint32, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32]
)
_GARBAGE_COLLECT = _symbol("H5garbage_collect", ctypes.c_int, [])


def garbage_collect() -> None:
    """Hand the blocks HDF5 keeps on its free lists for reuse back to the C heap
    (``H5garbage_collect``; where it is not exported, nothing): what a closed file's caches
    held stays on them otherwise."""
    if _GARBAGE_COLLECT is not None:
        with LOCK:
            _GARBAGE_COLLECT()


def lookup3(data: bytes, seed: int = 0) -> int | None:
    """lookup3 ``hashlittle`` of ``data`` by HDF5's own code, None where it is not exported
    (then ``root.lookup3``, in Python, computes it)."""
    if _LOOKUP3 is None:
        return None
    if not isinstance(data, bytes):
        data = bytes(data)
    return _LOOKUP3(data, len(data), seed)


class Value:
    """An attribute's value laid out for ``H5Awrite``: the memory type's identifier and the
    address of the bytes (kept alive by ``keep``)."""

    __slots__ = ("address", "keep", "mtype")

    def __init__(self, mtype: int, address: int, keep: Any) -> None:
        self.mtype, self.address, self.keep = mtype, address, keep


def layout(data: np.ndarray, mtype: h5py.h5t.TypeID, file_type: h5py.h5t.TypeID) -> Value | None:
    """``data`` as ``H5Awrite`` takes it, or None for a value h5py is to write (``_CALLS``
    missing, a layout other than plain numbers and UTF-8 strings, a string holding NUL, which
    HDF5 would cut short)."""
    if _CALLS is None or not data.flags.c_contiguous:
        return None
    if data.dtype.kind in "biuf":
        return Value(mtype.id, data.ctypes.data, data)
    if data.dtype.kind != "O" or h5py.check_string_dtype(data.dtype) != _UTF8:
        return None
    if not (file_type.get_class() == h5py.h5t.STRING and file_type.is_variable_str()):
        return None
    texts = []
    for item in data.ravel().tolist():
        raw = _utf8(item)
        if raw is None:
            return None
        texts.append(raw)
    pointers = (ctypes.c_char_p * len(texts))(*texts)
    return Value(file_type.id, ctypes.addressof(pointers), (pointers, texts))


_UTF8 = h5py.check_string_dtype(h5py.string_dtype())  # variable-length UTF-8


def text(value: str | bytes, file_type: h5py.h5t.TypeID) -> Value | None:
    """A scalar variable-length string attribute's value, as :func:`layout` lays it out
    (``bytes``: the UTF-8 text itself, handed to HDF5 without a copy)."""
    raw = _utf8(value) if isinstance(value, str) else value
    if _CALLS is None or raw is None or b"\0" in raw:
        return None
    pointer = ctypes.c_char_p(raw)
    return Value(file_type.id, ctypes.addressof(pointer), (pointer, raw))


def create(
    oid: h5py.h5o.ObjectID,
    name: bytes,
    tid: h5py.h5t.TypeID,
    space: h5py.h5s.SpaceID,
    value: Value | None,
) -> bool:
    """Create attribute ``name`` on ``oid`` and write ``value`` (None: nothing to write, an
    empty space); False if HDF5 refused, with nothing created (the caller then makes the same
    calls through h5py, which raise the error HDF5 reports)."""
    assert _CALLS is not None
    make, write, close = _CALLS
    with LOCK:
        attr = make(oid.id, b".", name, tid.id, space.id, 0, 0, 0)
        if attr < 0:
            return False
        written = value is None or write(attr, value.mtype, value.address) >= 0
        close(attr)
    if not written:  # as if never made: the caller's h5py calls then raise
        h5a.delete(oid, name)
    return written


def write(attr: h5a.AttrID, value: Value | None) -> bool:
    """``H5Awrite`` of ``value`` to the open attribute ``attr``; False where there is no value
    or HDF5 refused (the caller then writes it through h5py, which raises the error HDF5
    reports)."""
    if value is None:
        return False
    assert _CALLS is not None
    with LOCK:
        return _CALLS[1](attr.id, value.mtype, value.address) >= 0


def available() -> bool:
    return _CALLS is not None


def _utf8(item: Any) -> bytes | None:
    """A ``str`` as the bytes HDF5 is to store, or None where h5py is to write it (no ``str``,
    a NUL that HDF5 would cut the string at, text UTF-8 cannot encode: h5py raises for it)."""
    if not isinstance(item, str):
        return None
    try:
        raw = item.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return None if b"\0" in raw else raw
