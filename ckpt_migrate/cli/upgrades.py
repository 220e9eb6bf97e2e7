"""The upgrade verbs' work, one function per verb (as ``commands``): ``upgrade`` of files and
``s3://`` objects, ``upgrade-dir`` of model directories, ``s3://`` prefixes and fleets.

Loaded by the package face (``cli.upgrades``) when one of them runs: the upgrade, config,
model-directory and object-storage engines are not the read-side verbs' (``commands``), and
importing them was 35 ms of the 160 ms of a ``check``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

from ckpt_migrate.atomic import same_file
from ckpt_migrate.cli.commands import check_copy_method, check_verify
from ckpt_migrate.cli.dir_names import CHECKPOINT_SUFFIXES, refuse_a_file_name
from ckpt_migrate.config.upgrade import ConfigAlongside, ConfigOutcome, upgrade_config_text
from ckpt_migrate.engine.manifest import manifest_clash
from ckpt_migrate.engine.plan import check
from ckpt_migrate.engine.upgrade import (
    Progress,
    UpgradeOptions,
    UpgradeResult,
    check_destination,
)
from ckpt_migrate.engine.upgrade import upgrade as upgrade_file
from ckpt_migrate.errors import CkptError, UsageError
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.model_dir import upgrade_dir as dir_upgrade
from ckpt_migrate.model_dir.names import DEFAULT_NAME
from ckpt_migrate.model_dir.upgrade_dir import DirEntry, DirOptions
from ckpt_migrate.models.detect import choose_family
from ckpt_migrate.remote import dirs as remote_dirs
from ckpt_migrate.remote import fleet, s3
from ckpt_migrate.remote import upgrade as remote_upgrade


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
    if output_dir is not None and not inplace:  # (with both, check_destination says so)
        _refuse_a_file_name(output_dir)
        _refuse_one_output_for_two(paths, output_dir, config_out)
    alongside = _config_alongside(
        config, config_out, num_csx, target=to, output_dir=output_dir, dry_run=dry_run, model=model
    )
    if any(s3.is_url(p) for p in [*paths, output_dir]):
        yield from _upgrade_objects(paths, output_dir, opts, alongside)
        return
    check_destination(opts)
    if manifest is not None:  # (the engine checks the rest once it has made the output's folder)
        keep = {"the source": paths[0], "the config": config, "the config's output": config_out}
        manifest_clash(manifest, keep)
    for path in paths:
        if alongside is not None and alongside.done is None:
            _refuse_a_one_way_config(alongside, path, opts)
        res = upgrade_file(path, opts, progress)
        yield res, alongside.run(res) if alongside is not None else None


def _refuse_a_file_name(output_dir: Path) -> None:
    if not s3.is_url(output_dir):  # (a prefix is taken by any name)
        why = "--output-dir takes a directory (each output keeps its source's name)"
        refuse_a_file_name(output_dir, CHECKPOINT_SUFFIXES, why, "--output-dir ")


def _refuse_a_one_way_config(alongside: ConfigAlongside, path: Path, opts: UpgradeOptions) -> None:
    """A config whose steps have no way back (a downgrade across the 2.3 trainer layout) is
    refused before the checkpoint is written: a dry run refused it, and the real run published
    the checkpoint first, then said so (exit 2). Asked of the root's release attributes only;
    a file they do not tell is the upgrade's to refuse."""
    try:
        state = check(path, opts.target, opts.source_release)
    except CkptError:
        return
    if state["downgrade"]:
        upgrade_config_text(
            alongside.text, state["release"], state["target"], source=alongside.config
        )


def _refuse_one_output_for_two(
    paths: list[Path], output_dir: Path, config_out: Path | None
) -> None:
    """Two checkpoints of one name would go to one output file (the second was refused once
    the first was done, or with ``--force`` replaced it, both reported as written), or
    ``--config-out`` names a checkpoint's output (refused once the checkpoint was written)."""
    seen: dict[str, PurePath] = {}
    for given in paths:
        path = s3.ObjectPath(given) if s3.is_url(given) else given  # prints as s3://…
        name = path.name
        target = (s3.ObjectPath if s3.is_url(output_dir) else PurePosixPath)(output_dir) / name
        if name in seen and (str(seen[name]) == str(path) or same_file(seen[name], path)):
            raise UsageError(path, "is named twice", "name each checkpoint once")
        if name in seen:
            raise UsageError(
                None,
                f"{seen[name]} and {path} would both be written to {target}",
                "upgrade them into different --output-dir directories",
            )
        if config_out is not None and same_file(config_out, Path(target)):
            raise UsageError(
                config_out, f"--config-out names the upgrade of {path}", "name another file"
            )
        seen[name] = path


def _config_alongside(
    config: Path | None, config_out: Path | None, num_csx: int | None, **options: Any
) -> ConfigAlongside | None:
    """``--config``: the run's params.yaml upgraded beside its checkpoints (``ConfigAlongside``
    and its ``options``, every check it makes before a checkpoint is touched); None without
    it, where ``--config-out`` and ``--num-csx`` have nothing to apply to."""
    if config is None:
        if config_out is not None or num_csx is not None:
            raise UsageError(None, "--config-out and --num-csx apply to --config", "pass --config")
        return None
    return ConfigAlongside(config, config_out=config_out, num_csx=num_csx, **options)


def _upgrade_objects(
    paths: list[Path], output_dir: Path | None, opts: UpgradeOptions, alongside: Any
) -> Iterator[tuple[UpgradeResult, None]]:
    """``s3://`` checkpoints into an ``s3://`` prefix (``remote.upgrade``)."""
    if alongside is not None:
        raise UsageError(None, "--config is not offered for s3:// checkpoints")
    if opts.inplace:
        raise UsageError(None, "s3:// checkpoints take --output-dir s3://..., not --inplace")
    if opts.manifest is not None:
        raise UsageError(None, "--manifest is not offered for s3:// checkpoints")
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
    if output_dir is not None and not inplace:
        _refuse_a_file_name(output_dir)
    remote = s3.is_url(model_dir) or s3.is_url(output_dir)
    if remote and deep_check:
        raise UsageError(None, "--deep-check is not offered for s3:// model directories")
    if remote and config is not None:
        raise UsageError(None, "--config is not offered for s3:// model directories")
    alongside = _config_alongside(
        config,
        config_out,
        num_csx,
        target=to,
        output_dir=output_dir,
        dry_run=dry_run,
        model=model,
        rerun=True,
    )
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
