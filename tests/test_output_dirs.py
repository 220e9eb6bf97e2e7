"""Where outputs go, in plain words: an unwritable place is exit 5 and one line, found before any
work; a missing --output-dir is created; a file already at the target goes into the output
directory too; --force replaces an output only once the new one is verified.

The unwritable place is a read-only tmpfs mounted at test time when running as root (root may
write anywhere else), or a directory without write permission otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, REAL, one_line_error, release_of, run_cli, sha256_file


@pytest.fixture
def unwritable(tmp_path):
    """A directory no file can be created in; the words its error must contain."""
    place = tmp_path / "locked"
    place.mkdir()
    if os.geteuid() != 0:
        place.chmod(0o555)
        yield place, "permission denied writing"
        place.chmod(0o755)
        return
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=4m", "tmpfs", str(place)], capture_output=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs: {proc.stderr.decode().strip()}")
    try:
        yield place, "read-only file system"
    finally:
        subprocess.run(["umount", str(place)], check=False)


def test_an_unwritable_output_dir_is_exit_5_before_any_work(unwritable, tmp_path):
    place, words = unwritable
    src = FIXTURES / "release-2.0.mdl"
    for extra in ([], ["--dry-run"]):
        proc = run_cli("upgrade", src, "-o", place, *extra)
        line = one_line_error(proc, 5, words, str(place), skip_warnings=True)
        assert "errno" not in line and "HDF5" not in line
    one_line_error(run_cli("upgrade", src, "-o", place / "new"), 5, words, str(place / "new"))
    one_line_error(run_cli("upgrade-dir", FIXTURES / "format-test", "-o", place / "sub"), 5, words)
    proc = run_cli("to-torch", src, place / "model.pt")
    one_line_error(proc, 5, words, str(place / "model.pt"))
    assert os.listdir(place) == []


def test_a_missing_output_dir_is_created(tmp_path):
    out = tmp_path / "a" / "b"
    src = tmp_path / "release-2.0.mdl"  # a private copy: an upgrade locks its source
    shutil.copyfile(FIXTURES / "release-2.0.mdl", src)
    proc = run_cli("upgrade", src, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert release_of(out / "release-2.0.mdl") == "2.10"
    dry = tmp_path / "dry"
    proc = run_cli("upgrade", FIXTURES / "release-2.0.mdl", "-o", dry, "-n")
    assert proc.returncode == 0, proc.stderr
    assert not dry.exists()  # a dry run creates nothing


@pytest.mark.parametrize(
    ("verb", "name"),
    [(["upgrade"], "out.mdl"), (["upgrade", "-n"], "new.h5"), (["upgrade-dir"], "Out.MDL")],
)
def test_an_output_dir_named_like_a_checkpoint_file_is_refused(verb, name, tmp_path):
    """``-o out.mdl`` made a directory ``out.mdl/`` holding the output under its source's
    name; an existing directory of any name is still taken (and the Python API's explicit
    ``output_dir`` takes any name: tests/test_s3_fleet.py)."""
    model_dir = tmp_path / "model_dir"
    model_dir.mkdir()
    src = model_dir / "checkpoint_1.mdl"
    shutil.copyfile(FIXTURES / "release-2.0.mdl", src)
    given = model_dir if verb[0] == "upgrade-dir" else src
    proc = run_cli(verb[0], given, "-o", tmp_path / name, *verb[1:])
    instead = f"--output-dir {tmp_path / name.rsplit('.', 1)[0]}"
    one_line_error(proc, 2, name, "--output-dir takes a directory", instead)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_dir"]
    (tmp_path / name).mkdir()
    assert run_cli(verb[0], given, "-o", tmp_path / name, *verb[1:]).returncode == 0


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin", "config.json"])
def test_an_export_directory_named_like_a_file_is_refused(name, tmp_path):
    """``export-hf ckpt model.safetensors`` made a directory ``model.safetensors/``."""
    src = FIXTURES / "models" / "gpt2-2.0"
    args = ("--config", src / "params.yaml")
    proc = run_cli("export-hf", src / "checkpoint_100.mdl", tmp_path / name, *args)
    instead = str(tmp_path / name.rsplit(".", 1)[0])
    one_line_error(proc, 2, name, "writes a Hugging Face model directory", f"e.g. {instead}")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / name).mkdir()  # (a directory of that name, existing: the export's own check)
    proc = run_cli("export-hf", src / "checkpoint_100.mdl", tmp_path / name, *args)
    one_line_error(proc, 2, name, "already exists", "--force")


def test_force_replaces_an_output_only_with_a_verified_one(tmp_path):
    src = FIXTURES / "release-1.9.mdl"
    out = tmp_path / "out"
    out.mkdir()
    old = out / src.name
    old.write_bytes(b"an older upgrade")
    proc = run_cli("upgrade", src, "-o", out, "--force")  # fails: no dataloader state
    one_line_error(proc, 2, "--data-iter-dir", skip_warnings=True)
    assert old.read_bytes() == b"an older upgrade"
    assert sorted(os.listdir(out)) == [src.name]
    proc = run_cli("upgrade", src, "-o", out, "--force", "--drop-dataloader-state")
    assert proc.returncode == 0, proc.stderr
    assert release_of(old) == "2.10" and sorted(os.listdir(out)) == [src.name]
    one_line_error(run_cli("upgrade", src, "--inplace", "--force"), 2, "--force")


def test_force_replaces_an_output_with_a_current_file(tmp_path):
    src = FIXTURES / "release-2.10.mdl"
    out = tmp_path / "out"
    out.mkdir()
    (out / src.name).write_bytes(b"stale")
    one_line_error(run_cli("upgrade", src, "-o", out), 2, "already exists")
    proc = run_cli("upgrade", src, "-o", out, "--force", "--drop-dataloader-state")
    assert proc.returncode == 0, proc.stderr
    assert "already at 2.10; copied into" in proc.stdout
    assert sha256_file(out / src.name) == sha256_file(src)


def test_a_refused_or_failed_run_leaves_no_directory_it_made(tmp_path, real_layout_19):
    """A missing --output-dir was made before anything was checked, and stayed, empty, when
    the run was then refused (a --manifest naming the output), failed (a file that is no
    checkpoint), or, for upgrade-dir, upgraded nothing; one that existed stays as it was."""
    src = tmp_path / "src" / "checkpoint_100.mdl"  # laid out as the 1.9 library wrote it
    src.parent.mkdir()
    shutil.copyfile(real_layout_19, src)
    drop = "--drop-dataloader-state"
    out = tmp_path / "a" / "b"
    proc = run_cli("upgrade", src, "-o", out, drop, "--manifest", out / src.name)
    one_line_error(proc, 2, "--manifest names the output")
    assert not (tmp_path / "a").exists()
    junk = tmp_path / "junk" / "checkpoint_1.mdl"
    junk.parent.mkdir()
    junk.write_bytes(b"not a checkpoint\n")
    one_line_error(run_cli("upgrade", junk, "-o", out), 2, "not an HDF5 file")
    assert not (tmp_path / "a").exists()
    proc = run_cli("upgrade-dir", junk.parent, "-o", out)
    assert proc.returncode == 2 and "1 failed" in proc.stderr + proc.stdout
    assert not (tmp_path / "a").exists()
    (tmp_path / "a").mkdir()
    one_line_error(run_cli("upgrade", junk, "-o", out), 2, "not an HDF5 file")
    assert os.listdir(tmp_path / "a") == []  # (it was there before: it stays)
    proc = run_cli("upgrade-dir", src.parent, "-o", out, drop)
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(out) == [src.name]


@pytest.mark.parametrize(
    "command",
    [
        "upgrade -o",
        "upgrade -o --dry-run",
        "upgrade-dir -o",
        "upgrade-dir -o --dry-run",
        "upgrade --config-out",
        "to-torch",
        "export-hf",
        "import-hf",
    ],
)
def test_an_output_path_through_a_file_names_that_file(tmp_path, command):
    """An output whose path passes through a file (``ckpt.mdl/out``): "write failed (Not a
    directory)", exit 5, from the commands that make their output directory, and "its
    directory does not exist; create it first" from the others, which cannot be done."""
    src = tmp_path / "src" / "basic.mdl"  # written by the real 2.10 library
    src.parent.mkdir()
    shutil.copyfile(REAL / "basic.mdl", src)
    blocking = tmp_path / "a.mdl"
    blocking.write_bytes(b"a file, where a directory is named\n")
    out = blocking / "sub" / "out"
    verb, _, option = command.partition(" ")
    if verb == "upgrade-dir":
        args = [verb, src.parent, option.split()[0], out, *option.split()[1:]]
    elif option == "--config-out":
        config = FIXTURES / "configs" / "modelzoo-gpt2-small-2.2.yaml"
        args = [verb, src, "-o", tmp_path / "o", "--config", config, "--config-out", out]
    elif option:
        args = [verb, src, option.split()[0], out, *option.split()[1:]]
    elif verb == "export-hf":  # (the shipped 1.9 example: a GPT-2 with its run's config)
        example = FIXTURES / "example"
        args = [verb, example / "checkpoint_100.mdl", out, "--config", example / "params.yaml"]
    elif verb == "import-hf":  # a directory transformers wrote
        transformers = pytest.importorskip("transformers")
        config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16)
        transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "src" / "hf")
        args = [verb, tmp_path / "src" / "hf", out]
    else:
        args = [verb, src, out]
    one_line_error(run_cli(*args), 2, "a.mdl is a file, not a directory", "choose another output")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["src", "a.mdl"])


