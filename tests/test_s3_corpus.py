"""Every checkpoint the local tests upgrade, upgraded through the object store: a ``moto_server``
subprocess and a Dask ``LocalCluster`` of worker processes, one of each for the module.

The corpus: the release fixtures (``fixtures/*.mdl``), the model fixtures, the real library's
2.10 files (``fixtures/real-cstorch-2.10/``) and 2.6/2.9 files
(``fixtures/real-cstorch-2.6-2.9/``), and a 1.9 checkpoint laid out as the 1.9 library wrote it
(``real_layout``: auto-chunked LZ4, bf16 as int16, Adam state). Each is upgraded by the local
``upgrade-dir`` and by ``upgrade-dir s3://…`` run here, with ``--workers`` and with
``--scheduler``; every object must be the local output (byte for byte but for the provenance
record and HDF5's object times), with the same outcome where the local run refuses a file, and
within the byte budget. The 2.x files also go down to 2.0.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
from pathlib import Path

import h5py
import pytest
from conftest import FIXTURES, MODELS, REAL, run_cli
from s3store import etags, moto_server, put_dir

from ckpt_migrate.cli import upgrades
from ckpt_migrate.engine.splitcopy import MIN_RANGE, data_ranges
from ckpt_migrate.format.provenance import PROVENANCE_ATTR
from ckpt_migrate.remote.parts import MIN_PART

DROP = {"drop_dataloader_state": True}
VOLATILE = {"time", "source_xxh3_128", "source_identity"}  # of the provenance record
REAL_2X = FIXTURES / "real-cstorch-2.6-2.9"
DOWN = (  # 2.x files taken down to 2.0: the real library's of several kinds, and ours
    "real-gpt2-2.6.0.mdl",
    "real-trainer-2.9.0.mdl",
    "real-2.10-basic.mdl",
    "real-2.10-dtypes.mdl",
    "real-2.10-dataloader_map.mdl",
    "release-2.3.mdl",
    "release-2.10.mdl",
)


@pytest.fixture(scope="module")
def store():
    with moto_server() as s3:
        yield s3


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed", reason="the distributed extra")
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as c:
        yield c


def _corpus(root: Path, real: Path) -> Path:
    """The local tests' checkpoints in one directory, under names of their own."""
    run = root / "corpus"
    run.mkdir()
    for p in FIXTURES.glob("*.mdl"):
        shutil.copyfile(p, run / p.name)
    for d in sorted(MODELS.iterdir()):
        if d.is_dir():
            shutil.copyfile(d / "checkpoint_100.mdl", run / f"{d.name}.mdl")
    for p in REAL.glob("*.mdl"):
        shutil.copyfile(p, run / f"real-2.10-{p.name}")
    for p in REAL_2X.glob("*.mdl.xz"):
        (run / f"real-{p.name[:-3]}").write_bytes(lzma.decompress(p.read_bytes()))
    shutil.copyfile(real, run / "real-layout-1.9.mdl")
    return run


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, real_layout_19) -> Path:
    return _corpus(tmp_path_factory.mktemp("s3corpus"), real_layout_19)


def run_dir(src: Path | str, out: Path | str, to: str = "latest", **kw) -> dict[str, object]:
    entries, _ = upgrades.upgrade_dir(Path(src), to=to, output_dir=Path(out), inputs=DROP, **kw)
    return {e.path.name: e for e in entries if e.kind == "checkpoint"}


def local_reference(corpus: Path, out: Path, to: str = "latest") -> dict[str, object]:
    return run_dir(corpus, out, to)


