"""Small files that declare enormous work are refused at once (``format.budgets``): a memo-bomb
spec, specs nested deeper than any state dict, a dataset declaring far more bytes than it
stores, and constant tensors declaring more than the file could hold. Each goes through the
commands in a fresh process with a 30 s cap; each is refused with exit 2 and one line, within
1 GiB of memory, leaving no output and the source unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import pytest
from conftest import FIXTURES, one_line_error, run_capped, sha256_file
from test_spec_codec import _bomb, _nested

import ckpt_migrate as cm
from ckpt_migrate.errors import CkptError, CorruptCheckpointError
from ckpt_migrate.format.h5.io import read_slab
from ckpt_migrate.format.read import read_checkpoint

GiB = 1 << 30


def _copy(tmp_path: Path, release: str) -> Path:
    src = tmp_path / "in" / "checkpoint_1.mdl"
    src.parent.mkdir()
    shutil.copyfile(FIXTURES / f"release-{release}.mdl", src)
    return src


def _legacy_spec(tmp_path: Path, pickle: bytes) -> Path:
    src = _copy(tmp_path, "2.0")
    with h5py.File(src, "r+") as f:
        f.attrs["__spec__"] = pickle.hex()
    return src


def _v05_nested(depth: int) -> str:
    """A treespec string nested ``depth`` dicts deep (built as text: ``json.dumps`` itself stops
    near a thousand levels)."""
    head = '{"type": "builtins.dict", "context": "[\\"a\\"]", "children_spec": ['
    leaf = '{"type": null, "context": null, "children_spec": []}'
    return "[1, " + head * depth + leaf + "]}" * depth + "]"


def _v05_spec(tmp_path: Path, depth: int) -> Path:
    src = _copy(tmp_path, "2.10")
    with h5py.File(src, "r+") as f:
        f.attrs["__spec__"] = json.dumps([None, _v05_nested(depth)])
    return src


def _unwritten(tmp_path: Path, elements: int) -> Path:
    """``model.double`` replaced by an LZ4-chunked dataset of ``elements`` float64 values, of
    which nothing is written (reading it returns fill values)."""
    src = _copy(tmp_path, "2.10")
    with h5py.File(src, "r+") as f:
        del f["model.double"]
        f.create_dataset(
            "model.double", (elements,), np.float64, chunks=(1 << 16,), **hdf5plugin.LZ4()
        )
    return src


def _full(tmp_path: Path, release: str) -> Path:
    """``misc.zeros`` (a constant tensor) declared as 16 GiB of float32 zeros."""
    src = _copy(tmp_path, release)
    with h5py.File(src, "r+") as f:
        if release == "2.0":
            f["misc.zeros"].attrs["shape"] = np.array([4 * GiB])
        else:
            meta = json.loads(f.attrs["misc.zeros.__metadata__"])
            meta["misc.zeros.__metadata__"]["shape"] = [4 * GiB]
            f.attrs["misc.zeros.__metadata__"] = json.dumps(meta)
    return src


HOSTILE = {
    "memo-bomb": (lambda t: _legacy_spec(t, _bomb(60)), "1,000,000 nodes"),
    "legacy-deep": (lambda t: _legacy_spec(t, _nested(900)), "nested more than 494 containers"),
    "treespec-deep": (lambda t: _v05_spec(t, 9000), "nested more than 494 containers"),
    "treespec-495": (lambda t: _v05_spec(t, 495), "nested more than 494 containers"),
    "unwritten-10^12": (lambda t: _unwritten(t, 10**12), "declares 7.3 TiB but stores 0 B"),
    "unwritten-16GiB": (lambda t: _unwritten(t, 2 * GiB), "declares 16.0 GiB but stores 0 B"),
    "full-16GiB-2.10": (lambda t: _full(t, "2.10"), "declare 16.0 GiB in all"),
    "full-16GiB-2.0": (lambda t: _full(t, "2.0"), "declare 16.0 GiB in all"),
}
COMMANDS = {
    "inspect": lambda src, out: ["inspect", src],
    "check --deep": lambda src, out: ["check", src, "--deep"],
    "plan": lambda src, out: ["plan", src],
    "verify": lambda src, out: ["verify", src, src],
    "upgrade": lambda src, out: ["upgrade", src, "--to", "2.10", "--output-dir", out],
    "upgrade-full": lambda src, out: ["upgrade", src, "--output-dir", out, "--verify", "full"],
    "to-torch": lambda src, out: ["to-torch", src, out / "w.pt"],
}
# Every kind through the commands that read the most (the memo bomb, at 5 s a run, through one);
# every command that reads the datasets for one kind. Since issue 33 ``check`` reads only the
# root's release attributes and ``plan`` of a file already current only the outline (no dataset
# opened: tests/test_outline_read.py): the unwritten dataset is not theirs to refuse; ``check
# --deep`` reads it, and ``plan`` still refuses what it reads, the spec.
CASES = (
    [(k, c) for k in HOSTILE for c in ("inspect", "verify", "to-torch") if k != "memo-bomb"]
    + [("memo-bomb", "inspect"), ("treespec-deep", "plan")]
    + [
        ("unwritten-10^12", c)
        for c in COMMANDS
        if c not in ("inspect", "verify", "to-torch", "plan")
    ]
)


@pytest.mark.parametrize(("kind", "command"), CASES)
def test_a_small_file_cannot_buy_minutes_or_gigabytes(tmp_path, kind, command):
    make, words = HOSTILE[kind]
    src = make(tmp_path)
    assert src.stat().st_size < 1 << 20
    digest = sha256_file(src)
    out = tmp_path / "out"
    out.mkdir()
    proc, peak_mib = run_capped(*COMMANDS[command](src, out))
    one_line_error(proc, 2, src.name, words)
    assert peak_mib < 1024
    assert list(out.iterdir()) == [] and sha256_file(src) == digest


@pytest.mark.parametrize("kind", ["unwritten-16GiB", "full-16GiB-2.10"])
def test_the_python_api_and_the_script_refuse_them(tmp_path, kind):
    make, words = HOSTILE[kind]
    src = make(tmp_path)
    with pytest.raises(CorruptCheckpointError, match=words):
        cm.load(src)
    with pytest.raises(CorruptCheckpointError, match=words):
        cm.CheckpointManager(src.parent).load(src)
    config = tmp_path / "params.yaml"
    config.write_text("model:\n  hidden_size: 16\n")
    proc, peak_mib = run_capped(
        "convert", src, "--model", "gpt2", "--src-fmt", "cs-2.0", "--tgt-fmt", "cs-2.10",
        "--config", config, "--output-dir", tmp_path / "out",
        script="convert_checkpoint.py",
    )  # fmt: skip
    one_line_error(proc, 2, words, skip_warnings=True)
    assert peak_mib < 1024


def test_legitimate_compression_and_constant_tensors_stay_within_budget(tmp_path):
    """What real checkpoints do is far inside the budgets: 64 MiB of zeros compressed by LZ4
    (over 100:1), an empty tensor, and a constant tensor 20 times the stored bytes."""
    src = tmp_path / "ok.mdl"
    zeros = np.zeros(16 << 20, np.float32)
    cm.save({"model": {"w": zeros, "e": np.zeros((0, 3), np.float32)}}, src)
    with h5py.File(src, "r+") as f:
        attrs = dict(f["model.w"].attrs)
        del f["model.w"]
        f.create_dataset("model.w", data=zeros, chunks=(1 << 20,), **hdf5plugin.LZ4())
        f["model.w"].attrs.update(attrs)
    assert src.stat().st_size < (64 << 20) / 100
    with read_checkpoint(src) as ckpt:
        assert ckpt.root is not None
    tree = cm.load(src)
    assert tree["model"]["w"].shape == (16 << 20,)


def test_a_tensor_in_a_chunk_far_larger_than_it_is_refused_before_decoding(tmp_path):
    """HDF5 decodes whole chunks: four float64 values in one gzip chunk of 64 MiB (a user's
    ``chunks=`` with ``maxshape=None``; 64 KiB on disk, within 1100:1 of what it stores) cost
    64 MiB per copy at every read, a file of many such tensors minutes. The chunk grid is held to
    the tensor's size, and the refusal says how to rewrite the file."""
    src = _copy(tmp_path, "2.10")
    with h5py.File(src, "r+") as f:
        attrs = dict(f["model.double"].attrs)
        del f["model.double"]
        ds = f.create_dataset(
            "model.double", data=np.arange(4.0).reshape(2, 2), chunks=(1 << 12, 1 << 11),
            maxshape=(None, None),
            compression="gzip", compression_opts=9,
        )  # fmt: skip
        ds.attrs.update(attrs)
    assert src.stat().st_size < 1 << 20
    proc, peak_mib = run_capped("check", src, "--deep")
    one_line_error(proc, 2, src.name, "chunks of 64.0 MiB")
    assert peak_mib < 1024
    with (
        h5py.File(src) as f,
        pytest.raises(CkptError, match=r"'model.double'.* chunks of 64.0 MiB.* -l CONTI"),
    ):
        read_slab(f["model.double"], ())


