"""Decoding a legacy ``__spec__`` (formats 0.1–0.4) into the neutral tree, and the entry points.

``spec_unpickler`` reads the pickle into inert records without running code; this module checks
their shape and turns them into the tree of ``format.tree``. Every leaf becomes a fresh
``MissingLeaf`` carrying its FORMAT.md §2.2 dotted name, for the caller to replace with the stored
value. Node types and contexts (FORMAT.md §2.1, §6.2): dict-like nodes have the key list as
context; list/tuple/set have ``None``; a namedtuple node has type ``collections.namedtuple`` and its
class as context.
"""

from __future__ import annotations

import io
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ckpt_migrate.errors import (
    CkptError,
    CorruptCheckpointError,
    UnsafeContentError,
    UnsupportedContentError,
)
from ckpt_migrate.format import budgets
from ckpt_migrate.format.legacy.spec_unpickler import (
    BUILTIN_TYPES,
    DEFAULTDICT,
    DEQUE,
    NAMEDTUPLE,
    ORDERED_DICT,
    TENSOR_SCALAR_DICT,
    UNSAFE_FIX,
    Malformed,
    NamedTupleClass,
    SpecRecord,
    SpecUnpickler,
    Unsafe,
    describe,
    printable,
)
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.tree import (
    DictNode,
    Key,
    MissingLeaf,
    NamedTupleNode,
    Node,
    SeqNode,
    format_path,
)

PathLike = str | Path | None
Style = Literal["plain", "dataclass"]

_CORRUPT_FIX = "the file is damaged, or its __spec__ was not written by cstorch"


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class SpecInfo:
    """What a legacy ``__spec__`` pickle says, beyond the tree itself."""

    root: Node
    had_tensor_scalar_dict: bool  # a 1.7-era TensorScalarDict node was read as a plain dict
    protocol: int  # the PROTO opcode's value; 0 when absent (protocol 0 or 1)
    style: Style  # "dataclass" when the root's state carried num_nodes (torch >= 2.2)


# --------------------------------------------------------------------------- records -> tree


class _Converter:
    """Turns decoded records into the neutral tree, naming leaves by FORMAT.md §2.2."""

    def __init__(self, path: PathLike):
        self.path = path
        self.visited = 0
        self.active: set[int] = set()
        self.had_tensor_scalar_dict = False

    def unsupported(self, what: str, at: tuple[Key, ...]) -> UnsupportedContentError:
        return UnsupportedContentError(
            self.path,
            f"legacy __spec__ has a {what} node at {format_path(at)}, "
            "which the neutral checkpoint tree cannot represent",
            "re-save the state dict with a dict or list in its place",
        )

    def convert(self, rec: Any, at: tuple[Key, ...], name: str = "") -> Node:
        """``name`` is ``at`` joined with dots (FORMAT.md §2.2), built as the walk descends."""
        # A spec is a tree, but BINGET can make a small pickle describe an exponentially large
        # DAG: the node budget is checked while expanding, and paths are formatted only for errors.
        if not isinstance(rec, SpecRecord) or not rec.built:
            raise Malformed(f"{format_path(at)} is {describe(rec)}, not a TreeSpec")
        self.visited += 1
        if self.visited > budgets.MAX_SPEC_NODES:
            raise budgets.too_many_nodes(self.path)
        if len(at) > budgets.MAX_DEPTH:
            raise budgets.too_deep(self.path, budgets.short(format_path(at)))
        children = rec.children
        if not isinstance(children, (list, tuple)):
            raise Malformed(f"children_specs at {format_path(at)} is {describe(children)}")
        typ = rec.type
        if typ is None:
            if children:
                raise Malformed(f"the leaf spec at {format_path(at)} has children")
            return MissingLeaf(name)
        if id(rec) in self.active:
            raise Malformed(f"the spec at {format_path(at)} contains itself")
        self.active.add(id(rec))
        try:
            return self._container(rec, typ, list(children), at, name)
        finally:
            self.active.discard(id(rec))

    def _container(
        self, rec: SpecRecord, typ: Any, kids: list, at: tuple[Key, ...], name: str
    ) -> Node:
        ctx = rec.context
        if typ is BUILTIN_TYPES["dict"] or typ is ORDERED_DICT or typ is TENSOR_SCALAR_DICT:
            if typ is TENSOR_SCALAR_DICT:
                self.had_tensor_scalar_dict = True
            keys = self._keys(ctx, len(kids), at)
            items = [
                (k, self.convert(c, (*at, k), _join(name, k)))
                for k, c in zip(keys, kids, strict=True)
            ]
            origin = "TensorScalarDict" if typ is TENSOR_SCALAR_DICT else None
            return DictNode(items, ordered=typ is ORDERED_DICT, origin=origin)
        for kind in ("list", "tuple", "set"):
            if typ is BUILTIN_TYPES[kind]:
                # The context of these is None; nothing reads it, so it is not checked.
                nodes = [self.convert(c, (*at, i), _join(name, i)) for i, c in enumerate(kids)]
                return SeqNode(kind, nodes)  # type: ignore[arg-type]
        if typ is NAMEDTUPLE:
            if not isinstance(ctx, NamedTupleClass):
                raise Malformed(
                    f"the namedtuple at {format_path(at)} has {describe(ctx)} as its class"
                )
            if len(ctx.fields) != len(kids):
                raise Malformed(
                    f"namedtuple {printable(ctx.name)} at {format_path(at)} has {len(ctx.fields)} "
                    f"fields but {len(kids)} children"
                )
            nodes = [self.convert(c, (*at, i), _join(name, i)) for i, c in enumerate(kids)]
            return NamedTupleNode(ctx.name, ctx.fields, nodes)
        if typ is DEFAULTDICT:
            raise self.unsupported("collections.defaultdict", at)
        if typ is DEQUE:
            raise self.unsupported("collections.deque", at)
        raise Malformed(f"the node type at {format_path(at)} is {describe(typ)}")

    def _keys(self, ctx: Any, count: int, at: tuple[Key, ...]) -> list[Key]:
        if not isinstance(ctx, (list, tuple)):
            raise Malformed(
                f"the keys of the dict at {format_path(at)} are {describe(ctx)}, not a list"
            )
        if len(ctx) != count:
            raise Malformed(
                f"the dict at {format_path(at)} has {len(ctx)} keys but {count} children"
            )
        seen: set[Key] = set()
        for key in ctx:
            if not isinstance(key, (str, int)):
                raise Malformed(f"the dict at {format_path(at)} has a key that is {describe(key)}")
            if key in seen:
                raise Malformed(
                    f"the dict at {format_path(at)} repeats the key {printable(repr(key))}"
                )
            seen.add(key)
        return list(ctx)


