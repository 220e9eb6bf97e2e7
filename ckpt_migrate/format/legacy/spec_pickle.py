"""Legacy ``__spec__`` pickles (formats 0.1–0.4): a safe decoder and a dill-compatible encoder.

Releases 1.7–2.4 store the state-dict structure as the root attribute ``__spec__``, the hex text of
``dill.dumps(torch.utils._pytree.TreeSpec)`` (FORMAT.md §3.1). This module reads and writes those
bytes **without torch and without dill**.

Decoding (FORMAT.md §6.3) uses the pure-Python ``pickle._Unpickler`` with every opcode that could
reach code gated:

* ``find_class`` is the only way to name a global. It returns inert stand-ins for the allowlist of
  §6.3 and refuses everything else; nothing is ever imported.
* ``REDUCE`` only calls the stand-in functions (``_load_type``, ``_create_namedtuple``, ``setattr``
  on a namedtuple, ``copyreg``), each of which checks its arguments and builds plain records.
* ``NEWOBJ``/``NEWOBJ_EX``/``INST``/``OBJ`` only make empty TreeSpec/LeafSpec records; ``BUILD``
  only goes to a record's ``__setstate__``.
* ``EXT1/2/4`` (the process-wide copyreg extension registry and its cache) and persistent ids are
  refused outright.

The records are then turned into the neutral tree of ``tree.py``; every leaf becomes a fresh
``MissingLeaf`` carrying its §2.2 dotted name, for the caller to replace with the stored value.

Encoding reproduces what ``dill.dumps(spec)`` writes (FORMAT.md §6.2, FORMAT_EXAMPLES A.1). It
drives the same pure-Python ``pickle._Pickler`` that dill subclasses, so framing, memoisation and
batching are the stock ones; only ``save_global`` is replaced so that
``torch.utils._pytree.TreeSpec`` and friends are written by name without importing them.

Which TreeSpec state each torch writes (read in torch's ``torch/utils/_pytree.py``):

* ``"plain"`` — torch ≤2.0 (releases 1.7–2.0): a plain class (a plain dataclass in 2.0); state
  ``type, context, children_specs, num_leaves``; a new ``LeafSpec()`` per leaf.
* ``"dataclass"`` — torch 2.2–2.4 (releases 2.2–2.4; 2.1 per the release table): a frozen dataclass
  whose ``__post_init__`` adds ``num_nodes, num_leaves, num_children``; torch 2.4 returns one shared
  ``_LEAF_SPEC`` for every leaf, so dill memoises it and later leaves are a ``BINGET``.
* torch ≥2.5 (e.g. 2.13, never used by a legacy release): a frozen *slots* dataclass whose state is
  the list ``[type, _context, _children, num_nodes, num_leaves, num_children]``. The decoder accepts
  it (style ``"dataclass"``); the encoder does not write it.

Node types and contexts (FORMAT.md §2.1, §6.2): dict-like nodes have the key list as context;
list/tuple/set have ``None``; a namedtuple node has type ``collections.namedtuple`` and its class as
context, which dill pickles by value as ``dill._dill._create_namedtuple(name, fields, module)``.
"""

from __future__ import annotations

import _compat_pickle
import copyreg
import io
import keyword
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from ckpt_migrate.errors import (
    CkptError,
    CorruptCheckpointError,
    UnsafeContentError,
    UnsupportedContentError,
)
from ckpt_migrate.format.tree import (
    LEAF_TYPES,
    DictNode,
    Key,
    MissingLeaf,
    NamedTupleNode,
    Node,
    SeqNode,
    format_path,
)

__all__ = [
    "SpecInfo",
    "decode_spec",
    "decode_spec_hex",
    "decode_spec_info",
    "encode_spec",
    "encode_spec_hex",
    "spec_bytes_from_hex",
]

PathLike = str | Path | None
Style = Literal["plain", "dataclass"]

_UNSAFE_FIX = "the file may be malicious; it was not loaded"
_CORRUPT_FIX = "the file is damaged, or its __spec__ was not written by cstorch"

