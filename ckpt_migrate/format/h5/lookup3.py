"""Bob Jenkins' lookup3 ``hashlittle`` of many equal-length buffers at once, with numpy.

HDF5 checksums its version-2+ metadata with it (``h5root.lookup3`` is the one-buffer form, in
Python: about 1 µs per 12 bytes). A fractal heap's direct blocks come in a few sizes, dozens
to hundreds of each in a root of 150k attributes (issue 33): hashed side by side, one numpy
operation per step covers every block of a size, so the cost follows the largest block size,
not the number of blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ckpt_migrate.format.h5 import capi
from ckpt_migrate.format.h5.root import lookup3

# Below this many buffers of one length, the one-buffer form is as fast.
BATCH = 8


def _rot(x: np.ndarray, k: int) -> np.ndarray:
    return (x << np.uint32(k)) | (x >> np.uint32(32 - k))


def _mix(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    """lookup3.c ``mix``, in place."""
    a -= c
    a ^= _rot(c, 4)
    c += b
    b -= a
    b ^= _rot(a, 6)
    a += c
    c -= b
    c ^= _rot(b, 8)
    b += a
    a -= c
    a ^= _rot(c, 16)
    c += b
    b -= a
    b ^= _rot(a, 19)
    a += c
    c -= b
    c ^= _rot(b, 4)
    b += a


def _final(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """lookup3.c ``final``: returns c."""
    c ^= b
    c -= _rot(b, 14)
    a ^= c
    a -= _rot(c, 11)
    b ^= a
    b -= _rot(a, 25)
    c ^= b
    c -= _rot(b, 16)
    a ^= c
    a -= _rot(c, 4)
    b ^= a
    b -= _rot(a, 14)
    c ^= b
    c -= _rot(b, 24)
    return c


def lookup3_many(buffers: Sequence[bytes]) -> list[int]:
    """``lookup3(buffer)`` (seed 0) of every buffer, in order: one by one where HDF5's own
    function does it (``capi.lookup3``), else side by side in numpy."""
    if capi.lookup3(b"") is not None:
        return [lookup3(data) for data in buffers]
    out: list[int] = [0] * len(buffers)
    by_length: dict[int, list[int]] = {}
    for i, data in enumerate(buffers):
        by_length.setdefault(len(data), []).append(i)
    for n, indexes in by_length.items():
        if n == 0 or len(indexes) < BATCH:
            for i in indexes:
                out[i] = lookup3(buffers[i])
            continue
        width = -(-n // 12) * 12
        raw = b"".join(buffers[i].ljust(width, b"\0") for i in indexes)
        words = np.frombuffer(raw, dtype="<u4").reshape(len(indexes), width // 12, 3)
        words = words.astype(np.uint32).transpose(1, 2, 0).copy()  # [round, word, buffer]
        start = np.uint32((0xDEADBEEF + n) & 0xFFFFFFFF)
        a, b, c = (np.full(len(indexes), start, dtype=np.uint32) for _ in range(3))
        with np.errstate(over="ignore"):
            for k in range(width // 12 - 1):
                a += words[k, 0]
                b += words[k, 1]
                c += words[k, 2]
                _mix(a, b, c)
            a += words[-1, 0]
            b += words[-1, 1]
            c += words[-1, 2]
            for i, value in zip(indexes, _final(a, b, c).tolist(), strict=True):
                out[i] = value
    return out
