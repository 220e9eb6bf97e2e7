"""One function per verb, plain arguments in, plain data out (like Alembic's ``command.py``).

``cli.main`` declares the options and prints; the scripts in ``scripts/`` call these too. The
TensorFlow verbs prepare the process for a command line (``tf.saver.setup_cli_process``): they
are only called from one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import ckpt_migrate.torch as torch_api
from ckpt_migrate.cli import hop_inputs
from ckpt_migrate.config import yaml_edit
from ckpt_migrate.config.upgrade import ConfigAlongside, ConfigOutcome
from ckpt_migrate.engine import plan as planner
from ckpt_migrate.engine.extents import METHODS, Choice
from ckpt_migrate.engine.plan import check as check_file
from ckpt_migrate.engine.upgrade import (
    Progress,
    UpgradeOptions,
    UpgradeResult,
    check_destination,
)
from ckpt_migrate.engine.upgrade import upgrade as upgrade_file
from ckpt_migrate.errors import UsageError
from ckpt_migrate.format import deep_check as deep
from ckpt_migrate.format import outline, releases
from ckpt_migrate.format.compare import compare_trees
from ckpt_migrate.format.deep_check import DeepReport
from ckpt_migrate.format.h5 import preflight
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import tied_positions
from ckpt_migrate.hf import export as hf_export
from ckpt_migrate.hf import import_ as hf_import
from ckpt_migrate.hops import graph
from ckpt_migrate.model_dir import upgrade_dir as dir_upgrade
from ckpt_migrate.model_dir.names import DEFAULT_NAME
from ckpt_migrate.model_dir.upgrade_dir import DirEntry, DirOptions
from ckpt_migrate.models.detect import choose_family
from ckpt_migrate.models.names import resolve_name
from ckpt_migrate.remote import dirs as remote_dirs
from ckpt_migrate.remote import fleet, s3
from ckpt_migrate.remote import upgrade as remote_upgrade
from ckpt_migrate.tf import from_h5, to_h5
from ckpt_migrate.tf.saver import setup_cli_process

Verify = Literal["index", "full"]


# What ``inspect`` shows without --all: the first levels, a few entries per container.
SUMMARY_DEPTH = 3
SUMMARY_CHILDREN = 8


def inspect(
    path: str | Path, *, everything: bool = True, depth: int | None = None
) -> dict[str, Any]:
    """``everything``: the whole outline; else a summary (``depth`` levels, default
    SUMMARY_DEPTH, and SUMMARY_CHILDREN entries per container unless a depth is given).

    A file is read from its root and its links (``read_outline``, issue 33), its datasets not
    opened: in format 0.5 each leaf as its metadata declares it, in a legacy format as its
    dataset's header describes it (``h5.headerfacts``); a file the outline does not answer is
    read in full."""
    if depth is not None and depth < 0:
        raise UsageError(None, f"--depth must be 0 or more, not {depth}")
    with read_checkpoint(path, outline=True, legacy_outline=True) as ckpt:
        ties = tied_positions(ckpt.root)
        data = outline.report(ckpt, leaves=everything, ties=ties)
        data["outline_summary"] = not everything
        if everything:
            data["outline"] = outline.outline_lines(ckpt.root, ties=ties)
        else:
            data["outline"] = outline.outline_lines(
                ckpt.root,
                max_depth=SUMMARY_DEPTH if depth is None else depth,
                max_children=SUMMARY_CHILDREN if depth is None else None,
                ties=ties,
            )
    return data


def to_torch(
    src: str | Path,
    dst: str | Path,
    *,
    allow_missing: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    out = torch_api.to_torch(src, dst, allow_missing=allow_missing, progress=progress)
    return {"source": str(src), "output": str(out)}


def export_hf(src: str | Path, output_dir: str | Path, **options: Any) -> dict[str, Any]:
    """``export-hf``: the options are :func:`ckpt_migrate.hf.export.export`'s."""
    return hf_export.export(src, output_dir, **options).to_json()


def import_hf(src: str | Path, dst: str | Path, **options: Any) -> dict[str, Any]:
    """``import-hf``: the options are :func:`ckpt_migrate.hf.import_.import_hf`'s."""
    return hf_import.import_hf(src, dst, **options).to_json()


