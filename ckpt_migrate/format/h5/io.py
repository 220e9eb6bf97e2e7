"""Thin h5py helpers: opening files with one-line errors, decoding attributes, copying data;
importing this module registers the LZ4 filter, the one real checkpoints use (``h5.plugins``)."""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ckpt_migrate.atomic import path_exists, refuse_object_address
from ckpt_migrate.errors import (
    CkptError,
    CkptIOError,
    CorruptCheckpointError,
    NotACheckpointError,
    UsageError,
)
from ckpt_migrate.format.h5 import capi, chunks, overlaps, rowreads
from ckpt_migrate.format.h5.identity import file_identity
from ckpt_migrate.format.h5.metadata_cache import bounded_metadata_cache
from ckpt_migrate.format.h5.plugins import forbid_plugin_loading, register_lz4
from ckpt_migrate.format.progress import Progress

register_lz4()

# Raw-chunk copy and slab streaming keep at most about this much tensor data in memory at once.
COPY_BLOCK_BYTES = 64 << 20


def check_file(p: Path) -> None:
    """A checkpoint path must name a regular file: one line otherwise, before any read (opening
    a named pipe to read waits for a writer)."""
    if not path_exists(p):
        refuse_object_address(p)
        raise NotACheckpointError(p, "no such file", "check the path")
    if p.is_dir():
        raise NotACheckpointError(
            p,
            "is a directory, not a checkpoint file",
            "name a .mdl file in it (`ckpt-migrate upgrade-dir` upgrades a whole model directory)",
        )
    if not p.is_file():
        raise NotACheckpointError(
            p, "is not a regular file (a pipe, socket or device)", "name a .mdl file"
        )


def _fix_for(p: Path, head: bytes) -> str:
    """What to do with a file that is not HDF5, from its first bytes and its name."""
    hf_dir = "`ckpt-migrate import-hf` takes its Hugging Face model directory (with config.json)"
    # (safetensors: an 8-byte little-endian header length, then the JSON header)
    framed = len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 27
    if p.suffix.lower() == ".safetensors" or framed:
        return f"a safetensors file: {hf_dir}"
    if head[:2] == b"PK" or head[:1] == b"\x80":  # (torch.save's zip format, or a pickle)
        if p.name.startswith("pytorch_model"):
            return f"a Hugging Face weights file: {hf_dir}"
        return "torch.save files: use from-torch"
    if p.suffix.lower() in (".yaml", ".yml"):
        return "name the checkpoint; a command that converts its config takes it as --config FILE"
    return "name a checkpoint file (.mdl)"


def open_read(path: str | Path) -> h5py.File:
    """Open a checkpoint read-only, turning h5py's errors into one-line ones."""
    p = Path(path)
    check_file(p)
    try:
        with open(p, "rb") as fh:
            head = fh.read(9)
    except OSError as exc:
        raise CkptIOError.reading(p, exc) from None
    if not h5py.is_hdf5(str(p)):
        hint = "an empty file" if not head else "not an HDF5 file"
        raise NotACheckpointError(p, f"{hint}, so not a Cerebras H5 checkpoint", _fix_for(p, head))
    forbid_plugin_loading()
    try:
        # No chunk cache: tensors are read whole, and the upgrade path reads no data at all.
        f = h5py.File(p, "r", locking=False, rdcc_nbytes=0)
    except OSError as exc:
        raise _unopenable(p, exc) from None
    return bounded_metadata_cache(f)


# HDF5's words for a file shorter than its superblock records (h5py: "Unable to ... open file").
_TRUNCATED = re.compile(r"truncated file: eof = (\d+),.*stored_eof = (\d+)")


