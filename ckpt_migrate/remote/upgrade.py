"""Upgrade a checkpoint object into another prefix without its tensor bytes leaving the store.

1. The source's metadata is fetched by ranged GETs (``s3.RangedFile`` under h5py) and laid
   into a sparse local *mirror* of the same size: the data ranges the engine would copy
   (``splitcopy.data_ranges``, at least ``MIN_RANGE``) stay holes, everything else is real.
2. The ordinary engine upgrades the mirror into a local staging file (``engine.upgrade``:
   ``read_checkpoint``'s boundary checks, the hops, the index verification). The copy-patch
   strategy keeps every reused tensor at its offset, so the staged file's data ranges inside
   the holes are the source's bytes at the same offsets.
3. The output object is a multipart upload (``parts.plan``): the ranges that are the source's
   bytes (``shared.layout``: every hole, and the unchanged metadata) are ``UploadPartCopy``
   parts from the source (pinned by ``CopySourceIfMatch``), the rest, the output's own bytes
   (edited metadata, small datasets), is uploaded from the staging file. The key appears only
   on ``CompleteMultipartUpload``; a failure aborts the upload, and an upload a killed run
   left is aborted by the next run.
4. The result is checked by ranged reads: its datasets store their data where the staged
   file's do and every byte not copied from the source equals the staged file's, each
   uploaded part's ETag is its MD5, and the object's ETag is the multipart ETag of the parts.

A rerun skips an output whose object metadata records this source's ETag and the target.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import h5py

from ckpt_migrate.engine.extents import Extents
from ckpt_migrate.engine.splitcopy import MIN_RANGE, complement, data_ranges
from ckpt_migrate.engine.upgrade import UpgradeOptions, UpgradeResult, upgrade
from ckpt_migrate.errors import CkptError, UsageError, VerificationError
from ckpt_migrate.format import releases
from ckpt_migrate.interrupt import Interrupt
from ckpt_migrate.remote import s3 as s3mod
from ckpt_migrate.remote.parts import SOURCE, UPLOAD, Program, Ref, clipped, plan
from ckpt_migrate.remote.s3 import RangedFile, S3Url
from ckpt_migrate.remote.shared import Layout, layout, stored_data

ALREADY_UPGRADED = "already-upgraded"
META_SOURCE = "ckpt-migrate-source"  # object metadata of an output: source URL, %-encoded
META_ETAG = "ckpt-migrate-source-etag"
META_TARGET = "ckpt-migrate-target"
GET_SPAN = 8 << 20  # metadata ranges are fetched in GETs of at most this much
CHAIN_SUFFIX = ".ckpt-migrate-chain/"  # + number: the chain objects while an output is built


def upgrade_object(
    src: S3Url,
    out_prefix: S3Url,
    opts: UpgradeOptions,
    s3: Any | None = None,
    stage_dir: Path | None = None,
    stop: Callable[[], None] | None = None,
) -> UpgradeResult:
    """Upgrade ``src`` into ``out_prefix/<name>``; errors become a failed result. ``stop``:
    raises KeyboardInterrupt once the run has stopped (a fleet's task: ``fleet.Stop``; by
    default a Ctrl-C of this process), asked before each part is uploaded."""
    result = UpgradeResult(src.path(), "failed")
    start = time.monotonic()
    try:
        client = s3 if s3 is not None else s3mod.client()
        stop = stop or Interrupt.check
        _upgrade(client, src, out_prefix.child(src.name), opts, result, stage_dir, stop)
    except CkptError as exc:
        result.status, result.error, result.exit_code = "failed", str(exc), exc.exit_code
    except OSError as exc:
        result.status, result.error, result.exit_code = "failed", f"{src}: {exc}", 5
    result.seconds = round(time.monotonic() - start, 3)
    return result


def _upgrade(
    s3: Any,
    src: S3Url,
    out: S3Url,
    opts: UpgradeOptions,
    result: UpgradeResult,
    stage: Any,
    stop: Callable[[], None],
) -> None:
    if opts.inplace:
        raise UsageError(str(src), "--inplace is not offered for objects", "pass --output-dir")
    if out == src:
        raise UsageError(str(out), "the output would be the source itself")
    info = s3mod.head(s3, src)
    if info is None:
        listing = f"{str(src.parent()).rstrip('/')}/"
        raise UsageError(
            str(src), "no such object", f"check the address (list the prefix: aws s3 ls {listing})"
        )
    size, etag = int(info["ContentLength"]), info["ETag"]
    target = releases.get(opts.target).name
    transfer: dict[str, Any] = {"fetched": 0, "uploaded": 0, "copied": 0, "parts": 0, "size": size}
    result.transfer = transfer
    existing = s3mod.head(s3, out)  # (a dry run fails where the run would)
    if existing is not None:
        meta = existing.get("Metadata") or {}
        if meta.get(META_ETAG) == etag and meta.get(META_TARGET) == target:
            result.status, result.to_release = ALREADY_UPGRADED, target
            result.output = out.path()
            return
        raise UsageError(
            str(out),
            "already exists and is not this source's upgrade; refusing to overwrite it",
            "remove it or choose another --output-dir",
        )
    if not opts.dry_run:
        transfer["aborted_uploads"] = abort_stale_uploads(s3, out)
    with tempfile.TemporaryDirectory(prefix="ckpt-migrate-s3-", dir=stage) as tmp:
        mirror = Path(tmp) / "source" / src.name
        mirror.parent.mkdir()
        holes = _mirror(s3, src, size, etag, mirror, transfer)
        staged_dir = Path(tmp) / "output"
        staged_dir.mkdir()
        # The staging file's shared ranges are never read (the store copies them from the
        # source object): they stay holes, so the local disk holds only the metadata.
        staging = replace(
            opts, output_dir=staged_dir, output=None, manifest=None, copy_method="sparse"
        )
        with Interrupt.unnoted():  # (the staging file is no output of the command's)
            local = upgrade(mirror, staging)
        _adopt(result, local, src)
        if local.status == "current":
            # Already at the target: a server-side copy, every part shared.
            staged = None
        elif local.status == "upgraded":
            staged = staged_dir / src.name
            if local.strategy != "copy-patch" and holes:
                raise UsageError(
                    str(src),
                    f"this upgrade rewrites the file ({local.strategy}); it needs the tensor "
                    "bytes, which an object-store upgrade does not fetch",
                    "download the checkpoint and upgrade it locally",
                )
        else:
            return
        if opts.dry_run:
            return
        # Object metadata travels as HTTP headers, ASCII only; a key may be any UTF-8.
        source = urllib.parse.quote(str(src), safe=":/")
        meta = {META_SOURCE: source, META_ETAG: etag, META_TARGET: target}
        if staged is None:
            shared, out_size = [(0, size)], size
        else:
            out_size = staged.stat().st_size
            found = layout(staged, mirror, holes, size)
            shared, transfer["own_data"] = found.shared, found.own_data
        remote = sorted((a, min(b, out_size)) for a, b in holes if a < out_size)  # (not staged)
        prog = plan(as_extents(shared, out_size), remote=None if staged is None else remote)
        writer = _Writer(s3, src, etag, out, staged, remote, transfer, stop)
        etag_out = writer.run(prog, meta)
        if staged is not None:
            _check_result(s3, out, staged, etag_out, found, transfer)
        result.output = out.path()
        result.bytes_written = out_size
        # What the local staging took on disk (sparse: the metadata, not the tensors)
        transfer["local_allocated"] = sum(
            p.stat().st_blocks * 512 for p in (mirror, staged) if p is not None
        )
        result.status = "upgraded" if staged is not None else "current"
        if staged is None:  # (said as a local run's "linked into D")
            result.placed = "copied"


def _adopt(result: UpgradeResult, local: UpgradeResult, src: S3Url) -> None:
    """The engine's account of the mirror, told of the object."""
    for name in (
        "status",
        "from_release",
        "to_release",
        "hops",
        "changes",
        "warnings",
        "strategy",
        "verified",
        "tensor_data",
        "tensors",
        "plan",
        "family",
        "upgraded_from",
        "model",
        "exit_code",
    ):
        setattr(result, name, getattr(local, name))
    if local.error:
        result.error = local.error.replace(str(local.source), str(src))


