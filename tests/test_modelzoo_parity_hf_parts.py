"""Opt-in Model Zoo parity of the Hugging Face names ``tests/test_modelzoo_parity_hf.py`` cannot
build from a ``transformers`` class (docs/MODELZOO_PARITY.md §4, same two variables):

* BTLM, JAIS and SantaCoder, whose HF classes are remote code: their state dicts and configs as
  ``tests/test_hf_starcoder_btlm_jais.py`` builds them, written as a sharded HF directory;
* Dragon+, LLaVA and MM-Simple LLaVA, a directory of model directories (Model Zoo's
  ``*_UnpackedHF_PackedCS`` converters, ``base_converter.py`` lines 1063-1296), compared
  directory by directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hf_multi_dir import BERT, CLIP, LlavaLlamaForCausalLM, _llava_text
from test_hf_starcoder_btlm_jais import btlm_config, btlm_state, santacoder_config, santacoder_state
from test_modelzoo_parity_hf import SHARD, check_both_ways

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

# name -> (state dict, config.json) of a model without a transformers class
HAND_BUILT = {
    "btlm": lambda: (
        btlm_state(False, True, True, True),
        btlm_config("btlm", True, True, True, False),
    ),
    "btlm-headless": lambda: (
        btlm_state(True, False, False, False),
        btlm_config("btlm", False, False, False, False),
    ),
    "jais": lambda: (
        btlm_state(False, False, True, True),
        btlm_config("jais", False, True, True, False),
    ),
    "santacoder": lambda: (santacoder_state(False, True), santacoder_config(False, True)),
    "santacoder-headless": lambda: (santacoder_state(True, False), santacoder_config(True, False)),
}


def _save_state(directory: Path, state: dict, config: dict) -> None:
    """One shard and its index (Model Zoo reads safetensors only through an index)."""
    directory.mkdir(parents=True)
    shard = "model-00001-of-00001.safetensors"
    safetensors_numpy.save_file(state, str(directory / shard), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": dict.fromkeys(state, shard)}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "config.json").write_text(json.dumps(config))


def _save_dragon(hf: Path) -> None:
    for part in ("q_encoder", "ctx_encoder"):
        model = transformers.BertModel(BERT, add_pooling_layer=False)
        model.save_pretrained(hf / part, max_shard_size=SHARD)


def _save_llava(hf: Path) -> None:
    # with the projection: both tools drop it (llava.py lines 61-74); vision_model. names
    transformers.CLIPVisionModelWithProjection(CLIP).save_pretrained(
        hf / "image_model", max_shard_size=SHARD
    )
    LlavaLlamaForCausalLM(_llava_text()).save_pretrained(hf / "text_model", max_shard_size=SHARD)


# name -> (its HF sub-directories, Model Zoo's component names; the writer of them)
MULTI_DIR = {
    "dragon": (("q_encoder", "ctx_encoder"), _save_dragon),
    "llava": (("image_model", "text_model"), _save_llava),
    "mmsimple-llava": (("image_model", "text_model"), _save_llava),
}


@pytest.mark.parametrize("name", sorted(HAND_BUILT))
def test_hand_built_models_as_modelzoo(name, tmp_path):
    state, config = HAND_BUILT[name]()
    _save_state(tmp_path / "hf", state, config)
    check_both_ways(tmp_path, name)


@pytest.mark.parametrize("name", sorted(MULTI_DIR))
def test_model_directories_as_modelzoo(name, tmp_path):
    parts, save = MULTI_DIR[name]
    torch.manual_seed(0)
    save(tmp_path / "hf")
    check_both_ways(tmp_path, name, parts)
