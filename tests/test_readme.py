"""The README's promises: its two commands exist, CI runs the test command, exit codes match."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from ckpt_migrate import errors
from ckpt_migrate.cli import console

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _commands() -> list[str]:
    return re.findall(r"```sh\n(.+?)\n```", README)


def _ckpt_migrate(args: list[str], cwd: Path):
    """``ckpt-migrate ARGS`` run from ``cwd`` (this interpreter's installation)."""
    return subprocess.run(
        [sys.executable, "-m", "ckpt_migrate", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_readme_opens_with_the_two_commands():
    example, tests = _commands()[:2]
    assert "ckpt-migrate upgrade fixtures/example/checkpoint_100.mdl --config" in example
    assert "--data-iter-dir fixtures/example/dataloader" in example
    assert "mkdir" not in example  # upgrade creates its --output-dir
    assert (ROOT / "fixtures/example/checkpoint_100.mdl").is_file()
    assert "torch==2.13.0" in example and "torch==2.13.0" in tests
    assert "pytest" in tests


def test_the_first_command_does_the_real_job(tmp_path):
    """The README's first command, after its setup, from a directory where fixtures/ is the
    repository's: an old run's checkpoint, config and dataloader side files reach the newest
    release together, and what changed is said (no unknown model); its sample lines are true."""

    from ckpt_migrate.format import releases
    from ckpt_migrate.format.read import read_checkpoint

    command = _commands()[0].split(" && ")
    assert command[-2] == "rm -rf upgraded"
    args = shlex.split(command[-1])
    assert args[0] == ".venv/bin/ckpt-migrate"
    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
    proc = _ckpt_migrate(args[1:], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "unknown" not in out.split("config 1.9", 1)[0]
    sample = re.search(r"It prints what changed.*?```text\n(.+?)\n```", README, flags=re.S)
    for line in sample.group(1).splitlines():
        if "…" not in line:
            assert line in out.splitlines(), line
    with read_checkpoint(tmp_path / "upgraded/checkpoint_100.mdl") as ckpt:
        assert ckpt.release.name == releases.LATEST.name
        assert ckpt.root.get("dataloader") is not None
    assert "trainer:" in (tmp_path / "upgraded/params.yaml").read_text()


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci/run").read_text()
    assert _commands()[1] in ci.splitlines()
    assert "set -euo pipefail" in ci


def test_exit_codes_in_readme_match_the_code():
    table = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", README, flags=re.M))
    assert table.keys() == {"0", "1", "2", "3", "4", "5", "10", "129", "130", "141", "143"}
    assert str(console.EXIT_INTERNAL) in table and str(console.EXIT_READER_GONE) in table
    assert str(errors.EXIT_BAD_INPUT) in table and str(errors.EXIT_NEWER_THAN_TOOL) in table
    assert str(errors.EXIT_VERIFY_FAILED) in table and str(errors.EXIT_IO) in table
    assert str(errors.EXIT_UPGRADE_NEEDED) in table
    assert str(console.EXIT_INTERRUPTED) in table and str(console.EXIT_TERMINATED) in table
    assert str(console.EXIT_HUNG_UP) in table


def _python_block(after: str) -> str:
    return re.search(re.escape(after) + r".*?```python\n(.+?)\n```", README, flags=re.S).group(1)


def test_the_python_api_block_runs_as_written(tmp_path):
    """From a directory where fixtures/ is the repository's: the outputs load as promised."""

    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
    code = _python_block("## Python API")
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    from ckpt_migrate.cli import commands

    example = ROOT / "fixtures/format-test/checkpoint_100.mdl"
    assert commands.verify(example, tmp_path / "out.mdl")["identical"]
    assert (tmp_path / "back.mdl").is_file()


def test_the_hugging_face_block_runs_as_written(tmp_path):
    """The README's export-hf / import-hf commands, line by line, from a directory where
    fixtures/ is the repository's; the exported directory loads in transformers."""

    import pytest

    transformers = pytest.importorskip("transformers")
    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
    block = re.search(r"## Hugging Face models\n\n```sh\n(.+?)\n```", README, flags=re.S)
    assert block is not None
    for line in block.group(1).splitlines():
        argv = shlex.split(line)
        assert argv[0] == "ckpt-migrate"
        proc = _ckpt_migrate(argv[1:], tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2-hf").config.n_layer == 1
    assert (tmp_path / "gpt2-2.10.mdl").is_file() and (tmp_path / "params-2.10.yaml").is_file()