# --------------------------------------------------------------------------- reading


def _mirror(
    s3: Any, src: S3Url, size: int, etag: str, mirror: Path, transfer: dict[str, Any]
) -> list[tuple[int, int]]:
    """Lay the source's metadata into a sparse file of its size; return the holes left (the
    tensor data ranges, never fetched)."""
    reader = RangedFile(s3, src, size, etag)
    holes = _data_ranges(reader, str(src), MIN_RANGE)
    with open(mirror, "wb") as f:
        f.truncate(size)
        for a, b in complement(holes, size):
            for lo in range(a, b, GET_SPAN):
                hi = min(b, lo + GET_SPAN)
                f.seek(lo)
                f.write(reader.read_range(lo, hi))
    transfer["fetched"] += reader.fetched
    transfer["metadata_requests"] = reader.requests
    transfer["unfetched"] = sum(b - a for a, b in holes)
    return holes


def _data_ranges(fileobj: Any, name: str, min_bytes: int) -> list[tuple[int, int]]:
    """The stored-data ranges of every dataset, from the metadata alone."""
    datasets: list[h5py.Dataset] = []
    try:
        with h5py.File(fileobj, "r") as f:

            def visit(_: str, obj: Any) -> None:
                if isinstance(obj, h5py.Dataset):
                    datasets.append(obj)

            f.visititems(visit)
            return data_ranges(datasets, min_bytes)
    except OSError as exc:
        raise UsageError(name, f"not a readable HDF5 checkpoint ({exc})") from None


