"""The real cerebras.pytorch 2.10 loader against the reference fixtures (optional).

Skipped unless CKPT_MIGRATE_CSTORCH_PYTHON names an interpreter with cerebras.pytorch
(see tests/real_cstorch.py). These tests pin down the harness itself: if the real library
reads every reference file back as its expected digest, the harness and tests/digest.py
can be trusted when later tests feed it files written by our own writer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from digest import FIXTURES_DIR, diff_digests, load_expected
from real_cstorch import real_cstorch_info, real_digest, requires_real_cstorch

pytestmark = requires_real_cstorch()

MANIFEST = json.loads((FIXTURES_DIR / "manifest.json").read_text(encoding="utf-8"))
CASES = sorted(p.name.removesuffix(".mdl") for p in FIXTURES_DIR.glob("*.mdl"))


@pytest.fixture(scope="module")
def real_results(tmp_path_factory) -> dict[str, dict]:
    garbage = tmp_path_factory.mktemp("real_cstorch") / "not_a_checkpoint.mdl"
    garbage.write_bytes(b"this is not an HDF5 file\n")
    paths = [FIXTURES_DIR / f"{case}.mdl" for case in CASES] + [garbage]
    results = real_digest(paths)
    return {Path(p).name.removesuffix(".mdl"): r for p, r in results.items()}


def test_real_library_version():
    info = real_cstorch_info()
    assert info["cerebras_pytorch"] == "2.10.0", info


@pytest.mark.parametrize("case", CASES)
def test_real_loader_matches_expected_digest(case, real_results):
    result = real_results[case]
    if MANIFEST["cases"][case]["roundtrip"]:
        assert result["ok"], f"real cstorch.load failed on {case}: {result.get('error')}"
        expected = load_expected(case)
        assert result["digest"] == expected, "\n".join(diff_digests(expected, result["digest"]))
    else:
        # key_collision*: the real writer saved them but the real loader cannot read them.
        assert not result["ok"], f"real cstorch.load unexpectedly read {case}"
        assert result["stage"] == "load", result
        assert result["error"].startswith("ValueError: treespec.unflatten"), result["error"]


def test_harness_reports_unreadable_files(real_results):
    result = real_results["not_a_checkpoint"]
    assert result["ok"] is False
    assert result["stage"] == "load"
    assert result["error"]
