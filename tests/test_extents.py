"""Sharing the unchanged bytes (``engine/extents.py``): every copy method on a real filesystem.

The clone tests run on XFS (``reflink=1``) and btrfs made on a loop device at test time; where
that cannot be done (not root, no mkfs) they are skipped with the reason. The copy method and
the refusals run on whatever filesystem the temporary directory is on.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import one_line_error, release_of, run_cli, sha256_file
from loopfs import mounted, unavailable
from test_upgrade import assert_identical, assert_only_temporaries, only_result

import ckpt_migrate as cm
from ckpt_migrate.engine import copypatch, extents, writeback
from ckpt_migrate.engine.extents import Extents, Own, Shared
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.format.h5 import boundary, walkreads
from ckpt_migrate.format.h5 import root as h5root
from ckpt_migrate.format.provenance import PROVENANCE_ATTR

TENSORS = 24  # x 1 MiB of float32


def _checkpoint(path: Path) -> Path:
    """A 2.0 checkpoint of ~25 MB: its upgrade keeps every tensor (copy-patch)."""
    import torch

    gen = torch.Generator().manual_seed(3)
    state = {"model": {f"w{i}": torch.randn(512, 512, generator=gen) for i in range(TENSORS)}}
    path.parent.mkdir(parents=True, exist_ok=True)
    cm.save({**state, "global_step": 5}, path, "2.0")
    return path


@pytest.fixture(scope="module", params=["xfs", "btrfs"])
def reflink_dir(request, tmp_path_factory):
    reason = unavailable(request.param)
    if reason:
        pytest.skip(f"no {request.param} to share extents on: {reason}")
    try:
        with mounted(request.param, 400 << 20, tmp_path_factory.mktemp("fs")) as mnt:
            yield mnt
    except RuntimeError as exc:
        pytest.skip(f"cannot make a {request.param} filesystem here: {exc}")


@pytest.fixture
def on_reflink(reflink_dir):
    """A fresh checkpoint and an empty output directory on the sharing filesystem."""
    work = reflink_dir / f"t{time.monotonic_ns()}"
    src = _checkpoint(work / "src" / "ckpt.mdl")
    out = work / "out"
    out.mkdir()
    yield src, out
    shutil.rmtree(work, ignore_errors=True)


def _upgrade(*args: str | Path) -> dict:
    proc = run_cli("upgrade", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return only_result(proc)


def test_extents_share_whole_blocks_of_the_data_ranges_and_own_the_rest():
    e = Extents.copy_patch([(1000, 9000), (12288, 12300), (16384, 32768)], 40000, 4096)
    assert e.parts == (
        Own(0, 4096),
        Shared(4096, 4096, 4096),
        Own(8192, 8192),
        Shared(16384, 16384, 16384),
        Own(32768, 7232),
    )
    assert e.shared_bytes == 20480
    assert sum(p.length for p in e.parts) == e.size


@pytest.mark.parametrize("method", ["auto", "clone"])
def test_a_clone_writes_only_the_metadata_and_shares_every_tensor(on_reflink, method):
    src, out = on_reflink
    digest = sha256_file(src)
    res = _upgrade(src, "--output-dir", out, "--copy-method", method)
    target = out / src.name
    size = src.stat().st_size
    assert (res["status"], res["copy_method"]) == ("upgraded", "clone")
    assert res["bytes_shared"] >= 0.9 * size
    assert res["bytes_written"] <= 0.1 * size  # the metadata: a few hundred KB of 25 MB
    assert extents.shared_bytes(target) >= res["bytes_shared"]  # FIEMAP says so too
    assert release_of(target) == "2.10"
    assert_identical(src, target)
    assert sha256_file(src) == digest
    entry = json.loads(_root_attr(target, PROVENANCE_ATTR))[-1]
    assert entry["source_xxh3_128"] is None  # never read, so not hashed
    assert entry["source_identity"]["bytes"] == size


def test_verify_full_reads_a_cloned_output_back(on_reflink):
    src, out = on_reflink
    res = _upgrade(src, "--output-dir", out, "--verify", "full")
    assert (res["copy_method"], res["verified"]) == ("clone", "full")
    assert_identical(src, out / src.name)


def test_a_forced_copy_on_a_sharing_filesystem_shares_nothing(on_reflink):
    src, out = on_reflink
    res = _upgrade(src, "--output-dir", out, "--copy-method", "copy")
    assert (res["copy_method"], res["bytes_shared"]) == ("copy", 0)
    # the worker copies every tensor; the metadata part goes through copy_file_range, which
    # XFS may still answer with a shared block or two
    assert extents.shared_bytes(out / src.name) <= 0.01 * src.stat().st_size
    assert_identical(src, out / src.name)


def test_inplace_clones_and_keeps_the_original_as_its_backup(on_reflink):
    src, _ = on_reflink
    digest = sha256_file(src)
    res = _upgrade(src, "--inplace")
    assert (res["status"], res["copy_method"]) == ("upgraded", "clone")
    backup = Path(res["backup"])
    assert sha256_file(backup) == digest  # the original, by hard link: nothing copied
    assert release_of(src) == "2.10"
    assert extents.shared_bytes(src) >= res["bytes_shared"] > 0
    assert_identical(backup, src)


def test_a_clone_upgrade_walks_no_chunk_index_in_its_own_process(on_reflink, monkeypatch):
    """The chunk indexes are walked by the preflight children alone, while the output is made:
    the upgrading process reads none of them, so its cost is the metadata's, not the chunks'."""
    src, out = on_reflink
    log = out.parent / "walks.log"

    def spy(real):
        def recording(*args, **kwargs):
            with open(log, "a") as fh:
                fh.write(f"{os.getpid()} {real.__name__}\n")
            return real(*args, **kwargs)

        return recording

    monkeypatch.setattr(walkreads, "dataset_storage", spy(walkreads.dataset_storage))
    monkeypatch.setattr(boundary, "dataset_storage", spy(boundary.dataset_storage))
    monkeypatch.setattr(copypatch, "data_ranges", spy(copypatch.data_ranges))
    res = upgrade(src, UpgradeOptions(output_dir=out))
    assert (res.status, res.copy_method) == ("upgraded", "clone"), res.error
    pids = [int(line.split()[0]) for line in log.read_text().splitlines()]
    assert len(pids) >= TENSORS and os.getpid() not in pids  # the children's walks only
    assert_identical(src, out / src.name)


def _descriptors() -> set[str]:
    """This process's open descriptors, once the writeback threads have ended."""
    for thread in threading.enumerate():
        if thread.name == "ckpt-migrate writeback":
            thread.join(30)
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("layout", ["ours 2.0", "the 1.9 library's"])
def test_a_clones_edit_is_written_back_through_hdf5s_own_descriptor(
    on_reflink, real_layout_19, monkeypatch, layout
):
    """HDF5 truncates the file as it closes it, and XFS writes a file truncated down back at
    its next release, in that call: the edit's pages are sent on their way by the writeback's
    thread instead, through a second descriptor of HDF5's own open file (its close then no
    release), which also switched the root and which the thread closes. On one of our files
    and on a 1.9 file laid out as the 1.9 library wrote it (the deep benchmark's release)."""
    src, out = on_reflink
    if layout != "ours 2.0":
        src = shutil.copyfile(real_layout_19, src.parent / real_layout_19.name)
    handed: list[tuple[int, int, bytes]] = []
    real = copypatch.start_writeback

    def spy(file: Path | int) -> None:
        assert isinstance(file, int)
        head = os.pread(file, 512, 0)
        handed.append((os.fstat(file).st_ino, fcntl.fcntl(file, fcntl.F_GETFL), head))
        real(file)

    monkeypatch.setattr(copypatch, "start_writeback", spy)
    before = _descriptors()
    res = upgrade(src, UpgradeOptions(output_dir=out, inputs={"drop_dataloader_state": True}))
    assert (res.status, res.strategy, res.copy_method) == ("upgraded", "copy-patch", "clone")
    assert _descriptors() == before  # the kept descriptor closed by the thread
    ((inode, flags, head),) = handed
    target = out / src.name
    assert inode == target.stat().st_ino  # the temporary, published
    assert flags & os.O_ACCMODE == os.O_RDWR
    at, size = h5root.root_field(head)  # its superblock already names the new root
    assert int.from_bytes(head[at : at + size], "little") == _root_address(target)
    assert_identical(src, target)


