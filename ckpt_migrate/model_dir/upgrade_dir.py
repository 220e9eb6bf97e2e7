"""Upgrade every checkpoint of a model directory: newest first, names kept, resumable.

Each checkpoint goes through ``engine.upgrade`` (atomic, verified, never overwriting), newest
first by the autoload order (``checkpoint_<step>[_<timestamp>].mdl`` by step, then timestamp;
other checkpoint files after them, newest modification first), so an interrupted run has done
the checkpoint a resumed training would load. Nothing outside the directory's own files is read;
subdirectories are not searched.

A rerun does only what is left:

* ``--output-dir D``: an output that already exists is accepted only if it is a complete
  checkpoint at the target release whose provenance (``__ckpt_migrate__``) records this very
  source by its xxh3-128 digest, or an identical copy of a source already at the target; any
  other file there is an error, never overwritten. A checkpoint already at the target is
  hard-linked into D (copied across filesystems), so that D is a complete model directory in
  which autoload finds the same newest checkpoint.
* ``--inplace``: an upgraded file is at the target and so current; the engine reuses the backup
  link an interrupted run left.

Temporary files an interrupted upgrade of one of these checkpoints left (``<name>.<8 hex>.tmp``
in the directory written to) are removed, but only those no live writer holds the lock of
(``atomic.remove_stale_temporaries``: an upgrade or save in progress, of this source or of
another with the same name, keeps its file); every other temporary file is listed and left
alone. Two ``upgrade-dir`` runs writing into the same directory are refused.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import h5py

from ckpt_migrate.atomic import (
    advisory_lock,
    io_error,
    made_directory,
    remove_stale_temporaries,
)
from ckpt_migrate.engine.copypatch import file_digest
from ckpt_migrate.engine.destination import check_output_dir
from ckpt_migrate.engine.extents import Choice
from ckpt_migrate.engine.upgrade import UpgradeOptions, UpgradeResult, upgrade
from ckpt_migrate.errors import CkptError, UsageError
from ckpt_migrate.format import releases
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.releases import Release
from ckpt_migrate.interrupt import Interrupt
from ckpt_migrate.model_dir.names import DEFAULT_NAME, TEMP_SUFFIX, NamePattern
from ckpt_migrate.model_dir.records import incomplete_reason, read_run_record
from ckpt_migrate.model_dir.report import traffic

BACKUP = re.compile(r"\.pre-\d+\.\d+\.bak$")  # engine.destination.backup_path

# Statuses besides the engine's "upgraded", "current", "planned" and "failed".
ALREADY_UPGRADED = "already-upgraded"  # --output-dir: a verified upgrade of this source is there
NOT_SELECTED = "not-selected"  # --only-latest: an older checkpoint
LEFT_ALONE = "left-alone"  # not a checkpoint (or a backup, or someone else's temporary file)
REMOVED = "removed"  # a temporary file left by an interrupted upgrade


@dataclass
class DirOptions:
    target: str = "latest"
    output_dir: Path | None = None
    inplace: bool = False
    only_latest: bool = False
    dry_run: bool = False
    name: str = DEFAULT_NAME  # the checkpoint name pattern, for the order and --only-latest
    verify: Literal["index", "full"] = "index"
    copy_method: Choice = "auto"
    allow_missing: bool = False
    inputs: dict[str, Any] | None = None  # step inputs (e.g. a config) for every checkpoint
    deep_check: bool = False  # decode every tensor of each checkpoint before upgrading it
    # Runs the selected checkpoints (``upgrade_one`` each) and yields their entries in any
    # order: a Dask cluster (``remote.fleet``); None: one after the other, here.
    runner: Callable[[list[Path], DirOptions], Iterable[DirEntry]] | None = None


@dataclass
class DirEntry:
    """One file of the directory and what happened to it."""

    path: Path
    kind: str  # "checkpoint" | "temporary" | "backup" | "other"
    status: str
    reason: str | None = None
    result: UpgradeResult | None = None
    action: str | None = None  # a current checkpoint put into --output-dir: "linked" | "copied"

    @property
    def exit_code(self) -> int:
        return self.result.exit_code if self.result is not None else 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": str(self.path), "kind": self.kind}
        if self.result is not None:
            out.update(self.result.to_json())
            out.update(traffic(self.result, self.status))
        out["status"] = self.status
        if self.reason:
            out["reason"] = self.reason
        if self.action:
            out["action"] = self.action
        return out


def worst_exit_code(entries: list[DirEntry]) -> int:
    return max((e.exit_code for e in entries), default=0)


def upgrade_dir(
    model_dir: str | Path,
    opts: DirOptions,
    progress: Progress | None = None,
    on_entry: Callable[[DirEntry], None] | None = None,
) -> list[DirEntry]:
    """Upgrade the checkpoints of ``model_dir``; ``on_entry`` hears of each file as it is done.

    Problems with one checkpoint become a failed entry (with the engine's exit code); problems
    with the command as a whole (bad directory, bad options) raise a ``CkptError``."""
    src_dir = Path(model_dir)
    if not src_dir.is_dir():
        what = "is not a directory" if src_dir.exists() else "no such directory"
        raise UsageError(src_dir, what, "name the model directory that holds the checkpoints")
    if opts.inplace and opts.output_dir is not None:
        raise UsageError(None, "--inplace and --output-dir exclude each other")
    if not opts.inplace and opts.output_dir is None and not opts.dry_run:
        raise UsageError(
            None, "say where the upgraded files go", "pass --output-dir DIR or --inplace"
        )
    target = releases.get(opts.target)
    try:
        pattern = NamePattern(opts.name)
    except ValueError as exc:
        raise UsageError(None, str(exc)) from None
    out_dir = opts.output_dir
    if out_dir is not None:
        check_output_dir(out_dir)
        if out_dir.exists() and os.path.samefile(out_dir, src_dir):
            raise UsageError(out_dir, "is the model directory itself", "use --inplace")
    entries: list[DirEntry] = []

    def emit(entry: DirEntry) -> None:
        entries.append(entry)
        if on_entry is not None:
            on_entry(entry)

    work_dir = out_dir if out_dir is not None else src_dir
    lock = contextlib.nullcontext() if opts.dry_run else _dir_lock(work_dir)
    made = contextlib.nullcontext()
    if out_dir is not None and not opts.dry_run:  # (one that ends empty is removed again)
        made = made_directory(out_dir)
    with made, lock:
        scan = _scan(src_dir, pattern)
        selected = scan.checkpoints
        if opts.only_latest:
            selected = _newest(scan)
        overall = _Overall(selected, progress)
        todo = []
        for path in scan.checkpoints:
            if path not in selected:
                emit(DirEntry(path, "checkpoint", NOT_SELECTED, "--only-latest: not the newest"))
                continue
            if not opts.dry_run:
                for tmp in _remove_leftovers(path, work_dir):
                    if out_dir is None:  # a file the scan listed
                        scan.temporary.pop(tmp.name, None)
                    emit(DirEntry(tmp, "temporary", REMOVED, "left by an interrupted upgrade"))
            Interrupt.check()  # one lost in a callback: no next file either
            if opts.runner is None:
                emit(_upgrade_one(path, opts, target, overall.file(path)))
                overall.done(path)
            else:
                todo.append(path)
        if opts.runner is not None:
            for entry in opts.runner(todo, opts):
                emit(entry)
        for path, reason in scan.temporary.items():
            emit(DirEntry(src_dir / path, "temporary", LEFT_ALONE, reason))
        for entry in scan.others:
            emit(entry)
    return entries


class _Overall:
    """Progress of the whole directory: each file's phases as ``file K of N: <phase>``, and
    ``all files`` in bytes (a file counts with its size once done, and while copied by its copy)
    so that the display's time left is the whole run's; a file's end is a line in a log
    (``<name>: checkpoint K of N done``, with the whole run's time left)."""

    def __init__(self, selected: list[Path], progress: Progress | None) -> None:
        self.progress = progress
        self.order = {p: k for k, p in enumerate(selected, 1)}
        self.sizes = {p: _size(p) for p in selected}
        self.total = sum(self.sizes.values())
        self.finished = 0
        self.completed = 0

    def file(self, path: Path) -> Progress | None:
        progress = self.progress
        if progress is None:
            return None
        label = f"file {self.order[path]} of {len(self.order)}"
        before = self.finished

        def update(phase: str, done: int, total: int) -> None:
            progress(f"{label}: {phase}", done, total)
            if phase == "copy":
                progress("all files", before + done, self.total)

        progress("all files", before, self.total)
        return update

    def done(self, path: Path) -> None:
        self.finished += self.sizes[path]
        self.completed += 1
        if self.progress is not None:
            self.progress("all files", self.finished, self.total)
        say = getattr(self.progress, "milestone", None)  # a log's display has it, a bar's not
        if say is not None:
            what = f"{path.name}: checkpoint {self.completed} of {len(self.order)} done"
            say(what, self.finished, self.total)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# --------------------------------------------------------------------------- one checkpoint


def upgrade_one(src: Path, opts: DirOptions, progress: Progress | None = None) -> DirEntry:
    """One checkpoint of the directory, as ``upgrade_dir`` does it (a runner's task)."""
    return _upgrade_one(src, opts, releases.get(opts.target), progress)


def _upgrade_one(
    src: Path, opts: DirOptions, target: Release, progress: Progress | None
) -> DirEntry:
    out_dir = opts.output_dir
    if out_dir is not None:
        out = out_dir / src.name
        if out.exists() or out.is_symlink():
            return _existing_output(src, out, target)
    res = upgrade(
        src,
        UpgradeOptions(
            target=target.name,
            output_dir=out_dir,
            inplace=opts.inplace,
            dry_run=opts.dry_run,
            verify=opts.verify,
            copy_method=opts.copy_method,
            allow_missing=opts.allow_missing,
            inputs=dict(opts.inputs or {}),
            deep_check=opts.deep_check,
        ),
        progress,
    )
    entry = DirEntry(src, "checkpoint", res.status, result=res)
    entry.action = res.placed  # a current file the engine put into the output directory
    return entry


def _existing_output(src: Path, out: Path, target: Release) -> DirEntry:
    """An output from an earlier run: accept it only if it is this source's upgrade (or copy)."""
    res = UpgradeResult(src, "failed", to_release=target.name, output=out)
    entry = DirEntry(src, "checkpoint", "failed", result=res)
    try:
        entry.status, entry.action, entry.reason = _judge_existing(src, out, target, res)
        res.status = entry.status
    except CkptError as exc:
        res.error, res.exit_code = str(exc), exc.exit_code
    except OSError as exc:
        err = io_error(out, exc)
        res.error, res.exit_code = str(err), err.exit_code
    return entry


def _judge_existing(
    src: Path, out: Path, target: Release, res: UpgradeResult
) -> tuple[str, str | None, str | None]:
    """(status, action, reason) for an existing output, or a CkptError saying why it is not
    acceptable."""
    try:
        with read_checkpoint(out) as ckpt:
            release, provenance, label = ckpt.release, ckpt.provenance, ckpt.detected.label
    except CkptError as exc:
        raise UsageError(
            out,
            f"already exists and is not a readable checkpoint ({exc.problem}); refusing to "
            "overwrite it",
            "remove it, then rerun",
        ) from None
    if release is None or release.name != target.name:
        raise UsageError(
            out,
            f"already exists at release {label}, not {target.name}; refusing to overwrite it",
            "remove it or choose another --output-dir",
        )
    if os.path.samefile(src, out):  # linked by an earlier run: the source is at the target
        res.from_release = target.name
        return "current", "linked", None
    last = provenance[-1] if provenance else {}
    st = src.stat()
    identity = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    shared = last.get("source_xxh3_128") is None and last.get("source_identity") == identity
    digest = None if shared else file_digest(src)  # a cloned upgrade never read its source
    if (shared or last.get("source_xxh3_128") == digest) and last.get(
        "target_release"
    ) == target.name:
        res.from_release = last.get("source_release")
        res.hops = list(last.get("hops") or [])
        return ALREADY_UPGRADED, None, "its verified upgrade (by provenance) is already there"
    if file_digest(out) == digest:  # copied by an earlier run: the source is at the target
        res.from_release = target.name
        return "current", "copied", None
    raise UsageError(
        out,
        f"already exists and is not an upgrade of {src} (its provenance records another "
        "source); refusing to overwrite it",
        "remove it or choose another --output-dir",
    )


def _remove_leftovers(src: Path, work_dir: Path) -> list[Path]:
    """Remove the temporary files killed upgrades of ``src`` left in ``work_dir`` (never those of
    a live writer: ``atomic.remove_stale_temporaries``)."""
    return remove_stale_temporaries(work_dir / src.name)


# --------------------------------------------------------------------------- the directory


@dataclass
class _Scan:
    checkpoints: list[Path]  # newest first
    named: list[Path]  # the ones named by the pattern, newest first
    temporary: dict[str, str]  # file name -> reason
    others: list[DirEntry]


def _scan(src_dir: Path, pattern: NamePattern) -> _Scan:
    named: list[tuple[Any, Path]] = []
    unnamed: list[tuple[float, Path]] = []
    temporary: dict[str, str] = {}
    others: list[DirEntry] = []
    links: list[tuple[Any, Path]] = []  # checkpoint names that are symbolic links to files
    for path in sorted(_listdir(src_dir), key=lambda p: p.name):
        name = path.name
        if path.is_symlink():
            others.append(DirEntry(path, "other", LEFT_ALONE, "symbolic link; not followed"))
            match = pattern.match(name)
            if match is not None and path.is_file():
                links.append((match.sort_key, path))
        elif path.is_dir():
            others.append(DirEntry(path, "other", LEFT_ALONE, "directory; not searched"))
        elif not path.is_file():
            others.append(DirEntry(path, "other", LEFT_ALONE, "not a regular file"))
        elif name.endswith(TEMP_SUFFIX):
            temporary[name] = "a temporary file (a write in progress or interrupted)"
        elif BACKUP.search(name):
            others.append(DirEntry(path, "backup", LEFT_ALONE, "the original kept by --inplace"))
        else:
            match = pattern.match(name)
            kind = _probe(path)
            if match is not None:  # named like a checkpoint: upgrade it or say why not
                named.append((match.sort_key, path))
            elif kind == "checkpoint" or (kind == "damaged" and path.suffix == ".mdl"):
                unnamed.append((path.stat().st_mtime, path))
            else:
                reason = {
                    "hdf5": "an HDF5 file but not a checkpoint",
                    "damaged": "an HDF5 file that cannot be opened",
                }.get(kind, "not a checkpoint")
                others.append(DirEntry(path, "other", LEFT_ALONE, reason))
    named.sort(key=lambda item: (item[0], item[1].name), reverse=True)
    _refuse_a_newest_link(links, named)
    unnamed.sort(key=lambda item: (item[0], item[1].name), reverse=True)
    named_paths = [p for _, p in named]
    return _Scan(named_paths + [p for _, p in unnamed], named_paths, temporary, others)


def _refuse_a_newest_link(links: list[tuple[Any, Path]], named: list[tuple[Any, Path]]) -> None:
    """A link is left alone; were it the newest checkpoint, the output's newest (what a resumed
    run loads) would be an older one, and ``--only-latest`` would upgrade that one."""
    if not links:
        return
    key, link = max(links, key=lambda item: (item[0], item[1].name))
    if named and (named[0][0], named[0][1].name) > (key, link.name):
        return
    raise UsageError(
        link,
        "is the newest checkpoint (the one autoload takes), and a symbolic link, which "
        "upgrade-dir does not follow",
        f"replace the link with the file it names ({os.path.realpath(link)}), or upgrade that "
        "file with `ckpt-migrate upgrade`",
    )


def _newest(scan: _Scan) -> list[Path]:
    """--only-latest: the checkpoint autoload would take (CheckpointManager.latest's rule)."""
    for path in scan.named:
        record = read_run_record(path)
        if record is not None and record.get("kind") == "subset":
            continue
        if incomplete_reason(path) is None:
            return [path]
    return scan.named[:1]  # none is complete: the newest, so that its problem is reported


def _probe(path: Path) -> str:
    """ "checkpoint", "hdf5" (another HDF5 file), "damaged" (HDF5 that will not open), "other"."""
    try:
        if not h5py.is_hdf5(str(path)):
            return "other"
        with h5py.File(path, "r", locking=False) as f:
            attrs = f.attrs
            return "checkpoint" if "__spec__" in attrs or "__version__" in attrs else "hdf5"
    except OSError:
        return "damaged"


def _listdir(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except OSError as exc:
        raise io_error(directory, exc) from None


def _dir_lock(directory: Path) -> contextlib.AbstractContextManager[None]:
    """One ``upgrade-dir`` at a time writes into a directory."""
    return advisory_lock(
        directory, "another ckpt-migrate upgrade-dir is writing into this directory"
    )
