"""``verify`` from the headers (``format.headercompare``, issue 33): where it answers, its answer
is the comparison through HDF5's (``commands._verify_walked``), on files this tool did not
write (the real 2.10 library's, Model Zoo's converter outputs, a 1.9 file laid out as the 1.9
library wrote it) and on their upgrades and downgrades; no dataset is opened through HDF5 in
this process; and what it cannot vouch for (a header HDF5 cannot read, a damaged chunk in
the first file, other stored bytes) is compared through HDF5, which refuses or decides it
as before."""

from __future__ import annotations

import lzma
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import FIXTURES, REAL, real_2x_files

import ckpt_migrate as cm
from ckpt_migrate.cli import commands
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.errors import CkptError
from ckpt_migrate.format import headercompare
from ckpt_migrate.format.h5 import linktable
from ckpt_migrate.format.h5.io import H5Handle

CONVERTED = FIXTURES / "modelzoo-2.10-converted"
# real 2.10 files whose outline answers (the others hold leaves a full read is needed for)
REAL_NAMES = ("basic", "dtypes", "empty", "emptyish", "nested", "tied", "dataloader_map")


def _upgraded(src: Path, target: str, out: Path) -> Path:
    options = UpgradeOptions(target=target, output_dir=out, inputs={"drop_dataloader_state": True})
    assert upgrade(src, options).error is None
    return out / src.name


def _sources(tmp_path: Path, real_layout_19: Path, group: str) -> list[tuple[Path, str]]:
    """Files this tool did not write (the real 2.6-2.10 libraries', Model Zoo's, a 1.9 file
    laid out as its library wrote it; and one of ours, with a scheduler and an empty tensor),
    each with the release to upgrade or downgrade it to: a 2.10 file to 2.3, the others to
    2.10. ``group``: one of ``SOURCE_GROUPS`` (a test each, shared out among the workers)."""
    found = []
    if group == "real 2.10":
        for name in REAL_NAMES:
            found.append((tmp_path / f"{name}.mdl", "2.3"))
            shutil.copyfile(REAL / f"{name}.mdl", found[-1][0])
    elif group == "model zoo":
        for packed in sorted(CONVERTED.glob("*.mdl.xz")):
            found.append((tmp_path / packed.name.removesuffix(".xz"), "2.10"))
            found[-1][0].write_bytes(lzma.decompress(packed.read_bytes()))
    elif group == "1.9":
        found.append((tmp_path / "release-1.9.mdl", "2.3"))
        shutil.copyfile(FIXTURES / "release-1.9.mdl", found[-1][0])
        found.append((tmp_path / "layout-1.9.mdl", "2.10"))
        shutil.copyfile(real_layout_19, found[-1][0])
    else:
        # (the real 2.6-2.9 libraries': a model and a Trainer's file, and each release's dtypes
        # and ties; their other cases hold leaves only a full read gives)
        (tmp_path / "2x").mkdir()
        found += [(p, "2.10") for p in real_2x_files(tmp_path / "2x")]
        for packed in sorted((FIXTURES / "real-cstorch-2.6-2.9" / "by-release").glob("*.mdl.xz")):
            if packed.name.startswith(("dtypes-", "tied-")):
                found.append((tmp_path / "2x" / packed.name.removesuffix(".xz"), "2.10"))
                found[-1][0].write_bytes(lzma.decompress(packed.read_bytes()))
    return found


SOURCE_GROUPS = ("real 2.10", "model zoo", "1.9", "real 2.6-2.9")


@pytest.mark.parametrize("group", SOURCE_GROUPS)
def test_it_answers_as_the_comparison_through_hdf5(group, tmp_path, real_layout_19):
    """Each file against itself and its upgrade (or downgrade), both ways."""
    pairs = []
    for src, target in _sources(tmp_path, real_layout_19, group):
        out = _upgraded(src, target, tmp_path / f"to-{target}")
        pairs += [(src, src), (src, out), (out, src)]
    assert pairs
    for a, b in pairs:
        found = headercompare.compare(a, b)
        assert found is not None, (a, b)
        assert found == commands._verify_walked(a, b, False, None), (a, b)


