"""Reads of a chunked tensor split so that each covers a bounded number of chunks.

HDF5 reads a selection's chunks together and keeps a pair of dataspaces for each chunk it
touches (about 4 KiB a chunk): one read of a 1 MiB tensor stored in 262,144 one-element chunks
(a script's ``chunks=(1, 1)``, 15 MB on disk) took 1 GiB, whichever command read it. Reading at
most :data:`MAX_CHUNKS` chunks at a time, along the first axis, costs the same time and a few
MiB.
"""

from __future__ import annotations

import math

import numpy as np
from h5py import h5d, h5s

MAX_CHUNKS = 4096


def rows_per_read(dsid: h5d.DatasetID) -> int | None:
    """How many rows of the first axis one read of ``dsid`` may cover, or None when a read of
    the whole dataset touches at most :data:`MAX_CHUNKS` chunks (or it is not chunked)."""
    shape = dsid.shape
    dcpl = dsid.get_create_plist()
    if not shape or 0 in shape or dcpl.get_layout() != h5d.CHUNKED:
        return None
    chunks = dcpl.get_chunk()
    band = math.prod(-(-n // c) for n, c in zip(shape[1:], chunks[1:], strict=True))
    if -(-shape[0] // chunks[0]) * band <= MAX_CHUNKS:
        return None
    return max(1, MAX_CHUNKS // band) * chunks[0]


def read_rows(dsid: h5d.DatasetID, out: np.ndarray, start: int = 0) -> np.ndarray:
    """Rows ``[start, start + len(out))`` of ``dsid`` into the C-contiguous ``out`` (all of it
    for ``start`` 0 and ``out`` of its shape), at most :data:`MAX_CHUNKS` chunks a read."""
    step = rows_per_read(dsid)
    if step is None and start == 0 and out.shape == dsid.shape:
        dsid.read(h5s.ALL, h5s.ALL, out)
        return out
    step = step or max(1, out.shape[0])
    space = dsid.get_space()
    rest = (0,) * (out.ndim - 1)
    for at in range(0, out.shape[0], step):
        piece = out[at : at + step]
        space.select_hyperslab((start + at, *rest), piece.shape)
        dsid.read(h5s.create_simple(piece.shape), space, piece)
    return out


def slab(dsid: h5d.DatasetID, sl: tuple[slice, ...]) -> np.ndarray | None:
    """``dsid[sl]`` (``()``: all of it; else one slice of the first axis) read by
    :func:`read_rows` where one read would touch more than :data:`MAX_CHUNKS` chunks; None
    otherwise (read it whole)."""
    whole = not sl or (len(sl) == 1 and isinstance(sl[0], slice) and sl[0].step in (None, 1))
    if not whole or rows_per_read(dsid) is None:
        return None
    start, stop, _ = sl[0].indices(dsid.shape[0]) if sl else (0, dsid.shape[0], 1)
    out = np.empty((max(0, stop - start), *dsid.shape[1:]), dsid.dtype)
    return read_rows(dsid, out, start)
