#!/usr/bin/env python
"""Peak memory and time of ``tensorflow-to-h5`` and ``h5-to-tensorflow`` on a large checkpoint.

Generates a synthetic TensorFlow checkpoint of ``--size`` bytes (``tf.train.Checkpoint``-style
names: per layer a bf16 kernel with fp32 Adam ``m``/``v`` slots, one large fp32 embedding of
``--largest-var`` bytes, ``step`` and ``save_counter``), written with ``SaveV2`` in parts and
merged, so generation itself holds at most one part in memory. Then, each in its own process:

1. ``tensorflow-to-h5 SRC out.h5``: reads one variable at a time, so its bound is the largest
   variable;
2. ``h5-to-tensorflow out.h5 back --max-shard-size M``: its bound is ``M`` (larger variables are
   sliced);
3. a check, in a separate process, that ``back`` holds exactly the names, dtypes and bytes of
   ``SRC`` (sha256 per variable).

Peak RSS is each child's ``ru_maxrss`` (``os.wait4``). TensorFlow alone costs a few hundred MB, so
the same two commands are first run on a one-variable checkpoint: that is the baseline, and each
command is judged by its growth above it. See benchmarks/README.md.

    python benchmarks/bench_tf.py --size 2GB --max-shard-size 256MB
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
TF_TO_H5 = BIN / "tensorflow-to-h5"
H5_TO_TF = BIN / "h5-to-tensorflow"
PART_BYTES = 256 << 20  # generation writes SaveV2 parts of at most this much


def parse_size(text: str) -> int:
    from ckpt_migrate.tf.saver import parse_size as parse

    return parse(text)


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


def mib(n: float) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def run_measured(cmd: list[str], log: Path) -> dict:
    """Run ``cmd`` as a child; its wall time and peak RSS (bytes). Fails loudly on error."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log.read_text()[-2000:]}")
    return {"seconds": seconds, "peak_rss": usage.ru_maxrss * 1024, "cmd": cmd}


# --------------------------------------------------------------------------- child work


