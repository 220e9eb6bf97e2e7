#!/usr/bin/env python
"""Convert 1.9 dataloader checkpoint side files into the 2.0 checkpoint's dataloader state.

The interface of Model Zoo 2.0's ``modelzoo/compat/data_iter_state_conversion.py``, run on the
ckpt-migrate engine: the checkpoint is upgraded to release 2.0 with the graph's 1.9 → 2.0 steps,
the dataloader state built from the side files. Unlike the original it reads only exactly named
side files (listing the others), needs every worker 0..N-1 exactly once, checks the data step
against ``global_step`` (``--allow-step-mismatch`` accepts another), never writes a silent zero,
never loads tensors into memory and never overwrites an existing output. Its defaults are
``ckpt-migrate upgrade``'s, not Model Zoo's: ``--dataloader_type`` must be given (Model Zoo
assumed map-style) and a map-style seed comes from ``--shuffle_seed`` or ``--config``'s
``train_input.shuffle_seed`` (Model Zoo assumed 0, which a shuffled 2.0 run rejects). The
``ckpt-migrate`` spellings (``--data-iter-dir``, ``--dataloader-type``, ``--shuffle-seed``) are
accepted too. ``ckpt-migrate upgrade --data-iter-dir`` does the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import ckpt_migrate  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckpt_migrate.cli import render
from ckpt_migrate.cli.script_options import (
    add_dataloader_arguments,
    add_step_arguments,
    dataloader_inputs,
)
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.errors import CkptError


def create_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Convert 1.9 dataloader checkpoint files into a 2.0 checkpoint's state"
    )
    parser.add_argument(
        "--old_checkpoint", "-c", type=Path, required=True, help="Path to the 1.9 checkpoint"
    )
    parser.add_argument(
        "--output_file", "-o", type=Path, required=True, help="Path of the 2.0 checkpoint to write"
    )
    add_dataloader_arguments(
        parser,
        data_iter_dir=("--worker_data_iter_files_dir", "-w", "--data-iter-dir"),
        dataloader_type=("--dataloader_type", "-d", "--dataloader-type"),
        shuffle_seed=("--shuffle_seed", "-s", "--shuffle-seed"),
        required=True,
    )
    add_step_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = create_arg_parser().parse_args(argv)
    try:
        inputs = dataloader_inputs(args)
    except CkptError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    opts = UpgradeOptions(
        target="2.0", output=args.output_file, inputs=inputs, allow_missing=args.allow_missing
    )
    result = upgrade(args.old_checkpoint, opts)
    render.messages(result)
    if result.status == "failed":
        print(f"error: {result.error}", file=sys.stderr)
    elif result.status == "current":
        print(
            f"error: {args.old_checkpoint} is already at release {result.to_release}; "
            "it has no 1.9 side files to convert",
            file=sys.stderr,
        )
        return 2
    else:
        print(f"{args.old_checkpoint}: written with its dataloader state to {result.output}")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
