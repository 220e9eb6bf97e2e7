#!/usr/bin/env python
"""What reading a checkpoint costs inside a large process: the library called from a training
run that holds its model and optimizer in memory.

Every read starts its preflight children (``format/h5/preflight.py``: HDF5 meets the file in a
child first, so that a hostile file cannot crash or hang the caller). A fork copies the
caller's page tables and the child's exit tears its copy down, so the cost of a read of even a
tiny file grows with the caller's resident memory. This measures, for callers holding 0 MiB
up to ``--sizes`` MiB of touched tensor memory in 4 KiB pages, as torch's CPU tensors are (numpy
arrays with its huge pages turned off, ``NUMPY_MADVISE_HUGEPAGE=0``: in 2 MiB pages a fork
copies 512 times fewer entries, and torch is not needed):

* ``fork``: one bare ``os.fork()`` whose child exits at once, and the wait for it;
* ``1 child`` and ``2 children``: ``read_checkpoint`` (structure and metadata) with the walk
  by one child and by ``WORKERS`` (``preflight.ONE_CHILD_RATIO`` set to 0 and to infinity);
* ``1 spawned`` and ``2 spawned``: the same walks by children started as new interpreters
  (``children.spawn``, as a caller of ``children.SPAWN_RESIDENT`` or more has them);
* ``shipped``: which the rules as shipped take for this file in this caller (one child where
  the caller holds ``ONE_CHILD_RATIO`` times the file's bytes or more; spawned from
  ``SPAWN_RESIDENT`` on).

Along both axes: the caller's size, and the file's tensor count (``--tensors``: MoE files of
2x2 tensors as 2.5 and 1.9 wrote them, beside ``--file``, by default the real 2.10 library's
``basic.mdl``). A second child shares the walk of a file of many objects; below some size
its fork costs more than it saves, the more so in a large caller. Medians of ``--repeat``
runs, each caller size in a fresh process.

    python benchmarks/bench_caller_size.py --sizes 0,4096 --tensors 24,96,204 --repeat 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FILE = ROOT / "fixtures" / "real-cstorch-2.10" / "basic.mdl"


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 1)


def measure(path: Path, mib: int, repeat: int) -> dict[str, float]:
    """In this process: hold ``mib`` MiB, then time the fork and the four reads."""
    import numpy as np

    from ckpt_migrate.format.h5 import children, preflight
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

    found = {"fork": _median_ms(timed(fork))}
    shipped = preflight.ONE_CHILD_RATIO, children.SPAWN_RESIDENT
    how = "spawned" if children.resident() >= children.SPAWN_RESIDENT else "forked"
    found["shipped"] = f"{preflight._workers(path, 'full')} {how}"
    for how, spawn_from in (("", 1 << 62), (" spawned", 0)):
        children.SPAWN_RESIDENT = spawn_from
        for label, ratio in (("1 child", 0), ("2 children", 1 << 62)):
            preflight.ONE_CHILD_RATIO = ratio
            found[label + how] = _median_ms(timed(read))
    preflight.ONE_CHILD_RATIO, children.SPAWN_RESIDENT = shipped
    rss = int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) >> 10
    found["rss_mib"] = rss
    del held
    return found


def _files(counts: list[int], workdir: Path) -> list[tuple[str, Path]]:
    """MoE checkpoints of about ``counts`` tensors of 2x2 (``moe_checkpoint``), as 2.5 writes
    them and as 1.9 did: files of tens to hundreds of objects, where the walk of more objects
    is what a second child shares."""
    sys.path.insert(0, str(Path(__file__).parent))
    from moe_checkpoint import MoEShape, generate

    found = []
    for release in ("2.5", "1.9"):
        for count in counts:
            shape = MoEShape.for_tensors(count, 2, 2)
            path = workdir / f"moe-{shape.tensors}-{release}.mdl"
            generate(path, shape, release)
            found.append((f"MoE {release}, {shape.tensors} tensors", path))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="0,4096", help="MiB the caller holds, comma-separated")
    ap.add_argument("--tensors", default="24,96,204", help="MoE files of about these many")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--file", type=Path, default=DEFAULT_FILE)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # (a size, in this process)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.file, args.one, args.repeat)))
        return
    from ckpt_migrate.format.h5 import children, preflight

    ratio, spawn_from = preflight.ONE_CHILD_RATIO, children.SPAWN_RESIDENT >> 20
    print(
        f"median of {args.repeat}, ms; ONE_CHILD_RATIO {ratio:,}, SPAWN_RESIDENT {spawn_from:,} MiB"
    )
    print(
        "| file | bytes | caller holds (RSS) | fork + exit | 1 child | 2 children "
        "| 1 spawned | 2 spawned | shipped |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        counts = [int(n) for n in args.tensors.split(",") if n]
        for label, path in [(args.file.name, args.file), *_files(counts, Path(tmp))]:
            for mib in (int(s) for s in args.sizes.split(",")):
                one = ["--one", str(mib), "--repeat", str(args.repeat), "--file", str(path)]
                done = subprocess.run(
                    [sys.executable, __file__, *one],
                    capture_output=True,
                    text=True,
                    check=True,
                    env={**os.environ, "NUMPY_MADVISE_HUGEPAGE": "0"},
                )
                r = json.loads(done.stdout)
                print(
                    f"| {label} | {path.stat().st_size:,} | {mib:,} MiB ({r['rss_mib']:,} MiB) "
                    f"| {r['fork']} | {r['1 child']} | {r['2 children']} "
                    f"| {r['1 child spawned']} | {r['2 children spawned']} | {r['shipped']} |"
                )


if __name__ == "__main__":
    main()
