"""Plans: which hops take a checkpoint from its release to the target, and what that costs."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_migrate.engine import extents
from ckpt_migrate.errors import NewerThanToolError
from ckpt_migrate.format import releases
from ckpt_migrate.format.checkpoint import Checkpoint
from ckpt_migrate.format.h5.root import root_metadata_bytes
from ckpt_migrate.format.outline import sizes
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.read import RootOutline, read_checkpoint, read_release, read_root_outline
from ckpt_migrate.format.releases import Release
from ckpt_migrate.format.space import HEADROOM, NEW_METADATA
from ckpt_migrate.hops import graph
from ckpt_migrate.hops.hop import Hop, StepContext


@dataclass
class Plan:
    source: Path
    source_release: Release
    target_release: Release
    hops: list[Hop]
    file_bytes: int
    tensor_bytes: int | None  # None: not read (``plan_from_root``)
    output_dir: Path
    free_bytes: int | None
    inputs_given: dict[str, Any] = field(default_factory=dict)

    @property
    def current(self) -> bool:
        return not self.hops

    @property
    def bytes_to_read(self) -> int:
        return 0 if self.current else self.file_bytes

    metadata_bytes: int = 0  # the part of the file that is not dataset storage
    copy_method: str = "copy"  # extents.expected_method: how the source's bytes will get there
    leaves: int = 0
    name_chars: int = 0  # the leaves' names, all together

    @property
    def root_only(self) -> bool:
        """Whether the hops change no dataset: 0.5 to 0.5 (releases 2.5-2.10, either way)
        through hops that change only root-level values (``Hop.root_only``: the release, the
        ``__metadata__`` list, the structure). The output is then the source with its root
        attributes edited (``engine.rootedit``), whatever the tensor count. Legacy formats keep
        scalars in datasets, so there a ``__metadata__`` entry is a dataset too."""
        return _root_only(self.source_release, self.target_release, self.hops)

    @property
    def needs_stored_bytes(self) -> bool:
        """Whether ``bytes_to_write`` depends on the bytes the datasets store (``metadata_bytes``),
        which only the full walk measures: a rewrite's output, a clone's unshared part."""
        if self.current or self.root_only:  # a root edit rewrites the root's metadata only
            return False
        return self.strategy == "rewrite" or self.copy_method == "clone"

    @property
    def output_bytes(self) -> int:
        """An upper bound of the output's size, within 1.2 times it plus 1 MiB: a patched copy
        is the source (its old metadata stays as free space) and the new metadata, a rewrite
        the stored data and the new metadata; each with ``HEADROOM``."""
        rewrite = self.strategy == "rewrite"
        base = self.file_bytes - self.metadata_bytes if rewrite else self.file_bytes
        return base + self.new_metadata_bytes + HEADROOM

    @property
    def strategy(self) -> str:
        """How the output will be made, as the engine chooses: a chain of root-level hops edits
        the root (``rootedit``); tensors under half the file are rewritten, else the source is
        patched (``copypatch.write``)."""
        if self.root_only:
            return "root-edit"
        assert self.tensor_bytes is not None  # (unread only where the hops edit the root)
        return "rewrite" if self.tensor_bytes < 0.5 * self.file_bytes else "copy-patch"

    @property
    def new_metadata_bytes(self) -> int:
        """What the output gains over the source's data or the source (``NEW_METADATA``)."""
        per_leaf, per_char = NEW_METADATA[self.strategy][self.target_release.format >= 0.5]
        return per_leaf * self.leaves + per_char * self.name_chars

    @property
    def bytes_to_write(self) -> int:
        """A clone writes only the metadata (the source's, unshared, and the new tree)."""
        if self.current:
            return 0
        if self.copy_method == "clone":
            return self.output_bytes - self.file_bytes + self.metadata_bytes
        return self.output_bytes

    @property
    def free_needed(self) -> int:
        """The new file is written beside the target before anything is removed."""
        return self.bytes_to_write

    def to_json(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "from": self.source_release.name,
            "to": self.target_release.name,
            "current": self.current,
            "hops": [h.to_json(self.inputs_given) for h in self.hops],
            "bytes_to_read": self.bytes_to_read,
            "bytes_to_write": self.bytes_to_write,
            "copy_method": self.copy_method,
            "datasets_changed": not self.current and not self.root_only,
            "tensor_bytes": self.tensor_bytes,
            "free_needed": self.free_needed,
            "free_available": self.free_bytes,
            "output_dir": str(self.output_dir),
        }