def _unopenable(path: Path, exc: OSError) -> CkptError:
    """A one-line error for an HDF5 file h5py will not open: a truncated one in plain words."""
    cut = _TRUNCATED.search(str(exc))
    if cut is not None:
        have, want = (int(n) for n in cut.groups())
        return CorruptCheckpointError(
            path,
            f"is truncated: it holds {have:,} of the {want:,} bytes its HDF5 header records "
            "(a copy or a save that did not finish)",
            "copy it again from where it was saved, or use another copy",
        )
    if "file locking flag values don't match" in str(exc):  # HDF5 shares one open per process
        return UsageError(
            path,
            "is already open in this process (an h5py.File) with other HDF5 file-locking settings",
            f"close that h5py.File first, or open it as h5py.File({str(path)!r}, 'r', "
            "locking=False)",
        )
    return CorruptCheckpointError(
        path,
        f"HDF5 file cannot be opened ({hdf5_reason(exc)})",
        "the file is probably truncated or corrupted; use another copy",
    )


# What h5py raises when a file's HDF5 structures are damaged (a bad signature, an address past
# the end, a truncated heap, an undecodable chunk or string type): it wraps HDF5's error stack
# in these, and an exception raised inside an HDF5 iteration callback comes back as SystemError.
DAMAGED_HDF5 = (OSError, RuntimeError, SystemError, KeyError, ValueError, TypeError)


def damaged(path: Path, exc: BaseException) -> CorruptCheckpointError:
    """A one-line error for a checkpoint whose HDF5 structures cannot be read."""
    return CorruptCheckpointError(
        path,
        f"HDF5 structures are damaged ({hdf5_reason(exc)})",
        "the file is probably truncated or corrupted; use another copy",
    )


def hdf5_reason(exc: BaseException) -> str:
    """HDF5's own words for what it could not do: its message from the first parenthesis."""
    said = str(exc).strip("'\"")  # (a ``KeyError`` quotes its message)
    text = said.split("(", 1)[-1].rstrip(")") if "(" in said else said
    return " ".join(text.split())[:200]


def attr_text(value: Any) -> str:
    """A string attribute as ``str`` (h5py may return bytes or a 0-d/1-element array)."""
    if isinstance(value, np.ndarray):
        value = value.item() if value.size == 1 else value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return value
    raise TypeError(f"expected a string attribute, found {type(value).__name__}")