# A spec is a tree, but BINGET can make a small pickle describe an exponentially large DAG. Real
# state dicts have well under a million spec nodes; this only stops such a bomb.
_MAX_NODES = 5_000_000


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class SpecInfo:
    """What a legacy ``__spec__`` pickle says, beyond the tree itself."""

    root: Node
    had_tensor_scalar_dict: bool  # a 1.7-era TensorScalarDict node was read as a plain dict
    protocol: int  # the PROTO opcode's value; 0 when absent (protocol 0 or 1)
    style: Style  # "dataclass" when the root's state carried num_nodes (torch >= 2.2)


# --------------------------------------------------------------------------- decoder stand-ins


class _Unsafe(Exception):
    """The pickle asks for something a spec never contains (becomes UnsafeContentError)."""


class _Malformed(Exception):
    """The pickle is readable but is not a TreeSpec (becomes CorruptCheckpointError)."""


def _printable(text: str, limit: int = 80) -> str:
    """A name taken from the file, safe to put in a one-line message."""
    out = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return out if len(out) <= limit else out[: limit - 1] + "…"


def _describe(obj: Any) -> str:
    if isinstance(obj, (_Marker, _StandInFunction, _RecordClass)):
        return obj.qualname
    if isinstance(obj, _SpecRecord):
        return "a TreeSpec object"
    if isinstance(obj, _NamedTupleClass):
        return f"namedtuple class {_printable(obj.name)}"
    return f"a {type(obj).__name__}"


def _refers_to(what: str) -> _Unsafe:
    return _Unsafe(f"legacy spec pickle refers to {what}, which a checkpoint spec never contains")


def _calls(obj: Any, how: str = "calls") -> _Unsafe:
    return _Unsafe(f"legacy spec pickle {how} {_describe(obj)}, which a checkpoint spec never does")


class _Marker:
    """An allowlisted global that is only ever data (a node type, a default_factory); never called.

    No container protocol methods (``append``, ``extend``, ``add``, ``__setitem__``), so
    ``APPEND``/``SETITEM`` on it fail instead of doing anything.
    """

    __slots__ = ("qualname",)

    def __init__(self, qualname: str):
        self.qualname = qualname

    def __repr__(self) -> str:
        return f"<{self.qualname}>"


class _RecordClass:
    """Stand-in for ``torch.utils._pytree.TreeSpec``/``LeafSpec``: ``NEWOBJ`` makes a record."""

    __slots__ = ("leaf", "qualname")

    def __init__(self, qualname: str, leaf: bool):
        self.qualname = qualname
        self.leaf = leaf

    def new(self) -> _SpecRecord:
        return _SpecRecord(self)


class _SpecRecord:
    """One TreeSpec/LeafSpec object: only the fields a spec has, filled by ``BUILD``."""

    __slots__ = ("built", "children", "cls", "context", "has_num_nodes", "type")

    def __init__(self, cls: _RecordClass):
        self.cls = cls
        self.built = False
        self.type: Any = None
        self.context: Any = None
        self.children: Any = []
        self.has_num_nodes = False

    def __setstate__(self, state: Any) -> None:
        """Take ``type``, ``context`` and ``children_specs``; ignore the ``num_*`` counts.

        Accepted shapes (FORMAT.md §6.2 and torch's ``_pytree.py``): the instance ``__dict__``
        (torch ≤2.4, also as pickle's ``(dict, slotstate)`` pair), and the field-value list of the
        frozen slots dataclass of torch ≥2.5.
        """
        if self.built:
            raise _Malformed("a TreeSpec object is built twice")
        if (
            isinstance(state, tuple)
            and len(state) == 2
            and (state[0] is None or isinstance(state[0], dict))
            and isinstance(state[1], dict)
        ):
            state = {**(state[0] or {}), **state[1]}
        if isinstance(state, dict):
            if "type" not in state:
                raise _Malformed("a TreeSpec state has no 'type'")
            self.type = state["type"]
            self.context = _first_of(state, ("context", "_context"))
            self.children = _first_of(state, ("children_specs", "_children_specs", "_children"))
            self.has_num_nodes = "num_nodes" in state
        elif isinstance(state, list) and len(state) == 6:
            self.type, self.context, self.children = state[0], state[1], state[2]
            self.has_num_nodes = True
        else:
            raise _Malformed(f"a TreeSpec state is {_describe(state)}, not a dict")
        self.built = True


