"""The output directory of an export: written beside its target, every file fsynced, then
renamed into place (an existing one, with ``force``, moved aside first and removed after)."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from ckpt_migrate.atomic import Interrupt, fsync_dir, fsync_path, io_error
from ckpt_migrate.errors import UsageError


def check_output_dir(target: Path, force: bool) -> None:
    if target.exists() or target.is_symlink():
        if not force:
            raise UsageError(
                target, "already exists; refusing to overwrite it", "remove it or pass --force"
            )
        if not target.is_dir() or target.is_symlink():
            raise UsageError(target, "is not a directory; --force replaces only a directory")
    if not target.parent.is_dir():
        raise UsageError(target, "its parent directory does not exist", "create it first")


@contextlib.contextmanager
def atomic_dir(target: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``target``; on success every file and
    directory in it, and itself, are fsynced and it is renamed to ``target`` (an existing one,
    with ``force``, is moved aside first and removed after). On any error the temporary
    directory is removed."""
    target = Path(target)
    check_output_dir(target, force)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.mkdir()
    except OSError as exc:
        raise io_error(target, exc) from None
    try:
        yield tmp
        for where, subdirs, files in os.walk(tmp, topdown=False):  # a directory after its files
            for name in files:
                fsync_path(Path(where, name))
            for name in subdirs:
                fsync_dir(Path(where, name))
        fsync_dir(tmp)
        Interrupt.check()
        _publish_dir(tmp, target, force)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise io_error(target, exc) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _publish_dir(tmp: Path, target: Path, force: bool) -> None:
    old = None
    if target.exists():
        if not force:
            raise UsageError(target, "appeared meanwhile; refusing to overwrite it")
        old = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.old")
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except OSError:
        if old is not None:
            os.rename(old, target)
        raise
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