def stored(path: Path) -> dict[str, tuple]:
    """Every object of the file: its kind, attributes and, for a dataset, its stored data
    ranges and their bytes (the provenance record without its per-run fields)."""
    out: dict[str, tuple] = {}
    with h5py.File(path, "r") as f, open(path, "rb") as raw:

        def attrs(obj) -> dict:
            got = {}
            for k, v in obj.attrs.items():
                if k == PROVENANCE_ATTR:
                    v = [{a: b for a, b in r.items() if a not in VOLATILE} for r in json.loads(v)]
                got[k] = repr(v)
            return got

        def visit(name: str, obj) -> None:
            if isinstance(obj, h5py.Dataset):
                spans = data_ranges([obj], 0)
                data = []
                for a, b in spans:
                    raw.seek(a)
                    data.append(raw.read(b - a))
                out[name] = ("dataset", obj.dtype.str, obj.shape, attrs(obj), spans, data)
            else:
                out[name] = ("group", attrs(obj))

        out["/"] = ("root", attrs(f))
        f.visititems(visit)
    return out


def assert_same_output(local: Path, remote: Path, source: Path, edited: bool) -> None:
    """The object is the local upgrade's output: the same size, the same objects, attributes
    and stored data at the same offsets, and for an ``edited`` source (copy-patch) the same
    bytes up to the source's end (HDF5 stamps new groups' headers with the time, and the
    provenance record differs by run)."""
    assert remote.stat().st_size == local.stat().st_size, remote.name
    if edited:
        size = source.stat().st_size
        with open(local, "rb") as a, open(remote, "rb") as b:
            assert a.read(size) == b.read(size), f"{remote.name}: bytes before the source's end"
    assert stored(remote) == stored(local), remote.name


def tensor_bytes(path: Path) -> int:
    """The bytes of the file's tensor data ranges (``MIN_RANGE`` or more: the rest travels
    with the metadata)."""
    found: list[h5py.Dataset] = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda _, o: found.append(o) if isinstance(o, h5py.Dataset) else None)
        return sum(b - a for a, b in data_ranges(found, MIN_RANGE))


def assert_fleet(s3, bucket: str, corpus: Path, local_out: Path, local, remote, tmp: Path):
    """Every checkpoint: the local run's outcome; an output equal to the local one, sent within
    the budget: 5 % of the source, its metadata (what is not tensor data) and S3's 5 MiB part."""
    assert local.keys() == remote.keys()
    for name, want in local.items():
        got = remote[name]
        if want.status == "failed":
            assert got.status == "failed", (name, got.to_json())
            assert got.exit_code == want.exit_code, (name, got.result.error, want.result.error)
            continue
        assert got.status == want.status, f"{name}: {got.result.error}"
        t = got.result.transfer
        src = corpus / name
        size = src.stat().st_size
        metadata = size - tensor_bytes(src)
        assert t["uploaded"] <= 0.05 * size + metadata + MIN_PART, (name, t)
        obj = tmp / name
        obj.unlink(missing_ok=True)
        s3.download_file(bucket, f"out/{name}", str(obj))
        edited = want.result.strategy == "copy-patch"
        assert_same_output(local_out / name, obj, src, edited)
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert [k for k in etags(s3, bucket, "out/") if "ckpt-migrate-chain" in k] == []


