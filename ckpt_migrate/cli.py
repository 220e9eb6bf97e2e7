"""The ``ckpt-migrate`` command line. Thin: parse, call ``commands``, print, exit.

Errors the user can act on are printed as one line with a distinct exit code (README);
a traceback only with ``--debug``. torch is never imported here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from . import __version__, commands
from .errors import CkptError

app = typer.Typer(
    name="ckpt-migrate",
    help="Read, inspect and upgrade Cerebras-style PyTorch HDF5 checkpoints, safely.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_state = {"debug": False}

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ckpt-migrate {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    _state["debug"] = debug


def _emit_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


@app.command("inspect")
def inspect_cmd(
    path: Annotated[Path, typer.Argument(help="Checkpoint file (.mdl / .h5).")],
    as_json: JsonOpt = False,
) -> None:
    """Release, format, leaf count, bytes by dtype and the tree outline with shapes."""
    data = commands.inspect(path)
    if as_json:
        _emit_json(data)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    console.print(f"[bold]{data['path']}[/bold]")
    console.print(
        f"release {data['release_label']}  format {data['format']}  "
        f"leaves {data['leaf_count']}  tensor bytes {data['tensor_bytes']:,}"
    )
    if data["bytes_by_dtype"]:
        table = Table("dtype", "tensors", "bytes")
        for dtype, d in sorted(data["bytes_by_dtype"].items()):
            table.add_row(dtype, str(d["tensors"]), f"{d['bytes']:,}")
        console.print(table)
    for line in data["outline"]:
        console.print(line, markup=False)
    if data["missing"]:
        console.print(f"[yellow]missing leaves ({len(data['missing'])}):[/yellow]")
        for name in data["missing"]:
            console.print(f"  {name}", markup=False)
    if data["unreferenced_datasets"]:
        console.print(
            f"[yellow]datasets not named by the spec ({len(data['unreferenced_datasets'])}):"
            "[/yellow]"
        )
        for name in data["unreferenced_datasets"]:
            console.print(f"  {name}", markup=False)


@app.command("to-torch")
def to_torch_cmd(
    src: Annotated[Path, typer.Argument(help="Checkpoint to convert.")],
    dst: Annotated[Path, typer.Argument(help="torch.save file to write (must not exist).")],
    allow_missing: Annotated[
        bool, typer.Option("--allow-missing", help="Write leaves the file lacks as None.")
    ] = False,
) -> None:
    """Write a plain torch.save file (loadable with torch.load(weights_only=True))."""
    out = commands.to_torch(src, dst, allow_missing=allow_missing)
    typer.echo(f"wrote {out['output']}")


@app.command("from-torch")
def from_torch_cmd(
    src: Annotated[Path, typer.Argument(help="torch.save file (loaded with weights_only=True).")],
    dst: Annotated[Path, typer.Argument(help="Checkpoint to write (must not exist).")],
    release: Annotated[
        str, typer.Option("--release", help="Release whose format to write, e.g. 2.0 or latest.")
    ] = "latest",
    as_json: JsonOpt = False,
) -> None:
    """Write a torch.save file as a Cerebras H5 checkpoint."""
    out = commands.from_torch(src, dst, release)
    if as_json:
        _emit_json(out)
    else:
        typer.echo(
            f"wrote {out['output']} (release {out['release']}, format {out['format']}, "
            f"{out['tensors']} tensors, {out['tensor_bytes']:,} bytes)"
        )


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app, turning CkptError into a one-line exit."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        app(args=args, standalone_mode=False)
    except CkptError as exc:
        if debug:
            raise
        typer.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 130
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        return 130
    except Exception as exc:  # usage errors of typer's bundled click, and anything unexpected
        if callable(getattr(exc, "show", None)) and isinstance(
            getattr(exc, "exit_code", None), int
        ):
            exc.show()
            return exc.exit_code
        if debug:
            raise
        typer.echo(f"internal error: {type(exc).__name__}: {exc}; rerun with --debug", err=True)
        return 1
    return 0
