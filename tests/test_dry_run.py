"""`upgrade --dry-run` is a preview: the real run's change lines, warnings and failures, nothing
written.

Each test runs the dry run and then the real run on the same fixture in real processes and
compares what they print.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, one_line_error, run_cli

SIDE = FIXTURES / "release-1.9-data-iter"


def change_lines(stdout: str) -> list[str]:
    """The lines an upgrade prints before its final line: ``  model: …`` and each change."""
    lines = stdout.splitlines()
    out = []
    for line in lines:
        if not line.startswith("  ") or line.startswith("    "):
            break
        out.append(line)
    return out


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


def listing(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()} if path.exists() else set()


CASES = [
    ("1.7", []),
    ("1.8", ["--drop-dataloader-state"]),
    ("1.9", ["--drop-dataloader-state"]),
    (
        "1.9",
        ["--data-iter-dir", str(SIDE / "good"), "--dataloader-type", "map", "--shuffle-seed", "7"],
    ),
    ("2.0", ["--model", "gpt2"]),
    ("2.3", []),
]


@pytest.mark.parametrize(("release", "extra"), CASES)
def test_dry_run_prints_the_real_runs_change_lines(tmp_path, release, extra):
    # a copy: an upgrade locks its source, and another test may be upgrading the fixture itself
    src = tmp_path / f"release-{release}.mdl"
    shutil.copyfile(FIXTURES / src.name, src)
    out = tmp_path / "out"
    out.mkdir()
    dry = run_cli("upgrade", src, "--output-dir", out, "--dry-run", *extra)
    assert dry.returncode == 0, dry.stderr
    assert listing(out) == set()
    assert f"{src}: dry run; nothing written" in dry.stdout
    real = run_cli("upgrade", src, "--output-dir", out, *extra)
    assert real.returncode == 0, real.stderr
    assert change_lines(dry.stdout) == change_lines(real.stdout)
    assert len(change_lines(real.stdout)) > 1  # the model line and at least one change
    assert warnings(dry.stderr) == warnings(real.stderr)
    assert listing(out) == {src.name}


def test_dry_run_json_lists_the_same_changes(tmp_path):
    src = FIXTURES / "release-1.9.mdl"
    args = ["--data-iter-dir", str(SIDE / "good"), "--dataloader-type", "iterable"]
    dry = run_cli("upgrade", src, "--dry-run", "--json", *args)
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert planned["status"] == "planned"
    real = run_cli("upgrade", src, "--output-dir", tmp_path, "--json", *args)
    done = json.loads(real.stdout)
    assert done["status"] == "upgraded"
    assert planned["changes"] == done["changes"] and planned["changes"]
    assert any("dataloader" in c for c in planned["changes"])
    assert any("last_epoch" in c for c in planned["changes"])
    assert planned["warnings"] == done["warnings"]


def test_dry_run_fails_where_the_real_run_fails(tmp_path):
    src = FIXTURES / "release-1.9.mdl"
    out = tmp_path / "out"
    out.mkdir()
    (out / src.name).write_bytes(b"precious")
    dry = run_cli("upgrade", src, "--output-dir", out, "--dry-run")
    real = run_cli("upgrade", src, "--output-dir", out)
    assert one_line_error(dry, 2, "already exists") == one_line_error(real, 2, "already exists")
    assert (out / src.name).read_bytes() == b"precious"

    other = tmp_path / "other"
    other.mkdir()
    dry = run_cli("upgrade", src, "--output-dir", other, "--dry-run", "--strict")
    real = run_cli("upgrade", src, "--output-dir", other, "--strict")
    assert one_line_error(dry, 2, "--data-iter-dir", skip_warnings=True) == one_line_error(
        real, 2, skip_warnings=True
    )
    assert listing(other) == set()


def test_dry_run_refuses_a_missing_leaf_like_the_real_run(tmp_path):
    cfg = tmp_path / "params.yaml"
    cfg.write_text("model:\n  share_embedding_weights: false\n")
    src = FIXTURES / "release-1.9.mdl"
    out = tmp_path / "o"
    out.mkdir()
    base = ["upgrade", src, "--output-dir", out, "--config", cfg, "--to", "2.0"]
    dry = run_cli(*base, "--dry-run")
    real = run_cli(*base)
    line = one_line_error(real, None, "model.lm_head.weight", "--allow-missing", skip_warnings=True)
    errors = [ln for ln in dry.stderr.splitlines() if ln.startswith("error:")]
    assert dry.returncode == real.returncode and errors[0] == line
    assert listing(out) == set()


def test_quiet_dry_run_is_one_line(tmp_path):
    src = FIXTURES / "release-2.3.mdl"
    proc = run_cli("upgrade", src, "-o", tmp_path, "-n", "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{src}: 2.3 → 2.10 in 7 hop(s); dry run, nothing written"]
    assert listing(tmp_path) == set()