def test_the_writeback_closes_a_descriptor_it_is_given_even_without_a_thread(tmp_path, monkeypatch):
    """Only a hint, raising nothing: a descriptor handed over is closed once the writeback is
    started, or at once where no thread can be started (the fsync writes the pages then)."""
    path = tmp_path / "f"
    path.write_bytes(b"x" * 8192)
    before = _descriptors()
    writeback.start_writeback(os.open(path, os.O_RDWR))
    assert _descriptors() == before

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    writeback.start_writeback(os.open(path, os.O_RDWR))
    writeback.start_writeback(path)
    assert _descriptors() == before


def test_a_refused_root_switch_closes_the_kept_descriptor(on_reflink, monkeypatch):
    src, out = on_reflink

    def refuse(*args: object, **kwargs: object) -> None:
        raise ValueError("the superblock names root 0x60, expected 0x30")

    monkeypatch.setattr(h5root, "switch_root", refuse)
    before = _descriptors()
    res = upgrade(src, UpgradeOptions(output_dir=out))
    assert res.status == "failed" and "cannot set the new root group" in str(res.error)
    assert _descriptors() == before
    assert list(out.iterdir()) == []


def test_a_rerun_of_upgrade_dir_knows_a_cloned_output_without_reading_the_source(on_reflink):
    src, out = on_reflink
    for expected in ("upgraded", "already-upgraded"):
        proc = run_cli("upgrade-dir", src.parent, "--output-dir", out, "--json")
        assert proc.returncode == 0, proc.stderr
        entries = [json.loads(line) for line in proc.stdout.splitlines()]
        (entry,) = [e for e in entries if e.get("source") == str(src)]
        assert entry["status"] == expected, entry


