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
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, REAL, ROOT, one_line_error, run_cli, run_script


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


@pytest.mark.parametrize("mode", [0o400, 0o600, 0o640, 0o664])
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
        assert _mode(out / src.name) == (mode | 0o600) & ~_umask()
    again = run_cli("upgrade", src, "--output-dir", out, "--force", *args)  # written anew
    assert again.returncode == 0, again.stderr
    assert _mode(out / src.name) == (mode | 0o600) & ~_umask()  # (its owner may write it)


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


@pytest.mark.parametrize("mode", [0o400, 0o600, 0o640, 0o664])
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


def _as_nobody() -> list[str]:
    """The command prefix that runs as user ``nobody`` (65534), or skip with the reason."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("running as another user needs root and setpriv (util-linux)")
    prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run([*prefix, sys.executable, "-c", "import ckpt_migrate"], cwd="/")
    if probe.returncode != 0:
        pytest.skip("user nobody cannot read this checkout or its venv")
    return prefix


def _run_as(prefix: list[str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [*prefix, sys.executable, "-m", "ckpt_migrate", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, cwd="/")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory of root's (``0755``) that user ``nobody`` can reach but not write: pytest's
    own are root's, ``0700``."""
    run = Path(tempfile.mkdtemp(prefix="ckpt-migrate-nobody-"))
    os.chmod(run, 0o755)
    yield run
    shutil.rmtree(run, ignore_errors=True)


def _nobodys(parent: Path, name: str) -> Path:
    """A new directory under ``parent`` that belongs to ``nobody``."""
    mine = parent / name
    mine.mkdir()
    os.chown(mine, 65534, 65534)
    return mine


@pytest.mark.parametrize("inplace", [False, True])
def test_a_read_only_checkpoint_of_a_user_is_upgraded(shared, inplace):
    """A user's ``0400`` checkpoint (kept read-only against accidents): HDF5 opens the
    temporary again to write it, which its owner must be able to; root never finds out."""
    prefix = _as_nobody()
    run = _nobodys(shared, "run")
    src = run / "ckpt.mdl"
    shutil.copyfile(REAL / "basic.mdl", src)
    os.chown(src, 65534, 65534)
    os.chmod(src, 0o400)
    where = ["--inplace"] if inplace else ["--output-dir", run / "out"]
    proc = _run_as(prefix, "upgrade", src, "--to", "2.3", *where)
    assert proc.returncode == 0, proc.stderr
    out = src if inplace else run / "out" / src.name
    assert _mode(out) == (0o400 if inplace else 0o600 & ~_umask())
    assert (out.stat().st_uid, out.stat().st_gid) == (65534, 65534)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("upgrade", "{}", "--dry-run"), "ckpt.mdl"),
        (("upgrade", "{}", "--inplace", "--to", "2.6"), "ckpt.mdl"),
        (("inspect", "{}"), "ckpt.mdl"),
        (("from-torch", "{}", "out.mdl"), "state.pt"),
        (("import-hf", "{}", "out.mdl"), "hf"),
    ],
)
def test_an_input_behind_a_directory_the_user_may_not_enter_is_one_line(tmp_path, args, name):
    """``upgrade``, ``inspect``, ``from-torch`` and ``import-hf`` said "internal error:
    PermissionError ...; rerun with --debug" (exit 1): whether the path exists raised EACCES.
    Now exit 5, one line. (The real 2.10 library's file; a model fixture exported to HF.)"""
    import torch

    prefix = _as_nobody()
    private = tmp_path / "private"  # (root's, 0700)
    private.mkdir(mode=0o700)
    shutil.copyfile(REAL / "basic.mdl", private / "ckpt.mdl")
    torch.save({"w": torch.ones(2)}, private / "state.pt")
    models = FIXTURES / "models" / "gpt2-2.0"
    export = ("export-hf", models / "checkpoint_100.mdl", private / "hf")
    assert run_cli(*export, "--config", models / "params.yaml").returncode == 0
    path = private / name
    proc = _run_as(prefix, *(path if a == "{}" else a for a in args))
    one_line_error(proc, 5, f"{path}: cannot read the file (Permission denied)")


