"""What a preflight child reads and says (``preflight``, ``preflight_outline``): attribute
values and a dataset's facts read as HDF5 stores them, the words and links a child writes to
its parent, and the exception that ends a walk the parent's own checks will refuse."""

from __future__ import annotations

import marshal
import math
import os
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np

from ckpt_migrate.format import budgets
from ckpt_migrate.format.h5 import attrtable, capi, overlaps
from ckpt_migrate.format.h5.boundary import (
    ALLOWED_TYPE_CLASSES,
    attribute_names,
    dataset_storage,
    description_problem,
    storage_problem,
    type_problem,
)
from ckpt_migrate.format.h5.facts import Shared
from ckpt_migrate.format.progress import Progress

TICK = b"."
FIRST = b"M"  # the first part is done: "M<stored>,<declared>;" (see preflight._walk)
SECOND = b"="  # the second part is done: "=<stored>;"
LINKS = b"L"  # an outline child read the root's links: "L<count>;" (-1: it read none)
END = b";"
WALKED, WALKED_EVERY = b"+", 8  # the full walk's first part: 8 more objects walked
OBJECTS = b"N"  # the first child counted the root's objects: "N<count>;" (the walk's total)
# A full walk's other stages, each said with its count and ticked (a root of 150k leaves spent
# 8 s on its attributes and 5 s of a chunk index walk that a reader waited for, unsaid):
ROOT = b"A"  # the first child reads the root's attributes, links: "A<count>;", a ROOTED per 1000
ROOTED, ROOTED_EVERY = b"a", attrtable.TICK_EVERY
REST = b"R"  # a child walks its chunk indexes: "R<datasets>;", a RESTED per 8
RESTED, RESTED_EVERY = b"r", 8


class Heard:
    """What a walk's children said, as their parent hears it (``preflight._Walk.follow``): their
    words (ticks left out) and their ticks counted, and how far the walk is."""

    def __init__(self) -> None:
        self.words = b""
        self.walked = self.rooted = self.rested = 0
        self.told: tuple[str, int] | None = None  # the stage told last, and its total
        self.ended = False  # the first part's end told: its count then is not (100% went to 99)
        self.rooted_told = False  # the root's stage told (its end, if it passed unheard)

    def take(self, data: bytes) -> None:
        if len(self.words) < 4096:  # a child says a few words; more is not worth keeping
            ticks = (TICK, WALKED, ROOTED, RESTED)
            self.words += data.translate(None, b"".join(ticks))
        self.walked += data.count(WALKED) * WALKED_EVERY
        self.rooted += data.count(ROOTED) * ROOTED_EVERY
        self.rested += data.count(RESTED) * RESTED_EVERY

    def said(self, word: bytes) -> list[bytes]:
        return [w[1:] for w in self.words.split(END) if w.startswith(word)]

    def tell(
        self, progress: Progress, children: int, *, done: bool = False, waiting: bool = False
    ) -> None:
        """Tell ``progress`` of the stage the walk is at, each stage ended (its total told)
        before the next is told. ``done``: the first part ended; ``waiting``: the caller waits
        for the chunk indexes too (else they run on unsaid, beside its work)."""
        stage = self.stage(children)
        if stage is None:
            return
        phase, count, total = stage
        if phase == "walk root":
            self.rooted_told = True
        elif not self.rooted_told and (root := self.said(ROOT)):
            # (a fast walk's root stage can pass between two looks: said ended, not skipped)
            self.rooted_told = True
            self._end(progress, "walk root", int(root[0]))
        if (done or phase == "check indexes") and not self.ended:
            if objects := self.said(OBJECTS):
                self._end(progress, "read", int(objects[0]))
            self.ended = True
        if done or (phase == "read" and self.ended) or (phase == "check indexes" and not waiting):
            return
        if self.told is not None and self.told[0] != phase:
            self._end(progress, *self.told)
        if self.told is None:  # (its beginning, as ``Count`` tells it)
            progress(phase, 0, total)
        progress(phase, count, total)
        self.told = (phase, total)

    def _end(self, progress: Progress, phase: str, total: int) -> None:
        if self.told is None or self.told[0] != phase:
            progress(phase, 0, total)
        progress(phase, total, total)
        self.told = None

    def stage(self, children: int) -> tuple[str, int, int] | None:
        """(phase, done, total) of the walk's stage now: the root's attributes, the objects,
        or, once every child ended its first part, the chunk indexes; None before any."""
        rests = self.said(REST)
        if children and len(self.said(FIRST)) == len(rests) == children:
            total = sum(int(n) for n in rests)
            done = total if len(self.said(SECOND)) == children else min(self.rested, total)
            return "check indexes", done, total
        if objects := self.said(OBJECTS):
            return "read", min(self.walked, int(objects[0])), int(objects[0])
        if root := self.said(ROOT):
            return "walk root", min(self.rooted, int(root[0])), int(root[0])
        return None


