"""The security boundary of legacy checkpoints: a restricted unpickler for ``__spec__``.

Releases 1.7–2.4 store the state-dict structure as the root attribute ``__spec__``, the hex text of
``dill.dumps(torch.utils._pytree.TreeSpec)`` (FORMAT.md §3.1). A pickle can name any global and
call it; this unpickler guarantees that reading one runs no code and imports nothing
(FORMAT.md §6.3). It drives the pure-Python ``pickle._Unpickler`` with every opcode that could
reach code gated:

* ``find_class`` is the only way to name a global. It returns inert stand-ins for the allowlist of
  §6.3 and refuses everything else; nothing is ever imported.
* ``REDUCE`` only calls the stand-in functions (``_load_type``, ``_create_namedtuple``, ``setattr``
  on a namedtuple, ``copyreg``), each of which checks its arguments and builds plain records.
* ``NEWOBJ``/``NEWOBJ_EX``/``INST``/``OBJ`` only make empty TreeSpec/LeafSpec records; ``BUILD``
  only goes to a record's ``__setstate__``.
* ``EXT1/2/4`` (the process-wide copyreg extension registry and its cache) and persistent ids are
  refused outright.

What it returns are inert records (``SpecRecord``, ``NamedTupleClass`` and the type markers);
``spec_decode`` turns them into the neutral tree. Which TreeSpec state each torch writes:

* ``"plain"`` — torch ≤2.0 (releases 1.7–2.0): a plain class (a plain dataclass in 2.0); state
  ``type, context, children_specs, num_leaves``; a new ``LeafSpec()`` per leaf.
* ``"dataclass"`` — torch 2.2–2.4 (releases 2.2–2.4; 2.1 per the release table): a frozen dataclass
  whose ``__post_init__`` adds ``num_nodes, num_leaves, num_children``; torch 2.4 returns one shared
  ``_LEAF_SPEC`` for every leaf, so dill memoises it and later leaves are a ``BINGET``.
* torch ≥2.5 (e.g. 2.13, never used by a legacy release): a frozen *slots* dataclass whose state is
  the list ``[type, _context, _children, num_nodes, num_leaves, num_children]``; accepted (style
  ``"dataclass"``).
"""

from __future__ import annotations

import _compat_pickle
import io
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ckpt_migrate.format.progress import Progress

UNSAFE_FIX = "the file may be malicious; it was not loaded"


# --------------------------------------------------------------------------- decoder stand-ins


class Unsafe(Exception):
    """The pickle asks for something a spec never contains (becomes UnsafeContentError)."""


class Malformed(Exception):
    """The pickle is readable but is not a TreeSpec (becomes CorruptCheckpointError)."""


def printable(text: str, limit: int = 80) -> str:
    """A name taken from the file, safe to put in a one-line message."""
    out = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return out if len(out) <= limit else out[: limit - 1] + "…"


def describe(obj: Any) -> str:
    if isinstance(obj, (_Marker, _StandInFunction, _RecordClass)):
        return obj.qualname
    if isinstance(obj, SpecRecord):
        return "a TreeSpec object"
    if isinstance(obj, NamedTupleClass):
        return f"namedtuple class {printable(obj.name)}"
    return f"a {type(obj).__name__}"


def _refers_to(what: str) -> Unsafe:
    return Unsafe(f"legacy spec pickle refers to {what}, which a checkpoint spec never contains")


def _calls(obj: Any, how: str = "calls") -> Unsafe:
    return Unsafe(f"legacy spec pickle {how} {describe(obj)}, which a checkpoint spec never does")


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

    def new(self) -> SpecRecord:
        return SpecRecord(self)


class SpecRecord:
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
            raise Malformed("a TreeSpec object is built twice")
        if (
            isinstance(state, tuple)
            and len(state) == 2
            and (state[0] is None or isinstance(state[0], dict))
            and isinstance(state[1], dict)
        ):
            state = {**(state[0] or {}), **state[1]}
        if isinstance(state, dict):
            if "type" not in state:
                raise Malformed("a TreeSpec state has no 'type'")
            self.type = state["type"]
            self.context = _first_of(state, ("context", "_context"))
            self.children = _first_of(state, ("children_specs", "_children_specs", "_children"))
            self.has_num_nodes = "num_nodes" in state
        elif isinstance(state, list) and len(state) == 6:
            self.type, self.context, self.children = state[0], state[1], state[2]
            self.has_num_nodes = True
        else:
            raise Malformed(f"a TreeSpec state is {describe(state)}, not a dict")
        self.built = True


def _first_of(state: dict, names: tuple[str, ...]) -> Any:
    for name in names:
        if name in state:
            return state[name]
    raise Malformed(f"a TreeSpec state has no {names[0]!r}")


class NamedTupleClass:
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


