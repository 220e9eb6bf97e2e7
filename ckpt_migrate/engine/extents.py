"""An upgrade's output as extents: byte ranges it shares with its source, and ranges of its own.

A copy-patch output is its source with the metadata edited (``copypatch``): the stored bytes of
every dataset the output keeps (the *data ranges* of the chunk index, ``splitcopy.data_ranges``)
stay where they are, byte for byte; everything else (superblock, object headers, chunk indexes,
heaps, small datasets) is the output's own, and HDF5 appends the new metadata past the source's
end. :class:`Extents` records which is which. One description, several ways to make the file:

``clone``
    ``FICLONE`` shares every block of the source (XFS with ``reflink=1``, btrfs, bcachefs,
    ZFS 2.2+ with block cloning), and the description is one shared range
    (:meth:`Extents.whole`): the filesystem unshares the blocks the metadata edit writes, as
    it writes them, and nothing else. No chunk index is read for it. The space the edit may
    need (the growth past the end, allocated; the source's metadata, which is all it can
    unshare, checked free) is made sure of before HDF5 writes a byte (``reserve_edit``).
    Cost: the metadata, whatever the checkpoint's size.
``kernel``
    ``copy_file_range`` of the whole file: the kernel or the file server shares or copies it
    without the bytes passing through this process (NFS 4.2 server-side copy, CIFS/SMB).
``copy``
    ``splitcopy``: a worker copies the data ranges past the page cache while the metadata is
    edited, hashing the source on the way (the only method that reads the source's bytes, so the
    only one that records the source's digest in the provenance).
``sparse``
    Only the output's own ranges are written; the shared ranges stay holes. For the object
    store's staging file alone, whose shared ranges are never read (the store copies them from
    the source object): the local disk then holds the metadata, not the checkpoint.

The object-store output (a multipart upload whose shared ranges are server-side part copies) is
another realiser of the same description.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ckpt_migrate import atomic
from ckpt_migrate.engine.splitcopy import copy_range

Method = Literal["clone", "kernel", "copy", "sparse"]
Choice = Literal["auto", "clone", "copy", "sparse"]
METHODS: tuple[str, ...] = ("auto", "clone", "copy")  # the users' choices (sparse is internal)

_FICLONE = 0x40049409  # _IOW(0x94, 9, int)
_UNSUPPORTED = (
    errno.EOPNOTSUPP,
    errno.ENOTTY,
    errno.EXDEV,
    errno.EINVAL,
    errno.ENOSYS,
    errno.EPERM,
)

# statfs(2) f_type of filesystems that share extents (clone) or copy server-side (kernel).
_CLONING = {
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0xCA451A4E: "bcachefs",
    0x2FC12FC2: "zfs",
    0x7461636F: "ocfs2",
}
_SERVER_COPY = {0x6969: "nfs", 0xFF534D42: "cifs", 0xFE534D42: "smb2"}
_NAMES = {
    0xEF53: "ext4",
    0x01021994: "tmpfs",
    0x858458F6: "ramfs",
    0x794C7630: "overlayfs",
    **_CLONING,
    **_SERVER_COPY,
}


@dataclass(frozen=True)
class Shared:
    """Output bytes ``[dst, dst + length)`` are source bytes ``[src, src + length)``."""

    dst: int
    src: int
    length: int


@dataclass(frozen=True)
class Own:
    """Output bytes ``[dst, dst + length)`` are the output's own (copied, then edited)."""

    dst: int
    length: int


