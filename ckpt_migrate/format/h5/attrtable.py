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

import codecs
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

from ckpt_migrate.format.h5 import fractalheap
from ckpt_migrate.format.h5.fractalheap import UNDEF, Unknown
from ckpt_migrate.format.h5.headers import SHARED, HeaderError, read_header
from ckpt_migrate.format.h5.heapblocks import Blocks
from ckpt_migrate.format.h5.root import root_header
from ckpt_migrate.format.progress import Count, Progress

TICK_EVERY = 1000
MAX_CHUNKS = 1 << 20  # continuation blocks of one header (each holds at least one message)
HEAPS_KEPT = 8  # global heap collections kept in memory (``HeapFile.heaps``)
# A larger collection was made for one large text (HDF5 fills collections of 4 to 64 KiB, each
# new one twice the last: 3,250 of them at 150k leaves, and makes one to fit an object larger
# than that): read for it once, not kept (the 27 MB spec was held through the pass, issue 33).
HEAP_KEPT_BYTES = 1 << 20
_ATTRIBUTE, _ATTRIBUTE_INFO = 0x0C, 0x15
_VLEN_CLASS, _STRING = 9, 1
_SCALAR_V2 = 0
_HEAD = struct.Struct("<BBHHH")  # an attribute message's version, flags and field sizes
STRING_REF = struct.Struct("<IQI")  # a variable-length string: length, heap collection, index
# An attribute message's (name's start, its length with its NUL, the data's start, ``_tail``)
Fields = tuple[int, int, int, "tuple[bool, int] | None"]
# Datatype and dataspace messages seen (few distinct ones: every leaf's is the same string).
_TAILS: dict[tuple[bytes, bytes], tuple[bool, int] | None] = {}
_TAILS_KEPT = 1024


Tick = Callable[[], object]
Keep = Callable[[str, "str | None"], Any]


def _nothing() -> None:
    pass


@dataclass
class HeapFile:
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
    heaps: OrderedDict[int, Collection] = field(default_factory=OrderedDict)
    visited: set[int] = field(default_factory=set)
    # Told of each block of a dense root and what its attributes name (``heapblocks``)
    blocks: Blocks | None = None

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

    def collection_bytes(self, at: int) -> bytes:
        """The bytes of the global heap collection at ``at`` (``Unknown`` if there is none)."""
        kept = self.heaps.get(at)
        return (kept if kept is not None else _collection(self, at))[0]

    def heap_text(self, collection: int, index: int, length: int) -> str | None:
        """The string of ``length`` bytes that is object ``index`` of the global heap
        collection at ``collection``, as h5py gives it (to its first NUL, decoded as UTF-8);
        None if the object is shorter. Decoded where the collection's bytes are: a 27 MB
        ``__spec__`` copied three times on its way was most of the peak of a read of 150k
        leaves (issue 33)."""
        kept, loaded = self.heaps.get(collection), None
        if kept is None:
            kept = _collection(self, collection)
            loaded = kept[0]
            if len(kept[0]) <= HEAP_KEPT_BYTES:
                self.heaps[collection] = kept
                if len(self.heaps) > HEAPS_KEPT:
                    self.heaps.popitem(last=False)
        else:
            self.heaps.move_to_end(collection)
        data, objects = kept
        if self.blocks is not None:
            self.blocks.collection(collection, loaded)
        try:
            start, n = objects[index]
        except KeyError:
            raise Unknown(f"no object {index} in the heap collection at {collection}") from None
        if n < length:
            return None
        nul = data.find(b"\0", start, start + length)
        return _utf8(memoryview(data)[start : start + length if nul < 0 else nul])


def root_texts(
    f: h5py.File,
    path: Path,
    tick: Tick = _nothing,
    keep: Keep | None = None,
    progress: Progress | None = None,
    phase: str = "read root",
    blocks: Blocks | None = None,
) -> dict[str, Any] | None:
    """``read_texts`` of the root group of ``f``, opened on ``path`` by HDF5's default driver,
    when it has as many attributes as HDF5 counts (those ``blocks`` vouched for among them,
    not in the table); else None. ``tick`` is called every ``TICK_EVERY`` attributes (the
    preflight's sign of progress); ``progress`` hears of them as ``phase`` (a root of 150k
    leaves takes seconds)."""
    at = root_header(f)
    if at is None:
        return None
    count = h5o.get_info(f.id).num_attrs
    counted = Count(progress, phase, count, TICK_EVERY)
    if progress is not None:
        keep = _counted(keep, counted)
        if blocks is not None:
            blocks.counted = counted.add
    try:
        table = read_texts(path, at[0], at[1], tick, keep, blocks)
    except OSError:
        return None
    if table is None or len(table) + (0 if blocks is None else blocks.vouched) != count:
        return None
    counted.end()
    return table


