"""The byte mover of ``splitcopy.SplitCopy``, run as its own process (standard library only).

A thread would share the interpreter lock with the HDF5 metadata work of the parent: between two
``copy_file_range`` calls it waits for the lock, and a checkpoint has thousands of data ranges.

    python _copyworker.py FD_IN FD_OUT SIZE BLOCK

Copies ``FD_IN`` to ``FD_OUT`` from offset 0 in blocks until a line ``ranges a b a b ...``
arrives on stdin; answers ``boundary N`` (every byte before N is copied), then copies the parts of
those ranges at or after N, printing ``copied N`` now and then and ``done N`` at the end (or
``error ERRNO MESSAGE``). It exits when stdin closes (its parent has gone) and dies with its parent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import signal
import sys

SYNC_FILE_RANGE_WRITE = 2
PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except OSError:
        return None


class Mover:
    def __init__(self, fd_in: int, fd_out: int, size: int, block: int) -> None:
        self.fd_in, self.fd_out, self.size, self.block = fd_in, fd_out, size, block
        self.copied = 0
        self.reported = 0
        libc = _libc()
        self.writeback = getattr(libc, "sync_file_range", None) if libc else None
        if self.writeback is not None:
            self.writeback.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        self.kernel = hasattr(os, "copy_file_range")

    def copy(self, offset: int, count: int) -> int:
        n = 0
        if self.kernel:
            try:
                n = os.copy_file_range(self.fd_in, self.fd_out, count, offset, offset)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                self.kernel = False
        if not self.kernel:
            data = os.pread(self.fd_in, count, offset)
            n = os.pwrite(self.fd_out, data, offset) if data else 0
        if n == 0:
            raise OSError(errno.EIO, "the source shrank while being copied")
        if self.writeback is not None:  # start writing to disk now: the final fsync is short
            self.writeback(self.fd_out, offset, n, SYNC_FILE_RANGE_WRITE)
        self.copied += n
        if self.copied - self.reported >= 64 << 20:
            self.reported = self.copied
            say(f"copied {self.copied}")
        return n


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def pending_line(timeout: float | None) -> str | None:
    """A control line if one is waiting (or, with timeout None, when one comes)."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    if not ready:
        return None
    line = sys.stdin.readline()
    if not line:  # the parent has gone
        os._exit(3)
    return line


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (abort)
    libc = _libc()
    if libc is not None and hasattr(libc, "prctl"):
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    fd_in, fd_out, size, block = (int(a) for a in argv[1:5])
    mover = Mover(fd_in, fd_out, size, block)
    try:
        pos = 0
        line = None
        while pos < size and (line := pending_line(0)) is None:
            pos += mover.copy(pos, min(block, size - pos))
        if line is None:
            line = pending_line(None)
        words = line.split()
        if not words or words[0] != "ranges":
            raise OSError(errno.EINVAL, f"unexpected control line {line!r}")
        bounds = [int(w) for w in words[1:]]
        say(f"boundary {pos}")
        for start, end in zip(bounds[::2], bounds[1::2]):
            start = max(start, pos)
            while start < end:
                pending_line(0)  # exits if the parent has gone
                start += mover.copy(start, min(block, end - start))
    except Exception as exc:  # reported to the parent as one line, never a traceback
        code = getattr(exc, "errno", None) or 0
        say(f"error {code} {getattr(exc, 'strerror', None) or exc}")
        return 1
    say(f"done {mover.copied}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
