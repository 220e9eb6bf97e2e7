"""The managed objects of a fractal heap, read block by block (HDF5 File Format Specification
3.0, §III.G), for the one-pass readers of a group's dense storage: ``attrtable`` (attribute
messages, §IV.A.2.v) and ``linktable`` (link messages, §IV.A.2.c).

HDF5 appends a heap's objects end to end in its direct blocks, so each object's length is read
from its own fields (the caller's ``TakeAt``, which takes the object as it reads them); the
heap's count of managed objects then proves
none was missed (a heap with a hole, where an object was deleted, is :class:`Unknown`). Heaps
with filters, huge or tiny objects are :class:`Unknown` too: the caller then asks HDF5. Every
checksum is verified (the direct blocks together: ``lookup3_many``), every block is read once,
and at most ``MAX_BLOCKS`` of them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ckpt_migrate.format.h5.lookup3 import lookup3_many
from ckpt_migrate.format.h5.root import lookup3

MAX_BLOCKS = 1 << 20
# Direct blocks read before they are verified together (``lookup3_many``: HDF5's own C
# function where it is exported, else one numpy pass per block size) and their objects taken.
# Their objects are found only then, each taken as a slice of its block: 32 MiB of blocks and
# a view per object (150k of them) were the largest transient of a 150k-leaf read (issue 33).
BATCH_BYTES = 4 << 20
UNDEF = (1 << 64) - 1

Read = Callable[[int, int], bytes]  # (address, count) -> exactly count bytes, or raise
# (a verified block, a position) -> the length of the object there, taken; None where none
# starts or it would run past the block (nothing taken)
TakeAt = Callable[[bytes, int], "int | None"]


class Unknown(Exception):
    """A structure this reader does not know, or one that contradicts itself."""


class Blocks(Protocol):
    """Told of each verified direct block before and after its objects are taken
    (``heapblocks``: a record of what each held, or a check that vouches for a block whose
    bytes a record holds, so that its objects are not taken again)."""

    def known(self, at: int, block: bytes) -> int | None:
        """The number of objects of the block at ``at`` vouched for (they are not taken), or
        None (they are)."""

    def taken(self, at: int, block: bytes, objects: int) -> None:
        """The block at ``at`` had its ``objects`` taken."""


# A fractal heap header's size with 8-byte offsets and lengths and no I/O filters (HDF5 File
# Format Specification 3.0, III.G), its checksum included
_HEADER_BYTES = 146


def _nothing() -> None:
    pass


def walk(
    read: Read,
    visited: set[int],
    heap: int,
    take_at: TakeAt,
    tick: Callable[[], object] = _nothing,
    blocks: Blocks | None = None,
) -> None:
    """Every managed object of the heap whose header is at ``heap``, in address order, to
    ``take_at``, each only after its block's checksum is verified. ``visited``: the blocks
    read (shared with the caller's other reads, against loops). ``blocks``: told of each
    direct block, and may vouch for its objects instead (``Blocks``)."""
    table, managed = _table(read, visited, heap)
    table.take_at, table.tick, table.told = take_at, tick, blocks
    table.grow()
    table.flush()
    if table.taken != managed:
        raise Unknown("the fractal heap holds objects this reader did not find")


def extent(read: Read, heap: int) -> list[tuple[int, int]]:
    """Where the heap whose header is at ``heap`` lies: (address, size) of its header, every
    indirect block (read, to find the others) and every direct block (not read)."""
    table, _ = _table(read, set(), heap)
    table.listed = [(heap, _HEADER_BYTES)]
    table.grow()
    return table.listed


def _table(read: Read, visited: set[int], heap: int) -> tuple[_Heap, int]:
    """The doubling table of the heap whose header is at ``heap`` (its blocks not yet read:
    ``_Heap.grow``) and its count of managed objects."""
    h = read(heap, _HEADER_BYTES)
    end = _HEADER_BYTES - 4  # (its checksum follows)
    if h[:5] != b"FRHP\0" or struct.unpack_from("<I", h, end)[0] != lookup3(h[:end]):
        raise Unknown(f"no fractal heap at {heap}")
    filters, flags = struct.unpack_from("<HB", h, 7)
    managed, huge, tiny = (struct.unpack_from("<Q", h, at)[0] for at in (70, 86, 102))
    width, start, top, bits, _rows, root, rows = struct.unpack_from("<HQQHHQH", h, 110)
    if filters or huge or tiny or width == 0 or not _power_of_two(start) or top < start:
        raise Unknown("a fractal heap with filters, huge or tiny objects")
    table = _Heap(read, visited, heap, width, start, top, (bits + 7) // 8)
    table.checksum = 4 if flags & 0x02 else 0
    table.root, table.rows = root, rows
    return table, managed


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass
class _Heap:
    """A fractal heap's doubling table: ``width`` blocks a row, row 0 and 1 of ``start`` bytes,
    each later row twice the one before; rows of blocks past ``top`` are indirect blocks."""

    read: Read
    visited: set[int]
    header: int
    width: int
    start: int
    top: int
    offset_bytes: int
    take_at: TakeAt = lambda block, pos: None
    tick: Callable[[], object] = _nothing
    told: Blocks | None = None
    checksum: int = 0
    root: int = UNDEF
    rows: int = 0
    listed: list[tuple[int, int]] | None = None  # (``extent``: the blocks' places, none read)
    blocks: list[bytes] = field(default_factory=list)  # direct blocks to verify
    stored: list[int] = field(default_factory=list)  # and their checksums
    # (address, block): their objects taken once verified
    read_blocks: list[tuple[int, bytes]] = field(default_factory=list)
    pending: int = 0  # bytes of blocks read since the last flush
    taken: int = 0

    def grow(self) -> None:
        """Read (or, ``listed``, list) the blocks from the root's."""
        if self.rows == 0:
            if self.root != UNDEF:
                self.direct(self.root, self.start)
        else:
            self.indirect(self.root, self.rows)

    def row_size(self, row: int) -> int:
        return self.start if row == 0 else self.start << (row - 1)

    def flush(self) -> None:
        """Verify the blocks read since the last flush, then take their objects."""
        if lookup3_many(self.blocks) != self.stored:
            raise Unknown("a fractal heap direct block: checksum mismatch")
        read_blocks, self.read_blocks, self.blocks, self.stored = self.read_blocks, [], [], []
        self.pending = 0
        told = self.told
        for at, block in read_blocks:
            vouched = None if told is None else told.known(at, block)
            if vouched is not None:
                self.taken += vouched
                continue
            before = self.taken
            self._objects(block)
            if told is not None:
                told.taken(at, block, self.taken - before)

    def _objects(self, block: bytes) -> None:
        """Take the objects of a verified direct block, end to end from its header's end."""
        size, take_at = len(block), self.take_at
        pos = 5 + 8 + self.offset_bytes + self.checksum
        while pos < size:
            n = take_at(block, pos)
            if n is None:
                break
            self.taken += 1
            pos += n

    def direct(self, at: int, size: int) -> None:
        if self.listed is not None:
            self.listed.append((at, size))
            return
        self.tick()  # a block holds up to about 600 attributes
        block = self.read(at, size)
        head = 5 + 8 + self.offset_bytes
        if block[:5] != b"FHDB\0" or struct.unpack_from("<Q", block, 5)[0] != self.header:
            raise Unknown(f"no fractal heap direct block at {at}")
        if self.checksum:  # verified together (``lookup3_many``), the field read as zero
            self.stored.append(struct.unpack_from("<I", block, head)[0])
            block = block[:head] + bytes(4) + block[head + 4 :]  # (objects lie past it)
            self.blocks.append(block)
        self.read_blocks.append((at, block))
        self.pending += size
        if self.pending >= BATCH_BYTES:
            self.flush()

    def indirect(self, at: int, rows: int) -> None:
        direct_rows = (self.top // self.start).bit_length() + 1
        head = 5 + 8 + self.offset_bytes
        n = self.width * rows
        block = self.read(at, head + 8 * n + 4)
        if self.listed is not None:
            self.listed.append((at, len(block)))
        if block[:5] != b"FHIB\0" or struct.unpack_from("<Q", block, 5)[0] != self.header:
            raise Unknown(f"no fractal heap indirect block at {at}")
        if struct.unpack_from("<I", block, head + 8 * n)[0] != lookup3(block[: head + 8 * n]):
            raise Unknown(f"fractal heap indirect block at {at}: checksum mismatch")
        for i in range(n):
            child = struct.unpack_from("<Q", block, head + 8 * i)[0]
            if child == UNDEF:
                continue
            row = i // self.width
            size = self.row_size(row)
            if row < direct_rows:
                self.direct(child, size)
            else:  # an indirect block of as many rows as span its size
                sub = (size // (self.start * self.width)).bit_length()
                if len(self.visited) >= MAX_BLOCKS or child in self.visited:
                    raise Unknown("fractal heap blocks loop or are too many")
                self.visited.add(child)
                self.indirect(child, sub)
