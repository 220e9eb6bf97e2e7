"""Every stored chunk is checked before HDF5 decodes it, so that no read returns bytes a filter
did not produce.

HDF5 hands a filter the bytes the chunk index says a chunk stores, and takes what the filter
returns. The LZ4 filter (hdf5plugin's ``H5Zlz4.c``, filter 32004) trusts the lengths inside its
frame and never looks at that size: a chunk whose index entry was shortened from 8,208 to 4,104
bytes decoded without an error, half of its values read from memory nobody initialised, and a
different half on every run (issue #36). A chunk missing from the index reads as the fill value,
a chunk whose address was moved onto another reads as that one's values, also without an error.

So before any slab is read (``h5.io.read_slab``, the one place tensor data is decoded), the chunk
index entries it touches are checked against the dataset's shape and the stored frames:

* every chunk the selection needs is in the index, once, on the chunk grid and inside the
  extent, and shares no stored byte with other stored data of the file (``shared_starts``);
* a chunk with no filter applied stores exactly one chunk of bytes;
* LZ4 frame (big-endian): an 8-byte original size, a 4-byte block size, then per block a 4-byte
  compressed size and the block (stored raw when that size equals the block's). The original
  size must be the chunk's bytes, every block size positive and at most its block, and the
  blocks must end exactly at the stored size. ``LZ4_decompress_fast`` then writes every byte of
  every block or fails, so the decoded chunk is all filter output;
* deflate (zlib, which checks its own stream) must inflate to exactly the bytes the next filter
  takes; fletcher32 (HDF5 checks the sum) needs its 4 bytes; shuffle keeps the length.

An LZ4-only dataset (what every Cerebras release writes, FORMAT.md §4.5) costs one 16-byte
``pread`` per chunk and block: nothing is decoded twice. Other pipelines are read as stored
(``read_direct_chunk``) and their deflate stage inflated once more, bounded by the chunk size.
"""

from __future__ import annotations

import itertools
import math
import os
import struct
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import h5py
import numpy as np

from ckpt_migrate.errors import CorruptCheckpointError, UnsupportedContentError

DEFLATE, SHUFFLE, FLETCHER32, LZ4 = 1, 2, 3, 32004
CHECKED_FILTERS = frozenset({DEFLATE, SHUFFLE, FLETCHER32, LZ4})
_FIX = "the file is damaged; use another copy"
_FRAME_HEAD = struct.Struct(">QI")
_BLOCK_HEAD = struct.Struct(">I")

Read = Callable[[int, int], bytes]  # (offset in the chunk, count) -> bytes


