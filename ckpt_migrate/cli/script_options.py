"""The 1.9 → 2.0 options of the Model Zoo-compatible scripts in ``scripts/``.

The upgrade engine's messages name ``ckpt-migrate``'s spellings (``--data-iter-dir``,
``--dataloader-type``, ``--shuffle-seed``, ``--allow-step-mismatch``,
``--drop-dataloader-state``, ``--config``, ``--allow-missing``, ``--model``). Every script that
upgrades through 1.9 → 2.0 accepts those spellings too (next to Model Zoo's underscore ones), so
a message never names an option the command in hand lacks. Defaults are ``upgrade``'s: no
dataloader style and no seed are guessed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ckpt_migrate.cli.commands import load_config
from ckpt_migrate.errors import UsageError
from ckpt_migrate.models.names import resolve_name


def add_dataloader_arguments(
    parser: argparse.ArgumentParser,
    *,
    data_iter_dir: tuple[str, ...] = ("--data-iter-dir",),
    dataloader_type: tuple[str, ...] = ("--dataloader-type",),
    shuffle_seed: tuple[str, ...] = ("--shuffle-seed",),
    config: bool = True,
    required: bool = False,
) -> None:
    """Add the dataloader options; the tuples are the option strings (Model Zoo's first).

    ``required``: the side files and their style must be given (``data_iter_state_conversion``,
    whose only job they are); then there is nothing to drop either."""
    parser.add_argument(
        *data_iter_dir,
        dest="data_iter_dir",
        type=Path,
        required=required,
        default=None,
        help="Directory with the 1.8/1.9 dataloader side files (data_iter_checkpoint_state_file_"
        "global, data_iter_state_file_worker_<id>_step_<step>.txt)",
    )
    parser.add_argument(
        *dataloader_type,
        dest="dataloader_type",
        choices=["map", "iterable"],
        required=required,
        default=None,
        help="The kind of dataloader the run used (needed with the side files; not guessed)",
    )
    parser.add_argument(
        *shuffle_seed,
        dest="shuffle_seed",
        type=int,
        default=None,
        help="Shuffle seed of a map-style dataloader (default: the config's "
        "train_input.shuffle_seed; never guessed)",
    )
    parser.add_argument(
        "--allow-step-mismatch",
        "--allow_step_mismatch",
        dest="allow_step_mismatch",
        action="store_true",
        help="Accept side files of another step than the checkpoint's global_step",
    )
    if not required:
        parser.add_argument(
            "--drop-dataloader-state",
            "--drop_dataloader_state",
            dest="drop_dataloader_state",
            action="store_true",
            help="Upgrade a 1.8/1.9 checkpoint without its side files: the dataloader state is "
            "lost and training restarts from the first sample. Default: refuse",
        )
    if config:
        parser.add_argument(
            "--config",
            dest="config",
            type=Path,
            default=None,
            help="The run's params.yaml (its train_input.shuffle_seed and tie flags)",
        )


def add_step_arguments(parser: argparse.ArgumentParser, *, model: bool = True) -> None:
    """``--allow-missing`` (and ``--model``): what the 1.x → 2.0 steps' messages suggest when a
    tied weight has no partner or the model family is not evident."""
    parser.add_argument(
        "--allow-missing",
        "--allow_missing",
        dest="allow_missing",
        action="store_true",
        help="Write leaves the checkpoint lacks (a tied weight without its partner) as None",
    )
    if model:
        parser.add_argument(
            "--model",
            dest="model",
            default=None,
            help="Model family for the model-key steps (gpt2, llama, bert, t5, ...); default: "
            "detected from the key names",
        )


def dataloader_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The engine's inputs for the options ``add_dataloader_arguments`` added."""
    inputs: dict[str, Any] = {}
    if args.data_iter_dir is not None:
        if args.dataloader_type is None:
            raise UsageError(None, "--data-iter-dir needs --dataloader-type map or iterable")
        inputs["data_iter_dir"] = args.data_iter_dir
    if args.dataloader_type is not None:
        inputs["dataloader_type"] = args.dataloader_type
    if args.shuffle_seed is not None:
        inputs["shuffle_seed"] = args.shuffle_seed
    if args.allow_step_mismatch:
        inputs["allow_step_mismatch"] = True
    if getattr(args, "drop_dataloader_state", False):
        if args.data_iter_dir is not None:
            raise UsageError(None, "--drop-dataloader-state and --data-iter-dir exclude each other")
        inputs["drop_dataloader_state"] = True
    if getattr(args, "config", None) is not None:
        inputs["config"] = load_config(args.config)
    if getattr(args, "model", None) is not None:
        resolve_name(args.model)  # an unknown name fails here, listing the known ones
        inputs["model"] = args.model
    return inputs
