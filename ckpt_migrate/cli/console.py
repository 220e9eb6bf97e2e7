"""The console every command shares: the one error wrapper and the progress display.

``run_guarded`` is how the ``ckpt-migrate`` app, the TensorFlow console scripts and the Model Zoo
scripts in ``scripts/`` end: a ``CkptError`` is one line with its exit code (README), Ctrl-C is one
``interrupted`` line and 130, anything else is an internal error (exit 1). ``--debug`` prints the
traceback first; the exit code stays the same.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ckpt_migrate.errors import CkptError, CkptIOError, UsageError, system_words
from ckpt_migrate.interrupt import STOP_SIGNALS, Interrupt

if TYPE_CHECKING:
    from ckpt_migrate.format.progress import Progress

EXIT_INTERNAL = 1
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # (143, as a shell reports a process it ended)
EXIT_HUNG_UP = 128 + signal.SIGHUP  # (129)
EXIT_READER_GONE = 128 + signal.SIGPIPE  # (141, as a shell reports ``cat`` under ``| head``)
_STOPPED_BY: list[int] = []  # the signal that was the interrupt, where not SIGINT
_SAID = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


# Control characters (ESC and the rest of C0/C1) and lone surrogates, which names taken from a
# file, and the file's own name, may contain: printed raw they would drive the user's terminal,
# and a newline would make one line two (a file named "a\nb.mdl" in an upgrade-dir log).
_UNPRINTABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff]")
_UNPRINTABLE_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def safe(text: str) -> str:
    """``text`` on one line, every control character and lone surrogate shown as an escape."""
    return _UNPRINTABLE.sub(_escape, text)


def safe_lines(text: str) -> str:
    """``safe``, its newlines kept: a text of several lines (indented JSON)."""
    return _UNPRINTABLE_BUT_LINES.sub(_escape, text)


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}"


def echo(text: str, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    # One write, the newline with it: ``print`` writes the two apart, and a Ctrl-C landing
    # between them left a progress line unended, the ``interrupted`` line glued to its tail.
    stream.write(safe(text) + "\n")
    stream.flush()


def echo_lines(lines: Iterable[str]) -> None:
    """``echo`` of each line, in blocks: the outline of 188k leaves took 30 s through rich's
    ``print``, a line at a time."""
    echo_pieces((f"{safe(line)}\n" for line in lines), end="")


def echo_pieces(pieces: Iterable[str], size: int = 1 << 16, end: str = "\n") -> None:
    """``echo`` of the text ``pieces`` make, written ``size`` characters at a time as they
    come: a long text (the JSON of 150k tensors, 19 MB) is never held whole, nor its pieces."""
    stream, held, count = sys.stdout, [], 0
    for piece in pieces:
        held.append(piece)
        count += len(piece)
        if count >= size:
            stream.write(safe_lines("".join(held)))
            held, count = [], 0
    held.append(end)
    stream.write(safe_lines("".join(held)))
    stream.flush()


def on_interrupt(signum: int, frame: Any) -> None:
    """SIGINT: note it (``interrupt.Interrupt``: nothing is published after it), then interrupt,
    at once or at the end of a step that must not stop half way (``Interrupt.hold``)."""
    Interrupt.press()
    if not Interrupt.held:
        raise KeyboardInterrupt


def on_terminate(signum: int, frame: Any) -> None:
    """SIGTERM (``kill``, ``timeout``, a batch scheduler's time limit, a container's stop) and
    SIGHUP (the terminal of an ssh session closed): the run stops as a Ctrl-C stops it, its
    temporary removed at once (it was left, as large as the output, until the next run of the
    same target), and says ``terminated`` (143) or ``hung up`` (129). Also where SIGINT is
    ignored (a job started with ``&``), which is when a ``kill`` is the way."""
    _STOPPED_BY.append(signum)
    on_interrupt(signum, frame)


def _stopped(published_before: int) -> int:
    """The interrupt's line, and its exit code. Preceded by what the command had put in place
    by then (``published_before``: the count when it began): an interrupt that lands as the
    output is moved into place is raised once it is there, whole and verified."""
    signum = _STOPPED_BY[0] if _STOPPED_BY else signal.SIGINT
    done, last = Interrupt.published - published_before, Interrupt.last_published
    with contextlib.suppress(OSError):  # (a closed terminal's stderr)
        if done == 1:
            echo(f"complete before the interrupt: {last}", err=True)
        elif done > 1:
            echo(f"complete before the interrupt: {done} outputs, the last {last}", err=True)
        echo(_SAID.get(signum, "interrupted"), err=True)
    return EXIT_INTERRUPTED if signum == signal.SIGINT else 128 + signum


class ReaderGone(Exception):
    """Standard output's reader went away (``| head``). Not an ``OSError``, which click would
    take and end with exit 1, the code of an internal error."""


class _Report:
    """Standard output while a command runs: a write that fails (a full disk under ``>
    report.json``) is the I/O error it is, exit 5, where it was an internal error. A reader
    gone (``| head``) ends the command quietly, exit 141 (``ReaderGone``)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as exc:
            raise _unwritten(exc) from None

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as exc:
            raise _unwritten(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _unwritten(exc: OSError) -> ReaderGone | CkptIOError:
    if exc.errno == errno.EPIPE:
        return ReaderGone()
    why = system_words(exc)
    fix = "free space where it goes, or send it elsewhere"
    return CkptIOError(None, f"cannot write to standard output ({why})", fix)


def run_guarded(fn: Callable[[], int | None], *, debug: bool = False) -> int:
    """Run ``fn`` and return its exit code, turning every error into one line and a code.

    Ctrl-C ends as one ``interrupted`` line and 130 however its KeyboardInterrupt travelled:
    raised, turned into exit code 130 by typer, or turned into another error on its way
    (``interrupt.Interrupt``). Lost altogether, it still stops every later ``publish``; a command
    that finished all the same reports its finished work. A SIGTERM or SIGHUP ends the same
    way, said as itself (``on_terminate``)."""
    _STOPPED_BY.clear()  # (a caller in this process may run several commands)
    published_before = Interrupt.published
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.default_int_handler:  # not ignored (nohup, &)
        signal.signal(signal.SIGINT, on_interrupt)
        sys.unraisablehook = _quiet_interrupts
    # (each unless ignored, as nohup ignores SIGHUP, or taken by a caller in this process)
    others = {s: signal.getsignal(s) for s in STOP_SIGNALS if s != signal.SIGINT}
    for signum, handler in others.items():
        if handler == signal.SIG_DFL:
            signal.signal(signum, on_terminate)
            sys.unraisablehook = _quiet_interrupts
    stdout = sys.stdout
    sys.stdout = _Report(stdout)
    try:
        code = fn() or 0
        sys.stdout.flush()  # (what is still buffered fails here, not as the process exits)
        if code == EXIT_INTERRUPTED and Interrupt.pressed:
            return _stopped(published_before)
        return code
    except CkptError as exc:
        if Interrupt.pressed:  # the error is an interrupt's consequence
            return _stopped(published_before)
        if debug:
            traceback.print_exc()
        echo(f"error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return _stopped(published_before)
    except ReaderGone:
        # What is still buffered goes nowhere, not into a traceback as the process exits.
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, stdout.fileno())
            os.close(null)
        return EXIT_READER_GONE
    except Exception as exc:
        if debug:
            traceback.print_exc()
        if Interrupt.pressed:
            return _stopped(published_before)
        refused = CkptIOError.refused(exc) if isinstance(exc, OSError) else None
        if refused is not None:  # a file closed to this user that no reader named itself
            echo(f"error: {refused}", err=True)
            return refused.exit_code
        text = " ".join(str(exc).split())[:300]
        echo(f"internal error: {type(exc).__name__}: {text}; rerun with --debug", err=True)
        return EXIT_INTERNAL
    finally:
        sys.stdout = stdout
        # Restored, not ignored: a caller in the same process (a test, a library user) keeps
        # its Ctrl-C, and so do the processes it starts (SIG_IGN would be inherited). The
        # console script ignores it once the outcome is printed (``cli.entry``).
        if signal.getsignal(signal.SIGINT) is on_interrupt:
            signal.signal(signal.SIGINT, previous)
        for signum, handler in others.items():
            if signal.getsignal(signum) is on_terminate:
                signal.signal(signum, handler)
        if Interrupt.pressed:
            forget_unhandled_interrupt()


def forget_unhandled_interrupt() -> None:
    """CPython marks a KeyboardInterrupt that leaves code run by ``exec(str)`` (dataclasses and
    typer build functions that way) as unhandled and then ends the process by SIGINT (-2) instead
    of our exit code, even when it was caught; the next ``exec`` of a string clears the mark."""
    exec("None")


def _quiet_interrupts(unraisable: Any) -> None:
    """A KeyboardInterrupt raised inside a destructor or weakref callback cannot propagate;
    ``Interrupt`` carries it on, so it is not printed as an "Exception ignored" traceback."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        return
    sys.__unraisablehook__(unraisable)


PROGRESS_MODES = ("auto", "bar", "plain", "none")
# Phases counted in tensors; every other phase is counted in bytes.
# The unit of each phase counted in items rather than bytes (by its last word: "file 1 of 2: write")
COUNTED_PHASES = {
    "read": "objects",
    "root": "attributes",
    "walk root": "attributes and links",
    "indexes": "datasets",
    "overlaps": "objects",
    "headers": "objects",
    "links": "links",
    "patch": "tensors",
    "write": "tensors",
    "check": "tensors",
    "load back": "storages",
    "lay out": "storages",
    "checkpoints": "checkpoints",
}


def progress_interval() -> float:
    """Seconds between two plain progress lines of a phase (``CKPT_MIGRATE_PROGRESS_INTERVAL``,
    default 5; tests set 0)."""
    try:
        return max(0.0, float(os.environ.get("CKPT_MIGRATE_PROGRESS_INTERVAL", "5")))
    except ValueError:
        return 5.0


@contextlib.contextmanager
def progress(
    enabled: bool = True, mode: str = "auto", *, beside_json: bool = False
) -> Iterator[Progress | None]:
    """The progress display on stderr: ``bar`` (rich, one bar per phase), ``plain`` (a line per
    phase at most every few seconds, for logs), ``none``; ``auto``: a bar on a terminal, plain
    lines otherwise, and nothing but the bar ``beside_json`` (a ``--json`` report, whose reader
    may take stderr with it). A mode asked for by name is kept with ``--json`` too."""
    if mode not in PROGRESS_MODES:
        raise UsageError(None, f"--progress must be one of {', '.join(PROGRESS_MODES)}")
    terminal = sys.stderr.isatty() and os.environ.get("TERM", "").lower() not in _DUMB
    if not enabled or mode == "none" or (mode == "auto" and beside_json and not terminal):
        yield None
        return
    if mode == "plain" or (mode == "auto" and not terminal):
        yield PlainProgress(progress_interval())
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("{task.description}", markup=False),  # (a file's name is no markup)
        BarColumn(),
        TextColumn("{task.fields[amount]}", markup=False),
        TimeRemainingColumn(),
        console=Console(stderr=True, soft_wrap=True),  # (rich's own: stdout; lines unbroken)
        redirect_stdout=sys.stdout.isatty(),  # (results printed above the bar, not into it)
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}
        seen: dict[str, tuple[int, int]] = {}  # (done, total) last told

        def update(phase: str, done: int, total: int) -> None:
            amount = amount_text(phase, done, total)
            before = seen.get(phase)
            seen[phase] = (done, total)
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total, amount=amount)
            elif _again(before, done, total):
                bar.reset(tasks[phase], total=total, completed=done, amount=amount)  # again
            bar.update(tasks[phase], completed=done, total=total, amount=amount)

        yield update


# Terminals that cannot redraw a line (Emacs' shell, some IDE consoles), where rich draws no
# bar at all: there plain lines are the progress.
_DUMB = ("dumb", "unknown")


def _again(before: tuple[int, int] | None, done: int, total: int) -> bool:
    """Whether a phase last told ``before`` (done, total) begins again (the second file's
    ``read``): its count went back, or it had ended and is not at its end."""
    if before is None:
        return False
    return done < before[0] or (0 < before[1] <= before[0] and done < total)


class PlainProgress:
    """Progress as plain lines on stderr, for logs: at most one line per phase every
    ``interval`` seconds, each with the time left, and the phase's end once it has shown a
    line. A phase shorter than ``interval`` prints nothing.

    The time left is at the rate since the phase first moved, so a wait before its first step
    (``verify``'s first tensor waits for both files' walks) is not taken for its pace: that
    said "about 361 h left" at 150k tensors. Nor is it said before 1% is done. A phase that
    begins again (the second file's ``read``) starts its clock again."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.born = time.monotonic()
        self.began: dict[str, float] = {}
        self.clock: dict[str, tuple[float, int, bool]] = {}  # (since, done then, moved)
        self.shown: dict[str, tuple[float, int]] = {}
        self.seen: dict[str, tuple[int, int]] = {}  # (done, total) last told

    def __call__(self, phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        before = self.seen.get(phase)
        self.seen[phase] = (done, total)
        if before is None or _again(before, done, total):
            self.began[phase] = now  # (a phase that begins, or again)
            self.clock[phase] = (now, done, False)
            self.shown.pop(phase, None)
        since, at_start, moved = self.clock[phase]
        if not moved and done > at_start:
            self.clock[phase] = since, at_start, moved = now, done, True
        last_at, last_done = self.shown.get(phase, (self.began[phase], -1))
        finished = total > 0 and done >= total
        if done == last_done:
            return
        due = now - last_at >= self.interval
        if not (due or (finished and phase in self.shown)):
            return
        self.shown[phase] = (now, done)
        text = f"{phase}: {amount_text(phase, done, total)}"
        if total > 0:
            text += f" ({100 * done // total}%)"
        steps = done - at_start
        if not finished and moved and steps * 100 >= total and now - since > 0.5:
            text += f", about {_duration((total - done) * (now - since) / steps)} left"
        echo(text, err=True)

    def milestone(self, what: str, done: int, total: int) -> None:
        """A line every time (a directory's file done, say): the whole run's amount so far and
        its time left at the run's rate. A terminal's bars show the same without it."""
        text = f"{what}: {amount_text(what, done, total)}"
        if 0 < done < total:
            left = (total - done) * (time.monotonic() - self.born) / done
            text += f" ({100 * done // total}%), about {_duration(left)} left"
        echo(text, err=True)


def each_done(progress: Progress | None, what: str) -> Callable[[int, int], None] | None:
    """``progress`` told of each item done (a cluster's checkpoint): a line for each in a log
    (``milestone``), the bar ``what`` on a terminal, nothing with ``-q``."""
    if progress is None:
        return None
    say = getattr(progress, "milestone", progress)
    return lambda done, total: say(what, done, total)


def amount_text(phase: str, done: int, total: int) -> str:
    unit = COUNTED_PHASES.get(phase) or COUNTED_PHASES.get(phase.rsplit(" ", 1)[-1])
    if unit is not None:
        return f"{done:,} of {total:,} {unit}"
    return f"{_bytes(done)} of {_bytes(total)}"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
