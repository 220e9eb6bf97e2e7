"""Open any Cerebras H5 checkpoint (formats 0.1–0.5) as a lazy ``Checkpoint``."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ckpt_migrate.errors import CorruptCheckpointError
from ckpt_migrate.format import budgets, provenance, releases, trainer_release
from ckpt_migrate.format.checkpoint import Checkpoint
from ckpt_migrate.format.h5 import headerscan, linktable
from ckpt_migrate.format.h5.boundary import check_self_contained
from ckpt_migrate.format.h5.facts import Facts, LinksLater, OutlineTooShort
from ckpt_migrate.format.h5.io import (
    DAMAGED_HDF5,
    H5Handle,
    attr_text,
    check_file,
    damaged,
    open_read,
)
from ckpt_migrate.format.h5.preflight import FIX, Rest, preflight, start
from ckpt_migrate.format.h5.root import root_metadata_bytes, superblock_offset
from ckpt_migrate.format.h5.rootdigest import RootDigest
from ckpt_migrate.format.h5.sniff import looks_like_format_05
from ckpt_migrate.format.legacy import read as read_legacy
from ckpt_migrate.format.legacy.early_spec import EarlySpec
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.tree import Leaf, Node
from ckpt_migrate.format.v05 import read as read_v05
from ckpt_migrate.format.v05.spec import spec_outline


def read_checkpoint(
    path: str | Path,
    *,
    release: str | None = None,
    isolate: bool = True,
    tensors_proven: bool = False,
    defer_chunks: bool = False,
    outline: bool = False,
    root_digest: bool = False,
    storage_scan: bool = False,
    legacy_outline: bool = False,
    alike: Callable[[str, Leaf], Leaf] | None = None,
    early_spec: bool = False,
    progress: Progress | None = None,
) -> Checkpoint:
    """Read the structure and metadata of ``path``; tensor data stays on disk until asked for.

    ``release`` overrides the release detected from the file (for files whose metadata is wrong).
    The boundary's checks are the preflight children's; the parent repeats them only to name a
    problem they met. ``isolate=False`` skips the forked :func:`preflight` pass and so the
    boundary checks: only for a file this process has just written from a source that passed
    them (its read-back of its own output); ``data_bytes`` is then None, and a legacy file's
    datasets are described from their headers (``_described``). ``tensors_proven``
    (with ``isolate=False``): the caller proves each tensor's dataset itself, by its address or
    its hash, so format 0.5 tensors are taken as their metadata describes them, unopened, and
    its datasets no leaf names are not looked for (``unreferenced`` is empty). ``alike`` (with
    ``isolate=False``) is handed each leaf as decoded (checked against its dataset, unless
    ``tensors_proven``), with its name, and the leaf it returns is kept (the read-back's
    comparison: ``compare.check_written``).
    ``defer_chunks``: return before the preflight walk of the chunk indexes ends; its verdict
    comes at ``handle.walked()``, which every read of data calls (an upgrade by clone reads
    none, and calls it before publishing), and ``data_bytes`` counts chunked datasets by
    their declared bytes meanwhile.

    ``outline`` (issue 33): for a format 0.5 file, read the root and the links only
    (``read_outline``), falling back to the full read when that does not suffice.
    ``root_digest``: take the digest of a format 0.5 root's attributes as they are read
    (``H5Handle.root_digest``; None when they were not read in one pass). ``storage_scan``:
    an outline read's preflight child goes on to scan the datasets' storage for what a copy
    would carry out of the file (``H5Handle.storage_scanned``) while this process reads.
    ``legacy_outline`` (with ``outline``): a legacy file's outline too, its datasets described
    from their headers (``read_outline``), for a reader that reads no tensor data.
    ``early_spec``: a legacy file's spec decoded on a thread while the children walk
    (``legacy.early_spec``), for a caller that does its own work before the walk's end (an
    upgrade's edit; a dry run waits for the walk, and the decode's CPU would be the walk's).
    ``progress``: told how far the walk of the objects (``read``) and the read of a format 0.5
    root's attributes (``read root``) are.
    """
    p = Path(path)
    check_file(p)
    if outline and isolate:
        ckpt = read_outline(p, release, root_digest, storage_scan, legacy_outline, progress)
        if ckpt is not None:
            return ckpt
    early = None
    if isolate and early_spec and not looks_like_format_05(p):  # (the walk begun first)
        start(p)
        early = EarlySpec(p)
    found = preflight(p, defer=defer_chunks, progress=progress) if isolate else None
    try:
        f = open_read(p)
    except BaseException:
        if found is not None and found.rest is not None:
            found.rest.cancel()
        raise
    handle = H5Handle(p, f)
    handle.root_digest = RootDigest() if root_digest else None
    handle.progress = progress
    if found is not None and found.rest is not None:
        handle.pending = _Verdict(found.rest, handle)
    if found is not None:
        handle.links_found = found.links

    def full() -> Checkpoint:
        stored, facts = (None, {}) if found is None else (found.stored, found.datasets)
        # (the facts are this read's own: a legacy reader lets go of each as it takes it)
        if isolate and found is None:  # the children met a problem: named here
            stored = check_self_contained(f, p)
        if not isolate and not looks_like_format_05(p):
            try:  # (its datasets described from their headers, as a legacy outline's)
                return _described(p, f, handle, release, alike=alike)
            except OutlineTooShort:
                pass
        proven = tensors_proven and not isolate
        facts_ = Facts(facts, proven, alike=alike)
        return _read(p, f, handle, release, stored, facts_, early)

    return _closed_on_error(p, handle, full)


def _closed_on_error(p: Path, handle: H5Handle, read: Callable[[], Any]) -> Any:
    """``read()``; if it fails, the handle is closed (damage HDF5 reports is named so)."""
    try:
        return read()
    except DAMAGED_HDF5 as exc:
        handle.close()
        raise damaged(p, exc) from None
    except BaseException:
        handle.close()
        raise


def read_outline(
    p: Path,
    release: str | None = None,
    root_digest: bool = False,
    storage_scan: bool = False,
    legacy: bool = False,
    progress: Progress | None = None,
) -> Checkpoint | None:
    """A format 0.5 checkpoint read from its root and its links alone, no dataset opened:
    every leaf as its ``__metadata__`` declares it (a tensor's dtype and shape), a tensor's
    dataset known to exist by a link of its name but not checked against its metadata, and
    the datasets' storage (chunk indexes, stored bytes: ``data_bytes`` None) not walked. The
    links are read from the file's bytes (``linktable``), the root's attributes through HDF5
    once the preflight child has tried them (``preflight(scope="outline")``; with
    ``storage_scan`` its ``"storage"`` scope, which goes on to scan the datasets); any read of
    tensor data waits for the full walk (``_WalkFirst``). None when the outline does not
    answer (a legacy format, a leaf whose dataset must be opened, a link that is no leaf's,
    a problem the child met): the caller reads the file in full, which names any problem.

    ``legacy``: a legacy file (formats 0.1-0.4) is read so too, each dataset's facts (its
    dtype, shape, attributes and a scalar's value, as the full walk would find them) and the
    bytes the datasets store read from their headers (``headerfacts``), no dataset opened;
    ``storage_scan`` does not apply to it. Without ``legacy``, a legacy root is known by its
    header and no child is forked for it."""
    is_legacy = not looks_like_format_05(p)
    if is_legacy and not legacy:
        return None
    scan = storage_scan and not is_legacy
    # (a format 0.5 root's child goes on to read its links: ``Rest.links``)
    tried = preflight(p, scope="storage" if scan else "outline", defer=not is_legacy)
    if tried is None:
        return None
    rest = tried.rest
    try:
        f = open_read(p)
    except BaseException:
        if rest is not None:
            rest.cancel()
        raise
    handle = H5Handle(p, f)
    handle.storage = rest if scan else None
    handle.root_digest = RootDigest() if root_digest else None
    handle.progress = progress
    handle.pending = _WalkFirst(p, f, progress)

    def links() -> dict[str, int] | None:
        """The child's, else read here (a link that is not a hard link, or not read: None,
        and the file is read in full)."""
        found = None if rest is None else rest.links(p)
        return linktable.of_root(f, p) if found is None else found

    def outline() -> Checkpoint | None:
        try:
            if not is_legacy:
                # (taken once the root's attributes are read, as the child read them meanwhile:
                # 0.25 s at 150k links, issue 33)
                later = LinksLater(links)
                ckpt = _read(p, f, handle, release, None, Facts(links=later))
                handle.known_addresses(later.found())  # every link is a leaf's (``_read``)
                return ckpt
            addresses = links()
            if addresses is None:
                raise OutlineTooShort("the root's links")
            # (not kept: 27 MB at 150k links, which ``addresses()`` reads again if asked;
            # ``inspect`` and ``plan``, the readers of a legacy outline, do not ask)
            return _described(p, f, handle, release, addresses)
        except OutlineTooShort:
            handle.close()
            return None
        finally:
            if rest is not None and not scan:  # (its links taken, or not wanted)
                rest.cancel()

    return _closed_on_error(p, handle, outline)


def _described(
    p: Path,
    f: h5py.File,
    handle: H5Handle,
    release: str | None,
    addresses: dict[str, int] | None = None,
    alike: Callable[[str, Any], Any] | None = None,
) -> Checkpoint:
    """A legacy file read with every dataset described from its header (``headerfacts``: its
    dtype, shape, attributes and a scalar's value, as the full walk finds them), scanned while
    the spec is decoded, no dataset opened: a legacy outline (``read_outline``), and the
    read-back of a file this process has just written (``isolate=False``: through HDF5 each
    dataset was 0.5 ms, and the first scalar's read a walk of every object of the file for
    the overlap check of untrusted input). ``OutlineTooShort`` where that does not answer.
    ``alike``: as ``Facts.alike``, for that read-back."""
    if addresses is None:
        addresses = linktable.of_root(f, p)
        if addresses is None:
            raise OutlineTooShort("the root's links")
    begun = headerscan.Scan(p, addresses, superblock_offset(f), SPEC_SHARE)
    later = headerscan.Later(begun)
    try:
        aliased = linktable.aliased(addresses.values())
        facts = Facts(later, links=addresses.keys(), described=True, aliased=aliased, alike=alike)
        ckpt = _read(p, f, handle, release, None, facts)
        ckpt.data_bytes = later.stored()
        return ckpt
    finally:
        begun.cancel()


# The share of a legacy outline's datasets whose headers a second process scans while this one
# decodes the spec, then scans the rest (``headerscan.Scan``): about as long, at 150k tensors.
SPEC_SHARE = 0.7


def read_release(p: Path, release: str | None = None) -> releases.Detected:
    """The release of the checkpoint at ``p`` from its root attributes alone (``check``):
    ``__version__`` and ``__cstorch_version__``, the ``__spec__`` a Cerebras file has, and in
    format 0.5 the ``__SUCCESS__`` marker of a finished save, and the ``version`` leaves of a
    Trainer's ``__metadata__`` (``trainer_release``). The preflight child reads the root
    first (``preflight(scope="root")``); nothing else of the file is read or checked. When
    the child meets a problem, the file is read in full, which names it."""
    check_file(p)
    if preflight(p, scope="root") is None:
        with read_checkpoint(p, release=release) as ckpt:
            return ckpt.detected
    try:
        with open_read(p) as f:
            return _root_release(p, f, release)
    except DAMAGED_HDF5 as exc:
        raise damaged(p, exc) from None


@dataclass
class RootOutline:
    """A format 0.5 file as its root tells it (``read_root_outline``): its release, its tree
    as the spec names it, every leaf a ``MissingLeaf`` (no leaf's metadata read), the spec's
    size and the root's own (``root.root_metadata_bytes``)."""

    detected: releases.Detected
    root: Node
    spec_bytes: int
    root_bytes: int


def read_root_outline(
    p: Path, release: str | None, wanted: Callable[[releases.Detected], bool]
) -> RootOutline | None:
    """``read_release``'s reading of a format 0.5 file, then its tree from the spec alone, if
    ``wanted`` of its release (a plan whose hops edit only the root, issue 33), while the
    preflight child reads the root's links (``preflight(scope="spec")``). None for a legacy
    file, one not ``wanted``, one the child met a problem in, or whose root has a link that
    is not a hard link (an external link): a full read then names it. Nothing behind a link
    is read (``check``'s rule: a dataset's external storage is the upgrade's to refuse)."""
    check_file(p)
    if not looks_like_format_05(p):  # (no child forked for a legacy file's plan)
        return None
    found = preflight(p, scope="spec", defer=True)
    if found is None or found.rest is None:
        return None
    try:
        with open_read(p) as f:
            detected = _root_release(p, f, release)
            if detected.format < 0.5 or not wanted(detected):
                return None
            root, spec_bytes = spec_outline(f, p)
            if found.rest.links(p) is None:
                return None
            return RootOutline(detected, root, spec_bytes, root_metadata_bytes(f))
    except DAMAGED_HDF5 as exc:
        raise damaged(p, exc) from None
    finally:
        found.rest.cancel()


def _root_release(p: Path, f: h5py.File, release: str | None) -> releases.Detected:
    detected = _detect(p, f, release)
    if detected.format >= 0.5:
        read_v05.require_success(f, p)
    if release is None:
        detected = trainer_release.reading(detected, trainer_release.in_file(f, detected))
    return detected


class _WalkFirst:
    """``H5Handle.pending`` of an outline read: the full preflight walk, run before the
    first dataset is opened; a problem it meets is named by the parent's own checks."""

    def __init__(self, path: Path, f: h5py.File, progress: Progress | None = None) -> None:
        self.path, self.f, self.progress = path, f, progress

    def wait(self) -> None:
        if preflight(self.path, progress=self.progress) is None:
            check_self_contained(self.f, self.path)
            raise CorruptCheckpointError(self.path, "its datasets cannot be read", FIX)

    def cancel(self) -> None:
        pass


class _Verdict:
    """The rest of a preflight walk, as ``H5Handle.pending``: a problem it met is named by
    the parent's own checks, as for a walk that ended before the read."""

    def __init__(self, rest: Rest, handle: H5Handle) -> None:
        self.rest, self.handle, self.path = rest, handle, handle.path

    def wait(self) -> None:
        if self.rest.finish(self.path) is None:
            # (through the handle: an upgrade closes the file while it reads its output back)
            check_self_contained(self.handle.file(), self.path)
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
    early: EarlySpec | None = None,
) -> Checkpoint:
    detected = _detect(p, f, release)
    if facts.links is not None and detected.format < 0.5 and not facts.described:
        raise OutlineTooShort("a legacy format")  # its scalars and shapes are in datasets
    tensor_scalar_dict = False
    if detected.format < 0.5:
        handle.root_digest = None  # (a legacy root holds no leaves' texts)
    if detected.format >= 0.5:
        root, unreferenced, warnings = read_v05.read(f, handle, facts)
    else:
        root, unreferenced, warnings, tensor_scalar_dict = read_legacy.read(
            f, handle, detected.format, facts, early
        )
    budgets.check_declared(root, p, os.stat(p).st_size)
    if release is None:  # (else --from names it)
        detected = trainer_release.reading(detected, trainer_release.in_tree(root, detected))
    if (reading := detected.reading) is not None:
        warnings.append(reading)
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
        outline=facts.links is not None,
    )


