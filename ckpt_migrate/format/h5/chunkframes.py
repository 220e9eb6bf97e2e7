"""Whether the stored bytes of one chunk decode to exactly one chunk (``h5.chunks``): an LZ4
frame's lengths walked as hdf5plugin's ``H5Zlz4.c`` walks them, a deflate stage inflated once
more, fletcher32's four bytes, each stage's length checked."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable

from ckpt_migrate.format.h5.plugins import LZ4_FILTER_ID

DEFLATE, SHUFFLE, FLETCHER32, LZ4 = 1, 2, 3, LZ4_FILTER_ID
Read = Callable[[int, int], bytes]  # (offset in the chunk, count) -> bytes
_FRAME_HEAD = struct.Struct(">QI")
_BLOCK_HEAD = struct.Struct(">I")
HEAD = _FRAME_HEAD.size + _BLOCK_HEAD.size  # a frame's header and its first block's size
PAST_END = "its LZ4 frame lies past the end of the file"


def frame_at(fd: int, at: int, stored: int, expected: int) -> str | None:
    """``frame_problem`` of the frame stored at byte ``at`` of the file ``fd``."""
    try:
        return frame_problem(_file_reader(fd, at), stored, expected)
    except _ShortRead:
        return PAST_END


def too_short(stored: int) -> str:
    return f"stores {stored} bytes, too few for an LZ4 frame"


def chunk_problem(active: tuple[int, ...], chunk_bytes: int, data: bytes) -> str | None:
    """Why the stored bytes of one chunk do not decode to exactly ``chunk_bytes``: the filters
    it went through (``active``, in the order the writer applied them) undone in reverse, the
    length checked at every stage."""
    stage = data
    for k in reversed(range(len(active))):
        want = chunk_bytes + 4 * active[:k].count(FLETCHER32)  # what filter k was given
        if active[k] == FLETCHER32:
            if len(stage) < 4:
                return f"stores {len(stage)} bytes, too few for its fletcher32 checksum"
            stage = stage[:-4]
            if {DEFLATE, LZ4} & set(active[:k]):  # h5py's order: it sums the compressed bytes
                continue
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
    ``expected`` bytes: its lengths walked as ``H5Zlz4.c`` walks them (``h5.chunks``' docstring)."""
    if stored < _FRAME_HEAD.size + _BLOCK_HEAD.size:
        return too_short(stored)
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


def _file_reader(fd: int, base: int) -> Read:
    return lambda at, n: os.pread(fd, n, base + at)
