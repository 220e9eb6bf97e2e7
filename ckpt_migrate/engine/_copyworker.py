"""The byte mover of ``splitcopy.SplitCopy``, run as its own process (standard library + xxhash).

A thread would share the interpreter lock with the HDF5 metadata work of the parent: between two
blocks it waits for the lock, and a checkpoint has thousands of data ranges.

    python -I -S _copyworker.py FD_IN FD_OUT SIZE BLOCK XXHASH_DIR direct|cached[,kernel] LEAD

Reads ``FD_IN`` from offset 0 to ``SIZE`` in blocks, in order, hashing every byte (xxh3-128, the
source digest of the provenance record). Until a line ``ranges a b a b ...`` arrives on stdin it
writes every block it reads to ``FD_OUT``, in blocks of ``LEAD`` bytes; then it answers
``boundary N`` (every byte before N is written) and from there on writes only the parts of those
ranges at or after N, in blocks of ``BLOCK`` bytes. The small blocks first leave the disk to the
parent's reads of the source's metadata while it still makes them: each read of the worker goes
to the virtual disk as one queue of requests, and a small read of the parent waits behind all
of it. It prints ``copied N`` now and then, ``digest HEX`` and ``done N`` at the end (or
``error ERRNO MESSAGE``). It exits when stdin closes (its parent has gone) and dies with its
parent.

Bulk data bypasses the page cache (``O_DIRECT``) where the filesystem allows it: on the virtual
disks measured, a buffered cold copy of 3 GB cost 3.5-7 s of kernel CPU, a direct one 0.35 s, and
the upgrade's metadata work needs that core. Blocks already in the page cache are taken from it
(``RWF_NOWAIT``); the unaligned edges of a range are written through the page cache, where the
parent's metadata edits of the same pages also go. With ``kernel``, a block found in the page
cache is copied by the kernel from there (``copy_file_range``: page cache to page cache, its
writeback started at once) instead of written from the worker's buffer past the page cache: a
warm 3 GB copy took 1.3 s so (``cp`` + ``sync``: 1.5 s), 2.1 s with ``O_DIRECT`` writes, and the
warm upgrade 2.5 s instead of 2.9 s (``cp`` + ``sync``: 1.9 s). The parent asks for it only where
``copy_file_range`` copies rather than shares extents (ext4, not XFS: a forced copy there writes
every byte). ``cached`` reads and writes everything through the page cache (for a caller that
reads the whole output right after); with ``kernel`` its writes are kernel copies too: a warm
3 GB copy that wrote its buffers through the page cache took 5-9 s here, with
``copy_file_range`` 1.5 s.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import queue
import select
import signal
import sys
import threading
import time

SYNC_FILE_RANGE_WRITE = 2
PR_SET_PDEATHSIG = 1
ALIGN = 4096  # O_DIRECT offsets, lengths and buffer addresses: a multiple of the block size
DEPTH = 2  # buffers: the next block is read while the last one is written
# Tests slow the writer down to show that ``boundary`` waits for it.
WRITE_DELAY = float(os.environ.get("CKPT_MIGRATE_TEST_WRITE_DELAY", "0"))


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except OSError:
        return None


def _reopen_direct(fd: int, flags: int) -> int | None:
    """The same file opened again with ``O_DIRECT`` (None where the filesystem refuses it)."""
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        return os.open(f"/proc/self/fd/{fd}", flags | os.O_DIRECT)
    except OSError:
        return None


def _down(n: int) -> int:
    return n - n % ALIGN


def _up(n: int) -> int:
    return _down(n + ALIGN - 1)


class Mover:
    def __init__(
        self, fd_in: int, fd_out: int, size: int, block: int, direct: bool, kernel: bool = False
    ) -> None:
        self.fd_in, self.fd_out, self.size = fd_in, fd_out, size
        self.block = max(ALIGN, _down(block))
        self.free: queue.Queue[memoryview] = queue.Queue()
        for _ in range(DEPTH):
            self.free.put(memoryview(mmap.mmap(-1, self.block)))  # page-aligned, for O_DIRECT
        self.in_direct = _reopen_direct(fd_in, os.O_RDONLY) if direct else None
        self.out_direct = _reopen_direct(fd_out, os.O_WRONLY) if direct else None
        self.kernel = kernel and hasattr(os, "copy_file_range")
        self.copied = 0
        self.reported = 0
        libc = _libc()
        self.writeback = getattr(libc, "sync_file_range", None) if libc else None
        if self.writeback is not None:
            self.writeback.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]

    def read(self, offset: int, view: memoryview, block: int) -> tuple[memoryview, bool]:
        """The bytes from ``offset`` (a multiple of ALIGN), read into ``view``: as much of a
        whole buffer as the page cache holds, else ``block`` bytes (a multiple of ALIGN), from
        the disk directly where they are not cached; and whether the page cache holds them
        all (read from it, or through it where nothing is read past it)."""
        full = min(self.block, self.size - offset)
        want = min(block, full)
        n = 0
        if self.in_direct is not None and hasattr(os, "RWF_NOWAIT"):
            try:
                n = os.preadv(self.fd_in, [view[:full]], offset, os.RWF_NOWAIT)
            except OSError as exc:  # EAGAIN: not cached; EOPNOTSUPP: no such flag here
                if exc.errno not in (errno.EAGAIN, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
            if n >= want:  # cached reads cost the disk nothing: take all there is
                return view[: n if n == full else _down(n)], True
        while n < want:
            at = offset + n
            if self.in_direct is not None and at % ALIGN == 0:
                got = os.preadv(self.in_direct, [view[n : n + _up(want - n)]], at)
            else:
                got = os.preadv(self.fd_in, [view[n:want]], at)
            if got <= 0:
                raise OSError(errno.EIO, "the source shrank while being copied")
            n = min(want, n + got)
        return view[:want], self.in_direct is None  # read through the page cache: now in it

    def write(self, data: memoryview, offset: int, start: int, end: int, cached: bool) -> None:
        """Write bytes ``[start, end)`` of the file; ``data`` holds those from ``offset``
        (``cached``: read from the page cache, where the kernel may copy them from)."""
        if cached and self.kernel and self._kernel_copy(start, end):
            if self.writeback is not None:  # to disk now, not all of it at the final fsync
                self.writeback(self.fd_out, start, end - start, SYNC_FILE_RANGE_WRITE)
            self._count(end - start)
            return
        if self.out_direct is not None:
            a, b = _up(start), _down(end)
            if b - a >= ALIGN:
                self._put(self.fd_out, data, offset, start, a)
                try:
                    self._put(self.out_direct, data, offset, a, b)
                except OSError as exc:  # alignment stricter than ALIGN: page cache from now on
                    if exc.errno != errno.EINVAL:
                        raise
                    os.close(self.out_direct)
                    self.out_direct = None
                    self._put(self.fd_out, data, offset, a, b)
                self._put(self.fd_out, data, offset, b, end)
                self._count(end - start)
                return
        self._put(self.fd_out, data, offset, start, end)
        if self.writeback is not None:  # start writing to disk now: the final fsync is short
            self.writeback(self.fd_out, start, end - start, SYNC_FILE_RANGE_WRITE)
        self._count(end - start)

    def _kernel_copy(self, start: int, end: int) -> bool:
        """``copy_file_range`` of ``[start, end)``; False (and never again) where the kernel
        cannot, before any byte is copied."""
        pos = start
        while pos < end:
            try:
                n = os.copy_file_range(self.fd_in, self.fd_out, end - pos, pos, pos)
            except OSError as exc:
                if pos > start or exc.errno not in (
                    errno.EXDEV,
                    errno.ENOSYS,
                    errno.EOPNOTSUPP,
                    errno.EINVAL,
                ):
                    raise
                self.kernel = False
                return False
            if n <= 0:
                raise OSError(errno.EIO, "the source shrank while being copied")
            pos += n
        return True

    def _put(self, fd: int, data: memoryview, offset: int, start: int, end: int) -> None:
        while start < end:
            n = os.pwrite(fd, data[start - offset : end - offset], start)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            start += n

    def _count(self, n: int) -> None:
        self.copied += n
        if self.copied - self.reported >= self.block:
            self.reported = self.copied
            say(f"copied {self.copied}")


_SAYING = threading.Lock()


def say(line: str) -> None:
    with _SAYING:  # the reader and the writer thread both report
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


def parse_ranges(line: str) -> list[tuple[int, int]]:
    words = line.split()
    if not words or words[0] != "ranges":
        raise OSError(errno.EINVAL, f"unexpected control line {line!r}")
    bounds = [int(w) for w in words[1:]]
    return list(zip(bounds[::2], bounds[1::2]))


class Writer(threading.Thread):
    """Writes the blocks the reader hands over, so that reading the next block overlaps."""

    def __init__(self, mover: Mover) -> None:
        super().__init__(daemon=True)
        self.mover = mover
        self.jobs: queue.Queue[tuple[memoryview, int, list[tuple[int, int]], bool] | None] = (
            queue.Queue()
        )
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        while (job := self.jobs.get()) is not None:
            buffer, offset, parts, cached = job
            try:
                if self.error is None:
                    if WRITE_DELAY:
                        time.sleep(WRITE_DELAY)
                    for start, end in parts:
                        self.mover.write(buffer, offset, start, end, cached)
            except BaseException as exc:
                self.error = exc
            self.mover.free.put(buffer)
            self.jobs.task_done()

    def submit(
        self, buffer: memoryview, offset: int, parts: list[tuple[int, int]], cached: bool
    ) -> None:
        """Write ``parts`` (file ranges) from ``buffer``, which holds the file from ``offset``
        (``cached``: as the page cache does); the buffer goes back to the free ones afterwards."""
        if self.error is not None:
            raise self.error
        self.jobs.put((buffer, offset, parts, cached))

    def drain(self) -> None:
        """Wait until every block handed over is written."""
        self.jobs.join()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.jobs.put(None)
        self.join()
        if self.error is not None:
            raise self.error


def copy(mover: Mover, hasher, lead: int) -> None:
    ranges: list[tuple[int, int]] | None = None
    block = min(mover.block, max(ALIGN, _down(lead)))
    boundary = 0
    i = 0  # the first range that may still reach into the current block
    pos = 0
    writer = Writer(mover)
    try:
        while pos < mover.size:
            line = pending_line(0)  # also: exits if the parent has gone
            if line is not None:
                if ranges is not None:
                    raise OSError(errno.EINVAL, f"unexpected control line {line!r}")
                ranges, boundary, block = parse_ranges(line), pos, mover.block
                writer.drain()  # "boundary" promises that every byte before it is written
                say(f"boundary {pos}")
            buffer = mover.free.get()
            data, cached = mover.read(pos, buffer, block)
            end = pos + len(data)
            hasher.update(data)
            if ranges is None:
                parts = [(pos, end)]
            else:
                while i < len(ranges) and ranges[i][1] <= pos:
                    i += 1
                parts = []
                j = i
                while j < len(ranges) and ranges[j][0] < end:
                    a, b = max(ranges[j][0], pos, boundary), min(ranges[j][1], end)
                    if a < b:
                        parts.append((a, b))
                    j += 1
            writer.submit(buffer, pos, parts, cached)
            pos = end
    finally:
        writer.close()
    if ranges is None:
        parse_ranges(pending_line(None) or "")
        say(f"boundary {pos}")


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (abort)
    libc = _libc()
    if libc is not None and hasattr(libc, "prctl"):
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        fd_in, fd_out, size, block = (int(a) for a in argv[1:5])
        sys.path.append(argv[5])
        import xxhash

        mode = argv[6].split(",")
        mover = Mover(fd_in, fd_out, size, block, "direct" in mode, "kernel" in mode)
        hasher = xxhash.xxh3_128()
        copy(mover, hasher, int(argv[7]))
    except Exception as exc:  # reported to the parent as one line, never a traceback
        code = getattr(exc, "errno", None) or 0
        say(f"error {code} {getattr(exc, 'strerror', None) or exc}")
        return 1
    say(f"digest {hasher.hexdigest()}")
    say(f"done {mover.copied}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
