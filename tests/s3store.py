"""A real S3 endpoint for the object-store tests: a ``moto_server`` subprocess on a free port,
with the AWS environment pointed at it while it runs (shared by a test module)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server() -> Iterator[object]:
    """A boto3 S3 client of a fresh moto server (skips the test when moto is missing)."""
    boto3 = pytest.importorskip("boto3", reason="the s3 extra (boto3) is not installed")
    server = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    if server is None:
        pytest.skip("moto_server (moto[server]) is not installed")
    port = free_port()
    proc = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.skip("moto_server did not start")
                time.sleep(0.2)
        yield boto3.client("s3")
    finally:
        proc.kill()
        proc.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def etags(s3, bucket: str, prefix: str) -> dict[str, str]:
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: o["ETag"] for o in listing.get("Contents", [])}


def put_dir(s3, local: Path, bucket: str, prefix: str = "run") -> dict[str, str]:
    """Every file of ``local`` under ``s3://bucket/prefix/`` (a new bucket); their ETags."""
    s3.create_bucket(Bucket=bucket)
    for p in local.iterdir():
        s3.upload_file(str(p), bucket, f"{prefix}/{p.name}")
    return etags(s3, bucket, f"{prefix}/")
