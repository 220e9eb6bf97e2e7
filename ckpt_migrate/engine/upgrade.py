"""Upgrade one checkpoint: plan, apply every hop to the lazy tree, write the result once
(``engine.copypatch``), verify it (``engine.verify``), then publish it.

The temporary file is written beside the target, verified, fsynced and only then moved into
place; the source is never modified. ``--inplace`` keeps the original as a backup (a hard link).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ckpt_migrate.atomic import (
    advisory_lock,
    as_os_error,
    atomic_output,
    check_writable,
    fsync_path,
    io_error,
    link_or_copy,
    made_directory,
    publish,
    remove_stale_temporaries,
    same_file,
    take_place_of,
)
from ckpt_migrate.engine import rootedit, rootverify
from ckpt_migrate.engine.copypatch import Output, Written, verified_copy, write
from ckpt_migrate.engine.destination import backup_path, check_output_dir, output_file, output_path
from ckpt_migrate.engine.extents import Choice
from ckpt_migrate.engine.manifest import check_manifest, current_manifest, write_manifest
from ckpt_migrate.engine.plan import Plan, read_planned
from ckpt_migrate.engine.splitcopy import SplitCopy
from ckpt_migrate.engine.verify import verify_full, verify_index
from ckpt_migrate.errors import CkptError, CkptIOError, UsageError, VerificationError
from ckpt_migrate.format import provenance
from ckpt_migrate.format.checkpoint import Checkpoint
from ckpt_migrate.format.deep_check import check_tensors
from ckpt_migrate.format.h5 import storagescan
from ckpt_migrate.format.h5.identity import watch
from ckpt_migrate.format.h5.io import check_file, damaged
from ckpt_migrate.format.h5.root import superblock_offset
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import DictNode
from ckpt_migrate.format.write import prepare
from ckpt_migrate.hops.hop import Hop, Operation, StepContext
from ckpt_migrate.interrupt import Interrupt
from ckpt_migrate.models.detect import FamilyChoice, choose_family
from ckpt_migrate.models.steps import report_unknown_keys


@dataclass
class UpgradeOptions:
    target: str = "latest"
    source_release: str | None = None  # --from: override the release the file claims
    output_dir: Path | None = None
    output: Path | None = None  # an explicit output file (the script front ends)
    inplace: bool = False
    dry_run: bool = False
    manifest: Path | None = None
    verify: Literal["index", "full"] = "index"
    inputs: dict[str, Any] = field(default_factory=dict)
    strict: bool = False
    allow_missing: bool = False
    copy_method: Choice = "auto"  # extents: clone where the filesystem shares, else copy
    force: bool = False  # replace an existing output, once the new one is verified
    # Operations for a file already at the target, which then is written anew (Hop.at)
    edits: tuple[Operation, ...] = ()
    deep_check: bool = False  # decode every tensor of the source first (``format.deep_check``)


@dataclass
class UpgradeResult:
    source: Path
    status: str  # "upgraded" | "current" | "planned" | "failed"
    from_release: str | None = None
    to_release: str | None = None
    output: Path | None = None
    backup: Path | None = None
    hops: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    strategy: str | None = None
    verified: str | None = None
    tensor_data: str | None = None  # what was done with the tensor data (``_tensor_data``)
    tensors: int = 0
    bytes_written: int = 0
    copy_method: str | None = None  # clone | kernel | copy | rewrite
    bytes_shared: int = 0  # source bytes the output shares with it instead of a copy
    seconds: float = 0.0
    error: str | None = None
    exit_code: int = 0
    plan: dict[str, Any] | None = None
    placed: str | None = None  # a file already current put into the output: linked, copied
    family: str | None = None  # the model family the key steps used (None: unknown)
    model: dict[str, Any] | None = None  # FamilyChoice.to_json(): source, detection, evidence
    transfer: dict[str, Any] | None = None  # object storage: bytes fetched/uploaded/copied
    upgraded_from: list[str] | None = None  # the releases earlier ckpt-migrate runs began at

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if v is not None}
        return out | {k: str(out[k]) for k in ("source", "output", "backup") if k in out}


def apply_hops(
    ckpt: Checkpoint, plan: Plan, opts: UpgradeOptions, family: FamilyChoice | None = None
) -> StepContext:
    """Run every operation of every hop on the tree (no tensor data is read unless transformed)."""
    inputs = {
        "allow_missing": opts.allow_missing,
        "source_release": plan.source_release.name,  # the file's, not the hop's
        **opts.inputs,
    }
    ctx = StepContext(ckpt.root, ckpt.path, inputs, opts.strict)
    choice = family or choose_family(ckpt.root, inputs.get("model"))
    ctx.inputs["model_family"] = choice  # read by the model-key steps
    ctx.warnings.extend(choice.warnings())
    for hop in plan.hops:
        ctx.hop = hop
        for operation in hop.operations:
            operation(ctx)
    ctx.hop = None
    report_unknown_keys(ctx)
    if ckpt.strays:  # (datasets the real loader never reads; inspect lists them)
        ctx.warnings.append(f"{len(ckpt.strays)} dataset(s) no leaf names: not carried over")
    return ctx


def upgrade(
    path: str | Path, opts: UpgradeOptions, progress: Progress | None = None
) -> UpgradeResult:
    """Upgrade one file; errors the user can act on become a failed result, not an exception."""
    src = Path(path)
    result = UpgradeResult(src, "failed")
    start = time.monotonic()
    try:
        _upgrade(src, opts, result, progress)
    except CkptError as exc:
        Interrupt.check()  # an error an interrupt caused: the interrupt is the news
        result.status, result.error, result.exit_code = "failed", str(exc), exc.exit_code
    except OSError as exc:
        Interrupt.check()
        err = io_error(src, exc)
        result.status, result.error, result.exit_code = "failed", str(err), err.exit_code
    result.seconds = round(time.monotonic() - start, 3)
    return result


def check_destination(opts: UpgradeOptions) -> None:
    """Raise ``UsageError`` unless ``opts`` says where an upgraded file goes (once per command,
    before any file: the problem is the command line's, not each file's)."""
    if opts.inplace and (opts.output_dir is not None or opts.output is not None):
        raise UsageError(None, "--inplace and --output-dir exclude each other")
    if not opts.inplace and opts.output_dir is None and opts.output is None and not opts.dry_run:
        raise UsageError(
            None, "say where the upgraded file goes", "pass --output-dir DIR or --inplace"
        )
    if opts.output_dir is not None:
        check_output_dir(opts.output_dir)


def _upgrade(src: Path, opts: UpgradeOptions, result: UpgradeResult, progress: Progress | None):
    check_destination(opts)
    if opts.inplace:  # through a symlink: upgrade the file it names, and keep the link
        src = src.resolve()
    check_file(src)  # (before the lock: a named pipe's open waits for a writer)
    lock = contextlib.nullcontext() if opts.dry_run else lock_source(src, opts.inplace)
    made = opts.output_dir is not None and not opts.dry_run
    with lock, made_directory(opts.output_dir) if made else contextlib.nullcontext():
        _upgrade_locked(src, opts, result, progress)


def _reads_back(opts: UpgradeOptions) -> bool:
    """Whether every tensor of the output is read back (and hashed) after writing it."""
    return opts.verify == "full" or opts.manifest is not None


def _tensor_data(opts: UpgradeOptions, written: Written) -> str:
    """What the upgrade did with the tensor data, for the report (issue #36). It copies the
    stored chunks and never decodes them: ``--verify full`` compares the stored bytes with the
    source's, a rewrite checks each chunk's index entry and frame as it copies it (``h5.chunks``),
    and only ``--deep-check`` and a manifest (which hashes every tensor) decode them."""
    if opts.deep_check or opts.manifest is not None:
        return "decoded"
    if written.strategy == "rewrite":
        return "copied as stored, chunks checked, not decoded"
    if opts.verify == "full":
        return "copied as stored, stored bytes compared, not decoded"
    return "copied as stored, not decoded"


def _place_current(src: Path, target: Path, opts: UpgradeOptions, result: UpgradeResult) -> None:
    """A file already at the target still belongs in the output directory (as ``upgrade-dir``
    puts it, at ``target``): a hard link, or a verified copy across filesystems; a dry run only
    checks."""
    check_writable(target.parent)
    if opts.dry_run:
        return
    if target.exists():  # --force: a verified copy replaces it in one rename
        with atomic_output(target, replace=True, like=src) as tmp:
            verified_copy(src, tmp)
        result.placed = "copied"
    else:
        result.placed = link_or_copy(src, target, verified_copy)
    result.output = target
    result.tensor_data = "decoded" if opts.deep_check else "copied as stored, not decoded"


def _has_destination(opts: UpgradeOptions) -> bool:
    return opts.inplace or opts.output_dir is not None or opts.output is not None


def _target(src: Path, opts: UpgradeOptions) -> Path:
    if opts.inplace:
        return src
    if opts.output is not None:  # (named by a script, which may have no --inplace)
        return output_file(src, opts.output, "name another output file", force=opts.force)
    return output_path(src, opts.output_dir, force=opts.force)


def _upgrade_locked(
    src: Path,
    opts: UpgradeOptions,
    result: UpgradeResult,
    progress: Progress | None,
) -> None:
    # The chunk indexes are walked (for damage, budgets, data past the end) while the output is
    # made, which reads none of them: their verdict is awaited before anything is published
    # (``walked``), and by any read of tensor data. A chain that edits only the root (or a file
    # already current), dry run or not, reads the outline only (``read_planned``) and copies the
    # datasets unread: their headers are scanned for what the copy would carry out of the file
    # instead (``_require_self_contained``; README, "What each command reads").
    unchanged = watch(src)  # (called before publishing)
    out_dir = opts.output.parent if opts.output is not None else opts.output_dir
    ckpt, plan = read_planned(
        src,
        opts.target,
        release=opts.source_release,
        defer_chunks=True,
        # (the object store's staging opens every dataset for its data ranges: read in full)
        outline=not opts.deep_check and opts.copy_method != "sparse",
        # (a root edit's verification compares its output with it; a dry run writes none)
        root_digest=not opts.dry_run,
        storage_scan=True,  # (``_require_self_contained``, on the second core meanwhile)
        early_spec=not opts.dry_run,  # (a dry run waits for the whole walk)
        enough=lambda plan: plan.root_only or (plan.current and not opts.edits),
        progress=progress,
        output_dir=out_dir,
        inputs=opts.inputs,
        copy_method=opts.copy_method,
    )
    with ckpt:
        if ckpt.outline:
            _require_self_contained(ckpt)
        if plan.current and opts.edits:
            plan.hops = [Hop.at(plan.target_release.name, opts.edits)]
        result.from_release, result.to_release = plan.source_release.name, plan.target_release.name
        result.upgraded_from = provenance.sources(ckpt.provenance)
        result.hops = [f"{h.source}→{h.target}" for h in plan.hops]
        family = choose_family(ckpt.root, opts.inputs.get("model"))
        result.family, result.model = family.family, family.to_json()
        # --deep-check: every tensor of the source decodes, or nothing is written
        if opts.deep_check and (error := check_tensors(ckpt, progress).error()) is not None:
            raise error
        if plan.current:
            if not ckpt.outline:
                ckpt.handle.walked()
            result.status, result.warnings = "current", list(ckpt.warnings)  # (--from's too)
            placed = opts.output_dir is not None or opts.output is not None
            output = _target(src, opts) if placed else src
            args = (opts.manifest, opts.force, opts.dry_run)
            with current_manifest(*args, src, output, ckpt, plan, progress):
                if placed:
                    _place_current(src, output, opts, result)
            if opts.manifest is not None and not opts.dry_run:
                result.tensor_data = "decoded"
            return
        # A dry run takes every check and hop of the real run and stops before the first byte
        # is written: its changes, warnings and failures are the real run's.
        target = None if opts.dry_run and not _has_destination(opts) else _target(src, opts)
        if target is not None:
            check_writable(target.parent)
        if (
            target is not None
            and plan.free_bytes is not None
            and plan.free_bytes < plan.free_needed
        ):
            raise CkptIOError(
                target.parent,
                f"needs {plan.free_needed:,} bytes free, {plan.free_bytes:,} available",
                "free disk space or "
                + ("choose another --output-dir" if opts.output is None else "write elsewhere"),
            )
        backup = backup_path(src, plan.source_release) if opts.inplace else None
        if opts.manifest is not None:
            keep = {"the source": src, "the output": target, "the backup": backup}
            check_manifest(opts.manifest, opts.force, keep)
        if opts.dry_run:
            ctx = apply_hops(ckpt, plan, opts, family)
            result.changes, result.warnings = ctx.changes, ctx.warnings + ckpt.warnings
            _, notes = prepare(
                ctx.root, plan.target_release, allow_missing=opts.allow_missing, path=src
            )
            result.warnings.extend(notes)
            if not ckpt.outline:  # a file the real run refuses fails its dry run too
                ckpt.handle.walked()
            result.status, result.plan = "planned", plan.to_json()
            return
        assert target is not None
        stale = [
            f"removed {p.name}, a temporary file an interrupted run left"
            for p in remove_stale_temporaries(target)
        ]
        out = Output.beside(src, target)
        tmp = out.tmp
        try:
            # Taken before the hops edit the tree: what they changed decides the strategy.
            before = rootedit.snapshot(ckpt.root) if _may_edit_root(plan) else None
            ctx = apply_hops(ckpt, plan, opts, family)
            result.changes, result.warnings = ctx.changes, stale + ctx.warnings + ckpt.warnings
            out_root, notes = prepare(
                ctx.root, plan.target_release, allow_missing=opts.allow_missing, path=src
            )
            result.warnings.extend(notes)
            record = _provenance(plan, src)
            full = _reads_back(opts)

            def check_metadata(written: Written) -> None:
                if edit is None:
                    verify_index(
                        ckpt,
                        out_root,
                        plan.target_release,
                        tmp,
                        written,
                        full=full,
                        progress=progress,
                    )
                    return
                root_checked = rootverify.verify_edit(ckpt.handle, tmp, edit, progress)
                if not root_checked or full:  # (the tree was let go of for the edit, below)
                    _verify_planned_again(
                        src,
                        opts,
                        plan,
                        family,
                        tmp,
                        written,
                        index=not root_checked,
                        full=full,
                        progress=progress,
                    )

            edit = None
            if before is not None:
                edit = rootedit.plan_edit(before, ckpt, out_root, plan.target_release)
                before = None  # (its 188k names at 150k leaves: 7 MB the write can use)
            args = (plan, out, record, progress, check_metadata)
            kw: dict[str, Any] = {"read_back": full, "copy_method": opts.copy_method}
            if edit is not None:  # the hops changed no dataset
                # Its check needs no tree (``Edit.let_go``): an empty one stands in. HDF5's
                # rewrite of the spec is the edit's peak; ``--verify full`` reads the source
                # again after it (``_verify_planned_again``): 325 MiB at 150k leaves with the
                # tree kept through it (issue 33).
                ctx = out_root = None
                ckpt.root = DictNode([])
                written = rootedit.write(ckpt, edit, *args, let_go=True, **kw)
            else:
                if ckpt.handle is not None:  # (the source root's digest is a root edit's)
                    ckpt.handle.root_digest = None
                written = write(ckpt, out_root, *args, **kw)
            result.copy_method, result.bytes_shared = written.copy_method, written.bytes_shared
            result.strategy = written.strategy
            result.tensors = written.tensors
            Interrupt.check()
            if full and edit is None:  # (a root edit's by ``check_metadata``)
                verify_full(out_root, tmp, written, progress, hash_all=opts.manifest is not None)
            result.verified = "full" if full else "index"
            result.tensor_data = _tensor_data(opts, written)
            if not (ckpt.outline and written.strategy == rootedit.STRATEGY):
                ckpt.handle.walked()
            Interrupt.check()
            fsync_path(tmp, settle=True)
            unchanged()
            size = tmp.stat().st_size
            result.bytes_written = (
                size
                if written.copy_method in ("copy", "rewrite")
                else written.bytes_own + max(0, size - plan.file_bytes)
            )
            manifest = contextlib.nullcontext()
            if opts.manifest is not None:  # (written first, in place once the output is)
                manifest = write_manifest(opts.manifest, src, target, plan, written.hashes, record)
            with manifest:
                if opts.inplace:
                    assert backup is not None
                    _link_backup(src, backup)
                    take_place_of(tmp, src)
                    publish(tmp, src, replace=True)
                    result.backup = backup
                else:  # --force: the old file stays until this atomic rename
                    publish(tmp, target, replace=opts.force)
            result.output = target
        except (OSError, RuntimeError) as exc:
            os_exc = as_os_error(exc)
            if os_exc is None and isinstance(exc, RuntimeError):
                # HDF5 met metadata it cannot read while editing a copy of the source (a damaged
                # object header: checksum, address), which the preflight never needed
                raise damaged(src, exc) from None
            if os_exc is None:
                raise
            raise io_error(target, os_exc) from None
        finally:
            out.abort()
        result.status = "upgraded"


def _verify_planned_again(
    src: Path,
    opts: UpgradeOptions,
    plan: Plan,
    family: FamilyChoice,
    tmp: Path,
    written: Written,
    *,
    index: bool,
    full: bool,
    progress: Progress | None,
) -> None:
    """A root edit's checks that need the tree, against the edit planned again from a second
    read of the source (the first plan's tree was let go of before the edit: ``Edit.let_go``):
    ``index``, the tree's re-read of the output (``verify_index``), where the edit's own check
    cannot read a root (``rootverify.verify_edit``); ``full``, every tensor's stored bytes
    compared with the source's (``verify_full``)."""
    with read_checkpoint(src, release=opts.source_release, outline=True) as again:
        before = rootedit.snapshot(again.root)
        ctx = apply_hops(again, plan, opts, family)
        root, _ = prepare(ctx.root, plan.target_release, allow_missing=opts.allow_missing, path=src)
        edit = rootedit.plan_edit(before, again, root, plan.target_release)
        if edit is None:
            raise VerificationError(src, "the source no longer reads as it did; was it modified?")
        edit.place_all()
        written.linked = edit.linked
        # what the checks need is ``linked``: the edit's spec text (27 MB at 150k leaves) and
        # its snapshot go (a manifest's hashes are kept meanwhile, issue 33)
        del ctx, before, edit
        if index:
            verify_index(again, root, plan.target_release, tmp, written, full=full)
        if full:
            verify_full(root, tmp, written, progress, hash_all=opts.manifest is not None)


def _require_self_contained(ckpt: Checkpoint) -> None:
    """An outline read opened no dataset, and a root edit or the placing of a current file
    copies them unread: what the copy would carry out of the file is refused from their
    headers (``storagescan``), or, where those do not tell, by the full walk."""
    handle = ckpt.handle
    if handle.storage_scanned():  # (the outline's preflight child scanned them)
        return
    base = superblock_offset(handle.file())
    if not storagescan.scan(handle.path, handle.addresses(), base):
        handle.walked()


def _link_backup(src: Path, backup: Path) -> None:
    """The backup is a hard link to the original: no copy, and nothing is removed."""
    if same_file(backup, src):  # left by an interrupted run: it *is* the original
        return
    link_or_copy(src, backup, lambda a, b: SplitCopy(a, b).finish())


def _provenance(plan: Plan, src: Path) -> dict[str, Any]:
    return provenance.record(
        src.name,
        source_release=plan.source_release.name,
        target_release=plan.target_release.name,
        hops=[f"{h.source}→{h.target}" for h in plan.hops],
        source_xxh3_128=None,  # filled in while copying
    )


def lock_source(src: Path, inplace: bool) -> contextlib.AbstractContextManager[None]:
    """Refuse an in-place upgrade of a file another upgrade is reading or replacing, and any
    upgrade of a file being upgraded in place. Upgrades that only read the file (each to its
    own output, which is published without replacing anything) run side by side."""
    busy = "another ckpt-migrate process is upgrading this file"
    return advisory_lock(src, busy, shared=not inplace)


def _may_edit_root(plan: Plan) -> bool:
    """Whether the hops may leave every dataset as it is (``engine.rootedit``), here and in
    the object store's staging file (``sparse``), whose data ranges the store shares."""
    return plan.root_only
