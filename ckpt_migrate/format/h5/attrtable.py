"""A group's string attributes in one pass over its object header (issue 33).

Format 0.5 keeps one ``<leaf>.__metadata__`` string attribute per leaf on the root group.
The real library's files (h5py's defaults) hold them in a version-1 object header, as a list
of attribute messages that HDF5 searches from the start on every look-up by name: reading all
of them one by one costs O(n²), about 2 ms per leaf at 150k leaves (37 µs at 3k, 180 µs at
12k, measured). The roots this tool writes (version 2, dense storage: a fractal heap indexed by
a B-tree) cost 30 µs per look-up through h5py. No HDF5 call reads a list of attributes with
their values in one pass, so this module does: 11 µs per attribute on a dense root, linear on
a version-1 one.

It knows only what checkpoint writers write (HDF5 File Format Specification 3.0):
version-1 and version-2 object headers (§IV.A.1) and their continuation blocks (§IV.A.2.q),
attribute messages of versions 1-3 (§IV.A.2.m), compact or in dense storage (§IV.A.2.v: the
attribute info message; the fractal heap of §III.G, its blocks read in address order, objects
end to end as HDF5 appends them), the variable-length string datatype (§IV.A.2.d, class 9)
with a scalar dataspace (§IV.A.2.b), and global heap collections (§III.E). Anything else makes
``read_texts`` return None (or the attribute's entry None) and the caller reads by h5py as
before: shared messages, heaps with filters or huge objects, other sizes of offsets and
lengths; and when the count is not HDF5's (a heap with a deleted attribute's hole). Every
checksum of the structures read is verified (the heap's blocks together: ``lookup3_many``).

Nothing here follows an address outside the file, and everything is budgeted by the file's
own size: every read lies inside it, all reads together stay under twice its size, and the
header chunks and heap blocks followed are at most ``MAX_CHUNKS``. A file that contradicts
itself is not judged here: the result is None and h5py reads it, with the checks that path
has.
"""

from __future__ import annotations

import math
import os
import struct
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
from h5py import h5o

from ckpt_migrate.format.h5.headers import SHARED, HeaderError, read_header
from ckpt_migrate.format.h5.lookup3 import lookup3_many
from ckpt_migrate.format.h5.root import lookup3, superblock_offset

TICK_EVERY = 1000
MAX_CHUNKS = 1 << 20  # continuation blocks of one header (each holds at least one message)
HEAPS_KEPT = 8  # global heap collections kept in memory (``_File.heaps``)
# Direct blocks read before they are verified together (``lookup3_many``: one numpy pass per
# block size, each costing about as much whatever the count) and their objects taken.
BATCH_BYTES = 32 << 20
_UNDEF = (1 << 64) - 1
_ATTRIBUTE, _ATTRIBUTE_INFO = 0x0C, 0x15
_VLEN_CLASS, _STRING = 9, 1
_SCALAR_V2 = 0


Tick = Callable[[], object]
Keep = Callable[[str, "str | None"], Any]


def _nothing() -> None:
    pass


class Unknown(Exception):
    """The header holds something this reader does not know: read it by h5py."""


@dataclass
class _File:
    """The file from its superblock's base (addresses count from there), every byte read
    counted: header chunks and heap collections do not overlap, so a file that makes this read
    more than twice its size is not one a writer made."""

    fd: int
    base: int
    size: int
    tick: Tick = _nothing
    spent: int = 0
    # The last global heap collections read, by address: a writer fills one collection after
    # the other, so a few suffice (all of them held the leaves' texts twice over, issue 33).
    heaps: OrderedDict[int, dict[int, bytes]] = field(default_factory=OrderedDict)
    visited: set[int] = field(default_factory=set)

    def read(self, at: int, n: int) -> bytes:
        if at < 0 or n < 0 or at + n > self.size:
            raise Unknown(f"{n} bytes at {at} are outside the file")
        self.spent += n
        if self.spent > 2 * self.size + (1 << 20):
            raise Unknown("the header and its heap are larger than the file")
        data = os.pread(self.fd, n, self.base + at)
        if len(data) != n:
            raise Unknown("short read")
        return data

    def heap_object(self, collection: int, index: int) -> bytes:
        objects = self.heaps.get(collection)
        if objects is None:
            objects = self.heaps[collection] = _collection(self, collection)
            if len(self.heaps) > HEAPS_KEPT:
                self.heaps.popitem(last=False)
        else:
            self.heaps.move_to_end(collection)
        try:
            return objects[index]
        except KeyError:
            raise Unknown(f"no object {index} in the heap collection at {collection}") from None


