#!/usr/bin/env python
"""The space an upgrade reserves against what it writes, along the tensor-count axis.

    python benchmarks/bench_space.py [--leaves 10000,30000,100000] [--dir D]

Each case is a training state (weights, Adam moments, parameter groups) of tiny tensors (the
output is all metadata: the estimate's hardest case) with long, Model Zoo-like names, saved at
1.9 and 2.0 and upgraded to 2.10 (and 1.9 to 2.0). Prints, per case, the reservation
(``plan.output_bytes``), the output's size and their ratio; the bound held by
``tests/test_space_estimate.py`` is ``size <= reserved <= 1.2 * size + 1 MiB``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_space_estimate import TINY, estimate_and_size, training_state  # noqa: E402

import ckpt_migrate as cm  # noqa: E402

CASES = (("1.9", "2.10"), ("1.9", "2.0"), ("2.0", "2.10"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", default="10000,30000,100000")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: /tmp)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(dir=args.dir))
    print("| leaves | hop | source | output | reserved | reserved / output | within |")
    print("|---|---|---|---|---|---|---|")
    try:
        for leaves in (int(n) for n in args.leaves.split(",")):
            state = training_state(leaves, TINY, True)
            for source, target in CASES:
                src = work / f"src-{source}.mdl"
                if not src.exists():
                    cm.save(state, src, source)
                out = work / "out.mdl"
                out.unlink(missing_ok=True)
                t0 = time.monotonic()
                reserved, size, _ = estimate_and_size(src, target, out)
                ok = size <= reserved <= 1.2 * size + (1 << 20)
                print(
                    f"| {leaves:,} | {source} → {target} | {src.stat().st_size:,} | {size:,} "
                    f"| {reserved:,} | {reserved / size:.3f} | {'yes' if ok else 'NO'} "
                    f"({time.monotonic() - t0:.1f} s) |",
                    flush=True,
                )
            for old in work.glob("src-*.mdl"):
                old.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
