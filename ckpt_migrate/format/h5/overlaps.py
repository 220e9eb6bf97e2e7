"""Stored data that overlaps other stored data, or the metadata, of the same file (issue #36).

HDF5 never stores two pieces of data in one place, but a chunk index entry whose address was
moved onto another chunk reads that chunk's bytes; since random weights do not compress, the
two chunks often store the same number of bytes and pass every check of the chunk alone (its
frame is whole, its size right), and the tensor decodes to the other one's values. A contiguous
dataset's address moved into metadata reads that metadata's bytes (``h5.metadata``). One walk of
every chunk index and object header of the file finds such overlaps; ``h5.chunks`` refuses data
that starts at one of them. A reader whose file ``preflight``'s children walked takes the
stored pieces from them (``remember``): they walk every chunk index anyway, and this process
then maps only the metadata, when it first asks (about 1.1-1.4 s less of a 12k-15k tensor
rewrite or export, issue 33).
"""

from __future__ import annotations

import contextlib
from array import array

import h5py
import numpy as np

from ckpt_migrate.format.h5.identity import hdf5_identity
from ckpt_migrate.format.h5.metadata import (
    metadata_extents,
    sorted_once,
    unreferenced_collections,
)
from ckpt_migrate.format.progress import Progress

_SHARED: dict[tuple[int, ...], np.ndarray | _Walked] = {}
_SHARED_FILES = 8
_LAST = (1 << 64) - 1


def shared_starts(f: h5py.File | h5py.h5o.ObjectID, progress: Progress | None = None) -> np.ndarray:
    """Where stored data of ``f`` starts that overlaps other stored data: a chunk whose index
    entry was moved onto another chunk (of any dataset) decodes to that one's values, and two
    chunks of incompressible data store the same number of bytes. HDF5 never stores two
    pieces of data in one place. Computed with one walk of every chunk index per file (kept,
    by inode, size and mtime, for the next reads; normally empty). Sorted, unsigned. ``f``:
    the file, or any object in it; ``progress`` hears of a walk's objects mapped."""
    key = hdf5_identity(f.id if isinstance(f, h5py.File) else f)
    found = _SHARED.get(key)
    if isinstance(found, np.ndarray):
        return found
    if not isinstance(f, h5py.File):
        f = h5py.File(h5py.h5i.get_file_id(f))
    found = _overlapping(*_stored_extents(f)) if found is None else found.overlapping(f, progress)
    _keep(key, found)
    return found


def remember(key: tuple[int, ...], data: Extents, objects: array) -> None:
    """Keep what a walk made elsewhere found of the file whose ``file_identity`` is ``key``
    (``preflight``'s children walk every chunk index anyway, each over its share of the
    objects): ``data``, the stored pieces of every object, each object once, and ``objects``,
    the addresses of the root and of every object linked, each once, whose metadata
    ``shared_starts`` maps when first asked (an array: a set of them was 21 MB at 150k)."""
    _keep(key, _Walked(data, objects))


class _Walked:
    """A walk's stored pieces and objects (``remember``), waiting for the metadata's map."""

    def __init__(self, data: Extents, objects: array) -> None:
        self.data, self.objects = data, objects

    def overlapping(self, f: h5py.File, progress: Progress | None = None) -> np.ndarray:
        """(The walk's own extents are copied, not sorted where they are: two threads may ask
        at once.)"""
        starts, ends = metadata_extents(f, self.objects, progress)
        starts.extend(self.data.starts)
        ends.extend(self.data.ends)
        _with_collections(f, starts, ends)
        return _overlapping(np.frombuffer(starts, np.uint64), np.frombuffer(ends, np.uint64))


def _keep(key: tuple[int, ...], found: np.ndarray | _Walked) -> None:
    if len(_SHARED) >= _SHARED_FILES:
        # (the oldest out; another thread's eviction or entry meanwhile is as good)
        with contextlib.suppress(StopIteration, KeyError, RuntimeError):
            _SHARED.pop(next(iter(_SHARED)))
    _SHARED[key] = found


