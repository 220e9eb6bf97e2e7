"""Upgrades whose hops change no dataset edit only the root (issue 33): 2.5-2.10 either way.

The output must equal what the copy-patch writes (every object, attribute and tensor), while
every dataset stays where it was, untouched, and the bytes that differ from the source do not
grow with the tensor count."""

from __future__ import annotations

import hashlib
import json
import lzma
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import run_cli, same_bytes
from loopfs import mounted, unavailable

from ckpt_migrate.engine import rootedit
from ckpt_migrate.engine import upgrade as engine
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.format.h5 import capi
from ckpt_migrate.format.provenance import PROVENANCE_ATTR
from ckpt_migrate.format.tree import (
    DictNode,
    MemoryData,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
    iter_leaves,
)
from ckpt_migrate.format.write import write_checkpoint

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "fixtures" / "real-cstorch-2.10"


def _tree(experts: int, release: str, params: Any = None) -> DictNode:
    """A small MoE training checkpoint: per expert a weight, its two Adam moments and a step;
    a tie, a None, a string, and the Trainer's ``__metadata__`` list."""
    model, state = [], []
    for e in range(experts):
        w = TensorLeaf("float32", (4, 2), MemoryData(np.full((4, 2), e, np.float32)))
        model.append((f"experts.{e}.w1.weight", w))
        moments = [
            (m, TensorLeaf("float32", (4, 2), MemoryData(np.zeros((4, 2), np.float32))))
            for m in ("exp_avg", "exp_avg_sq")
        ]
        step = TensorLeaf("float32", (), MemoryData(np.array(7, np.float32)))
        state.append((e, DictNode([("step", step), *moments])))
    model.append(("lm_head.weight", model[0][1]))  # a tie
    entry = DictNode(
        [
            ("version", ValueLeaf(f"{release}.0")),
            ("model_name", ValueLeaf("moe")),
            ("params", params if params is not None else DictNode([("lr", ValueLeaf(1e-4))])),
        ]
    )
    return DictNode(
        [
            ("model", DictNode(model)),
            ("optimizer", DictNode([("state", DictNode(state))])),
            ("note", ValueLeaf("moe run")),
            ("nothing", ValueLeaf(None)),
            ("__metadata__", SeqNode("list", [entry])),
        ]
    )


def _source(path: Path, experts: int = 50, release: str = "2.5", params: Any = None) -> Path:
    write_checkpoint(_tree(experts, release, params), path, release)
    return path


def _ours_or_real(tmp_path: Path, source: str, experts: int) -> Path:
    """A 2.5 file of ours (``ours``) or the real 2.6-2.9 library's file of that name."""
    if source == "ours":
        return _source(tmp_path / "src.mdl", experts=experts)
    src = tmp_path / f"{source}.mdl"
    packed = ROOT / "fixtures" / "real-cstorch-2.6-2.9" / f"{source}.mdl.xz"
    src.write_bytes(lzma.decompress(packed.read_bytes()))
    return src


def _upgrade(src: Path, out: Path, to: str = "2.10", **kw: Any):
    result = upgrade(src, UpgradeOptions(target=to, output_dir=out, **kw))
    assert result.status == "upgraded", result.error
    return result, out / src.name


def _patched(src: Path, out: Path, monkeypatch: pytest.MonkeyPatch, to: str = "2.10") -> Path:
    """The same upgrade as the copy-patch writes it."""
    with monkeypatch.context() as m:
        m.setattr(engine, "_may_edit_root", lambda plan: False)
        result, path = _upgrade(src, out, to)
    assert result.strategy != rootedit.STRATEGY
    return path


