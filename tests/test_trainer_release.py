"""A model older than the library that wrote its file: Model Zoo's converters run on a newer
``cerebras.pytorch`` stamp its version in ``__cstorch_version__`` and their target release in
the last ``__metadata__`` entry (``update_ckpt_metadata``); Model Zoo reads the release from the
entry, and so does ``ckpt-migrate`` (``format/trainer_release.py``)."""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from conftest import FIXTURES, run_cli, run_script

import ckpt_migrate as cm
from ckpt_migrate.cli import commands
from ckpt_migrate.errors import EXIT_UPGRADE_NEEDED
from ckpt_migrate.format.read import read_checkpoint, read_release
from ckpt_migrate.format.v05 import treespec


def converted(version: str = "2.1.0", *, entries: int = 1) -> dict:
    """A state as a converter to ``cs-<version>`` leaves it: the Trainer's entries, then the
    converter's ``{version, model_name: "", params}``."""
    meta = [
        {"version": "2.0.0", "model_name": "GPT2LMHeadModel", "params": {"model": {"n": 1}}}
        for _ in range(entries - 1)
    ]
    meta.append({"version": version, "model_name": "", "params": {"model": {"n": 2}}})
    rng = np.random.default_rng(0)
    return {
        "model": {"w": rng.random((4, 3), dtype=np.float32), "b": np.zeros(3, np.float32)},
        "global_step": 100,
        "__metadata__": meta,
    }


def saved(tmp_path: Path, state: dict, release: str, name: str = "checkpoint_100.mdl") -> Path:
    path = tmp_path / name
    cm.save(state, path, release)
    return path


@pytest.mark.parametrize(
    ("container", "version", "read_as"),
    [
        ("2.10", "2.1.0", "2.1"),  # a 2.10 converter to cs-2.1: 0.5 file, 2.1 model
        ("2.10", "2.5.0", "2.5"),
        ("2.10", "2.4.0", "2.4"),
        ("2.4", "2.2.0", "2.2"),  # a 2.4 converter to cs-2.2: both 0.4
        ("2.10", "2.10.0", "2.10"),  # agreeing
        ("2.5", "2.9.0", "2.5"),  # newer than the stamp: no claim
        ("2.10", "2.0.0", "2.10"),  # before 2.1 no Trainer wrote the list: no claim
        ("2.10", "not a version", "2.10"),
        ("2.10", "2.1.0+local", "2.1"),
    ],
)
def test_the_last_entry_names_the_release_read_and_checked(tmp_path, container, version, read_as):
    path = saved(tmp_path, converted(version, entries=2), container)
    with read_checkpoint(path) as ckpt:
        assert ckpt.detected.release.name == read_as
        said = [w for w in ckpt.warnings if "__metadata__ entry says" in w]
        assert len(said) == (read_as != container)
    assert read_release(path).release.name == read_as  # (check's read of the named leaves)
    assert read_release(path, release=container).release.name == container  # --from wins


def test_check_and_upgrade_of_a_converted_file(tmp_path):
    """``check`` says where the model is and why; the upgrade runs the hops from there, and
    its output says 2.10 by both its stamp and its last entry."""
    src = saved(tmp_path, converted(), "2.10")
    done = run_cli("check", src)
    assert done.returncode == EXIT_UPGRADE_NEEDED, done.stderr
    assert done.stdout.strip() == f"{src}: 2.1 needs upgrading to 2.10"
    assert "version '2.1.0'" in done.stderr and "--from 2.10" in done.stderr
    answer = json.loads(run_cli("check", src, "--json").stdout)
    assert answer["release"] == "2.1" and len(answer["hops"]) == 9 and "note" in answer
    shown = run_cli("inspect", src).stdout
    assert "release 2.1  format 0.5" in shown and "note: its model is release 2.1" in shown
    assert json.loads(run_cli("inspect", src, "--json").stdout)["note"] == answer["note"]
    assert run_cli("check", src, "--from", "2.10").returncode == 0

    out = tmp_path / "out"
    done = run_cli("upgrade", src, "--output-dir", out)
    assert done.returncode == 0, done.stderr
    assert "2.1 → 2.10" in done.stdout
    assert run_cli("check", out / src.name).returncode == 0
    before, after = cm.load(src), cm.load(out / src.name)
    assert [e["version"] for e in after["__metadata__"]] == ["2.1.0", "2.10.0"]
    for key, value in before["model"].items():
        assert np.array_equal(value, after["model"][key])


