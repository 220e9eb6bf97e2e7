"""Ctrl-C and its kin, as the whole package sees them: whether one was pressed, and the steps
it must not cut in two."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

# What stops a command as Ctrl-C does: a terminal's SIGINT, a ``kill``'s SIGTERM, a closed
# terminal's SIGHUP (``cli.console``; held across a fork by ``h5.children``).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupt:
    """Whether Ctrl-C (SIGINT) has been pressed in this process. The command line's handler
    (``cli.console.on_interrupt``) sets it before raising KeyboardInterrupt. Python runs that
    handler between any two bytecodes, also inside a destructor or a callback from HDF5's C
    code, where the exception is printed and dropped ("Exception ignored in ...") and the work
    goes on; so ``publish`` looks at the flag itself and never moves a file into place after an
    interrupt."""

    pressed = False
    held = 0  # inside ``hold``: a press is noted, its KeyboardInterrupt raised at the end
    published = 0  # outputs put in place in this process (a file, an object in a store)
    last_published: str | None = None
    quiet = 0  # inside ``unnoted``

    @classmethod
    def press(cls) -> None:
        cls.pressed = True

    @classmethod
    def check(cls) -> None:
        """Raise KeyboardInterrupt if Ctrl-C was pressed, even if its exception was lost."""
        if cls.pressed:
            raise KeyboardInterrupt

    @classmethod
    @contextlib.contextmanager
    def hold(cls) -> Iterator[None]:
        """A step that must not stop half way (a rename and the removal of its temporary): a
        press is raised at the end of the outermost step, unless an error ended it first.
        Under Python's own SIGINT handler (the library called from a program or a notebook) a
        handler is put in its place for the step, which notes the press for the step alone."""
        pressed_here: list[int] = []
        previous = None
        if not cls.held and _default_handler_here():
            previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed_here.append(1))
        cls.held += 1
        try:
            yield
        finally:
            cls.held -= 1
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if not cls.held:
            cls.check()
            if pressed_here:
                raise KeyboardInterrupt

    @classmethod
    def note_published(cls, target: str | Path) -> None:
        if not cls.quiet:
            cls.published += 1
            cls.last_published = str(target)

    @classmethod
    @contextlib.contextmanager
    def unnoted(cls) -> Iterator[None]:
        """Files put in place meanwhile are not the command's outputs (a staging file)."""
        cls.quiet += 1
        try:
            yield
        finally:
            cls.quiet -= 1


def _default_handler_here() -> bool:
    return (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )
