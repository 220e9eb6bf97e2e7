#!/usr/bin/env python
"""The tensor-count sweep (issue 33): how the commands' cost grows with the number of tensors.

For each tensor count (``--counts``), tensor size (``--sizes``: ``small`` 8x8 float32, 256 bytes;
``realistic`` 128x256 float32, 128 KiB) and source release (``--releases``), a mixture-of-experts
training checkpoint (``moe_checkpoint``) is generated once into ``--sources`` and copied to
``--workdir`` (the filesystem under test: ext4, or an XFS with ``reflink=1`` on a loop device,
``--fs xfs`` makes one). Then, interleaved, ``--repeat`` times each, every command in its own
process under GNU ``/usr/bin/time`` (wall, CPU of the process and its children, peak RSS):

* ``cp --reflink=never SRC DST && sync DST`` and, where the filesystem shares extents,
  ``cp --reflink=always SRC DST``: the yardsticks, in the same run;
* ``ckpt-migrate upgrade SRC -o OUT --json`` to 2.10 (its JSON says the strategy and the copy
  method), ``verify SRC OUT`` right after it, the upgrade again with ``--verify full`` and
  with ``--manifest``, and ``upgrade --dry-run``;
* ``ckpt-migrate inspect``, ``plan --to 2.10``, ``check``.

Medians are reported, with the per-tensor cost of the upgrade and its ratio to the yardsticks.
The machine's load (``/proc/loadavg``) is recorded before and after: other work makes wall time
noisy, CPU time less so.

    python benchmarks/bench_tensors.py --counts 1k,12k --releases 2.5,2.4 --sizes small
    python benchmarks/bench_tensors.py --fs xfs --counts 12k,150k --releases 2.5 --json
    python benchmarks/bench_tensors.py --read-side --against /var/tmp/base --counts 150k

``--read-side`` runs only the commands that write nothing (``inspect``, ``plan``, the dry run,
``check``), and ``--against TREE`` each of them on another tree of the project too (by
``PYTHONPATH``, interleaved with this one's runs: a before and after on the same machine load).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import bench_upgrade  # noqa: E402
from moe_checkpoint import MoEShape, generate  # noqa: E402

CLI = str(Path(sys.executable).with_name("ckpt-migrate"))
SIZES = {"small": (8, 8), "realistic": (128, 256)}
TARGET = "2.10"


def parse_count(text: str) -> int:
    text = text.strip().lower()
    return int(float(text[:-1]) * 1000) if text.endswith("k") else int(text)


def source(sources: Path, count: int, size: str, release: str) -> tuple[Path, MoEShape]:
    """The generated checkpoint (made once, kept in ``sources``)."""
    shape = MoEShape.for_tensors(count, *SIZES[size])
    path = sources / f"moe-{count}-{size}-{release}.mdl"
    if not path.exists():
        generate(path, shape, release)
    return path, shape


def commands(src: Path, work: Path, reflink: bool, release: str) -> dict[str, list[str]]:
    out, dst = work / "out", work / "copy.mdl"
    sh = ["sh", "-c"]
    # A 1.8/1.9 checkpoint has no dataloader side files here: say so, or the upgrade refuses.
    drop = list(bench_upgrade.DROP) if release in ("1.8", "1.9") else []
    up = [CLI, "upgrade", str(src), "--to", TARGET, *drop]
    cmds = {
        "cp + sync": [*sh, f'cp --reflink=never "{src}" "{dst}" && sync "{dst}"'],
        "upgrade": [*up, "-o", str(out), "--json"],
        # the source against the upgrade's output, leaf by leaf (run right after the upgrade)
        "verify": [CLI, "verify", str(src), str(out / src.name), "--json", "-q"],
        # the upgrade again, its output's every reused tensor compared as stored with the source
        "verify full": [*up, "--verify", "full", "-o", str(out), "--json"],
        # and with a manifest: every source tensor decoded and hashed besides
        "manifest": [*up, "--manifest", str(work / "manifest.json"), "-o", str(out), "--json"],
        "dry-run": [*up, "--dry-run", "--json"],
        "inspect": [CLI, "inspect", str(src), "--json"],
        "plan": [CLI, "plan", str(src), "--to", TARGET, "--json"],
        "check": [CLI, "check", str(src), "--to", TARGET],
    }
    if reflink:
        cmds["cp --reflink"] = [*sh, f'cp --reflink=always "{src}" "{dst}"']
    return cmds


READ_SIDE = ("inspect", "plan", "dry-run", "check")  # (issue 33, item 4: at most 1 s each)


def read_side(src: Path, work: Path, release: str, against: Path | None) -> dict[str, list[str]]:
    """The commands that write nothing, and with ``against`` each also run on that tree of
    the project (``PYTHONPATH``), named ``<command> before``, interleaved with the current."""
    cmds = {k: v for k, v in commands(src, work, False, release).items() if k in READ_SIDE}
    if against is not None:
        for name in READ_SIDE:
            cmds[f"{name} before"] = ["env", f"PYTHONPATH={against}", *cmds[name]]
    return cmds


def read_side_case(
    src: Path, shape: MoEShape, work: Path, repeat: int, release: str, against: Path | None
) -> dict[str, Any]:
    runs: dict[str, list[bench_upgrade.Measured]] = {}
    for _ in range(repeat):
        for name, argv in read_side(src, work, release, against).items():
            m = bench_upgrade.run_measured(argv, work)
            if m.returncode not in (0, 10):  # check: 10 = an upgrade is needed
                why = (m.stderr or m.stdout)[-2000:]
                raise SystemExit(f"{name} failed ({m.returncode}): {why}")
            runs.setdefault(name, []).append(m)
    row: dict[str, Any] = {"tensors": shape.tensors, "file_bytes": src.stat().st_size}
    for name, ms in runs.items():
        row[name] = {
            "seconds": statistics.median(m.seconds for m in ms),
            "cpu_seconds": statistics.median(m.cpu_seconds for m in ms),
            "rss_mib": max(m.maxrss_mib for m in ms),
        }
    return row


def print_read_side(rows: list[dict[str, Any]], file: Any = sys.stdout) -> None:
    """Seconds (CPU seconds, peak RSS MiB) of each command; ``before → now`` when measured
    against another tree."""

    def figures(m: dict[str, float]) -> str:
        return f"{m['seconds']:.2f} ({m['cpu_seconds']:.2f}, {m['rss_mib']:.0f})"

    def cell(r: dict[str, Any], name: str) -> str:
        before = r.get(f"{name} before")
        now = figures(r[name])
        return now if before is None else f"{figures(before)} → {now}"

    print("| release | tensors | size | " + " | ".join(READ_SIDE) + " |", file=file)
    print("|" + "---|" * (3 + len(READ_SIDE)), file=file)
    for r in rows:
        cells = " | ".join(cell(r, name) for name in READ_SIDE)
        print(f"| {r['release']} | {r['tensors']:,} | {r['size']} | {cells} |", file=file)


def can_reflink(work: Path) -> bool:
    a, b = work / ".probe-a", work / ".probe-b"
    a.write_bytes(b"x" * 4096)
    try:
        return os.system(f'cp --reflink=always "{a}" "{b}" 2>/dev/null') == 0
    finally:
        for p in (a, b):
            p.unlink(missing_ok=True)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def one_case(src: Path, shape: MoEShape, work: Path, repeat: int, release: str) -> dict[str, Any]:
    reflink = can_reflink(work)
    runs: dict[str, list[bench_upgrade.Measured]] = {}
    extra: dict[str, Any] = {}
    for _ in range(repeat):
        for name, argv in commands(src, work, reflink, release).items():
            if name != "verify":
                shutil.rmtree(work / "out", ignore_errors=True)
            (work / "copy.mdl").unlink(missing_ok=True)
            (work / "manifest.json").unlink(missing_ok=True)
            os.sync()
            m = bench_upgrade.run_measured(argv, work)
            # verify: 4 = differences (the upgrade's own __metadata__ entries, recorded in the
            # row); check: 10 = an upgrade is needed
            if m.returncode not in ((0, 4) if name == "verify" else (0, 10)):
                why = (m.stderr or m.stdout)[-2000:]
                raise SystemExit(f"{name} failed ({m.returncode}): {why}")
            if name == "verify":
                said = json.loads(m.stdout)
                extra["verify_differences"] = sorted(d["name"] for d in said["differences"])
            if name == "upgrade":
                done = json.loads(m.stdout.splitlines()[0])
                extra |= {k: done.get(k) for k in ("strategy", "copy_method", "bytes_written")}
            runs.setdefault(name, []).append(m)
    row: dict[str, Any] = {"tensors": shape.tensors, "file_bytes": src.stat().st_size, **extra}
    for name, ms in runs.items():
        row[name] = {
            "seconds": statistics.median(m.seconds for m in ms),
            "cpu_seconds": statistics.median(m.cpu_seconds for m in ms),
            "rss_mib": max(m.maxrss_mib for m in ms),
        }
    up = row["upgrade"]["seconds"]
    row["upgrade_us_per_tensor"] = round(up / shape.tensors * 1e6, 1)
    row["x_cp_sync"] = round(up / row["cp + sync"]["seconds"], 2)
    if reflink:
        row["x_cp_reflink"] = round(up / max(row["cp --reflink"]["seconds"], 1e-3), 2)
    return row


def print_table(rows: list[dict[str, Any]], file: Any = sys.stdout) -> None:
    print(
        "| release | tensors | size | strategy (method) | upgrade s (cpu) | µs/tensor | "
        "× cp+sync | × reflink | upgrade RSS MiB | verify s (MiB) | --verify full s (MiB) | "
        "--manifest s (MiB) | dry-run s | inspect s | plan s | check s |",
        file=file,
    )
    print("|" + "---|" * 16, file=file)
    for r in rows:
        s = {k: f"{v['seconds']:.2f}" for k, v in r.items() if isinstance(v, dict)}
        print(
            f"| {r['release']} | {r['tensors']:,} | {r['size']} | "
            f"{r.get('strategy')} ({r.get('copy_method')}) | "
            f"{r['upgrade']['seconds']:.2f} ({r['upgrade']['cpu_seconds']:.2f}) | "
            f"{r['upgrade_us_per_tensor']} | {r['x_cp_sync']} | {r.get('x_cp_reflink', '—')} | "
            f"{r['upgrade']['rss_mib']:.0f} | "
            f"{s['verify']} ({r['verify']['rss_mib']:.0f}) | "
            f"{s['verify full']} ({r['verify full']['rss_mib']:.0f}) | "
            f"{s['manifest']} ({r['manifest']['rss_mib']:.0f}) | "
            f"{s['dry-run']} | {s['inspect']} | {s['plan']} | {s['check']} |",
            file=file,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1k,12k,50k,150k")
    ap.add_argument("--sizes", default="small,realistic")
    ap.add_argument("--releases", default="1.9,2.0,2.4,2.5")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sources", type=Path, default=Path(tempfile.gettempdir()) / "moe-sources")
    ap.add_argument("--workdir", type=Path, default=None, help="the filesystem under test")
    ap.add_argument("--fs", choices=["here", "xfs"], default="here")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--read-side",
        action="store_true",
        help="only the commands that write nothing: " + ", ".join(READ_SIDE),
    )
    ap.add_argument(
        "--against",
        type=Path,
        default=None,
        help="with --read-side: also run each command on this tree of the project, interleaved",
    )
    args = ap.parse_args(argv)
    bench_upgrade.warm_bytecode()
    show = print_read_side if args.read_side else print_table
    args.sources.mkdir(parents=True, exist_ok=True)
    rows = []
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if args.fs == "xfs":
            from loopfs import mounted

            base = stack.enter_context(mounted("xfs", 64 << 30, args.workdir))
        else:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.workdir)))
        for count in map(parse_count, args.counts.split(",")):
            for size in args.sizes.split(","):
                for release in args.releases.split(","):
                    src, shape = source(args.sources, count, size, release)
                    work = base / "case"
                    shutil.rmtree(work, ignore_errors=True)
                    work.mkdir()
                    local = work / src.name
                    shutil.copyfile(src, local)
                    before = loadavg()
                    if args.read_side:
                        row = read_side_case(local, shape, work, args.repeat, release, args.against)
                    else:
                        row = one_case(local, shape, work, args.repeat, release)
                    row.update(release=release, size=size, load=[before, loadavg()])
                    rows.append(row)
                    show([row], sys.stderr)
                    shutil.rmtree(work)
    if args.json:
        print(json.dumps(rows, indent=1))
    show(rows, sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