def root_texts(
    f: h5py.File, path: Path, tick: Tick = _nothing, keep: Keep | None = None
) -> dict[str, Any] | None:
    """``read_texts`` of the root group of ``f``, opened on ``path`` by HDF5's default driver,
    when it has as many attributes as HDF5 counts; else None. ``tick`` is called every
    ``TICK_EVERY`` attributes (the preflight's sign of progress)."""
    if f.driver != "sec2" or f.id.get_create_plist().get_sizes() != (8, 8):
        return None
    try:
        table = read_texts(path, h5o.get_info(f.id).addr, superblock_offset(f), tick, keep)
    except OSError:
        return None
    if table is None or len(table) != h5o.get_info(f.id).num_attrs:
        return None
    return table


def read_texts(
    path: Path, address: int, base: int = 0, tick: Tick = _nothing, keep: Keep | None = None
) -> dict[str, Any] | None:
    """Every attribute of the object whose header is at ``address`` in ``path`` (relative to
    the superblock's base address ``base``, with 8-byte offsets and lengths): name -> the text
    of a scalar variable-length string, None for any other attribute. None when the header is
    not one this reader knows (the caller then reads the attributes by h5py).

    ``keep(name, text or None)``: what the table holds instead of each text, called as each
    is read (after its block's checksum is verified): a reader of 150k leaves keeps what it
    makes of each text, not all the texts at once. Its exceptions pass through; the caller
    must expect a table of None even after ``keep`` has seen every attribute."""
    fd = os.open(path, os.O_RDONLY)
    try:
        f = _File(fd, base, os.fstat(fd).st_size - base, tick)
        return _attributes(f, address, tick, keep)
    except Unknown:
        return None
    finally:
        os.close(fd)


def _attributes(f: _File, address: int, tick: Tick, keep: Keep | None) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def take(body: bytes) -> None:
        name, value = _attribute(f, body)
        if name in found:
            raise Unknown(f"attribute {name!r} twice")
        found[name] = value if keep is None else keep(name, value)
        if len(found) % TICK_EVERY == 0:
            tick()

    for kind, body in _messages(f, address):
        if kind == _ATTRIBUTE_INFO:
            _dense(f, body, take)
        else:
            take(body)
    return found


