"""HDF5's metadata cache stays small however many tensors a checkpoint has.

The cache's limit counts object headers by their size on disk; decoded in memory they take
several times that, so a cache that holds every header makes peak RSS grow with the tensor count
(the upgrade benchmark at a 4 MiB limit: 163 MiB with 1,552 tensors, 190 MiB with 2,832).
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import MODELS, REAL, real_2x_files, same_bytes

import ckpt_migrate as cm
from ckpt_migrate.engine import upgrade as engine
from ckpt_migrate.errors import CkptError
from ckpt_migrate.format import releases
from ckpt_migrate.format.h5 import io as h5io
from ckpt_migrate.format.h5 import metadata_cache, unnamed
from ckpt_migrate.format.h5 import root as h5root
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import iter_leaves
from ckpt_migrate.format.write import prepare, root_attributes, write_tree

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
        assert cap == metadata_cache.METADATA_CACHE_MAX + metadata_cache.root_name_heap(f)
        capped = read_every_header(f)
    assert default > cap >= capped


def test_the_reader_and_the_upgrade_work_within_the_cap(many_tensors, tmp_path):
    with read_checkpoint(many_tensors) as ckpt:
        assert sum(1 for _ in iter_leaves(ckpt.root)) == TENSORS + 1
        assert cache_bytes(ckpt.handle.file()) <= metadata_cache.METADATA_CACHE_MAX
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


@pytest.mark.parametrize("source", ["ours", "real 2.10", "real 2.9"])
def test_a_handle_let_go_of_opens_its_file_again_and_refuses_another(
    many_tensors, tmp_path, source
):
    """``H5Handle.let_go`` closes the file, and HDF5's caches of it with it (an upgrade lets go
    of its source while its output is read back); the next read opens it again and reads the
    same values, and a file that replaced it meanwhile is refused, not read in its place: a
    legacy file of ours, the real 2.10 library's and the real 2.9 trainer's."""
    import lzma
    import shutil

    from ckpt_migrate.errors import CorruptCheckpointError
    from ckpt_migrate.format.tree import TensorLeaf

    path = tmp_path / "c.mdl"
    if source == "ours":
        shutil.copyfile(many_tensors, path)
    elif source == "real 2.10":
        shutil.copyfile(REAL / "dtypes.mdl", path)
    else:
        xz = REAL.parent / "real-cstorch-2.6-2.9" / "trainer-2.9.0.mdl.xz"
        path.write_bytes(lzma.decompress(xz.read_bytes()))
    with read_checkpoint(path) as ckpt:
        tensors = [r.leaf for r in iter_leaves(ckpt.root) if isinstance(r.leaf, TensorLeaf)]
        first, last = tensors[0], tensors[-1]
        want = first.data.read(), last.data.read()
        opened = ckpt.handle.file()
        ckpt.handle.let_go()
        assert not opened.id.valid
        got = first.data.read(), last.data.read()  # opened again
        assert [a.tobytes() for a in want] == [b.tobytes() for b in got]
        ckpt.handle.let_go()
        shutil.copyfile(path, tmp_path / "copy.mdl")
        (tmp_path / "copy.mdl").replace(path)  # the same bytes, another file
        with pytest.raises(CorruptCheckpointError, match="replaced while it was read"):
            last.data.read()


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
        heap = metadata_cache.root_name_heap(f)
        assert heap > metadata_cache.METADATA_CACHE_MAX
        assert f.id.get_mdc_config().max_size >= metadata_cache.METADATA_CACHE_MAX + heap
        f.id.reset_mdc_hit_rate_stats()
        for name in names[::10]:
            h5py.h5o.open(f.id, name.encode())
        assert f.id.get_mdc_hit_rate() > 0.9


def test_a_new_style_root_gets_no_room_for_its_names(tmp_path):
    """A format 0.5 root of many names keeps them in a fractal heap, found block by block
    through a B-tree of their hashes, never read whole: room for it in a reader's cache only
    let the cache keep that much more of the datasets' headers (11 MB of room at 112k
    tensors, 63 MB more held decoded while an export read them, issue 33). Every tensor is
    still found by its name, and the cache stays within its cap."""
    path = tmp_path / "wide.h5"
    names = [f"model.layers.{i}.{'x' * 100}.weight" for i in range(12_000)]
    with h5py.File(path, "w", libver=("v108", "latest")) as f:  # (as ``create_wide_root``)
        for i, name in enumerate(names):
            f.create_dataset(name, data=np.full(2, i, np.float32))
    with h5io.open_read(path) as f:
        assert metadata_cache.root_name_heap(f, local_only=True) == 0
        assert metadata_cache.root_name_heap(f) > metadata_cache.METADATA_CACHE_MAX
        assert f.id.get_mdc_config().max_size == metadata_cache.METADATA_CACHE_MAX
        for i in range(0, len(names), 7):
            assert f[names[i]][0] == i
        assert cache_bytes(f) <= metadata_cache.METADATA_CACHE_MAX
    # The real 2.10 library's files (h5py's defaults: an old-style root, a local heap) keep
    # the room for their names
    for path in sorted(REAL.glob("*.mdl")):
        with h5io.open_read(path) as f:
            heap = metadata_cache.root_name_heap(f, local_only=True)
            assert heap == metadata_cache.root_name_heap(f) > 0, path.name
            assert f.id.get_mdc_config().max_size == metadata_cache.METADATA_CACHE_MAX + heap


def _heap_bytes(names: list[str]) -> int:
    return sum((len(n) + 8) // 8 * 8 for n in names)


def _fill(path, names: list[str], room: bool) -> h5py.File:
    """Link every name of the root into a fresh group, through a 1 MiB cache, counting each
    link with ``GroupNameRoom`` when ``room``, as the copy-patch does; the file stays open."""
    f = metadata_cache.bounded_metadata_cache(h5py.File(path, "r+"), 0)
    heap = metadata_cache.root_name_heap(f, local_only=True)  # (an old-style root: all of it)
    fresh = f.create_group("fresh")
    counted = metadata_cache.GroupNameRoom(f, heap, local=True)
    f.id.reset_mdc_hit_rate_stats()
    for name in names:
        if room:
            counted.added(name)
        fresh.id.links.create_hard(name.encode(), f.id, name.encode())
    return f


def _names_file(path, names: list[str]) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=np.zeros(4))
        for name in names:
            f[name] = f["d"]


def test_a_group_being_filled_keeps_its_name_heap_in_the_cache(tmp_path):
    """The copy-patch links every tensor into a fresh root while it looks each one up in the
    old: a cache with room for the old root's heap alone evicted the new one's, wrote it whole
    and read it again for the next link (half the look-ups missed: 7.4 s for these 10k links,
    against 0.09 s; 105 s against 30 s for a 50k-tensor upgrade, issue 33)."""
    path = tmp_path / "names.h5"
    names = [f"model.layers.{i}.{'x' * 100}.weight" for i in range(10_000)]
    _names_file(path, names)
    with _fill(path, names, room=True) as f:
        assert f.id.get_mdc_hit_rate() > 0.9  # (before the heap is asked for: a walk of its own)
        heap = h5py.h5o.get_info(f["fresh"].id).meta_size.obj.heap_size
        assert heap > metadata_cache.METADATA_CACHE_MAX
        # HDF5 doubles a full heap: the reckoning's bound holds, and the room is no more
        assert heap <= 2 * _heap_bytes(names)
        root = (
            f.id.get_mdc_config().max_size
            - metadata_cache.METADATA_CACHE_MAX
            - 2 * _heap_bytes(names)
        )
        assert 0 < root <= metadata_cache.root_name_heap(f)


def test_heaps_that_fit_leave_the_file_as_it_was(tmp_path):
    """While both heaps of names fit in the 1 MiB, the cache keeps its size, and the file its
    bytes (the order HDF5 flushes metadata in decides where it goes: asking HDF5 for the
    group's heap, a walk of its B-tree through the cache, changed them)."""
    names = [f"model.layers.{i}.weight" for i in range(5_000)]
    paths = [tmp_path / "counted.h5", tmp_path / "plain.h5"]
    _names_file(paths[0], names)
    paths[1].write_bytes(paths[0].read_bytes())
    for path, room in zip(paths, (True, False)):
        with _fill(path, names, room) as f:
            assert f.id.get_mdc_config().max_size == metadata_cache.METADATA_CACHE_MAX
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_only_an_old_style_fresh_root_gets_room(tmp_path):
    """The copy-patch counts names (``local``) for the fresh root ``create_fresh_root`` makes
    while the root attributes track their order: an old-style group, its names in one local
    heap (a symbol table message). Past that it is ``create_wide_root``'s, new-style, whose
    names are found by their hashes and read block by block."""
    symbol_table = 1 << metadata_cache.SYMBOL_TABLE_MESSAGE
    path = tmp_path / "roots.h5"
    with h5py.File(path, "w") as f:
        assert h5root.tracks_order(10)
        fresh = h5root.create_fresh_root(f, 10)
        assert h5py.h5o.get_info(fresh.id).hdr.mesg.present & symbol_table
    wide = h5root.MAX_TRACKED_ATTRIBUTES + 1
    assert not h5root.tracks_order(wide)
    path.unlink()
    with h5py.File(path, "w"):
        pass
    h5root.create_wide_root(path)
    with h5py.File(path, "r+") as f:
        fresh = h5root.create_fresh_root(f, wide)
        assert not h5py.h5o.get_info(fresh.id).hdr.mesg.present & symbol_table
    # nor an old root of that kind: ``local_only`` counts none of its heap
    with h5py.File(path, "w", libver="latest") as f:
        for i in range(100):
            f[f"model.layers.{i}.{'x' * 100}.weight"] = 1
        assert metadata_cache.root_name_heap(f) > 0
        assert metadata_cache.root_name_heap(f, local_only=True) == 0


def _written(tree, release, path, *, capped: bool, monkeypatch) -> tuple[int, int]:
    """``tree`` written to ``path`` as the writers write it (``create_file``), with the cache
    capped or (``capped`` False) HDF5's default: (the cache's size at the end, its cap)."""
    with monkeypatch.context() as m:
        if not capped:
            m.setattr(h5root, "bounded_metadata_cache", lambda f, names=None: f)
        attributes = root_attributes(tree, release, {})
        with h5root.create_file(path, exclusive=True, attributes=attributes) as f:
            write_tree(f, tree, release)
            return cache_bytes(f), f.id.get_mdc_config().max_size


def _contents(path) -> list:
    """Everything a reader sees: the root attributes in their order, and every group's and
    dataset's attributes, and each dataset's type, shape and bytes."""
    with h5py.File(path, "r") as f:
        found: list = [("/", [(k, repr(v)) for k, v in f.attrs.items()])]

        def visit(name: str, obj) -> None:
            attrs = [(k, repr(v)) for k, v in obj.attrs.items()]
            if isinstance(obj, h5py.Group):
                found.append((name, attrs))
                return
            if obj.shape is None:  # (an empty dataset: a pickled object's attributes only)
                data = None
            elif obj.dtype.kind == "O":
                data = obj[()]
            else:
                data = bytes(np.ascontiguousarray(obj[()]).data)
            found.append((name, obj.dtype.str, obj.shape, data, attrs))

        f.visititems(visit)
        return found


def test_a_new_file_is_written_through_the_capped_cache(many_tensors, tmp_path, monkeypatch):
    """Every writer creates its file with ``create_file`` (the rewrite, ``save``, ``import-hf``,
    the TensorFlow converter): each object header is written once, and HDF5's default cache
    held 350 MB of a 150k-tensor rewrite's 1.1 GB (issue 33). Capped as a reader's is. What a
    reader sees is the same; the bytes are the same where the metadata fits the cap (the real
    library's files and the model fixtures), and laid out otherwise where it does not."""
    release = releases.get("2.10")
    sources = [many_tensors, *sorted(REAL.glob("*.mdl")), MODELS / "llama-2.0/checkpoint_100.mdl"]
    compared = 0
    for i, src in enumerate(sources):
        try:
            with read_checkpoint(src) as ckpt:
                tree, _ = prepare(ckpt.root, release, path=src)
                default, ours = tmp_path / f"{i}-default.mdl", tmp_path / f"{i}-ours.mdl"
                default_size, _ = _written(
                    tree, release, default, capped=False, monkeypatch=monkeypatch
                )
                ours_size, cap = _written(tree, release, ours, capped=True, monkeypatch=monkeypatch)
        except CkptError:  # (keys the real writer itself let collide: refused for 0.5)
            continue
        assert cap == metadata_cache.METADATA_CACHE_MAX
        compared += 1
        assert _contents(default) == _contents(ours), src.name
        if src == many_tensors:
            assert default_size > metadata_cache.METADATA_CACHE_MAX >= ours_size
        else:
            assert same_bytes(default) == same_bytes(ours), src.name
    assert compared == len(sources) - 2  # (two real files hold keys that collide in 0.5)


def _long_names_tree(count: int, length: int):
    """A tree of ``count`` scalars and small tensors whose names fill more than the cache's
    1 MiB of link names (a checkpoint of tens of thousands of tensors, in a few thousand)."""
    from ckpt_migrate.format.tree import DictNode, MemoryData, TensorLeaf, ValueLeaf

    pad = "x" * length
    leaves = []
    for i in range(count):
        data = TensorLeaf("float32", (2,), MemoryData(np.full(2, i, np.float32)))
        leaves.append((f"{pad}.{i}", data if i % 2 else ValueLeaf(i)))
    return DictNode([("model", DictNode(leaves))])


@pytest.mark.parametrize(("release", "length"), [("2.4", 400), ("2.10", 1000)])
def test_a_writer_filling_an_old_style_root_keeps_its_name_heap_in_the_cache(
    tmp_path, monkeypatch, release, length
):
    """Every writer fills the root ``create_file`` made, an old-style group (one local heap of
    link names) while its attributes track their order: every format 0.1-0.4 file and a 0.5
    file of up to about 50k leaves. Through the 1 MiB cache, each link added past a heap of
    1 MiB evicted the heap, wrote it whole and read it again for the next one: quadratic (a
    40k-tensor 2.4 source took 88 s to write and 252 MB on disk, its rewrite to 2.10 116 s,
    against 60 s and 119 MB, 52 s with the room; issue 33). The writers tell ``names_room`` of
    every link, so the cache makes room for the heap as it grows, and the file reads the same.
    (Format 0.5 links only tensors, half the leaves: their names are longer.) Without a room
    given, ``write_tree`` makes that one: a writer cannot forget it."""
    tree, rel = _long_names_tree(3000, length), releases.get(release)
    attributes = root_attributes(tree, rel, {})
    assert h5root.tracks_order(attributes)
    found = []
    for room in (True, False):
        path = tmp_path / f"{room}.mdl"
        with monkeypatch.context() as m:
            if not room:  # (as every writer but the copy-patch wrote before)
                m.setattr(metadata_cache.GroupNameRoom, "added", lambda self, name: None)
            with h5root.create_file(path, exclusive=True, attributes=attributes) as f:
                f.id.reset_mdc_hit_rate_stats()
                write_tree(f, tree, rel)
                heap = metadata_cache.root_name_heap(f, local_only=True)
                found.append((f.id.get_mdc_hit_rate(), f.id.get_mdc_config().max_size, heap))
        assert heap > metadata_cache.METADATA_CACHE_MAX
    (hits, size, heap), (hits_without, size_without, _) = found
    assert size >= heap > size_without == metadata_cache.METADATA_CACHE_MAX
    assert hits > 0.95 > hits_without
    assert _contents(tmp_path / "True.mdl") == _contents(tmp_path / "False.mdl")
    assert (tmp_path / "True.mdl").stat().st_size < (tmp_path / "False.mdl").stat().st_size


@pytest.mark.parametrize("libver", ["earliest", "latest"])
def test_the_datasets_no_leaf_uses_are_found_in_hdf5s_own_order(tmp_path, libver):
    """``datasets_not_in`` visits the links in HDF5's own order (by name, HDF5 first builds a
    sorted table of a dense group's links: 35 MiB at 188k, issue 33) and answers sorted, as
    before: every name of every dataset not used, at any depth, ties by each name; groups
    never; on old-style groups and on dense new-style ones (``latest``: more than 8 links)."""
    rng = np.random.default_rng(3)
    names = [f"t{i}" for i in rng.permutation(40)]
    path = tmp_path / "f.h5"
    with h5py.File(path, "w", libver=libver) as f:
        for name in names:
            f[name] = np.zeros(2, np.float32)
        inner = f.create_group("g")
        for i in rng.permutation(12):
            inner[f"u{i}"] = np.ones(3)
        f["tie"] = f["t3"]  # a second name of one dataset
        inner["tie"] = f["t5"]
    used = {"t1", "t3", "g/u2", "t5"}
    with h5py.File(path, "r") as f:
        every = []
        f.visititems(lambda n, o: every.append(n) if isinstance(o, h5py.Dataset) else None)
        want = sorted({*every, "tie", "g/tie"} - used)  # (visititems names an object once)
        assert unnamed.datasets_not_in(f, used, recursive=True) == want
        top = sorted(n for n in [*names, "tie"] if n not in used)
        assert unnamed.datasets_not_in(f, used, recursive=False) == top


def test_the_datasets_no_leaf_uses_are_found_without_opening_the_used_ones(tmp_path):
    """Only the links outside ``used`` are opened: HDF5's own recursive visit read every
    object's header to learn its type (2.9 s and 17 MiB at 188k leaves, issue 33), so that a
    damaged header among the used datasets stopped it; a group linked into itself, or the
    root linked from below, is visited once."""
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f["a"] = np.zeros(4, np.float32)
        f["b"] = np.ones(4)
        inner = f.create_group("g")
        inner["c"] = np.ones(2)
        inner["loop"], inner["up"] = inner, f
        address = h5py.h5o.get_info(f["a"].id).addr
    with open(path, "r+b") as raw:
        raw.seek(address)
        raw.write(b"\xff" * 16)
    with h5py.File(path, "r") as f:
        assert unnamed.datasets_not_in(f, {"a"}, recursive=True) == ["b", "g/c"]
        assert unnamed.datasets_not_in(f, {"a", "b"}, recursive=False) == []


def test_the_datasets_no_leaf_uses_in_the_real_librarys_files_are_those_h5py_finds(tmp_path):
    """The real library's 2.10 and 2.6-2.9 files and the legacy Model Zoo fixtures: with
    nothing used, every dataset h5py's own walk finds (each name of a tie); with every other
    one used, the rest."""
    paths = [*sorted(REAL.glob("*.mdl")), *real_2x_files(tmp_path), *sorted(MODELS.glob("*/*.mdl"))]
    assert len(paths) > 20
    for path in paths:
        with h5py.File(path, "r", locking=False) as f:
            every = _dataset_links(f)
            assert unnamed.datasets_not_in(f, set(), recursive=True) == every, path.name
            used = set(every[::2])
            rest = [n for n in every if n not in used]
            assert unnamed.datasets_not_in(f, used, recursive=True) == rest, path.name


def _dataset_links(f: h5py.File) -> list[str]:
    """Every link to a dataset, at any depth (each name of a dataset linked twice), sorted."""
    found: list[str] = []
    f.visit_links(lambda n: found.append(n) if isinstance(f.get(n), h5py.Dataset) else None)
    return sorted(found)


def test_a_file_open_in_h5py_is_said_to_be_open_not_damaged(tmp_path):
    """A notebook that looked at the file with h5py's defaults and then loads it: HDF5 shares
    one open file per process and refuses the reader's other locking setting; that is said, with
    the two ways out, instead of calling a sound file truncated or corrupted."""
    src = REAL / "basic.mdl"
    with h5py.File(src, "r"):
        with pytest.raises(CkptError) as err:
            read_checkpoint(src)
        assert type(err.value).__name__ == "UsageError"
        assert "already open in this process" in str(err.value)
        assert "locking=False" in str(err.value)
        assert "corrupted" not in str(err.value)
    with h5py.File(src, "r", locking=False), read_checkpoint(src) as ckpt:
        assert ckpt.release.name == "2.10"
