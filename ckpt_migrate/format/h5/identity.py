"""A file's identity for what is learnt of it and kept: its device, inode, size and modification
time. A file rewritten or replaced has another, so nothing learnt of the old one is taken for
it (the preflight's early walk, the overlap map, the userblock size).

And the file HDF5 reads an open object from, by HDF5's own descriptor: a checkpoint loaded
lazily reads its tensors later, when its name may name another file (an upgrade in place, a
copy over it) or none (a manager's pruning). What is checked of a tensor's stored bytes is then
still the file HDF5 decodes them from."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py

from ckpt_migrate.errors import VerificationError


def file_identity(path: str | os.PathLike[str] | int) -> tuple[int, ...]:
    """Of the file at ``path``, or of the one open as the descriptor ``path``."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def watch(*paths: Path, voids: str = "nothing was published") -> Callable[[], None]:
    """A check, called before an output made from ``paths`` is published (or a verdict on
    them given), that raises ``VerificationError`` unless each is still the file it was now.
    A source written to while it was read (a job saving over it, ``rsync --inplace``) gave a
    verified output that was neither the old file nor the new: the part read before the write
    the old. ``voids``: what the message says of the outcome."""
    held = [(path, file_identity(path)) for path in paths]

    def unchanged() -> None:
        for path, identity in held:
            try:
                now = file_identity(path)
            except FileNotFoundError:  # removed (or moved): the file read, still open, is whole
                continue
            if now != identity:
                raise VerificationError(
                    path,
                    f"was written to while it was read; {voids}",
                    "run again once nothing writes to it",
                )

    return unchanged


def _descriptor(oid: h5py.h5o.ObjectID) -> int | None:
    """HDF5's own descriptor of the file ``oid`` lies in, or None where its driver keeps none
    (a Python file object's)."""
    try:
        return h5py.h5i.get_file_id(oid).get_vfd_handle()
    except (OSError, ValueError, RuntimeError, TypeError):
        return None


def _name(oid: h5py.h5o.ObjectID) -> str:
    return os.fsdecode(h5py.h5f.get_name(oid))


@contextlib.contextmanager
def hdf5_file(oid: h5py.h5o.ObjectID) -> Iterator[int]:
    """A descriptor to read the file ``oid`` (a file or any object in it) lies in: HDF5's own
    (left open), or one opened by the file's name where HDF5 keeps none."""
    fd = _descriptor(oid)
    if fd is not None:
        yield fd
        return
    fd = os.open(_name(oid), os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


def hdf5_identity(oid: h5py.h5o.ObjectID) -> tuple[int, ...]:
    """``file_identity`` of the file HDF5 reads ``oid`` from."""
    fd = _descriptor(oid)
    return file_identity(_name(oid) if fd is None else fd)
