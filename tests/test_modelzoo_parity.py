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

import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import CKPT, MODELS, ROOT

import ckpt_migrate as cm
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
    # Values must be equal; only the tie structure may differ: Model Zoo's streaming writer
    # stores each name as its own copy, ours keeps a tie a tie (docs/MODELZOO_PARITY.md §2)
    model_diffs = [
        d
        for d in commands.verify(theirs, ours)["differences"]
        if d["name"].startswith("model.") and not d["what"].startswith("tied to")
    ]
    assert model_diffs == []
    mz_config = _flat(yaml.safe_load((tmp_path / "mz" / f"params_to_cs-{tgt}.yaml").read_text()))
    our_config = _flat(yaml.safe_load((tmp_path / "ours" / f"params_to_cs-{tgt}.yaml").read_text()))
    differ = {
        k for k in mz_config.keys() | our_config.keys() if mz_config.get(k) != our_config.get(k)
    }
    assert differ <= DOCUMENTED, sorted(differ - DOCUMENTED)
    # the __metadata__ entry its converter appends (update_ckpt_metadata): the same, and its
    # params the converted config, which differs where the configs do
    mz_meta, our_meta = (cm.load(p)["__metadata__"] for p in (theirs, ours))
    assert [{k: v for k, v in e.items() if k != "params"} for e in our_meta] == [
        {k: v for k, v in e.items() if k != "params"} for e in mz_meta
    ]
    mz_params, our_params = _flat(mz_meta[-1]["params"]), _flat(our_meta[-1]["params"])
    differ = {
        k for k in mz_params.keys() | our_params.keys() if mz_params.get(k) != our_params.get(k)
    }
    assert differ <= DOCUMENTED, sorted(differ - DOCUMENTED)


# Model Zoo 2.10's CS -> CS converters end at cs-2.5 (its fallback converters, base_converter.py
# lines 1441-1449); these hops it takes from our outputs.
NEXT_HOPS = [("2.1", "2.2"), ("2.2", "2.3"), ("2.3", "2.4"), ("2.4", "2.5")]
FAMILIES = [("gpt2-2.0", "gpt2"), ("llama-2.0", "llama"), ("t5-2.0", "t5"), ("bert-2.0", "bert")]


def _values_differ(theirs: Path, ours: Path) -> list[dict]:
    """Model tensors whose values (not tie structure) differ."""
    return [
        d
        for d in commands.verify(theirs, ours)["differences"]
        if d["name"].startswith("model.") and not d["what"].startswith("tied to")
    ]


@pytest.mark.parametrize(("fixture", "model"), FAMILIES)
@pytest.mark.parametrize(("src", "tgt"), NEXT_HOPS)
def test_modelzoo_takes_our_output_for_its_next_hop(tmp_path, fixture, model, src, tgt):
    """Every output of ours is a valid input to Model Zoo's converter for the next release
    (issue #20), and what Model Zoo makes of it has our own next output's model tensors."""
    checkout, python = _environment()
    work = tmp_path / fixture
    shutil.copytree(MODELS / fixture, work)
    base = ["--model", model, "--src-fmt", "cs-2.0", "--config", str(work / "params.yaml")]
    _run_ours(["convert", str(work / CKPT), *base, "--tgt-fmt", f"cs-{src}", "--output-dir",
               str(tmp_path / "ours")])  # fmt: skip
    ours_src = tmp_path / "ours" / f"checkpoint_100_to_cs-{src}.mdl"
    our_config = tmp_path / "ours" / f"params_to_cs-{src}.yaml"
    _run_modelzoo(checkout, python, [
        "convert", str(ours_src), "--model", model, "--src-fmt", f"cs-{src}", "--tgt-fmt",
        f"cs-{tgt}", "--config", str(our_config), "--output-dir", str(tmp_path / "mz"),
    ])  # fmt: skip
    _run_ours(["convert", str(work / CKPT), *base, "--tgt-fmt", f"cs-{tgt}", "--output-dir",
               str(tmp_path / "direct")])  # fmt: skip
    theirs = tmp_path / "mz" / f"checkpoint_100_to_cs-{src}_to_cs-{tgt}.mdl"
    assert _values_differ(theirs, tmp_path / "direct" / f"checkpoint_100_to_cs-{tgt}.mdl") == []