def _one(value: object) -> object:
    """A 1-element array attribute as its element (a writer that stored ``np.array([0.5])``)."""
    return value.item() if isinstance(value, np.ndarray) and value.size == 1 else value


def _detect(p: Path, f: h5py.File, release: str | None) -> releases.Detected:
    """The file's release from its root attributes (``release``: the user's ``--from``)."""
    version = f.attrs.get("__version__")
    cstorch = f.attrs.get("__cstorch_version__")
    try:
        version_value = None if version is None else float(_one(version))
        cstorch_text = None if cstorch is None else attr_text(cstorch)
    except (TypeError, ValueError, UnicodeDecodeError):
        raise CorruptCheckpointError(p, "unreadable __version__/__cstorch_version__") from None
    if version is None and "__spec__" not in f.attrs:
        raise CorruptCheckpointError(
            p,
            "HDF5 file without __spec__ or __version__: not a Cerebras checkpoint",
            "is this a different kind of HDF5 file?",
        )
    try:
        detected = releases.detect(p, version_value, cstorch_text)
    except CorruptCheckpointError:  # (its fix names --from: the user's word for the release)
        if release is None:
            raise
        detected = releases.detect(p, version_value, None)
    if release is None:
        return detected
    forced = releases.get(release)
    if not releases.readable_as(forced, detected.format):
        raise CorruptCheckpointError(
            p,
            f"--from {forced.name} writes format {forced.format} but the file is format "
            f"{detected.format}",
            "name a release of the file's format (or, for a 0.5 file, one from 2.0 on)",
        )
    said = detected.release if detected.cstorch_version and detected.release != forced else None
    return releases.Detected(detected.format, detected.cstorch_version, forced, said)
