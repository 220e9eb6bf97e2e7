"""The file is the whole world: what an HDF5 checkpoint may refer to, checked before any of it is
read.

HDF5 can reach outside a file. A dataset's raw data may live in other files (*external
storage*), a link may name an object of another file (*external link*) or be resolved by
registered code (*user-defined link*), a *virtual dataset* maps datasets of other files, and a
filter may be a plugin that HDF5 loads from ``HDF5_PLUGIN_PATH``. No checkpoint a Cerebras
release writes uses any of them (FORMAT.md §3.2, §4.5: plain datasets, LZ4 or no filter), and a
crafted file could use them to copy ``/etc/passwd`` or ``~/.aws/credentials`` into an output, or
to run a shared library. ``check_self_contained`` refuses all of them, naming the object, before
a reader resolves a single link (``h5.plugins`` keeps HDF5 from loading filter plugins from
the environment and registers hdf5plugin's LZ4 library itself).
"""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np

from ckpt_migrate.errors import (
    CkptError,
    CorruptCheckpointError,
    UnsafeContentError,
    UnsupportedContentError,
)
from ckpt_migrate.format import budgets
from ckpt_migrate.format.h5 import capi
from ckpt_migrate.format.h5.chunks import DEFLATE, FLETCHER32, LZ4, SHUFFLE
from ckpt_migrate.format.h5.io import DAMAGED_HDF5, damaged
from ckpt_migrate.format.h5.overlaps import Extents

# The filters checkpoints use: LZ4 (hdf5plugin) and HDF5's built-in lossless ones, each of
# whose stored chunks ``h5.chunks`` can check before it is decoded (szip, nbit and
# scaleoffset were admitted until issue #36: no release writes them, and their output cannot
# be checked without decoding them).
ALLOWED_FILTERS: dict[int, str] = {
    DEFLATE: "deflate",
    SHUFFLE: "shuffle",
    FLETCHER32: "fletcher32",
    LZ4: "lz4",
}
_NUMBER_CLASSES = {h5py.h5t.INTEGER: "integer", h5py.h5t.FLOAT: "float", h5py.h5t.ENUM: "enum"}
_FIX = "a checkpoint must hold all of its data itself; the file was not read"
# Filters a repacked or hand-written file may carry (HDF5's registry of filter numbers).
_FILTER_NAMES = {4: "szip", 5: "nbit", 6: "scaleoffset", 307: "bzip2", 32001: "blosc"}
_FILTER_NAMES |= {32008: "bitshuffle", 32013: "zfp", 32015: "zstd", 32017: "sz", 32026: "blosc2"}
_FILTER_FIX = (
    f"write it again without that filter ({budgets.H5REPACK} -f NONE FILE NEW.mdl, where HDF5 "
    "can decode it) and use the new file; the file was not read"
)

# The HDF5 type classes of checkpoint datasets and attributes: numbers, strings (fixed and
# variable-length), bool (an enum) and pickled bytes (opaque). Anything else, a variable-length
# sequence above all, is damage, and reading it has crashed HDF5 (SIGSEGV) on fuzzed files.
ALLOWED_TYPE_CLASSES = frozenset(
    {h5py.h5t.INTEGER, h5py.h5t.FLOAT, h5py.h5t.STRING, h5py.h5t.ENUM, h5py.h5t.OPAQUE}
)
_CLASS_NAMES = {2: "time", 4: "bitfield", 6: "compound", 7: "reference", 9: "vlen", 10: "array"}

# A dataset's number type is one of the standard ones, exactly, in either byte order: its
# precision, bit offset, exponent and mantissa fields are bytes of a version-1 object header,
# which no checksum guards, and HDF5 converts whatever they say (issue #36: one changed byte
# read a float32 tensor as other values). bool is h5py's enum.
_STANDARD_NUMBERS: dict[tuple[int, int], tuple[h5py.h5t.TypeID, ...]] = {}
for _code in ("f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"):
    for _order in "<>":
        _tid = h5py.h5t.py_create(np.dtype(_order + _code))
        _STANDARD_NUMBERS.setdefault((_tid.get_class(), _tid.get_size()), ())
        _STANDARD_NUMBERS[_tid.get_class(), _tid.get_size()] += (_tid,)

# This machine's numpy long double as h5py stores it (x86's 80-bit extended in 16 bytes): the
# real writer stores ``np.longdouble`` arrays so; where it is float64 it is no long double.
_LONG_DOUBLES = (
    tuple(h5py.h5t.py_create(np.dtype(np.longdouble).newbyteorder(o)) for o in "<>")
    if np.dtype(np.longdouble).itemsize > 8
    else ()
)


