#!/usr/bin/env python
"""Fix checkpoints taken in releases < 2.0 to be functional for releases >= 2.0.

The interface of Model Zoo 2.0's ``modelzoo/compat/fix_checkpoint_spec.py``, run on the
ckpt-migrate engine: the checkpoint is upgraded to release 2.0 by the graph's 1.9 → 2.0 steps
(spec fix, tied weights, LR-scheduler ``last_epoch``). Unlike the original it never truncates an
existing output, writes atomically, keeps a backup with ``--fix_inplace`` and asks its question
only on a terminal (``--yes`` skips it). A 1.8/1.9 checkpoint's dataloader state lives in side
files: pass them with ``--data-iter-dir DIR --dataloader-type map|iterable`` (as
``data_iter_state_conversion.py`` does), or ``--drop-dataloader-state`` to lose it; without
either the fix is refused rather than silently dropping it. ``ckpt-migrate upgrade`` does all
of it in one run.
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
from ckpt_migrate.errors import EXIT_BAD_INPUT, CkptError


def create_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Fix checkpoints taken in releases < 2.0 to be functional for releases >= 2.0"
    )
    parser.add_argument("checkpoint_path", type=Path, help="Path to the checkpoint to fix")
    parser.add_argument(
        "--fixed_checkpoint_path",
        type=Path,
        default=None,
        help="Where to write the fixed checkpoint (default: <stem>_fixed<suffix> beside it)",
    )
    parser.add_argument(
        "--fix_inplace",
        action="store_true",
        help="Fix the checkpoint in place (the original is kept as <name>.pre-<release>.bak)",
    )
    parser.add_argument("--yes", action="store_true", help="Do not ask before fixing in place")
    add_dataloader_arguments(parser)
    add_step_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = create_arg_parser().parse_args(argv)
    src: Path = args.checkpoint_path
    if args.fix_inplace and args.fixed_checkpoint_path is not None:
        print(
            "error: --fix_inplace and --fixed_checkpoint_path exclude each other", file=sys.stderr
        )
        return EXIT_BAD_INPUT
    if args.fix_inplace and not args.yes and sys.stdin.isatty():
        answer = input("Are you sure you want to fix the checkpoint inplace? [y/N]: ")
        if answer.strip().lower() != "y":
            print("Aborting...")
            return 0
    try:
        inputs = dataloader_inputs(args)
    except CkptError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    output = args.fixed_checkpoint_path or src.with_name(f"{src.stem}_fixed{src.suffix}")
    opts = UpgradeOptions(
        target="2.0", inplace=args.fix_inplace, inputs=inputs, allow_missing=args.allow_missing
    )
    if not args.fix_inplace:
        opts.output = output
    result = upgrade(src, opts)
    render.messages(result)
    if result.status == "failed":
        print(f"error: {result.error}", file=sys.stderr)
    elif result.status == "current":
        print(f"{src}: already at release {result.to_release}; nothing to fix")
    else:
        where = f"in place (backup {result.backup})" if args.fix_inplace else f"to {result.output}"
        print(f"{src}: fixed {where}")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
