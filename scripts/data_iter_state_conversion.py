#!/usr/bin/env python
"""Convert 1.9 dataloader checkpoint side files into the 2.0 checkpoint's dataloader state.

The interface of Model Zoo 2.0's ``modelzoo/compat/data_iter_state_conversion.py``
(``-c/--old_checkpoint``, ``-w/--worker_data_iter_files_dir``, ``-o/--output_file`` required;
``-d/--dataloader_type`` map or iterable, map by default; ``-s/--shuffle_seed``, 0 by default),
run on the ckpt-migrate engine. The checkpoint is a 1.x one (upgraded to 2.0 on the way, as
``fix_checkpoint_spec.py`` would) or the 2.0 file ``fix_checkpoint_spec.py`` wrote (the
documentation's order: that script first, then this one); the state is added to it.

Unlike the original it reads only exactly named side files (listing the others), needs every
worker 0..N-1 exactly once, checks the data step against ``global_step``
(``--allow-step-mismatch`` accepts another), never loads tensors into memory and never
overwrites an existing output. Where it takes a documented default (map-style without ``-d``,
seed 0 without ``-s`` or a ``--config`` that names the run's seed) it says so in one line.
``ckpt-migrate upgrade --data-iter-dir`` does the same in one run.
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
from ckpt_migrate.hops.dataloader import convert_dataloader_state

DEFAULT_TYPE = "map"  # Model Zoo 2.0: "-d ... defaults to map-style dataloader"
DEFAULT_SEED = 0  # Model Zoo 2.0: --shuffle_seed default 0


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
    add_hop_arguments(
        parser,
        required=("data_iter_dir",),
        helps={
            "dataloader_type": f"map or iterable (default: {DEFAULT_TYPE}, as documented)",
            "shuffle_seed": "Shuffle seed of a map-style dataloader (default: the config's "
            f"train_input.shuffle_seed, else {DEFAULT_SEED} as documented, said as a warning)",
        },
    )
    add_config_argument(parser)
    add_step_arguments(parser)
    return parser


def convert(args: argparse.Namespace) -> int:
    src: Path = args.old_checkpoint
    if args.dataloader_type is None:
        args.dataloader_type = DEFAULT_TYPE
        print(f"assuming a {DEFAULT_TYPE}-style dataloader (the default; -d iterable otherwise)")
    inputs = {**script_inputs(args), "default_shuffle_seed": DEFAULT_SEED}
    state = check(src, "2.0")
    if state["downgrade"]:
        raise UsageError(
            src,
            f"is at release {state['release']}, which keeps its dataloader state inside the "
            "checkpoint; 1.9 side files go into a checkpoint of release 2.0 or older",
        )
    opts = UpgradeOptions(
        target="2.0",
        output=args.output_file,
        inputs=inputs,
        allow_missing=args.allow_missing,
        edits=(convert_dataloader_state,) if state["current"] else (),
    )
    result = upgrade(src, opts)
    render.messages(result)
    if result.status == "failed":
        print(f"error: {result.error}", file=sys.stderr)
    else:
        print(f"{src}: written with its dataloader state to {result.output}")
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    args = create_arg_parser().parse_args(argv)
    return console.run_guarded(lambda: convert(args))


if __name__ == "__main__":
    sys.exit(main())
