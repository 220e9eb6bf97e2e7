"""The run record each CheckpointManager save carries, whether a file is complete, and the
newest complete one of a directory another process may be pruning.

``__ckpt_migrate_run__`` is a root attribute (JSON: run id, kind, step, save index) that the real
loader ignores, like ``__ckpt_migrate__``. ``upgrade-dir`` reads it too (to find the newest
checkpoint), so it lives apart from the manager.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import h5py

from ckpt_migrate import jsonfile
from ckpt_migrate.errors import CkptError, CkptIOError, CorruptCheckpointError, NotACheckpointError
from ckpt_migrate.format.h5.io import attr_text
from ckpt_migrate.format.read import read_checkpoint

RUN_ATTR = "__ckpt_migrate_run__"
RELISTS = 8  # listings of a directory whose newest files kept vanishing, before giving up

log = logging.getLogger(__name__)
T = TypeVar("T")


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
    None (``check_complete``)."""
    try:
        check_complete(Path(path))
    except (CorruptCheckpointError, NotACheckpointError) as exc:
        return exc.problem
    return None


def check_complete(path: Path) -> None:
    """Raise the reader's error for a file that is not a complete checkpoint (partially
    written, truncated, not one). A file newer than this tool counts as complete: loading it
    says what is wrong."""
    try:
        with read_checkpoint(path):
            return
    except (CorruptCheckpointError, NotACheckpointError):
        raise
    except CkptError:
        return


def newest_complete(
    directory: Path, newest_first: Callable[[], Iterable[Path]], read: Callable[[Path], T]
) -> tuple[Path, T] | None:
    """The first of ``newest_first()`` that ``read`` takes, with what it returned; None when
    none is complete. ``read`` raises the reader's errors for an incomplete file (a save still
    writing it, a truncated copy), which is passed over with a warning. A file removed since it
    was listed (another process's manager pruning) is passed over quietly, and the directory
    listed again: a directory of checkpoints never looks empty because its newest ones were
    pruned while they were being read (it looked so, and a resume would have started afresh)."""
    for _ in range(RELISTS):
        gone = False
        for path in newest_first():
            try:
                return path, read(path)
            except (CorruptCheckpointError, NotACheckpointError) as exc:
                if not os.path.lexists(path):
                    gone = True
                    continue
                log.warning("skipping %s: %s", path, exc.problem)
        if not gone:
            return None
    raise CkptIOError(
        directory,
        f"its newest checkpoints were removed while they were read, {RELISTS} times over",
        "retry, or stop the process that prunes them meanwhile",
    )
