"""Whether a file's root keeps its leaves' metadata as attributes (format 0.5), from its
superblock and its root's object header alone, before any HDF5 code reads it (issue 33).

The command line begins the full preflight walk of the file an ``upgrade`` names before its
own imports (``preflight.start``), a tenth of a second sooner for an upgrade that reads every
dataset. A format 0.5 file's upgrade between 2.5 and 2.10 reads only its outline, and there the
early walk would be two children reading every dataset for nobody, on the cores the outline
read needs (at 150k tensors: 100 s of CPU and 700 MB). So the early walk skips a file whose
root looks like format 0.5: attributes in dense storage (legacy roots hold two or three), one
named ``<leaf>.__metadata__``, or the ``__SUCCESS__`` marker only format 0.5 writes (FORMAT.md
§4.7; a checkpoint with no leaf has nothing else). And the outline read
(``format.read.read_outline``) is not tried on a file that does not look so: a legacy file's
outline cannot answer, and trying it cost a forked child per command. A wrong guess costs
only time: the reader walks the file when it needs to.

Superblock layouts: HDF5 File Format Specification 3.0, §II.A; the root's object header and
its attribute messages: §IV.A.1, §IV.A.2.m, §IV.A.2.v (``headers``). Every read is bounded by
the file's size; anything not understood answers False (walk early, as before).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from ckpt_migrate.format.h5.headers import HeaderError, Read, file_reader, read_header
from ckpt_migrate.format.h5.root import SIGNATURE, root_field

_ATTRIBUTE, _ATTRIBUTE_INFO = 0x0C, 0x15
_UNDEF = (1 << 64) - 1
_SUFFIX = b".__metadata__"
_SUCCESS = b"__SUCCESS__"
_LIMIT = 64  # continuation blocks of the root's header read at most


def looks_like_format_05(path: Path) -> bool:
    """Whether the root of the HDF5 file at ``path`` keeps leaf metadata as attributes."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        found = _root(fd, size)
        if found is None:
            return False
        header = read_header(file_reader(fd, size, found[1]), found[0], set(), _LIMIT)
        return any(_marks_format_05(m.kind, m.body) for m in header.messages)
    except (HeaderError, ValueError, struct.error, OSError):
        return False
    finally:
        os.close(fd)


def is_hdf5(path: Path) -> bool:
    """Whether the file at ``path`` has an HDF5 signature where HDF5 looks for a superblock
    (a named pipe, opened without waiting for a writer, has none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        return _superblock(file_reader(fd, size), size) is not None
    except (HeaderError, ValueError, OSError):
        return False
    finally:
        os.close(fd)


def root_header(path: Path) -> tuple[int, int] | None:
    """(the root's object header address, the superblock's base) of the HDF5 file at
    ``path``, from its superblock's bytes (as ``h5.root.root_header`` asks HDF5 for them);
    None where it is not a superblock with the 8-byte offsets the byte readers read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _root(fd, os.fstat(fd).st_size)
    except (HeaderError, ValueError, struct.error, OSError):
        return None
    finally:
        os.close(fd)


def _root(fd: int, size: int) -> tuple[int, int] | None:
    read = file_reader(fd, size)
    base = _superblock(read, size)
    if base is None:
        return None
    at, width = root_field(read(base, 96))
    if width != 8:  # (``headers`` reads 8-byte offsets only)
        return None
    return struct.unpack_from("<Q", read(base + at, 8))[0], base


def _superblock(read: Read, size: int) -> int | None:
    """Where the superblock starts: at 0 or past a user block of 512, 1024, 2048... bytes."""
    at = 0
    while at + len(SIGNATURE) <= size:
        if read(at, len(SIGNATURE)) == SIGNATURE:
            return at
        at = 512 if at == 0 else at * 2
    return None


def _marks_format_05(kind: int, body: bytes) -> bool:
    """An attribute info message naming a heap (dense storage), or an attribute message whose
    name ends in ``.__metadata__`` or is ``__SUCCESS__``."""
    if kind == _ATTRIBUTE_INFO and len(body) >= 2:
        pos = 2 + (2 if body[1] & 0x01 else 0)
        return struct.unpack_from("<Q", body, pos)[0] != _UNDEF
    if kind != _ATTRIBUTE or len(body) < 8:
        return False
    version, name_n = body[0], struct.unpack_from("<H", body, 2)[0]
    start = 9 if version == 3 else 8
    name = body[start : start + name_n].rstrip(b"\0")
    return name.endswith(_SUFFIX) or name == _SUCCESS
