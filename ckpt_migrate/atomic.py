"""Crash-safe file operations: write beside the target, fsync, then move into place.

A crash at any moment leaves at most a ``<name>.<8 hex>.tmp`` file (never a file at the target
name), and an existing target is never truncated or replaced unless the caller asks for it.
Also the one advisory lock (``advisory_lock``) and the one link-or-copy (``link_or_copy``) the
engine, ``upgrade-dir`` and the manager share.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ckpt_migrate.errors import CkptIOError, UsageError
from ckpt_migrate.interrupt import Interrupt
from ckpt_migrate.sidenames import NAME_MAX, cut_bytes, side_name, tail

TMP_SUFFIX = ".tmp"
_TEMP_TAIL = tail(TMP_SUFFIX)
# os.link fails with these where the filesystem (or a mount boundary) has no hard links.
LINK_REFUSED = (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK)


def temp_name(target: Path) -> Path:
    return target.with_name(side_name(target.name, TMP_SUFFIX))


def check_fits(path: Path, suffix: str, what: str, fix: str) -> None:
    """Refuse ``path`` if ``what`` (``a backup``), named by ``suffix`` added to its name, cannot be
    made beside it."""
    size = len(os.fsencode(path.name + suffix))
    if size > NAME_MAX:
        problem = f"its name is too long for {what} beside it (with {suffix} it makes {size} bytes"
        raise UsageError(path, f"{problem}, more than the {NAME_MAX} a name may have)", fix)


def create_temp(target: Path, like: Path | None = None) -> tuple[Path, int]:
    """Create ``target``'s temporary file, empty, and take an exclusive flock on it; returns the
    path and the descriptor that holds the lock (close it once the file is published or gone).
    The lock marks the file as being written: ``remove_stale_temporaries`` leaves it alone, and
    the kernel drops it when the writer dies, however it dies. ``like``: the file it is made
    from, whose group and others permission bits it never exceeds (as ``cp`` makes a copy: the
    source's, within the umask), from its creation on: a private checkpoint's upgrade is
    private too. Its owner may read and write it (HDF5 opens it again to write, a read-only
    source's too)."""
    tmp = temp_name(target)
    mode = 0o644 if like is None else 0o600 | (0o666 & stat.S_IMODE(os.stat(like).st_mode))
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        _cleanup(tmp)
        raise
    return tmp, fd


# A writer's file is empty until it holds its lock: younger empty files may be being created.
_CREATING_SECONDS = 10.0


def remove_stale_temporaries(target: Path) -> list[Path]:
    """Remove the temporary files that killed writers of ``target`` left beside it, and return
    them: files named as ``temp_name`` names them (of ``target`` or of its ``.pre-R.bak``
    backup) that no live process holds the lock of. A live writer's file is never touched.
    (A long name's temporaries, and its backup's, are known by its first bytes: ``fitting``.)"""
    raw = os.fsencode(target.name)
    cut = ""
    if len(raw) + len(".pre-99.99.bak") + _TEMP_TAIL > NAME_MAX:  # (else none is cut)
        cut = rf"|{re.escape(os.fsdecode(raw[: cut_bytes(_TEMP_TAIL)]))}.*~[0-9a-f]{{8}}"
    pattern = re.compile(
        rf"(?:{re.escape(target.name)}(?:\.pre-\d+\.\d+\.bak)?{cut})"
        rf"\.[0-9a-f]{{8}}{re.escape(TMP_SUFFIX)}",
        re.DOTALL,
    )
    try:
        names = [n for n in os.listdir(target.parent) if pattern.fullmatch(n)]
    except OSError:
        return []
    removed = []
    for name in names:
        path = target.parent / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            st = os.fstat(fd)
            creating = st.st_size == 0 and time.time() - st.st_mtime < _CREATING_SECONDS
            if not creating and stat.S_ISREG(st.st_mode) and os.stat(path).st_ino == st.st_ino:
                os.unlink(path)
                removed.append(path)
        except OSError:  # locked by a live writer, or gone meanwhile
            pass
        finally:
            os.close(fd)
    if removed:
        fsync_dir(target.parent)
    return removed


def fsync_path(path: Path, *, settle: bool = False) -> None:
    """``settle``: a finished file, whose room ``reserve`` kept past its end is freed first."""
    fd = os.open(path, os.O_RDWR if settle else os.O_RDONLY)
    try:
        if settle:
            os.ftruncate(fd, os.fstat(fd).st_size)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
        fsync_path(path)


_FALLOC_FL_KEEP_SIZE = 1
_libc: ctypes.CDLL | None = None


def _c_library() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return _libc


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """``fallocate(2)``: no emulation by writing zeros (glibc's ``posix_fallocate`` does that
    where the filesystem cannot allocate, which would cost a write of every block)."""
    if _c_library().fallocate(fd, mode, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def reserve(fd: int, size: int, total: int, *, allocate_existing: bool = True) -> None:
    """Allocate the disk space a file of ``size`` bytes growing to ``total`` will need, now.

    Blocks of ``[0, size)`` are allocated (holes a copy fills later included; skipped with
    ``allocate_existing=False``, for a clone whose blocks are shared) and the growth up to
    ``total`` is reserved past the end without changing the file's size, so a full disk is met
    here, before HDF5 edits a byte: HDF5 meeting ENOSPC in the middle of a metadata edit has
    crashed (SIGSEGV). Where the filesystem cannot allocate (tmpfs of old kernels, NFS v3, ZFS
    before 2.2), the free space is checked instead. Raises ``OSError(ENOSPC)``."""
    try:
        if size and allocate_existing:
            fallocate(fd, 0, 0, size)
        if total > size:
            fallocate(fd, _FALLOC_FL_KEEP_SIZE, size, total - size)
        return
    except (OSError, AttributeError) as exc:
        if isinstance(exc, OSError) and exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise
    needed = total - (os.fstat(fd).st_blocks * 512 if allocate_existing else size)
    require_free(fd, needed)


def require_free(fd: int, needed: int) -> None:
    """Raise ``OSError(ENOSPC)`` unless the filesystem of ``fd`` has ``needed`` bytes free (a
    filesystem reporting no size at all, such as ramfs, counts as unknown: not refused)."""
    st = os.fstatvfs(fd)
    if st.f_blocks and st.f_bavail * st.f_frsize < needed:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


_EXISTS, _ELSEWHERE = "already exists; refusing to overwrite it", "choose another output"


def take_place_of(tmp: Path, original: Path) -> None:
    """Give ``tmp``, which is to replace ``original``, its permission bits and, where this
    process may, its owner and group (a root's in-place upgrade of a user's file stays theirs)."""
    st = os.stat(original)
    with contextlib.suppress(PermissionError):
        os.chown(tmp, st.st_uid, st.st_gid)
    os.chmod(tmp, stat.S_IMODE(st.st_mode))


def publish(tmp: Path, target: Path, *, replace: bool = False, note: bool = True) -> None:
    """Move ``tmp`` to ``target``; without ``replace``, fail if ``target`` appeared meanwhile.
    Never after Ctrl-C (``Interrupt``); a Ctrl-C while it moves the file is raised once the
    file is in place and counted (``Interrupt.published``; ``note``: unless the caller counts
    a whole made of several files itself), so the command can say so."""
    with Interrupt.hold():
        Interrupt.check()
        if replace:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)  # atomic and refuses to clobber
            except FileExistsError:
                raise UsageError(target, _EXISTS, _ELSEWHERE) from None
            except OSError as exc:
                if exc.errno not in LINK_REFUSED:
                    raise
                if target.exists():
                    raise UsageError(target, _EXISTS, _ELSEWHERE) from None
                os.rename(tmp, target)
            else:
                os.unlink(tmp)
        if note:
            Interrupt.note_published(target)
        fsync_dir(target.parent)


@contextlib.contextmanager
def atomic_output(
    target: str | Path, *, replace: bool = False, like: Path | None = None
) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; publish it only if the block succeeds.

    The temporary file exists, empty and locked (``create_temp``, which ``like`` is given to);
    the block writes it (opening it for writing truncates nothing but itself) and may verify
    it; it is fsynced and moved into place on a normal exit and removed on any exception.
    """
    target = Path(target)
    if output_exists(target) and not replace:
        raise UsageError(target, _EXISTS, _ELSEWHERE)
    check_parent(target)
    try:
        tmp, lock = create_temp(target, like)
    except OSError as exc:
        raise io_error(target, exc) from None
    try:
        yield tmp
        fsync_path(tmp, settle=True)
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
    finally:
        os.close(lock)


def output_exists(target: Path) -> bool:
    """``target`` is taken (a dangling link too); a name too long is an error, not a crash."""
    try:
        return target.exists() or target.is_symlink()
    except OSError as exc:
        raise io_error(target, exc) from None


def check_output(target: Path, *, force: bool) -> None:
    """Before any work: ``target`` is new in an existing directory, or a regular file that
    ``force`` replaces (never a directory, a link or a device)."""
    if output_exists(target):
        if not force:
            raise UsageError(target, _EXISTS, "remove it first")
        if not target.is_file() or target.is_symlink():
            raise UsageError(target, "is not a regular file; --force replaces only files")
    else:
        check_parent(target)


def path_exists(path: Path) -> bool:
    """``path.exists()``; a directory on its way that this user may not enter is the I/O
    error it is (``pathlib`` raises ``PermissionError``), not a traceback."""
    try:
        return path.exists()
    except OSError as exc:
        raise CkptIOError.reading(path, exc) from None


def object_address(path: object) -> str | None:
    """``s3://bucket/key`` where ``path`` is an object's address, also after ``pathlib`` folded
    its ``//`` into ``/``; None for a local path."""
    text = str(path)
    return "s3://" + text[len("s3:/") :].lstrip("/") if text.startswith("s3:/") else None


def refuse_object_address(path: Path | str, *, writing: bool = False) -> None:
    """One line for an ``s3://`` address given where a command takes a local path: it read as
    a missing file, or as a directory to create first."""
    address = object_address(path)
    if address is None:
        return
    if writing:
        problem = "is an object-store address; this command writes local files"
        fix = "write here, then upload (upgrade and upgrade-dir write s3:// themselves)"
    else:
        problem = "is an object-store address; this command reads local files"
        fix = "download it first (upgrade and upgrade-dir read s3:// themselves)"
    raise UsageError(address, problem, fix)


def check_parent(target: Path) -> None:
    """Refuse ``target`` unless its directory exists, saying what is in the way."""
    if target.parent.is_dir():
        return
    refuse_object_address(target, writing=True)
    refuse_file_on_the_way(target)
    raise UsageError(target, "its directory does not exist", "create it first")


def refuse_file_on_the_way(target: Path) -> None:
    """Refuse ``target`` if one of its parents is a file (exit 2: the path given is wrong,
    not the disk)."""
    blocking = _file_on_the_way(target)
    if blocking is not None:
        raise UsageError(
            target, f"cannot be written: {blocking} is a file, not a directory", _ELSEWHERE
        )


def io_error(target: Path, exc: OSError) -> CkptIOError:
    """``exc`` in plain words: the place, what went wrong and what to do (never HDF5's
    error stack)."""
    if exc.errno == errno.ENOSPC or "No space" in str(exc):
        return CkptIOError(target, "no space left on the device", "free disk space and retry")
    if exc.errno in (errno.EACCES, errno.EPERM):
        refused = CkptIOError.refused(exc)
        if refused is not None:  # the source, a side file, their directory: read, not written
            return refused
        return CkptIOError(
            None,
            f"permission denied writing {target}",
            "choose a place you can write to, or change its permissions",
        )
    if exc.errno == errno.EROFS:
        return CkptIOError(
            None, f"cannot write {target}: read-only file system", "choose a writable place"
        )
    reason = os.strerror(exc.errno) if exc.errno else " ".join(str(exc).split())[:120]
    fix = "check the path" if exc.errno in (errno.ENOENT, errno.ENOTDIR) else None
    fix = "choose a shorter name" if exc.errno == errno.ENAMETOOLONG else fix
    return CkptIOError(target, f"write failed ({reason})", fix)


def _file_on_the_way(target: Path) -> Path | None:
    """The first of ``target``'s parents that exists and is not a directory."""
    for parent in reversed(Path(target).parents):
        if parent.exists() and not parent.is_dir():
            return parent
    return None


@contextlib.contextmanager
def made_directory(directory: Path) -> Iterator[None]:
    """``directory``, made where missing with its missing parents; those made here are removed
    again when the block ends and they are empty: a refused or failed run leaves no new
    directory behind. An existing ``directory`` (or a file of that name, which the caller
    refuses) is left as it is."""
    made = []
    missing = directory
    while not missing.exists() and not missing.is_symlink() and missing.parent != missing:
        made.append(missing)
        missing = missing.parent
    if made:
        refuse_file_on_the_way(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise io_error(directory, exc) from None
    try:
        yield
    finally:
        for path in made:  # (deepest first; a directory something was written into stays)
            try:
                path.rmdir()
            except OSError:
                break


def check_writable(directory: Path) -> None:
    """Raise ``CkptIOError`` (exit 5) now, before any work, if no file can be created in
    ``directory`` (or, if it does not exist yet, in the nearest parent that does, where it will
    be created). The probe is an unnamed file (``O_TMPFILE``), which a kill cannot strand, or
    where the filesystem has none a named temporary removed at once."""
    existing = directory
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if existing != directory:
        refuse_file_on_the_way(directory)
    unnamed = getattr(os, "O_TMPFILE", 0)
    if unnamed:
        try:  # a file with no name: a kill at any moment leaves nothing behind
            os.close(os.open(existing, unnamed | os.O_WRONLY, 0o600))
            return
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise io_error(directory, exc) from None
    try:
        fd, name = tempfile.mkstemp(dir=existing, prefix=".ckpt-migrate-probe.")
    except OSError as exc:
        raise io_error(directory, exc) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)


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
        raise UsageError(target, _EXISTS, _ELSEWHERE) from None
    except OSError as exc:
        if exc.errno not in LINK_REFUSED:
            raise io_error(target, exc) from None
        with atomic_output(target, like=src) as tmp:
            copy(src, tmp)
        return "copied"
    fsync_dir(target.parent)
    return "linked"


@contextlib.contextmanager
def advisory_lock(path: Path, busy: str, *, shared: bool = False) -> Iterator[None]:
    """Hold an advisory flock on ``path`` (a file or a directory) while the block runs; when
    another process holds a lock that excludes it, fail at once with ``busy`` as the problem.
    ``shared`` locks (readers) coexist with each other, never with the exclusive one."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise UsageError(path, "no such file or directory", "check the path") from None
    except OSError as exc:
        raise io_error(path, exc) from None
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(path, busy, "wait for it to finish") from None
        yield
    finally:
        os.close(fd)


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same absolute name (whether or not it exists
    yet), or one existing file (through a link, another name)."""
    if Path(a).absolute() == Path(b).absolute():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
