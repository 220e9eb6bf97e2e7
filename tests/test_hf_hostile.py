"""Hostile Hugging Face inputs (issues #18 and #23): a crafted safetensors header or config.json
is one clean line with exit 2, quickly, and nothing is written."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import MODELS, one_line_error, run_capped, run_cli
from test_chunks import _index_entry, _patch

safetensors_numpy = pytest.importorskip("safetensors.numpy")

CONFIG = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_embd": 8,
    "n_layer": 1,
    "n_head": 2,
    "n_positions": 16,
    "vocab_size": 32,
}


def _directory(tmp_path: Path, header: object, config: dict | None = None) -> Path:
    d = tmp_path / "hf"
    d.mkdir()
    raw = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(64))
    (d / "config.json").write_text(json.dumps(config or CONFIG))
    return d


ENTRY = {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}


@pytest.mark.parametrize(
    ("header", "words"),
    [
        ([1, 2, 3], "header is not an object"),
        ({"wte.weight": "x"}, "not a safetensors tensor entry"),
        ({"wte.weight": {"dtype": "F32", "shape": [4, 4]}}, "not a safetensors tensor entry"),
        ({"wte.weight": {**ENTRY, "shape": [-4, -4]}}, "shape and byte range disagree"),
        ({"wte.weight": {**ENTRY, "data_offsets": [-64, 0]}}, "shape and byte range disagree"),
        ({"wte.weight": {**ENTRY, "shape": [4, 8], "data_offsets": [0, 128]}}, "does not fit"),
        ({"wte.weight": {**ENTRY, "dtype": "OBJ"}}, "unsupported safetensors dtype"),
    ],
)
def test_a_crafted_safetensors_header_is_one_line(tmp_path, header, words):
    src = _directory(tmp_path, header)
    proc = run_cli("import-hf", src, tmp_path / "out.mdl", "--model", "gpt2")
    one_line_error(proc, 2, "model.safetensors", words)
    assert not (tmp_path / "out.mdl").exists()


def test_a_declared_layer_count_cannot_buy_minutes(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    safetensors_numpy.save_file(
        {"wte.weight": np.zeros((32, 8), np.float32)}, d / "model.safetensors"
    )
    (d / "config.json").write_text(json.dumps({**CONFIG, "n_layer": 10**9}))
    start = time.monotonic()
    proc = run_cli("import-hf", d, tmp_path / "out.mdl", "--model", "gpt2")
    one_line_error(proc, 2, "n_layer is 1000000000", "1 tensors")
    assert time.monotonic() - start < 30


def test_a_huge_config_is_not_read(tmp_path):
    src = _directory(tmp_path, {"wte.weight": ENTRY})
    with (src / "config.json").open("w") as f:
        f.truncate(17 << 20)  # sparse: 17 MiB of zeros
    proc = run_cli("import-hf", src, tmp_path / "out.mdl", "--model", "gpt2")
    one_line_error(proc, 2, "config.json", "not a config")


def test_a_checkpoint_whose_chunk_lies_past_its_end_exports_nothing(tmp_path):
    """The export reads the tree while the preflight walks the chunk indexes: a chunk whose
    address points past the end of the file is refused, in one line, before any tensor is
    read, and no output directory is left."""
    src = tmp_path / "checkpoint_100.mdl"
    shutil.copyfile(MODELS / "gpt2-2.0" / "checkpoint_100.mdl", src)
    with h5py.File(src, "r") as f:
        names: list[str] = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        name = next(n for n in names if f[n].chunks is not None)
        ndim = len(f[name].shape)
    at, _ = _index_entry(src, name, 0)
    _patch(src, at + 8 + 8 * (ndim + 1), struct.pack("<Q", src.stat().st_size + (1 << 20)))
    out = tmp_path / "hf"
    proc = run_cli("export-hf", src, out, "--config", MODELS / "gpt2-2.0" / "params.yaml")
    one_line_error(proc, 2, "past the end of the file")
    assert not out.exists()


DEEP = "[" * 100_000 + "]" * 100_000  # past the recursion limit of CPython's JSON decoder


@pytest.mark.parametrize(
    "name", ["config.json", "model.safetensors.index.json", "model.safetensors"]
)
def test_json_nested_past_what_python_decodes_is_one_line(tmp_path, name):
    """CPython's decoder meets ``[[[[…`` as a RecursionError, which was an internal error."""
    src = _directory(tmp_path, {"wte.weight": ENTRY})
    if name == "model.safetensors":
        (src / name).write_bytes(struct.pack("<Q", len(DEEP)) + DEEP.encode())
    else:
        (src / name).write_text(DEEP)
    proc = run_cli("import-hf", src, tmp_path / "out.mdl", "--model", "gpt2")
    one_line_error(proc, 2, name, "nested too deeply")
    assert not (tmp_path / "out.mdl").exists()


