"""A damaged chunk is an error, never garbage (issue #36): every chunk a read decodes is checked
against its index entry and the dataset's shape first (``format/h5/chunks.py``)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import pytest
from conftest import FIXTURES, REAL, one_line_error, real_2x_files, run_cli

import ckpt_migrate as cm
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.errors import CorruptCheckpointError
from ckpt_migrate.format.h5.io import read_slab
from ckpt_migrate.format.h5.metadata import metadata_extents


def _saved(tmp_path: Path) -> Path:
    src = tmp_path / "checkpoint_1.mdl"
    rng = np.random.default_rng(0)
    cm.save({"model": {"w": rng.random((64, 64), dtype=np.float32)}, "step": 3}, src, "2.0")
    return src


def _index_entry(path: Path, name: str, chunk: int) -> tuple[int, h5py.h5d.StoreInfo]:
    """Where the v1 B-tree key of a chunk starts (size u32, filter mask u32, offsets u64...),
    found from the chunk address that follows it (no checksum guards it)."""
    with h5py.File(path) as f:
        infos: list[h5py.h5d.StoreInfo] = []
        f[name].id.chunk_iter(infos.append)
        ndim = len(f[name].shape)
    info = infos[chunk]
    data = path.read_bytes()
    at = data.index(struct.pack("<Q", info.byte_offset)) - 8 - 8 * (ndim + 1)
    assert struct.unpack_from("<I", data, at)[0] == info.size
    return at, info


def _patch(path: Path, at: int, raw: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[at : at + len(raw)] = raw
    path.write_bytes(bytes(data))


def test_a_chunk_shortened_in_its_index_is_refused_on_every_read(tmp_path):
    """The issue's case: the stored size halved in the index. HDF5 read the 4,104 bytes and the
    LZ4 filter read on past them, giving values that changed from run to run, with exit 0."""
    src = _saved(tmp_path)
    at, info = _index_entry(src, "model.w", 0)
    _patch(src, at, struct.pack("<I", info.size // 2))
    with pytest.raises(CorruptCheckpointError, match=r"'model.w', chunk \(0, 0\): its LZ4 frame"):
        cm.load(src)["model"]["w"].sum()
    why = "its LZ4 frame ends at byte 8,208 but the chunk index gives it 4,104 bytes"
    one_line_error(run_cli("verify", src, src), 2, "'model.w', chunk (0, 0)", why)
    one_line_error(run_cli("to-torch", src, tmp_path / "out.pt"), 2, "'model.w'", why)
    assert not (tmp_path / "out.pt").exists()


def test_a_chunk_address_moved_onto_another_chunk_is_refused(tmp_path):
    """Random weights do not compress: both chunks store 8,208 bytes, so the frame alone cannot
    tell one from the other; two chunks sharing stored bytes can (both are named: the first
    read is the first chunk)."""
    src = _saved(tmp_path)
    at, _ = _index_entry(src, "model.w", 1)
    _, first = _index_entry(src, "model.w", 0)
    _patch(src, at + 8 + 8 * 3, struct.pack("<Q", first.byte_offset))
    proc = run_cli("verify", src, src)
    one_line_error(proc, 2, "'model.w', chunk (0, 0)", "shares its stored bytes (at ")


def test_a_chunk_address_moved_onto_another_tensors_chunk_is_refused(tmp_path):
    """Found by the fuzz: two 4x4 float32 tensors store 80 bytes each (random data does not
    compress), so a chunk address moved onto the other tensor's chunk decoded without an
    error to the other tensor's values."""
    src = tmp_path / "two.mdl"
    rng = np.random.default_rng(1)
    cm.save(
        {"a": rng.random((4, 4), dtype=np.float32), "b": rng.random((4, 4), dtype=np.float32)}, src
    )
    at, _ = _index_entry(src, "a", 0)
    _, other = _index_entry(src, "b", 0)
    _patch(src, at + 8 + 8 * 3, struct.pack("<Q", other.byte_offset))
    with pytest.raises(CorruptCheckpointError, match=r"'a', chunk \(0, 0\): shares its stored"):
        cm.load(src)["a"].sum()


