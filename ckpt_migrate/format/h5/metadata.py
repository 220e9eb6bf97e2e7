"""Where a file's HDF5 metadata lies: the extents of its object headers, their continuation
blocks, the version-1 B-tree nodes of its chunk indexes and symbol tables, the symbol table
nodes and local heaps, and the global heap collections that the variable-length attributes of
its version-1 headers use (HDF5 file format specification 3.0, sections II–IV).

Tensor data never lies inside metadata. A contiguous dataset's address is eight bytes of an
object header that carries no checksum (version 1, what every release writes through h5py's
default ``libver``); one changed byte moves the data anywhere, and where it lands inside a
B-tree node's unused entries it reads as zeros, with no error (issue #36: the fuzz benchmark's
``model.scale``). ``h5.overlaps`` adds these extents to the data's, so that data starting inside
metadata is refused like data starting inside other data.

Only what this module knows is mapped: superblock versions 0–3 with 8-byte offsets and lengths,
object header versions 1 and 2 (read by ``h5.headers``), data layout message version 3,
version-1 B-trees. Anything else (dense attribute or link storage, the newer chunk indexes, a
structure that does not parse or whose checksum fails) is left out, so the map can miss metadata
but never claims data. Global heap collections no mapped structure names are found between the
extents known, by their headers (``unreferenced_collections``). Every read lies inside the
file, all of them together stay under twice its size, and the count of structures by what the
file's size can hold. Each object is visited once, and each node of a group's structures; the
nodes of one object (its header's blocks, its chunk index) are remembered only while it is
read: a set of every node the map had visited was 17.6 MiB at 150k tensors, the peak of
``verify`` then (issue 33).
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Collection

import h5py
import numpy as np

from ckpt_migrate.format.h5.attrtable import elements, message_fields
from ckpt_migrate.format.h5.headers import SHARED, Header, HeaderError, read_header
from ckpt_migrate.format.h5.identity import hdf5_file
from ckpt_migrate.format.progress import Count, Progress

_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_LAYOUT, _SYMBOL_TABLE, _ATTRIBUTE, _BTREE_K = 0x08, 0x11, 0x0C, 0x13
_VLEN_CLASS = 9
_VLEN_REF = struct.Struct("<IQI")  # an element's length, global heap collection, object index
_TREE_HEAD = 24  # "TREE", type, level, entries used, left and right siblings
_COLLECTION_MIN = 4096  # HDF5 makes no global heap collection smaller (H5HG_MINSIZE)
_SCAN_BLOCK = 4 << 20
_ENTRY = 40  # a symbol table entry
_CHUNKED = 2
_UNDEFINED = (1 << 64) - 1


class _Stop(Exception):
    """A structure this module does not know or that does not parse: mapped no further."""


class _File:
    """Bounded reads of one file, and the extents found so far (their starts and ends as
    arrays: a pair of ints each was 48 bytes, 36 MB at 150k tensors)."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self.starts, self.ends = array("Q"), array("Q")
        self.seen: set[int] = set()  # (the nodes of groups' structures)
        self.limit = size // 8 + 16  # no more structures than the file can hold
        self.budget = self.limit
        # every structure is read once and none overlaps another, so a file that makes this
        # read more than twice its size (nodes claiming the rest of the file) is not mapped on
        self.unread = 2 * size + (1 << 20)

    def read(self, at: int, n: int) -> bytes:
        self.unread -= max(n, 0)
        if at < 0 or n < 0 or at + n > self.size or self.unread < 0:
            raise _Stop
        data = os.pread(self.fd, n, at)
        if len(data) != n:
            raise _Stop
        return data

    def first_visit(self, at: int, seen: set[int]) -> bool:
        if at in seen:
            return False
        self.spend()
        seen.add(at)
        return True

    def spend(self) -> None:
        """Count one more structure against what the file's size can hold."""
        self.budget -= 1
        if self.budget < 0:
            raise _Stop

    def add(self, at: int, n: int) -> None:
        if n > 0:
            self.starts.append(at)
            self.ends.append(min(at + n, _UNDEFINED))


class _Sizes:
    """The superblock's B-tree constants (defaults of the specification unless it says)."""

    group_leaf_k = 4
    group_internal_k = 16
    chunk_k = 32


def sorted_once(values: np.ndarray) -> np.ndarray:
    """``values`` sorted, each once: ``np.unique``, without the ``numpy.ma`` it imports on
    first use (its objects, made amid a 150k-tensor tree, kept that tree's memory from being
    given back; issue 33)."""
    values = np.sort(values)
    if len(values) < 2:
        return values
    return values[np.concatenate(([True], values[1:] != values[:-1]))]


def metadata_extents(
    f: h5py.File, objects: Collection[int], progress: Progress | None = None
) -> tuple[array, array]:
    """The starts and ends of the metadata of ``f`` that belongs to the superblock and to the
    objects at the addresses ``objects`` (their headers, chunk indexes and group structures),
    each address once; ``progress`` hears of them as ``check overlaps`` (9 s at 150k tensors
    on a slow machine)."""
    with hdf5_file(f.id) as fd:
        mapped = _File(fd, os.fstat(fd).st_size)
        try:
            sizes = _superblock(mapped)
        except _Stop:
            return array("Q"), array("Q")
        once = array("Q", sorted_once(np.fromiter(objects, np.uint64, len(objects))).tobytes())
        count = Count(progress, "check overlaps", len(once), 1000)
        for address in once:
            count()
            try:
                _object(mapped, address, sizes)
            except _Stop:
                continue
        count.end()
        return mapped.starts, mapped.ends