BUILTIN_TYPES = {name: _Marker(f"builtins.{name}") for name in ("dict", "list", "tuple", "set")}
_NONE_TYPE = _Marker("builtins.NoneType")
ORDERED_DICT = _Marker("collections.OrderedDict")
NAMEDTUPLE = _Marker("collections.namedtuple")
DEFAULTDICT = _Marker("collections.defaultdict")
DEQUE = _Marker("collections.deque")
TENSOR_SCALAR_DICT = _Marker("TensorScalarDict")
_OBJECT = _Marker("builtins.object")
_TREESPEC = _RecordClass("torch.utils._pytree.TreeSpec", leaf=False)
_LEAFSPEC = _RecordClass("torch.utils._pytree.LeafSpec", leaf=True)


def _sl_load_type(name: Any) -> _Marker:
    """``dill._dill._load_type(name)``: dill's by-name pickling of builtin types (§6.2)."""
    if name == "NoneType":
        return _NONE_TYPE
    if isinstance(name, str) and name in BUILTIN_TYPES:
        return BUILTIN_TYPES[name]
    shown = printable(name) if isinstance(name, str) else describe(name)
    raise _refers_to(f"dill._dill._load_type({shown!r})")


def _sl_create_namedtuple(
    name: Any, fields: Any, module: Any, defaults: Any = None
) -> NamedTupleClass:
    """``dill._dill._create_namedtuple``: dill rebuilds namedtuple classes by value (§6.2).

    The real function imports ``module`` first; the stand-in never looks at it.
    """
    if not isinstance(name, str) or not isinstance(module, str):
        raise Malformed("a namedtuple class has a non-text name or module")
    if not isinstance(fields, (tuple, list)) or not all(isinstance(f, str) for f in fields):
        raise Malformed(f"namedtuple {printable(name)} has non-text field names")
    if not name.isidentifier() or not all(f.isidentifier() for f in fields):
        raise Malformed(f"namedtuple {printable(name)} has names that are not identifiers")
    return NamedTupleClass(name, tuple(fields))


def _sl_setattr(target: Any, name: Any, value: Any) -> None:
    """``builtins.setattr``: dill's post-processing that sets a namedtuple's ``__qualname__``."""
    if not isinstance(target, NamedTupleClass):
        raise _calls(target, "calls builtins.setattr on")


def _sl_reconstructor(cls: Any, base: Any, state: Any) -> SpecRecord:
    """``copyreg._reconstructor``: how protocols 0/1 create an object of a plain class."""
    if not isinstance(cls, _RecordClass):
        raise _calls(cls, "calls copyreg._reconstructor for")
    if base is not _OBJECT or state is not None:
        raise Malformed("copyreg._reconstructor with an unexpected base or state")
    return cls.new()


def _sl_newobj(cls: Any, *args: Any) -> SpecRecord:
    """``copyreg.__newobj__``: the protocol-<2 spelling of ``NEWOBJ``."""
    if not isinstance(cls, _RecordClass):
        raise _calls(cls, "calls copyreg.__newobj__ for")
    if args:
        raise Malformed("a TreeSpec object is created with arguments")
    return cls.new()


# FORMAT.md §6.3, plus the inert builtins a defaultdict default_factory could name.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch.utils._pytree", "TreeSpec"): _TREESPEC,
    ("torch.utils._pytree", "LeafSpec"): _LEAFSPEC,
    ("dill._dill", "_load_type"): _StandInFunction("dill._dill._load_type", _sl_load_type),
    ("dill._dill", "_create_namedtuple"): _StandInFunction(
        "dill._dill._create_namedtuple", _sl_create_namedtuple
    ),
    ("collections", "OrderedDict"): ORDERED_DICT,
    ("collections", "namedtuple"): NAMEDTUPLE,
    ("collections", "defaultdict"): DEFAULTDICT,
    ("collections", "deque"): DEQUE,
    ("cerebras_pytorch.utils.tensor_scalar_dict", "TensorScalarDict"): TENSOR_SCALAR_DICT,
    ("cerebras.pytorch.utils.tensor_scalar_dict", "TensorScalarDict"): TENSOR_SCALAR_DICT,
    ("builtins", "setattr"): _StandInFunction("builtins.setattr", _sl_setattr),
    ("copyreg", "_reconstructor"): _StandInFunction("copyreg._reconstructor", _sl_reconstructor),
    ("copyreg", "__newobj__"): _StandInFunction("copyreg.__newobj__", _sl_newobj),
    ("builtins", "object"): _OBJECT,
    **{("builtins", name): marker for name, marker in BUILTIN_TYPES.items()},
    **{("builtins", n): _Marker(f"builtins.{n}") for n in ("int", "float", "str", "bool", "bytes")},
}

_RECORD_CLASSES = (_TREESPEC, _LEAFSPEC)
_USED_UP = _Marker("a TreeSpec state already built")
_STATES = (dict, list)
_LOOK_BACK = 8  # memo slots searched for a BUILD's state (a leaf's are the last two)
_TICK = 4096  # records decoded between two words of progress


