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

from ckpt_migrate._version import __version__
from ckpt_migrate.cli import commands
from ckpt_migrate.errors import EXIT_UPGRADE_NEEDED, EXIT_VERIFY_FAILED, CkptError, UsageError

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


ExcludeOpt = Annotated[
    list[str] | None,
    typer.Option("--exclude", help="Leave out variables matching this regex (repeatable)."),
]
VerifyOpt = Annotated[
    str, typer.Option("--verify", help="structure (names, dtypes, shapes) or full (sha256).")
]


@app.command("tf-to-h5")
def tf_to_h5_cmd(
    saver_path: Annotated[
        list[Path], typer.Argument(help="TF checkpoint prefix, .index or directory (1 or more).")
    ],
    h5_path: Annotated[Path, typer.Argument(help="H5 checkpoint to write (must not exist).")],
    release: Annotated[
        str, typer.Option("--release", help="Release whose format to write, or auto.")
    ] = "auto",
    exclude: ExcludeOpt = None,
    verify: VerifyOpt = "structure",
    as_json: JsonOpt = False,
) -> None:
    """Convert a TensorFlow saver checkpoint to a Cerebras H5 checkpoint (needs [tensorflow])."""
    from ckpt_migrate.cli.tf import print_tf_to_h5
    from ckpt_migrate.tf.saver import setup_cli_process

    setup_cli_process()
    with _progress(enabled=not as_json) as progress:
        out = commands.tf_to_h5(
            saver_path,
            h5_path,
            release=release,
            exclude=exclude or [],
            verify=verify,
            progress=progress,
        )
    _emit_json(out) if as_json else print_tf_to_h5(out, typer.echo)


@app.command("h5-to-tf")
def h5_to_tf_cmd(
    h5_path: Annotated[Path, typer.Argument(help="H5 checkpoint to convert.")],
    saver_path: Annotated[Path, typer.Argument(help="TF checkpoint prefix (or directory).")],
    shard_by: Annotated[
        list[str] | None,
        typer.Option("--shard-by", help="Name prefix (repeatable) or re:REGEX: one ckpt each."),
    ] = None,
    max_shard_size: Annotated[
        str, typer.Option("--max-shard-size", help="Bytes per data file; bounds memory.")
    ] = "1GiB",
    exclude: ExcludeOpt = None,
    verify: VerifyOpt = "structure",
    as_json: JsonOpt = False,
) -> None:
    """Convert a Cerebras H5 checkpoint to TensorFlow saver checkpoint(s) (needs [tensorflow])."""
    from ckpt_migrate.cli.tf import print_h5_to_tf
    from ckpt_migrate.tf.saver import setup_cli_process

    setup_cli_process()
    with _progress(enabled=not as_json) as progress:
        out = commands.h5_to_tf(
            h5_path,
            saver_path,
            shard_by=shard_by or [],
            max_shard_size=max_shard_size,
            exclude=exclude or [],
            verify=verify,
            progress=progress,
        )
    _emit_json(out) if as_json else print_h5_to_tf(out, typer.echo)


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
    if plan.get("model"):
        typer.echo(f"  model: {plan['model']['summary']}")
    for hop in plan["hops"]:
        _print_hop(hop, "  ", show_state=True)
    free = plan["free_available"]
    typer.echo(
        f"  reads {plan['bytes_to_read']:,} bytes, writes {plan['bytes_to_write']:,} bytes; "
        f"needs {plan['free_needed']:,} bytes free in {plan['output_dir']}"
        + (f" ({free:,} available)" if free is not None else "")
    )


ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Model family for the model-key steps (gpt2, llama, bert, t5, …); "
        "default: detected from the key names.",
    ),
]


