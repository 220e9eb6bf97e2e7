#!/usr/bin/env python
"""What HDF5 itself costs per dataset when an upgrade rewrites every one (issue 33, item 2).

A bare loop of exactly the HDF5 calls the rewrite makes for one small tensor, through h5py's
low-level API with everything reusable made once (types, dataspaces, creation properties,
attribute values), in a file created as the upgrade creates its output (``h5root.create_file``):

* ``create``: ``h5d.create`` of an 8x8 float32 dataset, LZ4-chunked;
* ``+chunk``: and one stored chunk (270 bytes) written with ``write_direct_chunk``;
* ``+attrs``: and the seven attributes format 0.5 gives a tensor's dataset (``h5attrs``);
* ``verify``: reopening each by name, its creation properties and its chunk index (what the
  verification's stored comparison asks HDF5 for, per dataset and file).

Nothing else runs per dataset: no checkpoint, no tree, no JSON. The figures are a floor for
the upgrade's per-tensor cost through h5py: below it only fewer HDF5 calls (fewer attributes,
no reopening) would go.

    python benchmarks/bench_h5_floor.py --count 12000 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from ckpt_migrate.format.h5 import attrs as h5attrs
from ckpt_migrate.format.h5 import root as h5root
from ckpt_migrate.format.h5.tensor import _lz4, _space
from ckpt_migrate.format.v05.write import _tensor_kind

CHUNK = os.urandom(270)


def write(path: Path, names: list[bytes], chunk: bool, attrs: bool) -> None:
    _, _, prepared = _tensor_kind("float32", (8, 8), False)
    tid, space, dcpl = h5attrs.hdf5_type(np.dtype("<f4")), _space((8, 8)), _lz4((8, 8))
    with h5root.create_file(path, exclusive=False, attributes=len(names) + 8) as f:
        root = h5root.create_fresh_root(f, len(names) + 8)
        for name in names:
            dsid = h5py.h5d.create(root.id, name, tid, space, dcpl=dcpl)
            if chunk:
                dsid.write_direct_chunk((0, 0), CHUNK, 0)
            if attrs:
                for attr in prepared:
                    h5attrs.create_prepared(dsid, attr)


def reopen(path: Path, names: list[bytes]) -> None:
    with h5py.File(path, "r", locking=False) as f:
        group = f[h5root.FRESH_ROOT].id
        for name in names:
            dsid = h5py.h5d.open(group, name)
            dsid.get_create_plist().get_layout()
            dsid.chunk_iter(lambda c: None)


def timed(fn, *args) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=12000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    args = ap.parse_args()
    n = args.count
    names = [
        f"model.layers.{i // 192}.experts.{i % 64}.w{i % 3}.weight{i}".encode() for i in range(n)
    ]
    path = args.workdir / "h5-floor.h5"
    cases = {
        "create": (write, False, False),
        "+chunk": (write, True, False),
        "+attrs": (write, True, True),
    }
    print(f"| HDF5 calls per dataset | µs wall (CPU), median of {args.repeat}, {n:,} datasets |")
    print("|---|---|")
    for label, (fn, chunk, attrs) in cases.items():
        runs = []
        for _ in range(args.repeat):
            path.unlink(missing_ok=True)
            runs.append(timed(fn, path, names, chunk, attrs))
        wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        print(f"| {label} | {wall / n * 1e6:.1f} ({cpu / n * 1e6:.1f}) |")
    runs = [timed(reopen, path, names) for _ in range(args.repeat)]
    wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
    print(f"| verify: open, properties, chunk index | {wall / n * 1e6:.1f} ({cpu / n * 1e6:.1f}) |")
    path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
