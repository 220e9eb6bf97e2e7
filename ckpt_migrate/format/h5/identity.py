"""A file's identity for what is learnt of it and kept: its device, inode, size and modification
time. A file rewritten or replaced has another, so nothing learnt of the old one is taken for
it (the preflight's early walk, the overlap map, the userblock size)."""

from __future__ import annotations

import os


def file_identity(path: str | os.PathLike[str] | int) -> tuple[int, ...]:
    """Of the file at ``path``, or of the one open as the descriptor ``path``."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
