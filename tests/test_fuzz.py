"""A seeded fuzzer: byte flips and truncations of every fixture, through inspect, verify and
upgrade. Every case is either accepted or refused with the bad-input exit code (2) and one
line; never an internal error, a signal, a hang, a leftover temporary or a changed source."""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import fuzz_damage
import fuzz_worker
import h5py
import numpy as np
import pytest
from conftest import FIXTURES, one_line_error, run_cli, sha256_file

import ckpt_migrate as cm
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.errors import CorruptCheckpointError
from ckpt_migrate.format.h5 import preflight
from ckpt_migrate.format.h5 import root as h5root
from ckpt_migrate.format.h5.headers import file_reader, read_header
from ckpt_migrate.format.read import read_checkpoint

WORKER = Path(__file__).with_name("fuzz_worker.py")
DAMAGE = Path(__file__).with_name("fuzz_damage.py")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_damaged_files_are_refused_cleanly(tmp_path, seed):
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(seed), "100", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"the worker died (exit {proc.returncode}): {proc.stderr[-2000:]}"
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["cases"] == 100
    assert got["internal"] == [], "\n".join(got["internal"])
    assert got["bad_exit"] == [], "\n".join(got["bad_exit"])
    assert got["left_behind"] == [] and got["source_changed"] == []
    assert got["refused"] > 50 and got["accepted"] > 20  # both outcomes are exercised
    assert got["slowest_s"] < 30
    assert got["peak_rss_mib"] < 1024