def next_creation_index(f: h5py.File, path: Path) -> int | None:
    """The creation order number HDF5 gives the next attribute of the root of ``f`` (open on
    ``path``): its attribute info message's maximum creation index, read from the file's
    bytes; None where the root does not track the order or this reader cannot tell. HDF5's
    own look-up of the last number (``H5Aget_info_by_idx`` in decreasing order) first sorts
    every attribute: 53 ms of a 12k-tensor root edit's 0.6 s (issue 33)."""
    at = root_header(f)
    if at is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        heapfile = HeapFile(fd, at[1], os.fstat(fd).st_size - at[1])
        for kind, body in _messages(heapfile, at[0]):
            if kind == _ATTRIBUTE_INFO and len(body) >= 4 and body[0] == 0 and body[1] & 0x01:
                return struct.unpack_from("<H", body, 2)[0]
        return None
    except (Unknown, OSError):
        return None
    finally:
        os.close(fd)


def _counted(keep: Keep | None, count: Callable[[], None]) -> Keep:
    def counted(name: str, text: str | None) -> Any:
        count()
        return text if keep is None else keep(name, text)

    return counted


def read_texts(
    path: Path,
    address: int,
    base: int = 0,
    tick: Tick = _nothing,
    keep: Keep | None = None,
    blocks: Blocks | None = None,
) -> dict[str, Any] | None:
    """Every attribute of the object whose header is at ``address`` in ``path`` (relative to
    the superblock's base address ``base``, with 8-byte offsets and lengths): name -> the text
    of a scalar variable-length string, None for any other attribute. None when the header is
    not one this reader knows (the caller then reads the attributes by h5py).

    ``keep(name, text or None)``: what the table holds instead of each text, called as each
    is read (after its block's checksum is verified): a reader of 150k leaves keeps what it
    makes of each text, not all the texts at once. Its exceptions pass through; the caller
    must expect a table of None even after ``keep`` has seen every attribute.

    ``blocks`` (``heapblocks``): told of each block of dense storage, each attribute's name
    and each text's collection; it may vouch for a block's attributes, which are then neither
    taken nor in the table."""
    fd = os.open(path, os.O_RDONLY)
    try:
        f = HeapFile(fd, base, os.fstat(fd).st_size - base, tick, blocks=blocks)
        if blocks is not None:
            blocks.bind(f)
        return _attributes(f, address, tick, keep)
    except Unknown:
        return None
    finally:
        os.close(fd)


def _attributes(f: HeapFile, address: int, tick: Tick, keep: Keep | None) -> dict[str, Any]:
    found: dict[str, Any] = {}
    told = f.blocks

    def take(name: str, value: str | None) -> None:
        if name in found:
            raise Unknown(f"attribute {name!r} twice")
        if told is not None:
            told.name(name)
        found[name] = value if keep is None else keep(name, value)
        if len(found) % TICK_EVERY == 0:
            tick()

    def take_at(block: bytes, pos: int) -> int | None:
        """The attribute message at ``pos`` of a heap block, its fields read once: its
        length, from its name, datatype and dataspace (each padded to 8 bytes in version 1)
        and the data they size; None where none starts (the block's free space)."""
        if pos + 8 > len(block) or block[pos] not in (1, 2, 3):
            return None
        fields = _fields(block, pos)
        tail = fields[3]
        if tail is None:
            return None
        end = fields[2] + tail[1]
        if end > len(block):
            return None
        take(*_attribute(f, block, pos, end, fields))
        return end - pos

    for kind, body in _messages(f, address):
        if kind == _ATTRIBUTE_INFO:
            _dense(f, body, take_at)
        else:
            take(*_attribute(f, body, 0, len(body)))
    return found


def _dense(f: HeapFile, info: bytes, take_at: fractalheap.TakeAt) -> None:
    """The attribute messages of dense storage (§IV.A.2.v), each to ``take_at``: every object
    of the fractal heap the attribute info message names (``fractalheap.walk``). The caller's
    count check against HDF5's catches attributes this reader did not find."""
    heap = attribute_heap(info)
    if heap == UNDEF:  # no heap: the attributes are messages of the header (compact)
        return
    fractalheap.walk(f.read, f.visited, heap, take_at, f.tick, f.blocks)


def attribute_heap(info: bytes) -> int:
    """The fractal heap an attribute info message names (``UNDEF``: none, the attributes are
    messages of the header); ``Unknown`` for a message this reader does not know."""
    if len(info) < 10 or info[0] != 0:
        raise Unknown("attribute info message")
    pos = 2 + (2 if info[1] & 0x01 else 0)
    return struct.unpack_from("<Q", info, pos)[0]


def _fields(block: bytes, pos: int) -> Fields:
    """(where the name starts, its length with its NUL, where the data starts, ``_tail`` of the
    datatype and dataspace) of the attribute message at ``pos`` (version 1, 2 or 3)."""
    name_at, name_n, type_at, type_n, space_at, space_n, data_at = message_fields(block, pos)
    key = block[type_at : type_at + type_n], block[space_at : space_at + space_n]
    tail = _TAILS.get(key)
    if tail is None:
        tail = _tail(*key)
        if len(_TAILS) < _TAILS_KEPT:
            _TAILS[key] = tail
    return name_at, name_n, data_at, tail


