"""``tf-to-h5`` and ``h5-to-tf``: option declarations for the TensorFlow converters.

Registered on the app by ``cli.main``; the work is ``cli.conversions.tf_to_h5`` / ``h5_to_tf``
(reached through the lazy face, so ``--help`` loads neither h5py nor TensorFlow).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ckpt_migrate import cli
from ckpt_migrate.cli import console, render
from ckpt_migrate.cli.dir_names import file_to_write, path
from ckpt_migrate.cli.options import ExcludeOpt, JsonOpt, ProgressOpt, QuietOpt, TfVerifyOpt


def tf_to_h5_cmd(
    saver_path: Annotated[
        list[Path], typer.Argument(help="TF checkpoint prefix, .index or directory (1 or more).")
    ],
    h5_path: Annotated[
        str, typer.Argument(help="H5 checkpoint to write (must not exist).", parser=path)
    ],
    release: Annotated[
        str, typer.Option("--release", "--to", help="Release whose format to write, or auto.")
    ] = "auto",
    exclude: ExcludeOpt = None,
    verify: TfVerifyOpt = "structure",
    as_json: JsonOpt = False,
    progress_mode: ProgressOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    r"""Convert a TensorFlow saver checkpoint to a Cerebras H5 checkpoint (needs the
    ckpt-migrate\[tensorflow] extra)."""
    with console.progress(not quiet, progress_mode, beside_json=as_json) as progress:
        out = cli.conversions.tf_to_h5(
            saver_path,
            file_to_write(h5_path, saver_path[0], ".mdl"),
            release=release,
            exclude=exclude or [],
            verify=verify,
            progress=progress,
        )
    render.emit_json(out) if as_json else render.tf_to_h5(out)


def h5_to_tf_cmd(
    h5_path: Annotated[Path, typer.Argument(help="H5 checkpoint to convert.")],
    saver_path: Annotated[Path, typer.Argument(help="TF checkpoint prefix (or directory).")],
    shard_by: Annotated[
        list[str] | None,
        typer.Option("--shard-by", help="Name prefix (repeatable) or re:REGEX: one ckpt each."),
    ] = None,
    max_shard_size: Annotated[
        str, typer.Option("--max-shard-size", help="Bytes per data file; bounds memory.")
    ] = "1GiB",
    exclude: ExcludeOpt = None,
    verify: TfVerifyOpt = "structure",
    as_json: JsonOpt = False,
    progress_mode: ProgressOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    r"""Convert a Cerebras H5 checkpoint to TensorFlow saver checkpoint(s) (needs the
    ckpt-migrate\[tensorflow] extra)."""
    with console.progress(not quiet, progress_mode, beside_json=as_json) as progress:
        out = cli.conversions.h5_to_tf(
            h5_path,
            saver_path,
            shard_by=shard_by or [],
            max_shard_size=max_shard_size,
            exclude=exclude or [],
            verify=verify,
            progress=progress,
        )
    render.emit_json(out) if as_json else render.h5_to_tf(out)
