"""Checkpoint file names in a model directory: ``checkpoint_{step}.mdl`` and its relatives.

The Cerebras Trainer names checkpoints from a pattern with one ``{step}`` field; when the name is
taken, ``{step}`` becomes ``<step>_<YYYYmmdd_HHMMSS>``. Autoload takes the newest by (step,
timestamp), a name without a timestamp counting as the oldest of its step
(MODELZOO_HISTORY.md §4.1). Unlike the Trainer, names are matched with ``fullmatch`` on the
*file name* (not the whole path), with the literal parts escaped (the Trainer leaves the ``.`` of
``.mdl`` unescaped), so temporary files, backups and subset files never match.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path

from ckpt_migrate.errors import CkptIOError

DEFAULT_NAME = "checkpoint_{step}.mdl"
TIMESTAMP_FORMAT = "%Y%m%d_%H%M%S"
TEMP_SUFFIX = ".tmp"  # atomic.temp_name: "<name>.<8 hex>.tmp"


@dataclass(frozen=True, order=True)
class NameMatch:
    step: int
    timestamp: str  # "" for a name without the collision suffix: the oldest of its step

    @property
    def sort_key(self) -> tuple[int, str]:
        return (self.step, self.timestamp)


class NamePattern:
    """A checkpoint name pattern with exactly one ``{step}`` field (e.g. ``{step:06d}``)."""

    def __init__(self, pattern: str = DEFAULT_NAME):
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"checkpoint name pattern must be a non-empty string, not {pattern!r}")
        try:
            parts = list(string.Formatter().parse(pattern))
        except ValueError as exc:
            raise ValueError(f"checkpoint name pattern {pattern!r}: {exc}") from None
        fields = [(name, spec, conv) for _, name, spec, conv in parts if name is not None]
        if len(fields) != 1 or fields[0][0] != "step" or fields[0][2] is not None:
            raise ValueError(
                f"checkpoint name pattern {pattern!r} must have exactly one field, {{step}} "
                "(optionally with a format spec such as {step:06d})"
            )
        spec = fields[0][1] or ""
        try:
            sample = format(12, spec)
        except ValueError:
            raise ValueError(f"{{step:{spec}}} in {pattern!r} is not an integer format") from None
        if not sample.isdigit() or int(sample) != 12:
            raise ValueError(f"{{step:{spec}}} in {pattern!r} must format a step as plain digits")
        if "/" in pattern or "\\" in pattern or pattern.startswith("."):
            raise ValueError(
                f"checkpoint name pattern {pattern!r} must be a plain file name "
                "(no directory parts, not hidden)"
            )
        if pattern.endswith(TEMP_SUFFIX):
            raise ValueError(f"checkpoint name pattern {pattern!r} must not end in {TEMP_SUFFIX}")
        self.pattern = pattern
        self._spec = spec
        at = next(i for i, part in enumerate(parts) if part[1] is not None)
        self.prefix = "".join(part[0] for part in parts[: at + 1])  # literal text, unescaped
        self.suffix = "".join(part[0] for part in parts[at + 1 :])
        self.regex = re.compile(
            re.escape(self.prefix)
            + r"(?P<step>\d+)(?:_(?P<timestamp>\d{8}_\d{6}))?"
            + re.escape(self.suffix)
        )

    def __repr__(self) -> str:
        return f"NamePattern({self.pattern!r})"

    def name(self, step: int, timestamp: str | None = None) -> str:
        text = format(step, self._spec)
        if timestamp:
            text = f"{text}_{timestamp}"
        return f"{self.prefix}{text}{self.suffix}"

    def match(self, name: str) -> NameMatch | None:
        """The step and timestamp of a file name, or None if it is not a checkpoint name."""
        m = self.regex.fullmatch(name)
        if m is None:
            return None
        return NameMatch(int(m.group("step")), m.group("timestamp") or "")

    def checkpoints(
        self, directory: str | Path, *, symlinks: bool = True
    ) -> list[tuple[NameMatch, Path]]:
        """Files in ``directory`` named by this pattern, oldest first (symbolic links to files
        included unless ``symlinks`` is false)."""
        found: list[tuple[NameMatch, Path]] = []
        try:
            entries = list(Path(directory).iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:  # (this user may not list it: not an empty directory)
            raise CkptIOError.reading(directory, exc, listing=True) from None
        for path in entries:
            m = self.match(path.name)
            if m is None or (path.is_symlink() and not symlinks):
                continue
            if path.is_file():
                found.append((m, path))
        found.sort(key=lambda item: (item[0].sort_key, item[1].name))
        return found
