"""Typer options that several ``ckpt-migrate`` verbs share (one spelling, one help text)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
JsonLinesOpt = Annotated[bool, typer.Option("--json", help="One JSON object per file.")]
ToOpt = Annotated[
    str, typer.Option("--to", help="Target release, e.g. 2.0 or latest.", show_default=True)
]
FromOpt = Annotated[
    str | None,
    typer.Option(
        "--from", help="Treat the file as this release (for files whose metadata is wrong)."
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Model family for the model-key steps (gpt2, llama, bert, t5, …); "
        "default: detected from the key names.",
    ),
]
InplaceOpt = Annotated[
    bool, typer.Option("--inplace", help="Replace each file, keeping <name>.pre-<release>.bak.")
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run", "-n", help="Preview: every change and check of the real run; write nothing."
    ),
]
ProgressOpt = Annotated[
    str,
    typer.Option(
        "--progress",
        help="auto (a bar on a terminal, plain lines in logs), bar, plain or none.",
        show_default=True,
    ),
]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress and no per-change lines.")
]
OutputDirOpt = Annotated[
    Path | None,
    typer.Option("--output-dir", "-o", help="Write here (created if missing), same names."),
]
UpgradeVerifyOpt = Annotated[
    str,
    typer.Option("--verify", help="index: by stored-chunk identity; full: hash every tensor."),
]
AllowMissingOpt = Annotated[
    bool, typer.Option("--allow-missing", help="Write leaves the file lacks as None.")
]
ExcludeOpt = Annotated[
    list[str] | None,
    typer.Option("--exclude", help="Leave out variables matching this regex (repeatable)."),
]
TfVerifyOpt = Annotated[
    str, typer.Option("--verify", help="structure (names, dtypes, shapes) or full (sha256).")
]
ConfigPathOpt = Annotated[
    Path | None, typer.Option("--config", help="The run's params.yaml (tie flags, seed).")
]