@dataclass(frozen=True)
class Layout:
    """What a chunked dataset's index must agree with."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    chunk_bytes: int
    filters: tuple[int, ...]  # in the order the writer applied them

    @classmethod
    def of(cls, ds: h5py.Dataset) -> Layout | None:
        """The layout of ``ds``, or None if it is not chunked (nothing to check)."""
        dcpl = ds.id.get_create_plist()
        if dcpl.get_layout() != h5py.h5d.CHUNKED:
            return None
        chunks = tuple(dcpl.get_chunk())
        filters = tuple(dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters()))
        odd = [f for f in filters if f not in CHECKED_FILTERS]
        if odd or (LZ4 in filters and DEFLATE in filters):
            raise UnsupportedContentError(
                ds.file.filename,
                f"dataset {_name(ds)!r} uses the HDF5 filter pipeline {filters}, whose chunks "
                "cannot be checked before decoding",
                "rewrite it with LZ4 (filter 32004) or without compression",
            )
        size = math.prod(chunks) * ds.id.get_type().get_size()
        return cls(tuple(ds.shape), chunks, size, filters)

    def active(self, mask: int) -> tuple[int, ...]:
        """The filters a chunk went through (bit i of its mask set: filter i was skipped)."""
        return tuple(f for i, f in enumerate(self.filters) if not mask & (1 << i))

    def grid(self, rows: tuple[int, int]) -> int:
        """How many chunks cover rows ``[start, stop)`` of the first axis and all of the rest."""
        if 0 in self.shape:
            return 0
        first = -(-rows[1] // self.chunks[0]) - rows[0] // self.chunks[0]
        rest = math.prod(-(-n // c) for n, c in zip(self.shape[1:], self.chunks[1:], strict=True))
        return max(0, first) * rest


def check_read(ds: h5py.Dataset, sl: tuple[slice, ...]) -> None:
    """Refuse (``CorruptCheckpointError``, naming the file, the tensor and the chunk) to read
    the selection ``sl`` (``()``: everything; else a slice of the first axis, as
    ``h5.io.iter_slabs`` makes them) of ``ds`` if a chunk it needs is damaged (module doc)."""
    layout = Layout.of(ds)
    if layout is None:
        return
    rows = _rows(sl, layout.shape)
    wanted: list[h5py.h5d.StoreInfo] = []

    def visit(info: h5py.h5d.StoreInfo) -> None:
        if rows[0] - layout.chunks[0] < info.chunk_offset[0] < rows[1]:  # chunked: ndim >= 1
            wanted.append(info)

    ds.id.chunk_iter(visit)
    problem = _index_problem(layout, rows, wanted, shared_starts(ds.file))
    if problem is not None:
        raise _damaged(ds, *problem)
    if not wanted:
        return
    if layout.filters == (LZ4,) and _userblock(ds) == 0:
        _check_lz4_in_file(ds, layout, wanted)
        return
    for info in wanted:
        mask, data = ds.id.read_direct_chunk(info.chunk_offset)
        problem_text = chunk_problem(layout, mask, data)
        if problem_text is not None:
            raise _damaged(ds, info.chunk_offset, problem_text)


def chunk_problem(layout: Layout, mask: int, data: bytes) -> str | None:
    """Why the stored bytes of one chunk do not decode to exactly ``layout.chunk_bytes``: its
    filters undone in reverse, the length checked at every stage."""
    active = layout.active(mask)
    stage = data
    for k in reversed(range(len(active))):
        want = layout.chunk_bytes + 4 * active[:k].count(FLETCHER32)  # what filter k was given
        if active[k] == FLETCHER32:
            if len(stage) < 4:
                return f"stores {len(stage)} bytes, too few for its fletcher32 checksum"
            stage = stage[:-4]
        elif active[k] == DEFLATE:
            out = _inflate(stage, want)
            if isinstance(out, str):
                return out
            stage = out
        elif active[k] == LZ4:
            # Only shuffle and fletcher32 can come before LZ4 (``Layout.of``): lengths known.
            return frame_problem(_reader(stage), len(stage), want)
        if len(stage) != want:
            return f"decodes to {len(stage):,} bytes where {want:,} belong"
    return None


def frame_problem(read: Read, stored: int, expected: int) -> str | None:
    """Why an LZ4 frame of ``stored`` bytes, read through ``read``, does not decode to exactly
    ``expected`` bytes: its lengths walked as ``H5Zlz4.c`` walks them (module docstring)."""
    if stored < _FRAME_HEAD.size + _BLOCK_HEAD.size:
        return f"stores {stored} bytes, too few for an LZ4 frame"
    original, block = _FRAME_HEAD.unpack(_exactly(read, 0, _FRAME_HEAD.size))
    if original != expected:
        return f"its LZ4 frame declares {original:,} bytes, the chunk holds {expected:,}"
    if block == 0:
        return "its LZ4 frame declares blocks of 0 bytes"
    block = min(block, original)
    at, done = _FRAME_HEAD.size, 0
    while done < original:
        size = min(block, original - done)
        if at + _BLOCK_HEAD.size > stored:
            return f"its LZ4 frame runs past the {stored:,} bytes the chunk index gives it"
        (packed,) = _BLOCK_HEAD.unpack(_exactly(read, at, _BLOCK_HEAD.size))
        if not 0 < packed <= size:
            return f"its LZ4 block at byte {at:,} declares {packed:,} stored bytes for {size:,}"
        at += _BLOCK_HEAD.size + packed
        done += size
    if at != stored:
        return f"its LZ4 frame ends at byte {at:,} but the chunk index gives it {stored:,} bytes"
    return None


def _reader(data: bytes) -> Read:
    view = memoryview(data)
    return lambda at, n: bytes(view[at : at + n])


def _exactly(read: Read, at: int, n: int) -> bytes:
    data = read(at, n)
    if len(data) != n:
        raise _ShortRead
    return data


class _ShortRead(Exception):
    """A frame field lies past the end of the file."""


def _check_lz4_in_file(ds: h5py.Dataset, layout: Layout, wanted: list[h5py.h5d.StoreInfo]) -> None:
    """The fast path: each LZ4 frame's length fields read where they lie in the file."""
    fd = os.open(ds.file.filename, os.O_RDONLY)
    try:
        for info in sorted(wanted, key=lambda i: i.byte_offset):
            if not layout.active(info.filter_mask):
                continue  # stored unfiltered: its size was checked with the index
            base = info.byte_offset
            try:
                problem = frame_problem(
                    lambda at, n, base=base: os.pread(fd, n, base + at),
                    info.size,
                    layout.chunk_bytes,
                )
            except _ShortRead:
                problem = "its LZ4 frame lies past the end of the file"
            if problem is not None:
                raise _damaged(ds, info.chunk_offset, problem)
    finally:
        os.close(fd)


