"""``run_cli`` and ``run_script`` fork a server that has imported the command (``forked_cli``):
what a forked call answers must be what the command started afresh answers."""

from __future__ import annotations

import subprocess
import sys

import forked_cli
import pytest
from conftest import FIXTURES, ROOT

EXAMPLE = FIXTURES / "example"

CALLS = [
    (None, ("--help",), None),
    (None, ("inspect", "checkpoint_100.mdl"), EXAMPLE),  # a path relative to its cwd
    (None, ("inspect", "--json", str(EXAMPLE / "checkpoint_100.mdl")), None),
    (None, ("inspect", "no-such.mdl"), None),  # a one-line error, exit 2
    (None, ("upgrade", "--no-such-option"), None),  # a usage error
    (None, ("plan", str(EXAMPLE / "params.yaml")), None),  # not a checkpoint
    ("fix_checkpoint_spec.py", ("--help",), None),
    ("data_iter_state_conversion.py", ("--help",), None),
    ("convert_checkpoint.py", ("list",), None),
]


@pytest.mark.parametrize(("script", "argv", "cwd"), CALLS)
def test_a_forked_call_answers_as_the_command_started_afresh(script, argv, cwd):
    path = ROOT / "scripts" / script if script else None
    forked = forked_cli.run(list(argv), script=path, cwd=cwd, stdin_devnull=True)
    assert forked is not None
    head = [str(path)] if path else ["-m", "ckpt_migrate"]
    fresh = subprocess.run(
        [sys.executable, *head, *argv],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
    assert forked.args == fresh.args


def test_a_call_in_another_environment_has_a_server_started_in_it(monkeypatch, tmp_path):
    """A variable may be read when a module is imported: a server that imported the command in
    one environment serves no call made in another."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os; print(os.getppid())\n")

    def server() -> str:
        done = forked_cli.run([], script=probe, cwd=tmp_path, stdin_devnull=True)
        assert done is not None and done.returncode == 0
        return done.stdout

    first = server()
    assert server() == first
    monkeypatch.setenv("CKPT_MIGRATE_STALL_SECONDS", "3")
    other = server()
    assert other != first
    assert server() == other


def test_the_child_has_the_tests_own_environment(monkeypatch, tmp_path):
    """The name of the test pytest keeps in the environment changes from test to test without
    sending calls to a fresh Python, and the child sees its current value."""
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "a name of its own")
    probe = tmp_path / "probe.py"
    probe.write_text("import os, sys; print(os.environ['PYTEST_CURRENT_TEST'], sys.argv[1:])\n")
    done = forked_cli.run(["x", "y"], script=probe, cwd=tmp_path, stdin_devnull=True)
    assert done is not None
    assert (done.returncode, done.stdout) == (0, "a name of its own ['x', 'y']\n")


def test_once_a_child_imported_torch_the_next_start_with_it(monkeypatch, tmp_path):
    """A server of its own (a variable of this test's): its children start without torch
    until one imports it (``to-torch``); the children after start with it, and a torch
    command answers and writes as started afresh."""
    monkeypatch.setenv("CKPT_MIGRATE_TEST_SERVER", str(tmp_path))
    probe = tmp_path / "probe.py"
    probe.write_text("import sys; print('torch' in sys.modules)\n")

    def has_torch() -> str:
        done = forked_cli.run([], script=probe, cwd=tmp_path, stdin_devnull=True)
        assert done is not None and done.returncode == 0
        return done.stdout.strip()

    assert has_torch() == "False"
    outputs = []
    for where in ("forked", "fresh", "forked-again"):
        real = FIXTURES / "real-cstorch-2.10" / "basic.mdl"
        argv = ["to-torch", str(real), str(tmp_path / where / "x.pt")]
        (tmp_path / where).mkdir()
        if where == "fresh":
            done = subprocess.run(
                [sys.executable, "-m", "ckpt_migrate", *argv], capture_output=True, text=True
            )
        else:
            done = forked_cli.run(argv, script=None, cwd=tmp_path, stdin_devnull=True)
            assert done is not None
        outputs.append((done.returncode, done.stdout.replace(where, "W"), done.stderr))
        assert done.returncode == 0, done.stderr
        assert has_torch() == "True"
    assert outputs[0] == outputs[1] == outputs[2]
    import torch
    from digest import digest

    # (the archive's name inside is its temporary's, random: the contents are compared)
    forked, fresh = (
        torch.load(tmp_path / w / "x.pt", weights_only=True) for w in ("forked", "fresh")
    )
    assert digest(forked) == digest(fresh)
