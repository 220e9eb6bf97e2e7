"""HDF5's metadata cache stays small however many tensors a checkpoint has.

The cache's limit counts object headers by their size on disk; decoded in memory they take
several times that, so a cache that holds every header makes peak RSS grow with the tensor count
(the upgrade benchmark at a 4 MiB limit: 163 MiB with 1,552 tensors, 190 MiB with 2,832).
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import ckpt_migrate as cm
from ckpt_migrate.engine import upgrade as engine
from ckpt_migrate.format.h5 import io as h5io
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import iter_leaves

TENSORS = 3000  # their object headers together are larger than METADATA_CACHE_MAX
# Enough data per tensor that an upgrade keeps the file and patches its metadata (copy-patch)
# instead of writing a new one.
VALUES = 1024


@pytest.fixture(scope="module")
def many_tensors(tmp_path_factory):
    path = tmp_path_factory.mktemp("many") / "checkpoint_1.mdl"
    state = {f"layer{i}.weight": np.full(VALUES, i, np.float32) for i in range(TENSORS)}
    cm.save({"model": state, "global_step": 1}, path, "1.9")
    return path


def cache_bytes(f: h5py.File) -> int:
    _max_size, _min_clean_size, cur_size, _entries = f.id.get_mdc_size()
    return cur_size


def read_every_header(f: h5py.File) -> int:
    """Open every dataset and read its attributes, as a reader does; return the cache's size."""
    for name in f:
        dict(f[name].attrs)
    return cache_bytes(f)


def test_the_cache_holds_at_most_its_cap_where_hdf5s_default_holds_more(many_tensors):
    with h5py.File(many_tensors, "r") as f:
        default = read_every_header(f)
    with h5io.open_read(many_tensors) as f:
        cap = f.id.get_mdc_config().max_size
        assert cap == h5io.METADATA_CACHE_MAX + h5io.root_name_heap(f)
        capped = read_every_header(f)
    assert default > cap >= capped


def test_the_reader_and_the_upgrade_work_within_the_cap(many_tensors, tmp_path):
    with read_checkpoint(many_tensors) as ckpt:
        assert sum(1 for _ in iter_leaves(ckpt.root)) == TENSORS + 1
        assert cache_bytes(ckpt.handle.file()) <= h5io.METADATA_CACHE_MAX
    out = tmp_path / "out"
    out.mkdir()
    result = engine.upgrade(
        many_tensors,
        engine.UpgradeOptions(
            output_dir=out, verify="full", inputs={"drop_dataloader_state": True}
        ),
    )
    assert result.status == "upgraded", result.error
    # The metadata of every tensor was patched through the capped cache, and every tensor of
    # the output hashes as its source does.
    assert (result.strategy, result.verified, result.tensors) == ("copy-patch", "full", TENSORS)


def test_a_root_of_many_names_keeps_its_name_heap_in_the_cache(tmp_path):
    """h5py's default root keeps every link name in one local heap, which HDF5 reads whole for
    each look-up by name: a cache smaller than the heap read it again on every look-up (0.44
    ms each at 62k links, against 0.04), so that a 50k-tensor upgrade was quadratic (issue
    33). The cap leaves room for it."""
    path = tmp_path / "names.h5"
    names = [f"model.layers.{i}.{'x' * 100}.weight" for i in range(10_000)]
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=np.zeros(4))
        for name in names:
            f[name] = f["d"]
    with h5io.open_read(path) as f:
        heap = h5io.root_name_heap(f)
        assert heap > h5io.METADATA_CACHE_MAX
        assert f.id.get_mdc_config().max_size >= h5io.METADATA_CACHE_MAX + heap
        f.id.reset_mdc_hit_rate_stats()
        for name in names[::10]:
            h5py.h5o.open(f.id, name.encode())
        assert f.id.get_mdc_hit_rate() > 0.9


def test_a_group_being_filled_keeps_its_name_heap_in_the_cache(tmp_path):
    """The copy-patch links every tensor into a fresh root while it looks each one up in the
    old: a cache with room for the old root's heap alone evicted the new one's, wrote it whole
    and read it again for the next link (half the look-ups missed: 7.4 s for these 10k links,
    against 0.09 s; 136 s against 39 s for a 50k-tensor upgrade, issue 33)."""
    path = tmp_path / "names.h5"
    names = [f"model.layers.{i}.{'x' * 100}.weight" for i in range(10_000)]
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=np.zeros(4))
        for name in names:
            f[name] = f["d"]
    with h5io.bounded_metadata_cache(h5py.File(path, "r+")) as f:
        fresh = f.create_group("fresh")
        room = h5io.GroupNameRoom(f, fresh)
        f.id.reset_mdc_hit_rate_stats()
        for name in names:
            room.added()
            fresh.id.links.create_hard(name.encode(), f.id, name.encode())
        heap = h5py.h5o.get_info(fresh.id).meta_size.obj.heap_size
        assert heap > h5io.METADATA_CACHE_MAX
        assert f.id.get_mdc_hit_rate() > 0.9
        # the room is the two heaps' (and a quarter more for the growing one), no more
        cap = f.id.get_mdc_config().max_size
        assert cap <= h5io.METADATA_CACHE_MAX + h5io.root_name_heap(f) + heap * 5 // 4


def test_a_new_style_group_gets_no_room(tmp_path):
    """A group keeping its names in a fractal heap (as ``create_wide_root`` makes one) finds a
    name through a B-tree of hashes and reads the heap block by block: room for the whole heap
    would only hold more object headers."""
    with h5io.bounded_metadata_cache(h5py.File(tmp_path / "new.h5", "w", libver="latest")) as f:
        f.create_dataset("d", data=np.zeros(4))
        fresh = f.create_group("fresh")
        cap = f.id.get_mdc_config().max_size
        room = h5io.GroupNameRoom(f, fresh)
        for i in range(3 * room.EVERY):
            room.added()
            fresh[f"model.layers.{i}.{'x' * 100}.weight"] = f["d"]
        assert h5py.h5o.get_info(fresh.id).meta_size.obj.heap_size > 0
        assert f.id.get_mdc_config().max_size == cap


def test_heaps_that_fit_leave_the_cache_as_it_was(tmp_path):
    """While both heaps of names fit in the 1 MiB, the cache keeps its size (and the file being
    written its bytes: HDF5's flush order decides where metadata goes)."""
    path = tmp_path / "few.h5"
    names = [f"model.layers.{i}.weight" for i in range(2_000)]
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=np.zeros(4))
        for name in names:
            f[name] = f["d"]
    with h5io.bounded_metadata_cache(h5py.File(path, "r+"), 0) as f:
        fresh = f.create_group("fresh")
        room = h5io.GroupNameRoom(f, fresh)
        for name in names:
            room.added()
            fresh.id.links.create_hard(name.encode(), f.id, name.encode())
        assert f.id.get_mdc_config().max_size == h5io.METADATA_CACHE_MAX