@dataclass(frozen=True)
class Extents:
    """The first ``size`` bytes of an output, in order; HDF5 may append past them."""

    size: int
    parts: tuple[Shared | Own, ...]

    @classmethod
    def copy_patch(cls, data_ranges: list[tuple[int, int]], size: int, block: int) -> Extents:
        """The data ranges shared (shrunk inward to whole ``block``\\ s, since a filesystem
        shares whole blocks), everything else the output's own."""
        parts: list[Shared | Own] = []
        pos = 0
        for start, end in data_ranges:
            a, b = -(-start // block) * block, end // block * block
            if b <= a:
                continue
            if a > pos:
                parts.append(Own(pos, a - pos))
            parts.append(Shared(a, a, b - a))
            pos = b
        if pos < size:
            parts.append(Own(pos, size - pos))
        return cls(size, tuple(parts))

    @classmethod
    def whole(cls, size: int) -> Extents:
        """All of the source shared: what a clone starts from."""
        return cls(size, (Shared(0, 0, size),))

    @property
    def shared_bytes(self) -> int:
        return sum(p.length for p in self.parts if isinstance(p, Shared))

    @property
    def own(self) -> list[Own]:
        return [p for p in self.parts if isinstance(p, Own)]


@dataclass(frozen=True)
class Filesystem:
    name: str
    block: int
    clones: bool  # of a kind that may share extents (reflink may still be off: XFS reflink=0)
    server_copy: bool


def filesystem(path: Path) -> Filesystem:
    """What the filesystem holding ``path`` (a directory or file) is, from ``statfs(2)``."""
    buf = ctypes.create_string_buffer(128)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.statfs(os.fsencode(path), buf) != 0:
        return Filesystem("unknown", 4096, False, False)
    f_type, f_bsize = struct.unpack_from("qq", buf)
    f_type &= 0xFFFFFFFF
    name = _NAMES.get(f_type, f"0x{f_type:x}")
    return Filesystem(name, f_bsize or 4096, f_type in _CLONING, f_type in _SERVER_COPY)


def expected_method(choice: Choice, src: Path, out_dir: Path) -> Method:
    """The method ``choice`` will most likely use (the plan's guess; ``share`` decides)."""
    if choice in ("copy", "sparse"):
        return choice
    try:
        same_device = os.stat(src).st_dev == os.stat(out_dir).st_dev
    except OSError:
        return "copy"
    fs = filesystem(out_dir)
    if same_device and fs.clones:
        return "clone"
    if choice == "auto" and same_device and fs.server_copy:
        return "kernel"
    return "copy" if choice == "auto" else "clone"


def share(
    fd_in: int, fd_out: int, extents: Extents, choice: Choice, fs: Filesystem
) -> Method | None:
    """Make the empty ``fd_out`` a copy of ``fd_in`` without moving the shared bytes through this
    process, if ``choice`` and the filesystem allow; return the method used, or None when the
    caller must copy (``splitcopy``). ``fd_out`` is left empty in that case."""
    size = extents.size
    if choice == "copy":
        return None
    if choice == "sparse":
        os.ftruncate(fd_out, size)
        for part in extents.own:
            pos, end = part.dst, part.dst + part.length
            while pos < end:
                pos += copy_range(fd_in, fd_out, pos, min(1 << 30, end - pos))
        return "sparse"
    try:
        fcntl.ioctl(fd_out, _FICLONE, fd_in)
        return "clone"
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
    if choice == "auto" and fs.server_copy:
        pos = 0
        while pos < size:
            pos += copy_range(fd_in, fd_out, pos, min(1 << 30, size - pos))
        return "kernel"
    return None


def reserve_edit(fd: int, size: int, total: int, metadata: int) -> None:
    """Make room for the metadata edit of a clone of ``size`` bytes before HDF5 writes a byte:
    its growth up to ``total`` allocated past the end, and ``metadata`` bytes free for the
    blocks it rewrites in place (copy-on-write: only the source's metadata is ever rewritten).

    Those blocks are checked, not allocated: unsharing every metadata range in advance
    (``FALLOC_FL_UNSHARE_RANGE``) cost one call per gap between chunks (0.42 s and 20 MB
    written for a 3 GB checkpoint of 81k chunks), most of them never edited. Raises
    ``OSError(ENOSPC)``."""
    atomic.reserve(fd, size, total, allocate_existing=False)
    atomic.require_free(fd, metadata)


_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_FLAG_SYNC = 0x1
_FIEMAP_EXTENT_LAST = 0x1
_FIEMAP_EXTENT_SHARED = 0x2000
_HEADER = struct.Struct("=QQIIII")  # fm_start, fm_length, fm_flags, mapped, count, reserved
_EXTENT = struct.Struct("=QQQQQIIII")  # logical, physical, length, 2 reserved, flags, 3 reserved


def shared_bytes(path: Path) -> int:
    """How many bytes of ``path`` the filesystem reports as shared with another file (FIEMAP
    ``FIEMAP_EXTENT_SHARED``); 0 where it cannot tell."""
    total, start, batch = 0, 0, 512
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            buf = bytearray(_HEADER.size + batch * _EXTENT.size)
            _HEADER.pack_into(buf, 0, start, 2**64 - 1 - start, _FIEMAP_FLAG_SYNC, 0, batch, 0)
            try:
                fcntl.ioctl(fd, _FS_IOC_FIEMAP, buf)
            except OSError:
                return 0
            mapped = _HEADER.unpack_from(buf, 0)[3]
            if not mapped:
                return total
            for i in range(mapped):
                logical, _, length, _, _, flags, *_ = _EXTENT.unpack_from(
                    buf, _HEADER.size + i * _EXTENT.size
                )
                if flags & _FIEMAP_EXTENT_SHARED:
                    total += length
                if flags & _FIEMAP_EXTENT_LAST:
                    return total
                start = logical + length
    finally:
        os.close(fd)
