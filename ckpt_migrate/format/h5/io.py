"""Thin h5py helpers: opening files with one-line errors, decoding attributes, copying data.

Importing this module registers the hdf5plugin filters (real checkpoints use LZ4, filter 32004).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numpy as np

from ckpt_migrate.errors import CkptError, CkptIOError, CorruptCheckpointError, NotACheckpointError
from ckpt_migrate.format.h5 import chunks

LZ4_FILTER_ID = 32004
# Raw-chunk copy and slab streaming keep at most about this much tensor data in memory at once.
COPY_BLOCK_BYTES = 64 << 20


def lz4_options() -> dict[str, Any]:
    """Dataset-creation options of the real writers: hdf5plugin ``LZ4()``, cd_values (0,)."""
    return dict(hdf5plugin.LZ4())


def forbid_plugin_loading() -> None:
    """Remove every directory from HDF5's filter-plugin search path (set from
    ``HDF5_PLUGIN_PATH`` when the library starts), so that no filter code is ever loaded
    from the environment. Idempotent and cheap."""
    while h5py.h5pl.size():
        h5py.h5pl.remove(0)


def open_read(path: str | Path) -> h5py.File:
    """Open a checkpoint read-only, turning h5py's errors into one-line ones."""
    p = Path(path)
    if not p.exists():
        raise NotACheckpointError(p, "no such file", "check the path")
    if p.is_dir():
        raise NotACheckpointError(p, "is a directory, not a checkpoint file", "name a .mdl file")
    try:
        with open(p, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise CkptIOError(p, f"cannot read the file ({exc.strerror or exc})") from None
    if not h5py.is_hdf5(str(p)):
        hint = "an empty file" if not head else "not an HDF5 file"
        raise NotACheckpointError(
            p, f"{hint}, so not a Cerebras H5 checkpoint", "torch.save files: use from-torch"
        )
    forbid_plugin_loading()
    try:
        # No chunk cache: tensors are read whole, and the upgrade path reads no data at all.
        f = h5py.File(p, "r", locking=False, rdcc_nbytes=0)
    except OSError as exc:
        raise CorruptCheckpointError(
            p, f"HDF5 file cannot be opened ({_short(exc)})", "the file is probably truncated"
        ) from None
    return bounded_metadata_cache(f)


# What h5py raises when a file's HDF5 structures are damaged (a bad signature, an address past
# the end, a truncated heap, an undecodable chunk or string type): it wraps HDF5's error stack
# in these, and an exception raised inside an HDF5 iteration callback comes back as SystemError.
DAMAGED_HDF5 = (OSError, RuntimeError, SystemError, KeyError, ValueError, TypeError)


def damaged(path: Path, exc: BaseException) -> CorruptCheckpointError:
    """A one-line error for a checkpoint whose HDF5 structures cannot be read."""
    return CorruptCheckpointError(
        path,
        f"HDF5 structures are damaged ({_short(exc)})",
        "the file is probably truncated or corrupted; use another copy",
    )


METADATA_CACHE_MAX = 1 << 20
SYMBOL_TABLE_MESSAGE = 0x11  # (an old-style group's: the B-tree and local heap of its names)
MAX_NAME_HEAP = 256 << 20  # (a heap HDF5 would read whole anyway; the cap only lets it stay)


def bounded_metadata_cache(f: h5py.File, names: int | None = None) -> h5py.File:
    """Cap HDF5's metadata cache (32 MiB by default, per open file): an upgrade visits each
    object header once, so a bigger cache only makes memory grow with the tensor count.

    The cap counts the headers' on-disk bytes, not their decoded form in memory, which is
    several times larger: at 4 MiB the cache held every header of a 3,567-object checkpoint
    and the benchmark upgrade's peak RSS grew from 163 to 190 MiB from 1,552 to 2,832 tensors;
    at 1 MiB it is 142 MiB at both sizes, and no slower (256 KiB made the 6 GB patch slower).

    The cap leaves room, beyond that, for the root's heap of link names (``names`` bytes,
    by default ``root_name_heap``; a file being written passes 0 and leaves it, and the room
    for the group it fills, to ``GroupNameRoom``): h5py's
    default root keeps every name in one local heap, which HDF5 reads whole for each look-up by
    name; a cache smaller than the heap evicted and read it again on every look-up, 0.44 ms
    each at 62k links against 0.04 ms, so that a 50k-tensor upgrade spent most of its time
    there, quadratic in the tensor count (issue 33). No more room than that: the heap, used at
    every look-up, stays in it, and the headers keep the 1 MiB they had (room for twice the
    heap held 105 MiB more of headers at 62k objects)."""
    config = f.id.get_mdc_config()
    names = root_name_heap(f) if names is None else names
    config.max_size = METADATA_CACHE_MAX + names
    config.min_size = min(config.min_size, METADATA_CACHE_MAX)
    config.initial_size = min(config.initial_size, METADATA_CACHE_MAX)
    config.set_initial_size = True
    f.id.set_mdc_config(config)
    return f


class GroupNameRoom:
    """Room in ``f``'s metadata cache (``bounded_metadata_cache``) for the root's heap of link
    names (``root_heap`` bytes, measured elsewhere) and for the one of a group being filled,
    once the two no longer fit in the cache's 1 MiB: each link added dirties the group's heap,
    each look-up by name loads the root's, and a cache too small for both evicted one for the
    other, writing the group's whole and reading both again for the next link. A 50k-tensor
    copy-patch moved 359 GB through the page cache that way (79 GB of it written) and took
    105 s against 30 s (issue 33; benchmarks/README.md, eighth session).

    The group's heap is reckoned from the names added (each stored with its terminating zero,
    8-byte aligned; HDF5 doubles a full heap, so up to twice that), not asked of HDF5: the
    question walks the group's B-tree through the same cache, and the order HDF5 flushes its
    metadata in decides where it writes, so asking changed the bytes of outputs whose heaps
    fitted. Until they no longer fit, the cache (and so the file) stays as it was. The room
    follows the heap as it grows (every ``EVERY`` links), so that the object headers keep the
    1 MiB they have: room for the heap's final size from the start held 130 MiB more of them
    at 50k. A new-style group (``local`` false: its names in a fractal heap, found through a
    B-tree of their hashes, as ``create_wide_root`` makes one) is read block by block and
    needs none."""

    EVERY = 256

    def __init__(self, f: h5py.File, root_heap: int, *, local: bool) -> None:
        self._f, self._root, self._local = f, root_heap, local
        self._names = self._links = 0
        self._groups: set[str] = set()
        self._given = False

    def added(self, name: str) -> None:
        """Count the link ``name`` (a path from the group) adds; every ``EVERY``, fit the room."""
        if not self._local:
            return
        top, slash, _ = name.partition("/")
        if slash:  # a link into a group of the group: the group's own name, once
            if top in self._groups:
                return
            self._groups.add(top)
        self._names += (len(top.encode("utf-8", "surrogateescape")) + 8) // 8 * 8
        self._links += 1
        if self._links % self.EVERY == 0:
            heap = min(2 * self._names, MAX_NAME_HEAP)
            if self._given or self._root + heap > METADATA_CACHE_MAX:
                self._given = True
                bounded_metadata_cache(self._f, self._root + heap)


def root_name_heap(f: h5py.File, *, local_only: bool = False) -> int:
    """The bytes of the heap that holds the root group's link names (``H5Oget_info``'s
    ``meta_size.obj.heap_size``: an old-style group's local heap, a new-style one's fractal
    heap, or 0 for that with ``local_only``: it is read block by block), at most
    ``MAX_NAME_HEAP``."""
    try:
        info = h5py.h5o.get_info(f.id)
    except (OSError, RuntimeError, ValueError):  # (the readers name a damaged root)
        return 0
    if local_only and not info.hdr.mesg.present & 1 << SYMBOL_TABLE_MESSAGE:
        return 0
    return min(info.meta_size.obj.heap_size, MAX_NAME_HEAP)


def _short(exc: BaseException) -> str:
    text = str(exc).split("(", 1)[-1].rstrip(")") if "(" in str(exc) else str(exc)
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
        # The root's attributes as a ``rootdigest.RootDigest``, taken by the reader when asked
        # (``read_checkpoint(root_digest=True)``): a root edit's verification compares with it.
        self.root_digest: Any = None
        # The size of the root's ``__spec__`` text in bytes, as a format 0.5 reader read it.
        self.spec_bytes: int | None = None
        # An outline read's scan of the datasets' storage, still running in its preflight
        # child (``read_checkpoint(storage_scan=True)``): a ``preflight.Rest``.
        self.storage: Any = None

    def addresses(self) -> dict[str, int]:
        """``object_addresses`` of the file, read once per handle: an upgrade's edit and its
        verification both need them (an outline read, whose root holds leaves' datasets only,
        takes them from its one pass over the links: ``known_addresses``)."""
        with self._lock:
            cached = self._addresses
        if cached is None:
            cached = object_addresses(self.file())
            with self._lock:
                self._addresses = cached
        return cached

    def known_addresses(self, addresses: dict[str, int]) -> None:
        """Take ``addresses`` as ``addresses()``'s answer: every hard link of the file."""
        with self._lock:
            self._addresses = addresses

    def walked(self) -> None:
        """Wait for the rest of the preflight walk, if it still runs (``read_checkpoint``
        with ``defer_chunks``): every read of data waits for its verdict."""
        with self._pending_lock:
            pending, self.pending = self.pending, None
            if pending is not None:
                pending.wait()

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
                self._file = open_read(self.path)
            return self._file

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


def datasets_not_in(group: h5py.Group, used: set[str], *, recursive: bool) -> list[str]:
    """The datasets under ``group`` (its members, or with ``recursive`` everything below it)
    whose names are not in ``used``, sorted. Found from the links: only the names outside
    ``used`` are opened (``h5o.visit`` with object info cost 0.17 s on a file of 2,000 leaves,
    for the attribute counts it gathers)."""
    other: list[bytes] = []

    def take(name: bytes, info: h5py.h5l.LinkInfo) -> None:
        if info.type == h5py.h5l.TYPE_HARD and name.decode() not in used:
            other.append(name)

    if recursive:
        group.id.links.visit(take, info=True)
    else:
        group.id.links.iterate(take, info=True)
    return sorted(
        n.decode() for n in other if isinstance(h5py.h5o.open(group.id, n), h5py.h5d.DatasetID)
    )


def read_slab(ds: h5py.Dataset, sl: tuple[slice, ...]) -> Any:
    """``ds[sl]`` (the whole dataset for ``()``), the one place tensor data is decoded. The
    chunks it needs are checked first (``h5.chunks``: index entries and frames agree with the
    dataset's shape), so it returns only bytes a filter produced; stored data that cannot be
    decoded is a one-line error naming the file, the dataset (and the chunk)."""
    try:
        chunks.check_read(ds.id, sl)
        return ds[sl] if sl else ds[()]
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
    try:
        chunks.check_read(dsid, ())
        out = np.empty(shape, dtype)
        dsid.read(h5py.h5s.ALL, h5py.h5s.ALL, out)
    except DAMAGED_HDF5 as exc:
        raise _undecodable(path, name, exc) from None
    return out


_PLAIN = frozenset("biufc")


def _undecodable(path: str | Path, name: str, exc: BaseException) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        path,
        f"cannot read dataset {name!r} ({_short(exc)})",
        "the file may be damaged; use another copy",
    )


def filters_of(ds: h5py.Dataset) -> tuple:
    """The filter pipeline as comparable data: ((id, flags, cd_values), ...)."""
    plist = ds.id.get_create_plist()
    return tuple(
        (f[0], f[1], tuple(f[2]))
        for f in (plist.get_filter(i) for i in range(plist.get_nfilters()))
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