@pytest.fixture(scope="module")
def local_out(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "out"
    return out, local_reference(corpus, out)


@pytest.fixture(scope="module")
def here(store, corpus):
    """The corpus upgraded by ``upgrade-dir s3://…`` in this process: (bucket, entries)."""
    s3, bucket = store, "corpus-here"
    before = put_dir(s3, corpus, bucket)
    entries = run_dir(f"s3://{bucket}/run", f"s3://{bucket}/out")
    assert etags(s3, bucket, "run/") == before  # sources never written
    return bucket, entries


def test_corpus_through_the_store(store, corpus, local_out, here, tmp_path):
    bucket, remote = here
    out, local = local_out
    assert_fleet(store, bucket, corpus, out, local, remote, tmp_path)


# On a cluster each checkpoint is the same task as here: a few of them (the real layout with
# --workers; test_s3_fleet runs it through a scheduler, a worker killed on the way), or with
# CKPT_MIGRATE_FULL_CORPUS=1 every one in both modes (a few minutes more: before a release).
ON_CLUSTER = ("gpt2-1.9.mdl", "real-2.10-basic.mdl", "real-gpt2-2.6.0.mdl")
FULL_CORPUS = os.environ.get("CKPT_MIGRATE_FULL_CORPUS") == "1"


@pytest.mark.parametrize("mode", ["workers", "scheduler"])
def test_a_cluster_upgrades_the_same(store, cluster, corpus, local_out, tmp_path, mode):
    s3, bucket = store, f"corpus-{mode}"
    run = tmp_path / "run"
    run.mkdir()
    names = ON_CLUSTER + (("real-layout-1.9.mdl",) if mode == "workers" else ())
    if FULL_CORPUS:
        names = tuple(sorted(p.name for p in corpus.glob("*.mdl")))
    for name in names:
        (run / name).hardlink_to(corpus / name)
    before = put_dir(s3, run, bucket)
    kw = {"workers": 2} if mode == "workers" else {"scheduler": cluster.scheduler_address}
    remote = run_dir(f"s3://{bucket}/run", f"s3://{bucket}/out", **kw)
    out, everything = local_out
    local = {name: everything[name] for name in names}
    assert_fleet(s3, bucket, corpus, out, local, remote, tmp_path)
    assert etags(s3, bucket, "run/") == before


def test_downgrades_through_the_store(store, corpus, local_out, tmp_path):
    """The 2.x files, the real library's and the real layout's local 2.10 upgrade, to 2.0."""
    run = tmp_path / "down"
    run.mkdir()
    for name in DOWN:
        shutil.copyfile(corpus / name, run / name)
    shutil.copyfile(local_out[0] / "real-layout-1.9.mdl", run / "real-layout-2.10.mdl")
    local = local_reference(run, tmp_path / "local", "2.0")
    assert local["real-layout-2.10.mdl"].status == "upgraded"
    s3, bucket = store, "downgrade"
    put_dir(s3, run, bucket)
    remote = run_dir(f"s3://{bucket}/run", f"s3://{bucket}/out", "2.0")
    assert_fleet(s3, bucket, run, tmp_path / "local", local, remote, tmp_path)


def test_fleet_report(corpus, local_out, here, tmp_path):
    """``upgrade-dir --json``, local and remote: per checkpoint the status, the bytes read, sent
    and copied server-side (or shared), and the time; the summary adds the totals."""
    remote = {name: e.to_json() for name, e in here[1].items()}
    size = (corpus / "real-layout-1.9.mdl").stat().st_size
    big = remote["real-layout-1.9.mdl"]
    assert big["status"] == "upgraded"
    assert big["bytes_sent"] == big["transfer"]["uploaded"] < size
    assert big["bytes_copied"] == big["transfer"]["copied"] > size // 2
    assert 0 < big["bytes_read"] < 2 * size and big["seconds"] > 0
    current = remote["release-2.10.mdl"]
    assert current["status"] == "current"  # a copy: server-side, or uploaded under 5 MiB
    assert current["bytes_copied"] + current["bytes_sent"] == current["transfer"]["size"]
    local = {name: e.to_json() for name, e in local_out[1].items()}
    up, linked = local["real-layout-1.9.mdl"], local["release-2.10.mdl"]
    assert up["bytes_sent"] == up["bytes_written"] and up["seconds"] > 0
    assert up["bytes_read"] + up["bytes_copied"] == size
    assert (linked["bytes_read"], linked["bytes_sent"]) == (0, 0)
    assert linked["bytes_copied"] == (corpus / "release-2.10.mdl").stat().st_size
    # the command line: one JSON object per file, and the totals under the summary table
    run = tmp_path / "run"
    run.mkdir()
    for name in ("gpt2-2.0.mdl", "release-2.10.mdl"):
        shutil.copyfile(corpus / name, run / name)
    as_json = run_cli("upgrade-dir", run, "--output-dir", tmp_path / "a", "--json")
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    sums = [
        sum(r[k] for r in rows if r["kind"] == "checkpoint")
        for k in ("bytes_read", "bytes_sent", "bytes_copied")
    ]
    text = run_cli("upgrade-dir", run, "--output-dir", tmp_path / "b")
    assert text.returncode == 0, text.stderr
    line = "bytes read {:,}, sent {:,}, copied server-side or shared {:,};".format(*sums)
    assert line in text.stdout, text.stdout