def test_a_manager_of_a_directory_the_user_may_not_list_says_so(tmp_path, shared):
    """``latest()`` raised a bare ``PermissionError``; an empty or missing directory is
    None (no checkpoint yet), one this user may not list is not."""
    prefix = _as_nobody()
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    script = (
        "import sys, ckpt_migrate as cm\n"
        "from ckpt_migrate.errors import CkptIOError\n"
        "try:\n    print(cm.CheckpointManager(sys.argv[1]).latest())\n"
        "except CkptIOError as exc:\n    print(exc.exit_code, exc)\n"
    )

    def latest(directory: Path) -> str:
        command = [*prefix, sys.executable, "-c", script, str(directory)]
        proc = subprocess.run(command, capture_output=True, text=True, cwd="/")
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert latest(private) == f"5 {private}: cannot list the directory (Permission denied)"
    assert latest(shared / "none") == "None"  # (reachable, and missing)


@pytest.mark.parametrize("side", ["--manifest", "--config-out"])
def test_a_side_output_the_user_may_not_write_is_refused_before_the_checkpoint(shared, side):
    """``--manifest`` or ``--config-out`` in a directory the user may not write to was refused
    only once the upgraded checkpoint had been published (exit 5 with an output there)."""
    prefix, run = _as_nobody(), shared  # (root's: the user may not write here)
    mine = _nobodys(run, "mine")
    example = FIXTURES / "example"
    args = ["upgrade", example / "checkpoint_100.mdl", "--drop-dataloader-state"]
    args += ["--config", example / "params.yaml", "--output-dir", mine / "out"]
    proc = _run_as(prefix, *args, side, run / "side")
    one_line_error(proc, 5, f"permission denied writing {run}")
    assert list(mine.iterdir()) == []


def test_an_imports_config_out_the_user_may_not_write_is_refused_before_the_checkpoint(shared):
    """``import-hf DIR ckpt.mdl --config-out P`` wrote the checkpoint, then failed on P."""
    prefix, run = _as_nobody(), shared
    models = FIXTURES / "models" / "gpt2-2.0"
    hf = run / "hf"
    proc = run_cli(
        "export-hf", models / "checkpoint_100.mdl", hf, "--config", models / "params.yaml"
    )
    assert proc.returncode == 0, proc.stderr
    mine = _nobodys(run, "mine")
    proc = _run_as(prefix, "import-hf", hf, mine / "ckpt.mdl", "--config-out", run / "params.yaml")
    one_line_error(proc, 5, f"permission denied writing {run}")
    assert list(mine.iterdir()) == []


MANAGER = """
import sys
import ckpt_migrate as cm
from ckpt_migrate.errors import CkptIOError
import numpy as np
try:
    cm.CheckpointManager(sys.argv[1]).save({"model": {"w": np.ones(2, np.float32)}}, step=1)
except CkptIOError as exc:
    print(exc.exit_code, exc)
"""


def test_a_manager_in_a_directory_the_user_may_not_write_raises_the_librarys_error(shared):
    """``CheckpointManager(DIR).save`` raised a bare ``PermissionError`` from making DIR (the
    library's errors are ``CkptError``s, ``CkptIOError`` for I/O: exit 5)."""
    prefix, run = _as_nobody(), shared
    command = [*prefix, sys.executable, "-c", MANAGER, str(run / "run" / "checkpoints")]
    proc = subprocess.run(command, capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"5 permission denied writing {run / 'run' / 'checkpoints'}")


