#!/usr/bin/env python
"""What reading a checkpoint costs inside a large process: the library called from a training
run that holds its model and optimizer in memory.

Every read forks its preflight children (``format/h5/preflight.py``: HDF5 meets the file in a
child first, so that a hostile file cannot crash or hang the caller). A fork copies the
caller's page tables and the child's exit tears its copy down, so the cost of a read of even a
tiny file grows with the caller's resident memory. This measures, for callers holding 0 MiB
up to ``--sizes`` MiB of touched tensor memory in 4 KiB pages, as torch's CPU tensors are (numpy
arrays with its huge pages turned off, ``NUMPY_MADVISE_HUGEPAGE=0``: in 2 MiB pages a fork
copies 512 times fewer entries, and torch is not needed):

* ``fork``: one bare ``os.fork()`` whose child exits at once, and the wait for it;
* ``read``: ``read_checkpoint`` of ``--file`` (default: the real 2.10 library's ``basic.mdl``),
  structure and metadata, with the walk as shipped (one child for a file under
  ``preflight.ONE_CHILD_BELOW`` bytes);
* ``read, 2 children``: the same with the threshold at 0 (every file walked by ``WORKERS``
  children, as before the threshold).

Medians of ``--repeat`` runs, each size in a fresh process.

    python benchmarks/bench_caller_size.py --sizes 0,1024,4096 --repeat 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FILE = ROOT / "fixtures" / "real-cstorch-2.10" / "basic.mdl"


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 1)


def measure(path: Path, mib: int, repeat: int) -> dict[str, float]:
    """In this process: hold ``mib`` MiB, then time the fork and the two reads."""
    import numpy as np

    from ckpt_migrate.format.h5 import preflight
    from ckpt_migrate.format.read import read_checkpoint

    held = np.ones(mib << 18, dtype=np.float32)  # (every page touched)

    def fork() -> None:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    def read() -> None:
        with read_checkpoint(path):
            pass

    def timed(fn) -> list[float]:
        fn()  # (warm)
        out = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
        return out

    found = {"fork": _median_ms(timed(fork)), "read": _median_ms(timed(read))}
    shipped = preflight.ONE_CHILD_BELOW
    preflight.ONE_CHILD_BELOW = 0
    found["read, 2 children"] = _median_ms(timed(read))
    preflight.ONE_CHILD_BELOW = shipped
    rss = int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) >> 10
    found["rss_mib"] = rss
    del held
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="0,1024,4096", help="MiB the caller holds, comma-separated")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--file", type=Path, default=DEFAULT_FILE)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # (a size, in this process)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.file, args.one, args.repeat)))
        return
    print(f"{args.file.name} ({args.file.stat().st_size:,} bytes), median of {args.repeat}, ms")
    print("| caller holds | caller RSS | fork + exit | read | read, 2 children |")
    print("|---|---|---|---|---|")
    for mib in (int(s) for s in args.sizes.split(",")):
        one = ["--one", str(mib), "--repeat", str(args.repeat), "--file", str(args.file)]
        done = subprocess.run(
            [sys.executable, __file__, *one],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "NUMPY_MADVISE_HUGEPAGE": "0"},
        )
        r = json.loads(done.stdout)
        print(
            f"| {mib:,} MiB | {r['rss_mib']:,} MiB | {r['fork']} | {r['read']} "
            f"| {r['read, 2 children']} |"
        )


if __name__ == "__main__":
    main()