def _join(name: str, key: Key) -> str:
    return f"{name}.{key}" if name else str(key)


# --------------------------------------------------------------------------- decoding API


def _corrupt(path: PathLike, reason: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        path, f"legacy __spec__ is not a readable pickle ({printable(reason, 120)})", _CORRUPT_FIX
    )


def decode_spec_info(
    data: bytes, path: PathLike = None, progress: Progress | None = None
) -> SpecInfo:
    """Decode ``dill.dumps(TreeSpec)`` bytes safely into a :class:`SpecInfo` (FORMAT.md §6.3).

    Raises ``UnsafeContentError`` for any global outside the allowlist, ``CorruptCheckpointError``
    for anything that is not a well-formed TreeSpec pickle, and ``UnsupportedContentError`` for
    ``defaultdict``/``deque`` nodes, which the neutral tree has no way to express (they do not occur
    in model, optimizer or scheduler state; their §2.2 leaf names are broken anyway).
    """
    unpickler = SpecUnpickler(io.BytesIO(bytes(data)), progress)
    try:
        root_rec = unpickler.load()
        if not isinstance(root_rec, SpecRecord):
            raise Malformed(f"it holds {describe(root_rec)}, not a TreeSpec")
        converter = _Converter(path)
        root = converter.convert(root_rec, ())
    except Unsafe as exc:
        raise UnsafeContentError(path, str(exc), UNSAFE_FIX) from None
    except Malformed as exc:
        raise _corrupt(path, str(exc)) from None
    except RecursionError:
        raise _corrupt(path, "nested too deeply") from None
    except pickle.UnpicklingError as exc:
        raise _corrupt(path, "truncated" if "truncated" in str(exc) else str(exc)) from None
    except CkptError:
        raise
    except (EOFError, struct.error):
        raise _corrupt(path, "truncated") from None
    except Exception as exc:  # the stock opcode handlers' reactions to garbage (nothing else runs)
        raise _corrupt(path, f"{type(exc).__name__}: {exc}") from None
    return SpecInfo(
        root=root,
        had_tensor_scalar_dict=converter.had_tensor_scalar_dict,
        protocol=unpickler.proto,
        style="dataclass" if root_rec.has_num_nodes else "plain",
    )


def decode_spec(data: bytes, *, path: PathLike = None) -> Node:
    """The root of the neutral tree described by a legacy ``__spec__`` pickle."""
    return decode_spec_info(data, path).root


def spec_bytes_from_hex(text: str | bytes, path: PathLike = None) -> bytes:
    """The pickle bytes of a ``__spec__`` attribute value, lower-case hex text (FORMAT.md §3.1)."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("ascii")
        except UnicodeDecodeError:
            raise CorruptCheckpointError(
                path, "legacy __spec__ is not hex text (non-ASCII bytes)", _CORRUPT_FIX
            ) from None
    text = text.strip()
    if not text:
        raise CorruptCheckpointError(path, "legacy __spec__ is empty", _CORRUPT_FIX)
    try:
        return bytes.fromhex(text)
    except ValueError as exc:
        raise CorruptCheckpointError(
            path, f"legacy __spec__ is not hex text ({exc})", _CORRUPT_FIX
        ) from None


def decode_spec_hex(text: str | bytes, path: PathLike = None) -> Node:
    """:func:`decode_spec` of the hex text stored in the ``__spec__`` attribute."""
    return decode_spec_info(spec_bytes_from_hex(text, path), path).root
