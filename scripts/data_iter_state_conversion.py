#!/usr/bin/env python
"""Convert 1.9 dataloader checkpoint side files into the 2.0 checkpoint's dataloader state.

The interface of Model Zoo 2.0's ``modelzoo/compat/data_iter_state_conversion.py``, run on the
ckpt-migrate engine: the checkpoint is upgraded to release 2.0 with the graph's 1.9 → 2.0 steps,
the dataloader state built from the side files. Unlike the original it reads only exactly named
side files (listing the others), needs every worker 0..N-1 exactly once, checks the data step
against ``global_step``, never writes a silent zero, never loads tensors into memory and never
overwrites an existing output. ``ckpt-migrate upgrade --data-iter-dir`` does the same.
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
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade


def create_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Convert 1.9 dataloader checkpoint files into a 2.0 checkpoint's state"
    )
    parser.add_argument(
        "--old_checkpoint", "-c", type=Path, required=True, help="Path to the 1.9 checkpoint"
    )
    parser.add_argument(
        "--worker_data_iter_files_dir",
        "-w",
        type=Path,
        required=True,
        help="Directory with the 1.9 worker data iterator state files",
    )
    parser.add_argument(
        "--output_file", "-o", type=Path, required=True, help="Path of the 2.0 checkpoint to write"
    )
    parser.add_argument(
        "--dataloader_type",
        "-d",
        choices=["map", "iterable"],
        default="map",
        help="The kind of dataloader the run used",
    )
    parser.add_argument(
        "--shuffle_seed", "-s", type=int, default=0, help="Shuffle seed of a map-style dataloader"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = create_arg_parser().parse_args(argv)
    opts = UpgradeOptions(
        target="2.0",
        output=args.output_file,
        inputs={
            "data_iter_dir": args.worker_data_iter_files_dir,
            "dataloader_type": args.dataloader_type,
            "shuffle_seed": args.shuffle_seed,
        },
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
