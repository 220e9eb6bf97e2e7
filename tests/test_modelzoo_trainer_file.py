"""A checkpoint Model Zoo 2.10's own Trainer wrote (fixtures/modelzoo-2.10-trainer): read as
the real library reads it, taken down the releases and back up with its tensors unchanged, and
exported to Hugging Face as Model Zoo's own converter exports it."""

from __future__ import annotations

import hashlib
import json
import lzma
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import FIXTURES, run_cli
from digest import digest

import ckpt_migrate as cm
from ckpt_migrate.cli import commands

HERE = FIXTURES / "modelzoo-2.10-trainer"
CONFIG = HERE / "params.yaml"


@pytest.fixture
def trainer_file(tmp_path: Path) -> Path:
    path = tmp_path / "checkpoint_4.mdl"
    path.write_bytes(lzma.decompress((HERE / "checkpoint_4.mdl.xz").read_bytes()))
    return path


def test_read_as_the_real_library_reads_it(trainer_file):
    expected = json.loads((HERE / "checkpoint_4.expected.json").read_text())
    assert digest(cm.load(trainer_file, objects_mode="data")) == expected
    done = run_cli("check", trainer_file)
    assert done.returncode == 0 and done.stdout.strip() == f"{trainer_file}: at 2.10"
    shown = json.loads(run_cli("inspect", trainer_file, "--json").stdout)
    assert (shown["release"], shown["cstorch_version"], shown["leaf_count"]) == (
        "2.10",
        "2.10.0",
        201,
    )
    assert "note" not in shown  # (its stamp and its __metadata__ agree)


@pytest.mark.parametrize(("down", "config"), [("2.5", True), ("2.3", True), ("2.0", False)])
def test_down_the_releases_and_back_up(tmp_path, trainer_file, down, config):
    """Down to ``down`` (with the run's config where its steps can be undone: 2.3 → 2.2 cannot)
    and back up to 2.10: every tensor and value as Model Zoo's Trainer saved it; only the
    ``__metadata__`` entries each conversion appends differ."""
    given = ["--config", CONFIG] if config else []
    done = run_cli("upgrade", trainer_file, "--to", down, *given, "-o", tmp_path / "down")
    assert done.returncode == 0, done.stderr
    lowered = tmp_path / "down" / trainer_file.name
    assert run_cli("check", lowered, "--to", down).returncode == 0
    if config:
        lowered_config = yaml.safe_load((tmp_path / "down" / CONFIG.name).read_text())
        assert "model" in lowered_config["trainer"]["init"]
    assert run_cli("upgrade", lowered, "-o", tmp_path / "up").returncode == 0
    raised = tmp_path / "up" / trainer_file.name
    differences = commands.verify(trainer_file, raised)["differences"]
    assert differences and all(d["name"].startswith("__metadata__.") for d in differences)
    versions = [e["version"] for e in cm.load(raised)["__metadata__"]]
    assert versions == ["2.10.0", f"{down}.0", "2.10.0"]


def test_export_hf_gives_model_zoos_tensors(tmp_path, trainer_file):
    """``export-hf`` of the Trainer's file: the tensors Model Zoo's own converter writes, bit
    for bit, but for the ones docs/MODELZOO_PARITY.md §5 lists (the tied ``lm_head`` and the
    causal-mask buffers transformers regenerates, which Model Zoo writes and we leave out), and
    every field of its ``config.json``."""
    from safetensors.numpy import load_file

    expected = json.loads((HERE / "modelzoo_hf.expected.json").read_text())
    out = tmp_path / "hf"
    done = run_cli("export-hf", trainer_file, out, "--config", CONFIG)
    assert done.returncode == 0, done.stderr
    ours = load_file(out / "model.safetensors")
    left_out = {"lm_head.weight", "transformer.h.0.attn.bias", "transformer.h.0.attn.masked_bias"}
    assert set(expected["tensors"]) - set(ours) == left_out
    assert set(ours) <= set(expected["tensors"])
    for name, array in ours.items():
        want = expected["tensors"][name]
        got = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
        assert [str(array.dtype), list(array.shape), got] == [
            want["dtype"],
            want["shape"],
            want["sha256"],
        ], name
    config = json.loads((out / "config.json").read_text())
    assert {k: v for k, v in config.items() if k in expected["config"]} == expected["config"]
