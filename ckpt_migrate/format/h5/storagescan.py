"""What a copy of a file would carry out of it, read from the datasets' object headers alone
(issue 33).

An upgrade that edits only the root (``engine.rootedit``) copies every dataset byte for byte
and reads none, so the full preflight walk (every dataset opened through HDF5 in a child, its
chunk index walked: about 0.3 ms a dataset) would be its largest cost. What the boundary must
still refuse (``boundary``) is what the copy would carry that points outside the file: a
dataset whose data is in external files (the External Data Files message, §IV.A.2.h of the
HDF5 File Format Specification 3.0), a virtual dataset (the layout message's class 3,
§IV.A.2.i) and a filter outside ``ALLOWED_FILTERS`` (the filter pipeline message, §IV.A.2.l),
which a reader of the output would load as a plugin. External and user-defined links are
refused by the outline's own walk of the links.

This reads each dataset's header with ``headers`` (pure Python: no HDF5 code runs on it, every
read bounded by the file's size) and looks at those three messages and the datatype's class:
about 10 µs a dataset. A header it does not understand (a shared message, a version it does not
know, one that contradicts itself) makes ``scan`` undecided, and the caller walks the file as
before (``H5Handle.walked``). The chunk indexes and the stored bytes are not read: the copy
does not read them either, and they reach the output as the source holds them.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

from ckpt_migrate.format.h5.boundary import (
    ALLOWED_FILTERS,
    ALLOWED_TYPE_CLASSES,
    filter_problem,
    unsafe,
)
from ckpt_migrate.format.h5.headers import SHARED, HeaderError, Read, file_reader, read_header

_DATATYPE, _EXTERNAL, _LAYOUT, _FILTERS = 0x03, 0x07, 0x08, 0x0B
_VIRTUAL = 3
_KINDS = frozenset((_DATATYPE, _EXTERNAL, _LAYOUT, _FILTERS))
_LIMIT = 1 << 10  # continuation blocks of one dataset's header
_WINDOW = 64 << 10  # bytes read at once
TICK_EVERY = 1000


class Undecided(Exception):
    """A header this scan does not understand."""


def scan(
    path: Path, datasets: dict[str, int], base: int = 0, tick: Callable[[], object] | None = None
) -> bool:
    """Raise ``UnsafeContentError`` for the first dataset of ``datasets`` (name -> its header's
    address relative to ``base``, the superblock's) that points outside the file; True when
    none does, False when a header was not understood (nothing concluded). ``tick`` is called
    every ``TICK_EVERY`` datasets (a preflight child's sign of progress)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        read = file_reader(fd, os.fstat(fd).st_size, base, window=_WINDOW)
        for i, (name, address) in enumerate(datasets.items()):
            if tick is not None and i % TICK_EVERY == 0:
                tick()
            try:
                problem = _problem(read, address)
            except (HeaderError, Undecided, struct.error, IndexError):  # (a message too short)
                return False
            if problem is not None:
                raise unsafe(path, f"/{name}", problem)
    finally:
        os.close(fd)
    return True


def _problem(read: Read, address: int) -> str | None:
    """What the header at ``address`` carries out of the file, in ``boundary``'s words."""
    header = read_header(read, address, set(), _LIMIT, verify=False, kinds=_KINDS)
    for m in header.messages:
        if m.flags & SHARED:
            raise Undecided("a shared message")
        if m.kind == _EXTERNAL:
            return "stores its data in an external file"
        if m.kind == _LAYOUT and _layout_class(m.body) == _VIRTUAL:
            return "is a virtual dataset over other files"
        if m.kind == _DATATYPE and m.body[0] & 0x0F not in ALLOWED_TYPE_CLASSES:
            raise Undecided("a type class checkpoints do not use")  # the walk names it
        if m.kind == _FILTERS:
            for code in filter_ids(m.body):
                if code not in ALLOWED_FILTERS:
                    return filter_problem(code)
    return None


def _layout_class(body: bytes) -> int:
    """The layout class of a data layout message: its byte 2 in versions 1-2, 1 in 3-5 (5:
    what HDF5 2.0 writes with the latest format, the class where version 4 has it)."""
    version = body[0]
    if version in (1, 2):
        return body[2]
    if version in (3, 4, 5):
        return body[1]
    raise Undecided(f"layout message version {version}")


def filter_ids(body: bytes) -> list[int]:
    """The filter identifiers of a filter pipeline message (versions 1 and 2)."""
    return [code for code, _, _ in filters(body)]


def filters(body: bytes) -> list[tuple[int, int, tuple[int, ...]]]:
    """(identifier, flags, client data) of each filter of a filter pipeline message (versions
    1 and 2), as HDF5's ``H5Pget_filter`` gives them (not the optional name)."""
    version, count = body[0], body[1]
    pos = 8 if version == 1 else 2
    if version not in (1, 2):
        raise Undecided(f"filter pipeline message version {version}")
    found = []
    for _ in range(count):
        code = struct.unpack_from("<H", body, pos)[0]
        if version == 1:
            name_n, flags, values = struct.unpack_from("<HHH", body, pos + 2)
            at = pos + 8 + (name_n + 7) // 8 * 8
            pos = at + 4 * (values + (values & 1))
        else:
            name_n = 0
            if code >= 256:
                name_n = struct.unpack_from("<H", body, pos + 2)[0]
                pos += 2
            flags, values = struct.unpack_from("<HH", body, pos + 2)
            at = pos + 6 + name_n
            pos = at + 4 * values
        if pos > len(body):
            raise Undecided("a filter pipeline message runs past its end")
        found.append((code, flags, struct.unpack_from(f"<{values}I", body, at)))
    return found
