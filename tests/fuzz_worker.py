"""Run seeded byte flips and truncations of the fixtures through inspect, verify and upgrade, in
one process, and print one JSON summary line (used by ``test_fuzz.py`` in a subprocess, so that a
crash inside HDF5 shows as a signal instead of killing pytest)."""

from __future__ import annotations

import hashlib
import json
import random
import resource
import sys
import time
from pathlib import Path

from fuzz_damage import sources  # (the seeds index its list)

from ckpt_migrate.cli import commands
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.errors import CkptError


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    if rng.random() < 0.3:
        return bytes(out[: rng.randrange(len(out))])
    for _ in range(rng.choice([1, 2, 4, 16, 64])):
        out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def main(seed: int, count: int, workdir: Path) -> dict:
    sources_ = sources()
    rng = random.Random(seed)
    summary: dict = {
        "cases": 0,
        "accepted": 0,
        "refused": 0,
        "internal": [],
        "bad_exit": [],
        "left_behind": [],
        "source_changed": [],
        "slowest_s": 0.0,
    }
    out = workdir / "out"
    out.mkdir()
    for i in range(count):
        src = rng.choice(sources_)
        case = workdir / f"case{i}.mdl"
        case.write_bytes(mutate(rng, src.read_bytes()))
        digest = hashlib.sha256(case.read_bytes()).hexdigest()
        for verb in ("inspect", "verify", "upgrade"):
            start = time.monotonic()
            try:
                if verb == "inspect":
                    commands.inspect(case)
                elif verb == "verify":
                    commands.verify(case, case)
                else:
                    opts = UpgradeOptions(
                        output_dir=out,
                        allow_missing=True,
                        inputs={"drop_dataloader_state": True},  # 1.8/1.9: write, not refuse
                    )
                    res = upgrade(case, opts)
                    if res.status == "failed" and res.exit_code != 2:
                        summary["bad_exit"].append(
                            f"{src.name} #{i}: exit {res.exit_code}: {res.error}"
                        )
                    summary["refused" if res.status == "failed" else "accepted"] += 1
                    for leftover in out.iterdir():
                        if leftover.name.endswith(".tmp"):
                            summary["left_behind"].append(f"{src.name} #{i}: {leftover.name}")
                        leftover.unlink()
                    continue
                summary["accepted"] += 1
            except CkptError as exc:
                summary["refused"] += 1
                if exc.exit_code != 2:
                    summary["bad_exit"].append(
                        f"{src.name} #{i} {verb}: exit {exc.exit_code}: {exc}"
                    )
            except Exception as exc:  # what the test forbids: an internal error on a bad file
                summary["internal"].append(f"{src.name} #{i} {verb}: {type(exc).__name__}: {exc}")
            finally:
                summary["slowest_s"] = max(summary["slowest_s"], time.monotonic() - start)
        if hashlib.sha256(case.read_bytes()).hexdigest() != digest:
            summary["source_changed"].append(f"{src.name} #{i}")
        case.unlink()
        summary["cases"] += 1
    summary["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return summary


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))))
