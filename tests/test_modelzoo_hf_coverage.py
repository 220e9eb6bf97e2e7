"""Every one of Model Zoo 2.10's 38 Hugging Face converter names (``modelzoo_hf_names.py``)
has an HF round-trip test here and a case in the opt-in Model Zoo parity tests (issue #35,
"Done when")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from modelzoo_hf_names import HF_NAMES, registry_hf_names, registry_text

from ckpt_migrate import catalogue

TESTS = Path(__file__).parent
_STARCODER = "test_hf_starcoder_btlm_jais.py::test_starcoder_round_trip"

# name -> the test case (pytest node id) that takes it HF -> CS -> HF bit for bit
ROUND_TRIPS = {
    **{
        n: f"test_hf_end_to_end.py::test_import_then_export_is_exact_for_every_family[{n}]"
        for n in ("codegen", "gpt-neox", "falcon", "bloom", "gemma2", "roberta", "t5")
    },
    "gpt2": "test_hf_gpt2.py::test_round_trip[gpt2-True]",
    "gpt2-headless": "test_hf_gpt2.py::test_round_trip[gpt2-headless-False]",
    "gptj": "test_hf_gptj_neox_falcon_bloom.py::test_round_trip[gptj]",
    "gptj-headless": "test_hf_gptj_neox_falcon_bloom.py::test_round_trip[gptj-headless]",
    "codegen-headless": "test_hf_gptj_neox_falcon_bloom.py::test_round_trip[codegen-headless-tied]",
    "gpt-neox-headless": "test_hf_gptj_neox_falcon_bloom.py::test_round_trip[gpt-neox-headless]",
    "falcon-headless": "test_hf_gptj_neox_falcon_bloom.py::test_round_trip[falcon-headless-mha]",
    "bloom-headless": "test_hf_gptj_neox_falcon_bloom.py::test_round_trip[bloom-headless-6-heads]",
    **{n: f"test_hf_llama.py::test_round_trip[{n}]" for n in ("llama", "mistral", "mixtral")},
    **{
        f"{n}-headless": f"test_hf_llama.py::test_round_trip[{n}-headless]"
        for n in ("llama", "mistral", "mixtral")
    },
    "starcoder": f"{_STARCODER}[starcoder-True-True-256]",
    "starcoder-headless": f"{_STARCODER}[starcoder-headless-True-True-None]",
    "santacoder": "test_hf_starcoder_btlm_jais.py::test_santacoder_round_trip[santacoder-True]",
    "santacoder-headless": (
        "test_hf_starcoder_btlm_jais.py::test_santacoder_round_trip[santacoder-headless-False]"
    ),
    "btlm": (
        "test_hf_starcoder_btlm_jais.py::test_btlm_jais_round_trip"
        "[ckpt_migrate.hf.families.btlm-btlm-True-True-True-True]"
    ),
    "btlm-headless": (
        "test_hf_starcoder_btlm_jais.py::test_btlm_jais_round_trip"
        "[ckpt_migrate.hf.families.btlm-btlm-headless-False-False-False-False]"
    ),
    "jais": (
        "test_hf_starcoder_btlm_jais.py::test_btlm_jais_round_trip"
        "[ckpt_migrate.hf.families.jais-jais-False-True-True-True]"
    ),
    "bert": "test_hf_bert_t5.py::test_tensors_round_trip_bitwise[bert]",
    "bert-sequence-classifier": "test_hf_bert_t5.py::test_tensors_round_trip_bitwise[bert-seq]",
    "bert-token-classifier": "test_hf_bert_t5.py::test_tensors_round_trip_bitwise[bert-token]",
    "bert-qa": "test_hf_bert_t5.py::test_tensors_round_trip_bitwise[bert-qa]",
    "esm-2": "test_hf_esm2.py::test_round_trip_is_bitwise_and_logits_equal[absolute-untied]",
    "clip-vit": "test_hf_more_families.py::test_clip_vit_round_trip",
    "dpo": "test_hf_more_families.py::test_dpo_round_trip[llama]",
    "dragon": "test_hf_multi_dir.py::test_dragon_round_trip_loads_and_computes_the_same",
    "llava": "test_hf_multi_dir.py::test_llava_round_trip_loads_in_llavas_classes",
    "mmsimple-llava": "test_hf_multi_dir.py::test_mmsimple_llava_round_trip_and_layout",
}


def test_the_38_names_are_model_zoos():
    """The transcribed list is Model Zoo's (checked against its registry.py when the parity
    check's Model Zoo checkout is given, docs/MODELZOO_PARITY.md §4)."""
    assert len(HF_NAMES) == len(set(HF_NAMES)) == 38
    checkout = os.environ.get("CKPT_MIGRATE_MODELZOO")
    if checkout:
        assert registry_hf_names(registry_text(Path(checkout))) == HF_NAMES


def test_every_name_is_served_and_has_a_round_trip():
    assert set(ROUND_TRIPS) == set(HF_NAMES)
    for name in HF_NAMES:
        assert catalogue.hf_support(name).startswith("Hugging Face: export-hf and import-hf"), name


def test_every_round_trip_case_exists():
    """Each listed case is collected by pytest (the cases run in their own files)."""
    files = sorted({f"tests/{case.split('::')[0]}" for case in ROUND_TRIPS.values()})
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        capture_output=True,
        text=True,
        cwd=TESTS.parent,
        timeout=300,
    )
    collected = {line.strip() for line in proc.stdout.splitlines() if "::" in line}
    missing = [case for case in ROUND_TRIPS.values() if f"tests/{case}" not in collected]
    assert not missing, (missing, proc.stderr[-2000:])


def test_every_name_has_a_modelzoo_parity_case():
    pytest.importorskip("transformers")
    from test_modelzoo_parity_hf import CASES, EXTRA_CASES
    from test_modelzoo_parity_hf_parts import HAND_BUILT, MULTI_DIR

    cases = [*CASES, *EXTRA_CASES, *HAND_BUILT, *MULTI_DIR]
    assert sorted(cases) == sorted(HF_NAMES)