def _index_problem(
    layout: Layout,
    rows: tuple[int, int],
    wanted: list[h5py.h5d.StoreInfo],
    shared: frozenset[int],
) -> tuple[tuple[int, ...], str] | None:
    """(chunk, why) the index entries cannot be the dataset's chunks: off the grid or outside
    the extent, listed twice, missing, or sharing stored bytes with other data (``shared``)."""
    seen: set[tuple[int, ...]] = set()
    for info in wanted:
        where = info.chunk_offset
        if not all(
            0 <= o < n and o % c == 0
            for o, n, c in zip(where, layout.shape, layout.chunks, strict=True)
        ):
            return where, f"lies off the chunk grid of shape {layout.shape}"
        if where in seen:
            return where, "is listed twice in the chunk index"
        seen.add(where)
        if not layout.active(info.filter_mask) and info.size != layout.chunk_bytes:
            return where, _raw_size(info.size, layout)
        if info.byte_offset in shared:
            return where, f"shares its stored bytes (at {info.byte_offset:,}) with other data"
    if len(seen) != layout.grid(rows):
        return _first_missing(layout, rows, seen), "is missing from the chunk index"
    return None


_SHARED: dict[tuple[int, ...], frozenset[int]] = {}
_SHARED_FILES = 8


def shared_starts(f: h5py.File) -> frozenset[int]:
    """Where stored data of ``f`` starts that overlaps other stored data: a chunk whose index
    entry was moved onto another chunk (of any dataset) decodes to that one's values, and two
    chunks of incompressible data store the same number of bytes. HDF5 never stores two
    pieces of data in one place. Computed with one walk of every chunk index per file (kept,
    by inode, size and mtime, for the next reads; normally the set is empty)."""
    st = os.stat(f.filename)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    found = _SHARED.get(key)
    if found is None:
        found = _overlapping(*_stored_extents(f))
        if len(_SHARED) >= _SHARED_FILES:
            _SHARED.pop(next(iter(_SHARED)))
        _SHARED[key] = found
    return found


def _stored_extents(f: h5py.File) -> tuple[np.ndarray, np.ndarray]:
    """The (starts, ends) of every piece of stored data in ``f``: chunks and contiguous
    blocks, each stored object once (a tied tensor is one object under several names)."""
    starts, ends = array("q"), array("q")
    objects: set[int] = set()

    def chunk(info: h5py.h5d.StoreInfo) -> None:
        starts.append(info.byte_offset)
        ends.append(info.byte_offset + info.size)

    def visit(name: bytes, info: h5py.h5l.LinkInfo) -> None:
        if info.type != h5py.h5l.TYPE_HARD or info.u in objects:
            return
        objects.add(info.u)
        obj = h5py.h5o.open(f.id, name)
        if not isinstance(obj, h5py.h5d.DatasetID):
            return
        layout = obj.get_create_plist().get_layout()
        if layout == h5py.h5d.CHUNKED:
            obj.chunk_iter(chunk)
        elif layout == h5py.h5d.CONTIGUOUS and obj.get_offset() is not None:
            starts.append(obj.get_offset())
            ends.append(obj.get_offset() + obj.get_storage_size())

    f.id.links.visit(visit, info=True)
    return np.frombuffer(starts, np.int64), np.frombuffer(ends, np.int64)


def _overlapping(starts: np.ndarray, ends: np.ndarray) -> frozenset[int]:
    """The starts of the extents that overlap another (empty extents never do)."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if len(starts) < 2:
        return frozenset()
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)[:-1]  # the furthest end of everything before
    late = starts[1:] < reach  # starts inside an earlier extent
    early = ends[:-1] > starts[1:]  # runs into the next
    bad = np.concatenate([starts[1:][late], starts[:-1][early]])
    return frozenset(int(x) for x in bad)


def _first_missing(
    layout: Layout, rows: tuple[int, int], seen: set[tuple[int, ...]]
) -> tuple[int, ...]:
    first = range(rows[0] - rows[0] % layout.chunks[0], rows[1], layout.chunks[0])
    rest = (range(0, n, c) for n, c in zip(layout.shape[1:], layout.chunks[1:], strict=True))
    return next((g for g in itertools.product(first, *rest) if g not in seen), ())


def _raw_size(size: int, layout: Layout) -> str:
    return f"stores {size:,} unfiltered bytes, the chunk holds {layout.chunk_bytes:,}"


def _inflate(data: bytes, chunk_bytes: int) -> bytes | str:
    """``data`` inflated, if it is one complete zlib stream of at most ``chunk_bytes``."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, chunk_bytes + 1)
    except zlib.error as exc:
        return f"its deflate stream is damaged ({exc})"
    if not inflater.eof or inflater.unused_data or len(out) > chunk_bytes:
        return "its deflate stream does not end where the chunk does"
    return out


def _rows(sl: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[int, int]:
    if not sl:
        return (0, shape[0])
    start, stop, _ = sl[0].indices(shape[0])
    return (start, max(start, stop))


def _userblock(ds: h5py.Dataset) -> int:
    return ds.file.id.get_create_plist().get_userblock()


def _name(ds: h5py.Dataset) -> str:
    return (ds.name or "").lstrip("/")


def _damaged(ds: h5py.Dataset, chunk: tuple[int, ...], problem: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        ds.file.filename, f"tensor {_name(ds)!r}, chunk {tuple(chunk)}: {problem}", _FIX
    )