def from_torch(src: str | Path, dst: str | Path, release: str | None = None) -> dict[str, Any]:
    rep = torch_api.from_torch(src, dst, release)
    return {
        "source": str(src),
        "output": str(rep.path),
        "release": rep.release.name,
        "format": rep.release.format,
        "tensors": rep.tensors,
        "tensor_bytes": rep.tensor_bytes,
        "notes": rep.notes,
    }


def tf_to_h5(saver_paths: list, h5_path: str | Path, **options: Any) -> dict[str, Any]:
    setup_cli_process()
    rep = to_h5.tf_to_h5(saver_paths, h5_path, **options)
    data = asdict(rep)
    data.update(output=str(rep.path), release=rep.release.name, format=rep.release.format)
    del data["path"]
    return data


def h5_to_tf(h5_path: str | Path, saver_path: str | Path, **options: Any) -> dict[str, Any]:
    setup_cli_process()
    options["max_shard_bytes"] = options.pop("max_shard_size", "1GiB")
    return asdict(from_h5.h5_to_tf(h5_path, saver_path, **options))


def history() -> dict[str, Any]:
    g = graph.load()
    return {
        "releases": [
            {"name": r.name, "format": r.format, "spec": r.spec_encoding, "type_tags": r.type_tags}
            for r in releases.RELEASES
        ],
        "newest": g.newest,
        "hops": [h.to_json() for h in g.hops],
    }


