"""The options of the Model Zoo-compatible scripts in ``scripts/`` that reach the hops.

Every input a hop declares (``hops.hop.InputSpec``) is an option of each script, spelled as
``ckpt-migrate`` spells it and as Model Zoo's scripts did (``--worker_data_iter_files_dir``,
``-w``, ``--dataloader_type``, …), so a message of the engine never names an option the script
in hand lacks. A script states its own documented defaults and required options.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ckpt_migrate.cli import hop_inputs
from ckpt_migrate.cli.commands import load_config
from ckpt_migrate.models.names import resolve_name

_TYPES: dict[str, Any] = {"path": Path, "int": int, "choice": str}


def add_hop_arguments(
    parser: argparse.ArgumentParser,
    *,
    required: tuple[str, ...] = (),
    helps: dict[str, str] | None = None,
) -> None:
    """An option per hop input; ``required`` names those the script needs (an input that
    excludes one of them is left out), ``helps`` gives a script's own help text (its documented
    default, say) in place of the hop's."""
    helps = helps or {}
    for spec in hop_inputs.specs():
        if set(spec.excludes) & set(required):
            continue  # e.g. no --drop-dataloader-state where the side files are required
        names = (*spec.aliases, spec.flag)
        text = helps.get(spec.name, spec.help)
        if spec.kind == "flag":
            parser.add_argument(*names, dest=spec.name, action="store_true", help=text)
        else:
            parser.add_argument(
                *names,
                dest=spec.name,
                type=_TYPES[spec.kind],
                choices=spec.choices or None,
                required=spec.name in required,
                help=text,
            )


def add_config_argument(parser: argparse.ArgumentParser) -> None:
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


def script_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The engine's inputs for the options the ``add_*_arguments`` above added."""
    values = {spec.name: getattr(args, spec.name, None) for spec in hop_inputs.specs()}
    inputs = hop_inputs.to_inputs(values)
    if getattr(args, "config", None) is not None:
        inputs["config"] = load_config(args.config)
    if getattr(args, "model", None) is not None:
        resolve_name(args.model)  # an unknown name fails here, listing the known ones
        inputs["model"] = args.model
    return inputs
