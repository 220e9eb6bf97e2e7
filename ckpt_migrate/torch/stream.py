"""Write a ``torch.save`` file one tensor at a time (``to-torch``): the process holds one tensor's
data at a time, not the checkpoint's.

``torch.serialization.skip_data`` writes the whole file with each storage's place reserved but
not filled ("the storage bytes can then be populated in a separate pass"), from ``torch.empty``
placeholders (address space only: their pages are never touched). Each storage is a stored
(uncompressed) zip record ``<archive>/data/<key>``, its key given in the order the pickler first
meets it, which is container order; the second pass finds each record's offset in the zip
directory, checks its size, and writes the tensor read from the checkpoint there, then drops it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import struct
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ckpt_migrate.format.progress import Count
from ckpt_migrate.torch.lazy import LazyTensor, read_once


def placeholder(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor of ``t``'s shape and dtype (no data read, no page touched)."""
    return torch.empty(tuple(t.shape), dtype=t.dtype)


def save_streaming(
    obj: Any,
    path: Path,
    sources: dict[int, torch.Tensor],
    progress: Callable[[str, int, int], None] | None = None,
) -> int:
    """Write ``obj`` (containers whose tensors are ``placeholder``s) to ``path`` as
    ``torch.save`` would, filling each placeholder's storage from ``sources[id(placeholder)]``
    (a LazyTensor is read without being cached on it); returns how many storages it wrote."""
    order = list({id(t): t for t in _tensors(obj)}.values())  # storage keys 0, 1, ... in order
    laid = Count(progress, "lay out", len(order), 64)
    with torch.serialization.skip_data(), _each_storage_saved(laid if progress else None):
        try:
            torch.save(obj, path)
        except RuntimeError as exc:  # (torch's zip writer says only "unexpected pos A vs B")
            if "inline_container" not in str(exc):
                raise
            free = shutil.disk_usage(path.parent).free
            code = errno.ENOSPC if free < 1 << 20 else errno.EIO
            raise OSError(
                code, f"torch.save could not write the file ({os.strerror(code)})"
            ) from None
    laid.end()
    offsets = _record_offsets(path)
    if len(offsets) != len(order):
        raise RuntimeError(f"{path}: {len(order)} tensors, {len(offsets)} storage records")
    total = sum(t.nbytes for t in order)
    done = 0
    fd = os.open(path, os.O_WRONLY)
    try:
        for key, holder in enumerate(order):
            offset, size = offsets[str(key)]
            if size != holder.nbytes:
                raise RuntimeError(f"{path}: record {key} holds {size} bytes, not {holder.nbytes}")
            source = sources[id(holder)]
            value = read_once(source) if isinstance(source, LazyTensor) else source
            if holder.nbytes:
                _write_all(fd, _raw_bytes(value), offset)
            done += holder.nbytes
            del value
            if progress is not None:
                progress("converting", done, total)
    finally:
        os.close(fd)
    return len(order)


_SAVING = threading.local()  # .step: what ``_tag`` calls, in the thread of a counted save
_TAGGER: list[bool] = []  # (registered once in the process: torch has no way to remove one)


@contextlib.contextmanager
def _each_storage_saved(step: Callable[[], None] | None) -> Iterator[None]:
    """Call ``step`` as ``torch.save`` pickles each storage: it asks each registered package
    (``torch.serialization.register_package``, its public hook) for the storage's location,
    this one first, which counts and answers none. Pickling 150k placeholders took 10 s
    unsaid."""
    if step is None:
        yield
        return
    if not _TAGGER:
        torch.serialization.register_package(-1000, _tag, lambda storage, location: None)
        _TAGGER.append(True)
    _SAVING.step = step
    try:
        yield
    finally:
        _SAVING.step = None


def _tag(storage: Any) -> None:
    step = getattr(_SAVING, "step", None)
    if step is not None:
        step()


def _raw_bytes(t: torch.Tensor) -> memoryview:
    """``t``'s bytes in memory order, as ``torch.save`` stores a contiguous storage."""
    flat = t.detach().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _record_offsets(path: Path) -> dict[str, tuple[int, int]]:
    """Storage key -> (offset of its bytes in the file, size), from the zip directory and each
    record's local header."""
    out: dict[str, tuple[int, int]] = {}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as fh:
        for info in archive.infolist():
            parent, _, key = info.filename.rpartition("/")
            if not parent.endswith("/data") and parent != "data":
                continue
            if info.compress_type != zipfile.ZIP_STORED:
                raise RuntimeError(f"{path}: record {info.filename} is compressed")
            fh.seek(info.header_offset)
            header = fh.read(30)
            if header[:4] != b"PK\x03\x04":
                raise RuntimeError(f"{path}: no local header for {info.filename}")
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            out[key] = (info.header_offset + 30 + name_len + extra_len, info.file_size)
    return out


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``obj``, in the order ``torch.save`` pickles them: container order; a
    set's is its iteration order, the same for the pickler as here while the set is unchanged."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for value in obj:
            yield from _tensors(value)
