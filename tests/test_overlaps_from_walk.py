"""The overlap map (``h5.overlaps``) taken from the preflight children's walk (issue 33): they
walk every chunk index anyway, each over its share of the objects, so the reader does not walk
them all again. What they hand over must be what the reader's own walk finds, extent for
extent, on files the project did not write and on damaged ones."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import shipped_checkpoints
from test_chunks import _contiguous_address, _index_entry, _patch

import ckpt_migrate as cm
from ckpt_migrate.errors import CkptError, CorruptCheckpointError
from ckpt_migrate.format.h5 import overlaps, preflight
from ckpt_migrate.format.h5.identity import file_identity
from ckpt_migrate.format.h5.metadata import metadata_extents, unreferenced_collections


def _pairs(starts: np.ndarray, ends: np.ndarray) -> Counter:
    return Counter(zip(starts.tolist(), ends.tolist(), strict=True))


def _walked(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Counter, np.ndarray] | None:
    """(the stored pieces the children handed over with the metadata they name mapped and the
    global heap collections between them, the overlap starts the reader then finds without a
    walk of its own), or None when a child met content the reader refuses (and so handed
    nothing over)."""
    seen = []
    remember = overlaps.remember
    monkeypatch.setattr(overlaps, "remember", lambda *a: (seen.append(a), remember(*a)))
    overlaps._SHARED.clear()
    found = preflight.preflight(path)
    monkeypatch.setattr(overlaps, "remember", remember)
    if found is None:
        return None
    assert len(seen) == 1, path
    key, data, objects = seen[0]
    assert key == file_identity(path)
    pieces = _pairs(data.starts_array(), data.ends_array())
    with h5py.File(path, "r", locking=False) as f:
        pieces.update(zip(*metadata_extents(f, objects), strict=True))
        known = np.array(list(pieces), np.uint64).reshape(-1, 2)
        pieces.update(zip(*unreferenced_collections(f, known[:, 0], known[:, 1]), strict=True))
        with monkeypatch.context() as m:
            m.setattr(overlaps, "_stored_extents", _no_second_walk)
            starts = overlaps.shared_starts(f)
    return pieces, starts


def _direct(path: Path) -> tuple[Counter, np.ndarray]:
    with h5py.File(path, "r", locking=False) as f:
        starts, ends = overlaps._stored_extents(f)
    return _pairs(starts, ends), overlaps._overlapping(starts, ends)


def test_the_walk_hands_over_what_the_reader_would_find(tmp_path, monkeypatch):
    """Every checkpoint the project ships (the real library's 2.6-2.10 files, Model Zoo's key
    layouts, every release's legacy layouts) and a file of many tied and scalar tensors: the
    same stored pieces as the reader's own walk, each once, and the objects whose metadata it
    maps."""
    made = tmp_path / "many.mdl"
    rng = np.random.default_rng(0)
    shared = rng.random((40, 8), dtype=np.float32)
    state = {f"w{i}": rng.random((i + 1, 8), dtype=np.float32) for i in range(60)}
    state |= {"tied_a": shared, "tied_b": shared, "step": 7, "scale": np.float32(2.5)}
    cm.save({"model": state}, made, "2.0")
    files = [*shipped_checkpoints(tmp_path), made]
    assert len(files) > 20
    walked = 0
    for path in files:
        if (handed := _walked(path, monkeypatch)) is None:
            with pytest.raises(CkptError):  # (the fixtures of files every reader refuses)
                cm.load(path)
            continue
        pieces, starts = handed
        walked += 1
        direct, direct_starts = _direct(path)
        assert pieces == direct, path
        assert np.array_equal(starts, direct_starts), path
    assert walked > 20


def test_a_chunk_moved_onto_another_tensors_chunk_is_found_by_the_walk(tmp_path, monkeypatch):
    """The children each walk a share of the datasets: two tensors' chunks in different shares
    still meet in one map, and the read refuses the moved one as before."""
    src = tmp_path / "two.mdl"
    rng = np.random.default_rng(1)
    state = {k: rng.random((4, 4), dtype=np.float32) for k in ("a", "b", "c", "d")}
    cm.save(state, src)
    at, _ = _index_entry(src, "a", 0)
    _, other = _index_entry(src, "d", 0)
    _patch(src, at + 8 + 8 * 3, struct.pack("<Q", other.byte_offset))
    _, starts = _walked(src, monkeypatch)
    _, direct_starts = _direct(src)
    assert other.byte_offset in starts.tolist()
    assert np.array_equal(starts, direct_starts)
    monkeypatch.setattr(overlaps, "_stored_extents", _no_second_walk)
    with pytest.raises(CorruptCheckpointError, match=r"'a', chunk \(0, 0\): shares its stored"):
        cm.load(src)["a"].sum()


def test_data_moved_into_metadata_is_found_by_the_walk(tmp_path, monkeypatch):
    """A 0-d tensor's address moved into a chunk index node: the metadata the children map
    holds it, and the read refuses it without a walk of its own."""
    src = tmp_path / "checkpoint_1.mdl"
    rng = np.random.default_rng(0)
    cm.save(
        {"w": rng.random((64, 64), np.float32), "scale": np.array(3.5, np.float32)}, src, "2.10"
    )
    at, _ = _contiguous_address(src, "scale")
    inside = src.read_bytes().index(b"TREE") + 600
    _patch(src, at, struct.pack("<Q", inside))
    _, starts = _walked(src, monkeypatch)
    assert inside in starts.tolist()
    monkeypatch.setattr(overlaps, "_stored_extents", _no_second_walk)
    with pytest.raises(CorruptCheckpointError, match="'scale': its data at byte"):
        cm.load(src)


def test_a_file_changed_after_the_walk_is_walked_again(tmp_path, monkeypatch):
    """The children's map is kept for the file they walked: a file rewritten meanwhile (another
    size or time) is mapped by the reader itself."""
    src = tmp_path / "c.mdl"
    cm.save({"w": np.ones((8, 8), np.float32)}, src)
    walk = preflight._Walk.begin(src)
    cm.save({"w": np.ones((16, 8), np.float32)}, tmp_path / "other.mdl")
    (tmp_path / "other.mdl").replace(src)
    overlaps._SHARED.clear()
    try:
        walk.conclude(src)
    finally:
        walk.cancel()
    assert file_identity(src) not in overlaps._SHARED


def _no_second_walk(f: h5py.File) -> None:
    raise AssertionError("the reader walked every chunk index again")


def test_the_overlapping_starts_are_every_pair_of_extents_that_meet():
    """``overlaps._overlapping`` sorts the arrays it is given where they are; what it finds
    is what comparing every pair of extents finds: the start of each non-empty extent that
    meets another (ties, nesting, empty extents and the last address included)."""
    import random

    rng = random.Random(33)
    for case in range(300):
        n = rng.randint(0, 40)
        top = rng.choice([50, 1000, (1 << 64) - 1])
        starts = [rng.randint(0, top - 1) for _ in range(n)]
        ends = [min(s + rng.choice([0, 1, 3, 20, 400]), top) for s in starts]
        if n and case % 7 == 0:
            starts.append(starts[0])
            ends.append(ends[0])  # the same extent twice
        want = {
            s
            for i, (s, e) in enumerate(zip(starts, ends, strict=True))
            if e > s
            and any(
                j != i and f > t and s < f and t < e
                for j, (t, f) in enumerate(zip(starts, ends, strict=True))
            )
        }
        found = overlaps._overlapping(
            np.array(starts, dtype=np.uint64), np.array(ends, dtype=np.uint64)
        )
        assert sorted(want) == found.tolist(), case


def test_the_overlap_map_leaves_numpy_ma_unloaded():
    """Making the map of overlapping data (``H5Handle.ready_to_read``) of the real library's
    2.10 file and a 1.9 file imports no module: ``np.unique`` imported ``numpy.ma`` on first
    use, and its objects, made amid a 150k-tensor tree, kept that tree's memory from being
    given back (issue 33). ``sorted_once`` is ``np.unique``."""
    import subprocess
    import sys

    from ckpt_migrate.format.h5.metadata import sorted_once

    rng = np.random.default_rng(33)
    for n in (0, 1, 2, 7, 500):
        values = rng.integers(0, 20, n, dtype=np.uint64)
        assert sorted_once(values).tolist() == np.unique(values).tolist()
        assert sorted_once(values).dtype == np.uint64
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    script = (
        "import sys\n"
        "from ckpt_migrate.format.read import read_checkpoint\n"
        "for path in sys.argv[1:]:\n"
        "    with read_checkpoint(path, defer_chunks=True) as ckpt:\n"
        "        before = set(sys.modules)\n"
        "        ckpt.handle.ready_to_read()\n"
        "        print(path, sorted(set(sys.modules) - before))\n"
    )
    files = [fixtures / "real-cstorch-2.10" / "basic.mdl", fixtures / "release-1.9.mdl"]
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, files)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{p} []" for p in files]