def _first_of(state: dict, names: tuple[str, ...]) -> Any:
    for name in names:
        if name in state:
            return state[name]
    raise _Malformed(f"a TreeSpec state has no {names[0]!r}")


class _NamedTupleClass:
    """What ``dill._dill._create_namedtuple`` would have built: only the name and field names."""

    __slots__ = ("fields", "name")

    def __init__(self, name: str, fields: tuple[str, ...]):
        self.name = name
        self.fields = fields


class _StandInFunction:
    """An allowlisted function: ``REDUCE`` runs ``impl``, which checks its arguments."""

    __slots__ = ("impl", "qualname")

    def __init__(self, qualname: str, impl: Callable[..., Any]):
        self.qualname = qualname
        self.impl = impl


_BUILTIN_TYPES = {name: _Marker(f"builtins.{name}") for name in ("dict", "list", "tuple", "set")}
_NONE_TYPE = _Marker("builtins.NoneType")
_ORDERED_DICT = _Marker("collections.OrderedDict")
_NAMEDTUPLE = _Marker("collections.namedtuple")
_DEFAULTDICT = _Marker("collections.defaultdict")
_DEQUE = _Marker("collections.deque")
_TENSOR_SCALAR_DICT = _Marker("TensorScalarDict")
_OBJECT = _Marker("builtins.object")
_TREESPEC = _RecordClass("torch.utils._pytree.TreeSpec", leaf=False)
_LEAFSPEC = _RecordClass("torch.utils._pytree.LeafSpec", leaf=True)


def _sl_load_type(name: Any) -> _Marker:
    """``dill._dill._load_type(name)``: dill's by-name pickling of builtin types (§6.2)."""
    if name == "NoneType":
        return _NONE_TYPE
    if isinstance(name, str) and name in _BUILTIN_TYPES:
        return _BUILTIN_TYPES[name]
    shown = _printable(name) if isinstance(name, str) else _describe(name)
    raise _refers_to(f"dill._dill._load_type({shown!r})")


def _sl_create_namedtuple(
    name: Any, fields: Any, module: Any, defaults: Any = None
) -> _NamedTupleClass:
    """``dill._dill._create_namedtuple``: dill rebuilds namedtuple classes by value (§6.2).

    The real function imports ``module`` first; the stand-in never looks at it.
    """
    if not isinstance(name, str) or not isinstance(module, str):
        raise _Malformed("a namedtuple class has a non-text name or module")
    if not isinstance(fields, (tuple, list)) or not all(isinstance(f, str) for f in fields):
        raise _Malformed(f"namedtuple {_printable(name)} has non-text field names")
    if not name.isidentifier() or not all(f.isidentifier() for f in fields):
        raise _Malformed(f"namedtuple {_printable(name)} has names that are not identifiers")
    return _NamedTupleClass(name, tuple(fields))


def _sl_setattr(target: Any, name: Any, value: Any) -> None:
    """``builtins.setattr``: dill's post-processing that sets a namedtuple's ``__qualname__``."""
    if not isinstance(target, _NamedTupleClass):
        raise _calls(target, "calls builtins.setattr on")


def _sl_reconstructor(cls: Any, base: Any, state: Any) -> _SpecRecord:
    """``copyreg._reconstructor``: how protocols 0/1 create an object of a plain class."""
    if not isinstance(cls, _RecordClass):
        raise _calls(cls, "calls copyreg._reconstructor for")
    if base is not _OBJECT or state is not None:
        raise _Malformed("copyreg._reconstructor with an unexpected base or state")
    return cls.new()


def _sl_newobj(cls: Any, *args: Any) -> _SpecRecord:
    """``copyreg.__newobj__``: the protocol-<2 spelling of ``NEWOBJ``."""
    if not isinstance(cls, _RecordClass):
        raise _calls(cls, "calls copyreg.__newobj__ for")
    if args:
        raise _Malformed("a TreeSpec object is created with arguments")
    return cls.new()