def _logical(path: Path) -> dict[str, Any]:
    """Every object of ``path``: attributes by name (the provenance record without its time
    and source digest), and each dataset's type, shape, layout, filters and data."""

    def attrs(obj: Any) -> dict[str, Any]:
        out = {}
        for key in sorted(obj.attrs):
            value = obj.attrs[key]
            if key == "__ckpt_migrate__":
                entries = json.loads(value)
                for e in entries:
                    for k in ("time", "source_xxh3_128", "source_identity"):
                        e.pop(k, None)
                value = json.dumps(entries)
            out[key] = repr(value) + (str(value.dtype) if hasattr(value, "dtype") else "")
        return out

    with h5py.File(path, "r") as f:
        found: dict[str, Any] = {"/": attrs(f)}

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                data = obj[()] if obj.shape is not None else None
                digest = None if data is None else hashlib.sha256(np.asarray(data).tobytes())
                found[name] = (
                    str(obj.dtype),
                    obj.shape,
                    obj.chunks,
                    obj.compression,
                    digest and digest.hexdigest(),
                    attrs(obj),
                )
            else:
                found[name] = attrs(obj)

        f.visititems(visit)
    return found


def _dataset_headers(path: Path) -> dict[str, tuple[int, bytes]]:
    """Each dataset's object header address and its first 256 bytes."""
    found: dict[str, tuple[int, bytes]] = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, obj: (
                found.setdefault(name, (h5py.h5o.get_info(obj.id).addr, b""))
                if isinstance(obj, h5py.Dataset)
                else None
            )
        )
    with open(path, "rb") as fh:
        for name, (addr, _) in found.items():
            fh.seek(addr)
            found[name] = (addr, fh.read(256))
    return found


def _blocks_differing(a: Path, b: Path, block: int = 4096) -> int:
    x, y = a.read_bytes(), b.read_bytes()
    return sum(x[i : i + block] != y[i : i + block] for i in range(0, len(x), block))


def test_a_chain_that_changes_no_dataset_edits_only_the_root(tmp_path, monkeypatch):
    """2.5 -> 2.10: the output is the copy-patch's, object for object; every dataset keeps its
    object header, untouched, and what differs from the source does not grow with the tensor
    count (the same handful of blocks at 50 and at 400 experts)."""
    differing = []
    for experts in (50, 400):
        src = _source(tmp_path / f"src{experts}.mdl", experts)
        result, out = _upgrade(src, tmp_path / f"edit{experts}")
        assert result.strategy == rootedit.STRATEGY and result.verified == "index"
        assert result.tensors == 4 * experts
        assert _logical(out) == _logical(_patched(src, tmp_path / f"patch{experts}", monkeypatch))
        assert _dataset_headers(out) == _dataset_headers(src)
        differing.append(_blocks_differing(src, out))
    assert differing[1] <= differing[0] + 4, differing


@pytest.mark.parametrize("name", ["basic", "tied", "scalars_misc", "dtypes", "nested"])
def test_the_real_librarys_files_go_down_by_a_root_edit_as_the_copy_patch_writes_them(
    name, tmp_path, monkeypatch
):
    """Files of the real 2.10 writer (ties, values, every dtype) down to 2.6: their dataset
    attributes and leaf metadata are what the writer here writes, so keeping them gives the
    copy-patch's output."""
    src = REAL / f"{name}.mdl"
    result, out = _upgrade(src, tmp_path / "edit", "2.6")
    assert result.strategy == rootedit.STRATEGY
    assert _logical(out) == _logical(_patched(src, tmp_path / "patch", monkeypatch, "2.6"))


def test_the_plan_says_whether_datasets_change(tmp_path):
    src = _source(tmp_path / "src.mdl")
    changed = {}
    for path, to in (
        (src, "2.10"),
        (REAL / "basic.mdl", "2.5"),
        (ROOT / "fixtures" / "release-2.3.mdl", "2.10"),
    ):
        proc = run_cli("plan", path, "--to", to, "--json")
        assert proc.returncode == 0, proc.stderr
        changed[(path.name, to)] = json.loads(proc.stdout)["datasets_changed"]
    assert changed == {
        ("src.mdl", "2.10"): False,
        ("basic.mdl", "2.5"): False,
        ("release-2.3.mdl", "2.10"): True,  # 2.4 -> 2.5: format 0.4 -> 0.5, every dataset
    }


