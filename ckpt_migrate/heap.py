"""glibc's heap, told to give large blocks and free pages back (issue 33).

By default glibc serves a block of 128 KiB or more as its own mapping, and raises that
threshold to the size of each such block freed (up to 32 MiB). After a command frees one large
text (a 27 MB ``__spec__``, a conversion's tensor), blocks up to that size come from the heap,
whose holes stay resident once freed: peak RSS creeps above what is live. A threshold set once
stays where it is: every block at or above it is its own mapping, returned when freed.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys

_M_MMAP_THRESHOLD = -3  # (malloc.h)


def fix_mmap_threshold(size: int) -> None:
    """Serve every block of ``size`` bytes or more as its own mapping, from now on (glibc's
    ``mallopt``; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, size)


def give_back_freed() -> None:
    """Hand the pages glibc's heap holds free back to the system (``malloc_trim``; elsewhere
    nothing): what was freed in blocks below the threshold stays resident until then."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).malloc_trim(0)
