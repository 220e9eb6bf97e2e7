"""The ``ckpt-migrate`` command line. Thin: parse, call ``commands``, print, exit.

Errors the user can act on are printed as one line with a distinct exit code (README);
a traceback only with ``--debug``. torch is never imported here.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from . import __version__, commands
from .errors import EXIT_UPGRADE_NEEDED, EXIT_VERIFY_FAILED, CkptError, UsageError

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


ToOpt = Annotated[
    str, typer.Option("--to", help="Target release, e.g. 2.0 or latest.", show_default=True)
]
FromOpt = Annotated[
    str | None,
    typer.Option(
        "--from", help="Treat the file as this release (for files whose metadata is wrong)."
    ),
]


@app.command("history")
def history_cmd(as_json: JsonOpt = False) -> None:
    """The known releases and the migration graph between them."""
    data = commands.history()
    if as_json:
        _emit_json(data)
        return
    for rel in data["releases"]:
        typer.echo(f"{rel['name']:>5}  format {rel['format']}  {rel['spec']}; {rel['type_tags']}")
    typer.echo("")
    for hop in data["hops"]:
        _print_hop(hop, "", show_state=False)
    typer.echo(f"newest: {data['newest']}")


def _print_hop(hop: dict, indent: str, *, show_state: bool) -> None:
    fmt = f" [format {hop['format'][0]} → {hop['format'][1]}]" if hop["format"] else ""
    typer.echo(f"{indent}{hop['from']} → {hop['to']}{fmt}  ({hop['module'].rsplit('.', 1)[-1]})")
    for line in hop["changes"]:
        typer.echo(f"{indent}    - {line}")
    for inp in hop["inputs"]:
        state = "given" if inp["given"] else ("REQUIRED" if inp["required"] else "optional")
        label = f" ({state})" if show_state else ""
        typer.echo(f"{indent}    input --{inp['name'].replace('_', '-')}{label}: {inp['help']}")


def _print_plan(plan: dict) -> None:
    if plan["current"]:
        typer.echo(f"{plan['source']}: already at {plan['to']}; nothing to do")
        return
    typer.echo(f"{plan['source']}: {plan['from']} → {plan['to']} in {len(plan['hops'])} hop(s)")
    for hop in plan["hops"]:
        _print_hop(hop, "  ", show_state=True)
    free = plan["free_available"]
    typer.echo(
        f"  reads {plan['bytes_to_read']:,} bytes, writes {plan['bytes_to_write']:,} bytes; "
        f"needs {plan['free_needed']:,} bytes free in {plan['output_dir']}"
        + (f" ({free:,} available)" if free is not None else "")
    )


@app.command("plan")
def plan_cmd(
    path: Annotated[Path, typer.Argument(help="Checkpoint file.")],
    to: ToOpt = "latest",
    from_release: FromOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the hops an upgrade would apply, the inputs they need and the disk they cost."""
    data = commands.plan(path, to, from_release)
    _emit_json(data) if as_json else _print_plan(data)