def test_a_damaged_lz4_frame_header_is_refused(tmp_path):
    src = _saved(tmp_path)
    _, info = _index_entry(src, "model.w", 1)
    _patch(src, info.byte_offset, struct.pack(">Q", 4096 * 4 * 2))  # declares two chunks' bytes
    proc = run_cli("verify", src, src)
    one_line_error(proc, 2, "'model.w', chunk (32, 0)", "declares 32,768 bytes")


def test_a_deflate_chunk_that_decodes_short_is_refused(tmp_path):
    """Other filters the boundary admits are checked too: a deflate stream whose chunk index
    entry lost its tail decodes to fewer bytes than a chunk."""
    src = tmp_path / "gz.mdl"
    cm.save({"w": np.arange(4096, dtype=np.float32).reshape(64, 64)}, src, "2.0")
    with h5py.File(src, "r+") as f:
        data = f["w"][()]
        del f["w"]
        f.create_dataset("w", data=data, chunks=(32, 64), compression="gzip", shuffle=True)
    at, info = _index_entry(src, "w", 0)
    _patch(src, at, struct.pack("<I", info.size - 8))
    with (
        h5py.File(src) as f,
        pytest.raises(CorruptCheckpointError, match=r"'w', chunk \(0, 0\): its deflate"),
    ):
        read_slab(f["w"], ())


@pytest.mark.parametrize("compression", [hdf5plugin.LZ4(), {"compression": "gzip"}])
def test_a_checksum_h5py_puts_after_the_compression_is_read(tmp_path, compression):
    """h5py's ``fletcher32=True`` sums the compressed chunk (the filter comes last in its
    pipeline): a user's script writing LZ4 or gzip with it made a sound file, read as h5py reads
    it and upgraded, not refused as damaged."""
    src = tmp_path / "checkpoint_1.mdl"
    rng = np.random.default_rng(0)
    cm.save({"model": {"w": rng.random((64, 64), dtype=np.float32)}, "step": 3}, src, "2.0")
    with h5py.File(src, "r+") as f:
        attrs, data = dict(f["model.w"].attrs), f["model.w"][()]
        del f["model.w"]
        ds = f.create_dataset("model.w", data=data, chunks=(32, 64), fletcher32=True, **compression)
        ds.attrs.update(attrs)
        assert ds.id.get_create_plist().get_filter(1)[0] == h5py.h5z.FILTER_FLETCHER32
    assert np.array_equal(np.asarray(cm.load(src)["model"]["w"]), data)
    proc = run_cli("upgrade", src, "-o", tmp_path / "out", "-q")
    assert proc.returncode == 0, proc.stderr
    assert run_cli("verify", src, tmp_path / "out" / src.name).returncode == 0


def test_a_chunk_a_writer_never_stored_is_said_so_with_a_rewrite_that_stores_it(tmp_path):
    """A script that wrote a tensor chunk by chunk, skipping the chunks equal to the fill value
    (h5py: ``create_dataset(shape=..., fillvalue=...)``, then ``ds[rows] = block``), made a file
    HDF5 reads with fill values there. The reader refuses what it cannot tell from a damaged
    index, but says what it found and how to store every value, not only "damaged"."""
    src = tmp_path / "checkpoint_1.mdl"
    cm.save({"model": {"w": np.full((64, 64), 0.5, np.float32)}, "step": 3}, src, "2.0")
    with h5py.File(src, "r+") as f:
        attrs = dict(f["model.w"].attrs)
        del f["model.w"]
        ds = f.create_dataset("model.w", (64, 64), np.float32, chunks=(32, 64), fillvalue=0.5)
        ds[:32] = np.arange(32 * 64, dtype=np.float32).reshape(32, 64)
        ds.attrs.update(attrs)
        assert ds.id.get_num_chunks() == 1 and ds[40, 0] == 0.5
    with (
        h5py.File(src) as f,
        pytest.raises(CorruptCheckpointError, match=r"'model.w', chunk \(32, 0\): is not stored"),
    ):
        read_slab(f["model.w"], ())
    proc = run_cli("verify", src, src)
    one_line_error(proc, 2, "chunk (32, 0): is not stored", "h5repack -l CONTI", "another copy")


