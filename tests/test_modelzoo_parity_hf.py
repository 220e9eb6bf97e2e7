"""Opt-in parity check of the Hugging Face conversions (issue #23): Model Zoo's own converter and
ckpt-migrate on the same tiny random ``transformers`` model, both directions.

Enabled by the same two variables as ``tests/test_modelzoo_parity.py`` (a Model Zoo checkout at
tag Release_2.10.0, and the interpreter of a virtualenv with ``cerebras-pytorch==2.10.0`` and
the converter's requirements; docs/MODELZOO_PARITY.md §4). For each family:

1. the HF model saved by ``save_pretrained`` (sharded: Model Zoo reads safetensors only with an
   index) -> Model Zoo ``convert --src-fmt hf --tgt-fmt cs-2.9`` and ``ckpt-migrate import-hf
   --release 2.9``: the same model tensors, name for name and bit for bit;
2. Model Zoo's CS checkpoint -> Model Zoo ``convert --src-fmt cs-2.9 --tgt-fmt hf
   --export-safetensors`` and ``ckpt-migrate export-hf``: the same HF tensors, and every field
   of Model Zoo's ``config.json`` with the same value in ours;
3. the differences docs/MODELZOO_PARITY.md lists on purpose (:data:`ON_PURPOSE`) are allowed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_hf_end_to_end import CASES
from test_hf_more_families import CLIP
from test_modelzoo_parity import MZ_SCRIPT, TIMEOUT_S, _environment

from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import TensorLeaf, iter_leaves

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

# HF tensors Model Zoo writes and we leave out on purpose (docs/MODELZOO_PARITY.md §5):
# buffers transformers regenerates and tied copies save_pretrained leaves out.
ON_PURPOSE = re.compile(
    r"(?:.*\.attn\.(?:bias|masked_bias)"  # GPT-2's causal-mask buffers (gpt2_hf_cs.py 190-202)
    r"|.*\.attention\.(?:bias|masked_bias|rotary_emb\.inv_freq)"  # GPT-NeoX's (265-280)
    r"|.*\.position_ids"  # BERT/RoBERTa's position-id buffer
    r"|lm_head\.decoder\.bias)"  # RoBERTa's decoder bias, a tie of lm_head.bias
)
# CS tensors only ours writes, on purpose (docs/MODELZOO_PARITY.md §5): the tied head Model Zoo's
# 2.1+ rules leave out while the CS model's state dict has it (strict loading fails on Model
# Zoo's file), BERT's MLM bias and T5's embeddings, which Model Zoo loses from the files
# save_pretrained writes (bert.py line 589; t5.py line 628).
CS_ONLY_OURS = {
    **{
        n: {"lm_head.weight"}
        for n in ("gpt2", "falcon", "bloom", "starcoder", "gemma2", "btlm", "santacoder")
    },
    "esm-2": {"bert_mlm_head.classifier.ffn.0.linear_layer.weight"},  # its tied decoder
    "bert": {"bert_mlm_head.classifier.ffn.0.linear_layer.bias"},
    "t5": {
        "encoder_embeddings.word_embeddings.weight",
        "decoder_embeddings.word_embeddings.weight",
        "lm_head.weight",
    },
}
# An untied headless model has no head: both tools start the CS lm_head from normal(0, 0.02)
# (Model Zoo: "Initializing lm_head to default", gpt2_hf_cs.py lines 367-394 and its
# siblings; ours seeded, hf/heads.py), so its values differ by construction.
CS_INITIALISED = {
    n: {"lm_head.weight"}
    for n in (
        "gptj-headless",
        "codegen-headless",
        "gpt-neox-headless",
        "llama-headless",
        "mistral-headless",
        "btlm-headless",
        "santacoder-headless",
        "mixtral-headless",
    )
}
# ... so Model Zoo's CS file of these lacks weights the HF model needs (our export zero-fills
# BERT's bias and refuses T5's file: tests/test_hf_modelzoo_files.py): the way back starts
# from our CS file (with Model Zoo's config) for both tools. Model Zoo then
# also writes the tied copies save_pretrained leaves out (and we leave out).
HF_NAMES_DIFFER = {
    "bert": {"only Model Zoo's: cls.predictions.decoder.bias"},
    "t5": {
        *(f"only Model Zoo's: {n}.embed_tokens.weight" for n in ("encoder", "decoder")),
        "only Model Zoo's: lm_head.weight",
    },
}
# config.json fields only ours writes are fine (architectures, dtype, the transformers 5 rope
# spelling); these fields of Model Zoo's differ on purpose:
CONFIG_ON_PURPOSE: dict[str, set[str]] = {
    "esm-2": {"model_type"},  # Model Zoo writes BERT's "bert" (bert.py line 955); ours "esm"
    # Model Zoo writes the LM class for the base model too (mistral.py line 109, the config
    # converter both Mistral converters share); ours names the class of the weights written
    "mistral-headless": {"architectures"},
    "starcoder-headless": {"architectures"},  # likewise (starcoder.py line 542)
    "santacoder-headless": {"architectures"},  # likewise (santacoder.py line 358)
    # the image directory's path as the export wrote it (llava.py lines 446-451): ours leaves it
    # out (a path where the directory was first written is no fact of the model)
    **{key: {"mm_vision_tower"} for key in ("llava", "mmsimple-llava")},
}
# Families not in tests/test_hf_end_to_end.py's CASES (its exact round trip cannot hold: ESM's
# contact head has no place in the CS model, and save_pretrained writes ESM's norms as
# gamma/beta); absolute positions, since Model Zoo cannot read the rotary inv_freq key
# transformers saves (esm2.py: "Key not matched").
EXTRA_CASES = {
    "esm-2": (
        "EsmForMaskedLM",
        transformers.EsmConfig(
            vocab_size=33,
            hidden_size=64,
            num_attention_heads=4,
            num_hidden_layers=2,
            intermediate_size=128,
            position_embedding_type="absolute",
            pad_token_id=1,
            mask_token_id=32,
            max_position_embeddings=64,
        ),
    ),
}
# The headless names: the base model of the family's case (Model Zoo's *Model_HF_CS
# converters), and the other single-directory names transformers has classes for.
HEADLESS = {
    "gpt2": "GPT2Model",
    "gptj": "GPTJModel",
    "codegen": "CodeGenModel",
    "gpt-neox": "GPTNeoXModel",
    "falcon": "FalconModel",
    "bloom": "BloomModel",
    "llama": "LlamaModel",
    "mistral": "MistralModel",
    "mixtral": "MixtralModel",
    "starcoder": "GPTBigCodeModel",
}
EXTRA_CASES |= {f"{name}-headless": (cls, CASES[name][1]) for name, cls in HEADLESS.items()}
_BERT = CASES["bert"][1]
EXTRA_CASES |= {
    "bert-sequence-classifier": (
        "BertForSequenceClassification",
        transformers.BertConfig(
            **{**_BERT.to_dict(), "problem_type": "single_label_classification"}
        ),
    ),
    "bert-token-classifier": ("BertForTokenClassification", _BERT),
    "bert-qa": ("BertForQuestionAnswering", _BERT),
    "clip-vit": ("CLIPVisionModelWithProjection", CLIP),
    "dpo": CASES["llama"],  # the policy model (dpo.py lines 205-246)
}
# Model Zoo's converter fails on these inputs (not a difference of ours)
# Model Zoo's mixtral converter fails on a sharded save_pretrained directory (mixtral.py line
# 314, assert_already_converted: an expert not yet fused): these are given one
# pytorch_model.bin (the safetensors file's tensors), which it reads.
ONE_FILE = ("mixtral", "mixtral-headless")
# Model Zoo's HF -> CS fails on these: only its CS -> HF runs, from our CS file and config
MODELZOO_CANNOT_IMPORT = {
    "falcon-headless": "KeyError in post_model_convert (falcon_40b.py line 472 reads an "
    "lm_head the headless model does not have)",
}
# Model Zoo's CS format name of these (dpo.py lines 155-166: cs-2.1-dpo ... cs-2.9-dpo)
CS_FORMAT_SUFFIX = {"dpo": "-dpo"}


# Model Zoo's convert_checkpoint.py looks each --model up in its model registry
# (``get_cs_model_name``, registry.py lines 381-390) and stops for a name neither
# ``_model_aliases`` nor registry.yaml has; for those the script runs with that look-up
# answering the name itself (the converters run unchanged).
_UNREGISTERED = (
    "bert-qa",
    "btlm-headless",
    "santacoder-headless",
    "starcoder-headless",
    "mixtral-headless",
    "dragon",
)
_LOOKUP_PATCH = (
    "import runpy, sys\n"
    "from cerebras.modelzoo.tools.checkpoint_converters import registry\n"
    "found = registry.get_cs_model_name\n"
    "registry.get_cs_model_name = lambda m, raise_error=True: found(m, False) or m\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def _modelzoo(checkout: Path, python: Path, *args: str | Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    patch = ["-c", _LOOKUP_PATCH] if set(map(str, args)) & set(_UNREGISTERED) else []
    proc = subprocess.run(
        [str(python), *patch, str(checkout / MZ_SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"Model Zoo's converter failed:\n{proc.stderr[-3000:]}"


def _ours(*args: str | Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_migrate", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"ckpt-migrate failed:\n{proc.stderr}"


def _model_tensors(path: Path) -> dict[str, np.ndarray]:
    with read_checkpoint(path) as ckpt:
        return {
            r.name: np.asarray(r.leaf.data.read())
            for r in iter_leaves(ckpt.root.get("model"))
            if isinstance(r.leaf, TensorLeaf)
        }


def _hf_tensors(directory: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(safetensors_numpy.load_file(str(file)))
    return out


def _differences(theirs: dict, ours: dict, allowed: re.Pattern | None = None) -> list[str]:
    out = []
    for key in sorted(theirs.keys() | ours.keys()):
        if allowed is not None and allowed.fullmatch(key) and key not in ours:
            continue
        if key not in ours:
            out.append(f"only Model Zoo's: {key}")
        elif key not in theirs:
            out.append(f"only ours: {key}")
        elif theirs[key].dtype != ours[key].dtype or not np.array_equal(theirs[key], ours[key]):
            out.append(f"differs: {key}")
    return out


@pytest.mark.parametrize("name", [*CASES, *EXTRA_CASES])
def test_same_tensors_and_config_as_modelzoo_both_ways(name, tmp_path):
    _environment()
    cls_name, config = {**CASES, **EXTRA_CASES}[name]
    torch.manual_seed(0)
    getattr(transformers, cls_name)(config).save_pretrained(tmp_path / "hf", max_shard_size=SHARD)
    check_both_ways(tmp_path, name)


SHARD = "20KB"  # Model Zoo reads safetensors only through an index: several shards


def check_both_ways(tmp_path: Path, name: str, parts: tuple[str, ...] = ("",)) -> None:
    """The HF model in ``tmp_path/hf`` (in the sub-directories ``parts``, Model Zoo's
    component names, for a multi-model converter) through both tools, both directions."""
    checkout, python = _environment()
    cs_format = "cs-2.9" + CS_FORMAT_SUFFIX.get(name, "")
    hf = tmp_path / "hf"
    source = hf if parts != ("",) else _one_file(hf) if name in ONE_FILE else hf / INDEX
    config = hf if parts != ("",) else hf / "config.json"  # base_converter.py lines 1264-1280
    ours_cs, ours_yaml = tmp_path / "ours.mdl", tmp_path / "ours.yaml"
    _ours("import-hf", hf, ours_cs, "--release", "2.9", "--model", name, "--config-out",
          ours_yaml, "-q")  # fmt: skip
    if name in MODELZOO_CANNOT_IMPORT:
        theirs_cs, cs_config = ours_cs, ours_yaml
    else:
        args = ["--model", name, "--src-fmt", "hf", "--tgt-fmt", cs_format]
        _modelzoo(checkout, python, "convert", source, *args, "--config", config,
                  "--output-dir", tmp_path / "mz")  # fmt: skip
        theirs_cs = next((tmp_path / "mz").glob("*.mdl"))
        cs_config = next((tmp_path / "mz").glob("*.yaml"))
        only_ours = {f"only ours: {n}" for n in CS_ONLY_OURS.get(name, set())}
        only_ours |= {f"differs: {n}" for n in CS_INITIALISED.get(name, set())}
        assert set(_differences(_model_tensors(theirs_cs), _model_tensors(ours_cs))) == only_ours

    source = ours_cs if name in HF_NAMES_DIFFER else theirs_cs
    args = ["--model", name, "--src-fmt", cs_format, "--tgt-fmt", "hf", "--export-safetensors"]
    _modelzoo(checkout, python, "convert", source, *args, "--config", cs_config,
              "--output-dir", tmp_path / "mzhf")  # fmt: skip
    ours_hf = tmp_path / "ourshf"
    _ours("export-hf", source, ours_hf, "--config", cs_config, "--model", name, "-q")
    differences: list[str] = []
    for part in parts:
        theirs_hf = _modelzoo_hf_dir(tmp_path / "mzhf", part)
        found = _differences(_hf_tensors(theirs_hf), _hf_tensors(ours_hf / part), ON_PURPOSE)
        differences += [f"{part}/{d}" if part else d for d in found]
        theirs_json = json.loads((theirs_hf / "config.json").read_text())
        ours_json = json.loads((ours_hf / part / "config.json").read_text())
        differ = {
            k for k, v in theirs_json.items() if ours_json.get(k, v) != v or k not in ours_json
        }
        allowed = CONFIG_ON_PURPOSE.get(name, set())
        assert differ <= allowed, {k: (theirs_json[k], ours_json.get(k)) for k in differ}
    assert set(differences) == HF_NAMES_DIFFER.get(name, set())


INDEX = "model.safetensors.index.json"


def _one_file(hf: Path) -> Path:
    """The sharded directory's tensors as one ``pytorch_model.bin`` beside them, sorted by
    name as one safetensors file holds them (Model Zoo's mixtral rules need an expert's
    ``w1`` before its ``w3``)."""
    tensors = {n: torch.from_numpy(a.copy()) for n, a in sorted(_hf_tensors(hf).items())}
    torch.save(tensors, hf / "pytorch_model.bin")
    return hf / "pytorch_model.bin"


def _modelzoo_hf_dir(out: Path, part: str) -> Path:
    """Where Model Zoo's CS -> HF wrote (a part: its component's directory, lines 1123-1163)."""
    if part:
        return next(p for p in out.rglob(part) if p.is_dir() and (p / "config.json").is_file())
    return next(p for p in out.iterdir() if p.is_dir())
