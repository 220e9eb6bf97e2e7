"""The console every command shares: the one error wrapper and the progress display.

``run_guarded`` is how the ``ckpt-migrate`` app, the TensorFlow console scripts and the Model Zoo
scripts in ``scripts/`` end: a ``CkptError`` is one line with its exit code (README), Ctrl-C is one
``interrupted`` line and 130, anything else is an internal error (exit 1). ``--debug`` prints the
traceback first; the exit code stays the same.
"""

from __future__ import annotations

import contextlib
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ckpt_migrate.errors import CkptError

if TYPE_CHECKING:
    from ckpt_migrate.engine.upgrade import Progress

EXIT_INTERNAL = 1
EXIT_INTERRUPTED = 130


# Control characters (ESC and the rest of C0/C1) and lone surrogates, which names taken from a
# file may contain: printed raw they would drive the user's terminal.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def safe(text: str) -> str:
    """``text`` with every control character and lone surrogate shown as an escape."""
    return _UNPRINTABLE.sub(_escape, text)


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}"


def echo(text: str, err: bool = False) -> None:
    print(safe(text), file=sys.stderr if err else sys.stdout, flush=True)


def run_guarded(fn: Callable[[], int | None], *, debug: bool = False) -> int:
    """Run ``fn`` and return its exit code, turning every error into one line and a code."""
    try:
        return fn() or 0
    except CkptError as exc:
        if debug:
            traceback.print_exc()
        echo(f"error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        echo("interrupted", err=True)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if debug:
            traceback.print_exc()
        text = " ".join(str(exc).split())[:300]
        echo(f"internal error: {type(exc).__name__}: {text}; rerun with --debug", err=True)
        return EXIT_INTERNAL


@contextlib.contextmanager
def progress(enabled: bool) -> Iterator[Progress | None]:
    """A rich progress bar when stderr is a terminal; otherwise nothing."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield update