def test_an_undamaged_file_reads_as_before(tmp_path):
    src = _saved(tmp_path)
    want = np.random.default_rng(0).random((64, 64), dtype=np.float32)
    assert np.array_equal(np.asarray(cm.load(src)["model"]["w"]), want)
    proc = run_cli("verify", src, src)
    assert proc.returncode == 0, proc.stderr


def test_verify_of_a_tensor_with_no_elements(tmp_path):
    """``verify`` hashed a (3, 0) tensor through ``memoryview.cast``, which refuses a zero in the
    shape: a TypeError (internal error) for a valid file, and for one whose header was damaged
    into such a shape."""
    src = tmp_path / "empty_rows.mdl"
    cm.save({"model": {"w": np.zeros((3, 0), np.float32), "b": np.ones(3, np.float32)}}, src)
    proc = run_cli("verify", src, src)
    assert proc.returncode == 0, proc.stderr


def test_check_deep_names_each_damaged_tensor_and_upgrade_says_what_it_checked(tmp_path):
    """``check --deep`` decodes every tensor and names each that does not decode (exit 2); an
    upgrade copies the stored chunks without decoding them and says so; ``upgrade-dir
    --deep-check`` decodes first and upgrades nothing that does not decode."""
    good = tmp_path / "good" / "checkpoint_1.mdl"
    good.parent.mkdir()
    weights = np.random.default_rng(0).random((256, 256))  # most of the file: a copy-patch
    cm.save({"model": {"w": weights}, "step": 3}, good, "2.0")
    proc = run_cli("check", good, "--deep")
    assert proc.returncode == 10, proc.stderr
    assert "1 tensors, 524,288 bytes decoded" in proc.stdout

    out = tmp_path / "out"
    proc = run_cli("upgrade", good, "--output-dir", out)
    assert proc.returncode == 0, proc.stderr
    assert "tensor data copied as stored, not decoded" in proc.stdout
    proc = run_cli("upgrade", good, "--output-dir", out, "--force", "--manifest", tmp_path / "m")
    assert "tensor data decoded" in proc.stdout

    bad = tmp_path / "bad" / "checkpoint_1.mdl"
    bad.parent.mkdir()
    bad.write_bytes(good.read_bytes())
    at, info = _index_entry(bad, "model.w", 0)
    _patch(bad, at, struct.pack("<I", info.size - 1))
    proc = run_cli("check", bad, "--deep")
    assert proc.returncode == 2
    assert "model.w does not decode: tensor 'model.w', chunk (0, 0)" in proc.stdout
    one_line_error(proc, 2, "1 of 1 tensors do not decode: 'model.w'")
    dir_out = tmp_path / "dir-out"
    # ``--json`` is one document (it was two: the decoding's report, then the release check)
    proc = run_cli("check", bad, "--deep", "--json")
    report = json.loads(proc.stdout)
    assert report["release"] == "2.0" and report["current"] is False, report
    assert [d["tensor"] for d in report["deep"]["damaged"]] == ["model.w"], report
    one_line_error(proc, 2, "1 of 1 tensors do not decode: 'model.w'")
    proc = run_cli("check", good, "--deep", "--json")
    assert proc.returncode == 10, proc.stderr
    assert json.loads(proc.stdout)["deep"]["bytes_decoded"] == 524_288, proc.stdout
    proc = run_cli("upgrade-dir", bad.parent, "--output-dir", dir_out, "--deep-check")
    assert proc.returncode == 2
    assert "1 of 1 tensors do not decode" in proc.stderr
    assert not (dir_out / bad.name).exists()


