"""Pickled objects inside checkpoints: kept opaque, decoded only when the caller opts in.

A pickled ``bytes`` object (how ``save`` stores a ``bytes`` leaf) is read as ``bytes`` in every
mode, and a pickled numpy scalar (how the real writer stores ``np.float32(1.5)``, ``np.int64``,
``np.bool_``: ``scalar(dtype("f4"), raw bytes)``) as that numpy scalar: its two globals are stood in
for by checks that build it from a plain numeric dtype and exactly its bytes, and nothing else.
``"data"`` decoding accepts only pickles made of plain data (bytes, str, numbers, numpy scalars,
containers): any other global is refused, so nothing can be imported or called.
``"trusted"`` runs the real unpickler and must only be used on files you trust.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import re
import struct
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ckpt_migrate.errors import UnsupportedContentError
from ckpt_migrate.format import dtypes
from ckpt_migrate.format.tree import (
    MemoryData,
    Node,
    OpaqueLeaf,
    TensorLeaf,
    leaf_objects,
    map_leaves,
)

ObjectMode = Literal["opaque", "data", "trusted"]
NUMPY_SCALAR = "numpy scalar"  # the type_hint of a numpy scalar ``save`` pickled


@dataclass(frozen=True)
class OpaqueObject:
    """A pickled value that was not unpickled; saving it again writes the same bytes."""

    payload: bytes
    type_hint: str = ""

    def __repr__(self) -> str:
        return f"OpaqueObject({len(self.payload)} pickled bytes)"


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refers to {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("uses persistent ids")


# A numpy scalar's pickle (numpy 1.x and 2.x): ``scalar(dtype(SPEC, False, True), RAW)`` with the
# dtype's state ``(3, ORDER, None, None, None, -1, -1, 0)`` set by BUILD in between.
_SCALAR_GLOBALS = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}
_PLAIN_SPEC = re.compile(r"[biufc][1-9][0-9]?")  # bool, ints, floats, complex: no object, no fields


class _DTypeSpec:
    """Stands in for ``numpy.dtype`` while unpickling: keeps a plain spec and its byte order."""

    def __init__(self, spec: object, align: object = False, copy: object = True) -> None:
        if not (isinstance(spec, str) and _PLAIN_SPEC.fullmatch(spec)) or align is not False:
            raise pickle.UnpicklingError(f"numpy dtype {spec!r} is not a plain number type")
        self.dtype = np.dtype(spec)

    def __setstate__(self, state: object) -> None:
        if not (
            isinstance(state, tuple)
            and len(state) == 8
            and state[0] == 3
            and state[1] in ("<", ">", "|", "=")
            and state[2:] == (None, None, None, -1, -1, 0)
        ):
            raise pickle.UnpicklingError("numpy dtype state is not a plain number type's")
        self.dtype = self.dtype.newbyteorder(state[1]) if state[1] in "<>" else self.dtype


def _scalar(spec: object, raw: object) -> np.generic:
    if not isinstance(spec, _DTypeSpec) or type(raw) is not bytes:
        raise pickle.UnpicklingError("numpy scalar is not a dtype and its bytes")
    if len(raw) != spec.dtype.itemsize:
        raise pickle.UnpicklingError(f"numpy {spec.dtype} scalar of {len(raw)} bytes")
    return np.frombuffer(raw, spec.dtype)[0]


class _PlainData(_DataOnly):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SCALAR_GLOBALS:
            return _scalar
        if (module, name) == ("numpy", "dtype"):
            self.dtype_named = True
            return _DTypeSpec
        raise pickle.UnpicklingError(f"refers to {module}.{name}")

    def load(self) -> Any:
        self.dtype_named = False
        value = super().load()
        if self.dtype_named:  # (the stand-in, never handed out)
            todo = [value]
            while todo:
                item = todo.pop()
                if isinstance(item, _DTypeSpec):
                    raise pickle.UnpicklingError("holds a numpy dtype outside a scalar")
                if isinstance(item, dict):
                    todo.extend(item.keys())
                    todo.extend(item.values())
                elif isinstance(item, (list, tuple, set, frozenset)):
                    todo.extend(item)
        return value


def numpy_scalar_payload(payload: bytes) -> np.generic | None:
    """The numpy scalar ``payload`` pickles when it pickles exactly one (of a plain number type),
    else None: the real writer pickles every numpy scalar but ``np.float64``."""
    try:
        value = decode_data_pickle(payload)
    except pickle.UnpicklingError:
        return None
    return value if isinstance(value, np.generic) else None


def numpy_scalar_pickle(value: np.generic) -> bytes:
    """``value`` pickled as numpy 1.x and dill (protocol 4) pickle it, whichever numpy runs here:
    the real 2.x writers run numpy 1.x, which cannot import 2.x's ``numpy._core``."""
    dt = value.dtype
    spec, order = f"{dt.kind}{dt.itemsize}", dt.byteorder if dt.byteorder != "=" else "<"
    if not _PLAIN_SPEC.fullmatch(spec):
        raise ValueError(f"numpy {dt} is not a plain number type")
    order = "|" if dt.itemsize == 1 or dt.kind == "b" else order

    def text(s: str) -> bytes:
        return b"\x8c" + bytes([len(s)]) + s.encode() + b"\x94"

    raw = value.tobytes()
    body = b"".join(
        (
            text("numpy.core.multiarray"),
            text("scalar"),
            b"\x93\x94",
            text("numpy"),
            text("dtype"),
            b"\x93\x94",
            text(spec),
            b"\x89\x88\x87\x94R\x94(K\x03",
            text(order),
            b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00t\x94b",
            b"C" + bytes([len(raw)]) + raw + b"\x94",
            b"\x86\x94R\x94.",
        )
    )
    return b"\x80\x04\x95" + struct.pack("<Q", len(body)) + body


