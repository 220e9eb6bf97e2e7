"""Progress of a long step, as the command line shows it: ``progress(phase, done, total)``,
called as the step goes (``cli.console`` draws a bar, or a line every few seconds)."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str, int, int], None]


def counter(progress: Progress, phase: str, total: int, every: int) -> Callable[[], None]:
    """A call per item of a loop of ``total``, reported every ``every`` items; the loop's
    caller reports the end (``total`` of ``total``)."""
    done = 0

    def count() -> None:
        nonlocal done
        done += 1
        if done % every == 0:
            progress(phase, min(done, total), total)

    return count