def test_a_managers_first_save_refused_leaves_no_directory(tmp_path):
    import ckpt_migrate as cm
    from ckpt_migrate.errors import CkptError

    manager = cm.CheckpointManager(tmp_path / "run" / "checkpoints")
    colliding = {"a.b": np.ones(2, np.float32), "a": {"b": np.zeros(2, np.float32)}}
    with pytest.raises(CkptError, match="would collide"):  # (refused by the writer)
        manager.save({"model": colliding}, step=1)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "unreadable",
    ["data_iter_checkpoint_state_file_global", "data_iter_state_file_worker_0_step_100.txt"],
)
def test_a_side_file_the_user_may_not_read_is_said_so_not_called_damaged(shared, unreadable):
    """The 1.9 dataloader's side files (the shipped example's, as 1.9 wrote them): one the
    user may not read was "first line is not an integer; is this a 1.9 dataloader state
    file?" (exit 2), the diagnosis of a damaged one."""
    prefix, run = _as_nobody(), shared
    shutil.copytree(FIXTURES / "example", run / "example")
    os.chmod(run / "example" / "dataloader" / unreadable, 0o600)  # root's
    out = _nobodys(run, "out")
    args = ["upgrade", run / "example" / "checkpoint_100.mdl", "--output-dir", out]
    proc = _run_as(
        prefix,
        *args,
        "--data-iter-dir",
        run / "example" / "dataloader",
        "--dataloader-type",
        "iterable",
    )
    where = run / "example" / "dataloader" / unreadable
    one_line_error(proc, 5, f"{where}: cannot read the file (Permission denied)")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("unreadable", ["model.safetensors", "config.json", "params.yaml"])
def test_an_input_the_user_may_not_read_is_an_io_error_not_a_damaged_file(shared, unreadable):
    """``import-hf`` said "not a safetensors file ([Errno 13] ...)" or "not a config (...)"
    (exit 2), and a run's config "cannot read the config (Permission denied)" (exit 2, the
    usage code): each is the I/O error it is, exit 5, as an unreadable checkpoint is."""
    prefix, run = _as_nobody(), shared
    models = FIXTURES / "models" / "gpt2-2.0"
    shutil.copyfile(models / "params.yaml", run / "params.yaml")
    proc = run_cli(
        "export-hf", models / "checkpoint_100.mdl", run / "hf", "--config", models / "params.yaml"
    )
    assert proc.returncode == 0, proc.stderr
    where = run / "params.yaml" if unreadable == "params.yaml" else run / "hf" / unreadable
    os.chmod(where, 0o600)  # root's
    mine = _nobodys(run, "mine")
    if unreadable == "params.yaml":  # (the script; the verbs: see the test below)
        script = str(ROOT / "scripts" / "convert_checkpoint.py")
        args = ["convert-config", where, "--model", "gpt2", "--src-fmt", "cs-2.0"]
        command = [*prefix, sys.executable, script, *map(str, args), "--tgt-fmt", "cs-2.3"]
        proc = subprocess.run([*command, "--output-dir", str(mine)], capture_output=True, text=True)
    else:
        proc = _run_as(prefix, "import-hf", run / "hf", mine / "ckpt.mdl")
    one_line_error(proc, 5, f"{where}: cannot read the file (Permission denied)")
    assert list(mine.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        ("inspect", "{}"),
        ("check", "{}"),
        ("plan", "{}"),
        ("verify", "{}", "{}"),
        ("to-torch", "{}", "{out}/state.pt"),
        ("from-torch", "{}", "{out}/ckpt.mdl"),
        ("tf-to-h5", "{}", "{out}/tf.h5"),
        ("upgrade", "{}", "--dry-run"),
        ("upgrade", "{}", "--to", "2.6", "--output-dir", "{out}"),  # a root edit
        ("upgrade", "{}", "--to", "2.3", "--output-dir", "{out}"),  # a rewrite
        ("upgrade-dir", "{dir}", "--to", "2.3", "--output-dir", "{out}", "--progress", "none"),
    ],
    ids=lambda args: "-".join(a.lstrip("-") for a in args if not a.startswith("{")),
)
def test_a_checkpoint_the_user_may_not_read_is_an_io_error(shared, args):
    """The real 2.10 library's file, root's and ``0600``. The parser checked a path readable
    first: "Invalid value for 'path': Path '…' is not readable." (exit 2, the usage code, in a
    box). Past it, ``upgrade`` blamed its source's read on the output: "permission denied
    writing <the source>"; ``upgrade-dir``, ``from-torch`` and ``tf-to-h5`` the same or an
    internal error. Each is now the one line an unreadable side file gives, exit 5, and writes
    nothing."""
    prefix = _as_nobody()
    src = _source(shared, REAL / "basic.mdl", 0o600)  # (root's)
    out = _nobodys(shared, "out")
    fill = {"{}": src, "{out}": out, "{dir}": src.parent}
    proc = _run_as(prefix, *(fill.get(a, a.replace("{out}", str(out))) for a in args))
    one_line_error(proc, 5, f"{src}: cannot read the file (Permission denied)", skip_warnings=True)
    assert list(out.iterdir()) == []


