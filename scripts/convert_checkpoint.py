#!/usr/bin/env python
"""Convert Cerebras checkpoints and configs between releases (Model Zoo's convert_checkpoint.py).

The verbs and flags of Model Zoo's ``convert_checkpoint.py`` (MODELZOO_HISTORY.md §3.7), run on
the ckpt-migrate engine: one run goes from any release to any newer one through every hop
between them (Model Zoo needs one run per hop), for every model family, verified and atomic;
unmatched keys are kept and reported (Model Zoo fails, or with ``--drop-unmatched-keys`` drops
them); ``cs-auto`` works for checkpoints of every release, not only 2.1+; ``cs-2.10`` is release
2.10, not 2.1. ``--src-fmt hf`` / ``--tgt-fmt hf`` run ``import-hf`` / ``export-hf``.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import ckpt_migrate  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckpt_migrate import catalogue
from ckpt_migrate.cli import console, render
from ckpt_migrate.cli.commands import load_config, verify
from ckpt_migrate.cli.modelzoo_formats import (
    hf_source,
    key_rules,
    listed,
    output_name,
    parse_format,
    resolve_source,
    stem,
)
from ckpt_migrate.cli.script_options import add_hop_arguments, add_step_arguments, script_inputs
from ckpt_migrate.config import yaml_edit
from ckpt_migrate.config.context import ConfigUpgrade
from ckpt_migrate.config.upgrade import upgrade_config_text, write_upgraded
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.errors import EXIT_VERIFY_FAILED, UsageError
from ckpt_migrate.format import releases
from ckpt_migrate.format.releases import Release
from ckpt_migrate.hf import config_only, mup
from ckpt_migrate.hf import export as hf_export
from ckpt_migrate.hf import import_ as hf_import
from ckpt_migrate.hops.trainer_metadata import CONVERTED_CONFIG
from ckpt_migrate.models.names import KEYLESS, MODEL_NAMES, MODELZOO_NAMES, canonical_family

AUTOLOAD_NOTE = (
    "The output is named <checkpoint stem>_to_<tgt-fmt>.mdl, as Model Zoo names it; that name "
    "does not match the Trainer's autoload pattern checkpoint_<step>.mdl. `ckpt-migrate upgrade "
    "CHECKPOINT --output-dir DIR` does the same conversion and keeps autoload-friendly names."
)


# --------------------------------------------------------------------------- outputs


def _refuse_existing(*paths: Path) -> None:
    for path in paths:
        if path.exists():
            raise UsageError(path, "already exists; refusing to overwrite it", "remove it first")


def _output_dir(given: str | None, default: Path) -> Path:
    if given is None:
        return default
    out = Path(given)
    try:
        out.mkdir(parents=True, exist_ok=True)  # created, as Model Zoo does for local paths
    except OSError as exc:
        raise UsageError(out, f"cannot create the output directory ({exc.strerror})") from None
    return out


# --------------------------------------------------------------------------- verbs


def convert(args: argparse.Namespace) -> int:
    src_hf, tgt_hf = (fmt.strip().lower() == "hf" for fmt in (args.src_fmt, args.tgt_fmt))
    if src_hf and tgt_hf:
        raise UsageError(None, "--src-fmt hf --tgt-fmt hf: nothing to convert")
    if tgt_hf:
        return convert_to_hf(args)
    if src_hf:
        return convert_from_hf(args)
    src, config = Path(args.checkpoint_file), Path(args.config)
    canonical_family(args.model)
    wanted = parse_format(args.src_fmt, source=True)
    tgt = parse_format(args.tgt_fmt, source=False)
    assert tgt is not None
    config_data, text = load_config(config), yaml_edit.read_config(config)
    from_release, note, config_from = resolve_source(src, wanted, (config, text), args.model)
    # Converted first: a downgrade step that cannot be undone is found before any writing.
    converted = upgrade_config_text(text, config_from, tgt.name, family=args.model, source=config)
    if note:
        print(note)
    if from_release == tgt.name:
        if config_from == tgt.name:
            print(f"{src}: already at release {tgt.name}; nothing to convert")
            return 0
        print(f"{src}: already at release {tgt.name}; only its config is converted")
        return _write_config(config, args, tgt, converted)
    given = script_inputs(args)  # the options name the side files (or drop them) over the config
    named = "data_iter_dir" in given or "drop_dataloader_state" in given
    side_files = {} if named else dataloader_inputs(config, config_data)
    if not named and not side_files:  # Model Zoo goes on without them; so do we, and say so
        given["dataloader_state_deferred"] = NOT_CARRIED.format(config=config)
    if side_files and releases.get(from_release).version >= releases.get("2.0").version:
        print(
            f"{config}: cerebras.save_iter_state_path ignored: release {from_release} keeps the "
            "dataloader state in the checkpoint (1.9 side files only matter for 1.9 → 2.0)"
        )
        side_files = {}
    ckpt_out = _output_dir(args.output_dir, src.parent) / output_name(src, tgt, ".mdl")
    config_out = _output_dir(args.output_dir, config.parent) / output_name(config, tgt, ".yaml")
    _refuse_existing(ckpt_out, config_out)
    opts = UpgradeOptions(
        target=tgt.name,
        source_release=from_release,
        output=ckpt_out,
        allow_missing=args.allow_missing,
        inputs={
            "model": args.model,
            "config": config_data,
            CONVERTED_CONFIG: yaml_edit.plain(yaml_edit.load(converted.text, config)[0]),
            **({"drop_unmatched_keys": True} if args.drop_unmatched_keys else {}),
            **given,
            **side_files,
        },
    )
    with console.progress(enabled=not args.no_progress_bar) as progress:
        result = upgrade(src, opts, progress)
    render.messages(result)
    if args.debug and result.model:
        for line in result.model["detected"]["evidence"]:
            print(f"  model evidence: {line}")
    if result.status == "failed":
        print(f"error: {result.error}", file=sys.stderr)
        return result.exit_code
    print(f"Checkpoint saved to {result.output}")
    return _write_config(config, args, tgt, converted, config_out)


def _write_config(
    config: Path,
    args: argparse.Namespace,
    tgt: Release,
    converted: ConfigUpgrade,
    out: Path | None = None,
) -> int:
    """``converted``, the config ``config`` at ``tgt``, into ``out`` (default: Model Zoo's
    name, beside it or in ``--output-dir``)."""
    if out is None:
        out = _output_dir(args.output_dir, config.parent) / output_name(config, tgt, ".yaml")
        _refuse_existing(out)
    for line in write_upgraded(converted, config, out).lines():
        print(line)
    print(f"Config saved to {out}")
    return 0


def convert_to_hf(args: argparse.Namespace) -> int:
    """``--tgt-fmt hf``: a Hugging Face directory ``<checkpoint stem>_to_hf`` holding the
    safetensors shards, their index and ``config.json``, as Model Zoo's ``StreamingShardedHFWriter``
    lays it out (tag Release_2.10.0, ``checkpoint_converters/streaming_checkpoints.py``, the
    class docstring; ``convert_checkpoint.py`` lines 371-423 name the directory and put the
    config in it). Any release is a source: the hops to 2.10 run on the way. Always safetensors
    (``--export-safetensors`` is accepted; Model Zoo writes ``pytorch_model.bin`` pickles
    without it)."""
    src = Path(args.checkpoint_file)
    wanted = parse_format(args.src_fmt, source=True)
    from_release, note, _ = resolve_source(src, wanted)
    if note:
        print(note)
    out = _output_dir(args.output_dir, src.parent) / f"{stem(src.name)}_to_hf"
    result = hf_export.export(
        src,
        out,
        model=args.model,
        config=args.config,
        shard_size=args.hf_shard_size,
        source_release=from_release,
        drop_unmatched_keys=args.drop_unmatched_keys,
        allow_missing_tensors=args.allow_missing_tensors,
    )
    for name, why in result.dropped.items():
        print(f"  left out {name}: {why}")
    for name, instead in result.missing.items():
        print(f"  {name} {instead}")
    print(f"Checkpoint saved to {out} ({result.shards} safetensors file(s))")
    for name in result.files:  # one config.json, or one per sub-directory (LLaVA, Dragon+)
        if Path(name).name == "config.json":
            print(f"Config saved to {out / name}")
    return 0


def convert_from_hf(args: argparse.Namespace) -> int:
    """``--src-fmt hf``: ``checkpoint-file`` is the Hugging Face directory or a file in it
    (``model.safetensors``, an index, ``pytorch_model.bin``), ``--config`` its ``config.json``;
    the outputs are ``<checkpoint stem>_to_cs-X.Y.mdl`` and ``<config stem>_to_cs-X.Y.yaml``
    (the run's params.yaml for that release), as for a CS source."""
    given, config = Path(args.checkpoint_file), Path(args.config)
    hf_dir, own_config = hf_source(given, config)
    tgt = parse_format(args.tgt_fmt, source=False)
    assert tgt is not None
    ckpt_out = _output_dir(args.output_dir, given.parent) / output_name(given, tgt, ".mdl")
    config_out = _output_dir(args.output_dir, config.parent) / output_name(config, tgt, ".yaml")
    _refuse_existing(ckpt_out, config_out)
    result = hf_import.import_hf(
        hf_dir,
        ckpt_out,
        release=tgt.name,
        model=args.model,
        config_out=config_out,
        drop_unmatched_keys=args.drop_unmatched_keys,
        config=own_config,
    )
    for name, why in result.dropped.items():
        print(f"  left out {name}: {why}")
    print(f"Checkpoint saved to {ckpt_out}")
    print(f"Config saved to {config_out}")
    return 0


NOT_CARRIED = (
    "not carried: {config} names no cerebras.save_iter_state_path (Model Zoo goes on without "
    "it too); pass --data-iter-dir DIR --dataloader-type map|iterable to carry it"
)

# train_input.data_processor -> the 2.0 dataloader style its 1.9 side files become
DATALOADER_TYPES = {"GptHDF5DataProcessor": "iterable", "GptHDF5MapDataProcessor": "map"}


def dataloader_inputs(config_path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The 1.9 dataloader side files a config names, as the engine's inputs.

    Model Zoo's ``convert`` reads them from the config being converted: the directory
    ``cerebras.save_iter_state_path`` and the style from ``train_input.data_processor``
    (``GptHDF5DataProcessor``: iterable, ``GptHDF5MapDataProcessor``: map, anything else an
    error): tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/
    base_converter.py``, ``BaseCheckpointConverter_CS_CS.pre_checkpoint_convert``, lines
    716-742. Unlike Model Zoo, which always writes seed 0, a map-style seed comes from
    ``train_input.shuffle_seed`` and is never guessed (the 1.9 → 2.0 step). A relative path is
    taken from the current directory, as Model Zoo takes it.
    """
    cerebras = config.get("cerebras")
    directory = cerebras.get("save_iter_state_path") if isinstance(cerebras, dict) else None
    if not directory:
        return {}
    train = config.get("train_input")
    processor = train.get("data_processor") if isinstance(train, dict) else None
    kind = DATALOADER_TYPES.get(str(processor))
    if kind is None:
        raise UsageError(
            config_path,
            f"cerebras.save_iter_state_path is set but train_input.data_processor is "
            f"{processor!r}, so the dataloader style is unknown",
            "set train_input.data_processor to GptHDF5DataProcessor (iterable) or "
            "GptHDF5MapDataProcessor (map), or remove save_iter_state_path",
        )
    return {"data_iter_dir": Path(str(directory)), "dataloader_type": kind}


def convert_config(args: argparse.Namespace) -> int:

    config = Path(args.config_file)
    canonical_family(args.model)
    if args.src_fmt.strip().lower() == "cs-auto":
        raise UsageError(
            config, "--src-fmt cs-auto: a config does not say its release", "name it: cs-X.Y"
        )
    src_hf, tgt_hf = (fmt.strip().lower() == "hf" for fmt in (args.src_fmt, args.tgt_fmt))
    if src_hf and tgt_hf:
        raise UsageError(None, "--src-fmt hf --tgt-fmt hf: nothing to convert")
    if src_hf or tgt_hf:  # Model Zoo's names: <stem>_to_cs-X.Y.yaml, <stem>_to_hf.json
        cs = parse_format(args.tgt_fmt if src_hf else args.src_fmt, source=tgt_hf)
        assert cs is not None
        suffix = f"_to_cs-{cs.name}.yaml" if src_hf else "_to_hf.json"
        out = _output_dir(args.output_dir, config.parent) / (stem(config.name) + suffix)
        _refuse_existing(out)
        convert = config_only.to_cs if src_hf else config_only.to_hf
        print(f"Config saved to {convert(config, out, args.model, cs.name)}")
        return 0
    src = parse_format(args.src_fmt, source=True)
    tgt = parse_format(args.tgt_fmt, source=False)
    assert src is not None and tgt is not None
    text = yaml_edit.read_config(config)
    converted = upgrade_config_text(text, src.name, tgt.name, family=args.model, source=config)
    return _write_config(config, args, tgt, converted)


def list_converters(args: argparse.Namespace) -> int:
    """Every Model Zoo 2.10 model name (or the one asked for), its family and registry name,
    and unless ``--hide-notes`` the key renames of every hop for it."""
    first, last = releases.RELEASES[0].name, releases.LATEST.name
    span = f"cs-{first} … cs-{last}: any release to any newer one, in one run"
    entries = listed(args.model)
    for name, family, registry, headless, since in entries:
        what = f"{family} family" + (", without lm_head" if headless else "")
        print(f"{name}: {what}; Model Zoo registry name {registry or '(none)'}")
        print(f"  {span}" + (f" (Model Zoo 2.10: from cs-{since})" if since else ""))
        print(f"  {catalogue.hf_support(name)}")
        if mup_export := mup.describe(name):
            print(f"  Hugging Face export of a muP checkpoint: {mup_export}")
        if args.hide_notes:
            continue
        rules = key_rules(family)
        for hop, hop_rules in rules:
            for rule in hop_rules:
                print(f"  {hop}: {rule.old} → {rule.new} ({rule.why})")
        if family in KEYLESS:
            print("  no model key changes at any hop (Model Zoo: fallback converters only)")
    if args.model in ("all", None):
        more = [n for n in MODEL_NAMES if n not in {m.name.lower() for m in MODELZOO_NAMES}]
        print(f"{len(MODELZOO_NAMES)} Model Zoo names; also accepted: {', '.join(more)}")
    if not args.hide_notes:
        print(
            "every model: 1.x tied weights restored and LR-scheduler last_epoch fixed (1.9→2.0), "
            "sparsity masks moved into the model (2.1→2.2), configs upgraded hop by hop"
        )
    return 0


def diff(args: argparse.Namespace) -> int:
    allclose = args.tensor_comparison_op == "allclose"
    data = verify(args.left_checkpoint, args.right_checkpoint, allclose=allclose)
    for d in data["differences"]:
        print(f"{d['name']}: {d['what']}")
    how = "allclose" if allclose else "equal"
    compared = f"{data['tensors_compared']} tensors compared ({how}){render.compared_how(data)}"
    if data["identical"]:
        print(f"{compared}: checkpoints are identical")
        return 0
    print(f"{compared}: {len(data['differences'])} diff")
    return EXIT_VERIFY_FAILED


# --------------------------------------------------------------------------- command line


class _Formatter(argparse.HelpFormatter):
    """Help text wrapped at spaces only: ``ckpt-migrate`` and ``--tgt-fmt`` stay whole."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
        )


def _with_formatter(add_parser: Callable[..., Any]) -> Callable[..., Any]:
    def add(*args: Any, **kwargs: Any) -> Any:
        return add_parser(*args, formatter_class=_Formatter, **kwargs)

    return add


def create_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        formatter_class=_Formatter,
        prog="convert_checkpoint.py",
        description=__doc__.splitlines()[0],
        epilog=AUTOLOAD_NOTE,
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    sub.add_parser = _with_formatter(sub.add_parser)

    conv = sub.add_parser(
        "convert",
        help="Convert a checkpoint and its config between releases, or to or from hf.",
        description="Convert a checkpoint and its config from one Cerebras release to another "
        "(newer, or older as far as the hops can be undone), through every release in between, "
        "in one run; or to or from a Hugging Face directory (hf). " + AUTOLOAD_NOTE,
    )
    conv.add_argument("checkpoint_file", metavar="checkpoint-file", help="Checkpoint to convert")
    _model_arg(conv)
    conv.add_argument(
        "--src-fmt",
        required=True,
        help='Release of the input: "cs-X.Y" (e.g. cs-1.9, cs-2.10), "cs-auto" to read it '
        'from the file (works for every release), or "hf" (a Hugging Face directory)',
    )
    conv.add_argument(
        "--tgt-fmt",
        required=True,
        help=f'Release to convert to: "cs-X.Y", "cs-current" (cs-{releases.LATEST.name}) or '
        '"hf" (a Hugging Face directory <checkpoint stem>_to_hf)',
    )
    conv.add_argument(
        "--config",
        required=True,
        help="The checkpoint's params.yaml (converted alongside), or config.json for --src-fmt hf",
    )
    conv.add_argument(
        "--output-dir",
        help="Output directory (created if missing). Default: beside the checkpoint and config",
    )
    conv.add_argument(
        "--drop-unmatched-keys",
        action="store_true",
        help="Drop model keys that are not in the model's key tables (each is reported). "
        "Default: keep them unchanged and list them",
    )
    add_hop_arguments(conv)  # the side files, --drop-orphan-sparsity, ...
    add_step_arguments(conv, model=False)  # --model is above
    conv.add_argument(
        "--hf-shard-size",
        default="10GB",
        help="--tgt-fmt hf: largest safetensors shard, e.g. 10GB, 500MB, 2GiB (default 10GB)",
    )
    conv.add_argument(
        "--allow-missing-tensors",
        action="store_true",
        help="--tgt-fmt hf: export a checkpoint that lacks tensors Model Zoo's own HF import "
        "leaves out (T5's embeddings) although the Hugging Face model is then not usable",
    )
    conv.add_argument(
        "--export-safetensors",
        action="store_true",
        help="--tgt-fmt hf: accepted for Model Zoo's command lines; the output is always "
        "safetensors",
    )
    conv.add_argument(
        "--export-h5-checkpoint",
        action="store_true",
        help="Model Zoo 1.8/1.9's flag, accepted: a Cerebras output is always H5",
    )
    conv.add_argument("--no-progress-bar", action="store_true", help="Disable the progress bar")
    conv.add_argument(
        "--debug", action="store_true", help="Show tracebacks and the model detection evidence"
    )
    conv.set_defaults(func=convert)

    conf = sub.add_parser(
        "convert-config",
        aliases=["convert_config"],  # Model Zoo 1.8-2.3 ran "_" + command with "-" as "_"
        help="Convert a config file only.",
        description="Upgrade a params.yaml from one release to a newer one; the output is "
        "<config stem>_to_<tgt-fmt>.yaml, comments and key order kept.",
    )
    conf.add_argument("config_file", metavar="config-file", help="Config file to convert")
    _model_arg(conf)
    conf.add_argument("--src-fmt", required=True, help='Release of the config: "cs-X.Y"')
    conf.add_argument(
        "--tgt-fmt", required=True, help='Release to convert to: "cs-X.Y" or "cs-current"'
    )
    conf.add_argument("--output-dir", help="Output directory. Default: beside the config")
    conf.add_argument("--debug", action="store_true", help="Show tracebacks on errors")
    conf.set_defaults(func=convert_config)

    for name in ("list-converters", "list"):
        lst = sub.add_parser(
            name,
            help="List the models and conversions."
            if name == "list-converters"
            else "Same as list-converters (older name).",
        )
        lst.add_argument(
            "model", type=str.lower, default="all", nargs="?", help="A model name, or all"
        )
        lst.add_argument("--hide-notes", action="store_true", help="Hide the key rules")
        lst.set_defaults(func=list_converters)

    dif = sub.add_parser("diff", help="Compare two checkpoints leaf by leaf.")
    dif.add_argument("left_checkpoint", help="Path to the left checkpoint")
    dif.add_argument("right_checkpoint", help="Path to the right checkpoint")
    dif.add_argument(
        "--tensor_comparison_op",
        choices=("equal", "allclose"),
        default="equal",
        help="equal: bit-identical (sha256); allclose: within tolerance",
    )
    dif.set_defaults(func=diff)
    return parser


def _model_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        help="Model name, as Model Zoo's converter names it (gpt2, llama, mistral, starcoder, "
        "gpt2-headless, ...: every one of its 54; see list-converters)",
    )


def main(argv: list[str] | None = None) -> int:
    args = create_arg_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return console.run_guarded(lambda: func(args), debug=getattr(args, "debug", False))


if __name__ == "__main__":
    sys.exit(main())
