"""A legacy root's ``__spec__`` decoded while the preflight children walk the file (issue 33).

A reader of a legacy file waits for the children's walk of every object, then decodes the
root's ``__spec__`` pickle, the tree's shape, from the file's bytes (``attrtable``) with the
restricted unpickler: Python alone, no HDF5 code, so it may run before the walk's verdict. On a
thread meanwhile, the decode leaves the read its result, which the reader takes once HDF5 has
the file open, if HDF5 finds the root where the superblock's bytes placed it with as many
attributes, and the file is the one read (``EarlySpec.take``); else it decodes as before.

Only a spec of up to :data:`EARLY_BYTES` is decoded early. The deep 12 GB benchmark's (400 kB,
72 ms) then costs the upgrade nothing, its children waiting for the disk; a 150k-tensor one
(9 MB, 2.2 s) would compete with the two children for the two cores while they walk.
"""

from __future__ import annotations

import threading
from pathlib import Path

import h5py

from ckpt_migrate.errors import CorruptCheckpointError
from ckpt_migrate.format.h5 import attrtable, sniff
from ckpt_migrate.format.h5.identity import file_identity
from ckpt_migrate.format.h5.root import root_header
from ckpt_migrate.format.legacy.spec_decode import SpecInfo, decode_spec_info

EARLY_BYTES = 1 << 20  # (a pickle of about 15k leaves)


def spec_pickle(text: str, path: Path) -> bytes:
    """The pickle a legacy ``__spec__`` holds as hex text."""
    try:
        return bytes.fromhex(text.strip())
    except ValueError:
        raise CorruptCheckpointError(path, "legacy __spec__ is not hex text") from None


def only_spec(name: str, text: str | None) -> str | None:
    """``attrtable``'s ``keep``: the ``__spec__`` text, no other."""
    return text if name == "__spec__" else None


class EarlySpec:
    """The decode of ``path``'s legacy ``__spec__``, begun on a thread of its own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._found: tuple[tuple[int, ...], tuple[int, int], int, SpecInfo] | None = None
        self._thread = threading.Thread(target=self._decode, name="ckpt-migrate spec", daemon=True)
        self._thread.start()

    def _decode(self) -> None:
        try:
            identity = file_identity(self.path)
            at = sniff.root_header(self.path)
            table = None if at is None else attrtable.read_texts(self.path, *at, keep=only_spec)
            text = None if table is None else table.get("__spec__")
            if at is None or table is None or not isinstance(text, str):
                return
            if len(text) // 2 > EARLY_BYTES:  # (two hex digits a byte: not made into bytes)
                return
            data = spec_pickle(text, self.path)
            self._found = identity, at, len(table), decode_spec_info(data, self.path)
        except Exception:  # (the reader decodes it itself, and names what is wrong)
            return

    def take(self, f: h5py.File) -> SpecInfo | None:
        """The spec decoded, if it is ``f``'s (open on the same path); else None."""
        self._thread.join()
        if self._found is None:
            return None
        identity, at, count, info = self._found
        self._found = None
        if root_header(f) != at or h5py.h5o.get_info(f.id).num_attrs != count:
            return None
        return info if file_identity(self.path) == identity else None
