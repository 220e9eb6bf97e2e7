"""Writing an upgrade's output: ``copy-patch`` (the source's bytes, its metadata rewritten) or
``rewrite`` (a fresh file), and the source digest for the provenance record.

``copy-patch``: the source file is cloned beside the target (``extents``) or copied byte for
byte (``splitcopy``: a worker process moves the tensor data, hashing the source as it goes,
while this process edits the metadata around it): tensor datasets the result still uses are
linked into a fresh root group, never decoded; everything else (attributes, scalars, the
spec) is written by the target release's writer. ``rewrite``, when the hops drop most of the
data: a new file, LZ4 chunks copied as stored bytes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import xxhash

from ckpt_migrate.atomic import create_temp, reserve
from ckpt_migrate.engine import extents as ext
from ckpt_migrate.engine.plan import Plan
from ckpt_migrate.engine.splitcopy import LEAD_BLOCK, SplitCopy, data_ranges
from ckpt_migrate.engine.writeback import start_writeback
from ckpt_migrate.errors import UsageError, VerificationError
from ckpt_migrate.format.checkpoint import Checkpoint
from ckpt_migrate.format.h5 import attrs as h5attrs
from ckpt_migrate.format.h5 import linktable
from ckpt_migrate.format.h5 import root as h5root
from ckpt_migrate.format.h5.io import H5Handle, prefetch
from ckpt_migrate.format.h5.metadata_cache import (
    bounded_metadata_cache,
    root_name_heap,
)
from ckpt_migrate.format.h5.tensor import place_tensor
from ckpt_migrate.format.h5.writing import writing
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.provenance import PROVENANCE_ATTR
from ckpt_migrate.format.releases import Release
from ckpt_migrate.format.tree import H5Data, Leaf, LeafRef, Node, TensorLeaf, iter_leaves
from ckpt_migrate.format.write import dataset_name, root_attributes, write_tree

COPY_BLOCK = 64 << 20


@dataclass
class Output:
    """The temporary file beside ``target``, and the copy of the source into it (its worker also
    computes the source's digest) or, for a rewrite, the digest alone.

    Either starts once the source's tree has been read (on a cold page cache a large sequential
    read queues ahead of its thousands of small reads: at 3 GB the tree took 4.0 s instead of
    0.95 s). The copy starts while the chunk indexes are still walked, in small blocks until
    its data ranges are known (``splitcopy.LEAD_BLOCK``): a cold 3 GB upgrade on ext4 took
    4.4 s instead of 6.3 s (medians of 4), against 5.2 s for ``cp`` + ``sync``."""

    src: Path
    target: Path
    tmp: Path
    lock: int  # the descriptor holding the temporary file's lock (atomic.create_temp)
    copier: SplitCopy | None = None
    digest: _Digest | None = None

    @classmethod
    def beside(cls, src: Path, target: Path) -> Output:
        return cls(src, target, *create_temp(target, like=src))

    def share(
        self, plan: Plan, choice: ext.Choice, ranges: list[tuple[int, int]] | None = None
    ) -> Written | None:
        """Make the temporary a copy of the source without this process moving its bytes
        (``extents.share``) and make room for what the metadata edit will write; None when
        the filesystem cannot (the caller copies). ``ranges``: the data ranges, which only
        ``sparse`` needs (to write everything else)."""
        fs = ext.filesystem(self.tmp.parent)
        if ranges is None:
            extents = ext.Extents.whole(plan.file_bytes)
        else:
            extents = ext.Extents.copy_patch(ranges, plan.file_bytes, fs.block)
        fd_in = os.open(self.src, os.O_RDONLY)
        try:
            fd_out = os.open(self.tmp, os.O_RDWR | os.O_NOFOLLOW)
            try:
                if os.fstat(fd_out).st_size:  # the empty locked temporary, nothing else
                    raise FileExistsError(errno.EEXIST, "not empty", str(self.tmp))
                method = ext.share(fd_in, fd_out, extents, choice, fs)
                if method is None:
                    if choice == "clone":
                        raise UsageError(
                            self.target,
                            f"cannot share extents with {self.src} here ({fs.name}, or not the "
                            "source's filesystem)",
                            "use --copy-method copy, or auto to choose by itself",
                        )
                    return None
                if method == "clone":
                    ext.reserve_edit(
                        fd_out, plan.file_bytes, plan.output_bytes, plan.metadata_bytes
                    )
                elif method == "sparse":  # own ranges written, shared ones holes
                    reserve(fd_out, extents.size, plan.output_bytes, allocate_existing=False)
                    own = sum(p.length for p in extents.own)
                    return Written(
                        "copy-patch",
                        plan.target_release,
                        copy_method=method,
                        bytes_shared=extents.size - own,
                        bytes_own=own,
                    )
                else:  # copied by the kernel or the server: what it shared is not known
                    reserve(fd_out, plan.file_bytes, plan.output_bytes)
            finally:
                os.close(fd_out)
        finally:
            os.close(fd_in)
        return Written(
            "copy-patch", plan.target_release, copy_method=method, bytes_own=plan.file_bytes
        )

    def start_copy(self, *, direct: bool, reserve: int, choice: ext.Choice) -> SplitCopy:
        """The copy worker, allowed ``copy_file_range`` where that call can only copy, never
        share: ``auto`` has just been refused a clone (the same remapping the call would try
        first), and ext4 and tmpfs cannot share at all. A forced ``copy`` elsewhere (XFS, or
        an overlay over it) writes every byte itself."""
        kernel = choice == "auto" or ext.filesystem(self.tmp.parent).name in ("ext4", "tmpfs")
        self.copier = SplitCopy(
            self.src, self.tmp, direct=direct, reserve=reserve, lead=LEAD_BLOCK, kernel=kernel
        )
        return self.copier

    def start_digest(self) -> _Digest:
        self.digest = _Digest(self.src)
        return self.digest

    def abort(self) -> None:
        """Stop both, remove the temporary file and drop its lock (idempotent; after a publish
        the file is gone)."""
        if self.copier is not None:
            self.copier.abort()
        if self.digest is not None:
            self.digest.cancelled.set()
        with contextlib.suppress(OSError):
            self.tmp.unlink()
        if self.lock >= 0:
            os.close(self.lock)
            self.lock = -1


@dataclass
class Written:
    strategy: str
    release: Release  # the output's, whose writer names its datasets
    # id(leaf) of the tensors written anew, and of the source's datasets linked into the
    # output (``linked``), each at its first place; its dataset's name is the writer's
    # (``format.write.dataset_name``): a name kept for each was 12 MB at 150k tensors, a
    # (name, reused) pair 8 MB more (issue 33)
    placed: set[int] = field(default_factory=set)
    tensors: int = 0
    source_xxh3_128: str | None = None
    hashes: dict[str, str] = field(default_factory=dict)  # leaf name -> sha256 (full verify)
    # id(leaf) of the tensors written anew whose stored bytes the verification found equal to
    # their source's (``h5.stored``): proven without a hash
    proven: set[int] = field(default_factory=set)
    copy_method: str | None = None  # extents.Method: how the source's bytes got there
    bytes_shared: int = 0  # of the source's bytes, shared with it rather than written
    bytes_own: int = 0  # of the source's bytes, written (copied, unshared) for the output
    linked: set[int] = field(default_factory=set)
    # A rewrite: every tensor written anew (``placed`` stays empty: 150k ids were 8.6 MiB of
    # a rewrite's peak, issue 33; the read-back of the tree finds a tensor not written)
    every_tensor: bool = False

    def holds(self, leaf: Leaf) -> bool:
        """Whether the tensor ``leaf`` has a dataset of its own in the output."""
        if self.every_tensor:
            return isinstance(leaf, TensorLeaf)
        return id(leaf) in self.placed or id(leaf) in self.linked

    def place(self, ref: LeafRef) -> tuple[str, bool]:
        """The dataset, in the output, of the tensor at ``ref`` (one it ``holds``, at its first
        place), and whether it is the source's."""
        return dataset_name(self.release, ref.name), id(ref.leaf) in self.linked