def _superblock(m: _File) -> _Sizes:
    """The superblock at offset 0 (no user block: h5py's default), its extent and constants."""
    head = m.read(0, 24)
    if head[:8] != _SIGNATURE:
        raise _Stop
    sizes = _Sizes()
    version = head[8]
    if version in (0, 1):
        if head[13] != 8 or head[14] != 8:
            raise _Stop
        sizes.group_leaf_k, sizes.group_internal_k = struct.unpack_from("<HH", head, 16)
        at = 24
        if version == 1:
            sizes.chunk_k = struct.unpack("<H", m.read(24, 2))[0]
            at = 28
        m.add(0, at + 4 * 8 + _ENTRY)  # four addresses, the root group's symbol table entry
    elif version in (2, 3):
        if head[9] != 8 or head[10] != 8:
            raise _Stop
        extension = struct.unpack("<Q", m.read(20, 8))[0]
        m.add(0, 12 + 4 * 8 + 4)
        if extension != _UNDEFINED:
            for kind, flags, body in _header(m, extension).messages:
                if kind == _BTREE_K and not flags & SHARED and len(body) >= 7:
                    sizes.chunk_k, sizes.group_internal_k, sizes.group_leaf_k = struct.unpack_from(
                        "<HHH", body, 1
                    )
    else:
        raise _Stop
    if min(sizes.group_leaf_k, sizes.group_internal_k, sizes.chunk_k) == 0:
        raise _Stop
    return sizes


def _object(m: _File, address: int, sizes: _Sizes) -> None:
    """One object's header and what its messages point at."""
    header = _header(m, address)
    for kind, flags, body in header.messages:
        if flags & SHARED:  # (a reference to a message stored elsewhere)
            continue
        if kind == _LAYOUT and len(body) >= 11 and body[0] == 3 and body[1] == _CHUNKED:
            rank = body[2]
            tree = struct.unpack_from("<Q", body, 3)[0]
            if tree != _UNDEFINED:  # (its nodes remembered while it is walked)
                _btree(m, tree, 1, 8 + 8 * rank, sizes.chunk_k, sizes, 0, set())
        elif kind == _SYMBOL_TABLE and len(body) >= 16:
            tree, heap = struct.unpack_from("<QQ", body)
            _local_heap(m, heap)
            _btree(m, tree, 0, 8, sizes.group_internal_k, sizes, 0, m.seen)
        elif kind == _ATTRIBUTE and not header.checksummed:
            # (a checksummed header's addresses cannot have moved unnoticed: HDF5 verifies
            # it, and the attribute messages of the 150k-tensor files this tool writes are a
            # million, 1.5 s to look through)
            _vlen_heaps(m, body)


def _header(m: _File, address: int) -> Header:
    """The object header at ``address`` (continuation blocks followed), each block's extent
    recorded. Each address comes once (``metadata_extents``); its blocks are remembered while
    it is read."""
    m.spend()
    try:
        header = read_header(m.read, address, set(), m.limit)
    except HeaderError:
        raise _Stop from None
    for at, n in header.blocks:
        m.add(at, n)
    return header


def _btree(
    m: _File, at: int, kind: int, key: int, k: int, sizes: _Sizes, depth: int, seen: set[int]
) -> None:
    """A version-1 B-tree node (type 0: a group's, type 1: a chunk index's) and its subtree,
    each node once of those ``seen``; a node takes room for 2K children and 2K + 1 keys
    whatever it holds."""
    if depth > 64 or not m.first_visit(at, seen):
        return
    head = m.read(at, _TREE_HEAD)
    if head[:4] != b"TREE" or head[4] != kind:
        raise _Stop
    level, used = head[5], struct.unpack_from("<H", head, 6)[0]
    if used > 2 * k:
        raise _Stop
    m.add(at, _TREE_HEAD + 2 * k * 8 + (2 * k + 1) * key)
    body = m.read(at + _TREE_HEAD, used * (key + 8))
    children = [struct.unpack_from("<Q", body, i * (key + 8) + key)[0] for i in range(used)]
    for child in children:
        if level > 0:
            _btree(m, child, kind, key, k, sizes, depth + 1, seen)
        elif kind == 0:
            _symbol_node(m, child, sizes)
        # a chunk index's leaves point at chunks: data, which h5.overlaps has


def _symbol_node(m: _File, at: int, sizes: _Sizes) -> None:
    if not m.first_visit(at, m.seen):
        return
    if m.read(at, 4) != b"SNOD":
        raise _Stop
    m.add(at, 8 + 2 * sizes.group_leaf_k * _ENTRY)