def plan(
    path: str | Path,
    target: str = "latest",
    source_release: str | None = None,
    output_dir: Path | None = None,
    inputs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The hops, the family and the disk an upgrade costs, read from the outline
    (``read_outline``, a legacy file's too) unless the bytes to write depend on what the
    datasets store and the outline did not measure them."""
    ckpt, made = planner.read_planned(
        Path(path),
        target,
        release=source_release,
        legacy_outline=True,
        output_dir=output_dir,
        inputs=inputs,
    )
    with ckpt:
        data = made.to_json()
        choice = choose_family(ckpt.root, (inputs or {}).get("model"))
        data["model"] = choice.to_json()
        return data


def check(path: str | Path, target: str = "latest", source_release: str | None = None) -> dict:
    return check_file(path, target, source_release)


def deep_check(path: str | Path, progress: Progress | None = None) -> DeepReport:
    """``check --deep``: every tensor decoded; the report names each damaged one."""
    return deep.deep_check(path, progress)


def check_copy_method(method: str) -> Choice:
    if method not in METHODS:
        raise UsageError(None, f"--copy-method must be auto, clone or copy, not {method!r}")
    return method  # type: ignore[return-value]


def check_verify(verify: str) -> Verify:
    if verify not in ("index", "full"):
        raise UsageError(None, f"--verify must be index or full, not {verify!r}")
    return verify  # type: ignore[return-value]


def upgrade(
    paths: list[Path],
    *,
    to: str = "latest",
    from_release: str | None = None,
    output_dir: Path | None = None,
    inplace: bool = False,
    dry_run: bool = False,
    manifest: Path | None = None,
    verify: str = "index",
    copy_method: str = "auto",
    strict: bool = False,
    allow_missing: bool = False,
    inputs: dict[str, Any] | None = None,
    config: Path | None = None,
    config_out: Path | None = None,
    num_csx: int | None = None,
    model: str | None = None,
    progress: Progress | None = None,
    force: bool = False,
) -> Iterator[tuple[UpgradeResult, ConfigOutcome | None]]:
    """Upgrade each file in turn (with ``config``: its params.yaml alongside, to the same
    release); every argument is checked before the first file is touched."""
    opts = UpgradeOptions(
        target=to,
        source_release=from_release,
        output_dir=output_dir,
        inplace=inplace,
        dry_run=dry_run,
        manifest=manifest,
        verify=check_verify(verify),
        copy_method=check_copy_method(copy_method),
        strict=strict,
        allow_missing=allow_missing,
        inputs=inputs or {},
        force=force,
    )
    if force and inplace:
        raise UsageError(None, "--force replaces an output; --inplace has none", "drop --force")
    if manifest is not None and len(paths) > 1:
        raise UsageError(None, "--manifest takes one checkpoint at a time")
    if config is None and (config_out is not None or num_csx is not None):
        raise UsageError(None, "--config-out and --num-csx apply to --config", "pass --config")
    alongside = None
    if config is not None:
        alongside = ConfigAlongside(
            config,
            config_out=config_out,
            num_csx=num_csx,
            target=to,
            output_dir=output_dir,
            dry_run=dry_run,
            model=model,
        )
    if any(s3.is_url(p) for p in [*paths, output_dir]):
        yield from _upgrade_objects(paths, output_dir, opts, alongside)
        return
    check_destination(opts)
    for path in paths:
        res = upgrade_file(path, opts, progress)
        yield res, alongside.run(res) if alongside is not None else None


def _upgrade_objects(
    paths: list[Path], output_dir: Path | None, opts: UpgradeOptions, alongside: Any
) -> Iterator[tuple[UpgradeResult, None]]:
    """``s3://`` checkpoints into an ``s3://`` prefix (``remote.upgrade``)."""
    if alongside is not None:
        raise UsageError(None, "--config is not offered for s3:// checkpoints")
    if opts.manifest is not None or opts.inplace:
        raise UsageError(None, "s3:// checkpoints take --output-dir s3://..., not --inplace")
    if not all(s3.is_url(p) for p in paths) or (
        output_dir is not None and not s3.is_url(output_dir)
    ):
        raise UsageError(None, "mixes s3:// and local paths", "upgrade each kind on its own")
    if output_dir is None and not opts.dry_run:
        raise UsageError(None, "say where the upgraded objects go", "pass --output-dir s3://...")
    out = s3.S3Url.parse(output_dir) if output_dir is not None else None
    client = s3.client()
    for path in paths:
        src = s3.S3Url.parse(path)
        yield remote_upgrade.upgrade_object(src, out or src.parent(), opts, client), None


def upgrade_dir(
    model_dir: Path,
    *,
    to: str = "latest",
    output_dir: Path | None = None,
    inplace: bool = False,
    only_latest: bool = False,
    dry_run: bool = False,
    name: str = DEFAULT_NAME,
    verify: str = "index",
    copy_method: str = "auto",
    allow_missing: bool = False,
    inputs: dict[str, Any] | None = None,
    progress: Progress | None = None,
    on_entry: Callable[[DirEntry], None] | None = None,
    config: Path | None = None,
    config_out: Path | None = None,
    num_csx: int | None = None,
    model: str | None = None,
    on_config: Callable[[ConfigOutcome], None] | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
    on_done: Callable[[int, int], None] | None = None,
    deep_check: bool = False,
) -> tuple[list[DirEntry], int]:
    """Every checkpoint of ``model_dir``, newest first; returns the entries and the worst exit
    code among them (the config's included). With ``config`` the run's params.yaml is upgraded
    with the newest checkpoint into ``output_dir`` (``on_config`` hears how). ``scheduler`` (a
    Dask scheduler address) or ``workers`` (a LocalCluster of that many processes): one task
    per checkpoint on the cluster; ``on_done(done, total)`` hears of each."""
    if scheduler is not None and workers is not None:
        raise UsageError(None, "--scheduler and --workers exclude each other")
    if workers is not None and workers < 1:
        raise UsageError(None, "--workers must be at least 1")
    remote = s3.is_url(model_dir) or s3.is_url(output_dir)
    if remote and deep_check:
        raise UsageError(None, "--deep-check is not offered for s3:// model directories")
    if remote and config is not None:
        raise UsageError(None, "--config is not offered for s3:// model directories")
    if config is None and (config_out is not None or num_csx is not None):
        raise UsageError(None, "--config-out and --num-csx apply to --config", "pass --config")
    opts = DirOptions(
        target=to,
        output_dir=output_dir,
        inplace=inplace,
        only_latest=only_latest,
        dry_run=dry_run,
        name=name,
        verify=check_verify(verify),
        copy_method=check_copy_method(copy_method),
        allow_missing=allow_missing,
        inputs=inputs,
        deep_check=deep_check,
    )
    alongside = None
    if config is not None:
        alongside = ConfigAlongside(
            config,
            config_out=config_out,
            num_csx=num_csx,
            target=to,
            output_dir=output_dir,
            dry_run=dry_run,
            model=model,
            rerun=True,
        )
    outcomes: list[ConfigOutcome] = []

    def entry_done(entry: DirEntry) -> None:
        if on_entry is not None:
            on_entry(entry)
        if alongside is not None and entry.kind == "checkpoint" and entry.result is not None:
            res = entry.result
            first = alongside.done is None
            if first and res.family is None and res.status == dir_upgrade.ALREADY_UPGRADED:
                # an earlier run's output: the family its config upgrade used, as it found it
                with read_checkpoint(entry.path) as ckpt:
                    res.family = choose_family(ckpt.root, model).family
            outcome = alongside.run(res)
            if outcome is not None:
                outcomes.append(outcome)
                if on_config is not None:
                    on_config(outcome)

    cluster = (
        contextlib.nullcontext(None)
        if scheduler is None and workers is None
        else fleet.connect(scheduler, workers)
    )
    with cluster as client:
        if remote:
            entries = _upgrade_prefix(model_dir, output_dir, opts, client, entry_done, on_done)
        else:
            if client is not None:
                opts.runner = fleet.local_runner(client, on_done)
            entries = dir_upgrade.upgrade_dir(model_dir, opts, progress, entry_done)
    worst = max([dir_upgrade.worst_exit_code(entries), *(o.exit_code for o in outcomes)])
    return entries, worst


def _upgrade_prefix(
    model_dir: Path,
    output_dir: Path | None,
    opts: DirOptions,
    client: Any,
    on_entry: Callable[[DirEntry], None],
    on_done: Callable[[int, int], None] | None,
) -> list[DirEntry]:
    """An ``s3://`` run prefix into an ``s3://`` output prefix (``remote.dirs``)."""
    if not s3.is_url(model_dir) or not s3.is_url(output_dir):
        raise UsageError(
            None, "s3:// model directories go to an s3:// --output-dir", "pass both as s3://"
        )
    entries = []
    src, out = s3.S3Url.parse(model_dir), s3.S3Url.parse(output_dir)
    for entry in remote_dirs.upgrade_prefix(src, out, opts, client, on_done):
        entries.append(entry)
        on_entry(entry)
    return entries


def verify(
    a: str | Path, b: str | Path, *, allclose: bool = False, progress: Progress | None = None
) -> dict[str, Any]:
    # (each tree is read while the preflight walks its chunk indexes; a tensor read waits).
    # The second file's walk begins first: its children, forked once the first tree was
    # built, held it too (311 MiB at 150k tensors, the peak of the command, issue 33). The
    # first file's map of overlapping data is made before the second tree is read, not beside
    # it (290 -> 284 MiB).
    begun = preflight.start(Path(b))
    try:
        with read_checkpoint(a, defer_chunks=True) as left:
            if left.handle is not None:
                left.handle.ready_to_read()
            with read_checkpoint(b, defer_chunks=True) as right:
                found = compare_trees(left.root, right.root, allclose=allclose, progress=progress)
    finally:
        preflight.cancel_started(begun)  # (the first file refused: the second's walk ends)
    return {
        "left": str(a),
        "right": str(b),
        "tensors_compared": found.tensors,
        "tensors_equal_as_stored": found.stored,  # (neither decoded: ``compare_trees``)
        "identical": not found.differences,
        "differences": [{"name": d.name, "what": d.what} for d in found.differences],
    }


def step_inputs(
    given: dict[str, Any] | None = None, *, config: Path | None = None, model: str | None = None
) -> dict[str, Any]:
    """The extra inputs hops may use, as the engine takes them (only those given): the hops'
    own options (``given``, checked by ``hop_inputs.to_inputs``), the run's config and the
    model family."""
    inputs = hop_inputs.to_inputs(given or {})
    if model is not None:
        resolve_name(model)  # an unknown name fails here, before any file is read
        inputs["model"] = model
    if config is not None:
        inputs["config"] = load_config(config)
    return inputs


def load_config(path: Path) -> dict[str, Any]:
    """A run's params.yaml as plain data, for the hops' inputs."""
    data, _ = yaml_edit.load(read_config_text(path), path)
    return yaml_edit.plain(data)


def read_config_text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(path, f"cannot read the config ({exc.strerror})") from None
