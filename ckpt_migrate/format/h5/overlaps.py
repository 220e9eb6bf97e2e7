"""Stored data that overlaps other stored data, or the metadata, of the same file (issue #36).

HDF5 never stores two pieces of data in one place, but a chunk index entry whose address was
moved onto another chunk reads that chunk's bytes; since random weights do not compress, the
two chunks often store the same number of bytes and pass every check of the chunk alone (its
frame is whole, its size right), and the tensor decodes to the other one's values. A contiguous
dataset's address moved into metadata reads that metadata's bytes (``h5.metadata``). One walk of
every chunk index and object header of the file finds such overlaps; ``h5.chunks`` refuses data
that starts at one of them.
"""

from __future__ import annotations

import os
from array import array

import h5py
import numpy as np

from ckpt_migrate.format.h5.metadata import metadata_extents

_SHARED: dict[tuple[int, ...], np.ndarray] = {}
_SHARED_FILES = 8
_LAST = (1 << 64) - 1


def shared_starts(f: h5py.File | h5py.h5o.ObjectID) -> np.ndarray:
    """Where stored data of ``f`` starts that overlaps other stored data: a chunk whose index
    entry was moved onto another chunk (of any dataset) decodes to that one's values, and two
    chunks of incompressible data store the same number of bytes. HDF5 never stores two
    pieces of data in one place. Computed with one walk of every chunk index per file (kept,
    by inode, size and mtime, for the next reads; normally empty). Sorted, unsigned. ``f``:
    the file, or any object in it."""
    path = f.filename if isinstance(f, h5py.File) else os.fsdecode(h5py.h5f.get_name(f))
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    found = _SHARED.get(key)
    if found is None:
        if not isinstance(f, h5py.File):
            f = h5py.File(h5py.h5i.get_file_id(f))
        found = _overlapping(*_stored_extents(f))
        if len(_SHARED) >= _SHARED_FILES:
            _SHARED.pop(next(iter(_SHARED)))
        _SHARED[key] = found
    return found


def _stored_extents(f: h5py.File) -> tuple[np.ndarray, np.ndarray]:
    """The (starts, ends) of every piece of stored data in ``f`` (chunks and contiguous
    blocks, each stored object once: a tied tensor is one object under several names) and of
    the metadata ``h5.metadata`` maps."""
    starts, ends = array("Q"), array("Q")
    objects: set[int] = {h5py.h5o.get_info(f.id).addr}

    def chunk(info: h5py.h5d.StoreInfo) -> None:
        starts.append(info.byte_offset)
        ends.append(min(info.byte_offset + info.size, _LAST))  # a damaged address may be huge

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
            ends.append(min(obj.get_offset() + obj.get_storage_size(), _LAST))

    f.id.links.visit(visit, info=True)
    for start, end in metadata_extents(f, objects):
        starts.append(start)
        ends.append(min(end, _LAST))
    return np.frombuffer(starts, np.uint64), np.frombuffer(ends, np.uint64)


def _overlapping(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The starts of the extents that overlap another (empty extents never do)."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if len(starts) < 2:
        return np.empty(0, np.uint64)
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)[:-1]  # the furthest end of everything before
    late = starts[1:] < reach  # starts inside an earlier extent
    early = ends[:-1] > starts[1:]  # runs into the next
    bad = np.concatenate([starts[1:][late], starts[:-1][early]])
    return np.unique(bad)
