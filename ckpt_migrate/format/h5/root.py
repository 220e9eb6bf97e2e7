"""Give an HDF5 file a new root group, by pointing its superblock at another group.

A copy-patch upgrade keeps the source file's root group, and files written by h5py's defaults
(every Cerebras checkpoint) have a version-1 object header there. Such a header keeps its
attributes as messages in a list that HDF5 searches on every insert and every look-up, so the
one attribute per leaf of format 0.5 costs O(n²): 1.0 s for 3,566 attributes, against 0.09 s
in a version-2 header, which moves them to indexed ("dense") storage past eight (measured with
``h5attrs.create``). Only a new group gets a version-2 header, and HDF5 has no call to make a
group the root, so the upgrade builds the new tree in a fresh group and then rewrites the one
superblock field that names the root. The old root and whatever only it reached stay in the
file unreachable, like any object HDF5 unlinks.

Superblock layouts: HDF5 File Format Specification 3.0, §II.A ("Disk Format: Level 0A - Format
Signature and Superblock"); the checksum of versions 2 and 3 is Bob Jenkins' lookup3
``hashlittle`` with seed 0 (H5checksum.c, ``H5_checksum_lookup3``).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import h5py
from h5py import h5f, h5g, h5o, h5p

from ckpt_migrate.format.h5 import capi
from ckpt_migrate.format.h5.metadata_cache import GroupNameRoom, bounded_metadata_cache
from ckpt_migrate.format.h5.writing import writing

SIGNATURE = b"\x89HDF\r\n\x1a\n"
FRESH_ROOT = "__ckpt_migrate_new_root__"


# An object that tracks the creation order of its attributes numbers them with 16 bits: the
# 65,536th fails ("attribute creation index can't be incremented"; H5O_MAX_CRT_ORDER_IDX,
# H5Oprivate.h), even after deletions (the index only grows). Format 0.5 has one root attribute
# per leaf, so a root of more leaves is created without that tracking, its header still of
# version 2 (attributes indexed by name in dense storage, O(log n) per insert). ORDER_HEADROOM
# leaves room for the root edits of later upgrades (each re-creates a few attributes).
MAX_TRACKED_ATTRIBUTES = 65_535
ORDER_HEADROOM = 1_024


def tracks_order(attributes: int) -> bool:
    """Whether a root that will hold ``attributes`` attributes tracks their creation order
    (every checkpoint of fewer than about 64k leaves: attributes list in the order written)."""
    return attributes <= MAX_TRACKED_ATTRIBUTES - ORDER_HEADROOM


def names_room(f: h5py.File, attributes: int, other_heap: int = 0) -> GroupNameRoom:
    """The ``GroupNameRoom`` of a root that ``create_file`` or ``create_fresh_root`` made for
    ``attributes`` attributes in ``f``: while it tracks their order it is an old-style group,
    its link names in one local heap (``other_heap``: the bytes of another such heap the
    writing looks names up in, in the same file)."""
    return GroupNameRoom(f, other_heap, local=tracks_order(attributes))


def create_fresh_root(f: h5py.File, attributes: int = 0) -> h5py.Group:
    """An empty group under the current root that can become the root, for ``attributes``
    attributes: tracking their creation order makes HDF5 give it a version-2 object header (and
    attributes then keep the order they were written in, as in the version-1 header of the real
    writer's files). Past ``tracks_order`` the group is the one ``create_wide_root`` made
    before ``f`` was opened."""
    if not tracks_order(attributes):
        return f[FRESH_ROOT]
    gcpl = h5p.create(h5p.GROUP_CREATE)
    gcpl.set_attr_creation_order(h5p.CRT_ORDER_TRACKED)
    return h5py.Group(h5g.create(f.id, FRESH_ROOT.encode(), gcpl=gcpl))


def create_wide_root(path: Path) -> None:
    """The fresh root of a root past ``tracks_order``, in the closed file ``path``: without
    creation order HDF5 gives a group a version-2 header only under a 1.8 lower format bound,
    which h5py sets only when opening a file (the superblock and every other object stay as
    they are)."""
    with writing(path, h5py.File(path, "r+", libver=("v108", "latest"), locking=False)) as f:
        f.create_group(FRESH_ROOT)


def _fapl(low: int) -> h5p.PropFAID:
    fapl = h5p.create(h5p.FILE_ACCESS)
    fapl.set_libver_bounds(low, h5f.LIBVER_LATEST)
    fapl.set_fclose_degree(h5f.CLOSE_STRONG)
    fapl.set_file_locking(False, True)
    return fapl


def create_file(path: Path, *, exclusive: bool, attributes: int = 0) -> h5py.File:
    """A new HDF5 file (h5py's defaults, no file locking) whose root group will hold
    ``attributes`` attributes, created the way ``create_fresh_root`` creates one, so that a
    checkpoint with many leaves writes its root attributes in O(n log n). Past
    ``tracks_order`` the file is created under the 1.8 lower bound (its superblock and root
    of version 2) and reopened under h5py's default bounds for the rest of the writing.

    Its metadata cache is capped as a reader's is (``bounded_metadata_cache``): each object
    header is written once, and HDF5's default cache (up to 32 MiB of metadata, several times
    that decoded) held 350 MB of a 150k-tensor rewrite's 1.1 GB (issue 33). What the cache
    evicts early is written early, and HDF5 places the root attributes' heap blocks, index
    nodes and strings as that order allows: where the metadata outgrows the cap, the datasets
    lie where they did, byte for byte, and the root's attributes, the same, are laid out
    otherwise (a 12k-tensor rewrite: the last quarter of the file)."""
    fcpl = h5p.create(h5p.FILE_CREATE)
    mode = h5f.ACC_EXCL if exclusive else h5f.ACC_TRUNC
    name = os.fsencode(path)
    if tracks_order(attributes):
        fcpl.set_attr_creation_order(h5p.CRT_ORDER_TRACKED)
        fid = h5f.create(name, mode, fapl=_fapl(h5f.LIBVER_EARLIEST), fcpl=fcpl)
    else:
        h5f.create(name, mode, fapl=_fapl(h5f.LIBVER_V18), fcpl=fcpl).close()
        fid = h5f.open(name, h5f.ACC_RDWR, fapl=_fapl(h5f.LIBVER_EARLIEST))
    return bounded_metadata_cache(h5py.File(fid), 0)


def root_metadata_bytes(f: h5py.File) -> int:
    """The root group's header, its attributes' heap and their index, in bytes."""
    info = h5o.get_info(f.id)
    return info.hdr.space.total + info.meta_size.attr.index_size + info.meta_size.attr.heap_size


def object_address(obj: h5py.Group | h5py.File) -> int:
    return h5o.get_info(obj.id).addr


def switch_root(path: Path, superblock_at: int, old: int, new: int, fd: int | None = None) -> None:
    """Make the group whose object header is at ``new`` the root of the closed file ``path``,
    whose superblock starts at ``superblock_at`` and names the root ``old`` (``fd``: open on it
    for writing, left open).

    Refuses (ValueError) a superblock it does not know or that does not name ``old``."""
    own = fd is None
    if fd is None:
        fd = os.open(path, os.O_RDWR)
    try:
        head = os.pread(fd, 128, superblock_at)
        if head[:8] != SIGNATURE:
            raise ValueError(f"no HDF5 superblock at byte {superblock_at}")
        at, size = root_field(head)
        _check(head, at, size, old)
        if head[8] in (0, 1):
            # Address, then cache type 0 ("nothing cached"), reserved word and scratch-pad: the
            # entry HDF5 itself writes for a root without a cached symbol table.
            os.pwrite(fd, new.to_bytes(size, "little") + bytes(24), superblock_at + at)
        else:
            body = head[:at] + new.to_bytes(size, "little")
            os.pwrite(fd, body[at:] + struct.pack("<I", lookup3(body)), superblock_at + at)
    finally:
        if own:
            os.close(fd)


def root_field(head: bytes) -> tuple[int, int]:
    """Where a superblock (its first bytes ``head``) names the root group's object header:
    (the field's offset in the superblock, the file's size of offsets). Versions 0-1 name it
    in the root's symbol table entry, 2-3 directly; ValueError for any other."""
    version = head[8]
    if version in (0, 1):
        size = head[13]
        return 24 + (4 if version == 1 else 0) + 5 * size, size
    if version in (2, 3):
        size = head[9]
        return 12 + 3 * size, size
    raise ValueError(f"superblock version {version} is not known")


def _check(head: bytes, at: int, size: int, old: int) -> None:
    named = int.from_bytes(head[at : at + size], "little")
    if named != old:
        raise ValueError(f"the superblock names root {named:#x}, expected {old:#x}")


def superblock_offset(f: h5py.File) -> int:
    """Where the superblock starts: right after the user block."""
    return f.id.get_create_plist().get_userblock()


def root_header(f: h5py.File) -> tuple[int, int] | None:
    """(the root's object header address, the superblock's base) of ``f`` for the readers of
    the file's bytes (``attrtable``, ``linktable``): None unless it is open by HDF5's default
    driver with the 8-byte offsets and lengths they read."""
    if f.driver != "sec2" or f.id.get_create_plist().get_sizes() != (8, 8):
        return None
    return h5o.get_info(f.id).addr, superblock_offset(f)


_MASK = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK


def lookup3(data: bytes, seed: int = 0) -> int:
    """Bob Jenkins' ``hashlittle`` (lookup3.c), the checksum of HDF5's version-2+ metadata: by
    HDF5's own function where the library exports it (``capi``), else here (1 µs per 12 bytes)."""
    done = capi.lookup3(data, seed)
    if done is not None:
        return done
    return lookup3_python(data, seed)


def lookup3_python(data: bytes, seed: int = 0) -> int:
    """:func:`lookup3` in Python."""
    a = b = c = (0xDEADBEEF + len(data) + seed) & _MASK
    n = len(data)
    if n == 0:
        return c
    pos = 0
    while n - pos > 12:
        x, y, z = struct.unpack_from("<III", data, pos)
        a, b, c = (a + x) & _MASK, (b + y) & _MASK, (c + z) & _MASK
        a = ((a - c) & _MASK) ^ _rot(c, 4)
        c = (c + b) & _MASK
        b = ((b - a) & _MASK) ^ _rot(a, 6)
        a = (a + c) & _MASK
        c = ((c - b) & _MASK) ^ _rot(b, 8)
        b = (b + a) & _MASK
        a = ((a - c) & _MASK) ^ _rot(c, 16)
        c = (c + b) & _MASK
        b = ((b - a) & _MASK) ^ _rot(a, 19)
        a = (a + c) & _MASK
        c = ((c - b) & _MASK) ^ _rot(b, 4)
        b = (b + a) & _MASK
        pos += 12
    x, y, z = struct.unpack("<III", data[pos:].ljust(12, b"\0"))
    a, b, c = (a + x) & _MASK, (b + y) & _MASK, (c + z) & _MASK
    c = (c ^ b) - _rot(b, 14) & _MASK
    a = (a ^ c) - _rot(c, 11) & _MASK
    b = (b ^ a) - _rot(a, 25) & _MASK
    c = (c ^ b) - _rot(b, 16) & _MASK
    a = (a ^ c) - _rot(c, 4) & _MASK
    b = (b ^ a) - _rot(a, 14) & _MASK
    c = (c ^ b) - _rot(b, 24) & _MASK
    return c