@app.command("upgrade")
def upgrade_cmd(
    paths: Annotated[list[Path], typer.Argument(help="Checkpoint files to upgrade.")],
    to: ToOpt = "latest",
    from_release: FromOpt = None,
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", help="Write upgraded files here, under the same names."),
    ] = None,
    inplace: Annotated[
        bool, typer.Option("--inplace", help="Replace each file, keeping <name>.pre-<release>.bak.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan only; write nothing.")] = False,
    manifest: Annotated[
        Path | None,
        typer.Option("--manifest", help="Write per-tensor sha256 hashes (implies --verify full)."),
    ] = None,
    verify: Annotated[
        str,
        typer.Option("--verify", help="index: by stored-chunk identity; full: hash every tensor."),
    ] = "index",
    allow_missing: Annotated[
        bool, typer.Option("--allow-missing", help="Write leaves the file lacks as None.")
    ] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="Refuse to upgrade a 1.9 file without its dataloader.")
    ] = False,
    data_iter_dir: Annotated[
        Path | None,
        typer.Option("--data-iter-dir", help="1.9 dataloader side files (for 1.9 → 2.0)."),
    ] = None,
    dataloader_type: Annotated[
        str | None,
        typer.Option("--dataloader-type", help="map or iterable (with --data-iter-dir)."),
    ] = None,
    shuffle_seed: Annotated[
        int | None, typer.Option("--shuffle-seed", help="Seed of a map-style 1.9 dataloader.")
    ] = None,
    allow_step_mismatch: Annotated[
        bool,
        typer.Option("--allow-step-mismatch", help="Accept side files of another step."),
    ] = False,
    config: Annotated[
        Path | None, typer.Option("--config", help="The run's params.yaml (tie flags, seed).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per file.")] = False,
) -> None:
    """Upgrade checkpoints to a newer release in one pass, verified, never overwriting."""
    from .engine import UpgradeOptions

    if verify not in ("index", "full"):
        raise UsageError(None, f"--verify must be index or full, not {verify!r}")
    if manifest is not None and len(paths) > 1:
        raise UsageError(None, "--manifest takes one checkpoint at a time")
    opts = UpgradeOptions(
        target=to,
        source_release=from_release,
        output_dir=output_dir,
        inplace=inplace,
        dry_run=dry_run,
        manifest=manifest,
        verify=verify,  # type: ignore[arg-type]
        strict=strict,
        allow_missing=allow_missing,
        inputs=commands.step_inputs(
            data_iter_dir=data_iter_dir,
            dataloader_type=dataloader_type,
            shuffle_seed=shuffle_seed,
            allow_step_mismatch=allow_step_mismatch,
            config=config,
        ),
    )
    worst = 0
    with _progress(enabled=not as_json) as progress:
        for path in paths:
            (res,) = commands.upgrade([path], opts, progress)
            worst = max(worst, res.exit_code)
            if as_json:
                typer.echo(json.dumps(res.to_json(), default=str))
            else:
                _print_result(res)
    if worst:
        raise typer.Exit(worst)


def print_messages(res: Any) -> None:
    """An upgrade's warnings (stderr) and reported changes (stdout); shared with the scripts."""
    for line in res.warnings:
        typer.echo(f"warning: {line}", err=True)
    for line in res.changes:
        typer.echo(f"  {line}")


def _print_result(res: Any) -> None:
    print_messages(res)
    if res.status == "failed":
        typer.echo(f"error: {res.error}", err=True)
        return
    if res.status == "current":
        typer.echo(f"{res.source}: already at {res.to_release}; left alone")
        return
    if res.status == "planned":
        _print_plan(res.plan)
        return
    extra = f", backup {res.backup}" if res.backup else ""
    typer.echo(
        f"{res.source}: {res.from_release} → {res.to_release} written to {res.output} "
        f"({res.strategy}, verified: {res.verified}, {res.seconds:.2f}s{extra})"
    )


@contextlib.contextmanager
def _progress(enabled: bool) -> Any:
    """A rich progress bar when stderr is a terminal; otherwise nothing."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield update


@app.command("check")
def check_cmd(
    path: Annotated[Path, typer.Argument(help="Checkpoint file.")],
    to: ToOpt = "latest",
    from_release: FromOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """For CI: exit 0 when at the target release, 10 when an upgrade is needed, 3 when newer."""
    data = commands.check(path, to, from_release)
    if as_json:
        _emit_json(data)
    elif data["current"]:
        typer.echo(f"{path}: at {data['target']}")
    else:
        typer.echo(f"{path}: {data['release']} needs upgrading to {data['target']}")
    if not data["current"]:
        raise typer.Exit(EXIT_UPGRADE_NEEDED)


@app.command("verify")
def verify_cmd(
    a: Annotated[Path, typer.Argument(help="First checkpoint.")],
    b: Annotated[Path, typer.Argument(help="Second checkpoint.")],
    allclose: Annotated[
        bool, typer.Option("--allclose", help="Compare tensor values with a tolerance.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Compare two checkpoints leaf by leaf (tensors by sha256, or --allclose)."""
    data = commands.verify(a, b, allclose=allclose)
    if as_json:
        _emit_json(data)
    else:
        for d in data["differences"]:
            typer.echo(f"{d['name']}: {d['what']}")
        verdict = "identical" if data["identical"] else f"{len(data['differences'])} difference(s)"
        typer.echo(f"{data['tensors_compared']} tensors compared: {verdict}")
    if not data["identical"]:
        raise typer.Exit(EXIT_VERIFY_FAILED)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app, turning CkptError into a one-line exit."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        # Without standalone mode typer returns (not raises) the code of a typer.Exit.
        code = app(args=args, standalone_mode=False)
        if isinstance(code, int) and code:
            return code
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