def message_fields(block: bytes, pos: int = 0) -> tuple[int, int, int, int, int, int, int]:
    """Where the attribute message at ``pos`` keeps its parts: (the name's start, its length
    with its NUL, the datatype's start, its length, the dataspace's start, its length, the
    data's start). Version 1 pads each part to 8 bytes; version 3 has an encoding byte first."""
    version, _flags, name_n, type_n, space_n = _HEAD.unpack_from(block, pos)
    if version == 1:
        name_at = pos + 8
        type_at = name_at + _pad8(name_n)
        space_at = type_at + _pad8(type_n)
        data_at = space_at + _pad8(space_n)
    else:
        name_at = pos + (9 if version == 3 else 8)
        type_at = name_at + name_n
        space_at = type_at + type_n
        data_at = space_at + space_n
    return name_at, name_n, type_at, type_n, space_at, space_n, data_at


def _tail(dtype: bytes, space: bytes) -> tuple[bool, int] | None:
    """(whether the attribute is a scalar variable-length string, the bytes of its data) of a
    datatype and dataspace message; None when their size is not known."""
    count = elements(space)
    if len(dtype) < 8 or count is None:
        return None
    element = struct.unpack_from("<I", dtype, 4)[0]
    return is_vlen_string(dtype) and _is_scalar(space), element * count


def elements(space: bytes) -> int | None:
    """How many elements a dataspace message (version 1 or 2) holds; None if unknown."""
    if len(space) < 4 or space[0] not in (1, 2):
        return None
    if space[0] == 2 and space[3] == 2:  # the null dataspace
        return 0
    rank, first = space[1], 8 if space[0] == 1 else 4
    if len(space) < first + 8 * rank:
        return None
    return math.prod(struct.unpack_from(f"<{rank}Q", space, first))


def _messages(f: HeapFile, address: int) -> list[tuple[int, bytes]]:
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


def _attribute(
    f: HeapFile, data: bytes, pos: int, end: int, fields: Fields | None = None
) -> tuple[str, str | None]:
    """(name, text or None) of the attribute message from ``pos`` to ``end`` of ``data``
    (``fields``: its ``_fields``, if the caller read them)."""
    if end - pos < 8:
        raise Unknown("short attribute message")
    version, flags = data[pos], data[pos + 1]
    if version not in (1, 2, 3):
        raise Unknown(f"attribute message version {version}")
    if version != 1 and flags & 0x03:
        raise Unknown("attribute with a shared datatype or dataspace")
    name_at, name_n, data_at, tail = fields or _fields(data, pos)
    if name_n < 1 or name_at + name_n > end or data[name_at + name_n - 1] != 0:
        raise Unknown("attribute name")
    if data_at > end:
        raise Unknown("attribute message runs past its end")
    name = data[name_at : name_at + name_n - 1].decode("utf-8", "surrogateescape")
    if tail is None or not tail[0]:
        return name, None
    if data_at + 16 > end:
        raise Unknown("attribute data")
    length, collection, index = STRING_REF.unpack_from(data, data_at)
    if collection in (0, UNDEF):  # a null string
        return name, None
    text = f.heap_text(collection, index, length)
    if text is None:
        raise Unknown("string longer than its heap object")
    return name, text


def _utf8(raw: memoryview) -> str:
    return codecs.utf_8_decode(raw, "surrogateescape", True)[0]


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def is_vlen_string(dtype: bytes) -> bool:
    """A variable-length string datatype (class 9, type 1)."""
    return len(dtype) >= 8 and dtype[0] & 0x0F == _VLEN_CLASS and dtype[1] & 0x0F == _STRING


def _is_scalar(space: bytes) -> bool:
    """A scalar dataspace: version 1 with no dimensions, or version 2 of type scalar."""
    if len(space) < 4 or space[1] != 0:
        return False
    return space[0] == 1 or (space[0] == 2 and space[3] == _SCALAR_V2)


# A global heap collection's bytes, and where each of its objects is in them (start, length)
Collection = tuple[bytes, dict[int, tuple[int, int]]]


def _collection(f: HeapFile, at: int) -> Collection:
    """The global heap collection at ``at``: its bytes, and its objects' places by index."""
    head = f.read(at, 16)
    if head[:5] != b"GCOL\x01":
        raise Unknown(f"no global heap collection at {at}")
    size = struct.unpack_from("<Q", head, 8)[0]
    data = f.read(at, size)
    objects: dict[int, tuple[int, int]] = {}
    pos = 16
    while pos + 16 <= size:
        index, _refs, n = struct.unpack_from("<HH4xQ", data, pos)
        if index == 0:  # free space: the rest of the collection
            break
        if pos + 16 + n > size:
            raise Unknown("a heap object runs past its collection")
        objects[index] = (pos + 16, n)
        pos += 16 + _pad8(n)
    return data, objects
