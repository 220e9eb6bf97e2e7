"""Copy an HDF5 file in two parts, so that its metadata can be edited while its data is copied.

The stored bytes of the datasets an upgrade keeps (``data ranges``, from the chunk index) are
never touched by an HDF5 metadata edit: renames, attributes and deletions only write object
headers, heaps and B-tree nodes, and new metadata is allocated at the end of the file or in space
freed by this session, never inside a live dataset's chunks. So the file is copied as

1. everything *outside* the data ranges (a few MB: superblock, object headers, chunk indexes,
   small datasets), at the same offsets, into a file of the source's size (holes elsewhere);
2. the data ranges, by a worker process (``_copyworker.py``) that reads the whole source once,
   in order, hashing it (the source digest of the provenance record), and writes past the page
   cache where it can;

and the caller edits the metadata with HDF5 during step 2. The copy starts before the data
ranges are known (phase 1 is then a plain sequential copy up to the point reached when they are).
Every byte of the source is copied exactly once; the byte counts are checked against its size.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import h5py
import xxhash

from ckpt_migrate import atomic
from ckpt_migrate.errors import CkptIOError, system_words
from ckpt_migrate.format.progress import Progress

# Tests copy in small blocks (slowed by the worker's CKPT_MIGRATE_TEST_WRITE_DELAY each) to
# watch the progress of a small file.
BLOCK = int(os.environ.get("CKPT_MIGRATE_TEST_COPY_BLOCK", 64 << 20))
MIN_RANGE = 64 << 10  # smaller data ranges travel with the metadata
# The block size of a copy started while the source's chunk indexes are still walked (cold 3 GB
# upgrade, ext4 on a virtual disk): in 64 MB blocks the walk took until the copy's end (5.2 s
# instead of 0.4 s), in 1 MB blocks 0.8 s, in 2 MB 1.5-2.9 s, in 4 MB 2.4 s (single traced
# runs); the whole upgrade took about the same with 1, 2 or 4 MB (4.3-5.3 s).
LEAD_BLOCK = 2 << 20
_XXHASH_DIR = str(Path(xxhash.__file__).parent.parent)  # the worker runs without site-packages


def data_ranges(
    datasets: Iterable[h5py.Dataset], min_bytes: int = MIN_RANGE
) -> list[tuple[int, int]]:
    """Sorted, merged ``[start, end)`` byte ranges holding the stored data of ``datasets``, at
    least ``min_bytes`` each. A dataset storing fewer bytes than that is left out even where its
    data adjoins a range: it travels with the metadata, so that whatever reads the small
    datasets of a copy (its verification) need not wait for the data ranges."""
    spans: list[tuple[int, int]] = []
    for ds in datasets:
        dsid = ds.id
        if ds.chunks is None:
            offset = dsid.get_offset()
            own = [] if offset is None else [(offset, offset + dsid.get_storage_size())]
        else:
            own = merge_spans(_chunk_spans(dsid))  # merged per dataset: memory stays small
        if sum(b - a for a, b in own) >= min_bytes:
            spans.extend(own)
    return [(a, b) for a, b in merge_spans(spans) if b - a >= min_bytes]


def _chunk_spans(dsid: h5py.h5d.DatasetID) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    dsid.chunk_iter(lambda c: spans.append((c.byte_offset, c.byte_offset + c.size)))
    return spans


def merge_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``[start, end)`` spans sorted (in place) and merged where they touch or overlap."""
    spans.sort()
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def complement(ranges: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    pos = 0
    for start, end in ranges:
        if start > pos:
            out.append((pos, start))
        pos = end
    if pos < size:
        out.append((pos, size))
    return out


class SplitCopy:
    """Copy ``src`` to ``dst`` (a new file, or an empty one such as a locked temporary from
    ``atomic.create_temp``; anything else is refused) in a worker process, in two phases.

    The worker (``_copyworker.py``: a process, so that it never waits for this interpreter's
    lock) starts copying every byte in order at once. ``restrict(ranges)`` then tells it to copy
    only the data ranges from where it is; this process copies the rest of the metadata part
    itself, and from then on may edit the metadata in ``dst``. ``finish()`` waits for the data,
    checks that every byte of ``src`` was copied exactly once and returns the source's digest.
    ``direct=False`` keeps the copy in the page cache (for a caller that reads it all next).
    """

    def __init__(
        self,
        src: Path,
        dst: Path,
        *,
        direct: bool = True,
        reserve: int = 0,
        lead: int = BLOCK,
        kernel: bool = False,
    ) -> None:
        """``reserve``: the size ``dst`` may grow to while its metadata is edited, allocated
        before the copy starts (``atomic.reserve``). ``lead``: the block size until
        ``restrict`` (``LEAD_BLOCK`` for a caller still reading the source's metadata).
        ``kernel``: blocks the page cache holds are copied by ``copy_file_range`` (only where
        it copies rather than shares: see ``_copyworker``)."""
        self.src, self.dst = src, dst
        self.size = src.stat().st_size
        self.boundary: int | None = None  # every byte before it was copied in order
        self.copied = 0  # bytes copied by the worker
        self.copied_here = 0  # bytes copied by this process
        self._ranges: list[tuple[int, int]] | None = None
        self.digest: str | None = None  # xxh3-128 of the whole source, once finished
        self._proc: subprocess.Popen[str] | None = None
        self.fd_in = os.open(src, os.O_RDONLY)
        try:
            self.fd_out = _open_empty(dst)
        except BaseException:
            os.close(self.fd_in)
            raise
        try:
            os.ftruncate(self.fd_out, self.size)
            atomic.reserve(self.fd_out, self.size, reserve)
            worker = Path(__file__).with_name("_copyworker.py")
            argv = [sys.executable, "-I", "-S", str(worker)]
            argv += [str(self.fd_in), str(self.fd_out), str(self.size), str(BLOCK), _XXHASH_DIR]
            mode = ["direct" if direct else "cached"] + (["kernel"] if kernel else [])
            argv += [",".join(mode), str(min(lead, BLOCK))]
            self._proc = _start(argv, (self.fd_in, self.fd_out))
        except BaseException:
            self._close()
            raise

    def _message(self) -> tuple[str, int, str]:
        assert self._proc is not None and self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            raise OSError(errno.EIO, f"the copy of {self.src} stopped (worker exit {code})")
        word, _, rest = line.strip().partition(" ")
        number, _, text = rest.partition(" ")
        if word == "error":
            raise OSError(int(number) or errno.EIO, text)
        if word == "digest":
            self.digest = number
            return self._message()
        return word, int(number), text

    def restrict(self, ranges: list[tuple[int, int]]) -> None:
        """From now on the worker copies only ``ranges``; everything else is in place on return
        (so the caller may edit ``dst`` outside ``ranges``)."""
        if any(a >= b for a, b in ranges) or any(
            ranges[i][1] > ranges[i + 1][0] for i in range(len(ranges) - 1)
        ):
            raise ValueError("data ranges must be sorted, non-empty and disjoint")
        if ranges and ranges[-1][1] > self.size:
            raise ValueError("data ranges reach past the end of the source")
        assert self._proc is not None and self._proc.stdin is not None
        self._ranges = ranges
        try:
            self._proc.stdin.write("ranges " + " ".join(f"{a} {b}" for a, b in ranges) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            pass  # the worker has stopped (e.g. the disk is full): its last line says why
        while True:
            word, number, _ = self._message()
            if word == "boundary":
                break
            self.copied = number
        self.boundary = number
        pieces = [(max(a, number), b) for a, b in complement(ranges, self.size) if b > number]
        # Thousands of small pieces: asked for all at once, the disk serves them in parallel
        # instead of one by one behind the worker's large reads.
        for start, end in pieces:
            os.posix_fadvise(self.fd_in, start, end - start, os.POSIX_FADV_WILLNEED)
        for start, end in pieces:
            self.copied_here += _copy_all(self.fd_in, self.fd_out, start, end)

    def finish(self, progress: Progress | None = None) -> str:
        """Wait for the worker; return the source's digest. Raise the worker's error, or an
        error if a byte was missed."""
        try:
            if self._ranges is None:
                self.restrict([])
            while True:
                word, number, _ = self._message()
                self.copied = number
                if progress is not None:
                    progress("copy", self.copied + self.copied_here, self.size)
                if word == "done":
                    break
            assert self._proc is not None
            self._proc.wait()
            if self.copied + self.copied_here != self.size:
                raise OSError(
                    errno.EIO,
                    f"{self.src}: copied {self.copied + self.copied_here} of {self.size} bytes",
                )
            if self.digest is None:
                raise OSError(errno.EIO, f"the copy of {self.src} reported no digest")
            return self.digest
        finally:
            self.abort()

    def abort(self) -> None:
        """Stop the worker (if it still runs) and close the files; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    if pipe is not None:
                        pipe.close()
        self._close()

    def _close(self) -> None:
        for fd in ("fd_in", "fd_out"):
            with contextlib.suppress(AttributeError, OSError):
                os.close(getattr(self, fd))
                delattr(self, fd)


def _open_empty(dst: Path) -> int:
    """Create ``dst``, or open it if it exists and is empty; never clobber a file with data."""
    try:
        return os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        fd = os.open(dst, os.O_RDWR | os.O_NOFOLLOW)
        if os.fstat(fd).st_size == 0:
            return fd
        os.close(fd)
        raise


def _copy_all(fd_in: int, fd_out: int, start: int, end: int) -> int:
    pos = start
    while pos < end:
        pos += copy_range(fd_in, fd_out, pos, min(BLOCK, end - pos))
    return end - start


_KERNEL_COPY = hasattr(os, "copy_file_range")


def copy_range(fd_in: int, fd_out: int, offset: int, count: int) -> int:
    """Copy up to ``count`` bytes at ``offset`` (same offset in both files); returns how many."""
    global _KERNEL_COPY
    if _KERNEL_COPY:
        try:
            n = os.copy_file_range(fd_in, fd_out, count, offset, offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            _KERNEL_COPY = False
        else:
            if n == 0:
                raise OSError(errno.EIO, "the source shrank while being copied")
            return n
    block = os.pread(fd_in, count, offset)
    if not block:
        raise OSError(errno.EIO, "the source shrank while being copied")
    return os.pwrite(fd_out, block, offset)


def _start(argv: list[str], fds: tuple[int, int]) -> subprocess.Popen[str]:
    """The worker's process. An interpreter this user may not run (an ``OSError`` that names
    it) is said so: taken for the upgrade's own I/O, it read as a denied write of the output."""
    try:
        # A session of its own: a terminal's Ctrl-C goes to the parent alone, which aborts (and
        # kills this worker). In the parent's process group the signal could reach the worker
        # while it still imports, before it ignores SIGINT: a KeyboardInterrupt traceback on
        # the shared stderr (seen under load in test_interrupt).
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=fds,
            start_new_session=True,
        )
    except OSError as exc:
        raise CkptIOError(
            None,
            f"cannot start the copy worker with {argv[0]} ({system_words(exc)})",
            "run ckpt-migrate with a Python this user may execute",
        ) from None
