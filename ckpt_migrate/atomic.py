"""Crash-safe file operations: write beside the target, fsync, then move into place.

A crash at any moment leaves at most a ``<name>.<8 hex>.tmp`` file (never a file at the target
name), and an existing target is never truncated or replaced unless the caller asks for it.
Also the one advisory lock (``exclusive_lock``) and the one link-or-copy (``link_or_copy``) the
engine, ``upgrade-dir`` and the manager share.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from ckpt_migrate.errors import CkptIOError, UsageError

TMP_SUFFIX = ".tmp"
# os.link fails with these where the filesystem (or a mount boundary) has no hard links.
LINK_REFUSED = (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK)


def temp_name(target: Path) -> Path:
    return target.with_name(f"{target.name}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
        fsync_path(path)


def publish(tmp: Path, target: Path, *, replace: bool = False) -> None:
    """Move ``tmp`` to ``target``; without ``replace``, fail if ``target`` appeared meanwhile."""
    if replace:
        os.replace(tmp, target)
    else:
        try:
            os.link(tmp, target)  # atomic and refuses to clobber
        except FileExistsError:
            raise UsageError(target, "already exists; refusing to overwrite it") from None
        except OSError as exc:
            if exc.errno not in LINK_REFUSED:
                raise
            if target.exists():
                raise UsageError(target, "already exists; refusing to overwrite it") from None
            os.rename(tmp, target)
        else:
            os.unlink(tmp)
    fsync_dir(target.parent)


@contextlib.contextmanager
def atomic_output(target: str | Path, *, replace: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; publish it only if the block succeeds.

    The block writes (and may verify) the temporary file; it is fsynced and moved into place on a
    normal exit and removed on any exception.
    """
    target = Path(target)
    if target.exists() and not replace:
        raise UsageError(
            target, "already exists; refusing to overwrite it", "choose another output"
        )
    if not target.parent.is_dir():
        raise UsageError(target, "its directory does not exist", "create it first")
    tmp = temp_name(target)
    try:
        yield tmp
        fsync_path(tmp)
        publish(tmp, target, replace=replace)
    except (OSError, RuntimeError) as exc:
        _cleanup(tmp)
        os_exc = as_os_error(exc)
        if os_exc is None:
            raise
        raise io_error(target, os_exc) from None
    except BaseException:
        _cleanup(tmp)
        raise


def io_error(target: Path, exc: OSError) -> CkptIOError:
    if exc.errno == errno.ENOSPC or "No space" in str(exc):
        return CkptIOError(target, "no space left on the device", "free disk space and retry")
    return CkptIOError(target, f"write failed ({exc.strerror or exc})")


def as_os_error(exc: BaseException) -> OSError | None:
    """``exc`` itself if it is an OSError, else the OSError behind an HDF5 RuntimeError
    ("file write failed: ..., errno = 28, ...").

    h5py raises RuntimeError, not OSError, when HDF5 cannot flush its metadata cache while
    closing a file (e.g. the disk filled up); without this a full disk is an internal error.
    """
    if isinstance(exc, OSError):
        return exc
    m = re.search(r"\berrno = (\d+)", str(exc))
    if m is None:  # closing after a failed write: the write's OSError is the context
        return exc.__context__ if isinstance(exc.__context__, OSError) else None
    code = int(m.group(1))
    return OSError(code, os.strerror(code))


def _cleanup(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        tmp.unlink()


def link_or_copy(src: Path, target: Path, copy: Callable[[Path, Path], None]) -> str:
    """Put ``src`` at ``target``: a hard link (free), or where the filesystem has none, a copy
    made by ``copy(src, tmp)`` into a temporary beside ``target``, fsynced and published. Never
    replaces anything. Returns ``"linked"`` or ``"copied"``."""
    try:
        os.link(src, target)
    except FileExistsError:
        raise UsageError(target, "already exists; refusing to overwrite it") from None
    except OSError as exc:
        if exc.errno not in LINK_REFUSED:
            raise io_error(target, exc) from None
        with atomic_output(target) as tmp:
            copy(src, tmp)
        return "copied"
    fsync_dir(target.parent)
    return "linked"


@contextlib.contextmanager
def exclusive_lock(path: Path, busy: str) -> Iterator[None]:
    """Hold an advisory flock on ``path`` (a file or a directory) while the block runs; when
    another process holds it, fail at once with ``busy`` as the problem."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise UsageError(path, "no such file or directory", "check the path") from None
    except OSError as exc:
        raise io_error(path, exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(path, busy, "wait for it to finish") from None
        yield
    finally:
        os.close(fd)


def same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