class Refused(Exception):
    """A dataset the parent's checks will refuse: the child stops walking."""


class HardLinks:
    """The root's hard links, as a full walk's first child iterates them (each name and the
    address of the object it names), written to ``fd`` for the parent (``facts.LinksFile``) in
    pieces of :data:`PIECE` (``marshal``, none held for long), then their count; -1 instead
    where a walk of that child met a group (``incomplete``: its links are not the root's, and
    the parent walks them all itself). Every child writes one."""

    PIECE = 4096

    def __init__(self, fd: int) -> None:
        self.fh = os.fdopen(os.dup(fd), "wb")
        self.piece: dict[str, int] = {}
        self.count = 0
        self.incomplete = False

    def add(self, name: bytes, address: int) -> None:
        self.piece[name.decode("utf-8", "surrogateescape")] = address
        if len(self.piece) == self.PIECE:
            self._write()

    def close(self) -> None:
        self._write()
        marshal.dump(-1 if self.incomplete else self.count, self.fh)
        self.fh.close()

    def _write(self) -> None:
        marshal.dump(self.piece, self.fh)
        self.count += len(self.piece)
        self.piece = {}


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
        elif scalars is not None and name == BF16 and kind.number is not None and len(shape) == 1:
            out = np.empty(shape, dtype=kind.number)  # (a flag as ``[True]``, read as True)
            attr.read(out)
            out = out.reshape(()) if out.size == 1 else None
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


_TAGS = frozenset({"__H5_TYPE__", "__TYPE__"})  # (a tagged dataset's tag, without which it fails)
SHAPE = b"shape"  # a full tensor's shape (``DeferredFullTensor``, FORMAT.md §3.3)
BF16 = b"is_bfloat16"  # its absence means False: a flag left out of the facts would flip it
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


def dataset_facts(
    obj: h5py.h5d.DatasetID,
    address: int,
    path: Path,
    file_bytes: int,
    tick: int,
    pieces: overlaps.Extents,
    shared: Shared,
) -> tuple[tuple, int, bool]:
    """A dataset's facts (``Findings.datasets``), the bytes it declares
    (chunked: its chunk index is measured in the second part) or stores (otherwise), and
    whether it is chunked. ``Refused`` if the boundary or a budget refuses it."""
    scalars: dict[str, Any] = {}
    read_attributes(obj, tick, scalars)
    dcpl, tid, space = obj.get_create_plist(), obj.get_type(), obj.get_space()
    kind = type_facts(tid)
    if kind.refused or description_problem(dcpl, path, "") is not None:
        raise Refused  # before its storage is looked at
    extent = space.get_simple_extent_type()
    shape = None if extent == h5py.h5s.NULL else () if extent == h5py.h5s.SCALAR else space.shape
    declared = math.prod(shape) * kind.size if extent == h5py.h5s.SIMPLE else 0
    dtype = numpy_type(tid).str if kind.number is None else kind.number.str
    if _flag_may_be_lost(scalars, dtype) and capi.unknown_messages(obj):
        raise Refused  # a message HDF5 skips: ``boundary.header_problem`` names it
    if dcpl.get_layout() == h5py.h5d.CHUNKED:
        if budgets.dataset_problem(declared, file_bytes) is not None:
            raise Refused  # more than the whole file could expand to
        return shared.fact(address, dtype, shape, scalars), declared, True
    size = measure(obj, dcpl, file_bytes, declared, pieces)  # (before its value is read)
    value = None
    if extent == h5py.h5s.SCALAR and kind.number is not None and kind.number.kind in "biuf":
        # one number or boolean (a step count), as the reader's ``ds[()].item()`` makes it
        out = np.empty((), dtype=kind.number)
        obj.read(h5py.h5s.ALL, h5py.h5s.ALL, out)
        value = out.item()
    return shared.fact(address, dtype, shape, scalars, value), size, False


