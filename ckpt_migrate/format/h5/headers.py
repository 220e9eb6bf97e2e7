"""An object header's messages read from the file's bytes (HDF5 File Format Specification 3.0:
version-1 and version-2 object headers, §IV.A.1; continuation blocks, §IV.A.2.q), for the
readers that parse what HDF5 has no call for: ``h5.attrtable`` (a root's attributes in one
pass) and ``h5.metadata`` (where the file's metadata lies).

Only 8-byte offsets and lengths. Every block is read through the caller's bounded ``read``;
a continuation block already seen (a loop) or past the caller's count, a message running past
its block, or a version-2 block whose checksum does not match is a :class:`HeaderError`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from ckpt_migrate.format.h5.root import lookup3

CONTINUATION = 0x10
LAST_KNOWN = 0x18  # the last message type HDF5 knows (HDF5 File Format Specification 3.0)
SHARED = 0x02  # a message flag: the body is a reference to a message stored elsewhere

_V1_MESSAGE = struct.Struct("<HHB")  # a version-1 message's type, length and flags
_V2_MESSAGE = struct.Struct("<BHB")

Read = Callable[[int, int], bytes]  # (address, count) -> exactly count bytes, or raise


class KeepUnknown(frozenset):
    """``read_header``'s ``kinds``: these message types, and every type HDF5 does not know
    (it skips them: a flag attribute's message, its type byte damaged, is lost to it)."""

    def __contains__(self, kind: object) -> bool:
        return (isinstance(kind, int) and kind > LAST_KNOWN) or super().__contains__(kind)


class HeaderError(Exception):
    """A header this module does not know, or one that contradicts itself."""


def file_reader(fd: int, size: int, base: int = 0, window: int = 0) -> Read:
    """A ``Read`` of the open file ``fd`` of ``size`` bytes, at addresses relative to ``base``
    (the superblock's), refusing any byte outside the file. ``window``: bytes read at once,
    the later reads inside them answered from memory (neighbouring headers); ``pread``, not a
    map of the file, whose touched pages would count in the process's memory."""
    block, start = b"", 0

    def read(at: int, n: int) -> bytes:
        nonlocal block, start
        at += base
        if at < 0 or n < 0 or at + n > size:
            raise HeaderError(f"{n} bytes at {at} are outside the file")
        if not (start <= at and at + n <= start + len(block)):
            block, start = os.pread(fd, max(n, window), at), at
        data = block[at - start : at - start + n]
        if len(data) != n:
            raise HeaderError("short read")
        return data

    return read


class Message(NamedTuple):
    """A header message (a tuple: a frozen dataclass cost 8 µs a dataset header to build,
    a third of ``headerfacts``' reading of one)."""

    kind: int
    flags: int
    body: bytes


@dataclass
class Header:
    """A header's messages (continuations followed, not listed) and its blocks' extents."""

    messages: list[Message] = field(default_factory=list)
    blocks: list[tuple[int, int]] = field(default_factory=list)  # (address, length)
    checksummed: bool = False  # a version-2 header whose blocks' checksums were verified


def read_header(
    read: Read,
    address: int,
    visited: set[int],
    limit: int,
    *,
    verify: bool = True,
    kinds: frozenset[int] | None = None,
) -> Header:
    """The header at ``address``; ``visited`` holds the blocks already read (it gains this
    header's), ``limit`` caps its size. ``verify=False`` skips the version-2 blocks' checksums
    (``storagescan``: HDF5 itself refuses an object whose header fails its checksum).
    ``kinds``: the message types kept (others are stepped over; continuations followed)."""
    visited.add(address)
    head = read(address, 16)  # (a version-1 header's prefix; a version-2 one's signature)
    if head[:4] == b"OHDR":
        return _version_2(read, address, visited, limit, verify, kinds)
    return _version_1(read, address, head, visited, limit, kinds)


def _version_1(
    read: Read,
    address: int,
    head: bytes,
    visited: set[int],
    limit: int,
    kinds: frozenset[int] | None,
) -> Header:
    if head[0] != 1:
        raise HeaderError(f"object header version {head[0]}")
    size = struct.unpack_from("<I", head, 8)[0]
    header = Header(blocks=[(address, 16 + size)])
    chunks = [(address + 16, size)]
    while chunks:
        at, n = chunks.pop()
        data, pos = read(at, n), 0
        while pos + 8 <= n:
            kind, length, flags = _V1_MESSAGE.unpack_from(data, pos)
            pos += 8
            if pos + length > n:
                raise HeaderError("a message runs past its block")
            if kind == CONTINUATION:
                more = _continuation(data[pos : pos + length], visited, limit)
                header.blocks.append(more)
                chunks.append(more)
            elif kinds is None or kind in kinds:
                header.messages.append(Message(kind, flags, data[pos : pos + length]))
            pos += length
    return header


def _version_2(
    read: Read,
    address: int,
    visited: set[int],
    limit: int,
    verify: bool,
    kinds: frozenset[int] | None,
) -> Header:
    head = read(address, 6 + 16 + 4 + 8)
    version, flags = head[4], head[5]
    if version != 2:
        raise HeaderError(f"object header version {version}")
    pos = 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
    width = 1 << (flags & 3)
    start = pos + width
    order = 2 if flags & 0x04 else 0  # each message's creation order
    first = (address, start + int.from_bytes(head[pos:start], "little") + 4)
    header = Header(blocks=[first], checksummed=verify)
    chunks = [(*first, start)]
    while chunks:
        at, n, pos = chunks.pop()
        data = read(at, n)
        stored = struct.unpack_from("<I", data, n - 4)[0] if n >= 4 else None
        if stored is None or (verify and stored != lookup3(data[: n - 4])):
            raise HeaderError(f"object header block at {at}: checksum mismatch")
        end = n - 4
        while pos + 4 + order <= end:
            kind, length, mflags = _V2_MESSAGE.unpack_from(data, pos)
            pos += 4 + order
            if pos + length > end:
                raise HeaderError("a message runs past its block")
            if kind == CONTINUATION:
                more = _continuation(data[pos : pos + length], visited, limit)
                if read(more[0], 4) != b"OCHK":  # signature, messages, checksum
                    raise HeaderError(f"no continuation block at {more[0]}")
                header.blocks.append(more)
                chunks.append((*more, 4))
            elif kinds is None or kind in kinds:
                header.messages.append(Message(kind, mflags, data[pos : pos + length]))
            pos += length
    return header


def _continuation(body: bytes, visited: set[int], limit: int) -> tuple[int, int]:
    """The block a continuation message names, each block once and at most ``limit``."""
    if len(body) < 16:
        raise HeaderError("short continuation message")
    at, n = struct.unpack_from("<QQ", body)
    if at in visited or len(visited) >= limit:
        raise HeaderError("continuation blocks loop or are too many")
    visited.add(at)
    return at, n
