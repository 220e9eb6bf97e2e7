"""``upgrade --manifest PATH``: a JSON file of the run (the source, its xxh3-128, the output,
the releases and hops) and the sha256 of every tensor of the output by name, written beside
the output and published with it. The hashes are made while the output is verified in full
(``verify.verify_full``); for a file already at its target, from the file itself."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ckpt_migrate._version import __version__
from ckpt_migrate.atomic import atomic_output, check_output, check_writable, fsync_path, same_file
from ckpt_migrate.engine.copypatch import file_digest
from ckpt_migrate.engine.plan import Plan
from ckpt_migrate.errors import UsageError
from ckpt_migrate.format.checkpoint import Checkpoint
from ckpt_migrate.format.compare import tensor_sha256
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.tree import Node, TensorLeaf, iter_leaves, tied_positions


def check_manifest(path: Path, force: bool, keep: dict[str, Path | None]) -> None:
    """``--manifest PATH`` before any work: a new file, or a regular file ``--force`` replaces,
    and never one of the files ``keep`` names (the source, the output, the backup)."""
    manifest_clash(path, keep)
    check_output(path, force=force)
    check_writable(path.parent)  # (else refused only once the upgrade was published)


def manifest_clash(path: Path, keep: dict[str, Path | None]) -> None:
    """Refuse a manifest ``path`` that is one of the files ``keep`` names (what: path)."""
    for what, other in keep.items():
        if other is not None and same_file(path, other):
            raise UsageError(path, f"--manifest names {what}", "name a new file for the manifest")


def tensor_hashes(root: Node, progress: Progress | None = None) -> dict[str, str]:
    """The sha256 of every tensor of ``root`` by name, each decoded and hashed once (a tie
    at its first place, its other names listed with that hash): the manifest of a file
    already at its target, which is its own output. ``progress`` hears of phase ``verify``."""
    tied = tied_positions(root)
    total = sum(r.leaf.nbytes for r in iter_leaves(root) if isinstance(r.leaf, TensorLeaf))
    hashes: dict[str, str] = {}
    ties, done = [], 0
    for ref in iter_leaves(root):
        leaf = ref.leaf
        if not isinstance(leaf, TensorLeaf):
            continue
        tie = tied.get(id(leaf))
        if tie is not None and tie.name != ref.name:
            ties.append((ref.name, tie.name))
            continue
        hashes[ref.name] = tensor_sha256(leaf)
        done += leaf.nbytes
        if progress is not None:
            progress("verify", done, total)
    for name, first_name in ties:
        hashes[name] = hashes[first_name]
    return hashes


@contextlib.contextmanager
def write_manifest(
    path: Path,
    src: Path,
    target: Path,
    plan: Plan,
    hashes: dict[str, str],
    record: dict[str, Any],
) -> Iterator[None]:
    """The manifest, written and synced before the block (which publishes the output) and
    moved into place after it: a manifest that cannot be written (a full disk) publishes no
    output, where the output was published and then the run said it failed. ``record``: the
    output's provenance record (its source's digest and the hops)."""
    doc = {
        "source": str(src),
        "output": str(target),
        "source_xxh3_128": record["source_xxh3_128"],
        "from": plan.source_release.name,
        "to": plan.target_release.name,
        "hops": record["hops"],
        "tool": f"ckpt-migrate {__version__}",
        "tensors": hashes,
    }
    with atomic_output(path, replace=True) as tmp:
        with tmp.open("w") as fh:  # (in pieces: the whole text was 17 MB at 150k tensors)
            json.dump(doc, fh, indent=1, sort_keys=True)
        fsync_path(tmp)
        yield


def current_manifest(
    path: Path | None,
    force: bool,
    dry_run: bool,
    src: Path,
    output: Path,
    ckpt: Checkpoint,
    plan: Plan,
    progress: Progress | None,
) -> contextlib.AbstractContextManager[None]:
    """``--manifest PATH`` (None: none) of a file already at its target, checked; unless a dry
    run, every tensor of the source decoded and hashed (the output, where there is one, is its
    hard link or its verified copy: ``output`` is the source where there is none), no hop."""
    if path is None:
        return contextlib.nullcontext()
    check_manifest(path, force, {"the source": src, "the output": output})
    if dry_run:
        return contextlib.nullcontext()
    hashes = tensor_hashes(ckpt.root, progress)
    record = {"source_xxh3_128": file_digest(src), "hops": []}
    return write_manifest(path, src, output, plan, hashes, record)
