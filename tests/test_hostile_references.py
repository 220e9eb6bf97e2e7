"""Checkpoints that point outside themselves are refused before any tensor is read, by every
entry point that reads a dataset, and nothing outside the file ever reaches an output (``check``
and a plan of hops that edit only the root read no dataset, and so follow nothing).

Each hostile file is a real checkpoint (written by ``save``) whose tensor ``model.w`` was
replaced, with its attributes, by a dataset of the same name, shape and dtype that refers to a
"secret" file: external raw storage (absolute and relative path), an external link, a virtual
dataset, or a filter outside the allow-list.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import pytest
from conftest import REAL, one_line_error, run_cli, run_script

import ckpt_migrate as cm
from ckpt_migrate.errors import UnsafeContentError
from ckpt_migrate.format.h5 import plugins

SECRET = b"TOP-SECRET-BYTES"  # 16 bytes, the size of model.w
KINDS = ["external-absolute", "external-relative", "external-link", "virtual", "filter"]
WORDS = {
    "external-absolute": "external file",
    "external-relative": "external file",
    "external-link": "external link",
    "virtual": "virtual dataset",
    "filter": "filter 307",
}


def hostile(tmp_path: Path, kind: str, release: str = "2.10") -> Path:
    src = tmp_path / "in" / "checkpoint_1.mdl"
    src.parent.mkdir(parents=True)
    cm.save({"model": {"w": np.arange(16, dtype=np.uint8)}, "step": 3}, src, release)
    point_outside(src, kind, tmp_path)
    return src


def point_outside(src: Path, kind: str, tmp_path: Path) -> None:
    """Replace the dataset ``model.w`` of ``src`` (16 bytes) by one of ``kind`` referring to
    a secret file in ``tmp_path``, keeping its attributes."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(SECRET)
    secret_h5 = tmp_path / "secret.h5"
    with h5py.File(secret_h5, "w") as g:
        g["d"] = np.frombuffer(SECRET, dtype=np.uint8)
    with h5py.File(src, "r+") as f:
        attrs = dict(f["model.w"].attrs)
        del f["model.w"]
        if kind == "external-absolute":
            f.create_dataset("model.w", (16,), np.uint8, external=[(str(secret), 0, 16)])
        elif kind == "external-relative":
            f.create_dataset("model.w", (16,), np.uint8, external=[("../secret.bin", 0, 16)])
        elif kind == "external-link":
            f["model.w"] = h5py.ExternalLink(str(secret_h5), "/d")
        elif kind == "virtual":
            layout = h5py.VirtualLayout(shape=(16,), dtype=np.uint8)
            layout[:] = h5py.VirtualSource(str(secret_h5), "d", shape=(16,))
            f.create_virtual_dataset("model.w", layout)
        else:
            f.create_dataset("model.w", data=np.frombuffer(SECRET, np.uint8), **hdf5plugin.BZip2())
        if kind != "external-link":
            for key, value in attrs.items():
                f["model.w"].attrs[key] = value


