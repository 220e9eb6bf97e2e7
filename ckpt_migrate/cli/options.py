"""Typer options that several ``ckpt-migrate`` verbs share (one spelling, one help text), and
the hops' declared inputs as options of the verbs that run hops (``offer_hop_inputs``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.models import ParamMeta

from ckpt_migrate import cli

if TYPE_CHECKING:
    from ckpt_migrate.hops.hop import InputSpec

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
JsonLinesOpt = Annotated[bool, typer.Option("--json", help="One JSON object per file.")]
ToOpt = Annotated[
    str, typer.Option("--to", help="Target release, e.g. 2.0 or latest.", show_default=True)
]
FromOpt = Annotated[
    str | None,
    typer.Option(
        "--from", help="Treat the file as this release (for files whose metadata is wrong)."
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Model family for the model-key steps (gpt2, llama, bert, t5, …); "
        "default: detected from the key names.",
    ),
]
InplaceOpt = Annotated[
    bool,
    typer.Option(
        "--inplace", "--in-place", help="Replace each file, keeping <name>.pre-<release>.bak."
    ),
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        "-n",
        help="Preview: every change and check of the real run, write nothing (a chain that "
        "edits only the root reads the root and links, not each dataset).",
    ),
]
ProgressOpt = Annotated[
    str,
    typer.Option(
        "--progress",
        help="auto (a bar on a terminal, plain lines in logs; with --json, the bar only), bar, "
        "plain or none.",
        show_default=True,
    ),
]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress and no per-change lines.")
]
OutputDirOpt = Annotated[
    Path | None,
    typer.Option("--output-dir", "-o", help="Write here (created if missing), same names."),
]
UpgradeVerifyOpt = Annotated[
    str,
    typer.Option("--verify", help="index: by stored-chunk identity; full: hash every tensor."),
]
CopyMethodOpt = Annotated[
    str,
    typer.Option(
        "--copy-method",
        help="auto: share the unchanged bytes with the source where the filesystem can "
        "(clone: XFS reflink, btrfs, ZFS 2.2+; server-side copy on NFS 4.2), else copy; "
        "clone: share or fail; copy: always copy.",
    ),
]
AllowMissingOpt = Annotated[
    bool, typer.Option("--allow-missing", help="Write leaves the file lacks as None.")
]
ExcludeOpt = Annotated[
    list[str] | None,
    typer.Option("--exclude", help="Leave out variables matching this regex (repeatable)."),
]
TfVerifyOpt = Annotated[
    str, typer.Option("--verify", help="structure (names, dtypes, shapes) or full (sha256).")
]
NumCsxOpt = Annotated[
    int | None,
    typer.Option(
        "--num-csx",
        help="CS-X systems a 1.7/1.8 run used: 1.9 made batch_size global, so the "
        "config's batch_size is multiplied by N (without it: reported, not changed).",
    ),
]


ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Replace an existing output file; it stays until the new one is verified.",
    ),
]

ManifestOpt = Annotated[
    Path | None,
    typer.Option("--manifest", help="Write per-tensor sha256 hashes (implies --verify full)."),
]

StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="Refuse to upgrade a 1.8/1.9 file without its dataloader (now the default; "
        "kept for old scripts).",
    ),
]

SchedulerOpt = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        help="A Dask scheduler (tcp://HOST:PORT): one task per checkpoint on its cluster "
        "(needs the distributed extra).",
    ),
]

WorkersOpt = Annotated[
    int | None,
    typer.Option("--workers", help="Start a Dask LocalCluster of N worker processes for the run."),
]

DeepCheckOpt = Annotated[
    bool,
    typer.Option(
        "--deep-check",
        help="Decode every tensor of each checkpoint before upgrading it (as check --deep); "
        "one that does not decode fails with exit 2 and is not upgraded.",
    ),
]
DeepOpt = Annotated[
    bool,
    typer.Option("--deep", help="First decode every tensor, naming each damaged one (exit 2)."),
]

# --------------------------------------------------------------------------- the hops' inputs

HOP_VERBS = ("upgrade", "upgrade-dir", "plan")
_GIVEN = "hop_inputs"
_ANNOTATION: dict[str, Any] = {
    "flag": bool,
    "path": Path | None,
    "int": int | None,
    "choice": str | None,
}


def offer_hop_inputs(group: Any) -> Any:
    """Give each verb of ``HOP_VERBS`` in the click ``group`` an option per input the hops
    declare (``cli.hop_inputs.specs``), built the first time the verb parses its command line or
    shows its help (so no other verb loads the hop modules); ``hop_inputs_given`` has their
    values."""
    for name in HOP_VERBS:
        command = group.commands.get(name)
        if command is not None:
            _offer(command)
    return group


def hop_inputs_given(ctx: typer.Context) -> dict[str, Any]:
    """The hop options this command line gave, by input name."""
    return dict(ctx.meta.get(_GIVEN, {}))


def _offer(command: Any) -> None:
    get_params = command.get_params
    built: list[bool] = []

    def params(ctx: Any) -> Any:
        if not built:
            built.append(True)
            command.params.extend(_option(spec) for spec in cli.hop_inputs.specs())
        return get_params(ctx)

    command.get_params = params


def _remember(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    if value is not None and value is not False:  # 0 is a value (a seed)
        ctx.meta.setdefault(_GIVEN, {})[param.name] = value
    return value


def _option(spec: InputSpec) -> Any:
    default: Any = False if spec.kind == "flag" else None
    metavar = "|".join(spec.choices) if spec.choices else None
    info = typer.Option(  # readable: as every path (main.paths_read_by_the_command)
        default, spec.flag, help=spec.help, metavar=metavar, callback=_remember, readable=False
    )
    param, _ = typer.main.get_click_param(
        ParamMeta(name=spec.name, default=info, annotation=_ANNOTATION[spec.kind])
    )
    param.expose_value = False  # read through hop_inputs_given: the verb's signature stays
    if spec.kind == "flag":
        param.metavar = ""  # no <bool> after a flag (see main.without_flag_metavars)
    return param
