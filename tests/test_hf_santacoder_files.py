"""SantaCoder through the files (the family's round trip is tested plan by plan in
``test_hf_starcoder_btlm_jais.py``): an HF directory with the causal-mask buffers its remote
code saves, and Model Zoo's own export writes (``santacoder.py`` lines 155-168), imports with
them left out; the export writes them again with their own dtype (uint8 mask, float32 fill)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_hf_end_to_end import _tensors
from test_hf_starcoder_btlm_jais import santacoder_config, santacoder_state

from ckpt_migrate.hf.export import export
from ckpt_migrate.hf.import_ import import_hf

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def test_santacoder_buffers_are_dropped_on_import_and_written_on_export(tmp_path):
    state, config = santacoder_state(False, True), santacoder_config(False, True)
    (tmp_path / "hf").mkdir()
    safetensors_numpy.save_file(state, str(tmp_path / "hf" / "model.safetensors"))
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    params = tmp_path / "params.yaml"
    result = import_hf(tmp_path / "hf", tmp_path / "m.mdl", model="santacoder", config_out=params)
    buffers = {n for n in state if n.endswith((".attn.bias", ".attn.masked_bias"))}
    assert buffers and set(result.dropped) == buffers
    export(tmp_path / "m.mdl", tmp_path / "back", model="santacoder", config=params)
    back = _tensors(tmp_path / "back")
    assert back.keys() == state.keys()
    for name, value in state.items():
        if name in buffers:
            continue
        assert back[name].dtype == value.dtype and np.array_equal(back[name], value), name
    mask = back["transformer.h.0.attn.bias"]
    positions = config["n_positions"]
    assert mask.dtype == np.uint8 and mask.shape == (1, 1, positions, positions)
    assert np.array_equal(mask[0, 0], np.tril(np.ones((positions, positions), np.uint8)))
    fill = back["transformer.h.1.attn.masked_bias"]
    assert fill.dtype == np.float32 and fill.shape == () and fill == np.float32(-1e4)