def check_self_contained(f: h5py.File, path: Path) -> int:
    """Refuse a file with external or user-defined links, external raw storage, virtual
    datasets or filters outside :data:`ALLOWED_FILTERS` (``UnsafeContentError``), or with a
    dataset or attribute of a type class outside :data:`ALLOWED_TYPE_CLASSES`
    (``CorruptCheckpointError``); both exit 2. Every chunk index is walked
    (``dataset_storage``) to refuse a dataset declaring more bytes than it stores could expand
    to (``format.budgets``) or storing bytes past the end of the file. Returns the bytes the
    datasets store.

    Links are inspected without being resolved; soft links stay inside the file and are
    allowed. Metadata only: no tensor data is read."""
    problems: list[CkptError] = []
    stored = [0]
    file_bytes = path.stat().st_size
    objects: set[int] = set()
    broken: list[BaseException] = []

    def visit(name: bytes, info: h5py.h5l.LinkInfo) -> bool | None:
        where = "/" + name.decode("utf-8", "replace")
        problem = link_problem(path, where, info)
        if problem is not None:
            problems.append(problem)
        elif info.type == h5py.h5l.TYPE_HARD and info.u not in objects:
            objects.add(info.u)  # an object under several names (a tie) is checked once
            try:
                problem = _dataset_problem(f.id, name, path, where, stored, file_bytes)
            except DAMAGED_HDF5 as exc:  # raised out of HDF5's callback it would lose its type
                broken.append(exc)
                return True
            if problem is not None:
                problems.append(problem)
        return True if problems else None  # anything but None stops the visit

    try:
        root_problem = _attributes_problem(f.id, path, "/")
        if root_problem is not None:
            problems.append(root_problem)
        else:
            f.id.links.visit(visit, info=True)
    except DAMAGED_HDF5 as exc:
        broken.append(exc)
    if broken:
        raise damaged(path, broken[0])
    if problems:
        raise problems[0]
    return stored[0]


def link_problem(path: Path, where: str, info: h5py.h5l.LinkInfo) -> CkptError | None:
    """Why a link (never resolved) is refused: it leads out of the file, or to code."""
    if info.type == h5py.h5l.TYPE_EXTERNAL:
        return unsafe(path, where, "is an external link to another file")
    if info.type not in (h5py.h5l.TYPE_HARD, h5py.h5l.TYPE_SOFT):
        return unsafe(path, where, f"is a user-defined link (type {info.type})")
    return None


def attribute_names(obj: h5py.h5o.ObjectID) -> list[bytes]:
    """The names of ``obj``'s attributes, in one pass (opening by index costs O(n) each in
    HDF5's dense attribute storage: 20,000 attributes took minutes)."""
    names: list[bytes] = []
    h5py.h5a.iterate(obj, names.append)
    return names


def _attributes_problem(obj: h5py.h5o.ObjectID, path: Path, where: str) -> CkptError | None:
    for name in attribute_names(obj):
        attr = h5py.h5a.open(obj, name)
        tid = attr.get_type()
        if tid.get_class() not in ALLOWED_TYPE_CLASSES:
            text = name.decode("utf-8", "replace")
            return _odd_type(path, f"attribute {text!r} of {where!r}", tid)
    return None


def _odd_type(path: Path, what: str, tid: h5py.h5t.TypeID) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        path,
        f"{what} is of HDF5 type class {_CLASS_NAMES.get(tid.get_class(), tid.get_class())}, "
        "which checkpoints do not use",
        budgets.FIX,
    )


def unsafe(path: Path, where: str, problem: str) -> UnsafeContentError:
    fix = _FILTER_FIX if problem.startswith("uses HDF5 filter") else _FIX
    return UnsafeContentError(path, f"dataset or link {where!r} {problem}", fix)


def filter_problem(code: int) -> str:
    """Why a dataset compressed with filter ``code`` (not in :data:`ALLOWED_FILTERS`) is
    refused."""
    name = f" ({_FILTER_NAMES[code]})" if code in _FILTER_NAMES else ""
    return (
        f"uses HDF5 filter {code}{name}, which no release writes and whose output cannot be "
        "checked before it is decoded"
    )


