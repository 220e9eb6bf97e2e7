"""Upgrade a large checkpoint in object storage: how many bytes go over the wire?

Starts a ``moto_server`` (moto[server]) on a free port and upgrades two 1.9 checkpoints to 2.10
with ``remote.upgrade.upgrade_object`` (ranged GETs of the metadata, a multipart upload of
server-side part copies):

* ``uniform``: ``--tensors`` float32 tensors of 4 MiB each;
* ``real``: a training checkpoint laid out as the 1.9 library wrote it (``tests/real_layout.py``:
  bf16 weights stored as int16, fp32 Adam moments and ``step`` scalars, auto-chunked LZ4,
  zero biases and unseen embedding rows), ``--hidden``/``--layers``/``--vocab`` wide.

Every request body the client sends is counted on the wire, as are the bytes it receives.
Then the output is downloaded and compared with the local upgrade's: every tensor bit for bit.

    python benchmarks/bench_s3.py --tensors 32     # 134 MB uniform, 147 MB real layout
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1 << 20
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def body_size(body) -> int:
    if body is None:
        return 0
    if isinstance(body, bytes | bytearray | str):
        return len(body)
    here = body.tell()
    end = body.seek(0, os.SEEK_END)
    body.seek(here)
    return end - here


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=130, help="4 MiB tensors (default 130)")
    ap.add_argument("--hidden", type=int, default=512, help="real layout: hidden size")
    ap.add_argument("--layers", type=int, default=2, help="real layout: decoder layers")
    ap.add_argument("--vocab", type=int, default=8192, help="real layout: vocabulary")
    ap.add_argument("--layout", choices=("both", "uniform", "real"), default="both")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    # moto keeps objects over its buffer size in temporary files and reads a whole object
    # for each part copy: kept in memory, a copy costs a memcpy, not a disk read.
    env = {**os.environ, "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(4 << 30)}
    moto = subprocess.Popen(
        [server, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        columns = {}
        if args.layout in ("both", "uniform"):
            columns["uniform"] = measure(work, uniform(work, args.tensors), "uniform")
        if args.layout in ("both", "real"):
            columns["real layout"] = measure(work, real(work, args), "real")
        names = list(columns)
        print("| measure | " + " | ".join(names) + " |")
        print("|---|" + "---:|" * len(names))
        for key in columns[names[0]]:
            print(f"| {key} | " + " | ".join(columns[n][key] for n in names) + " |")
        return (
            0
            if all(c["output = local upgrade's tensors"] == "True" for c in columns.values())
            else 1
        )
    finally:
        moto.kill()
        moto.wait()
        shutil.rmtree(work, ignore_errors=True)


def uniform(work: Path, tensors: int) -> Path:
    import torch

    import ckpt_migrate as cm

    gen = torch.Generator().manual_seed(0)
    layers = {f"layer{i}.weight": torch.randn(1024, 1024, generator=gen) for i in range(tensors)}
    src = work / "uniform" / "checkpoint_100.mdl"
    src.parent.mkdir()
    cm.save({"model": layers, "global_step": 7}, src, "1.9")
    return src


def real(work: Path, args: argparse.Namespace) -> Path:
    import real_layout

    src = work / "real" / "checkpoint_100.mdl"
    src.parent.mkdir()
    return real_layout.write(src, hidden=args.hidden, layers=args.layers, vocab=args.vocab)


def measure(work: Path, src: Path, label: str) -> dict[str, str]:
    """Upgrade ``src`` through the store and locally; the table's column."""
    import boto3
    import h5py

    import ckpt_migrate as cm
    from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
    from ckpt_migrate.remote.s3 import S3Url
    from ckpt_migrate.remote.upgrade import upgrade_object

    size = src.stat().st_size
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=f"bench-{label}")
    s3.upload_file(str(src), f"bench-{label}", "run/checkpoint_100.mdl")
    client = boto3.client("s3")
    sent, received = [], []
    client.meta.events.register(
        "before-send.s3.*", lambda request, **_: sent.append(body_size(request.body))
    )
    client.meta.events.register(
        "after-call.s3.GetObject",
        lambda parsed, **_: received.append(int(parsed.get("ContentLength", 0))),
    )
    opts = UpgradeOptions(target="2.10", inputs={"drop_dataloader_state": True})
    start = time.monotonic()
    res = upgrade_object(
        S3Url(f"bench-{label}", "run/checkpoint_100.mdl"),
        S3Url(f"bench-{label}", "out"),
        opts,
        client,
    )
    seconds = time.monotonic() - start
    if res.status != "upgraded":
        raise SystemExit(f"{label}: {res.error}")
    out = work / label / "remote.mdl"
    s3.download_file(f"bench-{label}", "out/checkpoint_100.mdl", str(out))
    local = upgrade(
        src,
        UpgradeOptions(
            target="2.10", output_dir=work / label / "local", inputs={"drop_dataloader_state": True}
        ),
    )
    a, b = cm.load(local.output), cm.load(out)
    identical = _equal(a, b)
    with h5py.File(src, "r") as f:
        datasets = len(f)
    t = res.transfer
    return {
        "checkpoint": f"{size / 1e6:.1f} MB, {datasets} datasets",
        "seconds (moto on this machine)": f"{seconds:.1f}",
        "request bodies sent (wire)": f"{sum(sent) / 1e6:.2f} MB ({sum(sent) / size:.2%})",
        "goal: 5 % + 16 MiB": f"{(0.05 * size + 16 * MiB) / 1e6:.2f} MB",
        "uploaded part bytes": f"{t['uploaded'] / 1e6:.2f} MB",
        "  of which tensor data outside the holes": f"{t.get('own_data', 0) / 1e6:.2f} MB",
        "GET bytes received (wire)": f"{sum(received) / 1e6:.2f} MB",
        "  metadata + first-part fill": f"{t['fetched'] / 1e6:.2f} MB",
        "  result check": f"{t.get('verify_fetched', 0) / 1e6:.2f} MB",
        "tensor bytes never fetched": f"{t['unfetched'] / 1e6:.1f} MB",
        "server-side part copies": f"{t['copied'] / 1e6:.1f} MB",
        "chain objects / final parts": f"{t['chain_objects']} / {t['parts']}",
        "local disk allocated (staging)": f"{t['local_allocated'] / 1e6:.1f} MB",
        "output = local upgrade's tensors": str(identical),
    }


def _equal(a, b) -> bool:
    """Two loaded state trees hold the same tensors and values, bit for bit."""
    import torch

    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


if __name__ == "__main__":
    sys.exit(main())
