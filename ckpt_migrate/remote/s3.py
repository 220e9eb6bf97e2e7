"""``s3://bucket/key`` addresses, the client, and a ranged-read file object for HDF5.

The client takes endpoint, region and credentials from the standard AWS environment and
config files (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``~/.aws/config``): boto3 reads them.
``RangedFile`` serves HDF5's reads with ranged GETs through a small block cache, so opening a
checkpoint and walking its metadata fetches the metadata, never the tensor bytes.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from ckpt_migrate.atomic import object_address
from ckpt_migrate.errors import CkptIOError, UsageError, require

SCHEME = "s3://"
BLOCK = 64 << 10  # the cache's unit: HDF5 metadata reads are small and clustered
CACHE_BLOCKS = 256


def is_url(value: object) -> bool:
    """An ``s3://`` address, also after ``pathlib`` folded its ``//`` into ``/``."""
    return object_address(value) is not None


@dataclass(frozen=True)
class S3Url:
    bucket: str
    key: str  # no leading "/"; a "directory" prefix has no trailing "/" either

    @classmethod
    def parse(cls, value: object) -> S3Url:
        text = str(value)
        if not is_url(text):
            raise UsageError(text, "is not an s3:// address")
        rest = text[len("s3:/") :].lstrip("/")
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise UsageError(text, "names no bucket", "write s3://BUCKET/KEY")
        return cls(bucket, key.strip("/"))

    @property
    def name(self) -> str:
        return PurePosixPath(self.key).name

    def parent(self) -> S3Url:
        return S3Url(self.bucket, str(PurePosixPath(self.key).parent).strip("."))

    def child(self, name: str) -> S3Url:
        return S3Url(self.bucket, f"{self.key}/{name}" if self.key else name)

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}"

    def path(self) -> ObjectPath:
        return ObjectPath(str(self))


class ObjectPath(PurePosixPath):
    """An object's address where the reports take a path: prints as ``s3://bucket/key``."""

    def __str__(self) -> str:
        text = super().__str__()
        return object_address(text) or text


def client() -> Any:
    """A boto3 S3 client configured from the standard AWS environment and config files."""
    boto3 = require("boto3", "s3")
    return boto3.client("s3")


def client_error(url: S3Url | str, exc: Exception) -> CkptIOError:
    """A botocore error as the one-line I/O error (exit 5)."""
    detail = getattr(exc, "response", {}).get("Error", {})
    what = detail.get("Message") or detail.get("Code") or str(exc)
    return CkptIOError(str(url), f"object storage: {what}", "check the address and credentials")


def head(s3: Any, url: S3Url) -> dict[str, Any] | None:
    """The object's HEAD response, or None when there is no such object."""
    try:
        return s3.head_object(Bucket=url.bucket, Key=url.key)
    except Exception as exc:
        code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchKey", "NotFound"):
            return None
        raise client_error(url, exc) from None


def get_range(s3: Any, url: S3Url, start: int, end: int, etag: str | None = None) -> bytes:
    """Bytes ``[start, end)`` of the object (``etag``: refuse if it changed meanwhile)."""
    if end <= start:
        return b""
    span = f"bytes={start}-{end - 1}"
    args: dict[str, Any] = {"Bucket": url.bucket, "Key": url.key, "Range": span}
    if etag is not None:
        args["IfMatch"] = etag
    try:
        data = s3.get_object(**args)["Body"].read()
    except Exception as exc:
        raise client_error(url, exc) from None
    if len(data) != end - start:
        raise CkptIOError(str(url), f"short read at {start}: {len(data)} of {end - start} bytes")
    return data


class RangedFile(io.RawIOBase):
    """A read-only, seekable view of one object version (pinned by its ETag)."""

    def __init__(self, s3: Any, url: S3Url, size: int, etag: str) -> None:
        super().__init__()
        self.s3, self.url, self.size, self.etag = s3, url, size, etag
        self.pos = 0
        self.fetched = 0  # bytes received, for the reports
        self.requests = 0
        self._cache: OrderedDict[int, bytes] = OrderedDict()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), max(0, self.size - self.pos))
        done = 0
        while done < want:
            block = (self.pos + done) // BLOCK
            data = self._block(block)
            inner = self.pos + done - block * BLOCK
            n = min(want - done, len(data) - inner)
            view[done : done + n] = data[inner : inner + n]
            done += n
        self.pos += done
        return done

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``: from the cache when its blocks hold them all (HDF5's walk
        has read most metadata already), else by one GET of exactly that range."""
        first, last = start // BLOCK, (end - 1) // BLOCK
        if end > start and all(i in self._cache for i in range(first, last + 1)):
            data = b"".join(self._cache[i] for i in range(first, last + 1))
            return data[start - first * BLOCK : end - first * BLOCK]
        data = get_range(self.s3, self.url, start, end, self.etag)
        self.fetched += len(data)
        self.requests += 1
        return data

    def _block(self, index: int) -> bytes:
        data = self._cache.get(index)
        if data is not None:
            self._cache.move_to_end(index)
            return data
        start = index * BLOCK
        data = get_range(self.s3, self.url, start, min(self.size, start + BLOCK), self.etag)
        self.fetched += len(data)
        self.requests += 1
        self._cache[index] = data
        if len(self._cache) > CACHE_BLOCKS:
            self._cache.popitem(last=False)
        return data