def _dataset_problem(
    root: h5py.h5g.GroupID,
    name: bytes,
    path: Path,
    where: str,
    stored: list[int],
    file_bytes: int,
) -> CkptError | None:
    obj = h5py.h5o.open(root, name)
    problem = _attributes_problem(obj, path, where)
    if problem is not None or not isinstance(obj, h5py.h5d.DatasetID):
        return problem
    problem = dataset_problem(obj, path, where) or header_problem(obj, path, where)
    if problem is not None:
        return problem
    size, end = dataset_storage(obj)
    stored[0] += size
    text = storage_problem(obj, size, end, file_bytes)
    fix = "the file is truncated or damaged" if end > file_bytes else budgets.FIX
    return None if text is None else CorruptCheckpointError(path, f"dataset {where!r} {text}", fix)


def dataset_problem(
    obj: h5py.h5d.DatasetID,
    path: Path,
    where: str,
    dcpl: h5py.h5p.PropDCID | None = None,
    tid: h5py.h5t.TypeID | None = None,
) -> CkptError | None:
    """Why a dataset is refused by its type or its storage description (metadata only): a type
    class checkpoints never use, a virtual dataset, external raw storage, an unknown filter.
    ``dcpl``, ``tid``: its creation property list and type, if the caller has them already."""
    return type_problem(tid or obj.get_type(), path, where) or description_problem(
        dcpl or obj.get_create_plist(), path, where
    )


def header_problem(obj: h5py.h5o.ObjectID, path: Path, where: str) -> CkptError | None:
    """A message of a type HDF5 does not know, which it skips: no writer makes one, and where
    it was a legacy dataset's only flag (``is_scalar``, ``is_bfloat16``) the dataset would read
    as an untagged tensor (issue #36's fuzz, ``--wide``)."""
    if not capi.unknown_messages(obj):
        return None
    return CorruptCheckpointError(
        path,
        f"dataset {where!r} has a header message of a type HDF5 does not know, which it skips",
        budgets.FIX,
    )


def type_problem(tid: h5py.h5t.TypeID, path: Path, where: str) -> CkptError | None:
    """Why a dataset of type ``tid`` is refused: a type class checkpoints never use, or a
    number type whose layout is not a standard one. A function of the type alone (the
    preflight children remember it by the type's encoding)."""
    if tid.get_class() not in ALLOWED_TYPE_CLASSES:
        if _complex_layout(tid):
            return UnsupportedContentError(
                path,
                f"dataset {where!r} holds a complex numpy array (stored as h5py stores one: a "
                "compound of r and i), which ckpt-migrate does not read",
                "save that value as two real arrays (its .real and .imag) with the library "
                "that wrote the file, or leave it out",
            )
        if (fields := _record_fields(tid)) is not None:
            return UnsupportedContentError(
                path,
                f"dataset {where!r} holds a numpy structured array (fields "
                f"{', '.join(map(repr, fields))}; stored as h5py stores one: a compound), "
                "which ckpt-migrate does not read",
                "save each field as an array of its own with the library that wrote the file, "
                "or leave it out",
            )
        return _odd_type(path, f"dataset {where!r}", tid)
    standard = _STANDARD_NUMBERS.get((tid.get_class(), tid.get_size()))
    if any(tid == t for t in _LONG_DOUBLES):
        return UnsupportedContentError(
            path,
            f"dataset {where!r} holds a numpy long double array (np.longdouble, "
            f"{tid.get_size()} bytes an element), which ckpt-migrate does not read",
            "save it as float64 with the library that wrote the file (np.float64 keeps 53 "
            "bits of its 64), or leave it out",
        )
    if tid.get_class() in _NUMBER_CLASSES and not any(tid == t for t in standard or ()):
        return CorruptCheckpointError(
            path,
            f"dataset {where!r} has a {tid.get_size()}-byte "
            f"{_NUMBER_CLASSES[tid.get_class()]} type whose layout is not the standard one",
            budgets.FIX,
        )
    return None


def _complex_layout(tid: h5py.h5t.TypeID) -> bool:
    """h5py's layout of a numpy complex: a compound of two like IEEE floats ``r`` and ``i``,
    back to back (the real writer stores a complex numpy array so)."""
    if not isinstance(tid, h5py.h5t.TypeCompoundID) or tid.get_nmembers() != 2:
        return False
    members = [(tid.get_member_name(i), tid.get_member_offset(i), tid.get_member_type(i))
               for i in range(2)]  # fmt: skip
    (r, r_at, r_t), (i, i_at, i_t) = members
    return (
        (r, i) == (b"r", b"i")
        and isinstance(r_t, h5py.h5t.TypeFloatID)
        and r_t == i_t
        and (r_at, i_at) == (0, r_t.get_size())
        and tid.get_size() == 2 * r_t.get_size()
    )