def test_a_directory_the_user_may_not_enter_is_named_not_the_output(shared, real_layout_19):
    """A 1.9 checkpoint as the 1.9 library laid it out, its dataloader directory (the shipped
    example's side files) root's and ``0700``: the parser refused the option (exit 2), and
    past it the upgrade said "permission denied writing <the output>". The same directory
    given to ``import-hf`` was an internal error, and the TensorFlow converter's a traceback's
    last words."""
    prefix = _as_nobody()
    closed = shared / "closed"
    shutil.copytree(FIXTURES / "example" / "dataloader", closed)
    os.chmod(closed, 0o700)
    src = _source(shared, real_layout_19, 0o644)
    out = _nobodys(shared, "out")
    upgrade = ["upgrade", src, "--output-dir", out, "--dataloader-type", "iterable"]
    for args in (
        [*upgrade, "--data-iter-dir", closed],
        ["import-hf", closed, out / "ckpt.mdl"],
    ):
        proc = _run_as(prefix, *args)
        one_line_error(proc, 5, f"{closed}: cannot list the directory (Permission denied)")
        assert list(out.iterdir()) == []


def test_a_config_the_user_may_not_read_is_an_io_error_for_the_verbs_too(shared):
    """``upgrade --config`` of a ``params.yaml`` (the Model Zoo fixture's) the user may not
    read: "Invalid value for '--config': Path … is not readable." (exit 2) from the parser."""
    prefix = _as_nobody()
    models = FIXTURES / "models" / "gpt2-2.0"
    config = _source(shared, models / "params.yaml", 0o600, "params.yaml")
    src = _source(shared, models / "checkpoint_100.mdl", 0o644)
    out = _nobodys(shared, "out")
    proc = _run_as(prefix, "upgrade", src, "--config", config, "--output-dir", out)
    one_line_error(proc, 5, f"{config}: cannot read the file (Permission denied)")
    assert list(out.iterdir()) == []


def test_a_copy_worker_that_cannot_start_is_said_so(tmp_path, monkeypatch):
    """The copy of a root edit runs in a worker process of ``sys.executable``. One this user
    may not run made the upgrade say "permission denied writing <the output>"."""
    from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade

    python = tmp_path / "python"
    python.write_text("")
    os.chmod(python, 0o644)  # (not executable: root may not run it either)
    monkeypatch.setattr(sys, "executable", str(python))
    out = tmp_path / "out"
    out.mkdir()
    result = upgrade(REAL / "basic.mdl", UpgradeOptions(target="2.6", output_dir=out))
    assert (result.status, result.exit_code) == ("failed", 5)
    assert result.error == (
        f"cannot start the copy worker with {python} (Permission denied); "
        "run ckpt-migrate with a Python this user may execute"
    )
    assert list(out.iterdir()) == []
