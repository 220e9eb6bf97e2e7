"""Pickled objects inside checkpoints: kept opaque, decoded only when the caller opts in.

A pickled ``bytes`` object (how ``save`` stores a ``bytes`` leaf) is read as ``bytes`` in every
mode. ``"data"`` decoding accepts only pickles made of plain data (bytes, str, numbers, containers):
any opcode that names a global is refused, so nothing can be imported or called.
``"trusted"`` runs the real unpickler and must only be used on files you trust.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from dataclasses import dataclass
from typing import Any, Literal

ObjectMode = Literal["opaque", "data", "trusted"]


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


def decode_data_pickle(payload: bytes) -> Any:
    """Unpickle ``payload`` if it holds plain data only; raise ``pickle.UnpicklingError`` if not."""
    try:
        return _DataOnly(io.BytesIO(payload)).load()
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
        return raw if raw is not None else OpaqueObject(payload, type_hint)
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
