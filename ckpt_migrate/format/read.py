"""Open any Cerebras H5 checkpoint (formats 0.1–0.5) as a lazy ``Checkpoint``."""

from __future__ import annotations

import os
from pathlib import Path

import h5py

from ckpt_migrate.errors import CorruptCheckpointError
from ckpt_migrate.format import budgets, provenance, releases
from ckpt_migrate.format.checkpoint import Checkpoint
from ckpt_migrate.format.h5.boundary import check_self_contained
from ckpt_migrate.format.h5.facts import Facts
from ckpt_migrate.format.h5.io import DAMAGED_HDF5, H5Handle, attr_text, damaged, open_read
from ckpt_migrate.format.h5.preflight import FIX, Rest, preflight
from ckpt_migrate.format.legacy import read as read_legacy
from ckpt_migrate.format.v05 import read as read_v05


def read_checkpoint(
    path: str | Path,
    *,
    release: str | None = None,
    isolate: bool = True,
    tensors_proven: bool = False,
    defer_chunks: bool = False,
) -> Checkpoint:
    """Read the structure and metadata of ``path``; tensor data stays on disk until asked for.

    ``release`` overrides the release detected from the file (for files whose metadata is wrong).
    The boundary's checks are the preflight children's; the parent repeats them only to name a
    problem they met. ``isolate=False`` skips the forked :func:`preflight` pass and so the
    boundary checks: only for a file this process has just written from a source that passed
    them (its read-back of its own output); ``data_bytes`` is then None. ``tensors_proven``
    (with ``isolate=False``): the caller proves each tensor's dataset itself, by its address or
    its hash, so format 0.5 tensors are taken as their metadata describes them, unopened.
    ``defer_chunks``: return before the preflight walk of the chunk indexes ends; its verdict
    comes at ``handle.walked()``, which every read of data calls (an upgrade by clone reads
    none, and calls it before publishing), and ``data_bytes`` counts chunked datasets by
    their declared bytes meanwhile.
    """
    p = Path(path)
    found = preflight(p, defer=defer_chunks) if isolate else None
    try:
        f = open_read(p)
    except BaseException:
        if found is not None and found.rest is not None:
            found.rest.cancel()
        raise
    handle = H5Handle(p, f)
    if found is not None and found.rest is not None:
        handle.pending = _Verdict(found.rest, f, p)
    try:
        stored, facts = (None, {}) if found is None else (found.stored, found.datasets)
        if isolate and found is None:  # the children met a problem: named here
            stored = check_self_contained(f, p)
        proven = tensors_proven and not isolate
        return _read(p, f, handle, release, stored, Facts(facts, proven))
    except DAMAGED_HDF5 as exc:
        handle.close()
        raise damaged(p, exc) from None
    except BaseException:
        handle.close()
        raise


class _Verdict:
    """The rest of a preflight walk, as ``H5Handle.pending``: a problem it met is named by
    the parent's own checks, as for a walk that ended before the read."""

    def __init__(self, rest: Rest, f: h5py.File, path: Path) -> None:
        self.rest, self.f, self.path = rest, f, path

    def wait(self) -> None:
        if self.rest.finish(self.path) is None:
            check_self_contained(self.f, self.path)
            raise CorruptCheckpointError(self.path, "its chunk indexes cannot be read", FIX)

    def cancel(self) -> None:
        self.rest.cancel()


def _read(
    p: Path,
    f: h5py.File,
    handle: H5Handle,
    release: str | None,
    data_bytes: int | None,
    facts: Facts,
) -> Checkpoint:
    version = f.attrs.get("__version__")
    cstorch = f.attrs.get("__cstorch_version__")
    try:
        version_value = None if version is None else float(version)
        cstorch_text = None if cstorch is None else attr_text(cstorch)
    except (TypeError, ValueError, UnicodeDecodeError):
        raise CorruptCheckpointError(p, "unreadable __version__/__cstorch_version__") from None
    if version is None and "__spec__" not in f.attrs:
        raise CorruptCheckpointError(
            p,
            "HDF5 file without __spec__ or __version__: not a Cerebras checkpoint",
            "is this a different kind of HDF5 file?",
        )
    detected = releases.detect(p, version_value, cstorch_text)
    if release is not None:
        forced = releases.get(release)
        if not releases.format_matches(forced.format, detected.format):
            raise CorruptCheckpointError(
                p,
                f"--from {forced.name} writes format {forced.format} but the file is format "
                f"{detected.format}",
                "name a release of the file's format",
            )
        detected = releases.Detected(detected.format, detected.cstorch_version, forced)
    tensor_scalar_dict = False
    if detected.format >= 0.5:
        root, unreferenced, warnings = read_v05.read(f, handle, facts)
    else:
        root, unreferenced, warnings, tensor_scalar_dict = read_legacy.read(
            f, handle, detected.format, facts
        )
    budgets.check_declared(root, p, os.stat(p).st_size)
    return Checkpoint(
        root,
        detected,
        p,
        unreferenced,
        provenance.read(f.attrs),
        warnings,
        tensor_scalar_dict,
        handle,
        data_bytes,
    )