# FORMAT.md §6.3, plus the inert builtins a defaultdict default_factory could name.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch.utils._pytree", "TreeSpec"): _TREESPEC,
    ("torch.utils._pytree", "LeafSpec"): _LEAFSPEC,
    ("dill._dill", "_load_type"): _StandInFunction("dill._dill._load_type", _sl_load_type),
    ("dill._dill", "_create_namedtuple"): _StandInFunction(
        "dill._dill._create_namedtuple", _sl_create_namedtuple
    ),
    ("collections", "OrderedDict"): _ORDERED_DICT,
    ("collections", "namedtuple"): _NAMEDTUPLE,
    ("collections", "defaultdict"): _DEFAULTDICT,
    ("collections", "deque"): _DEQUE,
    ("cerebras_pytorch.utils.tensor_scalar_dict", "TensorScalarDict"): _TENSOR_SCALAR_DICT,
    ("cerebras.pytorch.utils.tensor_scalar_dict", "TensorScalarDict"): _TENSOR_SCALAR_DICT,
    ("builtins", "setattr"): _StandInFunction("builtins.setattr", _sl_setattr),
    ("copyreg", "_reconstructor"): _StandInFunction("copyreg._reconstructor", _sl_reconstructor),
    ("copyreg", "__newobj__"): _StandInFunction("copyreg.__newobj__", _sl_newobj),
    ("builtins", "object"): _OBJECT,
    **{("builtins", name): marker for name, marker in _BUILTIN_TYPES.items()},
    **{("builtins", n): _Marker(f"builtins.{n}") for n in ("int", "float", "str", "bool", "bytes")},
}

_RECORD_CLASSES = (_TREESPEC, _LEAFSPEC)