DEEP_JSON = "[" * 100_000 + "]" * 100_000  # past the recursion limit of CPython's JSON decoder


def test_json_nested_past_what_python_decodes_in_a_checkpoint(tmp_path):
    """The real 2.10 library's file with a leaf's ``__metadata__`` nested past what CPython's
    JSON decoder recurses through was refused as "HDF5 structures are damaged (maximum
    recursion depth exceeded …)", and a provenance record so nested refused the whole file,
    which is readable without it."""
    leaf = tmp_path / "leaf.mdl"
    shutil.copyfile(FIXTURES / "real-cstorch-2.10" / "basic.mdl", leaf)
    with h5py.File(leaf, "r+") as f:
        key = next(k for k in f.attrs if k.endswith(".__metadata__"))
        f.attrs[key] = DEEP_JSON
    proc, _ = run_capped("inspect", leaf)
    one_line_error(proc, 2, key, "is not valid JSON")
    record = tmp_path / "record.mdl"
    shutil.copyfile(FIXTURES / "real-cstorch-2.10" / "basic.mdl", record)
    with h5py.File(record, "r+") as f:
        f.attrs["__ckpt_migrate__"] = DEEP_JSON
    proc, _ = run_capped("inspect", record)
    assert proc.returncode == 0, proc.stderr
