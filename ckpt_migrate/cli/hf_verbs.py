"""``export-hf`` and ``import-hf``: option declarations for the Hugging Face verbs (issue #23).

Registered on the app by ``cli.main``; the work is ``cli.conversions.export_hf`` /
``import_hf`` (reached through the lazy face, so ``--help`` loads neither h5py nor safetensors).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ckpt_migrate import cli
from ckpt_migrate.cli import console, render
from ckpt_migrate.cli.dir_names import HF_FILE_SUFFIXES, refuse_a_file_name
from ckpt_migrate.cli.options import FromOpt, JsonOpt, ProgressOpt, QuietOpt

HfModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Model Zoo model name (gpt2, llama, mistral, bert, t5, …-headless); "
        "default: detected from the key names (export) or config.json (import).",
    ),
]
HfForceOpt = Annotated[
    bool,
    typer.Option(
        "--force", help="Replace an existing output; it stays until the new one is ready."
    ),
]
DtypeOpt = Annotated[
    str | None,
    typer.Option("--dtype", help="Cast floating tensors: float32, float16 or bfloat16."),
]
DropUnmatchedOpt = Annotated[
    bool,
    typer.Option(
        "--drop-unmatched-keys",
        help="Leave out model tensors the family's rules do not map (each is reported); "
        "without it they are an error.",
    ),
]

AllowMissingOpt = Annotated[
    bool,
    typer.Option(
        "--allow-missing-tensors",
        help="Export a checkpoint that lacks tensors Model Zoo's own HF import leaves out "
        "(T5's embeddings) although the Hugging Face model is then not usable; each is "
        "reported. Without it such a file is an error.",
    ),
]


def export_hf_cmd(
    src: Annotated[Path, typer.Argument(help="Checkpoint of any release (1.7 … 2.10).")],
    output_dir: Annotated[
        Path, typer.Argument(help="Hugging Face model directory to write (must not exist).")
    ],
    config: Annotated[
        Path | None,
        typer.Option("--config", help="The run's params.yaml (needed for config.json)."),
    ] = None,
    model: HfModelOpt = None,
    shard_size: Annotated[
        str,
        typer.Option(
            "--hf-shard-size", help="Largest safetensors shard, e.g. 5GB or 500MB (decimal)."
        ),
    ] = "10GB",
    from_release: FromOpt = None,
    dtype: DtypeOpt = None,
    drop_unmatched_keys: DropUnmatchedOpt = False,
    allow_missing_tensors: AllowMissingOpt = False,
    force: HfForceOpt = False,
    as_json: JsonOpt = False,
    progress_mode: ProgressOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    """Export a checkpoint of any release to a Hugging Face model directory.

    Writes config.json and model.safetensors (or shards with model.safetensors.index.json),
    one tensor at a time, the release hops applied on the way."""
    why = "export-hf writes a Hugging Face model directory (config.json and the weight files)"
    refuse_a_file_name(output_dir, HF_FILE_SUFFIXES, why)
    with console.progress(not quiet, progress_mode, beside_json=as_json) as progress:
        out = cli.conversions.export_hf(
            src,
            output_dir,
            model=model,
            config=config,
            shard_size=shard_size,
            source_release=from_release,
            dtype=dtype,
            drop_unmatched_keys=drop_unmatched_keys,
            allow_missing_tensors=allow_missing_tensors,
            force=force,
            progress=progress,
        )
    render.emit_json(out) if as_json else render.hf_result(out, quiet=quiet)


def import_hf_cmd(
    src: Annotated[
        Path, typer.Argument(help="Hugging Face model directory (safetensors or .bin shards).")
    ],
    dst: Annotated[Path, typer.Argument(help="Checkpoint to write (must not exist).")],
    release: Annotated[
        str,
        typer.Option("--release", "--to", help="Release whose checkpoint to write, e.g. 2.10."),
    ] = "latest",
    config_out: Annotated[
        Path | None,
        typer.Option("--config-out", help="Where to write the run's params.yaml for that release."),
    ] = None,
    model: HfModelOpt = None,
    dtype: DtypeOpt = None,
    drop_unmatched_keys: DropUnmatchedOpt = False,
    force: HfForceOpt = False,
    as_json: JsonOpt = False,
    progress_mode: ProgressOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    """Import a Hugging Face model directory as a checkpoint of a chosen release.

    Reads safetensors (or pytorch_model.bin) shards one tensor at a time and writes the
    checkpoint and, with --config-out, the run's params.yaml for that release."""
    with console.progress(not quiet, progress_mode, beside_json=as_json) as progress:
        out = cli.conversions.import_hf(
            src,
            dst,
            release=release,
            model=model,
            config_out=config_out,
            dtype=dtype,
            drop_unmatched_keys=drop_unmatched_keys,
            force=force,
            progress=progress,
        )
    render.emit_json(out) if as_json else render.hf_result(out, quiet=quiet)