def write(
    ckpt: Checkpoint,
    root: Node,
    plan: Plan,
    out: Output,
    record: dict[str, Any],
    progress: Progress | None,
    check_metadata: Callable[[Written], None],
    *,
    read_back: bool = False,
    copy_method: ext.Choice = "auto",
) -> Written:
    """Write ``root`` to ``out.tmp`` and run ``check_metadata`` on it once its metadata is in
    place (on the copy path while the worker still copies the data ranges, which no check reads:
    see ``splitcopy.data_ranges``). ``read_back``: the caller reads every tensor of the output
    next, so the copy keeps it in the page cache. The space the output may need
    (``plan.output_bytes``) is allocated before HDF5 writes anything, so that a full disk is an
    ordinary error. ``copy_method``: how the source's bytes get into the copy-patch output
    (``extents``); a rewrite always writes."""
    handle, tmp, release = ckpt.handle, out.tmp, plan.target_release
    reused, reused_bytes = _reusable(root, handle)
    entries = pending_provenance(ckpt, record)
    extra = {PROVENANCE_ATTR: json.dumps(entries)}
    placed: set[int] = set()
    linked: set[int] = set()
    if reused_bytes >= 0.5 * plan.file_bytes:
        # A staging file (sparse) is written but for the data; a clone needs no ranges.
        ranges = _data_ranges(handle, reused) if copy_method == "sparse" else None
        shared = out.share(plan, copy_method, ranges)
        if shared is not None:
            written = shared
            written.placed, written.linked = placed, linked
            if progress is not None:
                progress("copy", plan.file_bytes, plan.file_bytes)
            # (the edit's pages go to disk while it is verified: ``_patch``'s ``write_back``)
            _patch(tmp, root, release, reused, written, extra, progress, handle, write_back=True)
            written.tensors = len(placed) + len(linked)
            check_metadata(written)
            digest = None  # the source's bytes were never read (see extents)
        else:
            copier = out.start_copy(
                direct=not read_back, reserve=plan.output_bytes, choice=copy_method
            )
            copier.restrict(_data_ranges(handle, reused))
            written = Written("copy-patch", release, placed, copy_method="copy", linked=linked)
            written.bytes_own = plan.file_bytes
            _patch(tmp, root, release, reused, written, extra, progress, handle)
            written.tensors = len(placed) + len(linked)
            check_metadata(written)
            digest = copier.finish(progress)
    else:  # most of the data changes: write a new file instead
        # It reads every chunk index and all the data: the walk's verdict first, before HDF5
        # writes anything (nothing to gain from overlapping them here).
        handle.walked()
        reused.clear()  # (150k tensors' ids: 12 MB, kept through the read-back for nothing)
        count = 0

        def place(f: h5py.Group, name: str, leaf: TensorLeaf) -> h5py.h5d.DatasetID:
            nonlocal count
            count += 1
            return place_tensor(f, name, leaf)

        hashing = out.start_digest()
        attributes = root_attributes(root, release, extra)
        made = h5root.create_file(tmp, exclusive=False, attributes=attributes)
        with writing(tmp, made, reserve=plan.output_bytes) as f:  # the temporary
            progress_ = _leaf_progress(root, progress, "write")
            write_tree(f, root, release, extra, progress_, place)
        written = Written(
            "rewrite", release, tensors=count, copy_method="rewrite", every_tensor=True
        )
        check_metadata(written)
        digest = hashing.result()
    finish(tmp, plan, written, entries, digest)
    return written