def _record_fields(tid: h5py.h5t.TypeID, depth: int = 0) -> list[str] | None:
    """The field names of h5py's layout of a numpy structured array: a compound of numbers
    (or of such compounds, 4 deep at most) with readable names, at most 64 of them (the real
    writer stores a structured numpy array so); None for any other type."""
    if not isinstance(tid, h5py.h5t.TypeCompoundID) or not 0 < tid.get_nmembers() <= 64:
        return None
    if depth > 4:
        return None
    names = []
    for i in range(tid.get_nmembers()):
        member = tid.get_member_type(i)
        numeric = isinstance(member, (h5py.h5t.TypeIntegerID, h5py.h5t.TypeFloatID))
        if not numeric and _record_fields(member, depth + 1) is None:
            return None
        try:
            names.append(tid.get_member_name(i).decode("utf-8"))
        except UnicodeDecodeError:
            return None
    return names if all(n.isprintable() and len(n) <= 64 for n in names) else None


def description_problem(dcpl: h5py.h5p.PropDCID, path: Path, where: str) -> CkptError | None:
    """Why a dataset is refused by its storage description: a virtual dataset, external raw
    storage, a filter outside :data:`ALLOWED_FILTERS`."""
    if dcpl.get_layout() == h5py.h5d.VIRTUAL:
        return unsafe(path, where, "is a virtual dataset over other files")
    if dcpl.get_external_count():
        return unsafe(path, where, "stores its data in an external file")
    for i in range(dcpl.get_nfilters()):
        code = dcpl.get_filter(i)[0]
        if code not in ALLOWED_FILTERS:
            return unsafe(path, where, filter_problem(code))
    return None


def dataset_storage(
    ds: h5py.h5d.DatasetID, dcpl: h5py.h5p.PropDCID | None = None, extents: Extents | None = None
) -> tuple[int, int]:
    """(bytes stored, end of the last stored byte) of a dataset: one walk of its chunk index
    (HDF5's own storage size walks it too), or its contiguous block. ``extents``: where each
    stored piece lies is added to it too (``overlaps.remember``)."""
    if (dcpl or ds.get_create_plist()).get_layout() != h5py.h5d.CHUNKED:
        size = ds.get_storage_size()
        offset = ds.get_offset()
        if extents is not None and offset is not None:
            extents.add(offset, offset + size)
        return size, 0 if offset is None else offset + size
    # Summed as the index is walked: memory stays flat however many chunks a file declares
    # (a list of them would let a small file with a huge index buy gigabytes; the caller
    # that asks for ``extents`` keeps 16 bytes a chunk, as the overlap map always has).
    total = end = 0

    def chunk(info: h5py.h5d.StoreInfo) -> None:
        nonlocal total, end
        total += info.size
        end = max(end, info.byte_offset + info.size)
        if extents is not None:
            extents.chunk(info)

    ds.chunk_iter(chunk)
    return total, end


def storage_problem(
    ds: h5py.h5d.DatasetID, stored: int, end: int, file_bytes: int, declared: int | None = None
) -> str | None:
    """Why a dataset storing ``stored`` bytes, the last at ``end``, cannot be read from a file of
    ``file_bytes``: it declares more than ``stored`` could expand to, or lies past the end.
    ``declared``: its :func:`declared_bytes`, if the caller has it already."""
    if end > file_bytes:
        return (
            f"has stored data that lies past the end of the file (byte {end:,} of {file_bytes:,})"
        )
    if declared is None:
        if ds.get_space().get_simple_extent_type() != h5py.h5s.SIMPLE:
            return None
        declared = declared_bytes(ds)
    return budgets.dataset_problem(declared, stored)


def declared_bytes(
    ds: h5py.h5d.DatasetID,
    space: h5py.h5s.SpaceID | None = None,
    tid: h5py.h5t.TypeID | None = None,
) -> int:
    """What a dataset's shape and type declare it holds (0 for a scalar or empty space).
    ``space``, ``tid``: its dataspace and type, if the caller has them already."""
    space = space or ds.get_space()
    if space.get_simple_extent_type() != h5py.h5s.SIMPLE:
        return 0
    return math.prod(space.shape) * (tid or ds.get_type()).get_size()