def legacy_numpy_scalars(root: Node, release_format: float) -> Node:
    """``root`` with each numpy scalar ``save`` pickled (for 2.5+, whose writer pickles them) as
    the 0-d array the writers of 1.7-2.4 stored (``NumpyArrayH5Type``, FORMAT.md §3.3)."""
    if not any(
        isinstance(leaf, OpaqueLeaf) and leaf.type_hint == NUMPY_SCALAR
        for leaf in leaf_objects(root)
    ):
        return root

    def as_array(ref: Any) -> Any:
        leaf = ref.leaf
        if not (isinstance(leaf, OpaqueLeaf) and leaf.type_hint == NUMPY_SCALAR):
            return leaf
        array = np.asarray(numpy_scalar_payload(leaf.payload))
        try:
            dt = dtypes.from_storage(array.dtype)
        except ValueError:
            raise UnsupportedContentError(
                None,
                f"{ref.name}: a numpy {array.dtype} scalar, which format {release_format} "
                "cannot hold",
                "write release 2.5 or newer (it pickles numpy scalars)",
            ) from None
        return TensorLeaf(dt.name, (), MemoryData(array), numpy=True)

    return map_leaves(root, as_array)


def decode_data_pickle(payload: bytes) -> Any:
    """Unpickle ``payload`` if it holds plain data only; raise ``pickle.UnpicklingError`` if not."""
    try:
        return _PlainData(io.BytesIO(payload)).load()
    except pickle.UnpicklingError:
        raise
    except Exception as exc:
        raise pickle.UnpicklingError(str(exc)) from None


def scalar_payload(payload: bytes) -> tuple[bool, Any]:
    """(True, value) when ``payload`` pickles just a None/bool/int/float/str (e.g. an int beyond
    64 bits that a legacy writer had to pickle); such a payload is read as that value."""
    try:
        value = decode_data_pickle(payload)
    except pickle.UnpicklingError:
        return False, None
    return (
        (True, value) if value is None or type(value) in (bool, int, float, str) else (False, None)
    )


# The opcodes of a pickled ``bytes`` object (protocol 3+): nothing but the bytes themselves.
_BYTES_OPS = frozenset(
    {"PROTO", "FRAME", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "MEMOIZE", "BINPUT", "STOP"}
)


def bytes_payload(payload: bytes) -> bytes | None:
    """The bytes a payload pickles when it pickles exactly one ``bytes`` object, else None.

    ``save`` stores a ``bytes`` leaf pickled (the format has no bytes leaf); reading it back as
    ``bytes`` rather than an ``OpaqueObject`` needs no opt-in: no global, nothing to call."""
    try:
        ops = [op.name for op, _, _ in pickletools.genops(payload)]
    except Exception:
        return None
    if not ops or not set(ops) <= _BYTES_OPS or sum(o.endswith("BYTES") for o in ops) != 1:
        return None
    value = decode_data_pickle(payload)
    return value if type(value) is bytes else None


def decode(payload: bytes, mode: ObjectMode, type_hint: str = "") -> Any:
    if mode == "opaque":
        raw = bytes_payload(payload)
        if raw is not None:
            return raw
        number = numpy_scalar_payload(payload)
        return number if number is not None else OpaqueObject(payload, type_hint)
    if mode == "data":
        try:
            return decode_data_pickle(payload)
        except pickle.UnpicklingError:
            return OpaqueObject(payload, type_hint)
    try:  # trusted: payloads were written by dill; plain pickle reads most of them
        import dill  # type: ignore[import-not-found]

        return dill.loads(payload)
    except ImportError:
        return pickle.loads(payload)