def _dense(f: _File, info: bytes, take: Callable[[bytes], None]) -> None:
    """The attribute messages of dense storage (§IV.A.2.v), each to ``take``: every object of
    the fractal heap (§III.G) the attribute info message names, read block by block in address
    order, ``BATCH`` blocks at a time verified then taken. The heap must hold managed objects
    only, laid end to end (as HDF5 appends them); the caller's count check against HDF5's
    catches a heap with holes."""
    if len(info) < 2 or info[0] != 0:
        raise Unknown("attribute info message")
    pos = 2 + (2 if info[1] & 0x01 else 0)
    heap = struct.unpack_from("<Q", info, pos)[0]
    if heap == _UNDEF:  # no heap: the attributes are messages of the header (compact)
        return
    h = f.read(heap, 146)
    if h[:5] != b"FRHP\0" or struct.unpack_from("<I", h, 142)[0] != lookup3(h[:142]):
        raise Unknown(f"no fractal heap at {heap}")
    filters, flags = struct.unpack_from("<HB", h, 7)
    managed, huge, tiny = (struct.unpack_from("<Q", h, at)[0] for at in (70, 86, 102))
    width, start, top, bits, _rows, root, rows = struct.unpack_from("<HQQHHQH", h, 110)
    if filters or huge or tiny or width == 0 or not _power_of_two(start) or top < start:
        raise Unknown("a fractal heap with filters, huge or tiny objects")
    geometry = _Heap(heap, width, start, top, (bits + 7) // 8, 4 if flags & 0x02 else 0, take)
    if rows == 0:
        geometry.direct(f, root, start)
    else:
        geometry.indirect(f, root, rows)
    geometry.flush()
    if geometry.taken != managed:
        raise Unknown("the fractal heap holds objects this reader did not find")


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass
class _Heap:
    """A fractal heap's doubling table: ``width`` blocks a row, row 0 and 1 of ``start`` bytes,
    each later row twice the one before; rows of blocks past ``top`` are indirect blocks."""

    header: int
    width: int
    start: int
    top: int
    offset_bytes: int
    checksum: int
    take: Callable[[bytes], None]
    blocks: list[bytes] = field(default_factory=list)  # direct blocks to verify
    stored: list[int] = field(default_factory=list)  # and their checksums
    objects: list[memoryview] = field(default_factory=list)  # theirs, taken once verified
    pending: int = 0  # bytes of blocks read since the last flush
    taken: int = 0

    def row_size(self, row: int) -> int:
        return self.start if row == 0 else self.start << (row - 1)

    def flush(self) -> None:
        """Verify the blocks read since the last flush, then take their objects."""
        if lookup3_many(self.blocks) != self.stored:
            raise Unknown("a fractal heap direct block: checksum mismatch")
        objects, self.objects, self.blocks, self.stored = self.objects, [], [], []
        self.pending = 0
        for one in objects:
            self.take(bytes(one))
        self.taken += len(objects)

    def direct(self, f: _File, at: int, size: int) -> None:
        f.tick()  # a block holds up to about 600 attributes
        block = f.read(at, size)
        head = 5 + 8 + self.offset_bytes
        if block[:5] != b"FHDB\0" or struct.unpack_from("<Q", block, 5)[0] != self.header:
            raise Unknown(f"no fractal heap direct block at {at}")
        if self.checksum:  # verified together (``lookup3_many``), the field read as zero
            self.stored.append(struct.unpack_from("<I", block, head)[0])
            block = block[:head] + bytes(4) + block[head + 4 :]  # (objects lie past it)
            self.blocks.append(block)
        view = memoryview(block)
        pos = head + self.checksum
        while pos + 8 <= size and block[pos] in (1, 2, 3):
            n = _attribute_size(block, pos)
            if n is None or pos + n > size:
                break
            self.objects.append(view[pos : pos + n])
            pos += n
        self.pending += size
        if self.pending >= BATCH_BYTES:
            self.flush()

    def indirect(self, f: _File, at: int, rows: int) -> None:
        direct_rows = (self.top // self.start).bit_length() + 1
        head = 5 + 8 + self.offset_bytes
        n = self.width * rows
        block = f.read(at, head + 8 * n + 4)
        if block[:5] != b"FHIB\0" or struct.unpack_from("<Q", block, 5)[0] != self.header:
            raise Unknown(f"no fractal heap indirect block at {at}")
        if struct.unpack_from("<I", block, head + 8 * n)[0] != lookup3(block[: head + 8 * n]):
            raise Unknown(f"fractal heap indirect block at {at}: checksum mismatch")
        for i in range(n):
            child = struct.unpack_from("<Q", block, head + 8 * i)[0]
            if child == _UNDEF:
                continue
            row = i // self.width
            size = self.row_size(row)
            if row < direct_rows:
                self.direct(f, child, size)
            else:  # an indirect block of as many rows as span its size
                sub = (size // (self.start * self.width)).bit_length()
                if len(f.visited) >= MAX_CHUNKS or child in f.visited:
                    raise Unknown("fractal heap blocks loop or are too many")
                f.visited.add(child)
                self.indirect(f, child, sub)


def _attribute_size(block: bytes, pos: int) -> int | None:
    """The length of the attribute message at ``pos`` from its own fields: name, datatype and
    dataspace (each padded to 8 bytes in version 1) and the data they size."""
    version, _flags, name_n, type_n, space_n = struct.unpack_from("<BBHHH", block, pos)
    pad = _pad8 if version == 1 else _same
    at = pos + 8 + (1 if version == 3 else 0) + pad(name_n)
    dtype = block[at : at + type_n]
    space = block[at + pad(type_n) : at + pad(type_n) + space_n]
    elements = _elements(space)
    if len(dtype) < 8 or elements is None:
        return None
    element = struct.unpack_from("<I", dtype, 4)[0]
    return at - pos + pad(type_n) + pad(space_n) + element * elements


def _elements(space: bytes) -> int | None:
    """How many elements a dataspace message (version 1 or 2) holds; None if unknown."""
    if len(space) < 4 or space[0] not in (1, 2):
        return None
    if space[0] == 2 and space[3] == 2:  # the null dataspace
        return 0
    rank, first = space[1], 8 if space[0] == 1 else 4
    if len(space) < first + 8 * rank:
        return None
    return math.prod(struct.unpack_from(f"<{rank}Q", space, first))


def _messages(f: _File, address: int) -> list[tuple[int, bytes]]:
    """(type, body) of every attribute or attribute info message of the header at
    ``address``, continuations followed (each block once)."""
    try:
        header = read_header(f.read, address, f.visited, MAX_CHUNKS)
    except HeaderError as exc:
        raise Unknown(str(exc)) from None
    found = []
    for m in header.messages:
        if m.kind in (_ATTRIBUTE, _ATTRIBUTE_INFO):
            if m.flags & SHARED:  # its body is elsewhere
                raise Unknown("shared attribute message")
            found.append((m.kind, m.body))
    return found


def _attribute(f: _File, body: bytes) -> tuple[str, str | None]:
    """(name, text or None) of one attribute message."""
    if len(body) < 8:
        raise Unknown("short attribute message")
    version, flags, name_n, type_n, space_n = struct.unpack_from("<BBHHH", body)
    if version == 1:
        pad, pos = _pad8, 8
    elif version in (2, 3):
        if flags & 0x03:
            raise Unknown("attribute with a shared datatype or dataspace")
        pad, pos = _same, 8 + (1 if version == 3 else 0)
    else:
        raise Unknown(f"attribute message version {version}")
    raw = body[pos : pos + name_n]
    if len(raw) != name_n or not raw.endswith(b"\0"):
        raise Unknown("attribute name")
    name = raw[:-1].decode("utf-8", "surrogateescape")
    pos += pad(name_n)
    dtype = body[pos : pos + type_n]
    pos += pad(type_n)
    space = body[pos : pos + space_n]
    pos += pad(space_n)
    if len(space) != space_n or len(dtype) != type_n:
        raise Unknown("attribute message runs past its end")
    if not (_is_vlen_string(dtype) and _is_scalar(space)):
        return name, None
    data = body[pos : pos + 16]
    if len(data) != 16:
        raise Unknown("attribute data")
    length, collection, index = struct.unpack("<IQI", data)
    if collection in (0, _UNDEF):  # a null string
        return name, None
    text = f.heap_object(collection, index)
    if len(text) < length:
        raise Unknown("string longer than its heap object")
    return name, _as_text(text[:length])


def _as_text(raw: bytes) -> str:
    """As h5py gives it: a C string (to the first NUL), decoded as UTF-8."""
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def _same(n: int) -> int:
    return n


def _is_vlen_string(dtype: bytes) -> bool:
    """A variable-length string datatype (class 9, type 1)."""
    return len(dtype) >= 8 and dtype[0] & 0x0F == _VLEN_CLASS and dtype[1] & 0x0F == _STRING


def _is_scalar(space: bytes) -> bool:
    """A scalar dataspace: version 1 with no dimensions, or version 2 of type scalar."""
    if len(space) < 4 or space[1] != 0:
        return False
    return space[0] == 1 or (space[0] == 2 and space[3] == _SCALAR_V2)


def _collection(f: _File, at: int) -> dict[int, bytes]:
    """The objects of the global heap collection at ``at``, by index."""
    head = f.read(at, 16)
    if head[:5] != b"GCOL\x01":
        raise Unknown(f"no global heap collection at {at}")
    size = struct.unpack_from("<Q", head, 8)[0]
    data = f.read(at, size)
    objects: dict[int, bytes] = {}
    pos = 16
    while pos + 16 <= size:
        index, _refs, n = struct.unpack_from("<HH4xQ", data, pos)
        if index == 0:  # free space: the rest of the collection
            break
        if pos + 16 + n > size:
            raise Unknown("a heap object runs past its collection")
        objects[index] = data[pos + 16 : pos + 16 + n]
        pos += 16 + _pad8(n)
    return objects