class _SpecUnpickler(pickle._Unpickler):  # type: ignore[name-defined,misc]
    """``pickle._Unpickler`` with every opcode that can run or import something gated."""

    # Only the stock handlers: a library that patched the shared table must not reach in here.
    dispatch: ClassVar[dict[int, Callable[..., None]]] = {
        code: handler
        for code, handler in pickle._Unpickler.dispatch.items()  # type: ignore[attr-defined]
        if getattr(handler, "__module__", None) == "pickle"
    }

    def find_class(self, module: str, name: str) -> Any:
        if self.proto < 3:  # Python 2 names; a plain table look-up, never an import
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
        found = _ALLOWED.get((module, name))
        if found is None:
            raise _refers_to(f"{_printable(module)}.{_printable(name)}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise _refers_to("a persistent id")

    def _load_reduce(self) -> None:
        stack = self.stack
        args = stack.pop()
        func = stack[-1]
        if not isinstance(func, _StandInFunction):
            if isinstance(func, (_Marker, _RecordClass)):
                raise _calls(func)
            raise _Malformed(f"REDUCE calls {_describe(func)}")
        if not isinstance(args, tuple):
            raise _Malformed("REDUCE arguments are not a tuple")
        try:
            stack[-1] = func.impl(*args)
        except TypeError:  # wrong number of arguments for the stand-in
            raise _Malformed(f"{func.qualname} called with {len(args)} arguments") from None

    dispatch[pickle.REDUCE[0]] = _load_reduce

    def _new_record(self, cls: Any, args: Any, kwargs: Any = None) -> _SpecRecord:
        if not isinstance(cls, _RecordClass):
            if isinstance(cls, (_Marker, _StandInFunction)):
                raise _calls(cls, "instantiates")
            raise _Malformed(f"an object of {_describe(cls)} is created")
        if args or kwargs:
            raise _Malformed("a TreeSpec object is created with arguments")
        return cls.new()

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new_record(cls, args))

    dispatch[pickle.NEWOBJ[0]] = _load_newobj

    def _load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new_record(cls, args, kwargs))

    dispatch[pickle.NEWOBJ_EX[0]] = _load_newobj_ex

    def _load_inst(self) -> None:
        module = self.readline()[:-1].decode("ascii")
        name = self.readline()[:-1].decode("ascii")
        cls = self.find_class(module, name)
        self.append(self._new_record(cls, self.pop_mark()))

    dispatch[pickle.INST[0]] = _load_inst

    def _load_obj(self) -> None:
        args = self.pop_mark()
        if not args:
            raise _Malformed("OBJ without a class")
        cls = args.pop(0)
        self.append(self._new_record(cls, args))

    dispatch[pickle.OBJ[0]] = _load_obj

    def _load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        if not isinstance(inst, _SpecRecord):
            raise _Malformed(f"BUILD on {_describe(inst)}")
        inst.__setstate__(state)

    dispatch[pickle.BUILD[0]] = _load_build

    def _load_ext(self) -> None:
        # The copyreg registry and pickle's process-wide cache would bypass find_class.
        raise _refers_to("an entry of the copyreg extension registry")

    for _op in (pickle.EXT1, pickle.EXT2, pickle.EXT4):
        dispatch[_op[0]] = _load_ext
    del _op


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

    def convert(self, rec: Any, at: tuple[Key, ...]) -> Node:
        where = format_path(at)
        if not isinstance(rec, _SpecRecord) or not rec.built:
            raise _Malformed(f"{where} is {_describe(rec)}, not a TreeSpec")
        self.visited += 1
        if self.visited > _MAX_NODES:
            raise _Malformed(f"the spec expands to more than {_MAX_NODES} nodes")
        children = rec.children
        if not isinstance(children, (list, tuple)):
            raise _Malformed(f"children_specs at {where} is {_describe(children)}")
        typ = rec.type
        if typ is None:
            if children:
                raise _Malformed(f"the leaf spec at {where} has children")
            return MissingLeaf(".".join(str(k) for k in at))
        if id(rec) in self.active:
            raise _Malformed(f"the spec at {where} contains itself")
        self.active.add(id(rec))
        try:
            return self._container(rec, typ, list(children), at)
        finally:
            self.active.discard(id(rec))

    def _container(self, rec: _SpecRecord, typ: Any, kids: list, at: tuple[Key, ...]) -> Node:
        where = format_path(at)
        ctx = rec.context
        if typ is _BUILTIN_TYPES["dict"] or typ is _ORDERED_DICT or typ is _TENSOR_SCALAR_DICT:
            if typ is _TENSOR_SCALAR_DICT:
                self.had_tensor_scalar_dict = True
            keys = self._keys(ctx, len(kids), at)
            items = [(k, self.convert(c, (*at, k))) for k, c in zip(keys, kids, strict=True)]
            origin = "TensorScalarDict" if typ is _TENSOR_SCALAR_DICT else None
            return DictNode(items, ordered=typ is _ORDERED_DICT, origin=origin)
        for kind in ("list", "tuple", "set"):
            if typ is _BUILTIN_TYPES[kind]:
                # The context of these is None; nothing reads it, so it is not checked.
                nodes = [self.convert(c, (*at, i)) for i, c in enumerate(kids)]
                return SeqNode(kind, nodes)  # type: ignore[arg-type]
        if typ is _NAMEDTUPLE:
            if not isinstance(ctx, _NamedTupleClass):
                raise _Malformed(f"the namedtuple at {where} has {_describe(ctx)} as its class")
            if len(ctx.fields) != len(kids):
                raise _Malformed(
                    f"namedtuple {_printable(ctx.name)} at {where} has {len(ctx.fields)} "
                    f"fields but {len(kids)} children"
                )
            nodes = [self.convert(c, (*at, i)) for i, c in enumerate(kids)]
            return NamedTupleNode(ctx.name, ctx.fields, nodes)
        if typ is _DEFAULTDICT:
            raise self.unsupported("collections.defaultdict", at)
        if typ is _DEQUE:
            raise self.unsupported("collections.deque", at)
        raise _Malformed(f"the node type at {where} is {_describe(typ)}")

    def _keys(self, ctx: Any, count: int, at: tuple[Key, ...]) -> list[Key]:
        where = format_path(at)
        if not isinstance(ctx, (list, tuple)):
            raise _Malformed(f"the keys of the dict at {where} are {_describe(ctx)}, not a list")
        if len(ctx) != count:
            raise _Malformed(f"the dict at {where} has {len(ctx)} keys but {count} children")
        seen: set[Key] = set()
        for key in ctx:
            if not isinstance(key, (str, int)):
                raise _Malformed(f"the dict at {where} has a key that is {_describe(key)}")
            if key in seen:
                raise _Malformed(f"the dict at {where} repeats the key {_printable(repr(key))}")
            seen.add(key)
        return list(ctx)