class SpecUnpickler(pickle._Unpickler):  # type: ignore[name-defined,misc]
    """``pickle._Unpickler`` with every opcode that can run or import something gated.
    ``progress``: told the bytes decoded (``decode spec``), every few thousand records: a
    1.9 spec of 150k tensors takes seconds, which a dry run said nothing through."""

    def __init__(self, file: io.BytesIO, progress: Progress | None = None) -> None:
        super().__init__(file)
        self._source, self._progress, self._builds = file, progress, 0

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
            raise _refers_to(f"{printable(module)}.{printable(name)}")
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
            raise Malformed(f"REDUCE calls {describe(func)}")
        if not isinstance(args, tuple):
            raise Malformed("REDUCE arguments are not a tuple")
        try:
            stack[-1] = func.impl(*args)
        except TypeError:  # wrong number of arguments for the stand-in
            raise Malformed(f"{func.qualname} called with {len(args)} arguments") from None

    dispatch[pickle.REDUCE[0]] = _load_reduce

    def _new_record(self, cls: Any, args: Any, kwargs: Any = None) -> SpecRecord:
        if not isinstance(cls, _RecordClass):
            if isinstance(cls, (_Marker, _StandInFunction)):
                raise _calls(cls, "instantiates")
            raise Malformed(f"an object of {describe(cls)} is created")
        if args or kwargs:
            raise Malformed("a TreeSpec object is created with arguments")
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
            raise Malformed("OBJ without a class")
        cls = args.pop(0)
        self.append(self._new_record(cls, args))

    dispatch[pickle.OBJ[0]] = _load_obj

    def _load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        if not isinstance(inst, SpecRecord):
            raise Malformed(f"BUILD on {describe(inst)}")
        inst.__setstate__(state)
        self._let_go_of(state, inst)
        self._builds += 1
        if self._progress is not None and not self._builds % _TICK:
            self._said()

    dispatch[pickle.BUILD[0]] = _load_build

    def _said(self) -> None:
        assert self._progress is not None
        self._progress("decode spec", self._source.tell(), len(self._source.getbuffer()))

    def _let_go_of(self, state: Any, inst: SpecRecord) -> None:
        """Drop from the memo what a ``BUILD`` has just used up: the state (an instance's own
        ``__dict__`` or field list, which no writer pickles twice) and a leaf's empty children
        list, found among the last few objects memoised (a leaf's state and list were 50 of
        the 90 MiB a 1.9 spec's memo held at 150k tensors, issue 33). A later ``GET`` of one is
        refused."""
        used = [id(p) for p in (state if type(state) is tuple else (state,)) if type(p) in _STATES]
        if type(inst.children) is list and not inst.children:
            used.append(id(inst.children))
            inst.children = ()
        memo = self.memo
        for i in range(len(memo) - 1, max(len(memo) - _LOOK_BACK, 0) - 1, -1):
            if id(memo[i]) in used:
                memo[i] = _USED_UP

    def _load_ext(self) -> None:
        # The copyreg registry and pickle's process-wide cache would bypass find_class.
        raise _refers_to("an entry of the copyreg extension registry")

    # The memo as a list: a writer numbers the objects it memoises 0, 1, 2, ... in order, and
    # pickle's dictionary of them, 750k at 150k tensors, was 60 MiB of a 1.9 spec's decoding
    # (issue 33). An index out of that order is refused.

    def load(self) -> Any:
        self.memo: list[Any] = []
        try:
            loaded = super().load()
        finally:
            self.memo = []  # (what ``load`` returns holds the objects: not the memo too)
        if self._progress is not None and self._builds >= _TICK:  # (a phase it spoke of)
            self._said()
        return loaded

    def _put(self, i: int) -> None:
        memo = self.memo
        if i == len(memo):
            memo.append(self.stack[-1])
        elif 0 <= i < len(memo):
            memo[i] = self.stack[-1]
        else:
            raise Malformed(f"memo index {i} out of order ({len(memo)} memoised)")

    def _get(self, i: int) -> None:
        if not 0 <= i < len(self.memo):
            raise Malformed(f"Memo value not found at index {i}")  # (pickle's words)
        obj = self.memo[i]
        if obj is _USED_UP:
            raise Malformed(f"memo index {i} is a TreeSpec state already built into its object")
        self.append(obj)

    def _load_memoize(self) -> None:
        self.memo.append(self.stack[-1])

    dispatch[pickle.MEMOIZE[0]] = _load_memoize
    dispatch[pickle.PUT[0]] = lambda self: self._put(int(self.readline()[:-1]))
    dispatch[pickle.BINPUT[0]] = lambda self: self._put(self.read(1)[0])
    dispatch[pickle.LONG_BINPUT[0]] = lambda self: self._put(int.from_bytes(self.read(4), "little"))
    dispatch[pickle.GET[0]] = lambda self: self._get(int(self.readline()[:-1]))
    dispatch[pickle.BINGET[0]] = lambda self: self._get(self.read(1)[0])
    dispatch[pickle.LONG_BINGET[0]] = lambda self: self._get(int.from_bytes(self.read(4), "little"))

    for _op in (pickle.EXT1, pickle.EXT2, pickle.EXT4):
        dispatch[_op[0]] = _load_ext
    del _op
