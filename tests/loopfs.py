"""A real filesystem of a given kind on a loop device, for the extent-sharing tests and benchmark.

Needs root, the filesystem's ``mkfs`` and loop devices; :func:`unavailable` says why not, so
callers can skip with that reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

MKFS = {
    "xfs": ["mkfs.xfs", "-q", "-f", "-m", "reflink=1"],
    "btrfs": ["mkfs.btrfs", "-q", "-f"],
}


def unavailable(kind: str) -> str | None:
    """Why a ``kind`` filesystem cannot be mounted here, or None if it can be tried."""
    if os.geteuid() != 0:
        return "mounting a loop device needs root"
    if shutil.which(MKFS[kind][0]) is None:
        return f"{MKFS[kind][0]} is not installed (Debian: xfsprogs / btrfs-progs)"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control)"
    return None


@contextlib.contextmanager
def mounted(kind: str, size: int, parent: Path | None = None) -> Iterator[Path]:
    """A fresh ``kind`` filesystem of ``size`` bytes (a sparse image file under ``parent``),
    mounted; unmounted and removed on exit. Raises ``RuntimeError`` naming what failed."""
    base = Path(tempfile.mkdtemp(prefix=f"ckpt-{kind}-", dir=parent))
    image, mountpoint = base / "fs.img", base / "mnt"
    mountpoint.mkdir()
    try:
        with open(image, "wb") as f:
            f.truncate(size)
        for argv in (
            [*MKFS[kind], str(image)],
            ["mount", "-o", "loop", str(image), str(mountpoint)],
        ):
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"{' '.join(argv[:2])}: {proc.stderr.strip()[:200]}")
        try:
            yield mountpoint
        finally:
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
