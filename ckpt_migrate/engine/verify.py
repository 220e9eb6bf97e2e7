"""Verifying an upgrade's output before it is published.

``index`` (the default): the re-read tree must equal the planned one, and every reused tensor
must index the same stored chunks as the source, so its bytes are the source's bytes by
construction; new tensors are hashed. ``full`` (implied by a manifest) hashes every tensor of
the output and of the source and compares them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py

from ckpt_migrate._version import __version__
from ckpt_migrate.atomic import atomic_output
from ckpt_migrate.engine.copypatch import Written
from ckpt_migrate.engine.plan import Plan
from ckpt_migrate.engine.splitcopy import Progress
from ckpt_migrate.errors import VerificationError
from ckpt_migrate.format.checkpoint import Checkpoint
from ckpt_migrate.format.compare import (
    check_written,
    dataset_sha256,
    tensor_sha256,
)
from ckpt_migrate.format.h5.io import object_addresses, open_read
from ckpt_migrate.format.releases import Release
from ckpt_migrate.format.tree import H5Data, Node, TensorLeaf, iter_leaves


def verify_index(
    ckpt: Checkpoint, root: Node, release: Release, tmp: Path, written: Written, *, full: bool
) -> None:
    """Metadata-only checks: the tree reads back as planned and every reused tensor is the very
    stored object of the source (so its bytes are the source's bytes by construction)."""
    check_written(tmp, root, release, tensors_proven=True)  # by address or hash, below
    seen: set[int] = set()
    with open_read(tmp) as out:
        at = object_addresses(out) if not full else {}
        for ref in iter_leaves(root):
            leaf = ref.leaf
            entry = written.placed.get(id(leaf))
            if entry is None or id(leaf) in seen:
                continue
            seen.add(id(leaf))
            assert isinstance(leaf, TensorLeaf)
            name, reused = entry
            if not reused:  # written by HDF5 just now, so complete: hash it
                _check_hash(tmp, ref.name, leaf, out[name], written)
            elif not full:
                data = leaf.data
                assert isinstance(data, H5Data)
                source_at = data.handle.addresses().get(data.name)
                if source_at is None or at.get(name) != source_at:
                    raise VerificationError(
                        tmp, f"tensor {ref.name!r} does not hold its source data"
                    )


def verify_full(root: Node, tmp: Path, written: Written, progress: Progress | None = None) -> None:
    """Hash every tensor of the output and compare it with its source (or its new data);
    ``progress`` hears of it as phase ``verify``, in bytes."""
    refs = [ref for ref in iter_leaves(root) if id(ref.leaf) in written.placed]
    total = sum(ref.leaf.nbytes for ref in refs if isinstance(ref.leaf, TensorLeaf))
    done = 0
    with open_read(tmp) as out:
        for ref in refs:
            leaf = ref.leaf
            assert isinstance(leaf, TensorLeaf)
            _check_hash(tmp, ref.name, leaf, out[written.placed[id(leaf)][0]], written)
            done += leaf.nbytes
            if progress is not None:
                progress("verify", done, total)


def _check_hash(tmp: Path, name: str, leaf: TensorLeaf, ds: h5py.Dataset, written: Written) -> None:
    if name in written.hashes:
        return
    got = dataset_sha256(ds, leaf.dtype)
    if tensor_sha256(leaf) != got:
        raise VerificationError(tmp, f"tensor {name!r} differs from its source")
    written.hashes[name] = got


def write_manifest(
    path: Path, src: Path, target: Path, plan: Plan, written: Written, record: dict[str, Any]
) -> None:
    doc = {
        "source": str(src),
        "output": str(target),
        "source_xxh3_128": record["source_xxh3_128"],
        "from": plan.source_release.name,
        "to": plan.target_release.name,
        "hops": record["hops"],
        "tool": f"ckpt-migrate {__version__}",
        "tensors": written.hashes,
    }
    with atomic_output(path, replace=True) as tmp:
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