def _contiguous_address(path: Path, name: str) -> tuple[int, int]:
    """Where a contiguous dataset's address lies in its (version 1, unchecksummed) layout
    message, and the address."""
    with h5py.File(path) as f:
        ds = f[name]
        assert ds.id.get_create_plist().get_layout() == h5py.h5d.CONTIGUOUS
        address, size = ds.id.get_offset(), ds.id.get_storage_size()
    data = path.read_bytes()
    at = data.index(b"\x03\x01" + struct.pack("<QQ", address, size)) + 2
    return at, address


@pytest.mark.parametrize(
    "target",
    ["a chunk index node", "an object header", "a local heap", "a freed global heap collection"],
)
def test_a_contiguous_address_moved_into_metadata_is_refused(tmp_path, target):
    """A 0-d tensor is a contiguous dataset: its data's address moved into a B-tree node's
    unused entries read zeros with no error (benchmarks/fuzz_damage.py, seed 3002, case 70);
    into an object header or a group's heap, that structure's bytes; into a global heap
    collection no attribute names any more (HDF5 freed its last object and left its bytes:
    the real 2.10 library's rewritten spec, ``fuzz_damage --wide`` seed 52100 case 150), the
    old text's bytes, with no error: found in the gaps between what the map names."""
    src = tmp_path / "checkpoint_1.mdl"
    rng = np.random.default_rng(0)
    cm.save(
        {"model": {"w": rng.random((64, 64), np.float32)}, "scale": np.array(3.5, np.float32)},
        src,
        "2.10",
    )
    with h5py.File(src, "r+") as f:  # a text of its own collection, then deleted
        f.attrs["gone"] = "x" * 6000
    with h5py.File(src, "r+") as f:
        del f.attrs["gone"]
    at, _ = _contiguous_address(src, "scale")
    data = src.read_bytes()
    with h5py.File(src) as f:
        header = h5py.h5o.get_info(f["model.w"].id).addr
    inside = {
        "a chunk index node": data.index(b"TREE") + 600,
        "an object header": header + 40,
        "a local heap": data.index(b"HEAP") + 8,
        "a freed global heap collection": data.index(b"x" * 64) + 64,
    }[target]
    _patch(src, at, struct.pack("<Q", inside))
    why = "its data at byte"
    with pytest.raises(CorruptCheckpointError, match="'scale': its data at byte"):
        cm.load(src)
    one_line_error(run_cli("verify", src, src), 2, "'scale'", why)
    one_line_error(run_cli("check", "--deep", src), 2, "'scale'")


def test_the_metadata_map_never_claims_data(tmp_path):
    """On every file the project ships, written by the real library (2.6.0-2.10) or by this
    project at every release: no stored data lies inside the metadata ``h5.metadata`` maps,
    and the map covers every object header."""
    import lzma

    from ckpt_migrate.format.h5 import overlaps

    real = []
    for packed in sorted((FIXTURES / "real-cstorch-2.6-2.9").glob("*.mdl.xz")):
        real.append(tmp_path / packed.name[:-3])
        real[-1].write_bytes(lzma.decompress(packed.read_bytes()))
    assert real
    files = sorted(FIXTURES.rglob("*.mdl")) + sorted(FIXTURES.rglob("*.h5")) + real
    assert len(files) > 20
    edited = tmp_path / "out"  # a root edit: the real 2.9 library's spec rewritten
    trainer = next(p for p in real if p.name == "trainer-2.9.0.mdl")
    res = upgrade(
        trainer, UpgradeOptions(output_dir=edited, inputs={"drop_dataloader_state": True})
    )
    assert res.strategy == "root-edit", res.error
    files.append(res.output)
    for path in files:
        with h5py.File(path, "r", locking=False) as f:
            assert overlaps.shared_starts(f).size == 0, path
            objects = _objects(f)
            mapped = list(zip(*metadata_extents(f, objects), strict=True))
        assert all(any(s <= a < e for s, e in mapped) for a in objects), path