@pytest.mark.parametrize(
    ("index", "words"),
    [
        ([1, 2], "no weight_map object"),
        ({"weight_map": ["model.safetensors"]}, "no weight_map object"),
        ({"weight_map": {"wte.weight": 7}}, "names 7"),
        ({"weight_map": {"wte.weight": "../outside/model.safetensors"}}, "not a file of its"),
        ({"weight_map": {"wte.weight": "OUTSIDE"}}, "not a file of its"),
        ({"weight_map": {"wte.weight": ".."}}, "not a file of its"),
    ],
)
def test_a_shard_index_names_only_files_beside_it(tmp_path, index, words):
    """A ``weight_map`` is refused unless it maps to plain file names: a path out of the
    directory was followed (and a real safetensors file there imported, with success), a list
    was an internal error."""
    outside = tmp_path / "outside"
    outside.mkdir()
    safetensors_numpy.save_file(
        {"wte.weight": np.ones((32, 8), np.float32)}, outside / "model.safetensors"
    )
    src = _directory(tmp_path, {"wte.weight": ENTRY})
    (src / "model.safetensors").unlink()
    if "OUTSIDE" in json.dumps(index):
        index = {"weight_map": {"wte.weight": str(outside / "model.safetensors")}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    proc = run_cli("import-hf", src, tmp_path / "out.mdl", "--model", "gpt2")
    one_line_error(proc, 2, "model.safetensors.index.json", words)
    assert not (tmp_path / "out.mdl").exists()


def test_a_pytorch_bin_index_names_only_files_beside_it(tmp_path):
    torch = pytest.importorskip("torch")
    outside = tmp_path / "outside"
    outside.mkdir()
    torch.save({"wte.weight": torch.ones(32, 8)}, outside / "pytorch_model.bin")
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(CONFIG))
    weight_map = {"wte.weight": "../outside/pytorch_model.bin"}
    (src / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    proc = run_cli("import-hf", src, tmp_path / "out.mdl", "--model", "gpt2")
    one_line_error(proc, 2, "pytorch_model.bin.index.json", "not a file of its directory")
    assert not (tmp_path / "out.mdl").exists()


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("empty", "cannot be read by torch.load (the file is empty)"),
        ("random", "neither torch's zip format nor a pickle of protocol 2 or later"),
        ("cut legacy", "cannot be read by torch.load (unexpected EOF"),
        ("cut zip", "a zip archive cut short or damaged: "),
        ("protocol 4", "save it again with torch.save's default pickle_protocol (2)"),
    ],
)
def test_a_damaged_pytorch_bin_is_one_line_without_torchs_advice(tmp_path, kind, words):
    """torch's refusals open with advice to load with ``weights_only=False`` (which this tool
    never does; with an ANSI escape in it) and warn on stderr; the line names what its
    restricted unpickler met instead."""
    torch = pytest.importorskip("torch")
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(CONFIG))
    buf = io.BytesIO()
    legacy = kind == "cut legacy"
    protocol = 4 if kind == "protocol 4" else 2  # (torch.save's argument; torch writes it)
    state = {"wte.weight": torch.ones(32, 8)}
    torch.save(state, buf, _use_new_zipfile_serialization=not legacy, pickle_protocol=protocol)
    whole = buf.getvalue()
    data = {"empty": b"", "random": np.random.default_rng(0).bytes(4096)}.get(
        kind, whole if kind == "protocol 4" else whole[: len(whole) // 2]
    )
    (src / "pytorch_model.bin").write_bytes(data)
    proc = run_cli("import-hf", src, tmp_path / "out.mdl", "--model", "gpt2")
    one_line_error(proc, 2, "pytorch_model.bin", words)
    assert "weights_only=False" not in proc.stderr and "\x1b" not in proc.stderr
    assert "mmap" not in proc.stderr  # (torch maps only its zip format: the others are read)
    assert not (tmp_path / "out.mdl").exists()


@pytest.mark.parametrize("how", ["overlap", "gap", "tail"])
def test_a_safetensors_whose_tensors_do_not_tile_its_data_is_refused(tmp_path, how):
    """A file the safetensors library wrote, its header edited: two tensors in one byte range
    (each then read the other's values, with success), a gap, or bytes after the last tensor.
    The library itself refuses all three ("invalid offset", "incomplete metadata")."""
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(CONFIG))
    tensors = {
        "wte.weight": np.ones((32, 8), np.float32),
        "wpe.weight": np.zeros((16, 8), np.float32),
    }
    safetensors_numpy.save_file(tensors, src / "model.safetensors")
    raw = (src / "model.safetensors").read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    header, data = json.loads(raw[8 : 8 + n]), raw[8 + n :]
    if how == "overlap":  # the second tensor's range moved onto the first's start
        second = max(("wte.weight", "wpe.weight"), key=lambda k: header[k]["data_offsets"][0])
        begin, end = header[second]["data_offsets"]
        header[second]["data_offsets"] = [0, end - begin]
    elif how == "gap":
        header = {
            k: {**v, "data_offsets": [o + 64 for o in v["data_offsets"]]} for k, v in header.items()
        }
        data = bytes(64) + data
    else:
        data += bytes(64)
    text = json.dumps(header).encode()
    (src / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data)
    proc = run_cli("import-hf", src, tmp_path / "out.mdl", "--model", "gpt2")
    words = {
        "overlap": "overlaps another tensor's",
        "gap": "leaves a gap",
        "tail": "64 bytes after",
    }
    one_line_error(proc, 2, "model.safetensors", words[how])
    assert not (tmp_path / "out.mdl").exists()


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "pytorch_model.bin"])
def test_a_named_pipe_in_a_hugging_face_directory_is_refused_not_waited_on(tmp_path, name):
    if name == "pytorch_model.bin":
        pytest.importorskip("torch")
    src = _directory(tmp_path, {"wte.weight": ENTRY})
    if name == "pytorch_model.bin":
        (src / "model.safetensors").unlink()
    else:
        (src / name).unlink()
    os.mkfifo(src / name)
    proc, _ = run_capped("import-hf", src, tmp_path / "out.mdl", "--model", "gpt2", seconds=60)
    one_line_error(proc, 2, name, "not a regular file")
