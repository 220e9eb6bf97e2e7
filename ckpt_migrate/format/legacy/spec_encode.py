"""Encoding the neutral tree as a legacy ``__spec__``: what ``dill.dumps(spec)`` writes, without
torch and without dill (FORMAT.md §6.2, FORMAT_EXAMPLES.md A.1).

It drives the same pure-Python ``pickle._Pickler`` that dill subclasses, so framing, memoisation
and batching are the stock ones; only ``save_global`` is replaced so that
``torch.utils._pytree.TreeSpec`` and friends are written by name without importing them. Styles:
``"plain"`` (torch ≤2.0, releases 1.7–2.0) and ``"dataclass"`` (torch 2.2–2.4); a namedtuple's
class is pickled by value as ``dill._dill._create_namedtuple(name, fields, module)``.
"""

from __future__ import annotations

import _compat_pickle
import copyreg
import io
import keyword
import pickle
from collections.abc import Callable
from typing import Any, ClassVar

from ckpt_migrate.errors import UnsupportedContentError
from ckpt_migrate.format.tree import (
    LEAF_TYPES,
    DictNode,
    Key,
    NamedTupleNode,
    Node,
    SeqNode,
    format_path,
)

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
_ONE_PLACE = (dict, list, tuple, _Out)  # what the builder makes for one place, unless shared


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

    def __init__(
        self, file: io.BytesIO, protocol: int, strings: dict[str, str], shared: list[_Out]
    ):
        super().__init__(file, protocol)
        self.strings = strings  # the builder's, so module names are memoised by value too
        self.shared = {id(out) for out in shared}
        self.memoised = 0

    def memoize(self, obj: Any) -> None:
        """pickle's own, keeping in the memo only what the pickle may meet again: strings,
        globals and the builder's shared objects (``_Builder.shared``). A spec, its state and
        lists and a reduce's arguments are made for one place, and are numbered as pickle
        numbers them but not remembered: a memo of every one was 31 MiB at 150k tensors,
        the peak of a write to a legacy release (issue 33)."""
        idx, self.memoised = self.memoised, self.memoised + 1
        self.write(self.put(idx))
        if not isinstance(obj, _ONE_PLACE) or id(obj) in self.shared:
            self.memo[id(obj)] = idx, obj

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

    def shared(self) -> list[_Out]:
        """The objects made once and used at several places (everything else is one place's)."""
        leaf = [] if self.shared_leaf is None else [self.shared_leaf]
        return [*self.load_types.values(), *self.namedtuples.values(), *leaf]

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
        _SpecPickler(buf, protocol, builder.strings, builder.shared()).dump(spec)
    except RecursionError:
        raise _unencodable("the tree is nested too deeply") from None
    return buf.getvalue()


def encode_spec_hex(root: Node, style: str = "plain") -> str:
    """:func:`encode_spec` as the lower-case hex text stored in ``__spec__`` (FORMAT.md §3.1)."""
    return encode_spec(root, style).hex()