@app.command("plan")
def plan_cmd(
    path: Annotated[Path, typer.Argument(help="Checkpoint file.")],
    to: ToOpt = "latest",
    from_release: FromOpt = None,
    model: ModelOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the hops an upgrade would apply, the inputs they need and the disk they cost."""
    data = commands.plan(path, to, from_release, inputs=commands.step_inputs(model=model))
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
        Path | None,
        typer.Option(
            "--config",
            help="The run's params.yaml: read for tie flags and the seed, and upgraded to the "
            "same release (comments kept; every change reported).",
        ),
    ] = None,
    config_out: Annotated[
        Path | None,
        typer.Option(
            "--config-out",
            help="Where the upgraded --config goes. Default: <output-dir>/<config name>, or "
            "<config stem>.<release>.yaml beside the config (--inplace, or output-dir = its "
            "directory). Never overwritten.",
        ),
    ] = None,
    num_csx: Annotated[
        int | None,
        typer.Option(
            "--num-csx",
            help="CS-X systems a 1.7/1.8 run used: 1.9 made batch_size global, so the "
            "config's batch_size is multiplied by N (without it: reported, not changed).",
        ),
    ] = None,
    model: ModelOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per file.")] = False,
) -> None:
    """Upgrade checkpoints to a newer release in one pass, verified, never overwriting.

    With --config, the run's params.yaml is upgraded alongside, from the checkpoint's release
    to the same target, and every config change is reported.
    """
    from ckpt_migrate.engine.upgrade import UpgradeOptions

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
            model=model,
        ),
    )
    if config is None and (config_out is not None or num_csx is not None):
        raise UsageError(None, "--config-out and --num-csx apply to --config", "pass --config")
    alongside = None
    if config is not None:
        alongside = commands.config_alongside(
            config,
            config_out=config_out,
            num_csx=num_csx,
            target=to,
            output_dir=output_dir,
            dry_run=dry_run,
            model=model,
        )
    worst = 0
    with _progress(enabled=not as_json) as progress:
        for path in paths:
            (res,) = commands.upgrade([path], opts, progress)
            cfg = alongside.run(res) if alongside is not None else None
            worst = max(worst, res.exit_code, cfg.exit_code if cfg else 0)
            if as_json:
                data = res.to_json()
                if cfg is not None:
                    data["config"] = cfg.to_json()
                typer.echo(json.dumps(data, default=str))
            else:
                _print_result(res)
                _print_config(cfg)
    if worst:
        raise typer.Exit(worst)


def _print_config(cfg: Any) -> None:
    """The config report of ``upgrade --config`` (stdout), or its error (stderr)."""
    if cfg is None:
        return
    if cfg.error:
        typer.echo(f"error: {cfg.error}", err=True)
    for line in cfg.lines():
        typer.echo(line)


def print_messages(res: Any) -> None:
    """An upgrade's warnings (stderr) and reported changes (stdout); shared with the scripts."""
    for line in res.warnings:
        typer.echo(f"warning: {line}", err=True)
    if getattr(res, "model", None) and res.status in ("upgraded", "planned"):
        typer.echo(f"  model: {res.model['summary']}")
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


@app.command("upgrade-dir")
def upgrade_dir_cmd(
    model_dir: Annotated[Path, typer.Argument(help="The model directory.")],
    to: ToOpt = "latest",
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", help="Write upgraded files here (created), same names."),
    ] = None,
    inplace: Annotated[
        bool, typer.Option("--inplace", help="Replace each file, keeping <name>.pre-<release>.bak.")
    ] = False,
    only_latest: Annotated[
        bool, typer.Option("--only-latest", help="Upgrade only the checkpoint autoload would take.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan only; write nothing.")] = False,
    name: Annotated[
        str, typer.Option("--name", help="Checkpoint name pattern with one {step} field.")
    ] = "checkpoint_{step}.mdl",
    verify: Annotated[
        str,
        typer.Option("--verify", help="index: by stored-chunk identity; full: hash every tensor."),
    ] = "index",
    allow_missing: Annotated[
        bool, typer.Option("--allow-missing", help="Write leaves a file lacks as None.")
    ] = False,
    config: Annotated[
        Path | None, typer.Option("--config", help="The run's params.yaml (tie flags, seed).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per file.")] = False,
) -> None:
    """Upgrade every checkpoint in a model directory, newest first; a rerun does what is left."""
    from ckpt_migrate.model_dir.upgrade_dir import DirOptions, worst_exit_code

    if verify not in ("index", "full"):
        raise UsageError(None, f"--verify must be index or full, not {verify!r}")
    opts = DirOptions(
        target=to,
        output_dir=output_dir,
        inplace=inplace,
        only_latest=only_latest,
        dry_run=dry_run,
        name=name,
        verify=verify,  # type: ignore[arg-type]
        allow_missing=allow_missing,
        inputs=commands.step_inputs(config=config),
    )

    def show(entry: Any) -> None:
        if as_json:
            typer.echo(json.dumps(entry.to_json(), default=str))
        else:
            _print_dir_entry(entry)

    with _progress(enabled=not as_json) as progress:
        entries = commands.upgrade_dir(model_dir, opts, progress, show)
    worst = worst_exit_code(entries)
    if not as_json:
        _print_dir_summary(entries, worst)
    if worst:
        raise typer.Exit(worst)


def _print_dir_entry(entry: Any) -> None:
    res = entry.result
    if res is not None and entry.status in ("upgraded", "planned", "failed"):
        _print_result(res)
    elif entry.status == "current":
        where = f"; {entry.action} into {res.output.parent}" if entry.action else "; left alone"
        typer.echo(f"{entry.path}: already at {res.to_release}{where}")
    elif entry.status == "already-upgraded":
        typer.echo(f"{entry.path}: already upgraded to {res.to_release} in {res.output}")
    elif entry.status == "not-selected":
        typer.echo(f"{entry.path}: left alone ({entry.reason})")
    else:
        typer.echo(f"{entry.path}: {entry.kind}, {entry.status.replace('-', ' ')} ({entry.reason})")


def _print_dir_summary(entries: list, worst: int) -> None:
    from collections import Counter

    from rich.console import Console
    from rich.table import Table

    table = Table("file", "kind", "outcome", "release", title="upgrade-dir summary")
    for e in entries:
        res = e.result
        release = ""
        if res is not None and res.from_release and res.to_release:
            release = f"{res.from_release} → {res.to_release}"
            if res.from_release == res.to_release:
                release = res.to_release
        outcome = e.status + (f" ({e.action})" if e.action else "")
        table.add_row(e.path.name, e.kind, outcome, release)
    console = Console(highlight=False)
    console.print(table)
    counts = Counter(e.status for e in entries)
    totals = ", ".join(f"{n} {status}" for status, n in counts.items())
    console.print(f"{totals}; exit {worst}", markup=False)


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
