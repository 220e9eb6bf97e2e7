"""Names near a directory's limit (255 bytes): a checkpoint whose own name fits, but whose
temporary (13 bytes more: ``.<8 hex>.tmp``), backup (``.pre-R.bak``) or an export's directory
moved aside would not. Before, each ended in "write failed (File name too long)", blaming a
name the user never chose."""

from __future__ import annotations

import json
import lzma
import os

import pytest
from conftest import FIXTURES, one_line_error, run_cli, sha256_file

from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.sidenames import NAME_MAX, fitting

LONG = "gpt2-2.6.0-" + "x" * 235 + ".mdl"  # 250 bytes
WIDE = "检查点" * 27 + "检a.mdl"  # 251 bytes of UTF-8: a cut at 233 bytes splits a character
REAL_26 = FIXTURES / "real-cstorch-2.6-2.9" / "gpt2-2.6.0.mdl.xz"  # the real library's file


def real_source(directory, name):
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_bytes(lzma.decompress(REAL_26.read_bytes()))
    return path


@pytest.mark.parametrize("name", [LONG, WIDE], ids=["ascii", "utf-8"])
def test_a_long_named_checkpoint_is_upgraded(tmp_path, name):
    assert NAME_MAX - 13 < len(os.fsencode(name)) <= NAME_MAX
    src = real_source(tmp_path / "src", name)
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("upgrade", src, "-o", out, "--verify", "full", "--json")
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(out) == [name]
    with read_checkpoint(out / name) as ckpt:
        assert ckpt.release is not None and ckpt.release.name == "2.10"


@pytest.mark.parametrize("name", [LONG, WIDE], ids=["ascii", "utf-8"])
def test_a_killed_runs_temporary_of_a_long_name_is_removed_by_the_next(tmp_path, name):
    src = real_source(tmp_path / "src", name)
    out = tmp_path / "out"
    out.mkdir()
    stale = out / f"{fitting(name, 13)}.0123abcd.tmp"
    stale.write_bytes(b"half an upgrade")
    assert len(os.fsencode(stale.name)) == NAME_MAX
    proc = run_cli("upgrade", src, "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert next(w for w in res["warnings"] if "interrupted run" in w).startswith(
        f"removed {stale.name},"
    )
    assert os.listdir(out) == [name]


def test_other_names_temporaries_are_left(tmp_path):
    """A long name's temporaries are known by its first bytes; a shorter name's are not its."""
    src = real_source(tmp_path / "src", LONG)
    out = tmp_path / "out"
    out.mkdir()
    other = out / "gpt2-2.6.0-xx.mdl.0123abcd.tmp"
    other.write_bytes(b"another file's")
    assert run_cli("upgrade", src, "-o", out).returncode == 0
    assert sorted(os.listdir(out)) == sorted([LONG, other.name])


def test_a_short_names_rerun_leaves_a_long_names_temporaries(tmp_path):
    """Only a name long enough to be cut looks for cut temporaries: ``a.mdl`` leaves those of
    a 250-byte name that begins with it."""
    src = real_source(tmp_path / "src", "gpt2.mdl")
    out = tmp_path / "out"
    out.mkdir()
    other = out / f"{fitting('gpt2.mdl' + 'y' * 242, 13)}.0123abcd.tmp"
    other.write_bytes(b"another file's")
    assert run_cli("upgrade", src, "-o", out).returncode == 0
    assert sorted(os.listdir(out)) == sorted(["gpt2.mdl", other.name])


def test_in_place_is_refused_where_its_backup_could_not_be_named(tmp_path):
    src = real_source(tmp_path, LONG)
    digest = sha256_file(src)
    proc = run_cli("upgrade", src, "--inplace")
    one_line_error(proc, 2, "too long for a backup", ".pre-2.6.bak", "262 bytes", "-o DIR")
    assert sha256_file(src) == digest and os.listdir(tmp_path) == [LONG]


def test_an_export_replaces_a_long_named_directory(tmp_path):
    """``export-hf --force`` moves the old directory aside under a name of its own first."""
    models = FIXTURES / "models" / "gpt2-2.0"
    hf = tmp_path / ("hf-" + "y" * 247)
    export = ("export-hf", models / "checkpoint_100.mdl", hf, "--config", models / "params.yaml")
    assert run_cli(*export).returncode == 0
    (hf / "README.md").write_text("the old export's")
    proc = run_cli(*export, "--force")
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(tmp_path) == [hf.name] and not (hf / "README.md").exists()
    assert (hf / "config.json").exists()