def _flag_may_be_lost(scalars: dict[str, Any], dtype: str) -> bool:
    """Whether a flag attribute whose absence changes what a dataset is may be missing: an
    untagged (0.1/0.2) dataset's flags (``is_scalar``, ``is_bfloat16``, …), or a 0.3/0.4
    int16 tensor's ``is_bfloat16`` (their writers give every tensor the flag). Only such
    datasets' headers are asked for messages HDF5 skipped (8 µs each): a 0.5 file's bfloat16
    tensors are int16 without the flag, their dtype in the ``dtypes`` attribute."""
    if not _TAGS & scalars.keys():
        return True
    return "__H5_TYPE__" in scalars and "is_bfloat16" not in scalars and dtype[1:] == "i2"


def measure(
    obj: h5py.h5d.DatasetID,
    dcpl: h5py.h5p.PropDCID,
    file_bytes: int,
    declared: int,
    pieces: overlaps.Extents,
) -> int:
    """The bytes a dataset stores (where each piece lies added to ``pieces``); ``Refused`` if
    it breaks a budget or lies past the end."""
    size, end = dataset_storage(obj, dcpl, pieces)
    if storage_problem(obj, size, end, file_bytes, declared) is not None:
        raise Refused
    return size


def measure_all(
    f: h5py.File,
    later: list[tuple[bytes, int]],
    file_bytes: int,
    pieces: overlaps.Extents,
    tick: int,
) -> int:
    """A walk's second part: ``measure`` each chunked dataset (its name, the bytes it
    declares) one at a time, said and ticked (``REST``); the bytes they store."""
    os.write(tick, b"%s%d%s" % (REST, len(later), END))
    rest = 0
    for i, (name, size) in enumerate(later, 1):
        obj = h5py.h5o.open(f.id, name)
        rest += measure(obj, obj.get_create_plist(), file_bytes, size, pieces)
        del obj
        if i % RESTED_EVERY == 0:
            os.write(tick, RESTED)
    return rest


def read_root_attributes(f: h5py.File, path: Path, tick: int) -> None:
    """The root's attributes by HDF5, but the texts the reader takes from ``attrtable``, which
    HDF5 never reads: the leaves' ``__metadata__`` (O(n²) by name) and the ``__spec__`` (HDF5
    read a 200k-leaf one with 220 MiB, this child's peak, issue 33)."""
    entries = h5py.h5o.get_info(f.id).num_attrs + f.id.get_num_objs()  # (its links come next)
    os.write(tick, b"%s%d%s" % (ROOT, entries, END))
    table = attrtable.root_texts(
        f,
        path,
        lambda: os.write(tick, TICK),  # (alive: a heap collection read)
        keep=_taken_text,
        progress=lambda phase, done, total: os.write(tick, ROOTED),  # (1,000 more attributes)
    )
    if table is None:
        return read_attributes(f.id, tick)
    # The table's names are HDF5's (as many; HDF5's list by name costs 8 µs an attribute).
    rest = [k for k, v in table.items() if v is not _TAKEN]
    read_attributes(f.id, tick, names=[k.encode("utf-8", "surrogateescape") for k in rest])


_TAKEN = True  # (in the table: a text the reader takes from the table too)


def named_groups(fd: int) -> list[bytes]:
    """The names of the groups the other children wrote to ``fd`` until they closed it (a
    child that died closed it too: its parent refuses the walk)."""
    said = b""
    while chunk := os.read(fd, 65536):
        said += chunk
    os.close(fd)
    return [name for name in said.split(b"\0") if name]


def _taken_text(name: str, text: str | None) -> bool | None:
    """Which texts the reader takes from the table (``v05.read``, ``legacy.read``); none is
    kept (150k leaves' texts: 340 MB, issue 33)."""
    taken = text is not None and (name == "__spec__" or name.endswith(".__metadata__"))
    return _TAKEN if taken else None
