"""``upgrade-dir s3://bucket/run --output-dir s3://bucket/run-2.10``: every checkpoint object
directly under the prefix, newest first by the checkpoint name pattern, each through
``remote.upgrade.upgrade_object`` (here, or one task each on a Dask cluster).

The run's other objects directly under the prefix (``params.yaml``, the dataloader side files)
travel with the checkpoints: copied server-side into the output prefix, unchanged (an object
already there with the same ETag is left; any other is refused, exit 2, never overwritten).
Sources are only read. Objects deeper under the prefix are not searched, as subdirectories are
not locally.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ckpt_migrate.engine.upgrade import UpgradeOptions, UpgradeResult
from ckpt_migrate.errors import CkptError, UsageError
from ckpt_migrate.model_dir.names import NamePattern
from ckpt_migrate.model_dir.upgrade_dir import LEFT_ALONE, NOT_SELECTED, DirEntry, DirOptions
from ckpt_migrate.remote import fleet
from ckpt_migrate.remote import s3 as s3mod
from ckpt_migrate.remote.s3 import S3Url
from ckpt_migrate.remote.upgrade import CHAIN_SUFFIX, upgrade_object

COPIED = "copied"  # a side file copied into the output prefix


def upgrade_prefix(
    src: S3Url,
    out: S3Url | None,
    opts: DirOptions,
    client: Any | None = None,
    on_done: fleet.Done | None = None,
) -> Iterator[DirEntry]:
    """Entries for every object directly under ``src`` (checkpoints first, newest first);
    ``client``: one task per checkpoint on that Dask cluster."""
    if opts.inplace or out is None:
        raise UsageError(str(src), "objects are upgraded into another prefix", "pass --output-dir")
    if out == src:
        raise UsageError(str(out), "is the source prefix itself", "choose another --output-dir")
    try:
        pattern = NamePattern(opts.name)
    except ValueError as exc:
        raise UsageError(None, str(exc)) from None
    s3 = s3mod.client()
    named, unnamed, others = _list(s3, src, pattern)
    checkpoints = named + unnamed
    selected = named[:1] if opts.only_latest and named else checkpoints
    for url in checkpoints:
        if url not in selected:
            yield DirEntry(url.path(), "checkpoint", NOT_SELECTED, "--only-latest: not the newest")
    task = _ObjectTask(out, _engine_options(opts))
    if client is None:
        for url in selected:
            yield _entry(task(url))
    else:
        yield from fleet.run(
            client,
            _EntryTask(task),
            selected,
            lambda url, why: fleet.failed_entry(url.path(), why),
            on_done,
        )
    for url in others:
        yield _side_file(s3, url, out.child(url.name), opts.dry_run)


def _engine_options(opts: DirOptions) -> UpgradeOptions:
    return UpgradeOptions(
        target=opts.target,
        dry_run=opts.dry_run,
        verify=opts.verify,
        copy_method=opts.copy_method,
        allow_missing=opts.allow_missing,
        inputs=dict(opts.inputs or {}),
    )


class _ObjectTask:
    """Picklable: one object's upgrade (a fresh client on the worker)."""

    def __init__(self, out: S3Url, opts: UpgradeOptions) -> None:
        self.out, self.opts = out, opts

    def __call__(self, url: S3Url, stop: fleet.Stop | None = None) -> Any:
        check = None if stop is None else stop.check
        return upgrade_object(url, self.out, replace(self.opts), stop=check)


class _EntryTask:
    def __init__(self, task: _ObjectTask) -> None:
        self.task = task

    def __call__(self, url: S3Url, stop: fleet.Stop) -> DirEntry:
        try:
            return _entry(self.task(url, stop))
        except KeyboardInterrupt:  # (the run stopped: ``fleet.Stop``)
            return fleet.failed_entry(url.path(), "interrupted")


def _entry(res: Any) -> DirEntry:
    return DirEntry(res.source, "checkpoint", res.status, result=res, action=res.placed)


def _list(
    s3: Any, src: S3Url, pattern: NamePattern
) -> tuple[list[S3Url], list[S3Url], list[S3Url]]:
    """(named checkpoints newest first, other ``.mdl`` objects newest first, side files)."""
    prefix = f"{src.key}/" if src.key else ""
    named: list[tuple[Any, S3Url]] = []
    unnamed: list[tuple[Any, S3Url]] = []
    others: list[S3Url] = []
    try:
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=src.bucket, Prefix=prefix, Delimiter="/"
        )
        for page in pages:
            for obj in page.get("Contents", []):
                name = obj["Key"][len(prefix) :]
                url = S3Url(src.bucket, obj["Key"])
                match = pattern.match(name)
                if CHAIN_SUFFIX.strip("/") in obj["Key"]:
                    continue
                if match is not None:
                    named.append((match.sort_key, url))
                elif name.endswith(".mdl"):
                    unnamed.append((obj["LastModified"], url))
                else:
                    others.append(url)
    except CkptError:
        raise
    except Exception as exc:
        raise s3mod.client_error(src, exc) from None
    if not named and not unnamed and not others:
        raise UsageError(str(src), "no objects under this prefix", "name the run's prefix")
    named.sort(key=lambda item: (item[0], item[1].key), reverse=True)
    unnamed.sort(key=lambda item: (item[0], item[1].key), reverse=True)
    return [u for _, u in named], [u for _, u in unnamed], others


def _side_file(s3: Any, src: S3Url, dst: S3Url, dry_run: bool) -> DirEntry:
    """A run's other object, copied server-side beside the upgraded checkpoints; another object
    at ``dst`` is refused (exit 2) and a failed copy is an I/O error (exit 5), each a failed
    entry, as a local run refuses another config at its output."""
    path = src.path()
    try:
        info = s3mod.head(s3, src)
        there = s3mod.head(s3, dst)
        if there is not None:
            if info is not None and there["ETag"] == info["ETag"]:
                return DirEntry(path, "other", LEFT_ALONE, "already in the output prefix")
            raise UsageError(
                str(dst),
                f"already exists and differs from {src}; refusing to overwrite it",
                "remove it or choose another --output-dir",
            )
        if dry_run:
            return DirEntry(path, "other", LEFT_ALONE, "would be copied")
        s3.copy({"Bucket": src.bucket, "Key": src.key}, dst.bucket, dst.key)
    except CkptError as exc:
        return _failed_side_file(path, exc)
    except Exception as exc:
        return _failed_side_file(path, s3mod.client_error(dst, exc))
    return DirEntry(path, "other", COPIED, f"copied to {dst}")


def _failed_side_file(path: Any, exc: CkptError) -> DirEntry:
    res = UpgradeResult(path, "failed", error=str(exc), exit_code=exc.exit_code)
    return DirEntry(path, "other", "failed", result=res)
