"""An HDF5 temporary open for writing: its room taken before HDF5 writes a byte.

A write that fails part way on a full disk leaves HDF5 holding what it has not written (the
datasets' chunks, the metadata cache); the close fails too, and HDF5's identifiers of the
half-closed file crash the process when they are released later (a segmentation fault in
``H5FO_top_decr`` under ``H5D_close``, at the next collection or at exit): ``save`` to a full
disk, then ``gc.collect()``; ``from-torch`` there, exit 139 after its error line. So the room
a new file needs is allocated first (``atomic.reserve``: a full disk is met there, as the
upgrade's rewrite meets it), and a write that fails anyway gives the temporary's bytes back at
once, so that HDF5's last writes may find room and the disk is not held full until the
process ends (the temporary, unlinked, lives on while HDF5 keeps it open).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import h5py

from ckpt_migrate.atomic import reserve as reserve_room


@contextlib.contextmanager
def writing(path: Path, f: h5py.File, *, reserve: int = 0) -> Iterator[h5py.File]:
    """``f``, open for writing on the temporary ``path``, closed when the block ends.
    ``reserve``: an upper bound of the bytes a new file will take, allocated first (freed past
    its end by ``atomic.fsync_path(settle=True)``). A block or a close that fails truncates
    ``path`` to nothing and closes ``f`` before the error goes on (the caller discards the
    temporary)."""
    try:
        if reserve:
            reserve_room(f.id.get_vfd_handle(), 0, reserve)
        yield f
        f.close()
    except BaseException:
        with contextlib.suppress(OSError):
            os.truncate(path, 0)
        with contextlib.suppress(Exception):
            f.close()
        raise