def layout(size: int, largest: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype, shape) of the synthetic checkpoint: ~``size`` bytes in total."""
    hidden = 1024
    entries = [
        ("model/embedding/.ATTRIBUTES/VARIABLE_VALUE", "float32", (largest // (4 * hidden), hidden))
    ]
    per_layer = hidden * 4 * hidden * (2 + 4 + 4)  # bf16 kernel + fp32 m and v
    layers = max(1, (size - largest) // per_layer)
    for i in range(layers):
        base = f"model/layer_with_weights-{i}/kernel"
        entries.append((f"{base}/.ATTRIBUTES/VARIABLE_VALUE", "bfloat16", (hidden, 4 * hidden)))
        for slot in ("m", "v"):
            name = f"{base}/.OPTIMIZER_SLOT/optimizer/{slot}/.ATTRIBUTES/VARIABLE_VALUE"
            entries.append((name, "float32", (hidden, 4 * hidden)))
    entries += [
        ("step/.ATTRIBUTES/VARIABLE_VALUE", "int64", ()),
        ("save_counter/.ATTRIBUTES/VARIABLE_VALUE", "int64", ()),
    ]
    return entries


def generate(prefix: str, size: int, largest: int) -> None:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    tmp = Path(prefix + ".parts")
    tmp.mkdir()
    parts: list[str] = []
    batch: list[tuple[str, object]] = []
    batch_bytes = 0

    def flush() -> None:
        nonlocal batch, batch_bytes
        part = str(tmp / f"part-{len(parts):05d}")
        tf.raw_ops.SaveV2(
            prefix=part,
            tensor_names=[n for n, _ in batch],
            shape_and_slices=[""] * len(batch),
            tensors=[t for _, t in batch],
        )
        parts.append(part)
        batch, batch_bytes = [], 0

    for name, dtype, shape in layout(size, largest):
        if not shape:
            value = tf.constant(1000 if name.startswith("step") else 1, dtype=tf.int64)
        else:
            array = rng.standard_normal(shape, dtype=np.float32)
            value = tf.constant(array, dtype=tf.as_dtype(dtype))
            del array
        nbytes = value.dtype.size * int(np.prod(value.shape))
        if batch and batch_bytes + nbytes > PART_BYTES:
            flush()
        batch.append((name, value))
        batch_bytes += nbytes
    flush()
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts, destination_prefix=prefix)
    shutil.rmtree(tmp, ignore_errors=True)


def digest(prefix: str) -> None:
    """name -> (dtype, shape, sha256) of every variable, one at a time, as JSON on stdout."""
    import hashlib

    import numpy as np
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    out = {}
    for name, dtype in sorted(reader.get_variable_to_dtype_map().items()):
        value = np.asarray(reader.get_tensor(name))
        out[name] = [dtype.name, list(value.shape), hashlib.sha256(value.tobytes()).hexdigest()]
        del value
    print(json.dumps(out))


def tiny(prefix: str) -> None:
    import numpy as np
    import tensorflow as tf

    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=["w"],
        shape_and_slices=[""],
        tensors=[tf.constant(np.ones(4, np.float32))],
    )


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="2GB", help="checkpoint size (default 2GB)")
    ap.add_argument("--max-shard-size", default="256MB", help="h5-to-tensorflow's bound")
    ap.add_argument(
        "--largest-var", default="512MB", help="size of the largest variable (an embedding)"
    )
    ap.add_argument("--verify", default="structure", choices=("structure", "full"))
    ap.add_argument("--workdir", default=None, help="where the files go (a fresh subdirectory)")
    ap.add_argument("--json", action="store_true", help="results as JSON on stdout")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        what, *rest = args.child
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
        if what == "generate":
            generate(rest[0], int(rest[1]), int(rest[2]))
        elif what == "digest":
            digest(rest[0])
        elif what == "tiny":
            tiny(rest[0])
        return

    size, shard, largest = (
        parse_size(args.size),
        parse_size(args.max_shard_size),
        parse_size(args.largest_var),
    )
    for tool in (TF_TO_H5, H5_TO_TF):
        if not tool.exists():
            sys.exit(f"{tool} not found: install ckpt-migrate[tensorflow] in this interpreter")
    work = Path(tempfile.mkdtemp(prefix="bench-tf-", dir=args.workdir))
    free = shutil.disk_usage(work).free
    if free < 3.2 * size:
        shutil.rmtree(work)
        sys.exit(f"needs about {human(3.2 * size)} free in {work.parent}, {human(free)} available")
    me = [sys.executable, str(Path(__file__).resolve()), "--child"]
    verify = ["--verify", args.verify]
    try:
        log = work / "log.txt"
        # baseline: the same commands on a one-variable checkpoint
        run_measured([*me, "tiny", str(work / "tiny")], log)
        base_in = run_measured([str(TF_TO_H5), str(work / "tiny"), str(work / "tiny.h5")], log)
        base_out = run_measured([str(H5_TO_TF), str(work / "tiny.h5"), str(work / "tiny2")], log)
        imports = run_measured(
            [
                sys.executable,
                "-c",
                "import tensorflow, ckpt_migrate.tf.to_h5, ckpt_migrate.tf.from_h5",
            ],
            log,
        )

        src = str(work / "src" / "ckpt-1000")
        Path(src).parent.mkdir()
        gen = run_measured([*me, "generate", src, str(size), str(largest)], log)
        src_bytes = sum(p.stat().st_size for p in Path(src).parent.glob("ckpt-1000.*"))
        n_vars = len(layout(size, largest))

        to_h5 = run_measured([str(TF_TO_H5), src, str(work / "out.h5"), *verify], log)
        h5_bytes = (work / "out.h5").stat().st_size
        (work / "back").mkdir()
        back = str(work / "back" / "ckpt-1000")
        to_tf = run_measured(
            [str(H5_TO_TF), str(work / "out.h5"), back, "--max-shard-size", str(shard), *verify],
            log,
        )
        data_files = len(list(Path(back).parent.glob("ckpt-1000.data-*")))

        digests = []
        for prefix in (src, back):
            with open(work / "digest.json", "w") as fh:
                subprocess.run([*me, "digest", prefix], stdout=fh, check=True)
            digests.append(json.loads((work / "digest.json").read_text()))
        identical = digests[0] == digests[1]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    grow_in = to_h5["peak_rss"] - base_in["peak_rss"]
    grow_out = to_tf["peak_rss"] - base_out["peak_rss"]
    result = {
        "machine": f"{platform.node()} {os.cpu_count()} cores, python {platform.python_version()}",
        "checkpoint_bytes": src_bytes,
        "variables": n_vars,
        "largest_variable_bytes": largest,
        "max_shard_size": shard,
        "h5_bytes": h5_bytes,
        "tf_data_files_written": data_files,
        "verify": args.verify,
        "generate_seconds": gen["seconds"],
        "import_only_rss": imports["peak_rss"],
        "baseline_tensorflow_to_h5_rss": base_in["peak_rss"],
        "baseline_h5_to_tensorflow_rss": base_out["peak_rss"],
        "tensorflow_to_h5": {
            "seconds": to_h5["seconds"],
            "peak_rss": to_h5["peak_rss"],
            "growth": grow_in,
        },
        "h5_to_tensorflow": {
            "seconds": to_tf["seconds"],
            "peak_rss": to_tf["peak_rss"],
            "growth": grow_out,
        },
        "round_trip_identical": identical,
    }
    lines = [
        f"checkpoint: {human(src_bytes)} in {n_vars} variables (largest {human(largest)}); "
        f"H5 {human(h5_bytes)}; --max-shard-size {human(shard)} -> {data_files} data files",
        f"import tensorflow + ckpt_migrate: peak RSS {mib(imports['peak_rss'])}",
        "| command | time | peak RSS | baseline (1 variable) | growth | bound |",
        "|---|---|---|---|---|---|",
        f"| tensorflow-to-h5 | {to_h5['seconds']:.1f} s | {mib(to_h5['peak_rss'])} | "
        f"{mib(base_in['peak_rss'])} | {mib(grow_in)} | largest variable {mib(largest)} |",
        f"| h5-to-tensorflow | {to_tf['seconds']:.1f} s | {mib(to_tf['peak_rss'])} | "
        f"{mib(base_out['peak_rss'])} | {mib(grow_out)} | --max-shard-size {mib(shard)} |",
        f"round trip TF -> H5 -> TF identical (sha256 of every variable): {identical}",
    ]
    if args.json:
        print(json.dumps(result, indent=2))
        print("\n".join(lines), file=sys.stderr)
    else:
        print("\n".join(lines))
    if not identical:
        sys.exit(1)


if __name__ == "__main__":
    main()
