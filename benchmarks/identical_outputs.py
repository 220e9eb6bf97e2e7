#!/usr/bin/env python
"""Are an upgrade's outputs bit-identical between two versions of ckpt-migrate (issue 33)?

Upgrades (and downgrades) a fixed list of sources in this process, the provenance record's time
frozen, and prints one JSON object: for each job the sha256 of the output file's bytes (the
times HDF5 writes into a new root group's header masked: the two fields that differ from run to
run), or the error. Run it once per version, with
``PYTHONPATH`` naming the tree to test, and compare the two documents:

    git archive BASE | tar -x -C /var/tmp/base
    PYTHONPATH=/var/tmp/base python benchmarks/identical_outputs.py --work /var/tmp/w >before.json
    python benchmarks/identical_outputs.py --work /var/tmp/w >after.json
    cmp before.json after.json

An editable install of the project finds its own tree before ``PYTHONPATH``: run "before" with
an interpreter whose site-packages lack it (and with ``migrations/`` linked into the extracted
``ckpt_migrate/``, where the install maps it).

The jobs: every checkpoint under ``fixtures/`` to 2.10 and down to 2.4 and 1.9 where it is
newer, ``--real DIR`` (the real 2.6–2.9 files, decompressed) the same way, and ``--sweep DIR``
(``bench_tensors``' sources, ``moe-*-small-*.mdl``) to 2.10.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FROZEN = "2026-01-01T00:00:00+00:00"


def sources(real: Path | None, sweep: Path | None) -> list[Path]:
    found = sorted(ROOT.glob("fixtures/**/*.mdl"))
    if real is not None:
        found += sorted(real.glob("*.mdl"))
    if sweep is not None:
        found += sorted(sweep.glob("moe-*-small-*.mdl"))
    return found


def targets(release: str) -> list[str]:
    major, minor = (int(x) for x in release.split("."))
    down = [t for t in ("2.4", "1.9") if (major, minor) > tuple(int(x) for x in t.split("."))]
    return ["2.10", *down]


def sha256(path: Path) -> str:
    """Of the file's bytes, but for the times HDF5 writes into a version-2 object header
    (``create_fresh_root``'s group: the wall clock, in seconds) and that header's checksum."""
    data = bytearray(path.read_bytes())
    at = data.find(b"OHDR\x02")
    while at >= 0:
        flags = data[at + 5]
        if flags & 0x20:  # times stored (HDF5 File Format Specification 3.0, IV.A.1.b)
            field = at + 6 + 16 + (4 if flags & 0x10 else 0)
            width = 1 << (flags & 0x3)
            end = field + width + int.from_bytes(data[field : field + width], "little")
            data[at + 6 : at + 22] = bytes(16)
            data[end : end + 4] = bytes(4)  # its checksum
        at = data.find(b"OHDR\x02", at + 1)
    return hashlib.sha256(data).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="where the outputs go")
    ap.add_argument("--real", type=Path, help="the real 2.6-2.9 files, decompressed")
    ap.add_argument("--sweep", type=Path, help="bench_tensors' generated sources")
    ap.add_argument("--only", help="jobs whose name contains this")
    ap.add_argument("--keep", action="store_true", help="keep the outputs in --work")
    args = ap.parse_args()

    from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
    from ckpt_migrate.format import provenance
    from ckpt_migrate.format.read import read_checkpoint

    record = provenance.record
    provenance.record = lambda *a, **k: {**record(*a, **k), "time": FROZEN}
    print(f"testing {provenance.__file__}", file=sys.stderr)
    doc: dict[str, str] = {}
    for src in sources(args.real, args.sweep):
        try:
            with read_checkpoint(src) as ckpt:
                release = ckpt.release.name if ckpt.release else "2.10"
        except Exception as exc:  # a fixture that is no checkpoint of its own
            doc[str(src.relative_to(ROOT) if src.is_relative_to(ROOT) else src)] = repr(exc)
            continue
        for to in targets(release):
            name = f"{src.parent.name}/{src.name} {release}->{to}"
            if args.only and args.only not in name:
                continue
            out = args.work / f"{len(doc):03d}.mdl"
            out.unlink(missing_ok=True)
            opts = UpgradeOptions(target=to, output=out, inputs={"drop_dataloader_state": True})
            result = upgrade(src, opts)
            doc[name] = (
                sha256(out) if result.status == "upgraded" else f"{result.status}: {result.error}"
            )
            print(name, result.strategy, doc[name][:16], file=sys.stderr)
            if not args.keep:
                out.unlink(missing_ok=True)
    print(json.dumps(doc, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