def test_to_its_own_release_it_is_written_in_that_releases_container(tmp_path):
    """A 2.1 model in a 0.5 file is not at 2.1: releases 2.1–2.4 refuse format 0.5. ``--to
    2.1`` writes the same tree in 2.1's container (format 0.4, stamped 2.1.0)."""
    src = saved(tmp_path, converted(), "2.10")
    done = run_cli("check", src, "--to", "2.1", "-q")
    assert done.returncode == EXIT_UPGRADE_NEEDED
    assert "needs writing in its own release's container at 2.1" in done.stdout
    out = tmp_path / "out"
    done = run_cli("upgrade", src, "--to", "2.1", "--output-dir", out)
    assert done.returncode == 0, done.stderr
    with h5py.File(out / src.name, "r") as f:
        assert float(f.attrs["__version__"]) == 0.4
        assert f.attrs["__cstorch_version__"] == "2.1.0"
    assert run_cli("check", out / src.name, "--to", "2.1").returncode == 0
    assert cm.load(out / src.name)["__metadata__"] == converted()["__metadata__"]
    done = run_cli("upgrade", out / src.name, "--to", "2.1", "--output-dir", tmp_path / "again")
    assert "already at 2.1" in done.stdout


def test_from_names_a_2_0_model_in_a_0_5_file_but_not_a_1_9_one(tmp_path):
    """``--from`` takes a 2.0+ release for a 0.5 file (the model of an older release in a
    newer container: Model Zoo 2.10's HF → cs-2.0 writes one, with no ``__metadata__`` to
    tell); 1.9's format 0.3 has a legacy spec no 0.5 file holds: refused."""
    src = saved(tmp_path, converted("2.10.0"), "2.10")
    done = run_cli("check", src, "--from", "2.3")
    assert done.returncode == EXIT_UPGRADE_NEEDED and "2.3 needs upgrading" in done.stdout
    done = run_cli("check", src, "--from", "2.0")
    assert done.returncode == EXIT_UPGRADE_NEEDED and "2.0 needs upgrading" in done.stdout
    done = run_cli("upgrade", src, "--from", "2.0", "--to", "2.1", "-o", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert read_release(tmp_path / "out" / src.name).release.name == "2.1"
    done = run_cli("check", src, "--from", "1.9")
    assert done.returncode == 2
    assert "--from 1.9 writes format 0.3 but the file is format 0.5" in done.stderr


def test_a_long_list_and_a_linked_version_text(tmp_path):
    """Many conversions' entries: the last one counts. One version object at two places (0.5
    writes the later one as a ``LinkedObject`` naming the first): ``check`` follows the link
    to the first place's text, as the read does."""
    path = saved(tmp_path, converted("2.3.0", entries=40), "2.10")
    assert read_release(path).release.name == "2.3"
    state = {"__metadata__": [{"version": "2.1.0"}, {"version": "2.5.0"}, {"version": "2.1.0"}]}
    path = saved(tmp_path, state, "2.10", "linked.mdl")
    name = "__metadata__.2.version"
    linked = {"key": "__metadata__.0.version", "__LINKED__": True, "__TYPE__": "LinkedObject"}
    document = {
        "__spec__": [{name: "*"}, treespec.single_leaf_spec(name)],
        "__objects__": [name],
        f"{name}.__metadata__": {**linked, "__NONE__": True},
    }
    with h5py.File(path, "a") as f:
        f.attrs[f"{name}.__metadata__"] = json.dumps(document, indent=4)
    with read_checkpoint(path) as ckpt:
        assert ckpt.root.get("__metadata__").items[2].get("version").value == "2.1.0"
        assert ckpt.detected.release.name == "2.1"
    assert read_release(path).release.name == "2.1"


def test_convert_checkpoint_cs_auto_goes_on_from_the_converters_target(tmp_path):
    """``scripts/convert_checkpoint.py`` as Model Zoo's ``cs-auto`` does
    (``_get_cs_src_fmt_from_metadata``): a 2.10 converter's cs-2.1 output goes on from 2.1;
    ``--src-fmt cs-2.10`` (the stamp) is the user's word, as ``--from`` is."""
    src = saved(tmp_path, converted(), "2.10")
    config = tmp_path / "params.yaml"
    config.write_text("trainer:\n  init:\n    model:\n      name: gpt2\n")
    args = ["convert", src, "--model", "gpt2", "--config", config, "--tgt-fmt", "cs-2.4"]
    done = run_script("convert_checkpoint.py", *args, "--src-fmt", "cs-auto")
    assert done.returncode == 0, done.stderr
    assert "cs-auto: release 2.1 (__metadata__ version '2.1.0')" in done.stdout
    out = tmp_path / "checkpoint_100_to_cs-2.4.mdl"
    assert read_release(out).release.name == "2.4"
    assert [e["version"] for e in cm.load(out)["__metadata__"]] == ["2.1.0", "2.4.0"]
    out.unlink()
    (tmp_path / "params_to_cs-2.4.yaml").unlink()
    done = run_script("convert_checkpoint.py", *args, "--src-fmt", "cs-2.10")
    assert done.returncode == 0, done.stderr
    assert read_release(out).release.name == "2.4"
    assert [e["version"] for e in cm.load(out)["__metadata__"]] == ["2.1.0", "2.4.0"]


# --------------------------------------------------------------------------- Model Zoo's own files

MZ_CONVERTED = FIXTURES / "modelzoo-2.10-converted"


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "t5"])
def test_model_zoos_own_cs_2_1_output_is_upgraded_from_2_1(tmp_path, family):
    """The files Model Zoo 2.10's converter wrote for cs-2.1 (fixtures/modelzoo-2.10-converted):
    read as 2.1, upgraded to 2.10 with their config, and the same model tensors as this tool's
    own 2.0 → 2.10 upgrade of the file Model Zoo converted (ties aside: Model Zoo writes a copy
    per name), one ``__metadata__`` entry added for 2.10."""
    src = tmp_path / "checkpoint_100.mdl"
    src.write_bytes(lzma.decompress((MZ_CONVERTED / f"{family}-2.0_to_cs-2.1.mdl.xz").read_bytes()))
    config = MZ_CONVERTED / f"{family}-2.0_params_to_cs-2.1.yaml"
    done = run_cli("check", src)
    assert done.returncode == EXIT_UPGRADE_NEEDED and "2.1 needs upgrading to 2.10" in done.stdout
    done = run_cli("upgrade", src, "--config", config, "--output-dir", tmp_path / "up")
    assert done.returncode == 0, done.stderr
    assert "[2.1→2.2]" in done.stdout and "[2.3→2.4]" in done.stdout  # (the config's steps)
    out = tmp_path / "up" / src.name
    assert run_cli("check", out).returncode == 0
    assert [e["version"] for e in cm.load(out)["__metadata__"]] == ["2.1.0", "2.10.0"]
    upgraded_config = yaml.safe_load((tmp_path / "up" / config.name).read_text())
    assert "model" in upgraded_config["trainer"]["init"]
    direct = tmp_path / "direct"
    original = FIXTURES / "models" / f"{family}-2.0" / "checkpoint_100.mdl"
    assert run_cli("upgrade", original, "--model", family, "--output-dir", direct).returncode == 0
    differences = commands.verify(out, direct / original.name)["differences"]
    assert differences  # (the ties and __metadata__, below)
    assert [
        d
        for d in differences
        if not d["name"].startswith("__metadata__") and not d["what"].startswith("tied to")
    ] == []


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "t5"])
def test_convert_checkpoint_appends_the_entry_model_zoos_converter_does(tmp_path, family):
    """``scripts/convert_checkpoint.py`` cs-2.0 → cs-2.1 of the file Model Zoo converted: the
    ``__metadata__`` list Model Zoo's own output has (one entry, ``version`` "2.1.0",
    ``model_name`` "", the converted config as ``params``), where the file had none; its params
    the converted config this script writes beside it."""
    work = tmp_path / family
    shutil.copytree(FIXTURES / "models" / f"{family}-2.0", work)
    args = ["--model", family, "--src-fmt", "cs-2.0", "--tgt-fmt", "cs-2.1"]
    done = run_script("convert_checkpoint.py", "convert", work / "checkpoint_100.mdl", *args,
                      "--config", work / "params.yaml")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "__metadata__.0: added {version: '2.1.0', model_name: ''}" in done.stdout
    ours = cm.load(work / "checkpoint_100_to_cs-2.1.mdl")["__metadata__"]
    packed = MZ_CONVERTED / f"{family}-2.0_to_cs-2.1.mdl.xz"
    (tmp_path / "mz.mdl").write_bytes(lzma.decompress(packed.read_bytes()))
    theirs = cm.load(tmp_path / "mz.mdl")["__metadata__"]
    assert [len(ours), ours[0]["version"], ours[0]["model_name"]] == [1, "2.1.0", ""]
    assert [len(theirs), theirs[0]["version"], theirs[0]["model_name"]] == [1, "2.1.0", ""]
    written = yaml.safe_load((work / "params_to_cs-2.1.yaml").read_text())
    assert ours[0]["params"] == written
    mz_written = yaml.safe_load((MZ_CONVERTED / f"{family}-2.0_params_to_cs-2.1.yaml").read_text())
    assert theirs[0]["params"] == mz_written  # (Model Zoo's entry is its config, too)
