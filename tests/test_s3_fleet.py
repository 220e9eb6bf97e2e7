"""Object storage and Dask fleets against the real things: a ``moto_server`` subprocess (the S3
API over HTTP) and a ``distributed.LocalCluster`` of worker processes.

A run prefix holds a 1.9 checkpoint laid out as the 1.9 library wrote it (``real_layout``), a
2.0 one of MiB-sized float32 tensors, the 2.10 fixture and a
``params.yaml``; upgrades go to another prefix. Checked: the bytes sent to the store, tensors
bit-identical after download, sources unchanged, reruns skipping, a killed run leaving no
object and its upload aborted by the next run, a worker killed mid-run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, one_line_error, release_of, run_cli
from s3store import etags, moto_server, put_dir

import ckpt_migrate as cm
from ckpt_migrate.cli import upgrades
from ckpt_migrate.cli.commands import verify
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.remote.s3 import S3Url
from ckpt_migrate.remote.upgrade import CHAIN_SUFFIX, upgrade_object

boto3 = pytest.importorskip("boto3", reason="the s3 extra (boto3) is not installed")
MiB = 1 << 20
SOURCES = ("checkpoint_100.mdl", "checkpoint_200.mdl")
DROP = {"drop_dataloader_state": True}


@pytest.fixture(scope="module")
def store():
    """A moto S3 server on a free port; the AWS environment pointed at it."""
    with moto_server() as s3:
        yield s3


def state(tensors: int, seed: int) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    layers = {f"layer{i}.weight": torch.randn(512, 1024, generator=gen) for i in range(tensors)}
    return {"model": layers, "global_step": 7}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, real_layout_19) -> Path:
    """A 1.9 checkpoint as the 1.9 library laid it out, a 2.0 one of uniform float32 tensors,
    the 2.10 fixture and a config."""
    md = tmp_path_factory.mktemp("run") / "run"
    md.mkdir()
    shutil.copyfile(real_layout_19, md / SOURCES[0])
    cm.save(state(4, 1), md / SOURCES[1], "2.0")
    shutil.copyfile(FIXTURES / "release-2.10.mdl", md / "checkpoint_300.mdl")
    (md / "params.yaml").write_text("trainer:\n  init:\n    seed: 1\n")
    return md


def put_run(s3, local: Path, bucket: str) -> dict[str, str]:
    """The run under s3://bucket/run; returns each object's ETag."""
    return put_dir(s3, local, bucket)


def assert_outputs(s3, bucket: str, local: Path, tmp: Path) -> None:
    """Every output is at 2.10 and loads with the source's tensors, bit for bit."""
    import torch

    for name in SOURCES:
        got = tmp / name
        got.unlink(missing_ok=True)
        s3.download_file(bucket, f"run-2.10/{name}", str(got))
        a, b = cm.load(local / name), cm.load(got)
        assert a["model"].keys() == b["model"].keys()
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
        if "optimizer" in a:  # the real layout's Adam state, bit for bit
            for i, st in a["optimizer"]["state"].items():
                assert all(torch.equal(v, b["optimizer"]["state"][i][k]) for k, v in st.items())
        assert release_of(got) == "2.10"
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert not [k for k in etags(s3, bucket, "run-2.10/") if CHAIN_SUFFIX.strip("/") in k]


def test_upgrade_dir_on_s3(store, local_run, tmp_path):
    s3, bucket = store, "cli-run"
    before = put_run(s3, local_run, bucket)
    args = ["upgrade-dir", f"s3://{bucket}/run", "--to", "2.10", "--drop-dataloader-state"]
    proc = run_cli(*args, "--output-dir", f"s3://{bucket}/run-2.10", "--json")
    assert proc.returncode == 0, proc.stderr
    got = {Path(e["source"]).name: e for e in map(json.loads, proc.stdout.splitlines())}
    assert got["checkpoint_100.mdl"]["status"] == "upgraded"
    assert got["checkpoint_200.mdl"]["status"] == "upgraded"
    assert got["checkpoint_300.mdl"]["status"] == "current"
    assert got["params.yaml"]["status"] == "copied"
    for name in SOURCES:
        t = got[name]["transfer"]
        # The goal: at most 5 % of the checkpoint + 16 MiB sent to the store.
        assert t["uploaded"] <= 0.05 * t["size"] + 16 * MiB, t
        assert t["copied"] > 0
    assert etags(s3, bucket, "run/") == before  # sources never written
    assert_outputs(s3, bucket, local_run, tmp_path)
    again = run_cli(*args, "--output-dir", f"s3://{bucket}/run-2.10", "--json")
    assert again.returncode == 0, again.stderr
    statuses = {
        Path(e["source"]).name: e["status"] for e in map(json.loads, again.stdout.splitlines())
    }
    assert statuses["checkpoint_100.mdl"] == statuses["checkpoint_200.mdl"] == "already-upgraded"
    assert statuses["params.yaml"] == "left-alone"


