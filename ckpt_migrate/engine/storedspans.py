"""``--verify full``'s comparison of reused tensors' stored bytes: the spans each tensor's
chunks take in a source, kept until every tensor is listed, then compared with the output's
bytes at the same offsets in file order (``verify.verify_full``)."""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from ckpt_migrate.errors import CorruptCheckpointError, VerificationError
from ckpt_migrate.format.h5 import overlaps
from ckpt_migrate.format.h5.io import open_read
from ckpt_migrate.format.h5.metadata import union
from ckpt_migrate.format.progress import Progress

COMPARE_BLOCK = 4 << 20  # (two buffers of it: 16 MiB ones were the peak of a 150k-leaf check)


class Spans:
    """One source's ``[start, end)`` spans and the position in the tree of the tensor whose
    they are, 20 bytes a span: 150k tuples of the two offsets and the tensor's name were
    20 MiB at the peak of a 150k-leaf ``--verify full`` (issue 33)."""

    def __init__(self) -> None:
        self.starts, self.ends, self.owners = array("Q"), array("Q"), array("I")

    def add(self, spans: Iterable[tuple[int, int]], position: int) -> None:
        for start, end in spans:
            self.starts.append(start)
            self.ends.append(end)
            self.owners.append(position)

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.starts:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
        return np.frombuffer(self.starts, np.uint64), np.frombuffer(self.ends, np.uint64)

    def total(self) -> int:
        starts, ends = self._arrays()
        return int((ends - starts).sum())

    def merged(self) -> Iterator[tuple[int, int]]:
        """The spans sorted and merged where they touch or overlap (``splitcopy.merge_spans``)."""
        starts, ends = union(*self._arrays())
        yield from zip(starts.tolist(), ends.tolist(), strict=True)

    def owner(self, at: int) -> int:
        """The position of the first tensor added whose span holds byte ``at``."""
        starts, ends = self._arrays()
        return self.owners[int(np.flatnonzero((starts <= at) & (ends > at))[0])]

    def of(self, position: int) -> list[tuple[int, int]]:
        starts, ends = self._arrays()
        mine = np.flatnonzero(np.frombuffer(self.owners, np.uint32) == position)
        return [(int(starts[i]), int(ends[i])) for i in mine]


def compare_stored(
    tmp: Path,
    source: Path,
    spans: Spans,
    name_of: Callable[[int], str],
    done: int,
    total: int,
    progress: Progress | None,
) -> int:
    """The bytes of ``tmp`` in every span must be ``source``'s at the same offsets; compared in
    file order, touching spans together, in blocks of ``COMPARE_BLOCK``; ``name_of``: the name
    of the tensor at a position. Returns ``done`` with the bytes compared added."""
    a, b = bytearray(COMPARE_BLOCK), bytearray(COMPARE_BLOCK)
    fd_out, fd_src = os.open(tmp, os.O_RDONLY), os.open(source, os.O_RDONLY)
    try:
        for start, end in spans.merged():
            for pos in range(start, end, COMPARE_BLOCK):
                n = min(COMPARE_BLOCK, end - pos)
                # (the source first: a chunk index entry of its own pointing past its end is
                # its damage, which the root edit's copy carried)
                got = _read(fd_src, b, n, pos)
                if got < n:
                    tensor = name_of(spans.owner(pos + got))
                    raise CorruptCheckpointError(
                        source,
                        f"tensor {tensor!r} has stored data that lies past the end of the file "
                        f"(byte {pos + got:,} of {os.fstat(fd_src).st_size:,})",
                        "the file is damaged; use another copy",
                    )
                if (mine := _read(fd_out, a, n, pos)) < n:
                    at = pos + mine
                    raise VerificationError(tmp, f"ends before the stored data at byte {at:,}")
                if not _equal(a, b, n):
                    at = pos + next(i for i in range(n) if a[i] != b[i])
                    position = spans.owner(at)
                    tensor = name_of(position)
                    _refuse_overlapping(source, tensor, spans.of(position))
                    what = f"differs from its source (stored byte at {at:,})"
                    raise VerificationError(tmp, f"tensor {tensor!r} {what}")
                done += n
                if progress is not None:
                    progress("verify", done, total)
    finally:
        os.close(fd_out)
        os.close(fd_src)
    return done


def _refuse_overlapping(source: Path, tensor: str, spans: list[tuple[int, int]]) -> None:
    """A reused tensor stored differently in the output than in ``source``: the source is
    damaged where its data overlaps its own metadata or other data (a chunk index entry's
    address moved into the root's attributes, which the root edit rewrote), never the case in a
    file HDF5 wrote: said so (exit 2), not as a failed verification of this tool's work."""
    with open_read(source) as f:
        shared = overlaps.shared_starts(f)
    if any(np.any((shared >= lo) & (shared < hi)) for lo, hi in spans):
        raise CorruptCheckpointError(
            source,
            f"tensor {tensor!r}: its stored data overlaps other data or the file's metadata",
            "the file is damaged; use another copy",
        )


def _read(fd: int, buffer: bytearray, n: int, offset: int) -> int:
    """Read up to ``n`` bytes at ``offset`` into ``buffer``: how many there were."""
    view = memoryview(buffer)
    got = 0
    while got < n:
        try:
            k = os.preadv(fd, [view[got:n]], offset + got)
        except OverflowError:  # (an offset no file reaches: a damaged address)
            break
        if k <= 0:
            break
        got += k
    return got


def _equal(a: bytearray, b: bytearray, n: int) -> bool:
    """Whether the first ``n`` bytes of ``a`` and ``b`` are equal (numpy compares 8 at a time)."""
    words = n // 8
    x = np.frombuffer(a, np.uint64, words)
    y = np.frombuffer(b, np.uint64, words)
    return bool(np.array_equal(x, y)) and a[words * 8 : n] == b[words * 8 : n]