def _root_only(src: Release, tgt: Release, hops: list[Hop]) -> bool:
    return bool(hops) and not src.legacy and not tgt.legacy and all(h.root_only for h in hops)


def source_release(ckpt: Checkpoint) -> Release:
    assert ckpt.path is not None
    return known_release(ckpt.detected, ckpt.path)


def known_release(detected: releases.Detected, path: Path) -> Release:
    if detected.release is None:
        raise NewerThanToolError(
            path,
            f"written by release {detected.label}, newer than this tool knows "
            f"(newest {releases.LATEST.name})",
            "upgrade ckpt-migrate",
        )
    return detected.release


def hops_to(detected: releases.Detected, src: Release, tgt: Release) -> list[Hop]:
    """The hops from ``src`` to ``tgt``; a model already at ``tgt`` in another release's
    container (``trainer_release``: a 2.1 model in the 0.5 file a 2.10 converter wrote) is
    written again, in its own release's container, by a hop of no tree edit."""
    hops = graph.load().path(src, tgt)
    if hops or releases.format_matches(tgt.format, detected.format):
        return hops
    return [Hop.at(tgt.name, (into_own_container,))]


def into_own_container(ctx: StepContext) -> None:
    """Write the model, already at the target release, in that release's own container.

    Model Zoo's converters write their target release's model with the library they run on:
    2.10's ``--tgt-fmt cs-2.1`` writes a 0.5 file, which 2.1–2.4 cannot load (they refuse any
    format newer than 0.4, FORMAT.md §1.3). The tree needs no edit: the target release's
    writer writes its own container (``trainer_release`` says how the release is known)."""


def make_plan(
    ckpt: Checkpoint,
    target: str = "latest",
    *,
    output_dir: Path | None = None,
    inputs: dict[str, Any] | None = None,
    copy_method: extents.Choice = "auto",
) -> Plan:
    assert ckpt.path is not None
    file_bytes = ckpt.path.stat().st_size
    tensors, leaves, names = sizes(ckpt.root)
    plan = _plan(
        ckpt.path,
        ckpt.detected,
        target,
        file_bytes,
        (
            _root_metadata_bytes(root_metadata_bytes(ckpt.handle.file()), ckpt.handle.spec_bytes)
            if ckpt.outline and ckpt.handle.spec_bytes is not None  # (every 0.5 read sets it)
            else file_bytes - min(ckpt.data_bytes or 0, file_bytes)
        ),
        output_dir,
        inputs,
        copy_method,
    )
    plan.tensor_bytes, plan.leaves, plan.name_chars = tensors, leaves, names
    return plan


def plan_from_root(
    path: Path,
    target: str = "latest",
    *,
    release: str | None = None,
    output_dir: Path | None = None,
    inputs: dict[str, Any] | None = None,
    copy_method: extents.Choice = "auto",
) -> tuple[Plan, RootOutline] | None:
    """The plan of a format 0.5 file whose hops edit only its root, or that is current, read
    from its root and spec alone (``read_root_outline``): every figure of such a plan comes
    from them but the tensors' bytes, which only the leaves' metadata gives (``tensor_bytes``
    None; ``inspect`` reads them). None for any other file: it is planned from a read of its
    tree (``read_planned``). At 150k leaves the leaves' metadata was half of ``plan``'s 2.2 s
    (issue 33)."""
    tgt = releases.get(target)

    def wanted(detected: releases.Detected) -> bool:
        src = known_release(detected, path)
        hops = hops_to(detected, src, tgt)
        return not hops or _root_only(src, tgt, hops)

    found = read_root_outline(path, release, wanted)
    if found is None:
        return None
    metadata = _root_metadata_bytes(found.root_bytes, found.spec_bytes)
    size = path.stat().st_size
    plan = _plan(path, found.detected, target, size, metadata, output_dir, inputs, copy_method)
    _, plan.leaves, plan.name_chars = sizes(found.root)
    return plan, found