def test_the_metadata_map_visits_each_object_once_however_often_it_is_named(tmp_path):
    """``metadata_extents`` takes each address once, and remembers an object's nodes only while
    it reads it (issue 33): every structure of the shipped files is mapped once, and naming
    every object twice (a tie names one dataset twice) maps the same."""
    files = sorted(FIXTURES.rglob("*.mdl"))
    assert len(files) > 20
    for path in files:
        with h5py.File(path, "r", locking=False) as f:
            objects = _objects(f)
            once = list(zip(*metadata_extents(f, objects), strict=True))
            twice = list(zip(*metadata_extents(f, objects + objects[::-1]), strict=True))
        assert once and len(set(once)) == len(once), path
        assert sorted(twice) == sorted(once), path


def _objects(f: h5py.File) -> list[int]:
    found = [h5py.h5o.get_info(f.id).addr]
    f.id.links.visit(lambda _n, i: found.append(i.u), info=True)
    return found


@pytest.mark.parametrize(
    ("field", "offset", "raw"),
    [("bit offset", 4, b"\x85\x00"), ("precision", 6, b"\x0b\x8e"), ("exponent bias", 12, b"\x7e")],
)
def test_a_number_type_damaged_in_its_header_is_refused(tmp_path, field, offset, raw):
    """A dataset's float type is bytes of a version-1 object header that no checksum guards;
    HDF5 converted a float32 whose precision and bit offset were changed into other values,
    exit 0 (benchmarks/fuzz_damage.py, seed 5001, case 54: the real library's dtypes file)."""
    import shutil

    src = tmp_path / "checkpoint_1.mdl"
    shutil.copyfile(FIXTURES / "real-cstorch-2.10" / "dtypes.mdl", src)
    data = src.read_bytes()
    with h5py.File(src) as f:
        header = h5py.h5o.get_info(f["special_f32"].id).addr
    # the datatype message of a float32: class and version 0x11, bits 0x20 0x1f 0x00, size 4
    at = data.index(b"\x11\x20\x1f\x00\x04\x00\x00\x00", header)
    _patch(src, at + 4 + offset, raw)
    with pytest.raises(CorruptCheckpointError, match="'/special_f32' has a 4-byte float type"):
        cm.load(src)
    one_line_error(run_cli("verify", src, src), 2, "special_f32", "not the standard one")


def test_the_metadata_map_reads_at_most_twice_the_file(tmp_path, monkeypatch):
    """A small file cannot buy a long walk: B-tree nodes may each claim entries up to the end
    of the file, so the map stops once its reads pass twice the file's size."""
    import os

    from ckpt_migrate.format.h5 import metadata

    src = tmp_path / "checkpoint_1.mdl"
    cm.save({f"w{i}": np.ones((64, 4), np.float32) for i in range(40)}, src, "2.10")
    read: list[int] = []
    real = os.pread
    monkeypatch.setattr(metadata.os, "pread", lambda fd, n, at: read.append(n) or real(fd, n, at))
    with h5py.File(src, "r") as f:
        full = metadata_extents(f, _objects(f))
        read.clear()
        monkeypatch.setattr(metadata._File, "__init__", _tiny_budget(metadata._File.__init__))
        cut = metadata_extents(f, _objects(f))
    assert sum(read) <= 4096 and len(cut[0]) == len(cut[1]) < len(full[0]) == len(full[1])


def _tiny_budget(init):
    def patched(self, fd, size):
        init(self, fd, size)
        self.unread = 4096  # as if the file were tiny next to what its nodes claim

    return patched


