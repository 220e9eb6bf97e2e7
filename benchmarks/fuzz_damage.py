"""Thousands of targeted damaged checkpoints (issue #36) through every entry point, the outcome
classes counted; exit 1 if any outcome is a forbidden one.

    python benchmarks/fuzz_damage.py --cases 3000 --jobs 2        # summary table on stdout
    python benchmarks/fuzz_damage.py --cases 3000 --json > r.json
    python benchmarks/fuzz_damage.py --cases 1000 --wide     # also bytes anywhere outside data

The cases are ``tests/fuzz_damage.py``'s (a chunk index entry's stored size or address, an LZ4
frame header, object-header bytes of the fixtures), split over ``--jobs`` worker processes of
``--chunk`` cases each, each with its own seed, so that a crash inside HDF5 costs one worker's
cases and shows as its exit status.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WORKER = Path(__file__).resolve().parents[1] / "tests" / "fuzz_damage.py"


def run_worker(seed: int, count: int, wide: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="ckpt-fuzz-") as tmp:
        proc = subprocess.run(
            [sys.executable, str(WORKER), str(seed), str(count), tmp, *(["--wide"] * wide)],
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        return {"crashed": f"seed {seed}: exit {proc.returncode}: {proc.stderr[-500:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=250, help="cases per worker process")
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--wide",
        action="store_true",
        help="also the real 2.6-2.9 files, and bytes anywhere outside tensor data (other cases)",
    )
    args = parser.parse_args()
    counts = [min(args.chunk, args.cases - i) for i in range(0, args.cases, args.chunk)]
    start = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        seeds = range(args.seed, args.seed + len(counts))
        results = list(pool.map(run_worker, seeds, counts, [args.wide] * len(counts)))
    total: dict = {"cases": 0, "kinds": Counter(), "outcomes": {}, "forbidden": [], "crashed": []}
    for res in results:
        if "crashed" in res:
            total["crashed"].append(res["crashed"])
            continue
        total["cases"] += res["cases"]
        total["kinds"].update(res["kinds"])
        total["forbidden"] += res["forbidden"]
        for verb, classes in res["outcomes"].items():
            total["outcomes"].setdefault(verb, Counter()).update(classes)
    total["seconds"] = round(time.monotonic() - start, 1)
    if args.json:
        print(json.dumps(total, indent=1, default=dict))
    else:
        _table(total)
    return 1 if total["forbidden"] or total["crashed"] else 0


def _table(total: dict) -> None:
    classes = sorted({c for v in total["outcomes"].values() for c in v})
    print(f"{total['cases']} damaged files in {total['seconds']} s; kinds: {dict(total['kinds'])}")
    print(f"{'entry point':<14}" + "".join(f"{c:>16}" for c in classes))
    for verb, got in total["outcomes"].items():
        print(f"{verb:<14}" + "".join(f"{got.get(c, 0):>16}" for c in classes))
    for line in total["forbidden"][:20] + total["crashed"]:
        print(f"FORBIDDEN {line}")


if __name__ == "__main__":
    sys.exit(main())