def _plan(
    path: Path,
    detected: releases.Detected,
    target: str,
    file_bytes: int,
    metadata_bytes: int,
    output_dir: Path | None,
    inputs: dict[str, Any] | None,
    copy_method: extents.Choice,
) -> Plan:
    src = known_release(detected, path)
    tgt = releases.get(target)
    out_dir = output_dir or path.parent
    return Plan(
        source=path,
        source_release=src,
        target_release=tgt,
        hops=hops_to(detected, src, tgt),
        file_bytes=file_bytes,
        tensor_bytes=None,
        output_dir=out_dir,
        free_bytes=free_space(out_dir),
        inputs_given=dict(inputs or {}),
        metadata_bytes=metadata_bytes,
        copy_method=extents.expected_method(copy_method, path, out_dir),
    )


def _root_metadata_bytes(root_bytes: int, spec_bytes: int) -> int:
    """What an edit of the root may rewrite in place, from an outline read (which measures no
    dataset): the root's header, its attributes' heap and index (``root_bytes``), and the
    global heap collections of the texts it replaces, the largest being ``__spec__``'s
    (``spec_bytes``, as the reader read it; counted twice: its collection may hold other
    texts), with room for a few leaves' texts."""
    return root_bytes + 2 * spec_bytes + (1 << 20)


def read_planned(
    path: Path,
    target: str,
    *,
    release: str | None = None,
    defer_chunks: bool = False,
    outline: bool = True,
    root_digest: bool = False,
    storage_scan: bool = False,
    legacy_outline: bool = False,
    early_spec: bool = False,
    enough: Callable[[Plan], bool] = lambda plan: True,
    progress: Progress | None = None,
    **options: Any,
) -> tuple[Checkpoint, Plan]:
    """The checkpoint at ``path`` and its plan (``make_plan``'s ``options``): read from its
    outline (``read_checkpoint(outline=True)``) when the plan made from it is ``enough`` for
    the caller and needs no measure of the stored bytes (``Plan.needs_stored_bytes``) that the
    outline lacks (a legacy file's has it), else read in full and planned again.
    ``root_digest``, ``storage_scan``, ``legacy_outline``, ``early_spec``, ``progress``:
    ``read_checkpoint``'s.
    The caller closes the checkpoint."""
    read = {
        "release": release,
        "defer_chunks": defer_chunks,
        "root_digest": root_digest,
        "early_spec": early_spec,
        "progress": progress,
    }
    ckpt = read_checkpoint(
        path,
        outline=outline,
        storage_scan=storage_scan,
        legacy_outline=legacy_outline,
        **read,
    )
    try:
        plan = make_plan(ckpt, target, **options)
        unmeasured = plan.needs_stored_bytes and ckpt.data_bytes is None
        if not ckpt.outline or (not unmeasured and enough(plan)):
            return ckpt, plan
    except BaseException:
        ckpt.close()
        raise
    ckpt.close()
    # (the outline's tree let go of before the full read builds its own: at 150k leaves it
    # was 108 MiB of the peak of a 2.5 → 2.4 rewrite, issue 33)
    del ckpt, plan
    ckpt = read_checkpoint(path, **read)
    try:
        return ckpt, make_plan(ckpt, target, **options)
    except BaseException:
        ckpt.close()
        raise


def check(path: str | Path, target: str = "latest", source_release: str | None = None) -> dict:
    """For CI: is ``path`` at ``target``? (exit 0 current, 10 upgrade needed, 3 newer than tool).

    Its question is the release, so it reads the root's release attributes and nothing else
    (``read_release``: the tree, the leaves' metadata and the datasets are neither read nor
    checked since issue 33; ``inspect`` reads the structure, ``check --deep`` every tensor)."""
    p = Path(path)
    detected = read_release(p, source_release)
    src = known_release(detected, p)
    tgt = releases.get(target)
    hops = hops_to(detected, src, tgt)
    found = {
        "path": str(path),
        "release": src.name,
        "target": tgt.name,
        "current": not hops,
        "downgrade": tgt.version < src.version,
        "hops": [f"{h.source}→{h.target}" for h in hops],
    }
    return found if detected.reading is None else {**found, "note": detected.reading}


def free_space(directory: Path) -> int | None:
    """Bytes free in ``directory``'s filesystem, or None when it does not say: ramfs and some
    network filesystems report a size of 0, and writes to them succeed all the same. A
    directory the upgrade will create counts as its nearest existing parent."""
    while not directory.exists() and directory.parent != directory:
        directory = directory.parent
    try:
        usage = shutil.disk_usage(directory)
    except OSError:
        return None
    return None if usage.total == 0 else usage.free