def _vlen_heaps(m: _File, body: bytes) -> None:
    """The global heap collections (§III.E) a variable-length attribute's elements lie in,
    each once, whole: HDF5 makes a collection of 4 KiB or more for a few short strings and
    leaves the rest zeros (the real 2.10 library's ``dtypes``), so a contiguous address moved
    there reads zeros with no error."""
    try:
        _, _, type_at, type_n, space_at, space_n, data_at = message_fields(body)
        if type_n < 8 or body[type_at] & 0x0F != _VLEN_CLASS:
            return
    except (struct.error, IndexError):
        return
    count = elements(body[space_at : space_at + space_n])
    if count is None:
        return
    for i in range(min(count, (len(body) - data_at) // _VLEN_REF.size)):
        at = _VLEN_REF.unpack_from(body, data_at + i * _VLEN_REF.size)[1]
        if at in (0, _UNDEFINED) or not m.first_visit(at, m.seen):
            continue
        head = m.read(at, 16)
        size = struct.unpack_from("<Q", head, 8)[0]
        if head[:4] != b"GCOL" or size < 16:
            raise _Stop
        m.add(at, size)


def _local_heap(m: _File, at: int) -> None:
    if not m.first_visit(at, m.seen):
        return
    head = m.read(at, 32)
    if head[:4] != b"HEAP":
        raise _Stop
    size, _, data = struct.unpack_from("<QQQ", head, 8)
    m.add(at, 32)
    if data != _UNDEFINED and data + size <= m.size:
        m.add(data, size)


def unreferenced_collections(
    f: h5py.File, starts: np.ndarray, ends: np.ndarray
) -> tuple[array, array]:
    """The extents of the global heap collections (§III.E) that lie where none of the extents
    ``starts``/``ends`` (the file's mapped metadata and its data) does: those no structure
    mapped names, such as one HDF5 left whole when it freed its objects (the real 2.10
    library writes ``__spec__`` more than once; a root edit's rewrite of it leaves the old
    one) or those of a dense root's attributes, which are not mapped. A contiguous address
    moved into one reads its old bytes with no error (``fuzz_damage --wide``, seed 52100,
    case 150). HDF5 allocates from the start of free space, so a collection whose
    signature is still there had nothing allocated over it. Each is taken only where its
    header reads as one (signature, version, a size of at least 4 KiB inside the file, its
    first object's header), and claimed whole; the bytes read are those of the gaps."""
    found_starts, found_ends = array("Q"), array("Q")
    with hdf5_file(f.id) as fd:
        size = os.fstat(fd).st_size
        claimed = 0
        for lo, hi in _gaps(starts, ends, size):
            at = max(lo, claimed)
            while at + 16 <= hi:
                # (three bytes more: a signature across the block's end)
                block = os.pread(fd, min(_SCAN_BLOCK, hi - at) + 3, at)
                if not block:
                    break
                end = min(hi, at + max(1, len(block) - 3))
                i = block.find(b"GCOL")
                while i >= 0 and at + i < end:
                    length = _collection_length(fd, at + i, size)
                    if length is None:
                        i = block.find(b"GCOL", i + 1)
                        continue
                    found_starts.append(at + i)
                    found_ends.append(at + i + length)
                    claimed = at + i + length
                    i = block.find(b"GCOL", i + length) if claimed < end else -1
                at = max(end, claimed)
    return found_starts, found_ends


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The extents ``[start, end)`` sorted and merged where they touch or overlap (as
    ``splitcopy.merge_spans``, in numpy): the starts and ends of the runs."""
    if not len(starts):
        return starts[:0], ends[:0]
    order = np.argsort(starts, kind="stable")
    low, reach = starts[order], np.maximum.accumulate(ends[order])
    first = np.flatnonzero(np.concatenate(([True], low[1:] > reach[:-1])))
    return low[first], reach[np.append(first[1:] - 1, len(low) - 1)]


def _gaps(starts: np.ndarray, ends: np.ndarray, size: int) -> list[tuple[int, int]]:
    """Where in ``[0, size)`` none of the extents lies (a damaged one may lie past the end)."""
    low, high = union(starts, ends)
    edges = [0, *np.column_stack((low, high)).ravel().tolist(), size]  # 0, run, run, ..., size
    pairs = zip(edges[::2], edges[1::2], strict=True)
    return [(a, min(b, size)) for a, b in pairs if a < min(b, size)]


def _collection_length(fd: int, at: int, size: int) -> int | None:
    """The size of the global heap collection at ``at``, if one is there: its header, and its
    first object's (index, reference count, four reserved zero bytes, a size inside the
    collection; object 0 is the free space, which fills the rest). Only the first is read:
    following every object of the 5,892 collections of a 150k-tensor file took 2.6 s."""
    head = os.pread(fd, 32, at)
    if len(head) < 32 or head[:8] != b"GCOL\x01\x00\x00\x00":
        return None
    length = struct.unpack_from("<Q", head, 8)[0]
    if length < _COLLECTION_MIN or at + length > size:
        return None
    index, _refs, reserved, n = struct.unpack_from("<HHIQ", head, 16)
    if reserved or (n != length - 16 if index == 0 else 32 + n > length):
        return None
    return length