def as_extents(shared: list[tuple[int, int]], size: int) -> Extents:
    """``engine.extents``' description of the output: ``shared`` at the same offsets."""
    return Extents.copy_patch(shared, size, 1)  # an object store shares any byte range


# --------------------------------------------------------------------------- writing


def chain_prefix(out: S3Url) -> str:
    """Where the chain objects of ``out``'s upload live while it is built."""
    return f"{out.key}{CHAIN_SUFFIX}"


def abort_stale_uploads(s3: Any, out: S3Url) -> int:
    """Abort the incomplete multipart uploads of this key and remove its chain objects (what a
    killed run left). Returns how many uploads and objects went."""
    count = 0
    prefix = chain_prefix(out)
    try:
        listing = s3.list_multipart_uploads(Bucket=out.bucket, Prefix=out.key)
        for upload in listing.get("Uploads", []):
            if upload["Key"] == out.key or upload["Key"].startswith(prefix):
                s3.abort_multipart_upload(
                    Bucket=out.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
                count += 1
        count += _remove_chains(s3, out)
    except CkptError:
        raise
    except Exception as exc:
        raise s3mod.client_error(out, exc) from None
    return count


def _remove_chains(s3: Any, out: S3Url) -> int:
    listing = s3.list_objects_v2(Bucket=out.bucket, Prefix=chain_prefix(out))
    keys = [{"Key": o["Key"]} for o in listing.get("Contents", [])]
    if keys:
        s3.delete_objects(Bucket=out.bucket, Delete={"Objects": keys, "Quiet": True})
    return len(keys)


class _Writer:
    """Runs a ``parts.Program``: chain objects, then the output; aborts on any failure."""

    def __init__(
        self,
        s3: Any,
        src: S3Url,
        etag: str,
        out: S3Url,
        staged: Path | None,
        remote: list[tuple[int, int]],
        transfer: dict[str, Any],
        stop: Callable[[], None] = Interrupt.check,
    ) -> None:
        self.s3, self.src, self.etag, self.out = s3, src, etag, out
        self.staged, self.remote, self.transfer, self.stop = staged, remote, transfer, stop
        self.remote_ends = [b for _, b in remote]
        self.chains: dict[int, tuple[S3Url, int, str]] = {}  # number -> (url, start, etag)

    def run(self, prog: Program, meta: dict[str, str]) -> str:
        kept = {r.obj for r in prog.final}  # chain objects the output copies from
        try:
            for chain in prog.chains:
                url = S3Url(self.out.bucket, f"{chain_prefix(self.out)}{chain.number}")
                self.chains[chain.number] = (url, chain.start, self._object(url, chain.parts, {}))
                used = {r.obj for r in chain.parts} - kept - {SOURCE, UPLOAD}
                for number in used:  # the chain object this one grew from: no longer needed
                    old = self.chains[number][0]
                    self.s3.delete_object(Bucket=old.bucket, Key=old.key)
            got = self._object(self.out, prog.final, meta)
        finally:
            with contextlib.suppress(Exception):
                _remove_chains(self.s3, self.out)
        self.transfer["chain_objects"] = len(prog.chains)
        self.transfer["parts"] = len(prog.final)
        return got

    def _object(self, url: S3Url, refs: list[Ref], meta: dict[str, str]) -> str:
        s3 = self.s3
        try:
            upload_id = s3.create_multipart_upload(Bucket=url.bucket, Key=url.key, Metadata=meta)[
                "UploadId"
            ]
        except Exception as exc:
            raise s3mod.client_error(url, exc) from None
        done: list[dict[str, Any]] = []
        try:
            for number, ref in enumerate(refs, 1):
                self.stop()  # (a fleet's task hears of it only here: ``fleet.Stop``)
                done.append({"PartNumber": number, "ETag": self._part(url, upload_id, number, ref)})
            self.stop()  # never published after Ctrl-C, as ``atomic.publish``
            with Interrupt.hold():
                reply = s3.complete_multipart_upload(
                    Bucket=url.bucket,
                    Key=url.key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": done},
                )
                if url == self.out:  # (a chain object is a temporary)
                    Interrupt.note_published(str(url))
        except BaseException as exc:
            with contextlib.suppress(Exception):
                s3.abort_multipart_upload(Bucket=url.bucket, Key=url.key, UploadId=upload_id)
            if isinstance(exc, Exception) and not isinstance(exc, CkptError):
                raise s3mod.client_error(url, exc) from None
            raise
        digests = b"".join(bytes.fromhex(p["ETag"].strip('"')) for p in done)
        expected = f'"{hashlib.md5(digests).hexdigest()}-{len(done)}"'
        got = reply.get("ETag") or (s3mod.head(s3, url) or {}).get("ETag")
        if got != expected:
            raise VerificationError(str(url), f"its ETag {got} is not its parts' {expected}")
        return got

    def _part(self, url: S3Url, upload_id: str, number: int, ref: Ref) -> str:
        args = {"Bucket": url.bucket, "Key": url.key, "UploadId": upload_id, "PartNumber": number}
        if ref.obj == UPLOAD:
            body = self._body(ref)
            etag = self.s3.upload_part(Body=body, **args)["ETag"]
            if etag.strip('"') != hashlib.md5(body).hexdigest():
                raise VerificationError(str(url), f"part {number}: the store's MD5 differs")
            self.transfer["uploaded"] += ref.size
            return etag
        if ref.obj == SOURCE:
            source, lo, if_match = self.src, ref.start + ref.delta, self.etag
        else:
            source, base, if_match = self.chains[ref.obj]
            lo = ref.start - base
        reply = self.s3.upload_part_copy(
            CopySource={"Bucket": source.bucket, "Key": source.key},
            CopySourceRange=f"bytes={lo}-{lo + ref.size - 1}",
            CopySourceIfMatch=if_match,
            **args,
        )
        self.transfer["copied"] += ref.size
        return reply["CopyPartResult"]["ETag"]

    def _body(self, ref: Ref) -> bytes:
        """Uploaded bytes: the staged file's, the tensor data it lacks fetched from the source."""
        if self.staged is None:
            self.transfer["fetched"] += ref.size
            return s3mod.get_range(self.s3, self.src, ref.start, ref.end, self.etag)
        with open(self.staged, "rb") as f:
            f.seek(ref.start)
            body = bytearray(f.read(ref.size))
        for lo, hi in clipped(self.remote, self.remote_ends, ref.start, ref.end):
            if lo < hi:
                body[lo - ref.start : hi - ref.start] = s3mod.get_range(
                    self.s3, self.src, lo, hi, self.etag
                )
                self.transfer["fetched"] += hi - lo
        return bytes(body)


def _check_result(
    s3: Any, out: S3Url, staged: Path, etag: str, found: Layout, transfer: dict[str, Any]
) -> None:
    """Index check by ranged reads: the object's datasets store their data where the staged
    file's do, and every byte it did not copy from the source's tensor data equals the staged
    file's."""
    size = staged.stat().st_size
    reader = RangedFile(s3, out, size, etag)
    with open(staged, "rb") as f:
        if stored_data(reader, str(out)) != found.datasets:
            raise VerificationError(str(out), "its data ranges differ from the upgrade's")
        for a, b in complement(found.shared, size):
            f.seek(a)
            if f.read(b - a) != reader.read_range(a, b):
                raise VerificationError(str(out), f"metadata bytes [{a}, {b}) differ")
    transfer["verify_fetched"] = reader.fetched