def test_an_output_dir_the_system_will_not_make_says_to_check_the_path(tmp_path):
    """``/proc`` takes no new directory (ENOENT, whoever asks): "write failed (No such file or
    directory)" gave no fix."""
    if not Path("/proc/self").exists():
        pytest.skip("no /proc here")
    src = tmp_path / "basic.mdl"  # written by the real 2.10 library
    shutil.copyfile(REAL / "basic.mdl", src)
    proc = run_cli("upgrade", src, "-o", "/proc/ckpt-migrate-out")
    one_line_error(proc, 5, "write failed (No such file or directory); check the path")


@pytest.mark.parametrize(
    ("verb", "written"),
    [("to-torch", "basic.pt"), ("from-torch", "basic.mdl"), ("tf-to-h5", "basic.mdl")],
)
def test_a_file_output_named_as_a_directory_is_refused(verb, written, tmp_path):
    """``to-torch ckpt outdir/`` wrote a file named ``outdir`` (typer's ``Path`` dropped the
    separator), and an existing directory was "already exists; refusing to overwrite it": both
    are refused by name, with the file to name inside instead; nothing is written. (tf-to-h5
    is given a directory of no TensorFlow checkpoint: its output is refused first.)"""
    sources = tmp_path / "sources"
    sources.mkdir()
    source = {"to-torch": REAL / "basic.mdl", "tf-to-h5": sources / "basic"}.get(verb)
    if source is None:
        source = sources / "basic.pt"
        assert run_cli("to-torch", REAL / "basic.mdl", source).returncode == 0
    made = sorted(sources.iterdir())
    for given, why in [
        (f"{tmp_path / 'outdir'}/", "ends with a separator"),
        (str(tmp_path / "exists"), "is a directory"),
    ]:
        (tmp_path / "exists").mkdir(exist_ok=True)
        proc = run_cli(verb, source, given)
        one_line_error(
            proc, 2, why, "this command writes one file", f"e.g. {Path(given) / written}"
        )
        assert sorted(p.name for p in tmp_path.iterdir()) == ["exists", "sources"]
        assert list((tmp_path / "exists").iterdir()) == []
        assert sorted(sources.iterdir()) == made