def test_a_tensor_in_the_params_is_a_new_dataset_so_the_tree_is_patched(tmp_path):
    """The ``__metadata__`` entry the upgrade adds copies the last one's params: a tensor
    there becomes a new dataset, which a root edit cannot write."""
    params = DictNode([("mask", TensorLeaf("int64", (3,), MemoryData(np.arange(3))))])
    src = _source(tmp_path / "src.mdl", params=params)
    result, out = _upgrade(src, tmp_path / "out")
    assert result.strategy != rootedit.STRATEGY
    with h5py.File(out, "r") as f:
        assert list(f["__metadata__.1.params.mask"][()]) == [0, 1, 2]


def test_datasets_no_leaf_names_are_left_behind_by_the_copy_patch(tmp_path):
    """A dataset the spec does not name is not carried into the output (as before): the root
    edit would keep it, so the tree is patched instead."""
    src = _source(tmp_path / "src.mdl")
    with h5py.File(src, "r+") as f:
        f["stray"] = np.arange(4)
    result, out = _upgrade(src, tmp_path / "out")
    assert result.strategy != rootedit.STRATEGY
    with h5py.File(out, "r") as f:
        assert "stray" not in f


def test_a_root_edit_is_verified_like_any_output(tmp_path, monkeypatch):
    """A leaf metadata the edit writes wrong fails the read-back: nothing is published."""
    src = _source(tmp_path / "src.mdl")
    real = rootedit.metadata_text
    monkeypatch.setattr(
        rootedit,
        "metadata_text",
        lambda name, leaf, first: real(
            name, ValueLeaf("2.9.0") if name.endswith("1.version") else leaf, first
        ),
    )
    result = upgrade(src, UpgradeOptions(target="2.10", output_dir=tmp_path / "out"))
    assert result.status == "failed" and result.exit_code != 0
    assert "expected tree" in (result.error or "")
    assert not (tmp_path / "out" / src.name).exists()


def test_full_verification_and_a_manifest_read_every_tensor_of_a_root_edit(tmp_path):
    src = _source(tmp_path / "src.mdl")
    manifest = tmp_path / "m.json"
    result, _ = _upgrade(src, tmp_path / "out", manifest=manifest)
    assert result.strategy == rootedit.STRATEGY and result.verified == "full"
    assert len(json.loads(manifest.read_text())["tensors"]) == 4 * 50 + 1  # the tie too


def test_on_a_filesystem_that_shares_extents_the_root_edit_is_a_clone(tmp_path_factory):
    """XFS with reflink: the output shares all but the few blocks of the edited root with
    its source (FIEMAP), and reads back as the source's tensors."""
    reason = unavailable("xfs")
    if reason:
        pytest.skip(f"no xfs to share extents on: {reason}")
    try:
        with mounted("xfs", 400 << 20, tmp_path_factory.mktemp("fs")) as mnt:
            src = _source(mnt / "src.mdl", 400)
            result, out = _upgrade(src, mnt / "out")
            assert (result.strategy, result.copy_method) == (rootedit.STRATEGY, "clone")
            size = src.stat().st_size
            assert result.bytes_shared >= size - 64 * 4096, (result.bytes_shared, size)
            assert _dataset_headers(out) == _dataset_headers(src)
    except RuntimeError as exc:
        pytest.skip(f"cannot make an xfs filesystem here: {exc}")


