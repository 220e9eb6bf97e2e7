#!/usr/bin/env python
"""Benchmark the peak memory of ``ckpt-migrate to-torch`` against a whole-state ``torch.save``.

Generates a release-2.0 checkpoint of ``--size`` bytes (64 MiB float32 tensors, one in memory at
a time while writing), then runs in separate processes:

* ``ckpt-migrate to-torch SRC DST``, which writes one tensor at a time (``torch/stream.py``);
* the whole-state way it replaced: ``ckpt_migrate.load``, every tensor materialized, one
  ``torch.save``.

For each: the wall time, the peak resident set size (``ru_maxrss`` from ``wait4``) and the peak
anonymous memory (``RssAnon`` of ``/proc/PID/status``, polled every 10 ms). Each output is
checked against the source (sizes and one tensor's values). See benchmarks/README.md.

    python benchmarks/bench_to_torch.py --size 2GiB
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TENSOR = 4096 * 4096  # float32 elements: 64 MiB
WHOLE_STATE = """
import sys, torch
from ckpt_migrate.torch import load, materialize
state = load(sys.argv[1])
def plain(x):
    if isinstance(x, torch.Tensor):
        return materialize(x)
    if isinstance(x, dict):
        return type(x)((k, plain(v)) for k, v in x.items())
    return x
torch.save(plain(state), sys.argv[2])
"""


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(GiB|MiB|GB|MB)?", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    unit = {"GiB": 2**30, "MiB": 2**20, "GB": 10**9, "MB": 10**6, None: 1}[m.group(2)]
    return int(float(m.group(1)) * unit)


def make(path: Path, size: int) -> None:
    """A 2.0 checkpoint of about ``size`` bytes, written with ``cm.save`` in one call (its
    tensors are LazyTensors read from a numpy memmap, so the generator holds little)."""
    code = f"""
import numpy as np, torch, ckpt_migrate as cm
from ckpt_migrate.torch import LazyTensor
n = max(1, {size} // ({TENSOR} * 4))
def loader(i):
    return lambda: torch.from_numpy(
        np.random.default_rng(i).standard_normal({TENSOR}, np.float32).reshape(4096, 4096))
model = {{f"layer{{i}}.weight": LazyTensor.create((4096, 4096), "float32", loader(i))
          for i in range(n)}}
cm.save({{"model": model, "step": 1}}, {str(path)!r}, "2.0")
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def measure(argv: list[str]) -> dict[str, float]:
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_anon = [0]

    def poll() -> None:
        status = Path(f"/proc/{proc.pid}/status")
        while proc.poll() is None:
            try:
                m = re.search(r"RssAnon:\s+(\d+) kB", status.read_text())
            except OSError:
                break
            if m:
                peak_anon[0] = max(peak_anon[0], int(m.group(1)))
            time.sleep(0.01)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - start
    watcher.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return {
        "seconds": round(seconds, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024),
        "peak_anon_mib": round(peak_anon[0] / 1024),
    }


def check(src: Path, out: Path) -> None:
    code = f"""
import torch
from ckpt_migrate.torch import load, materialize
a, b = load({str(src)!r}), torch.load({str(out)!r}, weights_only=True, mmap=True)
names = list(a["model"])
assert names == list(b["model"]), "names differ"
assert torch.equal(materialize(a["model"][names[-1]]), b["model"][names[-1]]), "values differ"
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--size", type=parse_size, default=parse_size("2GiB"))
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-to-torch-", dir=args.dir))
    try:
        src = base / "src.mdl"
        make(src, args.size)
        print(f"source: {src.stat().st_size / 2**30:.2f} GiB")
        runs = {
            "ckpt-migrate to-torch (streaming)": [
                sys.executable,
                "-m",
                "ckpt_migrate",
                "to-torch",
                str(src),
                str(base / "a.pt"),
            ],
            "whole state, one torch.save": [
                sys.executable,
                "-c",
                WHOLE_STATE,
                str(src),
                str(base / "b.pt"),
            ],
        }
        for (label, argv), out in zip(runs.items(), ("a.pt", "b.pt"), strict=True):
            result = measure(argv)
            check(src, base / out)
            print(f"{label}: {result}")
            (base / out).unlink()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
