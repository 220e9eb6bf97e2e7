"""Progress of a long step, as the command line shows it: ``progress(phase, done, total)``,
called as the step goes (``cli.console`` draws a bar, or a line every few seconds)."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str, int, int], None]


def counter(progress: Progress, phase: str, total: int, every: int) -> Callable[[], None]:
    """A call per item of a loop of ``total``, reported every ``every`` items and at the first
    as its beginning (0 done: a phase run twice with the same numbers, as ``verify``'s two
    reads of a file and its copy, is told apart); the loop's caller reports the end."""
    done = 0

    def count() -> None:
        nonlocal done
        if not done:
            progress(phase, 0, total)
        done += 1
        if done % every == 0:
            progress(phase, min(done, total), total)

    return count