# --------------------------------------------------------------------------- decoding API


def _corrupt(path: PathLike, reason: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        path, f"legacy __spec__ is not a readable pickle ({_printable(reason, 120)})", _CORRUPT_FIX
    )


def decode_spec_info(data: bytes, path: PathLike = None) -> SpecInfo:
    """Decode ``dill.dumps(TreeSpec)`` bytes safely into a :class:`SpecInfo` (FORMAT.md §6.3).

    Raises ``UnsafeContentError`` for any global outside the allowlist, ``CorruptCheckpointError``
    for anything that is not a well-formed TreeSpec pickle, and ``UnsupportedContentError`` for
    ``defaultdict``/``deque`` nodes, which the neutral tree has no way to express (they do not occur
    in model, optimizer or scheduler state; their §2.2 leaf names are broken anyway).
    """
    unpickler = _SpecUnpickler(io.BytesIO(bytes(data)))
    try:
        root_rec = unpickler.load()
        if not isinstance(root_rec, _SpecRecord):
            raise _Malformed(f"it holds {_describe(root_rec)}, not a TreeSpec")
        converter = _Converter(path)
        root = converter.convert(root_rec, ())
    except _Unsafe as exc:
        raise UnsafeContentError(path, str(exc), _UNSAFE_FIX) from None
    except _Malformed as exc:
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


# --------------------------------------------------------------------------- encoder


def _global_class(module: str, name: str) -> type:
    """A dummy class the encoder writes as the global ``module.name``."""
    cls = type(name.rpartition(".")[2], (), {"__slots__": ()})
    _OUT_GLOBALS[cls] = (module, name)
    return cls


_OUT_GLOBALS: dict[Any, tuple[str, str]] = {
    # Only used for protocols 0/1, where an object is made by copyreg._reconstructor.
    copyreg._reconstructor: ("copyreg", "_reconstructor"),  # type: ignore[attr-defined]
    object: ("builtins", "object"),
}
_G_LOAD_TYPE = _global_class("dill._dill", "_load_type")
_G_CREATE_NAMEDTUPLE = _global_class("dill._dill", "_create_namedtuple")
_G_ORDERED_DICT = _global_class("collections", "OrderedDict")
_G_TENSOR_SCALAR_DICT = _global_class(
    "cerebras_pytorch.utils.tensor_scalar_dict", "TensorScalarDict"
)
_G_NAMEDTUPLE = _global_class("collections", "namedtuple")


class _Out:
    """An object the encoder writes through ``__reduce_ex__`` (i.e. ``save_reduce``)."""

    __slots__ = ("reduce",)

    def __reduce_ex__(self, protocol: Any) -> Any:  # type: ignore[override]
        return self.reduce


class _SpecOut(_Out):
    """A TreeSpec/LeafSpec: ``class, (), NEWOBJ, state, BUILD`` as ``object.__reduce_ex__`` does."""

    __slots__ = ()

    def __init__(self, state: dict[str, Any], protocol: int):
        if protocol >= 2:
            self.reduce = (copyreg.__newobj__, (type(self),), state)  # type: ignore[attr-defined]
        else:
            self.reduce = (copyreg._reconstructor, (type(self), object, None), state)  # type: ignore[attr-defined]


_TreeSpecOut = type("TreeSpec", (_SpecOut,), {"__slots__": ()})
_LeafSpecOut = type("LeafSpec", (_TreeSpecOut,), {"__slots__": ()})
_OUT_GLOBALS[_TreeSpecOut] = ("torch.utils._pytree", "TreeSpec")
_OUT_GLOBALS[_LeafSpecOut] = ("torch.utils._pytree", "LeafSpec")


def _save_by_name(pickler: _SpecPickler, obj: Any) -> None:
    pickler.save_global(obj)


_STOCK = pickle._Pickler  # type: ignore[attr-defined]