def test_no_dataset_is_opened_through_hdf5_here(tmp_path, real_layout_19, monkeypatch):
    """``verify`` of a 2.10 file against its downgrade and of a 1.9 file laid out by its
    library against its upgrade: no dataset opened in this process (the walk's children try
    them), every tensor equal as stored."""
    pairs = [
        (src, _upgraded(src, target, tmp_path / target))
        for src, target in ((REAL / "tied.mdl", "2.3"), (real_layout_19, "2.10"))
    ]

    def refused(*args, **kwargs):
        raise AssertionError("a dataset opened through HDF5")

    monkeypatch.setattr(H5Handle, "dataset_id", refused)
    monkeypatch.setattr(H5Handle, "dataset", refused)
    for a, b in pairs:
        said = commands.verify(a, b)
        assert said["tensors_compared"] == said["tensors_equal_as_stored"] > 0


def _header_of(path: Path, name: str) -> int:
    with h5py.File(path, "r") as f:
        found = linktable.of_root(f, path)
    assert found is not None
    return found[name]


def test_a_header_hdf5_cannot_read_is_refused_as_before(tmp_path):
    """A dataset's fill value message (which the headers read here do not look at) claiming
    126 bytes of value it does not hold: HDF5 cannot decode the header (what ``fuzz_damage``
    found). No answer from the headers; ``verify`` refuses the file as the comparison through
    HDF5 does (exit 2)."""
    src = tmp_path / "dtypes.mdl"
    shutil.copyfile(REAL / "dtypes.mdl", src)
    case = tmp_path / "damaged.mdl"
    data = bytearray(src.read_bytes())
    # (version 1 message: type 5, 8 bytes; its body: version 2, the times, defined, then size)
    fill = data.index(b"\x05\x00\x08\x00\x01\x00\x00\x00\x02", _header_of(src, "slice_view"))
    assert data[fill + 12 : fill + 16] == bytes(4)
    data[fill + 12] = 126
    case.write_bytes(bytes(data))
    for a, b in ((case, src), (src, case), (case, case)):
        assert headercompare.compare(a, b) is None
        with pytest.raises(CkptError) as walked:
            commands._verify_walked(a, b, False, None)
        with pytest.raises(CkptError) as said:
            commands.verify(a, b)
        assert str(said.value) == str(walked.value) and said.value.exit_code == 2


def _damaged_frame(src: Path, name: str, out: Path) -> None:
    """``src`` with the LZ4 frame of tensor ``name``'s first chunk claiming one byte more."""
    with h5py.File(src, "r") as f:
        offset = f[name].id.get_chunk_info(0).byte_offset
    data = bytearray(src.read_bytes())
    original = int.from_bytes(data[offset : offset + 8], "big")
    data[offset : offset + 8] = (original + 1).to_bytes(8, "big")
    out.write_bytes(bytes(data))


def test_a_damaged_chunk_is_refused_as_before(tmp_path):
    """A chunk whose frame does not hold one chunk: in the first file (whose chunks are
    checked), or in the second (whose bytes then differ from the first's, and both are
    decoded). No answer from the headers: the comparison through HDF5 refuses it, in its
    words."""
    src = tmp_path / "basic.mdl"
    shutil.copyfile(REAL / "basic.mdl", src)
    with h5py.File(src, "r") as f:
        name = next(n for n in f if f[n].chunks is not None)
    case = tmp_path / "damaged.mdl"
    _damaged_frame(src, name, case)
    for a, b in ((case, src), (src, case)):
        assert headercompare.compare(a, b) is None
        with pytest.raises(CkptError) as walked:
            commands._verify_walked(a, b, False, None)
        with pytest.raises(CkptError) as said:
            commands.verify(a, b)
        assert said.value.exit_code == 2 and repr(name) in str(said.value)
        assert str(said.value) == str(walked.value)


