"""Plans: which hops take a checkpoint from its release to the target, and what that costs."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_migrate.engine import extents
from ckpt_migrate.errors import NewerThanToolError
from ckpt_migrate.format import releases
from ckpt_migrate.format.checkpoint import Checkpoint
from ckpt_migrate.format.outline import tensor_bytes
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.releases import Release
from ckpt_migrate.format.tree import iter_leaves
from ckpt_migrate.hops import graph
from ckpt_migrate.hops.hop import Hop

HEADROOM = 1 << 20
# The least metadata room planned per leaf: a dataset's object header rewritten (a block), its
# attributes and its root attribute. ``data_bytes`` may be an estimate (``read_checkpoint``
# with ``defer_chunks``) that compressed data makes larger than the file.
METADATA_PER_LEAF = 8 << 10


@dataclass
class Plan:
    source: Path
    source_release: Release
    target_release: Release
    hops: list[Hop]
    file_bytes: int
    tensor_bytes: int
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

    @property
    def root_only(self) -> bool:
        """Whether the hops change no dataset: 0.5 to 0.5 (releases 2.5-2.10, either way)
        through hops that change only root-level values (``Hop.root_only``: the release, the
        ``__metadata__`` list, the structure). The output is then the source with its root
        attributes edited (``engine.rootedit``), whatever the tensor count. Legacy formats keep
        scalars in datasets, so there a ``__metadata__`` entry is a dataset too."""
        return (
            bool(self.hops)
            and not self.source_release.legacy
            and not self.target_release.legacy
            and all(h.root_only for h in self.hops)
        )

    @property
    def output_bytes(self) -> int:
        """An upper bound of the output's size: the source plus room for its metadata twice over
        (the target's tree is written anew beside the old one, which stays as free space) and a
        fixed margin. Outputs measured 3-17 % larger than their sources, all metadata."""
        return self.file_bytes + 2 * self.metadata_bytes + HEADROOM

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


def source_release(ckpt: Checkpoint) -> Release:
    if ckpt.release is None:
        raise NewerThanToolError(
            ckpt.path,
            f"written by release {ckpt.detected.label}, newer than this tool knows "
            f"(newest {releases.LATEST.name})",
            "upgrade ckpt-migrate",
        )
    return ckpt.release


def make_plan(
    ckpt: Checkpoint,
    target: str = "latest",
    *,
    output_dir: Path | None = None,
    inputs: dict[str, Any] | None = None,
    copy_method: extents.Choice = "auto",
) -> Plan:
    assert ckpt.path is not None
    src = source_release(ckpt)
    tgt = releases.get(target)
    hops = graph.load().path(src, tgt)
    out_dir = output_dir or ckpt.path.parent
    free = free_space(out_dir)
    file_bytes = ckpt.path.stat().st_size
    leaves = sum(1 for _ in iter_leaves(ckpt.root))
    return Plan(
        source=ckpt.path,
        source_release=src,
        target_release=tgt,
        hops=hops,
        file_bytes=file_bytes,
        tensor_bytes=tensor_bytes(ckpt.root),
        output_dir=out_dir,
        free_bytes=free,
        inputs_given=dict(inputs or {}),
        metadata_bytes=max(file_bytes - (ckpt.data_bytes or 0), METADATA_PER_LEAF * leaves),
        copy_method=extents.expected_method(copy_method, ckpt.path, out_dir),
    )


def check(path: str | Path, target: str = "latest", source_release: str | None = None) -> dict:
    """For CI: is ``path`` at ``target``? (exit 0 current, 10 upgrade needed, 3 newer than tool)."""
    with read_checkpoint(path, release=source_release) as ckpt:
        plan = make_plan(ckpt, target)
        return {
            "path": str(path),
            "release": plan.source_release.name,
            "target": plan.target_release.name,
            "current": plan.current,
            "downgrade": plan.target_release.version < plan.source_release.version,
            "hops": [f"{h.source}→{h.target}" for h in plan.hops],
        }


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
