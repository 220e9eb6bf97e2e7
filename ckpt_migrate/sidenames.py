"""The names of what is made beside a user's file (a temporary, a backup, an old export moved
aside), which must fit in a directory however long the file's own name is."""

from __future__ import annotations

import hashlib
import os
import uuid

# The bytes of one name in a directory (ext4, XFS, btrfs, tmpfs, NFS, Lustre alike).
NAME_MAX = 255


def fitting(name: str, tail: int) -> str:
    """``name``, or, where ``tail`` more bytes would pass ``NAME_MAX``, its first bytes and a
    digest of the whole (two long names stay apart): the name of a temporary, or of the old
    directory an export replaces, beside a file whose own name is near the limit."""
    raw = os.fsencode(name)
    if len(raw) + tail <= NAME_MAX:
        return name
    return f"{os.fsdecode(raw[: cut_bytes(tail)])}~{hashlib.sha256(raw).hexdigest()[:8]}"


def cut_bytes(tail: int) -> int:
    """The bytes of a long name that ``fitting`` keeps."""
    return NAME_MAX - tail - len("~01234567")


def side_name(name: str, suffix: str, prefix: str = "") -> str:
    """A fresh name to make beside ``name``: ``prefix``, ``name`` (``fitting``), eight random
    hex digits and ``suffix`` (``.big.mdl.1f2e3d4c.tmp`` for ``big.mdl``, ``.``, ``.tmp``)."""
    return f"{prefix}{fitting(name, tail(suffix, prefix))}.{uuid.uuid4().hex[:8]}{suffix}"


def tail(suffix: str, prefix: str = "") -> int:
    """The bytes ``side_name`` adds to a name."""
    return len(os.fsencode(prefix)) + len(".01234567") + len(os.fsencode(suffix))