def test_dry_run_fails_where_the_run_would_on_another_object_at_the_output(store):
    """Another object at the output key: the real run refuses it (exit 2), and so must its dry
    run; it printed "planned" and exited 0."""
    s3, bucket = store, "dry-other"
    s3.create_bucket(Bucket=bucket)
    s3.upload_file(str(FIXTURES / "release-2.3.mdl"), bucket, "run/checkpoint_200.mdl")
    s3.put_object(Bucket=bucket, Key="out/checkpoint_200.mdl", Body=b"somebody else's file")
    args = ["upgrade-dir", f"s3://{bucket}/run", "--output-dir", f"s3://{bucket}/out", "-q"]
    for extra in (["--dry-run"], []):
        proc = run_cli(*args, *extra)
        assert proc.returncode == 2, (extra, proc.stdout + proc.stderr)
        assert "out/checkpoint_200.mdl: already exists" in proc.stderr, proc.stderr
        assert "planned" not in proc.stdout
    body = s3.get_object(Bucket=bucket, Key="out/checkpoint_200.mdl")["Body"].read()
    assert body == b"somebody else's file"


def test_a_side_file_the_output_prefix_holds_another_of_is_refused(store, local_run):
    """Another ``params.yaml`` at the output prefix: refused with exit 2 and one line naming it,
    as a local run refuses another config at its output (it was "left alone", exit 0); a side
    file whose copy fails (the output bucket is missing) is an I/O error (exit 5)."""
    s3, bucket = store, "side-other"
    s3.create_bucket(Bucket=bucket)
    s3.upload_file(str(local_run / "params.yaml"), bucket, "run/params.yaml")
    s3.put_object(Bucket=bucket, Key="out/params.yaml", Body=b"model: {name: other}\n")
    for extra in (["--dry-run"], []):
        proc = run_cli("upgrade-dir", f"s3://{bucket}/run", "-o", f"s3://{bucket}/out", *extra)
        assert proc.returncode == 2, (extra, proc.stdout + proc.stderr)
        want = f"error: s3://{bucket}/out/params.yaml: already exists and differs from "
        assert want in proc.stderr and "remove it or choose another --output-dir" in proc.stderr
        assert "left alone" not in proc.stdout
    body = s3.get_object(Bucket=bucket, Key="out/params.yaml")["Body"].read()
    assert body == b"model: {name: other}\n"
    args = ["upgrade-dir", f"s3://{bucket}/run", "-o", "s3://no-such-bucket/out", "--json"]
    proc = run_cli(*args)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    (entry,) = map(json.loads, proc.stdout.splitlines())
    assert entry["kind"] == "other" and entry["status"] == "failed", entry
    assert entry["error"].startswith("s3://no-such-bucket/out/params.yaml: object storage"), entry


