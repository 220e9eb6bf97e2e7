"""A seeded fuzzer: byte flips and truncations of every fixture, through inspect, verify and
upgrade. Every case is either accepted or refused with the bad-input exit code (2) and one
line; never an internal error, a signal, a hang, a leftover temporary or a changed source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("fuzz_worker.py")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_damaged_files_are_refused_cleanly(tmp_path, seed):
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(seed), "100", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"the worker died (exit {proc.returncode}): {proc.stderr[-2000:]}"
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["cases"] == 100
    assert got["internal"] == [], "\n".join(got["internal"])
    assert got["bad_exit"] == [], "\n".join(got["bad_exit"])
    assert got["left_behind"] == [] and got["source_changed"] == []
    assert got["refused"] > 50 and got["accepted"] > 20  # both outcomes are exercised
    assert got["slowest_s"] < 30
    assert got["peak_rss_mib"] < 1024