@pytest.mark.parametrize(("fixture", "model"), FAMILIES)
def test_the_2_1_downgrade_is_model_zoos(tmp_path, fixture, model):
    """2.1 -> 2.0 (issue #20): Model Zoo's bidirectional converter and ``upgrade --to 2.0`` give
    the same model tensors under the same names."""
    checkout, python = _environment()
    work = tmp_path / fixture
    shutil.copytree(MODELS / fixture, work)
    args = ["--model", model, "--src-fmt", "cs-2.0", "--tgt-fmt", "cs-2.1"]
    _run_ours(["convert", str(work / CKPT), *args, "--config", str(work / "params.yaml"),
               "--output-dir", str(tmp_path / "up")])  # fmt: skip
    up = tmp_path / "up" / "checkpoint_100_to_cs-2.1.mdl"
    _run_modelzoo(checkout, python, [
        "convert", str(up), "--model", model, "--src-fmt", "cs-2.1", "--tgt-fmt", "cs-2.0",
        "--config", str(tmp_path / "up" / "params_to_cs-2.1.yaml"), "--output-dir",
        str(tmp_path / "mz"),
    ])  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_migrate", "upgrade", str(up), "--to", "2.0", "-o",
         str(tmp_path / "down"), "--model", model, "-q"],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    theirs = tmp_path / "mz" / "checkpoint_100_to_cs-2.1_to_cs-2.0.mdl"
    assert _values_differ(theirs, tmp_path / "down" / up.name) == []


COMPATIBLE = """
import sys
import cerebras.pytorch as cstorch
from cerebras.modelzoo.trainer.callbacks.checkpoint import Checkpoint

for path in sys.argv[1:]:
    try:
        Checkpoint.check_compatibility(cstorch.load(path))
        print("accepted")
    except ValueError:
        print("rejected")
"""


@pytest.mark.parametrize(("fixture", "model"), FAMILIES)
def test_the_trainer_takes_our_upgrade_of_model_zoos_cs_2_1_output(tmp_path, fixture, model):
    """Model Zoo 2.10 converts a 2.0 checkpoint to cs-2.1: a 2.1 model in a file its 2.10
    library stamps ``2.10.0`` (``__metadata__[-1].version`` "2.1.0", docs/FORMAT.md §1.3).
    Its own Trainer rejects that file (``check_compatibility``); ``ckpt-migrate upgrade`` reads
    it as 2.1, and the Trainer takes what it writes."""
    checkout, python = _environment()
    work = tmp_path / fixture
    shutil.copytree(MODELS / fixture, work)
    _run_modelzoo(checkout, python, [
        "convert", str(work / CKPT), "--model", model, "--src-fmt", "cs-2.0", "--tgt-fmt",
        "cs-2.1", "--config", str(work / "params.yaml"), "--output-dir", str(tmp_path / "mz"),
    ])  # fmt: skip
    theirs = tmp_path / "mz" / "checkpoint_100_to_cs-2.1.mdl"
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_migrate", "upgrade", str(theirs), "--config",
         str(tmp_path / "mz" / "params_to_cs-2.1.yaml"), "--output-dir", str(tmp_path / "up"),
         "--model", model, "-q"],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ours = tmp_path / "up" / theirs.name
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    proc = subprocess.run(
        [str(python), "-c", COMPATIBLE, str(theirs), str(ours)],
        capture_output=True, text=True, env=env, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["rejected", "accepted"]


def test_the_trainer_takes_its_own_checkpoint_back_after_a_round_trip(tmp_path):
    """The checkpoint Model Zoo 2.10's Trainer wrote (fixtures/modelzoo-2.10-trainer), taken
    down to 2.5 and back to 2.10: its Trainer's version check and ``cstorch.load`` take it."""
    checkout, python = _environment()
    src = tmp_path / "checkpoint_4.mdl"
    packed = ROOT / "fixtures" / "modelzoo-2.10-trainer" / "checkpoint_4.mdl.xz"
    src.write_bytes(lzma.decompress(packed.read_bytes()))
    for args in ([str(src), "--to", "2.5", "-o", str(tmp_path / "down")],
                 [str(tmp_path / "down" / src.name), "-o", str(tmp_path / "up")]):  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "ckpt_migrate", "upgrade", *args, "-q"],
            capture_output=True, text=True, timeout=TIMEOUT_S,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    files = [str(tmp_path / where / src.name) for where in ("down", "up")]
    proc = subprocess.run(
        [str(python), "-c", COMPATIBLE, *files],
        capture_output=True, text=True, env=env, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["rejected", "accepted"]  # (the 2.5 file is 2.5's, not 2.10's)
