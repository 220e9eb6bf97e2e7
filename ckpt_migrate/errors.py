"""Errors that end a command with a one-line message and a distinct exit code.

Every message names the file, the problem and, where there is one, the fix. The CLI prints
``str(error)`` and exits with ``error.exit_code``; a traceback is shown only with ``--debug``.
"""

from __future__ import annotations

import errno
import importlib
import os
from pathlib import Path
from typing import Any

# Exit codes, documented in the README.
EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_NEWER_THAN_TOOL = 3
EXIT_VERIFY_FAILED = 4
EXIT_IO = 5
EXIT_UPGRADE_NEEDED = 10


class CkptError(Exception):
    """Base class: a problem the user can act on."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, path: str | Path | None, problem: str, fix: str | None = None):
        self.path = None if path is None else str(path)
        self.problem = problem
        self.fix = fix
        super().__init__(self._line())

    def _line(self) -> str:
        head = f"{self.path}: {self.problem}" if self.path else self.problem
        text = f"{head}; {self.fix}" if self.fix else head
        return " ".join(text.split())  # always one line


class NotACheckpointError(CkptError):
    """The file is missing, not HDF5, or HDF5 without the checkpoint layout."""


class CorruptCheckpointError(CkptError):
    """The file claims to be a checkpoint but its contents are inconsistent."""


class UnsafeContentError(CkptError):
    """The file asks for something a safe reader must not do (run code, import modules)."""


class NewerThanToolError(CkptError):
    exit_code = EXIT_NEWER_THAN_TOOL


class KeyCollisionError(CkptError):
    """Two leaves would get the same stored name."""


class MissingLeavesError(CkptError):
    """The spec names leaves that have no data in the file."""


class UnsupportedContentError(CkptError):
    """A value the chosen format cannot express."""


class UsageError(CkptError):
    """Bad arguments."""


class VerificationError(CkptError):
    exit_code = EXIT_VERIFY_FAILED


def system_words(exc: OSError) -> str:
    """What the system says of ``exc``: its code's words (h5py puts HDF5's whole report where
    they go), else its message."""
    return os.strerror(exc.errno) if exc.errno else exc.strerror or str(exc)


class CkptIOError(CkptError):
    """Disk full, permission denied, or another operating-system failure."""

    exit_code = EXIT_IO

    @classmethod
    def reading(cls, path: Path | str, exc: OSError, *, listing: bool = False) -> CkptIOError:
        """``path`` could not be read (its permissions, the disk): never what it holds.
        ``listing``: a directory, also where this user may not even tell it is one."""
        what = "list the directory" if listing or os.path.isdir(path) else "read the file"
        return cls(path, f"cannot {what} ({system_words(exc)})")

    @classmethod
    def refused(cls, exc: OSError) -> CkptIOError | None:
        """``exc`` as the read error it is where the file it names is one this user may not
        read, or lies in a directory the user may not enter (that one is named); None where
        neither is so. What the command created, or failed to create, did not exist: its
        failure is a write's."""
        if exc.errno not in (errno.EACCES, errno.EPERM) or exc.filename is None:
            return None
        path = os.fsdecode(exc.filename)
        if os.path.lexists(path):
            return None if os.access(path, os.R_OK) else cls.reading(path, exc)
        parent = os.path.dirname(path)
        while parent and not os.path.lexists(parent):
            parent = os.path.dirname(parent)
        parent = parent or "."
        if os.path.isdir(parent) and not os.access(parent, os.X_OK):
            return cls.reading(parent, exc, listing=True)
        return None


class StateSelectionError(UsageError, KeyError):
    """A requested top-level state (``model``, ``optimizer``, ...) is not in the checkpoint.

    Also a ``KeyError``, as the Cerebras ``LoadCheckpointStates`` callback raises one."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class StateMismatchError(CkptError, RuntimeError):
    """Strict loading found missing or unexpected keys (or a shape that cannot be loaded).

    Also a ``RuntimeError``, like ``torch.nn.Module.load_state_dict`` in strict mode."""

    def __init__(
        self,
        path: str | Path | None,
        problem: str,
        fix: str | None = None,
        *,
        missing: dict[str, list[str]] | None = None,
        unexpected: dict[str, list[str]] | None = None,
    ):
        self.missing_keys = missing or {}
        self.unexpected_keys = unexpected or {}
        super().__init__(path, problem, fix)


def require(module: str, extra: str) -> Any:
    """Import an optional package, or end with the one-line install hint (exit 2)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(
            None,
            f"this needs the optional package {module.split('.')[0]}",
            f"pip install 'ckpt-migrate[{extra}]'",
        ) from None
