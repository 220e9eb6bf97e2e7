#!/usr/bin/env python
"""Fix checkpoints taken in releases < 2.0 to be functional for releases >= 2.0.

The interface of Model Zoo 2.0's ``modelzoo/compat/fix_checkpoint_spec.py`` (``[-h]
[--fixed_checkpoint_path P] [--fix_inplace] checkpoint_path``), run on the ckpt-migrate
engine: the checkpoint is upgraded to release 2.0 by the graph's 1.9 → 2.0 steps (spec fix,
tied weights, LR-scheduler ``last_epoch``). Unlike the original it never truncates an existing
output, writes atomically, keeps a backup with ``--fix_inplace`` and asks its question only on
a terminal (``--yes`` skips it). A file of release 2.0 or newer needs no fix and is left alone.

The documentation's workflow converts a 1.8/1.9 run's dataloader side files in the next step,
``data_iter_state_conversion.py``: without ``--data-iter-dir`` this script fixes the spec and
says (one line) that the side files are left for it. ``--data-iter-dir DIR`` (with
``--dataloader-type``) does both at once; ``--drop-dataloader-state`` says they are not wanted.
``ckpt-migrate upgrade`` does all of it, to any release, in one run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import ckpt_migrate  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckpt_migrate.cli import console, render
from ckpt_migrate.cli.script_options import (
    add_config_argument,
    add_hop_arguments,
    add_step_arguments,
    script_inputs,
)
from ckpt_migrate.engine.plan import check
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.errors import UsageError

NEXT_STEP = (
    "run data_iter_state_conversion.py -c {checkpoint} -w <side files directory> -o <output> "
    "next to convert them, or pass --data-iter-dir and --dataloader-type to this script"
)


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
    add_hop_arguments(parser)
    add_config_argument(parser)
    add_step_arguments(parser)
    return parser


def fix(args: argparse.Namespace) -> int:
    src: Path = args.checkpoint_path
    if args.fix_inplace and args.fixed_checkpoint_path is not None:
        raise UsageError(None, "--fix_inplace and --fixed_checkpoint_path exclude each other")
    inputs = script_inputs(args)
    state = check(src, "2.0")
    if state["current"] or state["downgrade"]:
        print(f"{src}: release {state['release']} is 2.0 or newer; nothing to fix")
        return 0
    if args.fix_inplace and not args.yes and sys.stdin.isatty():
        answer = input("Are you sure you want to fix the checkpoint inplace? [y/N]: ")
        if answer.strip().lower() != "y":
            print("Aborting...")
            return 0
    output = args.fixed_checkpoint_path or src.with_name(f"{src.stem}_fixed{src.suffix}")
    inputs["dataloader_state_deferred"] = NEXT_STEP.format(
        checkpoint=src if args.fix_inplace else output
    )
    opts = UpgradeOptions(
        target="2.0", inplace=args.fix_inplace, inputs=inputs, allow_missing=args.allow_missing
    )
    if not args.fix_inplace:
        opts.output = output
    result = upgrade(src, opts)
    render.messages(result)
    if result.status == "failed":
        print(f"error: {result.error}", file=sys.stderr)
    else:
        where = f"in place (backup {result.backup})" if args.fix_inplace else f"to {result.output}"
        print(f"{src}: fixed {where}")
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    args = create_arg_parser().parse_args(argv)
    return console.run_guarded(lambda: fix(args))


if __name__ == "__main__":
    sys.exit(main())
