"""An upgrade never lets more people read a checkpoint than could read its source.

Outputs were created ``0o644`` less the umask whatever the source's mode: a private (``0600``)
checkpoint upgraded with ``--output-dir`` came out readable by every user, and ``--inplace``
replaced a ``0640`` file owned by its user with a ``0644`` one owned by whoever ran the
upgrade. An output now takes the source's permission bits within the umask, as ``cp`` makes a
copy, from its temporary file's creation on; a file replaced in place keeps its mode, and its
owner and group where the process may set them. The conversions (torch, Hugging Face) and the
configs follow their source too. The inputs are the real 2.10 library's files, a 1.9
checkpoint as the 1.9 library laid it out, the model fixtures and the example's config.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from conftest import FIXTURES, REAL, run_cli, run_script


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _source(tmp_path: Path, original: Path, mode: int, name: str = "ckpt.mdl") -> Path:
    src = tmp_path / "src" / name
    src.parent.mkdir(exist_ok=True)
    shutil.copyfile(original, src)
    os.chmod(src, mode)
    return src


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o664])
@pytest.mark.parametrize(
    ("original", "args"),
    [
        (REAL / "basic.mdl", ("--to", "2.6")),  # a root edit
        (REAL / "basic.mdl", ("--to", "2.3")),  # a rewrite
        (FIXTURES / "release-2.10.mdl", ()),  # current: linked, or with --force copied
    ],
    ids=["root-edit", "rewrite", "current"],
)
def test_an_output_is_no_more_readable_than_its_source(tmp_path, original, args, mode):
    src = _source(tmp_path, original, mode)
    out = tmp_path / "out"
    proc = run_cli("upgrade", src, "--output-dir", out, *args)
    assert proc.returncode == 0, proc.stderr
    if not args:  # a current file is linked: the same file, its own mode
        assert os.path.samefile(src, out / src.name)
        (out / src.name).unlink()
        (out / src.name).write_bytes(b"an older output")
    else:
        assert _mode(out / src.name) == mode & ~_umask()
    again = run_cli("upgrade", src, "--output-dir", out, "--force", *args)  # written anew
    assert again.returncode == 0, again.stderr
    assert _mode(out / src.name) == mode & ~_umask()


def test_a_legacy_layouts_rewrite_and_its_config_stay_private(tmp_path, real_layout_19):
    src = _source(tmp_path, real_layout_19, 0o600)
    config = tmp_path / "src" / "params.yaml"
    shutil.copyfile(FIXTURES / "example" / "params.yaml", config)
    os.chmod(config, 0o600)
    out = tmp_path / "out"
    proc = run_cli(
        "upgrade", src, "--config", config, "--drop-dataloader-state", "--output-dir", out
    )
    assert proc.returncode == 0, proc.stderr
    assert _mode(out / src.name) == _mode(out / "params.yaml") == 0o600


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o664])
def test_an_inplace_upgrade_keeps_the_files_mode_and_owner(tmp_path, mode):
    src = _source(tmp_path, REAL / "dtypes.mdl", mode)
    owner = (1234, 2345) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    if os.geteuid() == 0:
        os.chown(src, *owner)
    proc = run_cli("upgrade", src, "--inplace", "--to", "2.3")
    assert proc.returncode == 0, proc.stderr
    backup = src.with_name(f"{src.name}.pre-2.10.bak")
    for path in (src, backup):
        st = path.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (mode, *owner), path.name


def test_the_scripts_keep_a_private_checkpoint_private(tmp_path):
    """The release documentation's ``fix_checkpoint_spec.py``, in place and beside."""
    src = _source(tmp_path, FIXTURES / "release-1.9.mdl", 0o600, "checkpoint_10.mdl")
    proc = run_script("fix_checkpoint_spec.py", "checkpoint_10.mdl", cwd=src.parent)
    assert proc.returncode == 0, proc.stderr
    assert _mode(src.parent / "checkpoint_10_fixed.mdl") == 0o600
    proc = run_script(
        "fix_checkpoint_spec.py", "--fix_inplace", "checkpoint_10.mdl", cwd=src.parent
    )
    assert proc.returncode == 0, proc.stderr
    assert _mode(src) == 0o600


@pytest.mark.parametrize("mode", [0o600, 0o640])
def test_the_conversions_keep_a_private_checkpoint_private(tmp_path, mode):
    """``to-torch`` and ``from-torch``, ``export-hf`` (its directory: whom the checkpoint does
    not let read, it does not let in) and ``import-hf`` back: each output was ``0644``."""
    models = FIXTURES / "models" / "gpt2-2.0"
    src = _source(tmp_path, models / "checkpoint_100.mdl", mode)
    pt, back, hf = tmp_path / "state.pt", tmp_path / "back.mdl", tmp_path / "hf"
    for args in (
        ("to-torch", src, pt),
        ("from-torch", pt, back),
        ("export-hf", src, hf, "--config", models / "params.yaml"),
    ):
        proc = run_cli(*args)
        assert proc.returncode == 0, proc.stderr
    assert _mode(pt) == _mode(back) == mode & ~_umask()
    assert _mode(hf) == (0o750 if mode & 0o040 else 0o700) & ~_umask()
    proc = run_cli("import-hf", hf, tmp_path / "imported.mdl")
    assert proc.returncode == 0, proc.stderr
    assert _mode(tmp_path / "imported.mdl") == 0o666 & _mode(hf) & ~_umask()
