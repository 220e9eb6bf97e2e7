"""Console scripts ``tensorflow-to-h5`` and ``h5-to-tensorflow``, with the usage Cerebras documented
(``tensorflow-to-h5 [-h] saver_path h5_path``, ``h5-to-tensorflow [-h] h5_path saver_path``).

Thin like ``cli.py``: parse, call ``commands``, print. ``ckpt-migrate tf-to-h5``/``h5-to-tf`` print
with the same functions. Errors are one line with the README's exit codes; ``--debug`` shows the
traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from ckpt_migrate.errors import CkptError

_VERIFY_HELP = (
    "structure: names, dtypes and shapes re-read (default); full: also every tensor's sha256"
)


def print_tf_to_h5(data: dict[str, Any], echo: Callable[..., None]) -> None:
    for note in data["notes"]:
        echo(f"note: {note}", err=True)
    if data["excluded"]:
        echo(f"excluded {len(data['excluded'])} variable(s): {', '.join(data['excluded'][:5])}")
    step = data["global_step"]
    step_text = "" if step is None else f"; global step {step} ({data['global_step_variable']})"
    echo(
        f"wrote {data['output']} (release {data['release']}, format {data['format']}, "
        f"{data['variables']} variable(s), {data['tensor_bytes']:,} tensor bytes, "
        f"verified: {data['verified']}{step_text})"
    )


def print_h5_to_tf(data: dict[str, Any], echo: Callable[..., None]) -> None:
    for note in data["notes"]:
        echo(f"note: {note}", err=True)
    if data["excluded"]:
        echo(f"excluded {len(data['excluded'])} leaf/leaves: {', '.join(data['excluded'][:5])}")
    for out in data["outputs"]:
        for note in out["notes"]:
            echo(f"note: {note}", err=True)
        picked = f" [{out['selector']}]" if out["selector"] else ""
        sliced = f", {len(out['sliced'])} variable(s) split into slices" if out["sliced"] else ""
        echo(
            f"wrote {out['prefix']}{picked} ({out['variables']} variable(s), "
            f"{out['tensor_bytes']:,} bytes in {out['data_files']} data file(s){sliced})"
        )
    if data["state_file"]:
        echo(f"wrote {data['state_file']}")
    if data["global_step"] is not None:
        echo(f"global step {data['global_step']}")
    echo(f"verified: {data['verified']}")


def _echo(text: str, err: bool = False) -> None:
    print(text, file=sys.stderr if err else sys.stdout)


def _run(fn: Callable[[], None], debug: bool) -> int:
    try:
        fn()
    except CkptError as exc:
        if debug:
            raise
        _echo(f"error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        _echo("interrupted", err=True)
        return 130
    except Exception as exc:
        if debug:
            raise
        text = " ".join(str(exc).split())[:300]
        _echo(f"internal error: {type(exc).__name__}: {text}; rerun with --debug", err=True)
        return 1
    return 0


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


def _emit(data: dict[str, Any], as_json: bool, printer: Callable[..., None]) -> None:
    if as_json:
        import json

        print(json.dumps(data, indent=2, default=str))
    else:
        printer(data, _echo)


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
        from ckpt_migrate.cli import commands
        from ckpt_migrate.cli.main import _progress
        from ckpt_migrate.tf.saver import setup_cli_process

        setup_cli_process()
        with _progress(enabled=not args.json) as progress:
            data = commands.tf_to_h5(
                args.saver_path,
                args.h5_path,
                release=args.release,
                exclude=args.exclude,
                verify=args.verify,
                progress=progress,
            )
        _emit(data, args.json, print_tf_to_h5)

    return _run(go, args.debug)


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
        from ckpt_migrate.cli import commands
        from ckpt_migrate.cli.main import _progress
        from ckpt_migrate.tf.saver import setup_cli_process

        setup_cli_process()
        with _progress(enabled=not args.json) as progress:
            data = commands.h5_to_tf(
                args.h5_path,
                args.saver_path,
                shard_by=args.shard_by,
                max_shard_size=args.max_shard_size,
                exclude=args.exclude,
                verify=args.verify,
                progress=progress,
            )
        _emit(data, args.json, print_h5_to_tf)

    return _run(go, args.debug)
