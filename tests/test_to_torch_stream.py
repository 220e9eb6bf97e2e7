"""`to-torch` writes one tensor at a time: its peak memory does not grow with the checkpoint.

A ~6 MB and a ~150 MB checkpoint (4 MiB tensors) are generated at test time and converted in
real processes; the peak resident memory of the large one may exceed the small one's by a few
tensors, not by the 150 MB a whole-state ``torch.save`` holds. The written file is read back
with ``torch.load`` and compared tensor by tensor (ties kept as one storage).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import run_capped

import ckpt_migrate as cm

TENSOR_MIB = 4


def make(path, tensors: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(tensors)
    model = {f"layer{i}.weight": torch.randn(1024, 1024, generator=gen) for i in range(tensors)}
    state = {"model": model, "step": 3}
    path.parent.mkdir(parents=True, exist_ok=True)
    cm.save(state, path, "2.0")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("to-torch")
    small, large = base / "small.mdl", base / "large.mdl"
    make(small, 1)
    make(large, 36)
    yield small, large
    shutil.rmtree(base, ignore_errors=True)


def test_peak_memory_does_not_grow_with_the_checkpoint(pair, tmp_path):
    import torch

    small, large = pair
    proc, small_peak = run_capped("to-torch", small, tmp_path / "small.pt", seconds=120)
    assert proc.returncode == 0, proc.stderr
    proc, large_peak = run_capped("to-torch", large, tmp_path / "large.pt", seconds=300)
    assert proc.returncode == 0, proc.stderr
    size_mib = large.stat().st_size / 2**20
    assert size_mib > 140
    grew = large_peak - small_peak
    assert grew < 4 * TENSOR_MIB + 16, f"peak {small_peak:.0f} → {large_peak:.0f} MiB"

    written = torch.load(tmp_path / "large.pt", weights_only=True)
    state = cm.load(large)
    assert list(written["model"]) == list(state["model"]) and written["step"] == 3
    for name, tensor in written["model"].items():
        assert torch.equal(tensor, state["model"][name]), name


def test_ties_stay_one_storage(tmp_path):
    import torch

    rng = np.random.default_rng(0)
    shared = rng.standard_normal((8, 4), np.float32)
    src = tmp_path / "tied.mdl"
    cm.save({"a": torch.from_numpy(shared), "z": torch.zeros(0)}, src, "2.0")
    state = cm.load(src)
    state["b"] = state["a"]
    cm.save(state, tmp_path / "tied2.mdl", "2.0")
    proc, _ = run_capped("to-torch", tmp_path / "tied2.mdl", tmp_path / "t.pt", seconds=120)
    assert proc.returncode == 0, proc.stderr
    got = torch.load(tmp_path / "t.pt", weights_only=True)
    assert torch.equal(got["a"], torch.from_numpy(shared)) and got["z"].shape == (0,)
    assert got["a"].untyped_storage().data_ptr() == got["b"].untyped_storage().data_ptr()