def test_an_index_verified_root_edit_keeps_a_count_of_its_tensors_not_their_places(
    tmp_path, monkeypatch
):
    """``Written.linked`` (an entry per tensor: 29 MB at 150k) is made only where a check reads
    it: the tree's re-read, the full verification, each on the edit planned again from a
    second read of the source once the edit is written (the first let go of its tree before
    HDF5 rewrote the spec, the peak). Made there, it names every tensor at its first place (a
    tie's other places not), each the source's dataset of its own name."""
    src = _source(tmp_path / "src.mdl", experts=5)
    edits: list[rootedit.Edit] = []
    real = rootedit.edit_root
    monkeypatch.setattr(
        rootedit, "edit_root", lambda path, edit: edits.append(edit) or real(path, edit)
    )
    placed: list[rootedit.Edit] = []
    place_all = rootedit.Edit.place_all
    monkeypatch.setattr(
        rootedit.Edit, "place_all", lambda edit: placed.append(edit) or place_all(edit)
    )
    result, _ = _upgrade(src, tmp_path / "index")
    assert result.strategy == rootedit.STRATEGY and result.tensors == 4 * 5
    assert edits[-1].linked == set() and edits[-1].tensors == 4 * 5 and not placed
    result, _ = _upgrade(src, tmp_path / "full", verify="full")
    assert result.verified == "full" and edits[-1].let_go_of
    assert len(placed) == 1 and placed[0] is not edits[-1]
    linked = placed[0].linked
    firsts: dict[int, str] = {}  # (each tensor's first place: a tie's others are no dataset)
    for ref in iter_leaves(placed[0].root):
        if id(ref.leaf) in linked:
            firsts.setdefault(id(ref.leaf), ref.name)
    names = list(firsts.values())
    assert len(linked) == 4 * 5 and "model.lm_head.weight" not in names
    assert "model.experts.0.w1.weight" in names and "optimizer.state.4.step" in names


@pytest.mark.parametrize("source", ["ours", "trainer-2.9.0", "gpt2-2.6.0"])
def test_the_texts_hdf5_is_handed_are_stored_as_h5py_stores_them(tmp_path, monkeypatch, source):
    """A text rewritten in place, or created, by HDF5's own calls (its UTF-8 bytes, no copy)
    leaves the same file as h5py's write of the same text (``capi.write`` and ``capi.create``
    refused: the path taken where the library's own calls cannot be found): on a root this
    tool wrote and on the real 2.9 and 2.6 libraries' roots, their own ``__spec__`` rewritten
    among the texts."""
    src = _ours_or_real(tmp_path, source, experts=2)
    with h5py.File(src, "r") as f:
        spec = f.attrs["__spec__"]
    texts = {
        "note.__metadata__": "ünïcode json",
        "__cstorch_version__": "2.10.0",
        "__spec__": spec.replace("[", "[ ", 1),
    }
    outs = []
    for via in ("capi", "h5py"):
        out = tmp_path / f"{via}.mdl"
        out.write_bytes(src.read_bytes())
        with monkeypatch.context() as m:
            if via == "h5py":  # (a new attribute's creation refused too: ``create_text``)
                m.setattr(capi, "write", lambda attr, value: False)
                m.setattr(capi, "create", lambda *args: False)
            raw = {name: rootedit._utf8(text) for name, text in texts.items()}
            rootedit.edit_root(out, rootedit.Edit(raw, [], DictNode([])))
        outs.append(same_bytes(out))  # (but for the root's times: the second each edit ran in)
        with h5py.File(out, "r") as f:
            assert {name: f.attrs[name] for name in texts} == texts
    assert outs[0] == outs[1]


def test_a_structure_the_hops_left_alone_is_not_written_again(tmp_path, monkeypatch):
    """The real 2.10 library's ``tied.mdl`` (no Trainer ``__metadata__``: no hop changes its
    structure) down to 2.6: its ``__spec__`` is known unchanged by its pair in the reader's
    digest, so the edit sets only the release and the provenance record; a chain that adds a
    ``__metadata__`` entry writes the new structure."""
    edits: list[rootedit.Edit] = []
    real = rootedit.edit_root
    monkeypatch.setattr(
        rootedit, "edit_root", lambda path, edit: edits.append(edit) or real(path, edit)
    )
    src = REAL / "tied.mdl"
    result, out = _upgrade(src, tmp_path / "tied", "2.6")
    assert result.strategy == rootedit.STRATEGY and result.verified == "index"
    assert set(edits[-1].set) == {"__cstorch_version__", PROVENANCE_ATTR}
    # (without HDF5's file lock, as every reader here opens it: ``cm.load``'s lazy tensors
    # of another test, freed by the collector only, may still hold this fixture open without
    # it, and HDF5 opens a file once per process with one set of lock flags)
    with h5py.File(src, "r", locking=False) as before, h5py.File(out, "r") as after:
        assert after.attrs["__spec__"] == before.attrs["__spec__"]
        assert after.attrs["__cstorch_version__"] == "2.6.0"
    assert _logical(out) == _logical(_patched(src, tmp_path / "patch", monkeypatch, "2.6"))
    _upgrade(_source(tmp_path / "src.mdl", experts=2), tmp_path / "ours")
    assert "__spec__" in edits[-1].set


