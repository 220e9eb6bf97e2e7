"""Opt-in parity check: Model Zoo's own converter next to ``scripts/convert_checkpoint.py`` on
this repository's model fixtures, hop by hop (docs/MODELZOO_PARITY.md, "Running the parity
test").

Enabled when both are set:

* ``CKPT_MIGRATE_MODELZOO``: a checkout of github.com/Cerebras/modelzoo at tag Release_2.10.0
  (its ``src/`` goes on ``PYTHONPATH``);
* ``CKPT_MIGRATE_CSTORCH_PYTHON``: the interpreter of a virtualenv with
  ``cerebras-pytorch==2.10.0`` and Model Zoo's requirements (never this project's venv).

Otherwise every test here is skipped, saying which variable is missing. Each case runs Model
Zoo's ``src/cerebras/modelzoo/tools/convert_checkpoint.py convert`` for one hop and ours for the
same hop, then compares: the model keys and every model tensor (sha256, through ckpt-migrate's
``verify``), and the converted configs key by key, except the differences docs/MODELZOO_PARITY.md
lists with their evidence (:data:`DOCUMENTED`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import CKPT, MODELS, ROOT

from ckpt_migrate.cli import commands
from ckpt_migrate.format.read import read_checkpoint

MODELZOO_VAR = "CKPT_MIGRATE_MODELZOO"
PYTHON_VAR = "CKPT_MIGRATE_CSTORCH_PYTHON"
MZ_SCRIPT = Path("src/cerebras/modelzoo/tools/convert_checkpoint.py")
TIMEOUT_S = 900

# (fixture, model, source release, target release): the CS→CS hops Model Zoo 2.10 has a
# converter for, from the fixtures' release.
CASES = [
    (fixture, model, src, tgt)
    for fixture, model in (("gpt2-2.0", "gpt2"), ("llama-2.0", "llama"), ("t5-2.0", "t5"))
    for src, tgt in (("2.0", "2.1"),)
] + [("bert-2.0", "bert", "2.0", "2.1")]

# Config paths where the two tools differ on purpose (docs/MODELZOO_PARITY.md, table rows).
DOCUMENTED = {
    "model.mixed_precision",  # Model Zoo 2.0-2.3 inject true (§ "mixed_precision")
    "runconfig.load_checkpoint_states",  # Model Zoo writes a list (§ "load_checkpoint_states")
}


def _environment() -> tuple[Path, Path]:
    checkout, python = os.environ.get(MODELZOO_VAR), os.environ.get(PYTHON_VAR)
    missing = [v for v, value in ((MODELZOO_VAR, checkout), (PYTHON_VAR, python)) if not value]
    if missing:
        pytest.skip(f"Model Zoo parity check: set {' and '.join(missing)} (see module docstring)")
    assert checkout is not None and python is not None
    if not (Path(checkout) / MZ_SCRIPT).is_file():
        pytest.skip(f"{MODELZOO_VAR}={checkout} has no {MZ_SCRIPT}")
    return Path(checkout), Path(python)


def _run_modelzoo(checkout: Path, python: Path, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    proc = subprocess.run(
        [str(python), str(checkout / MZ_SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"Model Zoo's converter failed:\n{proc.stdout}\n{proc.stderr}"


def _run_ours(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "convert_checkpoint.py"), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"ours failed:\n{proc.stdout}\n{proc.stderr}"


def _flat(doc: object, prefix: str = "") -> dict[str, object]:
    if isinstance(doc, dict):
        out: dict[str, object] = {}
        for key, value in doc.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: doc}


@pytest.mark.parametrize(("fixture", "model", "src", "tgt"), CASES)
def test_same_checkpoint_and_config_as_modelzoo(tmp_path, fixture, model, src, tgt):
    checkout, python = _environment()
    work = tmp_path / fixture
    shutil.copytree(MODELS / fixture, work)
    args = [
        "convert",
        str(work / CKPT),
        "--model",
        model,
        "--src-fmt",
        f"cs-{src}",
        "--tgt-fmt",
        f"cs-{tgt}",
        "--config",
        str(work / "params.yaml"),
    ]
    _run_modelzoo(checkout, python, [*args, "--output-dir", str(tmp_path / "mz")])
    _run_ours([*args, "--output-dir", str(tmp_path / "ours")])
    name = f"checkpoint_100_to_cs-{tgt}"
    theirs, ours = tmp_path / "mz" / f"{name}.mdl", tmp_path / "ours" / f"{name}.mdl"
    with read_checkpoint(theirs) as a, read_checkpoint(ours) as b:
        assert [k for k, _ in a.root.get("model").items] == [
            k for k, _ in b.root.get("model").items
        ]
    model_diffs = [
        d for d in commands.verify(theirs, ours)["differences"] if d["name"].startswith("model.")
    ]
    assert model_diffs == []
    mz_config = _flat(yaml.safe_load((tmp_path / "mz" / f"params_to_cs-{tgt}.yaml").read_text()))
    our_config = _flat(yaml.safe_load((tmp_path / "ours" / f"params_to_cs-{tgt}.yaml").read_text()))
    differ = {
        k for k in mz_config.keys() | our_config.keys() if mz_config.get(k) != our_config.get(k)
    }
    assert differ <= DOCUMENTED, sorted(differ - DOCUMENTED)