def test_a_kill_during_a_cloned_upgrade_leaves_the_source_and_no_output(on_reflink):
    src, out = on_reflink
    digest = sha256_file(src)
    target = out / src.name
    start = time.monotonic()
    _upgrade(src, "--output-dir", out)
    total = time.monotonic() - start
    target.unlink()
    leftovers: list[Path] = []
    for delay in [0.05 * total * i for i in range(1, 20, 2)]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckpt_migrate", "upgrade", str(src), "--output-dir", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert sha256_file(src) == digest, f"source changed (kill after {delay:.2f}s)"
        leftovers = assert_only_temporaries(out, {target.name}, src.name)
        if target.exists():  # published before the kill: complete
            assert_identical(src, target)
            target.unlink()
    res = _upgrade(src, "--output-dir", out)  # a rerun cleans up what the last kill left
    assert res["copy_method"] == "clone"
    # ... except an empty temporary younger than 10 s: a writer between creating and locking it
    # looks the same (atomic.remove_stale_temporaries), so it waits for a later run
    kept = assert_only_temporaries(out, {target.name}, src.name)
    assert all(p.stat().st_size == 0 and time.time() - p.stat().st_mtime < 10 for p in kept)
    removed = [w for w in res["warnings"] if "interrupted run left" in w]
    assert len(removed) + len(kept) == len(leftovers)
    assert_identical(src, target)


def test_clone_where_extents_cannot_be_shared_is_refused_in_one_line(tmp_path):
    src = _checkpoint(tmp_path / "src" / "ckpt.mdl")
    out = tmp_path / "out"
    out.mkdir()
    if extents.filesystem(out).clones:
        pytest.skip(f"{tmp_path} is on {extents.filesystem(out).name}, which can share extents")
    proc = run_cli("upgrade", src, "--output-dir", out, "--copy-method", "clone")
    line = one_line_error(proc, 2)
    assert "cannot share extents" in line and "--copy-method copy" in line
    assert list(out.iterdir()) == []  # not even a temporary
    res = _upgrade(src, "--output-dir", out)  # auto falls back to the copy
    assert (res["copy_method"], res["bytes_shared"]) == ("copy", 0)
    assert res["bytes_written"] == (out / src.name).stat().st_size
    assert_identical(src, out / src.name)


def test_the_plan_says_which_method_will_run(tmp_path):
    src = _checkpoint(tmp_path / "ckpt.mdl")
    proc = run_cli("upgrade", src, "--dry-run", "--json", "--copy-method", "copy")
    assert proc.returncode == 0, proc.stderr
    assert only_result(proc)["plan"]["copy_method"] == "copy"
    proc = run_cli("upgrade", src, "--copy-method", "share", "--output-dir", tmp_path)
    assert "--copy-method must be auto, clone or copy" in one_line_error(proc, 2)


def _root_address(path: Path) -> int:
    import h5py

    with h5py.File(path, "r", locking=False) as f:
        return h5root.object_address(f)


def _root_attr(path: Path, name: str) -> str:
    import h5py

    with h5py.File(path, "r", locking=False) as f:
        value = f.attrs[name]
    return value.decode() if isinstance(value, bytes) else str(value)
