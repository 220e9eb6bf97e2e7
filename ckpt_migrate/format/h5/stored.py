"""Two datasets stored alike: the same bytes at other offsets (issue #33).

A dataset whose type, shape, layout and filter pipeline are another's, whose chunk index lists
the same chunks (coordinates, filter masks and stored sizes) and covers the whole grid, and whose
stored bytes are the other's chunk for chunk, decodes to the same values: HDF5 decodes a chunk
from its stored bytes, its filter mask and the dataset's pipeline alone, and a complete index
leaves nothing to the fill value. So an upgrade that copied a tensor's chunks as stored
(``h5.tensor``) proves it by comparing those bytes, without decoding either file; at 256-byte
tensors decoding and hashing both took about 0.9 ms a tensor, most of an upgrade's time.

``copied_pieces`` says where the bytes to compare lie; the caller reads and compares them.
"""

from __future__ import annotations

import math
from typing import Any

import h5py
from h5py import h5d

Index = list[tuple[tuple[int, ...], int, int, int]]  # (chunk offset, filter mask, address, size)


def copied_pieces(out: h5d.DatasetID, src: h5d.DatasetID) -> list[tuple[int, int, int]] | None:
    """``(offset in out's file, offset in src's file, size)`` of every piece of stored data,
    in chunk order, if ``out`` is stored as ``src`` is (module doc): then the two decode alike
    exactly when those bytes are equal. None if it is not (a tensor written by decoding its
    source, to another chunk shape or type, or an index with gaps): compare the decoded values
    instead."""
    if out.shape != src.shape or out.get_type() != src.get_type():
        return None
    a, b = out.get_create_plist(), src.get_create_plist()
    layout = a.get_layout()
    if layout != b.get_layout() or _pipeline(a) != _pipeline(b):
        return None
    if layout == h5d.CONTIGUOUS:
        return _contiguous(out, src)
    if layout != h5d.CHUNKED or a.get_chunk() != b.get_chunk() or 0 in out.shape:
        return None
    chunks = a.get_chunk()
    mine, theirs = _index(out), _index(src)
    if not _complete(mine, out.shape, chunks):
        return None
    if [(c, m, n) for c, m, _, n in mine] != [(c, m, n) for c, m, _, n in theirs]:
        return None
    return [(x[2], y[2], x[3]) for x, y in zip(mine, theirs, strict=True)]


def _contiguous(out: h5d.DatasetID, src: h5d.DatasetID) -> list[tuple[int, int, int]] | None:
    """The one piece of two contiguous datasets, if both have their whole data stored."""
    size = math.prod(out.shape) * out.get_type().get_size()
    at, there = out.get_offset(), src.get_offset()
    if at is None or there is None or size == 0:
        return None
    if out.get_storage_size() != size or src.get_storage_size() != size:
        return None
    return [(at, there, size)]


def _pipeline(dcpl: h5py.h5p.PropDCID) -> list[tuple[Any, ...]]:
    """The filters as comparable data: (id, flags, client data) each, in order."""
    return [dcpl.get_filter(i)[:3] for i in range(dcpl.get_nfilters())]


def _index(dsid: h5d.DatasetID) -> Index:
    index: Index = []
    dsid.chunk_iter(lambda c: index.append((c.chunk_offset, c.filter_mask, c.byte_offset, c.size)))
    index.sort()
    return index


def _complete(index: Index, shape: tuple[int, ...], chunks: tuple[int, ...]) -> bool:
    """Whether ``index`` lists every chunk of the grid once (then none reads as fill)."""
    if len(index) != math.prod(-(-n // c) for n, c in zip(shape, chunks, strict=True)):
        return False
    if len({where for where, _, _, _ in index}) != len(index):
        return False
    return all(
        x % c == 0 and x < n
        for where, _, _, _ in index
        for x, c, n in zip(where, chunks, shape, strict=True)
    )
