"""The two-phase copy behind copy-patch upgrades: every byte exactly once, whenever the switch."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import pytest

from ckpt_migrate.engine import _copyworker, splitcopy
from ckpt_migrate.engine.copypatch import file_digest
from ckpt_migrate.engine.splitcopy import SplitCopy, complement, data_ranges


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "src.bin"
    path.write_bytes(np.random.default_rng(0).bytes(5 * 1024 * 1024 + 123))
    return path


@pytest.mark.parametrize("lead", [1 << 20, 10_000], ids=["lead=block", "lead=small"])
@pytest.mark.parametrize(
    ("direct", "kernel"),
    [(True, False), (True, True), (False, False), (False, True)],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("switch_after", [0, 1, 3, None])
def test_split_copy_is_byte_identical_whenever_the_ranges_arrive(
    source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    switch_after: int | None,
    direct: bool,
    kernel: bool,
    lead: int,
) -> None:
    """``lead`` (the block size before the ranges are known) not a multiple of the page size:
    the worker rounds it down, and its offsets stay aligned for O_DIRECT after the switch.
    ``kernel``: the source was just written, so its blocks are in the page cache and
    ``copy_file_range`` copies them (where the filesystem can)."""
    monkeypatch.setattr(splitcopy, "BLOCK", 1 << 20)
    ranges = [(100, 700_000), (1_500_000, 2_500_000), (4_000_000, 5 * 1024 * 1024)]
    dst = tmp_path / "dst.bin"
    copier = SplitCopy(source, dst, direct=direct, lead=lead, kernel=kernel)
    if switch_after is not None:
        time.sleep(0.05 * switch_after)  # let the sequential phase get somewhere
        copier.restrict(ranges)
        # Everything outside the ranges is in place now: the caller may edit it.
        with open(dst, "r+b") as fh:
            for start, end in complement(ranges, source.stat().st_size):
                fh.seek(start)
                assert fh.read(end - start) == source.read_bytes()[start:end]
    digest = copier.finish()
    assert dst.read_bytes() == source.read_bytes()
    assert copier.copied + copier.copied_here == source.stat().st_size
    assert digest == file_digest(source)


def test_a_partly_cached_source_is_read_from_cache_and_disk(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks in the page cache are taken from it, the others read past it; some blocks are
    partly cached (the cached head comes from the cache, the rest from the disk)."""
    monkeypatch.setattr(splitcopy, "BLOCK", 1 << 20)
    size = source.stat().st_size
    os.sync()
    fd = os.open(source, os.O_RDONLY)
    try:
        for start in range(0, size, 3 << 19):  # evict every third half-MiB
            os.posix_fadvise(fd, start, 1 << 19, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    dst = tmp_path / "dst.bin"
    copier = SplitCopy(source, dst)
    copier.restrict([(4096 * 3 + 5, size - 77)])
    assert copier.finish() == file_digest(source)
    assert dst.read_bytes() == source.read_bytes()


def test_lead_blocks_are_small_unless_the_page_cache_holds_more(
    source: Path, tmp_path: Path
) -> None:
    """Before its ranges arrive the worker reads the disk in small blocks (the parent is still
    reading the source's metadata from it), but takes a whole buffer from the page cache."""
    size = source.stat().st_size
    fd_in = os.open(source, os.O_RDONLY)
    fd_out = os.open(tmp_path / "dst.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        mover = _copyworker.Mover(fd_in, fd_out, size, 1 << 20, direct=True)
        if mover.in_direct is None or not hasattr(os, "RWF_NOWAIT"):
            pytest.skip(f"no O_DIRECT or RWF_NOWAIT on {tmp_path}'s filesystem")
        buffer = mover.free.get()
        os.pread(fd_in, size, 0)  # all of it in the page cache
        cached, from_cache = mover.read(8192, buffer, 8192)
        assert from_cache and len(cached) == 1 << 20
        assert bytes(cached) == source.read_bytes()[8192 : 8192 + (1 << 20)]
        os.fsync(fd_in)
        os.posix_fadvise(fd_in, 0, 0, os.POSIX_FADV_DONTNEED)
        with contextlib.suppress(BlockingIOError):  # EAGAIN: not in the page cache
            os.preadv(fd_in, [bytearray(4096)], 1 << 20, os.RWF_NOWAIT)
            pytest.skip("the page cache would not drop the source here")
        cold, from_cache = mover.read(8192, buffer, 8192)
        assert not from_cache and bytes(cold) == source.read_bytes()[8192 : 2 * 8192]
        tail, _ = mover.read(size - size % 4096, buffer, 8192)  # the last, short block
        assert bytes(tail) == source.read_bytes()[size - size % 4096 :]
    finally:
        os.close(fd_in)
        os.close(fd_out)


@pytest.mark.parametrize("kernel", [True, False])
def test_a_cached_block_is_copied_by_the_kernel_where_asked(
    source: Path, tmp_path: Path, kernel: bool
) -> None:
    """With ``kernel``, a block read from the page cache is written by ``copy_file_range`` from
    the source, not from the worker's buffer (here deliberately wrong, to tell them apart);
    a block read from the disk is always written from the buffer."""
    fd_in = os.open(source, os.O_RDONLY)
    fd_out = os.open(tmp_path / "dst.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd_out, 1 << 20)
        mover = _copyworker.Mover(fd_in, fd_out, 1 << 20, 1 << 20, True, kernel)
        wrong = memoryview(bytearray(b"x" * (1 << 20)))
        mover.write(wrong, 0, 0, 4096 * 3 + 10, cached=True)
        mover.write(wrong, 0, 4096 * 3 + 10, 1 << 20, cached=False)
        got = os.pread(fd_out, 1 << 20, 0)
    finally:
        os.close(fd_in)
        os.close(fd_out)
    head = source.read_bytes()[: 4096 * 3 + 10] if kernel else b"x" * (4096 * 3 + 10)
    assert got == head + b"x" * ((1 << 20) - len(head))


def test_the_boundary_waits_for_the_blocks_still_being_written(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker reads ahead of its writer thread: bytes before the boundary it reports must
    be on file (the caller edits them next), not merely read."""
    monkeypatch.setattr(splitcopy, "BLOCK", 1 << 20)
    monkeypatch.setenv("CKPT_MIGRATE_TEST_WRITE_DELAY", "0.2")
    dst = tmp_path / "dst.bin"
    copier = SplitCopy(source, dst)
    time.sleep(0.5)  # the reader is a block ahead of the slowed writer by now
    copier.restrict([(4 << 20, 5 << 20)])
    assert copier.boundary is not None and copier.boundary > 0
    with open(dst, "rb") as fh:
        assert fh.read(copier.boundary) == source.read_bytes()[: copier.boundary]
    copier.finish()
    assert dst.read_bytes() == source.read_bytes()


def test_edits_outside_the_ranges_survive_the_data_copy(source: Path, tmp_path: Path) -> None:
    ranges = [(0, 1 << 20), (2 << 20, 5 << 20)]
    dst = tmp_path / "dst.bin"
    copier = SplitCopy(source, dst)
    copier.restrict(ranges)
    with open(dst, "r+b") as fh:
        fh.seek((1 << 20) + 10)
        fh.write(b"edited")
    copier.finish()
    data = dst.read_bytes()
    assert data[(1 << 20) + 10 : (1 << 20) + 16] == b"edited"
    want = bytearray(source.read_bytes())
    want[(1 << 20) + 10 : (1 << 20) + 16] = b"edited"
    assert data == bytes(want)


def test_overlapping_ranges_are_refused(source: Path, tmp_path: Path) -> None:
    copier = SplitCopy(source, tmp_path / "dst.bin")
    with pytest.raises(ValueError, match="disjoint"):
        copier.restrict([(0, 2 << 20), (1 << 20, 3 << 20)])
    with pytest.raises(ValueError, match="past the end"):
        copier.restrict([(0, 10 << 20)])
    copier.abort()


def test_abort_stops_and_never_clobbers(source: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst.bin"
    copier = SplitCopy(source, dst)
    copier.abort()
    copier.abort()  # idempotent
    with pytest.raises(FileExistsError):
        SplitCopy(source, dst)


def test_the_worker_stops_when_its_parent_goes(source: Path, tmp_path: Path) -> None:
    copier = SplitCopy(source, tmp_path / "dst.bin")
    proc = copier._proc
    assert proc is not None and proc.stdin is not None
    proc.stdin.close()  # what the parent's death does to the pipe
    assert proc.wait(timeout=10) in (0, 3)  # done already, or stopped at the next block
    copier.abort()


def test_data_ranges_cover_exactly_the_stored_chunks(tmp_path: Path) -> None:
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "big", data=np.arange(300_000, dtype="f4"), chunks=(10_000,), **hdf5plugin.LZ4()
        )
        f.create_dataset("small", data=np.arange(10, dtype="f4"))
        f.create_dataset("other", data=np.ones(200_000, dtype="f8"), chunks=(50_000,))
    with h5py.File(path, "r") as f:
        ranges = data_ranges([f["big"], f["other"]], min_bytes=0)
        stored = f["big"].id.get_storage_size() + f["other"].id.get_storage_size()
        assert sum(b - a for a, b in ranges) == stored
        assert all(a < b for a, b in ranges)
        assert all(ranges[i][1] <= ranges[i + 1][0] for i in range(len(ranges) - 1))
        size = os.path.getsize(path)
        rest = complement(ranges, size)
        assert sum(b - a for a, b in rest) + stored == size
        assert data_ranges([f["small"]], min_bytes=1 << 20) == []


def test_a_worker_failure_is_one_error_not_a_traceback(source: Path, tmp_path: Path, capfd) -> None:
    copier = SplitCopy(source, tmp_path / "dst.bin")
    proc = copier._proc
    assert proc is not None and proc.stdin is not None
    proc.stdin.write("nonsense\n")
    proc.stdin.flush()
    assert proc.wait(timeout=10) == 1  # gone: finish() now writes into a broken pipe
    with pytest.raises(OSError, match="unexpected control line"):
        copier.finish()
    assert "Traceback" not in capfd.readouterr().err