def _reusable(root: Node, handle: H5Handle) -> tuple[dict[int, str], int]:
    """Which tensors of ``root`` are a dataset of the source (id(leaf) -> its name, each
    dataset used once), and their bytes."""
    reused: dict[int, str] = {}
    taken: set[str] = set()
    reused_bytes = 0
    for ref in iter_leaves(root):
        leaf = ref.leaf
        if (
            isinstance(leaf, TensorLeaf)
            and isinstance(leaf.data, H5Data)
            and leaf.data.handle is handle
            and id(leaf) not in reused
            and leaf.data.name not in taken
        ):
            reused[id(leaf)] = leaf.data.name
            taken.add(leaf.data.name)
            reused_bytes += leaf.nbytes
    return reused, reused_bytes


def pending_provenance(ckpt: Checkpoint, record: dict[str, Any]) -> list[dict[str, Any]]:
    """The provenance entries of the output: the source's and ``record``, whose digest is not
    known before the whole source has been read: a placeholder of the same length is written,
    then replaced in place (``finish``)."""
    record["source_xxh3_128"] = PENDING_DIGEST
    return [*ckpt.provenance, record]


def finish(
    tmp: Path, plan: Plan, written: Written, entries: list[dict[str, Any]], digest: str | None
) -> None:
    """Once the output is written: what a clone left shared, and the provenance record's
    source digest (``None`` when the source's bytes were never read) in place."""
    if written.copy_method == "clone":  # what the edit left shared, as FIEMAP says
        written.bytes_shared = min(plan.file_bytes, ext.shared_bytes(tmp))
        written.bytes_own = plan.file_bytes - written.bytes_shared
    record = entries[-1]
    record["source_xxh3_128"] = written.source_xxh3_128 = digest
    if digest is None:  # not read: the source is known by its size and time instead
        st = plan.source.stat()
        record["source_identity"] = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    _set_root_attr(tmp, PROVENANCE_ATTR, json.dumps(entries))


