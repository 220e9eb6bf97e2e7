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
  extent, and shares no stored byte with other stored data or the metadata of the file
  (``h5.overlaps``); so does a contiguous dataset's data;
* a chunk with no filter applied stores exactly one chunk of bytes;
* LZ4 frame (big-endian): an 8-byte original size, a 4-byte block size, then per block a 4-byte
  compressed size and the block (stored raw when that size equals the block's). The original
  size must be the chunk's bytes, every block size positive and at most its block, and the
  blocks must end exactly at the stored size. ``LZ4_decompress_fast`` then writes every byte of
  every block or fails, so the decoded chunk is all filter output;
* deflate (zlib, which checks its own stream) must inflate to exactly the bytes the next filter
  takes; fletcher32 (HDF5 checks the sum) needs its 4 bytes; shuffle keeps the length.

An LZ4-only dataset (what every Cerebras release writes, FORMAT.md §4.5) costs one 16-byte
``pread`` per chunk (and per further block), the headers checked together: nothing is decoded
twice. Other pipelines are read as stored
(``read_direct_chunk``) and their deflate stage inflated once more, bounded by the chunk size.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import struct
from array import array
from dataclasses import dataclass

import h5py
import numpy as np
from h5py import h5d

from ckpt_migrate.errors import CorruptCheckpointError, UnsupportedContentError
from ckpt_migrate.format import budgets
from ckpt_migrate.format.h5 import capi, overlaps
from ckpt_migrate.format.h5.chunkframes import (
    DEFLATE,
    FLETCHER32,
    HEAD,
    LZ4,
    PAST_END,
    SHUFFLE,
    chunk_problem,
    frame_at,
    too_short,
)
from ckpt_migrate.format.h5.identity import hdf5_file, hdf5_identity

CHECKED_FILTERS = frozenset({DEFLATE, SHUFFLE, FLETCHER32, LZ4})
_FIX = "the file is damaged; use another copy"
_UNCHECKABLE = "whose chunks cannot be checked before decoding"
_REWRITE = "rewrite it with LZ4 (filter 32004) or without compression"
_FIRST_BLOCK = struct.Struct(">QII")  # (the original size, the block size, the first's stored)
# Index entries from which the checks run on numpy arrays: below, plain Python is faster.
FEW = 8

Chunks = list[tuple[int, ...]]  # chunk coordinates
Problem = tuple[tuple[int, ...], str] | None  # (the chunk, why it is refused)


@dataclass(frozen=True)
class Layout:
    """What a chunked dataset's index must agree with."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    chunk_bytes: int
    filters: tuple[int, ...]  # in the order the writer applied them

    @classmethod
    def of(cls, ds: h5py.Dataset | h5d.DatasetID) -> Layout | None:
        """The layout of ``ds``, or None if it is not chunked (nothing to check)."""
        dsid = ds if isinstance(ds, h5d.DatasetID) else ds.id
        dcpl = dsid.get_create_plist()
        if dcpl.get_layout() != h5d.CHUNKED:
            return None
        chunks = tuple(dcpl.get_chunk())
        filters = tuple(dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters()))
        size = math.prod(chunks) * dsid.get_type().get_size()
        layout = cls(tuple(dsid.shape), chunks, size, filters)
        problem = layout.problem()
        if problem is not None:
            why, fix = problem
            raise UnsupportedContentError(
                filename(dsid), f"dataset {dataset_name(dsid)!r} {why}", fix
            )
        return layout

    def problem(self) -> tuple[str, str] | None:
        """(why, the fix) where the chunks cannot be checked before they are decoded: a grid
        over budget, or a pipeline this module does not check."""
        filters = self.filters
        if set(filters) - CHECKED_FILTERS or sum(f in (LZ4, DEFLATE) for f in filters) > 1:
            return f"uses the HDF5 filter pipeline {filters}, {_UNCHECKABLE}", _REWRITE
        why = budgets.chunk_grid_problem(self.shape, self.chunks, self.chunk_bytes)
        return None if why is None else (why, budgets.CHUNK_FIX)

    @property
    def strides(self) -> np.ndarray:
        """How far apart neighbours along each axis are when the grid is numbered row-major."""
        counts = [-(-n // c) for n, c in zip(self.shape, self.chunks, strict=True)]
        return np.array([math.prod(counts[k + 1 :]) for k in range(len(counts))], np.uint64)

    @property
    def all_skipped(self) -> int:
        """The filter mask of a chunk stored unfiltered (every filter skipped)."""
        return (1 << len(self.filters)) - 1

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


def check_read(dsid: h5d.DatasetID, sl: tuple[slice, ...]) -> None:
    """Refuse (``CorruptCheckpointError``, naming the file, the tensor and the chunk) to read
    the selection ``sl`` (``()``: everything; else a slice of the first axis, as
    ``h5.io.iter_slabs`` makes them) of the dataset ``dsid`` if a chunk it needs is damaged
    (module doc)."""
    layout = Layout.of(dsid)
    if layout is None:
        _check_contiguous(dsid)
        return
    check_chunks(dsid, layout, sl)


def check_chunks(dsid: h5d.DatasetID, layout: Layout, sl: tuple[slice, ...] = ()) -> Chunks:
    """``check_read`` of a chunked dataset whose ``layout`` the caller has; the coordinates
    of the chunks checked, in the order of the chunk index."""
    path = filename(dsid)
    rows = _rows(sl, layout.shape)
    index = Index.of(dsid, layout, rows)
    problem = index_problem(layout, rows, index, overlaps.shared_starts(dsid))
    if problem is None and len(index):
        if layout.filters == (LZ4,) and _userblock(dsid) == 0:
            with hdf5_file(dsid) as fd:  # (the bytes HDF5 decodes, whatever the name is now)
                problem = frames_problem(fd, layout, index)
        else:
            problem = _stored_chunks(dsid, layout, index)
    if problem is not None:
        (where, why), fix = problem, budgets.UNSTORED_FIX if problem[1] is _MISSING else _FIX
        raise CorruptCheckpointError(
            path, f"tensor {dataset_name(dsid)!r}, chunk {where}: {why}", fix
        )
    return [index.where(i) for i in range(len(index))]


def index_problem(
    layout: Layout, rows: tuple[int, int], index: Index, shared: np.ndarray
) -> Problem:
    """(chunk, why) the index entries of rows ``[start, stop)`` cannot be the dataset's
    chunks (``_index_problem``); ``shared``: the starts of the file's overlapping data."""
    few = len(index) <= FEW
    return (_few_index_problem if few else _index_problem)(layout, rows, index, shared)


def frames_problem(fd: int, layout: Layout, index: Index) -> Problem:
    """(chunk, why) a chunk of an LZ4-only dataset, read where the index says in the open
    file ``fd`` (no userblock), is not one whole LZ4 frame of one chunk (``_frames_in_file``)."""
    few = len(index) <= FEW
    return (_few_frames_in_file if few else _frames_in_file)(fd, layout, index)


def filename(oid: h5py.h5o.ObjectID) -> str:
    """The name of the file ``oid`` lies in (without the ``File`` object ``Dataset.file``
    makes, about 25 µs)."""
    return os.fsdecode(h5py.h5f.get_name(oid))


_USERBLOCKS: dict[tuple[int, ...], int] = {}


def _userblock(oid: h5py.h5o.ObjectID) -> int:
    """The userblock size of the file ``oid`` lies in, asked of HDF5 once per file (40 µs a
    time), kept by the file's identity as ``overlaps`` keeps its findings."""
    key = hdf5_identity(oid)
    found = _USERBLOCKS.get(key)
    if found is None:
        found = h5py.h5i.get_file_id(oid).get_create_plist().get_userblock()
        if len(_USERBLOCKS) >= 8:  # (as ``overlaps._keep``: threads may evict alike)
            with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                _USERBLOCKS.pop(next(iter(_USERBLOCKS)))
        _USERBLOCKS[key] = found
    return found


def _check_contiguous(dsid: h5d.DatasetID) -> None:
    """A contiguous dataset's data must not start inside other data or the file's metadata
    (its address is eight unchecksummed bytes of its object header)."""
    if dsid.get_create_plist().get_layout() != h5d.CONTIGUOUS:
        return
    at = dsid.get_offset()
    if at is not None and np.isin(np.uint64(at), overlaps.shared_starts(dsid)):
        raise CorruptCheckpointError(
            filename(dsid),
            f"tensor {dataset_name(dsid)!r}: its data at byte {at} lies inside other data or the "
            "file's metadata",
            _FIX,
        )


@dataclass
class Index:
    """The chunk index entries a selection needs (a tensor may have 100,000), as HDF5 lists
    them (``flat``: the coordinates, ``ndim`` a chunk), and as numpy arrays (``arrays``)."""

    ndim: int
    flat: array  # the chunks' offsets in elements, one after the other
    offsets: array  # where each is stored, in bytes
    sizes: array
    masks: array  # bit i set: filter i was skipped for the chunk

    @classmethod
    def of(cls, dsid: h5d.DatasetID, layout: Layout, rows: tuple[int, int]) -> Index:
        coords, offsets, sizes, masks = array("Q"), array("Q"), array("Q"), array("Q")
        low = rows[0] - layout.chunks[0]

        def visit(info: h5py.h5d.StoreInfo) -> None:
            where = info.chunk_offset
            if low < where[0] < rows[1]:  # chunked, so ndim >= 1
                coords.extend(where)
                offsets.append(info.byte_offset)
                sizes.append(info.size)
                masks.append(info.filter_mask)

        dsid.chunk_iter(visit)
        return cls(len(layout.shape), coords, offsets, sizes, masks)

    def __len__(self) -> int:
        return len(self.offsets)

    def where(self, i: int) -> tuple[int, ...]:
        return tuple(self.flat[i * self.ndim : (i + 1) * self.ndim])

    @functools.cached_property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(coordinates of shape ``(n, ndim)``, offsets, sizes, masks)."""
        found = [np.frombuffer(a, np.uint64) for a in (self.flat, self.offsets, self.sizes)]
        found[0] = found[0].reshape(len(self), self.ndim)
        return found[0], found[1], found[2], np.frombuffer(self.masks, np.uint64)


def _index_problem(
    layout: Layout, rows: tuple[int, int], index: Index, shared: np.ndarray
) -> Problem:
    """(chunk, why) the index entries cannot be the dataset's chunks: off the grid or outside
    the extent, listed twice, missing, unfiltered but not one chunk long, or sharing stored
    bytes with other data (``shared``)."""
    coords, offsets, sizes, masks = index.arrays
    shape = np.array(layout.shape, np.uint64)
    chunks = np.array(layout.chunks, np.uint64)
    off = ~((coords % chunks == 0) & (coords < shape)).all(axis=1)
    if off.any():
        return index.where(_first(off)), f"lies off the chunk grid of shape {layout.shape}"
    places = np.sort((coords // chunks) @ layout.strides)  # each chunk's place, a number
    if (places[1:] == places[:-1]).any():
        return _listed_twice(index), _TWICE
    if len(places) != layout.grid(rows):
        seen = {index.where(i) for i in range(len(index))}
        return _first_missing(layout, rows, seen), _MISSING
    unfiltered = (masks & layout.all_skipped) == layout.all_skipped
    wrong = unfiltered & (sizes != layout.chunk_bytes)
    if wrong.any():
        i = _first(wrong)
        return index.where(i), _raw_size(int(sizes[i]), layout)
    return _moved(index, offsets, shared)


def _few_index_problem(
    layout: Layout, rows: tuple[int, int], index: Index, shared: np.ndarray
) -> Problem:
    """``_index_problem`` of at most :data:`FEW` entries, in plain Python: the same verdicts,
    in the same order. Most tensors of a checkpoint are one chunk, and numpy's fixed cost per
    call was most of checking one (issue 33)."""
    wheres = [index.where(i) for i in range(len(index))]
    for where in wheres:
        if any(x % c or x >= n for x, c, n in zip(where, layout.chunks, layout.shape)):
            return where, f"lies off the chunk grid of shape {layout.shape}"
    if len(set(wheres)) != len(wheres):
        return _listed_twice(index), _TWICE
    if len(wheres) != layout.grid(rows):
        return _first_missing(layout, rows, set(wheres)), _MISSING
    skipped = layout.all_skipped
    for where, mask, size in zip(wheres, index.masks, index.sizes):
        if mask & skipped == skipped and size != layout.chunk_bytes:
            return where, _raw_size(size, layout)
    return _moved(index, np.frombuffer(index.offsets, np.uint64), shared) if shared.size else None


def _moved(index: Index, offsets: np.ndarray, shared: np.ndarray) -> Problem:
    """The first entry whose stored bytes start where other data's overlap (``shared``)."""
    moved = np.isin(offsets, shared) if shared.size else None
    if moved is not None and moved.any():
        i = _first(moved)
        at = int(offsets[i])
        return index.where(i), f"shares its stored bytes (at {at:,}) with other data"
    return None


_TWICE = "is listed twice in the chunk index"
_MISSING = "is not stored (HDF5 reads the fill value): a writer skipped it or its index is damaged"


def _frames_in_file(fd: int, layout: Layout, index: Index) -> Problem:
    """The LZ4-only fast path: the first 16 bytes of every chunk (its frame header and first
    block size) read where they lie, checked together; a frame of several blocks (a writer
    with a block size below the chunk's) is walked block by block."""
    _, offsets, all_sizes, masks = index.arrays
    lz4 = np.flatnonzero((masks & 1) == 0)  # the others were checked as unfiltered
    short = all_sizes[lz4] < HEAD
    if short.any():
        i = int(lz4[_first(short)])
        return index.where(i), too_short(int(all_sizes[i]))
    heads = [os.pread(fd, HEAD, int(offsets[i])) for i in lz4]
    ragged = [k for k, head in enumerate(heads) if len(head) != HEAD]
    if ragged:
        return index.where(int(lz4[ragged[0]])), PAST_END
    head = np.frombuffer(b"".join(heads), np.uint8).reshape(len(lz4), HEAD)
    original = head[:, :8].copy().view(">u8").ravel()
    block = head[:, 8:12].copy().view(">u4").ravel().astype(np.uint64)
    packed = head[:, 12:16].copy().view(">u4").ravel().astype(np.uint64)
    sizes = all_sizes[lz4]
    one_block = block >= original
    fine = (original == layout.chunk_bytes) & (block > 0) & one_block
    fine &= (packed > 0) & (packed <= original) & (sizes == packed + HEAD)
    for k in np.flatnonzero(~fine):
        i = int(lz4[k])
        why = frame_at(fd, int(offsets[i]), int(all_sizes[i]), layout.chunk_bytes)
        if why is not None:
            return index.where(i), why
    return None


def _few_frames_in_file(fd: int, layout: Layout, index: Index) -> Problem:
    """``_frames_in_file`` of at most :data:`FEW` entries, in plain Python (as above)."""
    lz4 = [i for i, mask in enumerate(index.masks) if not mask & 1]
    for i in lz4:
        if index.sizes[i] < HEAD:
            return index.where(i), too_short(index.sizes[i])
    heads = [os.pread(fd, HEAD, index.offsets[i]) for i in lz4]
    for i, head in zip(lz4, heads):
        if len(head) != HEAD:
            return index.where(i), PAST_END
    for i, head in zip(lz4, heads):
        original, block, packed = _FIRST_BLOCK.unpack(head)
        size = index.sizes[i]
        whole = original == layout.chunk_bytes and block >= original and block > 0
        if whole and 0 < packed <= original and size == packed + HEAD:
            continue
        why = frame_at(fd, index.offsets[i], size, layout.chunk_bytes)
        if why is not None:
            return index.where(i), why
    return None


def _stored_chunks(dsid: h5d.DatasetID, layout: Layout, index: Index) -> Problem:
    """Any other pipeline: each chunk read as stored and its filters undone far enough to know
    the length it decodes to (``chunk_problem``)."""
    for i in range(len(index)):
        where = index.where(i)
        with capi.LOCK:
            mask, data = dsid.read_direct_chunk(where)
        why = chunk_problem(layout.active(mask), layout.chunk_bytes, data)
        if why is not None:
            return where, why
    return None


def _listed_twice(index: Index) -> tuple[int, ...]:
    seen: set[tuple[int, ...]] = set()
    for i in range(len(index)):
        where = index.where(i)
        if where in seen:
            return where
        seen.add(where)
    return ()


def _first(flags: np.ndarray) -> int:
    return int(np.flatnonzero(flags)[0])


def _first_missing(
    layout: Layout, rows: tuple[int, int], seen: set[tuple[int, ...]]
) -> tuple[int, ...]:
    first = range(rows[0] - rows[0] % layout.chunks[0], rows[1], layout.chunks[0])
    rest = (range(0, n, c) for n, c in zip(layout.shape[1:], layout.chunks[1:], strict=True))
    return next((g for g in itertools.product(first, *rest) if g not in seen), ())


def _raw_size(size: int, layout: Layout) -> str:
    return f"stores {size:,} unfiltered bytes, the chunk holds {layout.chunk_bytes:,}"


def _rows(sl: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[int, int]:
    if not sl:
        return (0, shape[0])
    start, stop, _ = sl[0].indices(shape[0])
    return (start, max(start, stop))


def dataset_name(dsid: h5d.DatasetID) -> str:
    """Its path in its file, without the leading ``/``."""
    name = h5py.h5i.get_name(dsid)
    return os.fsdecode(name or b"").lstrip("/")
