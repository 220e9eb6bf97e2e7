"""Progress of a long step, as the command line shows it: ``progress(phase, done, total)``,
called as the step goes (``cli.console`` draws a bar, or a line every few seconds)."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str, int, int], None]


class Count:
    """A loop's items told to ``progress`` as ``phase``: every ``every`` items, and at the first
    as its beginning (0 done: a phase run twice with the same numbers, as ``verify``'s two
    reads of a file and its copy, is told apart); ``end`` tells the end. Without ``progress``
    it tells nothing."""

    __slots__ = ("done", "every", "phase", "progress", "total")

    def __init__(self, progress: Progress | None, phase: str, total: int, every: int) -> None:
        self.progress, self.phase, self.total, self.every = progress, phase, total, every
        self.done = 0

    def __call__(self) -> None:
        if self.progress is None:
            return
        if not self.done:
            self.progress(self.phase, 0, self.total)
        self.done += 1
        if self.done % self.every == 0:
            self.progress(self.phase, min(self.done, self.total), self.total)

    def add(self, n: int) -> None:
        """``n`` items at once, each ``every``-th told as one by one would."""
        if self.progress is None or n <= 0:
            return
        if not self.done:
            self.progress(self.phase, 0, self.total)
        start, self.done = self.done, self.done + n
        for at in range(start - start % self.every + self.every, self.done + 1, self.every):
            self.progress(self.phase, min(at, self.total), self.total)

    def end(self) -> None:
        if self.progress is not None:
            self.progress(self.phase, self.total, self.total)