def _lz4_file(path: Path, rows: int, block: int = 0) -> None:
    """One 64-column float32 tensor of ``rows // 8`` LZ4 chunks (``block``: the frame's block
    size, 0 for one block a chunk), as the legacy writer stored them."""
    import hdf5plugin

    data = np.random.default_rng(rows).random((rows, 64), dtype=np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("w", data=data, chunks=(8, 64), **hdf5plugin.LZ4(nbytes=block))


def _key_damage(at: int, info: h5py.h5d.StoreInfo, size: int) -> dict[str, tuple[int, bytes]]:
    """Damage to one chunk's v1 B-tree key (size u32, filter mask u32, offsets u64 each, then
    the chunk's address), by name: (where, the bytes written there)."""
    coords, address = at + 8, at + 8 + 8 * 3
    return {
        "size halved": (at, struct.pack("<I", info.size // 2)),
        "size grown": (at, struct.pack("<I", info.size + 16)),
        "unfiltered": (at + 4, struct.pack("<I", 1)),
        "off the grid": (coords, struct.pack("<Q", info.chunk_offset[0] + 1)),
        "outside the extent": (coords, struct.pack("<Q", 1 << 20)),
        "listed twice": (coords, struct.pack("<Q", 0)),
        "address past the end": (address, struct.pack("<Q", size - 8)),
    }


def _frame_damage(info: h5py.h5d.StoreInfo) -> dict[str, tuple[int, bytes]]:
    at = info.byte_offset
    return {
        "frame declares more": (at, struct.pack(">Q", 8 * 64 * 4 * 2)),
        "block size 0": (at + 8, struct.pack(">I", 0)),
        "first block stores 0": (at + 12, struct.pack(">I", 0)),
        "first block stores more": (at + 12, struct.pack(">I", info.size)),
    }


def _verdict(path: Path) -> object:
    from ckpt_migrate.format.h5 import chunks

    with h5py.File(path, "r", locking=False) as f:
        dsid = f["w"].id
        try:
            return chunks.check_chunks(dsid, chunks.Layout.of(dsid))
        except (CorruptCheckpointError, RuntimeError) as exc:  # (HDF5's own, on both paths)
            return f"{type(exc).__name__}: {exc}"


def test_check_of_several_files_answers_each_a_damaged_one_too(tmp_path):
    """``check`` took one file (``check ckpts/*.mdl`` was a usage error). Each is now answered,
    a damaged one among them, and the exit code is the worst: an error's before 10. Inputs:
    the real 2.6 library's file, the real 2.10 library's file, and a damaged copy of a file
    of ours."""
    real_26 = next(p for p in real_2x_files(tmp_path) if p.name == "gpt2-2.6.0.mdl")
    good = tmp_path / "good.mdl"
    cm.save({"model": {"w": np.random.default_rng(0).random((256, 256))}}, good, "2.10")
    bad = tmp_path / "bad.mdl"
    bad.write_bytes(good.read_bytes())
    at, info = _index_entry(bad, "model.w", 0)
    _patch(bad, at, struct.pack("<I", info.size - 1))
    files = [real_26, bad, REAL / "basic.mdl"]
    proc = run_cli("check", *files, "--deep")
    assert proc.returncode == 2, proc.stderr
    assert f"{real_26}: 2.6 needs upgrading to 2.10" in proc.stdout
    assert f"{REAL / 'basic.mdl'}: at 2.10" in proc.stdout
    assert f"{bad}: model.w does not decode" in proc.stdout
    one_line_error(proc, 2, f"{bad}: 1 of 1 tensors do not decode: 'model.w'")
    proc = run_cli("check", *files, "--deep", "--json")  # one line a file
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a["path"] for a in answers] == [str(p) for p in files] and proc.returncode == 2
    assert answers[0]["current"] is False and answers[2]["current"] is True
    assert answers[1]["exit_code"] == 2 and "do not decode" in answers[1]["error"]
    proc = run_cli("check", real_26, REAL / "basic.mdl", good)
    assert proc.returncode == 10 and len(proc.stdout.splitlines()) == 3, proc.stdout
    proc = run_cli("check", real_26, good, "--to", "2.11")  # the command's error: said once
    one_line_error(proc, 2, "release '2.11' is newer than this ckpt-migrate knows (newest 2.10)")
    assert proc.stdout == ""


@pytest.mark.parametrize(("rows", "block"), [(8, 0), (16, 0), (96, 0), (16, 512), (96, 512)])
def test_few_chunks_are_checked_as_many_are(tmp_path, monkeypatch, rows, block):
    """An index of at most ``chunks.FEW`` entries is checked in plain Python, a longer one on
    numpy arrays: for every kind of damage, each gives the same verdict (the same chunk and
    words) on files laid out as the legacy writer laid them out (one chunk or several, one LZ4
    block a chunk or several), and the same chunks on an undamaged one."""
    from ckpt_migrate.format.h5 import chunks

    clean = tmp_path / "clean.mdl"
    _lz4_file(clean, rows, block)
    last = rows // 8 - 1
    at, info = _index_entry(clean, "w", last)
    _, first = _index_entry(clean, "w", 0)
    damage = {"none": (0, clean.read_bytes()[:1])}
    damage |= _key_damage(at, info, clean.stat().st_size)
    damage |= _frame_damage(info)
    if last:
        damage["moved onto the first chunk"] = (
            at + 8 + 8 * 3,
            struct.pack("<Q", first.byte_offset),
        )
    refused = 0
    for name, (where, raw) in damage.items():
        path = tmp_path / f"{name}.mdl"
        path.write_bytes(clean.read_bytes())
        _patch(path, where, raw)
        verdicts = []
        for few in (-1, 1 << 20):  # numpy for all, plain Python for all
            monkeypatch.setattr(chunks, "FEW", few)
            verdicts.append(_verdict(path))
        assert verdicts[0] == verdicts[1], name
        refused += isinstance(verdicts[0], str) and "CorruptCheckpointError" in verdicts[0]
        if name == "none":
            assert verdicts[0] == [(8 * i, 0) for i in range(rows // 8)]
    assert refused >= len(damage) - 3, "most damage must be refused, or the test tests nothing"


def test_few_chunks_of_the_real_librarys_files_are_checked_as_many_are(tmp_path, monkeypatch):
    """Every chunked dataset the real libraries wrote (2.6-2.10) gives the same chunks by
    both checks."""
    from ckpt_migrate.format.h5 import chunks

    checked = 0
    for path in [*sorted(REAL.glob("*.mdl")), *real_2x_files(tmp_path)]:
        with h5py.File(path, "r", locking=False) as f:
            names: list[str] = []
            f.visit(names.append)
            for name in names:
                if not isinstance(f[name], h5py.Dataset):
                    continue
                layout = chunks.Layout.of(f[name].id)
                if layout is None:
                    continue
                found = []
                for few in (-1, 1 << 20):
                    monkeypatch.setattr(chunks, "FEW", few)
                    found.append(chunks.check_chunks(f[name].id, layout))
                assert found[0] == found[1], (path.name, name)
                checked += 1
    assert checked > 20


def test_check_deep_of_a_chunk_never_stored_gives_the_rewrite_not_only_damaged(tmp_path):
    """``check --deep``'s closing line said "the file is damaged; use another copy" for every
    tensor that does not decode, although its line for a chunk a writer never stored (h5py's
    ``create_dataset(fillvalue=...)`` then a partial write) says what it is and how a rewrite
    stores it. The summary now gives the tensors' own fix where they share one."""
    src = tmp_path / "checkpoint_1.mdl"
    cm.save({"model": {"w": np.zeros((64, 64), np.float32)}, "step": 3}, src, "2.0")
    with h5py.File(src, "r+") as f:
        attrs = dict(f["model.w"].attrs)
        del f["model.w"]
        ds = f.create_dataset("model.w", (64, 64), np.float32, chunks=(32, 64), fillvalue=0.5)
        ds[:32] = 1.0
        ds.attrs.update(attrs)
    proc = run_cli("check", src, "--deep")
    assert "model.w does not decode: tensor 'model.w', chunk (32, 0): is not stored" in proc.stdout
    one_line_error(proc, 2, "1 of 1 tensors do not decode", "h5repack -l CONTI", "another copy")
    assert "the file is damaged" not in proc.stderr, proc.stderr
    report = json.loads(run_cli("check", src, "--deep", "--json").stdout)
    assert "h5repack -l CONTI" in report["deep"]["damaged"][0]["fix"], report