def attr_bool(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        value = value.item()
    return bool(value)


def attr_python(value: Any) -> Any:
    """An attribute as plain Python: numpy scalars to int/float/bool, arrays to lists."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return (
            [attr_python(v) for v in value.tolist()] if value.dtype.kind == "O" else value.tolist()
        )
    if isinstance(value, np.generic):
        return value.item()
    return value


class H5Handle:
    """One lazily opened, shared read-only handle per checkpoint file.

    Tensor leaves keep a reference to it; nothing is opened until data is read.
    """

    def __init__(self, path: str | Path, file: h5py.File | None = None):
        self.path = Path(path)
        self._file = file
        self._lock = threading.Lock()
        # What must end before any data is read: the rest of the file's preflight walk (its
        # chunk indexes), with ``wait()`` (raises on a problem) and ``cancel()``.
        self.pending: Any = None
        self._pending_lock = threading.Lock()
        self._addresses: dict[str, int] | None = None
        # Where ``addresses()`` may take them instead of walking the links: the preflight
        # walk's (``Findings.links``), a callable giving them, or None where it cannot.
        self.links_found: Callable[[], dict[str, int] | None] | None = None
        # The root's attributes as a ``rootdigest.RootDigest``, taken by the reader when asked
        # (``read_checkpoint(root_digest=True)``): a root edit's verification compares with it.
        self.root_digest: Any = None
        # Told of the long reads of the root (``read_checkpoint(progress=...)``)
        self.progress: Progress | None = None
        # The size of the root's ``__spec__`` text in bytes, as a format 0.5 reader read it.
        self.spec_bytes: int | None = None
        # An outline read's scan of the datasets' storage, still running in its preflight
        # child (``read_checkpoint(storage_scan=True)``): a ``preflight.Rest``.
        self.storage: Any = None
        # The file's identity once it was let go of (``let_go``): it must be the file opened again.
        self._identity: tuple[int, ...] | None = None

    def addresses(self) -> dict[str, int]:
        """``object_addresses`` of the file, read once per handle: an upgrade's edit and its
        verification both need them (an outline read, whose root holds leaves' datasets only,
        takes them from its one pass over the links: ``known_addresses``; a full read from
        the preflight walk's: ``links_found``)."""
        with self._lock:
            cached = self._addresses
            found, self.links_found = self.links_found, None
        if cached is None:
            cached = (found() if found is not None else None) or object_addresses(self.file())
            with self._lock:
                self._addresses = cached
        return cached

    def known_addresses(self, addresses: dict[str, int]) -> None:
        """Take ``addresses`` as ``addresses()``'s answer: every hard link of the file."""
        with self._lock:
            self._addresses = addresses

    def root_addresses(self) -> dict[str, int]:
        """``addresses()`` of the root's own links (none of a group's members)."""
        return {name: at for name, at in self.addresses().items() if "/" not in name}

    def forget_addresses(self) -> None:
        """Let go of ``addresses()``'s answer (20 MiB at 150k links): asked again, it is read
        again."""
        with self._lock:
            self._addresses = None

    @property
    def knows_addresses(self) -> bool:
        with self._lock:
            return self._addresses is not None

    def walked(self) -> None:
        """Wait for the rest of the preflight walk, if it still runs (``read_checkpoint``
        with ``defer_chunks``): every read of data waits for its verdict."""
        with self._pending_lock:
            pending, self.pending = self.pending, None
            if pending is not None:
                pending.wait()

    def ready_to_read(self) -> None:
        """``walked()``, then the map of the stored data that overlaps other data
        (``overlaps.shared_starts``) that the first read's check of its chunks would make:
        made now, by a caller that holds less now than while it reads (the map's making took
        21 MiB more than it keeps at 150k tensors, issue 33)."""
        self.walked()
        overlaps.shared_starts(self.file(), self.progress)

    def storage_scanned(self) -> bool:
        """Whether the preflight child's scan of the datasets' storage (``H5Handle.storage``)
        found nothing a copy would carry out of the file. False when none ran, or it found
        something, stalled or died: the caller then scans itself, and names what it finds."""
        with self._pending_lock:
            rest, self.storage = self.storage, None
        if rest is None:
            return False
        try:
            return rest.finish(self.path) is not None
        except CkptError:
            return False

    def file(self) -> h5py.File:
        with self._lock:
            if self._file is None or not self._file.id.valid:
                f = open_read(self.path)
                if self._identity is not None and _identity(f) != self._identity:
                    f.close()
                    raise CorruptCheckpointError(
                        self.path, "the file was replaced while it was read", "run it again"
                    )
                self._file = f
            return self._file

    def let_go(self) -> None:
        """Close the file until it is next needed (``file`` opens it again, and refuses a file
        that replaced it): HDF5's caches of it, its root's heap of names among them, were 23
        MiB of the 150k-tensor rewrite's peak, which its output's read-back reached (issue
        33)."""
        with self._lock:
            if self._file is not None and self._file.id.valid:
                self._identity = _identity(self._file)
                self._file.close()
            self._file = None
        capi.garbage_collect()

    def dataset(self, name: str) -> h5py.Dataset:
        self.walked()
        try:
            obj = self.file()[name]
        except KeyError:
            raise CorruptCheckpointError(
                self.path, f"dataset {name!r} has gone from the file", "was it modified?"
            ) from None
        if not isinstance(obj, h5py.Dataset):
            raise CorruptCheckpointError(self.path, f"{name!r} is a group, expected a dataset")
        return obj

    def dataset_id(self, name: str) -> h5py.h5d.DatasetID:
        """``dataset(name).id`` without the ``Dataset`` and ``File`` objects h5py builds on a
        lookup through a group (about 60 µs of the 100 µs it costs)."""
        self.walked()
        try:
            oid = h5py.h5o.open(self.file().id, name.encode())
        except KeyError:
            raise CorruptCheckpointError(
                self.path, f"dataset {name!r} has gone from the file", "was it modified?"
            ) from None
        if not isinstance(oid, h5py.h5d.DatasetID):
            raise CorruptCheckpointError(self.path, f"{name!r} is not a dataset")
        return oid

    def read_dataset(self, name: str) -> np.ndarray:
        dsid = self.dataset_id(name)
        arr = read_whole(dsid, self.path, name)
        if arr is None:
            arr = np.asarray(read_slab(self.dataset(name), ()))
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        return arr

    def close(self) -> None:
        with self._pending_lock:
            pending, self.pending = self.pending, None
            storage, self.storage = self.storage, None
        for running in (pending, storage):
            if running is not None:
                running.cancel()
        with self._lock:
            if self._file is not None and self._file.id.valid:
                self._file.close()
            self._file = None


def _identity(f: h5py.File) -> tuple[int, ...]:
    return file_identity(f.id.get_vfd_handle())


def link_names(
    f: h5py.File, each: Callable[[bytes, h5py.h5l.LinkInfo], object] | None = None
) -> frozenset[str]:
    """The names of the root's links (``each`` called with every one), in HDF5's own order
    (by name, HDF5 first sorts every link of a group: seconds at 150k), no object opened:
    ``H5Literate`` reads the links alone, where ``H5Lvisit`` reads every object's header to
    find the groups to descend into."""
    names: list[bytes] = []

    def take(name: bytes, info: h5py.h5l.LinkInfo) -> None:
        names.append(name)
        if each is not None:
            each(name, info)

    f.id.links.iterate(take, info=True, order=h5py.h5.ITER_NATIVE)
    return frozenset(n.decode("utf-8", "surrogateescape") for n in names)


def root_addresses(f: h5py.File) -> tuple[frozenset[str], dict[str, int]]:
    """``link_names`` of the root, and ``object_addresses`` of its hard links, in one pass
    (no object header read, where ``H5Lvisit`` reads each one to find groups): a format 0.5
    file's tensors."""
    found: dict[str, int] = {}

    def take(name: bytes, info: h5py.h5l.LinkInfo) -> None:
        if info.type == h5py.h5l.TYPE_HARD:
            found[name.decode("utf-8", "surrogateescape")] = info.u

    return link_names(f, take), found


def object_addresses(group: h5py.Group) -> dict[str, int]:
    """The object each hard link under ``group`` names, by its address in the file, from the
    links alone (no object is opened: an upgrade checks one per tensor).

    A tensor of a copy or clone of a file that names the object at the source dataset's
    address *is* that stored object: same header, so same type, shape, layout and chunk index,
    all of them the source's bytes, as is the data they point to."""
    found: dict[str, int] = {}

    def visit(name: bytes, info: h5py.h5l.LinkInfo) -> None:
        if info.type == h5py.h5l.TYPE_HARD:
            found[name.decode("utf-8", "surrogateescape")] = info.u

    group.id.links.visit(visit, info=True)
    return found


def prefetch(path: Path, addresses: list[int]) -> None:
    """Ask the kernel to read the blocks at ``addresses`` (object headers) now, all at once:
    HDF5 then finds them in the page cache instead of waiting for each in turn (on a file
    whose pages are not cached, such as a fresh clone, 60 % of the time of linking 2,000
    datasets). Only a hint: errors are ignored."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        for address in sorted(addresses):
            os.posix_fadvise(fd, address & ~4095, 8192, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_dataset(group: h5py.Group, name: str) -> h5py.Dataset | None:
    """``group.get(name)`` if it is a dataset, None if there is nothing of that name, without
    the ``File`` object h5py builds on every lookup (half of its 90 µs; a checkpoint has
    thousands of datasets). Anything else there is damage: a dataset whose dataspace message's
    type was changed in its unchecksummed header reads as a named datatype (issue #36)."""
    try:
        oid = h5py.h5o.open(group.id, name.encode())
    except KeyError:
        return None
    if isinstance(oid, h5py.h5d.DatasetID):
        return h5py.Dataset(oid)
    kind = "group" if isinstance(oid, h5py.h5g.GroupID) else "named datatype"
    raise CorruptCheckpointError(
        group.file.filename,
        f"{name!r} is a {kind} where a dataset belongs",
        "the file is damaged; use another copy",
    )


def read_slab(ds: h5py.Dataset, sl: tuple[slice, ...]) -> Any:
    """``ds[sl]`` (the whole dataset for ``()``), the one place tensor data is decoded. The
    chunks it needs are checked first (``h5.chunks``: index entries and frames agree with the
    dataset's shape), so it returns only bytes a filter produced; stored data that cannot be
    decoded is a one-line error naming the file, the dataset (and the chunk)."""
    try:
        chunks.check_read(ds.id, sl)
        out = rowreads.slab(ds.id, sl) if ds.dtype.kind in _PLAIN else None
        return (ds[sl] if sl else ds[()]) if out is None else out
    except DAMAGED_HDF5 as exc:
        raise _undecodable(ds.file.filename, ds.name.lstrip("/"), exc) from None


def read_whole(
    dsid: h5py.h5d.DatasetID, path: str | Path, name: str, max_bytes: int | None = None
) -> np.ndarray | None:
    """``read_slab`` of the whole dataset ``dsid`` (``name`` in ``path``), as an array, where it
    holds numbers or booleans, read by HDF5 straight into an array of its type: the same checks
    and the same values, without the ``Dataset``, selection and reader objects h5py builds
    around a read (about 0.1 ms a tensor: a sixteenth of a 15k-tensor export, issue 33). None
    for anything else (strings, compound and empty types, no elements, a type or space h5py
    cannot describe, more than ``max_bytes``): read it by ``read_slab``, which names what is
    wrong."""
    try:
        dtype, shape = dsid.dtype, dsid.shape
    except DAMAGED_HDF5:
        return None
    if dtype.kind not in _PLAIN or dtype.fields is not None or shape is None or 0 in shape:
        return None
    if max_bytes is not None and math.prod(shape) * dtype.itemsize > max_bytes:
        return None
    check_whole(dsid, path, name)
    try:
        out = np.empty(shape, dtype)
        rowreads.read_rows(dsid, out)
    except DAMAGED_HDF5 as exc:
        raise _undecodable(path, name, exc) from None
    return out


def check_whole(dsid: h5py.h5d.DatasetID, path: str | Path, name: str) -> None:
    """The check ``read_whole`` makes of every chunk of ``dsid`` before it decodes them
    (``h5.chunks``), and names as it does: for a caller that compares their stored bytes."""
    try:
        chunks.check_read(dsid, ())
    except DAMAGED_HDF5 as exc:
        raise _undecodable(path, name, exc) from None


_PLAIN = frozenset("biufc")


def _undecodable(path: str | Path, name: str, exc: BaseException) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        path,
        f"cannot read dataset {name!r} ({hdf5_reason(exc)})",
        "the file may be damaged; use another copy",
    )


def iter_slabs(shape: tuple[int, ...], itemsize: int) -> Iterator[tuple[slice, ...]]:
    """Slices along the first axis, each holding at most about COPY_BLOCK_BYTES."""
    if not shape:
        yield ()
        return
    row = max(1, math.prod(shape[1:]) * itemsize)
    step = max(1, COPY_BLOCK_BYTES // row)
    for start in range(0, shape[0], step):
        yield (slice(start, min(start + step, shape[0])),)
