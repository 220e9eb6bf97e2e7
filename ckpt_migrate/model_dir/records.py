"""The run record each CheckpointManager save carries, and whether a file is complete.

``__ckpt_migrate_run__`` is a root attribute (JSON: run id, kind, step, save index) that the real
loader ignores, like ``__ckpt_migrate__``. ``upgrade-dir`` reads it too (to find the newest
checkpoint), so it lives apart from the manager.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py

from ckpt_migrate import jsonfile
from ckpt_migrate.errors import CkptError, CorruptCheckpointError, NotACheckpointError
from ckpt_migrate.format.h5.io import attr_text
from ckpt_migrate.format.read import read_checkpoint

RUN_ATTR = "__ckpt_migrate_run__"


def read_run_record(path: str | Path) -> dict[str, Any] | None:
    """The ``__ckpt_migrate_run__`` record of a checkpoint file, or None (not ours, unreadable)."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            raw = f.attrs.get(RUN_ATTR)
    except OSError:
        return None
    if raw is None:
        return None
    try:
        value = jsonfile.loads(attr_text(raw))
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def incomplete_reason(path: str | Path) -> str | None:
    """Why ``path`` is not a complete checkpoint (partially written, truncated, not one), or
    None. A file newer than this tool counts as complete: loading it says what is wrong."""
    try:
        with read_checkpoint(path):
            return None
    except (CorruptCheckpointError, NotACheckpointError) as exc:
        return exc.problem
    except CkptError:
        return None