class Extents:
    """(start, end) pairs of stored pieces, as a walk meets them (an end past 2**64 - 1, which
    a damaged address can make, is cut there)."""

    def __init__(self) -> None:
        self.starts, self.ends = array("Q"), array("Q")

    def add(self, start: int, end: int) -> None:
        self.starts.append(start)
        self.ends.append(min(end, _LAST))

    def extend(self, starts: array, ends: array) -> None:
        """Add the extents of ``starts`` and ``ends`` (each end at most 2**64 - 1)."""
        self.starts.extend(starts)
        self.ends.extend(ends)

    def chunk(self, info: h5py.h5d.StoreInfo) -> None:
        """A ``chunk_iter`` callback."""
        self.add(info.byte_offset, info.byte_offset + info.size)

    def starts_array(self) -> np.ndarray:
        return np.frombuffer(self.starts, np.uint64)

    def ends_array(self) -> np.ndarray:
        return np.frombuffer(self.ends, np.uint64)

    def to_bytes(self) -> bytes:
        return len(self.starts).to_bytes(8, "little") + self.starts.tobytes() + self.ends.tobytes()

    def extend_from_bytes(self, raw: bytes, at: int = 0) -> int:
        """Add the extents ``to_bytes`` wrote at ``at`` of ``raw``; where they end. ValueError
        if ``raw`` is too short for them."""
        n = int.from_bytes(raw[at : at + 8], "little")
        end = at + 8 + 16 * n
        if len(raw) < end:
            raise ValueError("extents cut short")
        self.starts.frombytes(raw[at + 8 : at + 8 + 8 * n])
        self.ends.frombytes(raw[at + 8 + 8 * n : end])
        return end


def _stored_extents(f: h5py.File) -> tuple[np.ndarray, np.ndarray]:
    """The (starts, ends) of every piece of stored data in ``f`` (chunks and contiguous
    blocks, each stored object once: a tied tensor is one object under several names) and of
    the metadata ``h5.metadata`` maps."""
    found = Extents()
    objects: set[int] = {h5py.h5o.get_info(f.id).addr}

    def visit(name: bytes, info: h5py.h5l.LinkInfo) -> None:
        if info.type != h5py.h5l.TYPE_HARD or info.u in objects:
            return
        objects.add(info.u)
        obj = h5py.h5o.open(f.id, name)
        if not isinstance(obj, h5py.h5d.DatasetID):
            return
        layout = obj.get_create_plist().get_layout()
        if layout == h5py.h5d.CHUNKED:
            obj.chunk_iter(found.chunk)
        elif layout == h5py.h5d.CONTIGUOUS and obj.get_offset() is not None:
            found.add(obj.get_offset(), obj.get_offset() + obj.get_storage_size())

    f.id.links.visit(visit, info=True)
    found.extend(*metadata_extents(f, objects))
    _with_collections(f, found.starts, found.ends)
    return found.starts_array(), found.ends_array()


def _with_collections(f: h5py.File, starts: array, ends: array) -> None:
    """Add to the extents the global heap collections none of them names
    (``metadata.unreferenced_collections``): data starting inside one is refused too."""
    # (views of the arrays' buffers, let go of before the arrays grow)
    low, high = np.frombuffer(starts, np.uint64), np.frombuffer(ends, np.uint64)
    more = unreferenced_collections(f, low, high)
    del low, high
    starts.extend(more[0])
    ends.extend(more[1])


def _overlapping(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The starts of the extents that overlap another (empty extents never do). The arrays
    are the caller's to give: they are sorted where they are (sorted copies, and the copies
    they were made from, were 26 MiB of ``verify``'s peak at 150k tensors, issue 33)."""
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    del keep
    if len(starts) < 2:
        return np.empty(0, np.uint64)
    order = np.argsort(starts, kind="stable")
    ends[:] = ends[order]
    starts.sort(kind="stable")
    del order
    early = ends[:-1] > starts[1:]  # runs into the next
    reach = np.maximum.accumulate(ends, out=ends)[:-1]  # the furthest end of all before
    late = starts[1:] < reach  # starts inside an earlier extent
    bad = np.concatenate([starts[1:][late], starts[:-1][early]])
    return sorted_once(bad)