def _data_ranges(handle: H5Handle, reused: dict[int, str]) -> list[tuple[int, int]]:
    """The byte ranges of the reused datasets' stored data worth leaving to the copy (or the
    store), from their chunk indexes (``handle.dataset`` waits for the walk's verdict first)."""
    return data_ranges(handle.dataset(name) for name in reused.values())


PENDING_DIGEST = "0" * 32  # same length as the digest, which replaces it once computed


class _Digest(threading.Thread):
    """``file_digest`` of the source on its own thread, concurrently with the copy."""

    def __init__(self, path: Path) -> None:
        super().__init__(name="ckpt-migrate source digest", daemon=True)
        self.path = path
        self.value: str | None = None
        self.error: BaseException | None = None
        self.cancelled = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            self.value = file_digest(self.path, self.cancelled)
        except BaseException as exc:
            self.error = exc

    def result(self) -> str:
        self.join()
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value


def _set_root_attr(path: Path, name: str, text: str) -> None:
    """Replace a root attribute's value in place (same position among the attributes)."""
    with writing(path, h5py.File(path, "r+", locking=False)) as f:
        f.attrs.modify(name, text)
        if f.attrs[name] != text:
            raise VerificationError(path, f"root attribute {name} did not read back")


def _leaf_progress(
    root: Node, progress: Progress | None, phase: str
) -> Callable[[str, Leaf], None] | None:
    """Count the leaves written (``phase``: ``patch`` or ``write``, counted in tensors)."""
    if progress is None:
        return None
    total = sum(1 for _ in iter_leaves(root))
    done = [0]

    def tick(name: str, leaf: Leaf) -> None:
        done[0] += 1
        progress(phase, done[0], total)

    return tick