def test_a_current_checkpoint_copied_into_the_output_prefix_says_so(store):
    """A checkpoint already at the target is copied into the output prefix: the line said "left
    alone"; it now says where it went, as a local run says "linked into D"."""
    s3, bucket = store, "current-copied"
    s3.create_bucket(Bucket=bucket)
    s3.upload_file(str(FIXTURES / "release-2.10.mdl"), bucket, "run/checkpoint_300.mdl")
    out = f"s3://{bucket}/out"
    proc = run_cli("upgrade-dir", f"s3://{bucket}/run", "--to", "2.10", "-o", out, "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = f"s3://{bucket}/run/checkpoint_300.mdl: already at 2.10; copied into {out}\n"
    assert proc.stdout.startswith(want), proc.stdout
    assert "out/checkpoint_300.mdl" in etags(s3, bucket, "out/")
    args = ["upgrade", f"s3://{bucket}/run/checkpoint_300.mdl", "--to", "2.10"]
    proc = run_cli(*args, "-o", f"s3://{bucket}/out2", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.endswith(f"already at 2.10; copied into s3://{bucket}/out2\n"), proc.stdout
    proc = run_cli(*args, "-o", f"s3://{bucket}/out3", "--json")
    assert json.loads(proc.stdout)["placed"] == "copied", proc.stdout


def test_a_missing_object_is_one_line_with_a_fix(store):
    s3, bucket = store, "missing-key"
    s3.create_bucket(Bucket=bucket)
    args = ["upgrade", f"s3://{bucket}/run/checkpoint_999.mdl", "-o", f"s3://{bucket}/out"]
    line = one_line_error(run_cli(*args), 2, f"s3://{bucket}/run/checkpoint_999.mdl: no such")
    assert f"aws s3 ls s3://{bucket}/run/" in line, line


def body_size(body) -> int:
    if body is None:
        return 0
    if isinstance(body, bytes | bytearray | str):
        return len(body)
    here = body.tell()
    end = body.seek(0, os.SEEK_END)
    body.seek(here)
    return end - here


@pytest.mark.parametrize("name", SOURCES)
def test_bytes_the_server_receives(store, local_run, name):
    """Counted on the wire (every request body the client sends): metadata-sized."""
    s3, bucket = store, f"wire-{name[11:14]}"
    s3.create_bucket(Bucket=bucket)
    s3.upload_file(str(local_run / name), bucket, f"run/{name}")
    client = boto3.client("s3")
    sent = []
    client.meta.events.register(
        "before-send.s3.*", lambda request, **_: sent.append(body_size(request.body))
    )
    res = upgrade_object(
        S3Url(bucket, f"run/{name}"),
        S3Url(bucket, "run-2.10"),
        UpgradeOptions(target="2.10", inputs=dict(DROP)),
        client,
    )
    assert res.status == "upgraded", res.error
    size = (local_run / name).stat().st_size
    assert sum(sent) <= 0.05 * size + 16 * MiB
    assert sum(sent) >= res.transfer["uploaded"]
    assert res.transfer["unfetched"] >= 0.8 * size  # the tensor data stayed in the store
    if name == SOURCES[1]:  # MiB-sized datasets: HDF5's metadata reads (64 KiB blocks) are few
        assert res.transfer["fetched"] < size
    # nor written to the local disk: the mirror and the staging file keep them as holes (the
    # two files holding them would take twice their bytes; the staging file's reservation for
    # the metadata edit counts here)
    assert res.transfer["local_allocated"] < 2 * res.transfer["unfetched"]


# S3 keys are any UTF-8 and may hold what a URL or a path would quote; object metadata is ASCII.
ODD_NAMES = ("rün ü.mdl", "with space.mdl", "pct%20+plus.mdl")


def test_keys_beyond_ascii_and_url_quoting(store, local_run, tmp_path):
    """A prefix and checkpoints named outside ASCII or with spaces, ``%`` and ``+``: each is
    upgraded as the same file is under its own name, the metadata records its source URL
    %-encoded, a rerun skips them, and the report says what was done with the tensor data."""
    s3, bucket = store, "odd-names"
    s3.create_bucket(Bucket=bucket)
    sources = {
        ODD_NAMES[0]: local_run / "checkpoint_100.mdl",  # 1.9 as the 1.9 library laid it out
        ODD_NAMES[1]: FIXTURES / "release-2.3.mdl",
        ODD_NAMES[2]: FIXTURES / "real-cstorch-2.10" / "dtypes.mdl",  # the real 2.10 writer's
    }
    for name, path in sources.items():
        s3.upload_file(str(path), bucket, f"lauf ü/{name}")
    s3.upload_file(str(local_run / "params.yaml"), bucket, "lauf ü/paräms.yaml")
    args = ["upgrade-dir", f"s3://{bucket}/lauf ü", "--drop-dataloader-state"]
    args += ["--output-dir", f"s3://{bucket}/aus ü"]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tensor data None" not in proc.stdout
    assert proc.stdout.count("tensor data copied as stored") == 2, proc.stdout
    assert sorted(etags(s3, bucket, "aus ü/")) == sorted(
        f"aus ü/{n}" for n in [*ODD_NAMES, "paräms.yaml"]
    )
    for name, path in sources.items():
        opts = UpgradeOptions(target="2.10", output_dir=tmp_path / name, inputs=dict(DROP))
        want = upgrade(path, opts)
        got = tmp_path / f"s3-{name}"
        s3.download_file(bucket, f"aus ü/{name}", str(got))
        assert verify(want.output, got)["identical"], name
        meta = s3.head_object(Bucket=bucket, Key=f"aus ü/{name}")["Metadata"]
        assert urllib.parse.unquote(meta["ckpt-migrate-source"]) == f"s3://{bucket}/lauf ü/{name}"
    again = run_cli(*args, "--json")
    assert again.returncode == 0, again.stderr
    statuses = [json.loads(line)["status"] for line in again.stdout.splitlines()]
    assert sorted(statuses) == ["already-upgraded"] * 3 + ["left-alone"]


def test_killed_run_leaves_no_object(store, local_run):
    s3, bucket = store, "killed"
    s3.create_bucket(Bucket=bucket)
    name = "checkpoint_100.mdl"
    s3.upload_file(str(local_run / name), bucket, f"run/{name}")
    before = etags(s3, bucket, "run/")
    args = ["-m", "ckpt_migrate", "upgrade", f"s3://{bucket}/run/{name}", "--to", "2.10"]
    args += ["--drop-dataloader-state", "--output-dir", f"s3://{bucket}/out"]
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not s3.list_multipart_uploads(Bucket=bucket).get("Uploads"):
        assert proc.poll() is None, "finished before an upload was seen"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert f"out/{name}" not in etags(s3, bucket, "out/")  # no partial output object
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads")  # left by the kill
    res = upgrade_object(
        S3Url(bucket, f"run/{name}"),
        S3Url(bucket, "out"),
        UpgradeOptions(target="2.10", inputs=dict(DROP)),
    )
    assert res.status == "upgraded", res.error
    assert res.transfer["aborted_uploads"] >= 1
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert list(etags(s3, bucket, "out/")) == [f"out/{name}"]
    assert etags(s3, bucket, "run/") == before


def test_an_interrupt_as_the_store_completes_the_object_is_said(
    store, local_run, monkeypatch, capsys
):
    """A Ctrl-C during the multipart upload's completion: the store completed the object, the
    command tried to abort an upload already complete and said only ``interrupted``. The
    completion is now finished before the interrupt is raised, and the object it completed is
    said, as a file moved into place is (``atomic.publish``). A real SIGINT, a real S3 server
    (moto), the 1.9 library's layout."""
    from ckpt_migrate.cli import console
    from ckpt_migrate.interrupt import Interrupt
    from ckpt_migrate.remote import s3 as s3mod

    s3, bucket = store, "completing"
    s3.create_bucket(Bucket=bucket)
    name = "checkpoint_100.mdl"
    s3.upload_file(str(local_run / name), bucket, f"run/{name}")
    real_client = s3mod.client

    class Completing:
        def __init__(self) -> None:
            self.real = real_client()

        def __getattr__(self, attr):
            return getattr(self.real, attr)

        def complete_multipart_upload(self, **kw):
            reply = self.real.complete_multipart_upload(**kw)
            if kw["Key"] == f"out/{name}":  # (the output's, not a chain object's)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.5)  # (the handler runs here)
            return reply

    monkeypatch.setattr(s3mod, "client", Completing)
    monkeypatch.setattr(Interrupt, "pressed", False)
    out = S3Url(bucket, "out")
    opts = UpgradeOptions(target="2.10", inputs=dict(DROP))
    code = console.run_guarded(lambda: upgrade_object(S3Url(bucket, f"run/{name}"), out, opts))
    assert code == 130
    assert capsys.readouterr().err.splitlines() == [
        f"complete before the interrupt: s3://{bucket}/out/{name}",
        "interrupted",
    ]
    assert list(etags(s3, bucket, "out/")) == [f"out/{name}"]
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_an_interrupt_in_a_fleets_task_publishes_no_object(store, local_run, monkeypatch):
    """A task on a fleet's worker hears of the run's Ctrl-C only through ``Interrupt`` (its
    process notes it: ``remote.fleet``); the upload went on part after part and completed the
    object after the command had said ``interrupted``. It now stops at the next part: the
    upload aborted, no object. (The 1.9 library's layout, as the worker meets it.)"""
    from ckpt_migrate.interrupt import Interrupt
    from ckpt_migrate.remote import upgrade as remote_upgrade

    s3, bucket = store, "interrupted"
    s3.create_bucket(Bucket=bucket)
    name = "checkpoint_100.mdl"
    s3.upload_file(str(local_run / name), bucket, f"run/{name}")
    part = remote_upgrade._Writer._part

    def part_then_pressed(self, *args):
        etag = part(self, *args)
        monkeypatch.setattr(Interrupt, "pressed", True)  # (as the worker's handler does)
        return etag

    monkeypatch.setattr(remote_upgrade._Writer, "_part", part_then_pressed)
    with pytest.raises(KeyboardInterrupt):
        upgrade_object(
            S3Url(bucket, f"run/{name}"),
            S3Url(bucket, "out"),
            UpgradeOptions(target="2.10", inputs=dict(DROP)),
        )
    assert etags(s3, bucket, "out/") == {}
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_dask_cluster_with_a_worker_killed(store, local_run, tmp_path):
    distributed = pytest.importorskip("distributed", reason="the distributed extra")
    s3, bucket = store, "fleet"
    before = put_run(s3, local_run, bucket)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        pids = client.run(os.getpid)
        out: dict = {}

        def go() -> None:
            out["result"] = upgrades.upgrade_dir(
                Path(f"s3://{bucket}/run"),
                to="2.10",
                output_dir=Path(f"s3://{bucket}/run-2.10"),
                inputs=dict(DROP),
                scheduler=cluster.scheduler_address,
                on_done=lambda done, total: out.setdefault("done", []).append((done, total)),
            )

        runner = threading.Thread(target=go)
        runner.start()
        deadline = time.monotonic() + 60
        busy: list[str] = []
        while not busy and runner.is_alive() and time.monotonic() < deadline:
            busy = [w for w, tasks in client.processing().items() if tasks]
            time.sleep(0.02)
        assert busy, "no task was seen running"
        os.kill(pids[busy[0]], signal.SIGKILL)  # the worker dies in the middle of its upgrade
        runner.join(120)
        entries, worst = out["result"]
        assert out["done"][-1] == (3, 3)
        # Dask reran the killed task elsewhere, or it failed on its own: never a partial output
        for e in entries:
            assert e.status in ("upgraded", "current", "failed", "copied"), e.to_json()
        again, worst = upgrades.upgrade_dir(
            Path(f"s3://{bucket}/run"),
            to="2.10",
            output_dir=Path(f"s3://{bucket}/run-2.10"),
            inputs=dict(DROP),
            scheduler=cluster.scheduler_address,
        )
    assert worst == 0, [e.to_json() for e in again]
    assert etags(s3, bucket, "run/") == before
    assert_outputs(s3, bucket, local_run, tmp_path)


def test_local_directory_on_a_local_cluster(tmp_path):
    pytest.importorskip("distributed", reason="the distributed extra")
    md = tmp_path / "run"
    md.mkdir()
    for name in ("checkpoint_1.mdl", "checkpoint_2.mdl"):
        shutil.copyfile(FIXTURES / "release-2.0.mdl", md / name)
    proc = run_cli(
        "upgrade-dir", md, "--to", "2.10", "--output-dir", tmp_path / "out", "--workers", "2"
    )
    assert proc.returncode == 0, proc.stderr
    assert "all checkpoints: 2 of 2 checkpoints" in proc.stderr
    # (it was "files 2/2" whatever -q, --progress none or --json said)
    for quiet in (["-q"], ["--json"], ["--progress", "none"]):
        again = tmp_path / f"out{quiet[-1]}"
        argv = ["upgrade-dir", md, "--to", "2.10", "--output-dir", again, "--workers", "2"]
        proc = run_cli(*argv, *quiet)
        assert proc.returncode == 0 and "checkpoints" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "checkpoint_1.mdl",
        "checkpoint_2.mdl",
    ]


def test_missing_extra_is_one_line_with_the_install_hint():
    code = (
        "import sys; sys.modules['boto3'] = None; from ckpt_migrate.cli.main import main; "
        "sys.argv[0] = 'ckpt-migrate'; sys.exit(main())"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "upgrade", "s3://b/run/c.mdl", "--output-dir", "s3://b/o"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert "pip install 'ckpt-migrate[s3]'" in proc.stderr
