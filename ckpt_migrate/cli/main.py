"""The ``ckpt-migrate`` command line: option declarations only.

Each verb parses, calls ``cli.commands``, prints with ``cli.render`` and exits; errors end as one
line with the README's exit code (``cli.console.run_guarded``), a traceback only with
``--debug``. ``cli.commands`` (and with it h5py, the engine and every room) is reached through
the package's lazy face, so ``--help`` and usage errors load none of it; torch is never
imported here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ckpt_migrate import cli
from ckpt_migrate._version import __version__
from ckpt_migrate.cli import checks, console, hf_verbs, render, tf_verbs
from ckpt_migrate.cli.dir_names import file_to_write, path
from ckpt_migrate.cli.options import (
    AllowMissingOpt,
    CopyMethodOpt,
    DeepCheckOpt,
    DeepOpt,
    DryRunOpt,
    ForceOpt,
    FromOpt,
    InplaceOpt,
    JsonLinesOpt,
    JsonOpt,
    ManifestOpt,
    ModelOpt,
    NumCsxOpt,
    OutputDirOpt,
    ProgressOpt,
    QuietOpt,
    SchedulerOpt,
    StrictOpt,
    ToOpt,
    UpgradeVerifyOpt,
    WorkersOpt,
    hop_inputs_given,
    offer_hop_inputs,
)
from ckpt_migrate.errors import EXIT_VERIFY_FAILED

app = typer.Typer(
    name="ckpt-migrate",
    help="Read, inspect and upgrade Cerebras-style PyTorch HDF5 checkpoints, safely.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


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
    """``--debug`` is read by ``main`` before the app runs."""


@app.command("inspect")
def inspect_cmd(
    path: Annotated[Path, typer.Argument(help="Checkpoint file (.mdl / .h5).")],
    show_all: Annotated[
        bool, typer.Option("--all", "-a", help="The whole tree outline, every leaf.")
    ] = False,
    depth: Annotated[
        int | None, typer.Option("--depth", help="Outline levels to show, every entry of each.")
    ] = None,
    as_json: JsonOpt = False,
    progress_mode: ProgressOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    """Release, format, bytes by dtype and a summary of the tree; --all for every leaf."""
    with console.progress(not quiet, progress_mode, beside_json=as_json) as progress:
        data = cli.commands.inspect(
            path, everything=show_all or as_json, depth=depth, progress=progress
        )
    render.emit_json(data) if as_json else render.inspect(data)


@app.command("to-torch")
def to_torch_cmd(
    src: Annotated[Path, typer.Argument(help="Checkpoint to convert.")],
    dst: Annotated[
        str, typer.Argument(help="torch.save file to write (must not exist).", parser=path)
    ],
    allow_missing: AllowMissingOpt = False,
    progress_mode: ProgressOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    """Write a plain torch.save file (loadable with torch.load(weights_only=True))."""
    with console.progress(not quiet, progress_mode) as progress:
        out = cli.commands.to_torch(
            src, file_to_write(dst, src, ".pt"), allow_missing=allow_missing, progress=progress
        )
    console.echo(f"wrote {out['output']}")
    for note in out["notes"]:
        console.echo(f"note: {out['output']} {note}", err=True)


@app.command("from-torch")
def from_torch_cmd(
    src: Annotated[Path, typer.Argument(help="torch.save file (loaded with weights_only=True).")],
    dst: Annotated[str, typer.Argument(help="Checkpoint to write (must not exist).", parser=path)],
    release: Annotated[
        str,
        typer.Option(
            "--release", "--to", help="Release whose format to write, e.g. 2.0 or latest."
        ),
    ] = "latest",
    as_json: JsonOpt = False,
    progress_mode: ProgressOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    """Write a torch.save file as a Cerebras H5 checkpoint."""
    with console.progress(not quiet, progress_mode, beside_json=as_json) as progress:
        out = cli.commands.from_torch(
            src, file_to_write(dst, src, ".mdl"), release, progress=progress
        )
    render.emit_json(out) if as_json else render.from_torch(out)


app.command("export-hf")(hf_verbs.export_hf_cmd)
app.command("import-hf")(hf_verbs.import_hf_cmd)
app.command("tf-to-h5")(tf_verbs.tf_to_h5_cmd)
app.command("h5-to-tf")(tf_verbs.h5_to_tf_cmd)


@app.command("history")
def history_cmd(as_json: JsonOpt = False) -> None:
    """The known releases and the migration graph between them."""
    data = cli.commands.history()
    render.emit_json(data) if as_json else render.history(data)


@app.command("plan")
def plan_cmd(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="Checkpoint file.")],
    to: ToOpt = "latest",
    from_release: FromOpt = None,
    model: ModelOpt = None,
    as_json: JsonOpt = False,
    progress_mode: ProgressOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    """Show the hops an upgrade would apply, the inputs they need and the disk they cost."""
    inputs = cli.commands.step_inputs(hop_inputs_given(ctx), model=model)
    with console.progress(not quiet, progress_mode, beside_json=as_json) as progress:
        data = cli.commands.plan(path, to, from_release, inputs=inputs, progress=progress)
    render.emit_json(data) if as_json else render.plan(data)
    given, chain = hop_inputs_given(ctx), (data["from"], data["to"])
    render.warnings(cli.hop_inputs.unused(given, [chain]))


@app.command("upgrade")
def upgrade_cmd(
    ctx: typer.Context,
    paths: Annotated[list[Path], typer.Argument(help="Checkpoint files to upgrade.")],
    to: ToOpt = "latest",
    from_release: FromOpt = None,
    output_dir: OutputDirOpt = None,
    inplace: InplaceOpt = False,
    force: ForceOpt = False,
    dry_run: DryRunOpt = False,
    manifest: ManifestOpt = None,
    verify: UpgradeVerifyOpt = "index",
    copy_method: CopyMethodOpt = "auto",
    allow_missing: AllowMissingOpt = False,
    strict: StrictOpt = False,
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
    num_csx: NumCsxOpt = None,
    model: ModelOpt = None,
    as_json: JsonLinesOpt = False,
    progress_mode: ProgressOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    """Upgrade checkpoints to a newer release in one pass, verified, never overwriting.

    With --config, the run's params.yaml is upgraded alongside, from the checkpoint's release
    to the same target, and every config change is reported.
    """
    if len(paths) == 1 and not dry_run:  # (a dry run may read the outline only)
        cli.begin_reading(paths[0])  # its metadata walk runs while the verbs are imported
    inputs = cli.commands.step_inputs(hop_inputs_given(ctx), config=config, model=model)
    worst, chains = 0, []
    with console.progress(not quiet, progress_mode, beside_json=as_json) as progress:
        runs = cli.upgrades.upgrade(
            paths,
            to=to,
            from_release=from_release,
            output_dir=output_dir,
            inplace=inplace,
            dry_run=dry_run,
            manifest=manifest,
            verify=verify,
            copy_method=copy_method,
            strict=strict,
            allow_missing=allow_missing,
            inputs=inputs,
            config=config,
            config_out=config_out,
            num_csx=num_csx,
            model=model,
            progress=progress,
            force=force,
        )
        for res, cfg in runs:
            worst = max(worst, res.exit_code, cfg.exit_code if cfg else 0)
            chains.append((res.from_release, res.to_release))
            if as_json:
                data = res.to_json()
                if cfg is not None:
                    data["config"] = cfg.to_json()
                console.echo(json.dumps(data, default=str))
            else:
                render.upgrade_result(res, quiet)
                render.config_outcome(cfg)
    _end_of_runs(ctx, worst, chains)


@app.command("upgrade-dir")
def upgrade_dir_cmd(
    ctx: typer.Context,
    model_dir: Annotated[Path, typer.Argument(help="The model directory.")],
    to: ToOpt = "latest",
    output_dir: OutputDirOpt = None,
    inplace: InplaceOpt = False,
    only_latest: Annotated[
        bool, typer.Option("--only-latest", help="Upgrade only the checkpoint autoload would take.")
    ] = False,
    dry_run: DryRunOpt = False,
    name: Annotated[
        str, typer.Option("--name", help="Checkpoint name pattern with one {step} field.")
    ] = "checkpoint_{step}.mdl",
    verify: UpgradeVerifyOpt = "index",
    copy_method: CopyMethodOpt = "auto",
    allow_missing: Annotated[
        bool, typer.Option("--allow-missing", help="Write leaves a file lacks as None.")
    ] = False,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="The run's params.yaml: read for tie flags and the seed, and upgraded with the "
            "newest checkpoint into --output-dir (so it is a complete model directory; "
            "<config stem>.<release>.yaml beside it with --inplace).",
        ),
    ] = None,
    config_out: Annotated[
        Path | None,
        typer.Option("--config-out", help="Where the upgraded --config goes instead."),
    ] = None,
    num_csx: NumCsxOpt = None,
    model: ModelOpt = None,
    scheduler: SchedulerOpt = None,
    workers: WorkersOpt = None,
    deep_check: DeepCheckOpt = False,
    as_json: JsonLinesOpt = False,
    progress_mode: ProgressOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    """Upgrade every checkpoint in a model directory, newest first; a rerun does what is left.

    With --config, the run's params.yaml is upgraded with the newest checkpoint, so the output
    directory is a complete model directory. The directory and --output-dir may be s3://
    prefixes (the s3 extra): tensor bytes are copied by the store, never downloaded.
    """

    def show(entry: Any) -> None:
        if as_json:
            console.echo(json.dumps(entry.to_json(), default=str))
        else:
            render.dir_entry(entry, quiet)

    def show_config(outcome: Any) -> None:
        if as_json:
            console.echo(json.dumps({"kind": "config", **outcome.to_json()}, default=str))
        else:
            render.config_outcome(outcome)

    with console.progress(not quiet, progress_mode, beside_json=as_json) as progress:
        entries, worst = cli.upgrades.upgrade_dir(
            model_dir,
            to=to,
            output_dir=output_dir,
            inplace=inplace,
            only_latest=only_latest,
            dry_run=dry_run,
            name=name,
            verify=verify,
            copy_method=copy_method,
            allow_missing=allow_missing,
            inputs=cli.commands.step_inputs(hop_inputs_given(ctx), config=config, model=model),
            progress=progress,
            on_entry=show,
            config=config,
            config_out=config_out,
            num_csx=num_csx,
            model=model,
            on_config=show_config,
            scheduler=scheduler,
            workers=workers,
            on_done=console.each_done(progress, "all checkpoints"),
            deep_check=deep_check,
        )
    if not as_json:
        render.dir_summary(entries, worst)
    chains = [(e.result.from_release, e.result.to_release) for e in entries if e.result]
    _end_of_runs(ctx, worst, chains)


def _end_of_runs(ctx: typer.Context, worst: int, chains: list[tuple[Any, Any]]) -> None:
    """The worst exit code of the runs, or the hop options none of them took, said."""
    if worst:  # (a failure's error stays the one line)
        raise typer.Exit(worst)
    render.warnings(cli.hop_inputs.unused(hop_inputs_given(ctx), chains))


@app.command("check")
def check_cmd(
    paths: Annotated[list[Path], typer.Argument(help="Checkpoint files.")],
    to: ToOpt = "latest",
    from_release: FromOpt = None,
    deep: DeepOpt = False,
    as_json: JsonOpt = False,
    progress_mode: ProgressOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    """For CI: exit 0 when at the target release, 10 when an upgrade is needed, 3 when newer
    than this tool knows; of several files, the worst (an error's before 10)."""
    asked = checks.Asked(to, from_release, deep, as_json, progress_mode, quiet)
    code = checks.check(paths, asked)
    if code:
        raise typer.Exit(code)


@app.command("verify")
def verify_cmd(
    a: Annotated[Path, typer.Argument(help="First checkpoint.")],
    b: Annotated[Path, typer.Argument(help="Second checkpoint.")],
    allclose: Annotated[
        bool, typer.Option("--allclose", help="Compare tensor values with a tolerance.")
    ] = False,
    as_json: JsonOpt = False,
    progress_mode: ProgressOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    """Compare two checkpoints leaf by leaf (tensors stored alike by their stored bytes, the
    others by sha256; or --allclose)."""
    with console.progress(not quiet, progress_mode, beside_json=as_json) as progress:
        data = cli.commands.verify(a, b, allclose=allclose, progress=progress)
    render.emit_json(data) if as_json else render.verify(data)
    if not data["identical"]:
        raise typer.Exit(EXIT_VERIFY_FAILED)


def without_flag_metavars(command: Any) -> Any:
    """Typer shows ``<bool>`` after every flag, which takes no value: show nothing there."""
    for param in getattr(command, "params", []):
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    make_help = command.get_help_option  # built anew for each help page

    def help_option(ctx: Any) -> Any:
        option = make_help(ctx)
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        without_flag_metavars(sub)
    return command


def paths_read_by_the_command(command: Any) -> Any:
    """Typer's paths are checked readable while the command line is parsed: a file this user
    may not read was a usage error (exit 2, "Path '…' is not readable."). The command's own
    reader says so instead, as the I/O error it is (exit 5, the file named), as it does for a
    file behind a directory the user may not enter, which that check never sees."""
    for param in getattr(command, "params", []):
        if getattr(param.type, "readable", False):
            param.type.readable = False
    for sub in getattr(command, "commands", {}).values():
        paths_read_by_the_command(sub)
    return command


def click_command() -> Any:
    """The app as click runs it: flags without metavars, paths read by the command (not
    checked by the parser), the hops' inputs offered."""
    command = offer_hop_inputs(without_flag_metavars(typer.main.get_command(app)))
    return paths_read_by_the_command(command)


def _run_app(args: list[str]) -> int:
    try:
        # Without standalone mode typer returns (not raises) the code of a typer.Exit.
        code = click_command().main(args=args, prog_name="ckpt-migrate", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        console.echo("aborted", err=True)
        return console.EXIT_INTERRUPTED
    except Exception as exc:  # usage errors of typer's bundled click show themselves
        if callable(getattr(exc, "show", None)) and isinstance(
            getattr(exc, "exit_code", None), int
        ):
            exc.show()
            return exc.exit_code
        raise
    return code if isinstance(code, int) else 0


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app, every error one line with its exit code."""
    args = sys.argv[1:] if argv is None else argv
    # --debug is accepted anywhere before a "--": after the verb as well as before it.
    end = args.index("--") if "--" in args else len(args)
    debug = "--debug" in args[:end]
    args = [a for a in args[:end] if a != "--debug"] + args[end:]
    return console.run_guarded(lambda: _run_app(args), debug=debug)