def assert_no_secret(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_bytes(), f"{path} holds bytes from outside"


COMMANDS = {
    "inspect": lambda src, out: ["inspect", src],
    # ``check`` reads only the root's release attributes since issue 33 (it follows nothing:
    # tests/test_outline_read.py); ``check --deep`` reads every dataset.
    "check --deep": lambda src, out: ["check", src, "--deep"],
    # A plan of hops that edit only the root reads the root and the spec (the root's links
    # checked by its child), not the datasets: ``test_a_plan_of_root_edits_follows_nothing``.
    "plan": lambda src, out: ["plan", src, "--to", "2.4"],
    "verify": lambda src, out: ["verify", src, src],
    "upgrade": lambda src, out: ["upgrade", src, "--to", "2.10", "--output-dir", out],
    "upgrade-full": lambda src, out: ["upgrade", src, "--output-dir", out, "--verify", "full"],
    "to-torch": lambda src, out: ["to-torch", src, out / "w.pt"],
    "upgrade-dir": lambda src, out: ["upgrade-dir", src.parent, "--output-dir", out],
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_a_file_that_points_outside(tmp_path, kind, command):
    release = "2.0" if command == "upgrade" else "2.10"  # 2.0: a real upgrade, not a no-op
    src = hostile(tmp_path, kind, release)
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli(*COMMANDS[command](src, out))
    if command == "upgrade-dir":  # a per-file failure in the summary, the worst exit code
        assert proc.returncode == 2, proc.stderr
        assert "model.w" in proc.stderr and WORDS[kind] in proc.stderr, proc.stderr
    else:
        one_line_error(proc, 2, "model.w", WORDS[kind], "was not read")
    assert list(out.iterdir()) == []
    assert_no_secret(tmp_path / "in")
    assert_no_secret(out)


@pytest.mark.parametrize("kind", KINDS)
def test_a_plan_of_root_edits_follows_nothing(tmp_path, kind):
    """``plan`` of a 2.5 file to 2.10 (hops that edit only the root) reads the root's
    attributes and its spec, as ``check`` reads the release: no dataset is opened, so nothing
    outside is read; a root link that is not a hard link (an external link) is refused by
    name, the links being read by the preflight child. The upgrade it plans refuses the file."""
    import torch  # (a tensor leaf: its metadata describes it, its dataset is not opened)

    src = tmp_path / "in" / "checkpoint_1.mdl"
    src.parent.mkdir(parents=True)
    cm.save({"model": {"w": torch.arange(16, dtype=torch.uint8)}, "step": 3}, src, "2.5")
    point_outside(src, kind, tmp_path)
    proc = run_cli("plan", src, "--json")
    if kind == "external-link":
        one_line_error(proc, 2, "model.w", WORDS[kind], "was not read")
    else:
        assert proc.returncode == 0, proc.stderr
        plan = json.loads(proc.stdout)
        assert plan["from"] == "2.5" and plan["datasets_changed"] is False
        assert plan["tensor_bytes"] is None  # (the leaves' metadata is not read)
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("upgrade", src, "--output-dir", out)
    one_line_error(proc, 2, "model.w", WORDS[kind], "was not read")
    assert list(out.iterdir()) == []
    assert_no_secret(tmp_path / "in")


@pytest.mark.parametrize("kind", KINDS)
def test_the_python_api_refuses_it(tmp_path, kind):
    src = hostile(tmp_path, kind)
    with pytest.raises(UnsafeContentError, match=r"model\.w"):
        cm.load(src)
    with pytest.raises(UnsafeContentError, match=r"model\.w"):
        cm.read_checkpoint(src)
    with pytest.raises(UnsafeContentError, match=r"model\.w"):
        cm.CheckpointManager(src.parent).load(src)


def test_the_model_zoo_script_refuses_it(tmp_path):
    src = hostile(tmp_path, "external-absolute", "2.0")
    config = tmp_path / "params.yaml"
    config.write_text("model:\n  hidden_size: 16\n")
    proc = run_script(
        "convert_checkpoint.py",
        "convert",
        src,
        "--model",
        "gpt2",
        "--src-fmt",
        "cs-2.0",
        "--tgt-fmt",
        "cs-2.10",
        "--config",
        config,
        "--output-dir",
        tmp_path / "out",
    )
    one_line_error(proc, 2, "model.w", "external file", skip_warnings=True)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    assert_no_secret(tmp_path / "in")


def test_soft_links_inside_the_file_are_allowed(tmp_path):
    src = tmp_path / "ok.mdl"
    cm.save({"model": {"w": np.arange(4.0)}}, src)
    with h5py.File(src, "r+") as f:
        f["alias"] = h5py.SoftLink("/model.w")
    assert float(cm.load(src)["model"]["w"][3]) == 3.0


def test_no_filter_plugin_is_loaded_from_the_environment(tmp_path):
    """HDF5 takes HDF5_PLUGIN_PATH into its search path when it starts; opening a checkpoint
    empties that path, so a plugin dropped there is never loaded (LZ4, hdf5plugin's library
    registered by ``h5.plugins``, still decodes)."""
    src = tmp_path / "lz4.mdl"
    cm.save({"model": {"w": np.arange(64.0)}}, src)
    code = (
        "import sys, h5py, ckpt_migrate as cm\n"
        "before = h5py.h5pl.size()\n"
        f"w = cm.load({str(src)!r})['model']['w']\n"
        "print(before, h5py.h5pl.size(), float(w[63]))\n"
    )
    env = {**os.environ, "HDF5_PLUGIN_PATH": str(tmp_path / "plugins")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "0", "63.0"]


@pytest.mark.parametrize("integer", [True, False], ids=["integer", "float"])
def test_a_file_repacked_with_a_builtin_filter_is_told_how_to_undo_it(tmp_path, integer):
    """``h5repack -f SOFF`` on a real library's file: one of HDF5's own filters, which no
    release writes and whose output cannot be checked undecoded. The refusal ended in "a
    checkpoint must hold all of its data itself", which is about external data; it now names
    the filter and how to write the file without it, and that works."""
    src, plain = tmp_path / "repacked.mdl", tmp_path / "plain.mdl"
    shutil.copyfile(REAL / "dtypes.mdl", src)
    plugins.register_lz4()  # (the real file's other tensors are LZ4)
    key = "int64" if integer else "float32"
    with h5py.File(src, "r+") as f:
        data, attrs = f[key][()], dict(f[key].attrs)
        del f[key]
        f.create_dataset(key, data=data, scaleoffset=0 if integer else 6)
        f[key].attrs.update(attrs)
    proc = run_cli("upgrade", src, "--to", "2.4", "--output-dir", tmp_path / "out")
    one_line_error(
        proc,
        2,
        f"'/{key}' uses HDF5 filter 6 (scaleoffset), which no release writes",
        "write it again without that filter (HDF5_PLUGIN_PATH=",
        "h5repack -f NONE FILE NEW.mdl",
    )
    # What the fix says to do (h5repack -f NONE), done with h5py: the file upgrades.
    with h5py.File(src) as f, h5py.File(plain, "w") as g:
        g.attrs.update(dict(f.attrs))
        for name in f:
            g.create_dataset(name, data=f[name][()], dtype=f[name].dtype)
            g[name].attrs.update(dict(f[name].attrs))
    assert (
        run_cli("upgrade", plain, "--to", "2.4", "--output-dir", tmp_path / "out").returncode == 0
    )