class _SpecPickler(pickle._Pickler):  # type: ignore[name-defined,misc]
    """dill's base pickler with globals written by name from ``_OUT_GLOBALS``, never imported.

    It has its own dispatch table of stock methods: importing dill copies dill's reducers into
    the table shared by every ``pickle._Pickler`` (``dill.extend``), which would change the bytes.
    """

    dispatch: ClassVar[dict[type, Callable[..., None]]] = {
        type(None): _STOCK.save_none,
        bool: _STOCK.save_bool,
        int: _STOCK.save_long,
        float: _STOCK.save_float,
        str: _STOCK.save_str,
        tuple: _STOCK.save_tuple,
        list: _STOCK.save_list,
        dict: _STOCK.save_dict,
        type: _save_by_name,  # our stand-in classes
        type(copyreg._reconstructor): _save_by_name,  # type: ignore[attr-defined]
    }

    def __init__(self, file: io.BytesIO, protocol: int, strings: dict[str, str]):
        super().__init__(file, protocol)
        self.strings = strings  # the builder's, so module names are memoised by value too

    def save_global(self, obj: Any, name: str | None = None) -> None:
        module, qualname = _OUT_GLOBALS[obj]
        if self.proto >= 4:
            self.save(self.strings.setdefault(module, module))
            self.save(self.strings.setdefault(qualname, qualname))
            self.write(pickle.STACK_GLOBAL)
        else:
            if self.proto < 3:  # Python 2 names, as the stock pickler's fix_imports writes them
                if (module, qualname) in _compat_pickle.REVERSE_NAME_MAPPING:
                    module, qualname = _compat_pickle.REVERSE_NAME_MAPPING[(module, qualname)]
                else:
                    module = _compat_pickle.REVERSE_IMPORT_MAPPING.get(module, module)
            self.write(pickle.GLOBAL + f"{module}\n{qualname}\n".encode("ascii"))
        self.memoize(obj)


class _Builder:
    """Makes the object graph that ``dill.dumps`` would see for the torch TreeSpec of a tree.

    Equal strings are one object, like the interned identifiers of a real state dict, so pickle
    memoises them by value (A.1 and torch 2.4 both show repeated keys as ``BINGET``).
    """

    def __init__(self, style: str, protocol: int):
        self.style = style
        self.protocol = protocol
        self.strings: dict[str, str] = {}
        self.load_types: dict[str, _Out] = {}
        self.namedtuples: dict[tuple[str, tuple[str, ...]], _Out] = {}
        self.shared_leaf: _SpecOut | None = None

    def s(self, text: str) -> str:
        return self.strings.setdefault(text, text)

    def reduce_out(self, func: type, args: tuple) -> _Out:
        out = _Out()
        out.reduce = (func, args)
        return out

    def load_type(self, name: str) -> _Out:
        if name not in self.load_types:
            self.load_types[name] = self.reduce_out(_G_LOAD_TYPE, (self.s(name),))
        return self.load_types[name]

    def namedtuple_class(self, name: str, fields: tuple[str, ...]) -> _Out:
        key = (name, fields)
        if key not in self.namedtuples:
            args = (self.s(name), tuple(self.s(f) for f in fields), self.s("__main__"))
            self.namedtuples[key] = self.reduce_out(_G_CREATE_NAMEDTUPLE, args)
        return self.namedtuples[key]

    def spec(self, cls: type, typ: Any, ctx: Any, kids: list, counts: tuple[int, int]) -> _SpecOut:
        nodes, leaves = counts
        state = {self.s("type"): typ, self.s("context"): ctx, self.s("children_specs"): kids}
        if self.style == "dataclass":
            state[self.s("num_nodes")] = nodes
            state[self.s("num_leaves")] = leaves
            state[self.s("num_children")] = len(kids)
        else:
            state[self.s("num_leaves")] = leaves
        return cls(state, self.protocol)

    def leaf(self) -> _SpecOut:
        if self.style == "dataclass":  # torch 2.4 returns its one _LEAF_SPEC for every leaf
            if self.shared_leaf is None:
                self.shared_leaf = self.spec(_LeafSpecOut, None, None, [], (1, 1))
            return self.shared_leaf
        return self.spec(_LeafSpecOut, None, None, [], (1, 1))

    def build(self, node: Node, at: tuple[Key, ...]) -> tuple[_SpecOut, int, int]:
        """The spec object for ``node`` and its (num_nodes, num_leaves)."""
        if isinstance(node, LEAF_TYPES):
            return self.leaf(), 1, 1
        ctx: Any
        if isinstance(node, DictNode):
            keys = [k for k, _ in node.items]
            for key in keys:
                if not isinstance(key, (str, int)):
                    raise _unencodable(f"the dict at {format_path(at)} has a key {key!r}")
            if len(set(keys)) != len(keys):
                raise _unencodable(f"the dict at {format_path(at)} repeats a key")
            if node.origin == "TensorScalarDict":  # only fixtures of 1.7 files write this
                typ = _G_TENSOR_SCALAR_DICT
            else:
                typ = _G_ORDERED_DICT if node.ordered else self.load_type("dict")
            ctx = [self.s(k) if isinstance(k, str) else k for k in keys]
            pairs = list(node.items)
        elif isinstance(node, SeqNode):
            if node.kind not in ("list", "tuple", "set"):
                raise _unencodable(f"the sequence at {format_path(at)} is a {node.kind!r}")
            typ, ctx = self.load_type(node.kind), None
            pairs = list(enumerate(node.items))
        elif isinstance(node, NamedTupleNode):
            fields = tuple(node.fields)
            if len(fields) != len(node.items):
                raise _unencodable(
                    f"namedtuple {node.name} at {format_path(at)} has {len(fields)} fields "
                    f"but {len(node.items)} items"
                )
            if not _namedtuple_names_ok(node.name, fields):
                raise _unencodable(
                    f"namedtuple {node.name!r} has names collections.namedtuple refuses: {fields}"
                )
            typ, ctx = _G_NAMEDTUPLE, self.namedtuple_class(node.name, fields)
            pairs = list(enumerate(node.items))
        else:
            raise _unencodable(f"{format_path(at)} is a {type(node).__name__}, not a tree node")
        kids: list[_SpecOut] = []
        nodes, leaves = 1, 0
        for key, child in pairs:
            spec, n, lv = self.build(child, (*at, key))
            kids.append(spec)
            nodes += n
            leaves += lv
        return self.spec(_TreeSpecOut, typ, ctx, kids, (nodes, leaves)), nodes, leaves