@pytest.mark.parametrize(
    ("seed", "cases", "wide"), [(11, 100, False), (12, 100, False), (13, 50, True)]
)
def test_damaged_chunks_and_headers_give_the_true_tensors_or_a_clean_refusal(
    tmp_path, seed, cases, wide
):
    """Issue #36: 100 files per seed with a chunk's stored size or address changed in its
    index entry, its LZ4 frame header or an object header damaged, each through ``load`` and
    one more entry point in turn (verify, check --deep, upgrade, upgrade --verify full). Never a
    success with other values, a file different from itself or an internal error; an upgrade
    may carry damage it copies as stored, and then says so. ``wide``: the real 2.6–2.9 files
    too, and bytes anywhere outside tensor data. (``benchmarks/fuzz_damage.py`` runs
    thousands through every entry point.)"""
    proc = subprocess.run(
        [sys.executable, str(DAMAGE), str(seed), str(cases), str(tmp_path), "--rotate"]
        + ["--wide"] * wide,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"the worker died (exit {proc.returncode}): {proc.stderr[-2000:]}"
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["forbidden"] == [], "\n".join(got["forbidden"])
    kinds = fuzz_damage.WIDE_KINDS if wide else fuzz_damage.KINDS
    assert got["cases"] == cases and set(got["kinds"]) == set(kinds)
    assert set(got["outcomes"]) == set(fuzz_damage.VERBS)
    load = got["outcomes"]["load"]
    assert load.get("refused", 0) > cases * 0.3 and load.get("equal", 0) > 5  # both occur
    assert got["slowest_s"] < 30


def test_wide_damage_lies_outside_tensor_data_and_reaches_the_real_2_6_to_2_9_files(tmp_path):
    bodies = {p: fuzz_damage.anatomy(p) for p in fuzz_damage.sources(tmp_path)}
    assert {"gpt2-2.6.0.mdl", "trainer-2.9.0.mdl"} <= {p.name for p in bodies}
    cases = itertools.islice(
        fuzz_damage.damaged_files(random.Random(5), bodies, fuzz_damage.WIDE_KINDS), 200
    )
    for src, kind, data in cases:
        if kind != "metadata":
            continue
        body = bodies[src]
        changed = [i for i, (a, b) in enumerate(zip(body.data, data)) if a != b]
        assert changed and changed[-1] - changed[0] < 8
        assert not any(start <= changed[0] < end for start, end in body.stored)


def test_a_chunk_index_pointing_past_the_end_is_refused_before_copying(tmp_path):
    """A crafted chunk address past the end of the file: the copy-patch would publish an output
    whose chunk lands in the metadata written there. It is refused when the file is read (the
    preflight child walks the chunk indexes), before anything is copied."""
    src = tmp_path / "in" / "checkpoint_1.mdl"
    src.parent.mkdir()
    rng = np.random.default_rng(0)
    weights = {f"w{i}": rng.random((256, 256), dtype=np.float32) for i in range(4)}
    cm.save({"model": weights}, src, "2.0")
    with h5py.File(src) as f:
        chunks: list = []
        f["model.w1"].id.chunk_iter(chunks.append)
    data = bytearray(src.read_bytes())
    at = data.index(struct.pack("<Q", chunks[-1].byte_offset))  # in a v1 B-tree node: no checksum
    data[at : at + 8] = struct.pack("<Q", len(data) + 4096)
    src.write_bytes(bytes(data))
    digest = sha256_file(src)
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("upgrade", src, "--output-dir", out)
    one_line_error(proc, 2, "model.w1", "lies past the end of the file", skip_warnings=True)
    assert list(out.iterdir()) == [] and sha256_file(src) == digest


def test_an_attribute_of_a_type_checkpoints_never_use_is_refused_unread(tmp_path):
    """A variable-length sequence where a string belongs (seen in fuzzed files: reading it
    crashed HDF5) is refused by the boundary walk, which reads only its type."""
    src = tmp_path / "odd.mdl"
    cm.save({"model": {"w": np.arange(4.0)}, "step": 1}, src, "2.0")
    with h5py.File(src, "r+") as f:
        del f["model.w"].attrs["__H5_TYPE__"]
        value = np.empty((), dtype=object)
        value[()] = np.arange(3, dtype=np.int32)
        f["model.w"].attrs.create("__H5_TYPE__", value, dtype=h5py.vlen_dtype(np.int32))
    proc = run_cli("inspect", src)
    one_line_error(proc, 2, "attribute '__H5_TYPE__' of '/model.w'", "type class vlen")


def _fuzz_case(seed: int, index: int) -> tuple[str, bytes]:
    """The source name and bytes of ``fuzz_worker``'s case ``index`` for ``seed``."""
    rng = random.Random(seed)
    sources = fuzz_worker.sources()
    for _ in range(index):
        fuzz_worker.mutate(rng, rng.choice(sources).read_bytes())
    src = rng.choice(sources)
    return src.name, fuzz_worker.mutate(rng, src.read_bytes())


def test_a_file_that_makes_hdf5_loop_is_refused_not_waited_on(tmp_path):
    """Seed 5, case 63: a flipped byte in a global-heap reference sends HDF5's own read of a
    string attribute into an endless loop; the pre-flight child stalls and the file is refused."""
    name, data = _fuzz_case(5, 63)
    assert name == "empty.mdl"
    case = tmp_path / "case63.mdl"
    case.write_bytes(data)
    env = {**os.environ, "CKPT_MIGRATE_STALL_SECONDS": "2"}
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_migrate", "inspect", str(case)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    one_line_error(proc, 2, "HDF5 made no progress reading the file's metadata for 2 s")


def test_a_crash_inside_hdf5_is_a_one_line_refusal(tmp_path, monkeypatch):
    """What a SIGSEGV in HDF5's C code does to the pre-flight child (simulated: the child kills
    itself so) becomes a refusal in the caller's process, which lives on."""
    src = tmp_path / "ok.mdl"
    cm.save({"w": np.arange(3.0)}, src)
    monkeypatch.setattr(preflight, "_walk", lambda *_: os.kill(os.getpid(), signal.SIGSEGV))
    with pytest.raises(CorruptCheckpointError, match=r"HDF5 crashed \(SIGSEGV\)"):
        cm.read_checkpoint(src)


def test_an_object_header_hdf5_cannot_read_while_editing_is_a_one_line_refusal(
    tmp_path, monkeypatch
):
    """Issue #36: a damaged object header checksum or address made ``h5o.get_info`` raise
    RuntimeError in the copy-patch (which edits a copy of the source) on 6 fuzzed files: an
    internal error. Simulated here as HDF5 raises it."""
    src = tmp_path / "checkpoint_1.mdl"
    weights = np.random.default_rng(0).random((512, 512))  # most of the file: a copy-patch
    cm.save({"model": {"w": weights}, "step": 1}, src, "2.0")

    def damaged_header(obj):
        raise RuntimeError(
            "Can't get deprecated info for object (incorrect metadata checksum after all read "
            "attempts)"
        )

    monkeypatch.setattr(h5root, "object_address", damaged_header)
    out = tmp_path / "out"
    res = upgrade(src, UpgradeOptions(output_dir=out))
    assert res.status == "failed" and res.exit_code == 2, (res.strategy, res.error)
    assert "HDF5 structures are damaged (incorrect metadata checksum" in res.error
    assert str(src) in res.error and "\n" not in res.error
    assert not out.exists()  # (made by the run, removed again empty: nothing published)


def test_an_enum_type_damaged_past_h5pys_reach_is_a_one_line_refusal(tmp_path):
    """Found by ``benchmarks/fuzz_damage.py`` (seed 1006, case 146): object-header damage gave a
    bool tensor an enum type whose member names h5py cannot sort, and the rewrite's chunk copy
    raised TypeError making the output dataset (an internal error). A bool is h5py's enum
    exactly, so the boundary now refuses the type before anything is copied."""
    src, kind, data = fuzz_damage.nth_case(1006, 146)
    assert (src.name, kind) == ("release-2.0.mdl", "object_header")
    case = tmp_path / "checkpoint_1.mdl"
    case.write_bytes(data)
    out = tmp_path / "out"
    res = upgrade(case, UpgradeOptions(output_dir=out, inputs={"drop_dataloader_state": True}))
    assert res.status == "failed" and res.exit_code == 2, res.error
    assert "'/model.mask' has a 1-byte enum type whose layout is not the standard one" in res.error


@pytest.mark.parametrize(
    ("release", "dataset", "attr", "damaged"),
    [
        ("1.8", "lr_scheduler.last_epoch", "is_scalar", "is_scnlar"),
        ("2.3", "misc.step.0", "__H5_TYPE__", "__H5_yYPE__"),
    ],
)
def test_a_damaged_attribute_name_in_a_legacy_header_is_refused(
    tmp_path, release, dataset, attr, damaged
):
    """Legacy datasets' flags and tags live in v1 object headers without checksum: one byte of
    a name changed (the two damages benchmarks/fuzz_damage.py found) must not turn a scalar
    into a 0-d tensor silently."""
    path = tmp_path / "damaged.mdl"
    shutil.copyfile(FIXTURES / f"release-{release}.mdl", path)
    with h5py.File(path, "r+") as f:
        ds = f[dataset]
        ds.attrs[damaged] = ds.attrs[attr]
        del ds.attrs[attr]
    with pytest.raises(CorruptCheckpointError, match=dataset), read_checkpoint(path):
        pass
    one_line_error(run_cli("inspect", path), 2, dataset, "damaged")


def test_a_damaged_bfloat16_flag_is_refused_not_read_as_int16(tmp_path, real_layout_19):
    """A bfloat16 tensor is stored as int16 with ``is_bfloat16`` in every legacy format: one
    byte of that name changed in the real 1.9 layout's unchecksummed header read the weights
    as int16, with success, through the walk's facts and through h5py alike."""
    name = "model.model.embedding_layer.word_embeddings.weight"
    path = tmp_path / "checkpoint_100.mdl"
    shutil.copyfile(real_layout_19, path)
    with h5py.File(path, "r+") as f:
        attrs = f[name].attrs
        assert attrs["is_bfloat16"] and f[name].dtype == "int16"
        attrs["is_bfloXt16"] = attrs["is_bfloat16"]
        del attrs["is_bfloat16"]
    why = f"{name!r} carries an attribute no release writes ('is_bfloXt16')"
    with pytest.raises(CorruptCheckpointError, match=re.escape(why)):
        fuzz_damage.tensor_hashes(path)
    out = tmp_path / "out"
    res = upgrade(path, UpgradeOptions(output_dir=out, inputs={"drop_dataloader_state": True}))
    assert (res.status, res.exit_code) == ("failed", 2) and why in res.error, res.error
    one_line_error(run_cli("check", "--deep", path), 2, name, "damaged")


@pytest.mark.parametrize(
    ("seed", "index", "source", "why"),
    [
        (3002, 70, "release-2.10.mdl", r"'model\.scale': its data at byte 29100 lies inside"),
        (5001, 54, "dtypes.mdl", "'/special_f32' has a 4-byte float type whose layout is not"),
        (7000, 231, "release-2.3.mdl", "'optimizer.state.0.step' is a named datatype where"),
        (977007, 54, "release-1.7.mdl", r"betas\.0' carries an attribute no release writes"),
        (1013007, 219, "dataloader_map.mdl", r"state\.1\.step': its data at byte 45012 lies"),
    ],
)
def test_the_fuzz_benchmarks_wrong_outcomes_are_refused(tmp_path, seed, index, source, why):
    """The cases ``benchmarks/fuzz_damage.py`` reported as ``wrong`` (success with other
    values), each one byte or three of an unchecksummed object header: a 0-d tensor's data
    address moved into a B-tree node (read its zeros), a float32's precision and bit offset
    changed (HDF5 converted the values), a dataspace message's type changed (HDF5 then takes
    the dataset for a named datatype, and the leaf read as missing), a 0.1 flag's name changed
    at its first byte (``Us_scalar``: the scalar read as a 0-d tensor), a 0-d tensor's address
    moved into the unused part of a global heap collection (the real 2.10 library's file: the
    collection of its ``dtypes`` strings, 4 KiB of which a few bytes are used)."""
    src, kind, data = fuzz_damage.nth_case(seed, index)
    assert (src.name, kind) == (source, "object_header")
    case = tmp_path / "checkpoint_1.mdl"
    case.write_bytes(data)
    with pytest.raises(CorruptCheckpointError, match=why):
        fuzz_damage.tensor_hashes(case)


def test_a_step_moved_into_a_freed_spec_collection_is_refused(tmp_path):
    """Found by ``benchmarks/fuzz_damage.py --wide --seed 52100`` (case 150): a 0-d tensor's
    address in the real 2.10 library's ``dataloader_map.mdl`` moved into the global heap
    collection of a ``__spec__`` the library wrote before its last one (no attribute names
    it; HDF5 left its bytes). Every entry point read a step of 2.5e17 with no error; the
    collection is now found between the structures the map names, and the data refused."""
    src, kind, data = fuzz_damage.nth_case(52100, 150, tmp_path)
    assert (src.name, kind) == ("dataloader_map.mdl", "object_header")
    case = tmp_path / "checkpoint_1.mdl"
    case.write_bytes(data)
    why = r"'optimizer\.state\.1\.step': its data at byte 3284 lies inside other data"
    with pytest.raises(CorruptCheckpointError, match=why):
        fuzz_damage.tensor_hashes(case)
    one_line_error(run_cli("check", "--deep", case), 2, "'optimizer.state.1.step'")


def test_a_contiguous_address_past_what_a_file_holds_is_refused_by_verify(tmp_path):
    """Found by ``benchmarks/fuzz_damage.py --wide --seed 52200`` (seed 52203, case 245): a
    0-d tensor's address in the real 2.10 library's ``dataloader_map.mdl`` made larger than
    any file offset. ``verify F F`` compared the pair from the headers and read there: an
    ``OverflowError``, an internal error. The header comparison leaves such a pair to the
    comparison through HDF5, which refuses the file (exit 2)."""
    src, kind, data = fuzz_damage.nth_case(52203, 245, tmp_path)
    assert (src.name, kind) == ("dataloader_map.mdl", "object_header")
    case = tmp_path / "checkpoint_1.mdl"
    case.write_bytes(data)
    one_line_error(run_cli("verify", case, case), 2, str(case), "HDF5 structures are damaged")


def test_a_header_message_too_short_for_its_fields_is_left_to_hdf5s_walk(tmp_path):
    """Found by ``benchmarks/fuzz_damage.py`` (seed 955011, case 95): damage to a dataset's
    unchecksummed header in the real library's ``dataloader_map.mdl`` left a message shorter
    than its fields, and the scan of what a root edit's copy would carry out of the file read
    past its end: IndexError, an internal error (exit 1) of every upgrade of it. Such a header
    is now one the scan does not understand, so HDF5 walks the file, as for any other; the
    copy carries the damage, said, and its output is refused as the source is."""
    src, kind, data = fuzz_damage.nth_case(955011, 95)
    assert (src.name, kind) == ("dataloader_map.mdl", "object_header")
    case = tmp_path / "checkpoint_1.mdl"
    case.write_bytes(data)
    why = "'model.fc.bias' is a named datatype where a dataset belongs"
    with pytest.raises(CorruptCheckpointError, match=why):
        fuzz_damage.tensor_hashes(case)
    out = tmp_path / "out"
    res = upgrade(case, UpgradeOptions(output_dir=out, target="2.6"))
    assert (res.status, res.exit_code, res.strategy) == ("upgraded", 0, "root-edit"), res.error
    assert res.tensor_data == "copied as stored, not decoded"
    with pytest.raises(CorruptCheckpointError, match=why):
        fuzz_damage.tensor_hashes(out / case.name)


@pytest.mark.parametrize("layout", ["release-1.8", "real-1.9"])
def test_a_damaged_name_in_a_legacy_spec_is_refused_not_read_as_missing(
    tmp_path, real_layout_19, layout
):
    """One nibble of a legacy spec's hex (no checksum) changed ``model`` to ``mndel``: every
    model leaf then had no data while the file held the datasets no leaf named, and the
    refusal suggested ``--allow-missing``, which drops them all. Found by damaging bytes
    anywhere outside tensor data (a run of ``wide_fuzz`` beside the benchmark's, 1.8 case 72)."""
    src = FIXTURES / "release-1.8.mdl" if layout == "release-1.8" else real_layout_19
    path = tmp_path / "checkpoint_100.mdl"
    data = src.read_bytes()
    # the pickle's short string: the state's key ``model`` (1.8), a model key (1.9)
    model = (b"\x8c\x05model" if layout == "release-1.8" else b"\x8c,model.embedding").hex()
    assert model.encode() in data
    path.write_bytes(data.replace(model.encode(), model.replace("6d6f", "6d6e", 1).encode(), 1))
    with pytest.raises(CorruptCheckpointError, match="the spec is damaged"):
        fuzz_damage.tensor_hashes(path)
    proc = run_cli("upgrade", path, "--output-dir", tmp_path / "out", "--allow-missing")
    one_line_error(proc, 2, "which no leaf names: the spec is damaged")
    assert "--allow-missing" not in proc.stderr


def test_a_chunk_moved_into_the_root_an_edit_rewrites_is_the_sources_damage(tmp_path):
    """Found by ``benchmarks/fuzz_damage.py --wide`` (seed 1041005, case 177): a chunk index
    entry of the real 2.9 library's file moved to run into the root's metadata, which the
    root edit rewrites. ``upgrade --verify full`` then found the output's stored bytes unlike
    the source's and failed as a verification of its own work (exit 4); the source's damage
    is now said as such (exit 2)."""
    src, kind, data = fuzz_damage.nth_case(1041005, 177, tmp_path)
    assert (src.name, kind) == ("trainer-2.9.0.mdl", "address")
    case = tmp_path / "checkpoint_1.mdl"
    case.write_bytes(data)
    out = tmp_path / "out"
    opts = UpgradeOptions(output_dir=out, verify="full", inputs={"drop_dataloader_state": True})
    res = upgrade(case, opts)
    assert (res.status, res.exit_code) == ("failed", 2), res.error
    assert "overlaps other data or the file's metadata" in res.error
    assert not out.exists()  # (made by the run, removed again empty: nothing published)


@pytest.mark.parametrize(
    ("seed", "index", "manifest"),
    [
        (52052, 26, False),
        (52052, 69, False),
        (52053, 26, False),
        (52053, 35, False),
        (52052, 26, True),
    ],
)
def test_a_dataset_header_hdf5_cannot_open_is_the_sources_damage_under_verify_full(
    tmp_path, seed, index, manifest
):
    """Found by ``benchmarks/fuzz_damage.py --wide --seed 52052`` (cases 26 and 69 of seed
    52052, 26 and 35 of 52053): a real 2.9 or 2.6 library's file whose dataset header is
    damaged where the header reader does not vouch for it (a float type's exponent, a
    dataspace's rank). A root edit copies it unread; ``--verify full`` (and ``--manifest``)
    then opened the output's copy through HDF5 first and ended in an internal ``KeyError``.
    The source is opened first: its damage is refused as such (exit 2), nothing published."""
    src, kind, data = fuzz_damage.nth_case(seed, index, tmp_path)
    assert (src.name, kind) in {
        ("trainer-2.9.0.mdl", "object_header"),
        ("gpt2-2.6.0.mdl", "object_header"),
    }
    case = tmp_path / "checkpoint_1.mdl"
    case.write_bytes(data)
    out = tmp_path / "out"
    opts = UpgradeOptions(
        output_dir=out,
        verify="full",
        manifest=tmp_path / "m.json" if manifest else None,
        inputs={"drop_dataloader_state": True},
    )
    res = upgrade(case, opts)
    assert (res.status, res.exit_code) == ("failed", 2), res.error
    assert f"{case}: HDF5 structures are damaged (" in res.error and "')" not in res.error
    assert not out.exists() and not (tmp_path / "m.json").exists()


def test_an_output_dataset_hdf5_cannot_open_fails_the_verification_naming_it(tmp_path, monkeypatch):
    """The other side of the case above: the real 2.9 library's file undamaged, and the same
    damaged header bytes (seed 52052, case 26) put into the root edit's output after HDF5's
    edit. ``--verify full`` opens the source's dataset, then fails to open the output's: a
    verification of this run that failed (exit 4), naming the dataset in HDF5's words, and
    nothing published."""
    from ckpt_migrate.engine import rootedit

    src, _, damaged = fuzz_damage.nth_case(52052, 26, tmp_path)
    original = src.read_bytes()
    changed = [i for i in range(len(original)) if original[i] != damaged[i]]
    assert 0 < len(changed) <= 4
    case = tmp_path / "checkpoint_1.mdl"
    case.write_bytes(original)
    real = rootedit.edit_root

    def edit_then_damage(path: Path, edit: rootedit.Edit) -> None:
        real(path, edit)
        with open(path, "r+b") as fh:  # (a byte copy: the datasets' headers where they were)
            for i in changed:
                fh.seek(i)
                fh.write(damaged[i : i + 1])

    monkeypatch.setattr(rootedit, "edit_root", edit_then_damage)
    out = tmp_path / "out"
    opts = UpgradeOptions(output_dir=out, verify="full", inputs={"drop_dataloader_state": True})
    res = upgrade(case, opts)
    assert (res.status, res.exit_code) == ("failed", 4), res.error
    assert "cannot be opened (exponent range out of bounds)" in res.error, res.error
    assert res.error.startswith(str(out)) and "'" + "Unable" not in res.error
    assert not out.exists() or not list(out.iterdir())


def test_a_reused_chunk_past_the_sources_end_is_its_damage_under_verify_full(tmp_path):
    """Found by ``benchmarks/fuzz_damage.py --wide --seed 52100`` (seed 52101, case 102): a
    chunk index entry of the real 2.6 library's file moved past the file's end. A root edit
    copies it unread; ``--verify full`` then read the output's bytes there first and failed
    as a verification of its own work (exit 4, naming the temporary output). The source is
    read first: its damage is refused as such, naming the tensor (exit 2)."""
    src, kind, data = fuzz_damage.nth_case(52101, 102, tmp_path)
    assert (src.name, kind) == ("gpt2-2.6.0.mdl", "address")
    case = tmp_path / "checkpoint_1.mdl"
    case.write_bytes(data)
    out = tmp_path / "out"
    res = upgrade(case, UpgradeOptions(output_dir=out, verify="full"))
    assert (res.status, res.exit_code) == ("failed", 2), res.error
    assert res.error.startswith(f"{case}: tensor 'model.model.transformer_decoder.layers.0.")
    assert (
        f"has stored data that lies past the end of the file (byte 4,331,993 of {len(data):,})"
        in res.error
    )
    assert not out.exists()
    res = upgrade(case, UpgradeOptions(output_dir=out))  # (the index check reads no data)
    assert (res.status, res.tensor_data) == ("upgraded", "copied as stored, not decoded")


def _damage_message_type(path: Path, dataset: str, attr: bytes) -> None:
    """Change the type of ``dataset``'s attribute message named ``attr`` (a version-1 header,
    continuation blocks followed) to one HDF5 does not know, as one damaged pair of bytes."""
    with h5py.File(path, "r") as f:
        address = h5py.h5o.get_info(f[dataset].id).addr
    data = bytearray(path.read_bytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        header = read_header(file_reader(fd, len(data)), address, set(), 64)
    finally:
        os.close(fd)
    at = next(
        start + i - 16
        for start, n in header.blocks
        if (i := data[start : start + n].find(attr + b"\0")) >= 0
    )
    assert data[at : at + 2] == b"\x0c\x00"  # an attribute message's type
    data[at : at + 2] = b"\x8b\xc2"
    path.write_bytes(bytes(data))


def test_a_flag_whose_message_type_hdf5_does_not_know_is_refused(tmp_path, real_layout_19):
    """HDF5 skips a message of a type it does not know. Where that was a legacy dataset's
    flag, the dataset read as an untagged tensor, with success: a 1.8 scalar as a 0-d tensor
    (``fuzz_damage.py --wide``, seed 1051005, case 108), the real 1.9 layout's bfloat16
    embeddings as int16 (which a hash of the bytes alone did not see)."""
    src, kind, data = fuzz_damage.nth_case(1051005, 108, tmp_path)
    assert (src.name, kind) == ("release-1.8.mdl", "metadata")
    scalar = tmp_path / "scalar.mdl"
    scalar.write_bytes(data)
    bf16 = tmp_path / "checkpoint_100.mdl"
    shutil.copyfile(real_layout_19, bf16)
    name = "model.model.embedding_layer.word_embeddings.weight"
    _damage_message_type(bf16, name, b"is_bfloat16")
    with h5py.File(bf16, "r") as f:
        assert "is_bfloat16" not in f[name].attrs and f[name].dtype == "int16"
    why = "has a header message of a type HDF5 does not know"
    for path, where in ((scalar, "optimizer.param_groups.0.amsgrad"), (bf16, name)):
        with pytest.raises(CorruptCheckpointError, match=why):
            fuzz_damage.tensor_hashes(path)
        for verb in ("inspect", "plan"):
            one_line_error(run_cli(verb, path), 2, where, why)
        res = upgrade(path, UpgradeOptions(output_dir=tmp_path / "out", allow_missing=True))
        assert (res.status, res.exit_code) == ("failed", 2) and why in res.error, res.error


def test_a_root_name_heap_too_large_for_hdf5s_cache_is_damage_not_an_internal_error(tmp_path):
    """One flipped bit of the 2.10 fixture (byte 693, in the root's local heap's size) makes
    the root claim a heap of ~256 MiB; the metadata cache was asked for room for it, beyond the
    128 MiB HDF5 accepts: "internal error: RuntimeError: Unable to set metadata cache
    configuration", exit 1, and a run of several files stopped there. Now the room is capped
    at HDF5's limit and the file is refused as damaged (exit 2); the others are answered."""
    data = bytearray((FIXTURES / "release-2.10.mdl").read_bytes())
    data[693] ^= 0x80
    bad = tmp_path / "flipped.mdl"
    bad.write_bytes(data)
    for verb in (["inspect"], ["plan"], ["upgrade", "-o", tmp_path / "out"], ["check", "--deep"]):
        one_line_error(run_cli(*verb, bad), 2, "flipped.mdl", "damaged")
    good = FIXTURES / "release-2.0.mdl"
    proc = run_cli("upgrade", bad, good, "-o", tmp_path / "several")
    assert proc.returncode == 2, proc.stderr
    assert "internal error" not in proc.stderr and (tmp_path / "several" / good.name).is_file()