@pytest.mark.parametrize("source", ["ours", "trainer-2.9.0"])
def test_a_root_edits_full_verification_names_the_tensor_whose_stored_byte_changed(
    tmp_path, monkeypatch, source
):
    """One stored byte of a tensor changed in the output after HDF5's edit of its root: the
    full verification (on the edit planned again from a second read of the source, the first
    plan's tree let go of before the edit) fails naming that tensor and the byte, exit 4, and
    publishes nothing; the index verification does not read tensor data."""
    src = _ours_or_real(tmp_path, source, experts=5)
    with h5py.File(src, "r") as f:
        chunked = [n for n in f if isinstance(f[n], h5py.Dataset) and f[n].chunks is not None]
        tensor = chunked[len(chunked) // 2]
        info = f[tensor].id.get_chunk_info(f[tensor].id.get_num_chunks() - 1)
    at = info.byte_offset + info.size // 2
    real = rootedit.edit_root

    def edit_then_flip(path: Path, edit: rootedit.Edit) -> None:
        real(path, edit)
        with open(path, "r+b") as fh:
            fh.seek(at)
            byte = fh.read(1)
            fh.seek(at)
            fh.write(bytes([byte[0] ^ 0x04]))

    monkeypatch.setattr(rootedit, "edit_root", edit_then_flip)
    out = tmp_path / "out"
    inputs = {"drop_dataloader_state": True}
    result = upgrade(src, UpgradeOptions(output_dir=out, verify="full", inputs=inputs))
    assert (result.status, result.exit_code) == ("failed", 4), result.error
    assert f"tensor {tensor!r} differs from its source (stored byte at {at:,})" in result.error
    assert not out.exists() or not list(out.iterdir())


def test_the_spans_kept_for_the_stored_comparison_merge_as_merge_spans_does():
    """``storedspans.Spans`` (offsets in arrays, each with its tensor's position) merges as
    ``splitcopy.merge_spans`` does, touching and overlapping spans together, and finds the
    first tensor added whose span holds a byte, and every span of a tensor."""
    from ckpt_migrate.engine.splitcopy import merge_spans
    from ckpt_migrate.engine.storedspans import Spans

    rng = np.random.default_rng(7)
    for case in range(200):
        spans, kept, total = [], Spans(), 0
        for position in range(int(rng.integers(0, 30))):
            mine = []
            for _ in range(int(rng.integers(1, 4))):
                start = int(rng.integers(0, 2000)) + (1 << 40) * (case % 2)
                mine.append((start, start + int(rng.integers(1, 80))))
            spans.extend(mine)
            merged = merge_spans(list(mine))
            kept.add(merged, position)
            total += sum(b - a for a, b in merged)
        assert list(kept.merged()) == merge_spans(list(spans))
        assert kept.total() == total
    kept = Spans()
    kept.add([(10, 20), (40, 50)], 3)
    kept.add([(15, 30)], 7)
    assert (kept.owner(17), kept.owner(25), kept.owner(45)) == (3, 7, 3)
    assert kept.of(3) == [(10, 20), (40, 50)] and kept.of(7) == [(15, 30)]
    assert list(Spans().merged()) == [] and Spans().total() == 0
