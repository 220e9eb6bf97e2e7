"""Console scripts ``tensorflow-to-h5`` and ``h5-to-tensorflow``, with the usage Cerebras documented
(``tensorflow-to-h5 [-h] saver_path h5_path``, ``h5-to-tensorflow [-h] h5_path saver_path``).

Thin like ``cli.main``: parse, call ``commands`` (through the package's lazy face, so that
``--help`` loads neither h5py nor the engine), print with ``render``, as ``ckpt-migrate
tf-to-h5``/``h5-to-tf`` do. Errors are one line with the README's exit codes; ``--debug`` shows the
traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ckpt_migrate import cli
from ckpt_migrate.cli import console, render

_VERIFY_HELP = (
    "structure: names, dtypes and shapes re-read (default); full: also every tensor's sha256"
)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="REGEX",
        help="leave out variables whose name matches (re.search); repeatable",
    )
    parser.add_argument(
        "--verify", choices=("structure", "full"), default="structure", help=_VERIFY_HELP
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")


def _emit(data: dict[str, Any], as_json: bool, printer: Callable[[dict[str, Any]], None]) -> None:
    render.emit_json(data) if as_json else printer(data)


def tensorflow_to_h5(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tensorflow-to-h5",
        description="Convert Tensorflow Saver Checkpoint to Cerebras H5 Format",
    )
    parser.add_argument(
        "saver_path",
        nargs="+",
        help="Path to existing saver checkpoint: its prefix, .index file, or a directory with a "
        "'checkpoint' file (several are merged into one H5)",
    )
    parser.add_argument("h5_path", help="Path to store converted h5 checkpoint (must not exist)")
    parser.add_argument(
        "--release",
        default="auto",
        help="release whose format to write, e.g. 2.10 or 2.4; auto (default): the newest, or 2.4 "
        "when TF names cannot be format 0.5 dataset names",
    )
    _common(parser)
    args = parser.parse_args(argv)

    def go() -> None:
        with console.progress(beside_json=args.json) as progress:
            data = cli.conversions.tf_to_h5(
                args.saver_path,
                args.h5_path,
                release=args.release,
                exclude=args.exclude,
                verify=args.verify,
                progress=progress,
            )
        _emit(data, args.json, render.tf_to_h5)

    return console.run_guarded(go, debug=args.debug)


def h5_to_tensorflow(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="h5-to-tensorflow",
        description="Convert Cerebras H5 Checkpoint to Tensorflow Saver Format",
    )
    parser.add_argument("h5_path", help="Path to existing h5 checkpoint")
    parser.add_argument(
        "saver_path",
        help="Path to store converted saver checkpoint: a prefix (writes <prefix>.index and "
        "<prefix>.data-*), or an existing directory (prefix <dir>/<h5 file stem>)",
    )
    parser.add_argument(
        "--shard-by",
        action="append",
        default=[],
        metavar="PREFIX|re:REGEX",
        help="write one saver checkpoint <saver_path>-<label> per name prefix (repeatable), or per "
        "distinct match of one re:REGEX (its first group if it has one); the rest go to "
        "<saver_path>-rest",
    )
    parser.add_argument(
        "--max-shard-size",
        default="1GiB",
        metavar="SIZE",
        help="bytes written per SaveV2 call, which bounds memory (e.g. 256MB, 1GiB; default "
        "1GiB); a checkpoint gets one .data file per shard, larger variables are sliced",
    )
    _common(parser)
    args = parser.parse_args(argv)

    def go() -> None:
        with console.progress(beside_json=args.json) as progress:
            data = cli.conversions.h5_to_tf(
                args.h5_path,
                args.saver_path,
                shard_by=args.shard_by,
                max_shard_size=args.max_shard_size,
                exclude=args.exclude,
                verify=args.verify,
                progress=progress,
            )
        _emit(data, args.json, render.h5_to_tf)

    return console.run_guarded(go, debug=args.debug)
