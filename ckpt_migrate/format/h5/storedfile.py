"""A file's datasets' storage by name, read from their headers (``storedheader``) through one
descriptor: what ``verify`` (``format.headercompare``) and an upgrade's ``--verify full``
(``engine.verify``) compare of two files' tensors without HDF5 opening either (issue 33)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import h5py
import numpy as np

from ckpt_migrate.format.h5 import linktable
from ckpt_migrate.format.h5.headerfacts import HeaderReader
from ckpt_migrate.format.h5.headers import HeaderError
from ckpt_migrate.format.h5.io import H5Handle
from ckpt_migrate.format.h5.root import superblock_offset
from ckpt_migrate.format.h5.storagescan import Undecided
from ckpt_migrate.format.h5.storedheader import StoredLayout, read_layout

_UNREAD = (HeaderError, Undecided, struct.error, IndexError, OSError)


class NotRead(Exception):
    """A dataset's header this does not read (a group, a layout or version it does not know,
    a name that is not the root's): the caller asks HDF5."""


class StoredFile:
    """The open file ``path`` (``fd``), its root's links (``addresses``: name -> header), a
    bounded reader of its headers (``HeaderReader``: every read inside the file, together
    under twice its size) and the datatype messages met."""

    def __init__(self, path: Path, addresses: dict[str, int]) -> None:
        self.path, self.addresses = path, addresses
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size
        self.reader = HeaderReader(self.fd, self.size, 0)
        self.types: dict[bytes, np.dtype | None] = {}

    @classmethod
    def of(
        cls, f: h5py.File, path: Path, addresses: dict[str, int] | None = None
    ) -> StoredFile | None:
        """``f``'s, open on ``path`` (``addresses``: its root's links, where the caller has
        them); None where its headers are not read here (a userblock, a link table this does
        not read)."""
        if superblock_offset(f) != 0:
            return None
        found = addresses if addresses is not None else linktable.of_root(f, path)
        return None if found is None else cls(path, found)

    @classmethod
    def of_handle(cls, handle: H5Handle) -> StoredFile | None:
        """``of`` the file a read holds (a format 0.5 outline's links, kept by its read, are
        not read twice: 27 MB at 150k)."""
        known = handle.addresses() if handle.knows_addresses else None
        return cls.of(handle.file(), handle.path, known)

    def at(self, address: int, reader: HeaderReader | None = None) -> StoredLayout:
        """The storage of the dataset whose header is at ``address`` (``reader``: another
        bounded reader, for a second pass over the file); ``NotRead`` where it is not read."""
        try:
            return read_layout((reader or self.reader).read, address, self.types)
        except _UNREAD:
            raise NotRead from None

    def named(self, name: str) -> StoredLayout:
        """``at`` of the root's link ``name``."""
        address = self.addresses.get(name)
        if address is None:
            raise NotRead
        return self.at(address)

    def close(self) -> None:
        os.close(self.fd)