def test_other_bytes_are_left_to_the_hash(tmp_path):
    """Two files whose tensors are stored alike with other bytes: no answer from the headers;
    ``verify`` decodes and hashes them, and names the one that differs."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    cm.save({"w": w, "v": w + 1}, tmp_path / "a.mdl")
    cm.save({"w": w, "v": w + 2}, tmp_path / "b.mdl")
    a, b = tmp_path / "a.mdl", tmp_path / "b.mdl"
    assert headercompare.compare(a, b) is None
    said = commands.verify(a, b)
    assert said["differences"] == [{"name": "v", "what": "tensor data differs"}]
    assert said["tensors_equal_as_stored"] == 1


def test_a_file_written_meanwhile_voids_the_answer(tmp_path, monkeypatch):
    """The second file replaced while the headers are compared: no verdict on either
    version."""
    src = tmp_path / "tied.mdl"
    shutil.copyfile(REAL / "tied.mdl", src)
    out = _upgraded(src, "2.3", tmp_path / "out")
    compare_trees = headercompare.compare_trees

    def then_replaced(*args, **kwargs):
        found = compare_trees(*args, **kwargs)
        os.utime(out, ns=(1, 1))
        return found

    monkeypatch.setattr(headercompare, "compare_trees", then_replaced)
    with pytest.raises(CkptError, match="the comparison does not hold"):
        commands.verify(src, out)


def test_a_root_edits_full_verification_reads_the_headers(tmp_path, monkeypatch):
    """``upgrade --verify full`` of a root edit (the real 2.6 library's file to 2.10, the
    real 2.10 library's to 2.5) compares each reused tensor's storage from both headers: no
    dataset of the source opened through HDF5, and so no full walk of it run."""
    from ckpt_migrate.format.h5 import preflight

    (gpt2,) = [p for p in real_2x_files(tmp_path) if p.name.startswith("gpt2-2.6.0")]
    walks: list[str] = []
    begin = preflight._Walk.begin
    monkeypatch.setattr(
        preflight._Walk,
        "begin",
        classmethod(lambda cls, p, scope="full": walks.append(scope) or begin(p, scope)),
    )

    def refused(*args, **kwargs):
        raise AssertionError("a dataset opened through HDF5")

    monkeypatch.setattr(H5Handle, "dataset", refused)
    for src, target in ((gpt2, "2.10"), (REAL / "tied.mdl", "2.5")):
        opts = UpgradeOptions(target=target, output_dir=tmp_path / target, verify="full")
        result = upgrade(src, opts)
        assert (result.status, result.strategy, result.verified) == (
            "upgraded",
            "root-edit",
            "full",
        ), result.error
    assert "full" not in walks, walks


def test_a_reused_tensors_other_index_is_refused_from_the_headers(tmp_path, monkeypatch):
    """The stored size of a reused tensor's chunk changed in the output's chunk index after
    the root edit's copy and edit: ``--verify full`` refuses it, naming the tensor, as
    through HDF5."""
    from ckpt_migrate.engine import rootedit

    src = tmp_path / "basic.mdl"
    shutil.copyfile(REAL / "basic.mdl", src)
    with h5py.File(src, "r") as f:
        name = next(n for n in f if f[n].chunks is not None)
        chunk = f[name].id.get_chunk_info(0).byte_offset
        key = 8 + 8 * (f[name].ndim + 1)
    real = rootedit.edit_root

    edited: list[Path] = []

    def edit_then_change(path, edit):
        real(path, edit)
        edited.append(path)
        data = bytearray(path.read_bytes())
        node = data.find(b"TREE\x01\x00\x01\x00")
        while data[node + 24 + key : node + 32 + key] != chunk.to_bytes(8, "little"):
            node = data.find(b"TREE\x01\x00\x01\x00", node + 1)
            assert node >= 0
        size = int.from_bytes(data[node + 24 : node + 28], "little")
        data[node + 24 : node + 28] = (size + 1).to_bytes(4, "little")
        path.write_bytes(bytes(data))

    monkeypatch.setattr(rootedit, "edit_root", edit_then_change)
    opts = UpgradeOptions(target="2.5", output_dir=tmp_path / "out", verify="full")
    result = upgrade(src, opts)
    assert result.status == "failed" and len(edited) == 1, result.error  # (a root edit)
    assert f"tensor {name!r}: its chunk index differs from its source's" in result.error
    assert not (tmp_path / "out" / src.name).exists()
