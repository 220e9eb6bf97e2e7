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
CopyMethodOpt = Annotated[
    str,
    typer.Option(
        "--copy-method",
        help="auto: share the unchanged bytes with the source where the filesystem can "
        "(clone: XFS reflink, btrfs, ZFS 2.2+; server-side copy on NFS 4.2), else copy; "
        "clone: share or fail; copy: always copy.",
    ),
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
DataIterDirOpt = Annotated[
    Path | None,
    typer.Option("--data-iter-dir", help="1.8/1.9 dataloader side files (for 1.9 → 2.0)."),
]
DataloaderTypeOpt = Annotated[
    str | None,
    typer.Option("--dataloader-type", help="map or iterable (with --data-iter-dir)."),
]
ShuffleSeedOpt = Annotated[
    int | None, typer.Option("--shuffle-seed", help="Seed of a map-style 1.9 dataloader.")
]
AllowStepMismatchOpt = Annotated[
    bool, typer.Option("--allow-step-mismatch", help="Accept side files of another step.")
]
DropDataloaderStateOpt = Annotated[
    bool,
    typer.Option(
        "--drop-dataloader-state",
        help="Upgrade a 1.8/1.9 file without its dataloader side files: the dataloader state "
        "is lost and training restarts from the first sample. Default: refuse.",
    ),
]
NumCsxOpt = Annotated[
    int | None,
    typer.Option(
        "--num-csx",
        help="CS-X systems a 1.7/1.8 run used: 1.9 made batch_size global, so the "
        "config's batch_size is multiplied by N (without it: reported, not changed).",
    ),
]

DropOrphanSparsityOpt = Annotated[
    bool,
    typer.Option(
        "--drop-orphan-sparsity",
        help="2.1 → 2.2: drop per-weight sparsity state 2.2 cannot hold (a mask whose weight "
        "the model lacks), each reported. Default: refuse.",
    ),
]

ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Replace an existing output file; it stays until the new one is verified.",
    ),
]

ManifestOpt = Annotated[
    Path | None,
    typer.Option("--manifest", help="Write per-tensor sha256 hashes (implies --verify full)."),
]

StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="Refuse to upgrade a 1.8/1.9 file without its dataloader (now the default; "
        "kept for old scripts).",
    ),
]

SchedulerOpt = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        help="A Dask scheduler (tcp://HOST:PORT): one task per checkpoint on its cluster "
        "(needs the distributed extra).",
    ),
]

WorkersOpt = Annotated[
    int | None,
    typer.Option("--workers", help="Start a Dask LocalCluster of N worker processes for the run."),
]

DeepCheckOpt = Annotated[
    bool,
    typer.Option(
        "--deep-check",
        help="Decode every tensor of each checkpoint before upgrading it (as check --deep); "
        "one that does not decode fails with exit 2 and is not upgraded.",
    ),
]
DeepOpt = Annotated[
    bool,
    typer.Option("--deep", help="First decode every tensor, naming each damaged one (exit 2)."),
]