def _namedtuple_names_ok(name: str, fields: tuple[str, ...]) -> bool:
    """Whether dill's ``_create_namedtuple`` could rebuild the class on load: the rules of
    ``collections.namedtuple`` without ``rename``."""
    names = (name, *fields)
    if not all(isinstance(n, str) and n.isidentifier() and not keyword.iskeyword(n) for n in names):
        return False
    return len(set(fields)) == len(fields) and not any(f.startswith("_") for f in fields)


def _unencodable(problem: str) -> UnsupportedContentError:
    return UnsupportedContentError(None, f"cannot write a legacy __spec__: {problem}")


def encode_spec(root: Node, style: str = "plain", *, protocol: int = 4) -> bytes:
    """The bytes ``dill.dumps(spec)`` gives for the torch TreeSpec of ``root`` (FORMAT.md §6.2).

    ``style="plain"`` imitates torch ≤2.0 (releases 1.7–2.0) and ``"dataclass"`` torch 2.2–2.4
    (releases 2.1–2.4); see the module docstring. Namedtuple classes are written by value with
    module ``"__main__"`` (the original module is not kept in the tree). dill always uses
    protocol 4 here (``pickle.DEFAULT_PROTOCOL`` on Python 3.8–3.13); other protocols (0–5) exist
    for tests of the decoder.
    """
    if style not in ("plain", "dataclass"):
        raise ValueError(f"style must be 'plain' or 'dataclass', not {style!r}")
    if not 0 <= protocol <= pickle.HIGHEST_PROTOCOL:
        raise ValueError(f"unsupported pickle protocol {protocol}")
    builder = _Builder(style, protocol)
    try:
        spec, _, _ = builder.build(root, ())
        buf = io.BytesIO()
        _SpecPickler(buf, protocol, builder.strings).dump(spec)
    except RecursionError:
        raise _unencodable("the tree is nested too deeply") from None
    return buf.getvalue()


def encode_spec_hex(root: Node, style: str = "plain") -> str:
    """:func:`encode_spec` as the lower-case hex text stored in ``__spec__`` (FORMAT.md §3.1)."""
    return encode_spec(root, style).hex()
