"""Two datasets stored alike: the same bytes at other offsets (issue #33).

A dataset whose type, shape, layout and filter pipeline are another's, whose chunk index lists
the same chunks (coordinates, filter masks and stored sizes) and covers the whole grid, and whose
stored bytes are the other's chunk for chunk, decodes to the same values: HDF5 decodes a chunk
from its stored bytes, its filter mask and the dataset's pipeline alone, and a complete index
leaves nothing to the fill value. So an upgrade that copied a tensor's chunks as stored
(``h5.tensor``) proves it by comparing those bytes, without decoding either file; at 256-byte
tensors decoding and hashing both took about 0.9 ms a tensor, most of an upgrade's time.

``copied_pieces`` says where the bytes to compare lie; the caller reads and compares them, or
``SameBytes`` does (``verify``'s comparison of two checkpoints).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import h5py
from h5py import h5d

from ckpt_migrate.errors import CkptIOError

Index = list[tuple[tuple[int, ...], int, int, int]]  # (chunk offset, filter mask, address, size)
Pieces = list[tuple[int, int, int]]  # (offset in one file, offset in the other, size)


def copied_pieces(out: h5d.DatasetID, src: h5d.DatasetID) -> Pieces | None:
    """``(offset in out's file, offset in src's file, size)`` of every piece of stored data,
    in chunk order, if ``out`` is stored as ``src`` is (module doc): then the two decode alike
    exactly when those bytes are equal. None if it is not (a tensor written by decoding its
    source, to another chunk shape or type, or an index with gaps): compare the decoded values
    instead."""
    shape, kind = out.shape, out.get_type()  # (each an HDF5 round trip: asked once)
    if shape != src.shape or kind != src.get_type():
        return None
    a, b = out.get_create_plist(), src.get_create_plist()
    layout = a.get_layout()
    if layout != b.get_layout() or pipeline(a) != pipeline(b):
        return None
    if layout == h5d.CONTIGUOUS:
        return _contiguous(out, src, math.prod(shape) * kind.get_size())
    chunks = a.get_chunk() if layout == h5d.CHUNKED else None
    if chunks is None or chunks != b.get_chunk() or 0 in shape:
        return None
    return chunk_pieces(_index(out), _index(src), shape, chunks)


def chunk_pieces(
    mine: Index, theirs: Index, shape: tuple[int, ...], chunks: tuple[int, ...]
) -> Pieces | None:
    """``copied_pieces`` of two chunked datasets of ``shape`` and ``chunks`` alike, from their
    indexes (each sorted by chunk offset): None unless ``mine`` covers the grid and both list
    the same chunks, filter masks and stored sizes."""
    if not _complete(mine, shape, chunks):
        return None
    if [(c, m, n) for c, m, _, n in mine] != [(c, m, n) for c, m, _, n in theirs]:
        return None
    return [(x[2], y[2], x[3]) for x, y in zip(mine, theirs, strict=True)]


def _contiguous(out: h5d.DatasetID, src: h5d.DatasetID, size: int) -> Pieces | None:
    """The one piece of two contiguous datasets of ``size`` bytes, if both store it whole."""
    return whole_piece(
        out.get_offset(), src.get_offset(), size, out.get_storage_size(), src.get_storage_size()
    )


def whole_piece(
    at: int | None, there: int | None, size: int, stored_here: int, stored_there: int
) -> Pieces | None:
    """The one piece of two contiguous datasets of ``size`` bytes stored at ``at`` and
    ``there``, if both store it whole (``stored_*``: the bytes each stores)."""
    if at is None or there is None or size == 0:
        return None
    if stored_here != size or stored_there != size:
        return None
    return [(at, there, size)]


def pipeline(dcpl: h5py.h5p.PropDCID) -> list[tuple[Any, ...]]:
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


def first_difference(fd: int, other: int, pieces: Pieces, block: int) -> tuple[int, bool] | None:
    """None if every piece's bytes at its first offset in ``fd`` are those at its second in
    ``other``, read in blocks of at most ``block`` bytes, in the order given; else (the offset
    in ``fd`` of the first byte that differs, whether a read there came up short)."""
    for at, there, size in pieces:
        for pos in range(0, size, block):
            n = min(block, size - pos)
            mine, theirs = os.pread(fd, n, at + pos), os.pread(other, n, there + pos)
            if len(mine) != n or len(theirs) != n:
                return at + pos, True
            if mine != theirs:
                return at + pos + next(i for i in range(n) if mine[i] != theirs[i]), False
    return None


class SameBytes:
    """Whether two datasets stored alike hold the same stored bytes (module doc): then they
    decode to the same values, and neither is decoded. The files stay open until ``close``;
    ``matched`` counts the pairs found equal."""

    BLOCK = 4 << 20

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}
        self.matched = 0

    def equal(self, a: h5d.DatasetID, a_path: Path, b: h5d.DatasetID, b_path: Path) -> bool | None:
        """True if ``b`` is stored as ``a`` is and its stored bytes are ``a``'s, False if it is
        stored alike with other bytes (they may still decode alike: another LZ4 writer), None
        if it is not stored alike."""
        pieces = copied_pieces(b, a)
        if pieces is None:
            return None
        try:
            found = first_difference(self._fd(b_path), self._fd(a_path), pieces, self.BLOCK)
        except OSError as exc:
            what = f"reading stored data here or in {a_path} failed ({exc.strerror or exc})"
            raise CkptIOError(b_path, what) from None
        self.matched += found is None
        return found is None

    def _fd(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
