"""Where a dataset's stored bytes lie, read from its object header and chunk index alone (issue
33): what ``h5.stored`` asks HDF5 for (type, shape, layout, filter pipeline, the chunk index's
entries), without HDF5 opening the dataset.

``verify`` of two checkpoints compares tensors stored alike by their stored bytes; through
HDF5 each pair cost two opens, two walks of the chunk index and the property lists (about
0.16 ms), each after the preflight walk had tried the dataset in a child. Read so, no dataset
is opened through HDF5 in the reading process (``headercompare``; the walk still decides
whether HDF5 can read the file).

Read: the datatype (a standard number or h5py's bool, ``number_type``), the dataspace (HDF5
File Format Specification 3.0, §IV.A.2.b), the data layout (§IV.A.2.i, version 3:
contiguous, compact, or chunked with a version-1 B-tree of chunks, §III.A.1, node type 1,
whose keys hold each chunk's stored size, filter mask and offset) and the filter pipeline
(§IV.A.2.l). Anything else (a virtual layout, version 4's newer indexes, external storage, a
shared message, a message HDF5 does not know, a group) is :class:`Undecided`. Every read goes
through the caller's bounded ``read`` (``headerfacts.HeaderReader``: inside the file, and
together under twice its size).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import h5py
import numpy as np

from ckpt_migrate.format.h5.chunks import Index
from ckpt_migrate.format.h5.fractalheap import UNDEF
from ckpt_migrate.format.h5.headers import LAST_KNOWN, SHARED, KeepUnknown, Read, read_header
from ckpt_migrate.format.h5.storagescan import Undecided, filters

_DATASPACE, _DATATYPE, _EXTERNAL, _LAYOUT, _FILTERS = 0x01, 0x03, 0x07, 0x08, 0x0B
_KINDS = KeepUnknown((_DATASPACE, _DATATYPE, _EXTERNAL, _LAYOUT, _FILTERS))
_COMPACT, _CONTIGUOUS, _CHUNKED = 0, 1, 2
_TYPES_KEPT = 1024  # distinct datatype messages remembered
_LIMIT = 1 << 10  # continuation blocks of one dataset's header
_MAX_DEPTH = 64  # levels of a chunk B-tree
_NODE_HEAD = 24  # "TREE", type, level, entries used, two sibling addresses


def _standard_numbers() -> dict[bytes, list[tuple[bytes, np.dtype]]]:
    """The datatype message of each standard number type and of h5py's bool (its encoding by
    HDF5, less ``H5Tencode``'s two leading bytes), by its first 8 bytes: class, bit fields
    and size."""
    table: dict[bytes, list[tuple[bytes, np.dtype]]] = {}
    for code in ("f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"):
        for order in "<>":
            dtype = np.dtype(order + code)
            message = h5py.h5t.py_create(dtype).encode()[2:]
            known = table.setdefault(message[:8], [])
            if all(m != message for m, _ in known):
                known.append((message, dtype))
    return table


_NUMBERS = _standard_numbers()


def number_type(body: bytes, exact: bool) -> np.dtype | None:
    """The numpy dtype of a datatype message that is a standard number or bool, else None.
    ``exact``: the message is exactly the type (an attribute's, whose length is its own);
    otherwise what follows it is the header's padding, zeros."""
    for message, dtype in _NUMBERS.get(body[:8], ()):
        if body == message or (
            not exact and body.startswith(message) and not any(body[len(message) :])
        ):
            return dtype
    return None


@dataclass(frozen=True, slots=True)
class StoredLayout:
    """A dataset's storage as its header declares it. ``dtype``: a standard number's (None:
    another type); ``shape`` None: a null dataspace; ``chunks``: the chunk shape (None: not
    chunked); ``pipeline``: its filters in order, each (id, flags, client data);
    ``entries``: a chunked dataset's index; ``at`` and ``size``: a contiguous one's single
    piece (``at`` None: nothing stored); ``compact``: its data is in its header."""

    dtype: np.dtype | None
    shape: tuple[int, ...] | None
    chunks: tuple[int, ...] | None
    pipeline: tuple[tuple[int, int, tuple[int, ...]], ...]
    entries: Index | None = None
    at: int | None = None
    size: int = 0
    compact: bool = False

    @property
    def filters(self) -> tuple[int, ...]:
        return tuple(code for code, _, _ in self.pipeline)

    def chunk_list(self) -> list[tuple[tuple[int, ...], int, int, int]]:
        """The chunk index as HDF5's ``chunk_iter`` lists it, in the index's order: (chunk
        offset, filter mask, address, size) each; empty where not chunked."""
        index = self.entries
        if index is None:
            return []
        return [
            (index.where(i), index.masks[i], index.offsets[i], index.sizes[i])
            for i in range(len(index))
        ]


def read_layout(read: Read, address: int, dtypes: dict[bytes, np.dtype | None]) -> StoredLayout:
    """The ``StoredLayout`` of the dataset whose header is at ``address``; ``dtypes``: the
    caller's table of datatype messages already known (each tensor of a dtype has the same)."""
    found: dict[int, bytes] = {}
    for kind, flags, body in read_header(read, address, set(), _LIMIT, kinds=_KINDS).messages:
        if flags & SHARED or kind > LAST_KNOWN or kind in found or kind == _EXTERNAL:
            raise Undecided(
                "a shared message, one HDF5 does not know, one twice, or storage in other files"
            )
        found[kind] = body
    if not {_DATASPACE, _DATATYPE, _LAYOUT} <= found.keys():
        raise Undecided("not a dataset")
    type_body = found[_DATATYPE]
    if type_body in dtypes:
        dtype = dtypes[type_body]
    else:
        dtype = number_type(type_body, exact=False)
        if len(dtypes) < _TYPES_KEPT:
            dtypes[type_body] = dtype
    shape = dataspace_shape(found[_DATASPACE])
    pipeline = tuple(filters(found[_FILTERS])) if _FILTERS in found else ()
    parts = dtype, shape
    layout = found[_LAYOUT]
    if len(layout) < 2 or layout[0] != 3:
        raise Undecided("a layout message of another version")
    if layout[1] == _COMPACT:
        return StoredLayout(*parts, None, pipeline, compact=True)
    if layout[1] == _CONTIGUOUS and len(layout) >= 18:
        at, size = struct.unpack_from("<QQ", layout, 2)
        return StoredLayout(*parts, None, pipeline, None, _at(at), 0 if at == UNDEF else size)
    rank = layout[2] if len(layout) > 2 else 0
    if layout[1] != _CHUNKED or len(layout) < 11 + 4 * rank or not shape:
        raise Undecided("a virtual layout, a chunked one that is not whole, or chunked scalar")
    dims = struct.unpack_from(f"<{rank}I", layout, 11)
    if rank != len(shape) + 1 or 0 in dims or (dtype is not None and dims[-1] != dtype.itemsize):
        raise Undecided("a chunk shape that is not the dataset's")
    root = struct.unpack_from("<Q", layout, 3)[0]
    entries = _entries(read, root, rank) if root != UNDEF else _no_entries(rank - 1)
    return StoredLayout(*parts, tuple(dims[:-1]), pipeline, entries)


def chunk_keys(read: Read, root: int, rank: int) -> Iterator[tuple[bytes, int, int]]:
    """(the body of a node's entries, where its entry starts, the chunk's address) of every
    leaf entry of the version-1 B-tree of chunks at ``root`` (``rank``: the layout's
    dimensionality, one more than the dataset's), in the tree's order. Each key is the chunk's
    stored size, filter mask and offset."""
    key = 8 + 8 * rank
    todo, seen = [(root, -1)], set()
    while todo:
        at, above = todo.pop()
        if at in seen:
            raise Undecided("chunk index nodes loop")
        seen.add(at)
        head = read(at, _NODE_HEAD)
        if head[:5] != b"TREE\x01":
            raise Undecided(f"no chunk index node at {at}")
        level, count = head[5], struct.unpack_from("<H", head, 6)[0]
        if level > _MAX_DEPTH or (above >= 0 and level != above - 1):
            raise Undecided("chunk index levels")
        body = read(at + _NODE_HEAD, count * (key + 8) + key)
        children = []
        for i in range(count):
            pos = i * (key + 8)
            child = struct.unpack_from("<Q", body, pos + key)[0]
            if level:
                children.append((child, level))
            else:
                yield body, pos, child
        todo.extend(reversed(children))  # (depth first, left to right: the tree's order)


def _entries(read: Read, root: int, rank: int) -> Index:
    found = _no_entries(rank - 1)
    offset = struct.Struct(f"<II{rank - 1}Q")
    for body, pos, child in chunk_keys(read, root, rank):
        size, mask, *where = offset.unpack_from(body, pos)
        found.flat.extend(where)
        found.offsets.append(child)
        found.sizes.append(size)
        found.masks.append(mask)
    return found


def _no_entries(ndim: int) -> Index:
    return Index(ndim, array("Q"), array("Q"), array("Q"), array("Q"))


def _at(address: int) -> int | None:
    return None if address == UNDEF else address


def dataspace_shape(space: bytes) -> tuple[int, ...] | None:
    """A dataspace message's shape (version 1 or 2): ``()`` scalar, None null."""
    if len(space) < 4 or space[0] not in (1, 2) or (space[0] == 2 and space[3] not in (0, 1, 2)):
        raise Undecided("a dataspace message of another version or type")
    if space[0] == 2 and space[3] == 2:
        return None
    rank, first = space[1], 8 if space[0] == 1 else 4
    if len(space) < first + 8 * rank or (space[0] == 2 and (space[3] == 0) != (rank == 0)):
        raise Undecided("a dataspace message that runs short or contradicts itself")
    return tuple(struct.unpack_from(f"<{rank}Q", space, first))