def _patch(
    tmp: Path,
    root: Node,
    release: Release,
    reused: dict[int, str],
    written: Written,
    extra: dict[str, str],
    progress: Progress | None,
    source: H5Handle,
    *,
    write_back: bool = False,
) -> None:
    """Build the new tree in a fresh group of the copied file, linking each reused dataset into
    it under its final name, then make that group the root (see ``h5root``): a new namespace
    needs no staging of renames, and its attributes are indexed rather than a list.
    ``write_back``: start writing the edit's pages to disk once it is made, without waiting
    for them (``writeback.start_writeback``)."""
    if reused:  # the headers the edit will touch, read ahead together (a clone's are cold)
        addresses = source.addresses()
        prefetch(tmp, [addresses[name] for name in reused.values() if name in addresses])
        # (and the old root's nodes, where each name is found: the source's, in the copy)
        linktable.prefetch_root(source.file(), tmp)
    attributes = root_attributes(root, release, extra)
    if not h5root.tracks_order(attributes):
        h5root.create_wide_root(tmp)
    # (1 MiB until the two roots' heaps of names outgrow it: ``GroupNameRoom``; the old root's
    # heap measured in the source, whose bytes it is)
    old_names = root_name_heap(source.file(), local_only=True)
    # HDF5 truncates the file as it closes it, down to the end of what it uses, and XFS writes
    # a file truncated down back at its next release (against the "NULL files" of a crash): at
    # the deep 12 GB shape, the close of HDF5's descriptor did in 0.1 s what ``write_back``
    # does on a thread while the output is checked. A second descriptor of that open file
    # (``kept``) makes HDF5's close no release; the writeback's thread releases it.
    kept: int | None = None
    try:
        with writing(tmp, bounded_metadata_cache(h5py.File(tmp, "r+", locking=False), 0)) as f:
            superblock_at, old_root = h5root.superblock_offset(f), h5root.object_address(f)
            new_root = h5root.create_fresh_root(f, attributes)
            at = reused  # (emptied as they are placed: a copy was 12 MB at 150k tensors)
            room = h5root.names_room(f, attributes, old_names)

            def place(g: h5py.Group, name: str, leaf: TensorLeaf) -> h5py.h5d.DatasetID:
                current = at.pop(id(leaf), None)
                if current is None:
                    written.placed.add(id(leaf))
                    return place_tensor(g, name, leaf)
                parent = name.rpartition("/")[0]
                if parent:
                    g.require_group(parent)
                # A second hard link, not a move: unlinking from the old root (unreachable once
                # the new one is in the superblock) would rewrite its heap and B-tree for nothing.
                g.id.links.create_hard(name.encode(), f.id, current.encode())
                dsid = h5py.h5d.open(g.id, name.encode())
                h5attrs.delete_all(dsid)
                written.linked.add(id(leaf))
                return dsid

            progress_ = _leaf_progress(root, progress, "patch")
            write_tree(new_root, root, release, extra, progress_, place, room)
            if at:
                raise VerificationError(tmp, f"{len(at)} reused dataset(s) were not placed")
            new_addr = h5root.object_address(new_root)
            if write_back:
                kept = os.dup(f.id.get_vfd_handle())
        try:
            h5root.switch_root(tmp, superblock_at, old_root, new_addr, fd=kept)
        except ValueError as exc:
            raise VerificationError(tmp, f"cannot set the new root group: {exc}") from None
    except BaseException:
        if kept is not None:
            os.close(kept)
        raise
    if kept is not None:
        start_writeback(kept)


def file_digest(path: Path, cancelled: threading.Event | None = None) -> str:
    """xxh3-128 of a whole file: it identifies the source in provenance records at memory
    speed (sha256 would run at about half the speed of a page-cache copy and dominate)."""
    h = xxhash.xxh3_128()
    buffer = bytearray(COPY_BLOCK // 8)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buffer):
            if cancelled is not None and cancelled.is_set():
                return ""
            h.update(view[:n])
    return h.hexdigest()


def verified_copy(src: Path, tmp: Path) -> None:
    """A copy of ``src`` at ``tmp`` (a file already at its target, placed across filesystems),
    read back: its xxh3-128 must be the one taken while copying."""
    copier = SplitCopy(src, tmp)
    digest = copier.finish()
    if file_digest(tmp) != digest:
        raise VerificationError(tmp, f"the copy of {src} differs from it")
