"""Upgrade a large checkpoint in object storage: how many bytes go over the wire?

Starts a ``moto_server`` (moto[server]) on a free port, writes a 1.9 checkpoint of
``--tensors`` float32 tensors of 4 MiB each, puts it in a bucket, and upgrades it to 2.10 with
``remote.upgrade.upgrade_object`` (ranged GETs of the metadata, a multipart upload of
server-side part copies). Every request body the client sends is counted on the wire, as are
the bytes it receives. Then the output is downloaded and its tensors compared bit for bit.

    python benchmarks/bench_s3.py --tensors 130      # ~545 MB
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
    args = ap.parse_args()
    import boto3
    import torch

    import ckpt_migrate as cm
    from ckpt_migrate.engine.upgrade import UpgradeOptions
    from ckpt_migrate.remote.s3 import S3Url
    from ckpt_migrate.remote.upgrade import upgrade_object

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
        gen = torch.Generator().manual_seed(0)
        layers = {
            f"layer{i}.weight": torch.randn(1024, 1024, generator=gen) for i in range(args.tensors)
        }
        src = work / "checkpoint_100.mdl"
        cm.save({"model": layers, "global_step": 7}, src, "1.9")
        size = src.stat().st_size
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="bench")
        s3.upload_file(str(src), "bench", "run/checkpoint_100.mdl")
        client = boto3.client("s3")
        sent, received = [], []
        client.meta.events.register(
            "before-send.s3.*", lambda request, **_: sent.append(body_size(request.body))
        )
        client.meta.events.register(
            "after-call.s3.GetObject",
            lambda parsed, **_: received.append(int(parsed.get("ContentLength", 0))),
        )
        start = time.monotonic()
        res = upgrade_object(
            S3Url("bench", "run/checkpoint_100.mdl"),
            S3Url("bench", "run-2.10"),
            UpgradeOptions(target="2.10", inputs={"drop_dataloader_state": True}),
            client,
        )
        seconds = time.monotonic() - start
        if res.status != "upgraded":
            print(res.error, file=sys.stderr)
            return 1
        out = work / "out.mdl"
        s3.download_file("bench", "run-2.10/checkpoint_100.mdl", str(out))
        a, b = cm.load(src)["model"], cm.load(out)["model"]
        identical = all(torch.equal(a[k], b[k]) for k in a)
        t = res.transfer
        rows = [
            ("checkpoint", f"{size / 1e6:.1f} MB ({args.tensors} tensors of 4 MiB)"),
            ("seconds (moto on this machine)", f"{seconds:.1f}"),
            ("request bodies sent (wire)", f"{sum(sent) / 1e6:.2f} MB ({sum(sent) / size:.2%})"),
            ("goal: 5 % + 16 MiB", f"{(0.05 * size + 16 * MiB) / 1e6:.2f} MB"),
            ("uploaded part bytes", f"{t['uploaded'] / 1e6:.2f} MB"),
            ("GET bytes received (wire)", f"{sum(received) / 1e6:.2f} MB"),
            ("  metadata + first-part fill", f"{t['fetched'] / 1e6:.2f} MB"),
            ("  result check", f"{t.get('verify_fetched', 0) / 1e6:.2f} MB"),
            ("server-side part copies", f"{t['copied'] / 1e6:.1f} MB"),
            ("chain objects / final parts", f"{t['chain_objects']} / {t['parts']}"),
            ("local disk allocated (staging)", f"{t['local_allocated'] / 1e6:.1f} MB"),
            ("tensors bit-identical", str(identical)),
        ]
        print("| measure | value |\n|---|---|")
        for k, v in rows:
            print(f"| {k} | {v} |")
        return 0 if identical else 1
    finally:
        moto.kill()
        moto.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
