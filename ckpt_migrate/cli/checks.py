"""``check``: whether checkpoints are at a release, for CI. One file answers as it always has
(a line, or one JSON document, and its exit code); several are each answered, a damaged or
unreadable one among them too, and the exit code is the worst of theirs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_migrate import cli
from ckpt_migrate.cli import console, render
from ckpt_migrate.errors import EXIT_UPGRADE_NEEDED, CkptError


@dataclass(frozen=True)
class Asked:
    """The command line of ``check``, beside its files."""

    to: str
    from_release: str | None
    deep: bool
    as_json: bool
    progress_mode: str
    quiet: bool


def check(paths: list[Path], asked: Asked) -> int:
    if len(paths) == 1:
        return _one(paths[0], asked)
    codes = []
    for path in paths:
        try:
            codes.append(_one(path, asked, lines=True))
        except CkptError as exc:  # (this file's answer; the others are still asked)
            if exc.path is None:  # (the command's: an unknown --to)
                raise
            codes.append(_failed({"path": str(path)}, exc, asked.as_json))
    return worst(codes)


def worst(codes: list[int]) -> int:
    """An error's code before ``EXIT_UPGRADE_NEEDED``, which is no error, before 0: a CI job
    told that one file needs an upgrade is not to miss that another is unreadable."""
    return max(codes, key=lambda c: (c not in (0, EXIT_UPGRADE_NEEDED), c != 0, c), default=0)


def _one(path: Path, asked: Asked, lines: bool = False) -> int:
    """``lines``: JSON as one line a file (several files), not an indented document."""
    report = None
    if asked.deep:
        shown = not asked.quiet
        with console.progress(shown, asked.progress_mode, beside_json=asked.as_json) as progress:
            report = cli.commands.deep_check(path, progress)
        if not asked.as_json:
            render.deep_check(report)
    data: dict[str, Any] = cli.commands.check(path, asked.to, asked.from_release)
    if asked.as_json:
        document = {**data, "deep": report.to_json()} if report else data
        error = report.error() if report else None
        if lines and error is not None:  # (one line for the file, its error in it)
            return _failed(document, error, True)
        if lines:
            console.echo(json.dumps(document))
        else:
            render.emit_json(document)
        if error is not None:
            raise error
    elif data["current"]:
        console.echo(f"{path}: at {data['target']}")
    else:
        if data["release"] == data["target"]:  # (in another release's container)
            how = "writing in its own release's container at"
        else:
            how = "downgrading to" if data["downgrade"] else "upgrading to"
        console.echo(f"{path}: {data['release']} needs {how} {data['target']}")
    if "note" in data and not asked.as_json and not asked.quiet:
        console.echo(f"note: {path}: {data['note']}", err=True)
    return 0 if data["current"] else EXIT_UPGRADE_NEEDED


def _failed(answer: dict[str, Any], error: CkptError, as_json: bool) -> int:
    """One of several files' error: its line on stderr, and with ``--json`` its answer's."""
    if as_json:
        console.echo(json.dumps({**answer, "error": str(error), "exit_code": error.exit_code}))
    console.echo(f"error: {error}", err=True)
    return error.exit_code
