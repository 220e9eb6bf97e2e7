"""Verifying an upgrade's output before it is published.

``index`` (the default): the re-read tree must equal the planned one, and every reused tensor
must index the same stored chunks as the source, so its bytes are the source's bytes by
construction. A tensor written anew whose dataset is stored as its source's (its chunks copied
as stored bytes: ``h5.tensor``) is compared as stored, chunk for chunk and byte for byte
(``copied_pieces``); any other is decoded and hashed. ``full`` also compares every reused
tensor's stored bytes with the source's (``verify_full``); with a manifest every tensor's
source is hashed too, and the manifest lists the hashes.
"""

from __future__ import annotations

import contextlib
import os
from array import array
from collections.abc import Callable, Iterator
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ckpt_migrate.engine.copypatch import Written
from ckpt_migrate.engine.splitcopy import merge_spans
from ckpt_migrate.engine.storedspans import COMPARE_BLOCK, Spans, compare_stored
from ckpt_migrate.errors import VerificationError
from ckpt_migrate.format.checkpoint import Checkpoint
from ckpt_migrate.format.compare import (
    check_written,
    dataset_sha256,
    tensor_sha256,
)
from ckpt_migrate.format.h5 import linktable
from ckpt_migrate.format.h5.io import DAMAGED_HDF5, hdf5_reason, object_addresses, open_read
from ckpt_migrate.format.h5.stored import Pieces, copied_pieces, first_difference, pipeline
from ckpt_migrate.format.h5.storedfile import NotRead, StoredFile
from ckpt_migrate.format.h5.storedheader import StoredLayout
from ckpt_migrate.format.progress import Count, Progress
from ckpt_migrate.format.releases import Release
from ckpt_migrate.format.tree import (
    H5Data,
    LeafRef,
    Node,
    TensorLeaf,
    iter_leaves,
    tied_positions,
)

CHECK, CHECK_EVERY = "check", 256  # the progress of the index check: tensors


def _said_as_check(progress: Progress) -> Progress:
    return lambda phase, done, total: progress(phase.replace("read", "check", 1), done, total)


def verify_index(
    ckpt: Checkpoint,
    root: Node,
    release: Release,
    tmp: Path,
    written: Written,
    *,
    full: bool,
    progress: Progress | None = None,
) -> None:
    """Metadata-only checks: the tree reads back as planned and every reused tensor is the very
    stored object of the source (so its bytes are the source's bytes by construction).
    ``progress`` hears of the tensors checked (``check``)."""
    ckpt.handle.let_go()  # (opened again for the tensors' checks, below)
    # A tied tensor is checked at its first place; only tied ones are remembered (every
    # tensor's id, 150k of them, was 13 MB)
    tied = tied_positions(root)
    # (by address, bytes or hash, below)
    # (the root read back, seconds at 150k leaves, said as the check it is: ``check root``)
    said = None if progress is None else _said_as_check(progress)
    check_written(tmp, root, release, tensors_proven=True, ties=tied, progress=said)
    seen: set[int] = set()
    copied = _Copied(tmp)
    with contextlib.closing(copied), open_read(tmp) as out:
        # Every link's address, asked once a reused tensor needs it: a rewrite reuses none,
        # and a visit of 150k links held 39 MB for 3 s (issue 33)
        at = _OutputLinks(out, tmp)
        total = written.tensors
        count = Count(progress, CHECK, total, CHECK_EVERY)
        for position, ref in enumerate(iter_leaves(root)):
            leaf = ref.leaf
            if not written.holds(leaf):
                continue
            if id(leaf) in tied:
                if id(leaf) in seen:
                    continue
                seen.add(id(leaf))
            assert isinstance(leaf, TensorLeaf)
            count()
            name, reused = written.place(ref)
            if not reused:  # written by HDF5 just now: compared as stored, else hashed
                try:
                    dsid = h5py.h5d.open(out.id, name.encode())
                except KeyError:
                    raise VerificationError(
                        tmp, f"tensor {ref.name!r} has no dataset {name!r}"
                    ) from None
                if _compared(copied, ref.name, position, leaf, dsid):
                    if full:  # (``verify_full`` reads no tensor twice; 150k ids: 10 MB)
                        written.proven.add(id(leaf))
                else:
                    _check_hash(tmp, ref.name, leaf, partial(h5py.Dataset, dsid), written)
            elif not full:
                data = leaf.data
                assert isinstance(data, H5Data)
                source_at = data.handle.addresses().get(data.name)
                if source_at is None or at.get(name) != source_at:
                    raise VerificationError(
                        tmp, f"tensor {ref.name!r} does not hold its source data"
                    )
        copied.apart(lambda position: next(islice(iter_leaves(root), position, None)).name)
    count.end()


class _OutputLinks:
    """The address each link of the output names, read when first asked: the root's own links
    from the file's bytes (``linktable.of_root``: 8 ms for a root of 6,096 links, HDF5's walk
    of them 30 ms), every link by HDF5 for a name inside a group, or where that reader does
    not answer (``object_addresses``)."""

    def __init__(self, out: h5py.File, path: Path) -> None:
        self._out, self._path = out, path
        self._root: dict[str, int] | None = None
        self._every: dict[str, int] | None = None

    def get(self, name: str) -> int | None:
        if self._every is None and "/" not in name:
            if self._root is None:
                self._root = linktable.of_root(self._out, self._path) or {}
            if self._root:
                return self._root.get(name)
        if self._every is None:
            self._root, self._every = None, object_addresses(self._out)
        return self._every.get(name)


def _compared(
    copied: _Copied, name: str, position: int, leaf: TensorLeaf, written: h5py.h5d.DatasetID
) -> bool:
    """Whether the tensor written anew as ``written`` is stored as its source is
    (``copied_pieces``), and then found to hold its bytes (else ``VerificationError``); False
    if it is not stored so, or has no source dataset."""
    data = leaf.data
    if not isinstance(data, H5Data):
        return False
    source = data.handle.dataset_id(data.name)
    found = copied_pieces(written, source)
    if found is None:
        return False
    copied.compare(data.handle.path, name, position, found)
    return True


def verify_full(
    root: Node,
    tmp: Path,
    written: Written,
    progress: Progress | None = None,
    *,
    hash_all: bool = False,
) -> None:
    """Compare every tensor of the output with its source (or its new data); ``progress``
    hears of it as phase ``verify``, in bytes.

    A reused tensor (the source's dataset, linked into the output) is compared as stored: its
    type, shape and filters, and the chunks its index lists (coordinates, filter masks, offsets
    and sizes) must be the source's, and every stored byte at those offsets the source's byte,
    so it decodes to the source's tensor. Neither file is decoded or hashed for it: decoding the
    LZ4 chunks of both files and hashing them took 6 s of a 3 GB upgrade, comparing the stored
    bytes 1 s. The bytes are compared last, in file order, neighbouring tensors' spans read
    together; what is kept until then is each tensor's merged spans, not its chunk list
    (``storedspans.Spans``: the offsets and the tensor's position, not its name). Tensors
    written anew are decoded and hashed, and compared with their source's hash. With
    ``hash_all`` (a manifest lists every tensor's sha256) the source of every other tensor is
    hashed too: stored as its source is, the output's copy decodes to the same bytes (not
    decoding it, nor mapping the output's overlaps as its reader would: a manifest of 150k
    tensors in 75 s, from 118 s, issue 33)."""
    tied = tied_positions(root)  # (a tie is read at its first place only)
    spans: dict[Path, Spans] = {}  # source -> the spans its tensors' chunks take
    hashed = array("Q")  # the positions of the tensors hashed, in order (not their refs:
    # 60 MB at 150k tensors), and the output names of those whose output is hashed too
    anew: dict[int, str] = {}
    ties, total = [], 0
    with open_read(tmp) as out, _Headers(out, tmp) as headers:
        for position, ref in enumerate(iter_leaves(root)):
            leaf = ref.leaf
            if not written.holds(leaf):
                continue
            assert isinstance(leaf, TensorLeaf)
            tie = tied.get(id(leaf))
            if tie is not None and tie.name != ref.name:
                ties.append((ref.name, tie.name))
                continue
            name, reused = written.place(ref)
            proven = id(leaf) in written.proven
            # stored as its source is, it decodes as its source does: a manifest lists the
            # source's hash, and the output's copy is neither decoded nor mapped
            if hash_all or not (reused or proven):
                hashed.append(position)
                total += leaf.nbytes
                if not (reused or proven):
                    anew[position] = name
            if reused and not proven:
                data = leaf.data
                assert isinstance(data, H5Data)
                pieces = headers.stored_alike(tmp, ref.name, name, data)
                if pieces is None:  # (through HDF5, the source's walk first: it refuses a
                    # damaged source as such, before the output's copy of its damage is met)
                    source = data.handle.dataset(data.name)
                    pieces = _stored_alike(tmp, ref.name, _output_dataset(out, tmp, name), source)
                spans.setdefault(data.handle.path, Spans()).add(merge_spans(pieces), position)
        total += sum(each.total() for each in spans.values())
        done = 0
        for ref, name in _at(root, hashed, anew):
            leaf = ref.leaf
            assert isinstance(leaf, TensorLeaf)
            output = None if name is None else partial(_output_dataset, out, tmp, name)
            _check_hash(tmp, ref.name, leaf, output, written)
            done += leaf.nbytes
            if progress is not None:
                progress("verify", done, total)
    for name, first_name in ties:  # a manifest lists every name of a hashed tensor
        if first_name in written.hashes:
            written.hashes[name] = written.hashes[first_name]

    def name_of(position: int) -> str:
        return next(islice(iter_leaves(root), position, None)).name

    for source, each in spans.items():
        done = compare_stored(tmp, source, each, name_of, done, total, progress)


def _at(
    root: Node, positions: array, names: dict[int, str]
) -> Iterator[tuple[LeafRef, str | None]]:
    """The leaves of ``root`` at ``positions`` (ascending), each with its name in ``names``."""
    if not positions:
        return
    wanted = iter(positions)
    at = next(wanted)
    for position, ref in enumerate(iter_leaves(root)):
        if position == at:
            yield ref, names.get(position)
            at = next(wanted, -1)
            if at < 0:
                return


class _Headers:
    """The output's and the sources' datasets read from their headers (``StoredFile``): a
    reused tensor's storage compared without HDF5 opening either dataset, nor the source's
    preflight walk run for it (a root edit's source is read as an outline, issue 33)."""

    def __init__(self, out: h5py.File, tmp: Path) -> None:
        self.out = StoredFile.of(out, tmp)
        self.sources: dict[int, StoredFile | None] = {}

    def __enter__(self) -> _Headers:
        return self

    def __exit__(self, *exc: object) -> None:
        for side in (self.out, *self.sources.values()):
            if side is not None:
                side.close()

    def stored_alike(
        self, tmp: Path, name: str, placed: str, data: H5Data
    ) -> list[tuple[int, int]] | None:
        """``_stored_alike`` of the output's dataset ``placed`` and the source's of ``data``,
        from their headers; None where either is not read so."""
        handle = data.handle
        if id(handle) not in self.sources:
            self.sources[id(handle)] = StoredFile.of_handle(handle)
        source = self.sources[id(handle)]
        if self.out is None or source is None:
            return None
        try:
            out, src = self.out.named(placed), source.named(data.name)
        except NotRead:
            return None
        if out.dtype is None or src.dtype is None or out.compact or src.compact:
            return None
        index = _listed(out)
        _refuse_unlike(
            tmp,
            name,
            out.dtype == src.dtype and out.shape == src.shape,
            out.chunks == src.chunks and out.pipeline == src.pipeline,
            index == _listed(src),
        )
        return [(offset, offset + size) for *_, offset, size in index]


def _output_dataset(out: h5py.File, tmp: Path, name: str) -> h5py.Dataset:
    """The output's dataset ``name`` (its source's was opened): one HDF5 cannot open is this
    run's failure, said as such (a raw ``KeyError`` before: found by ``fuzz_damage --wide``)."""
    try:
        obj = out[name]
    except DAMAGED_HDF5 as exc:
        why = hdf5_reason(exc)
        raise VerificationError(tmp, f"dataset {name!r} cannot be opened ({why})") from None
    if not isinstance(obj, h5py.Dataset):
        raise VerificationError(tmp, f"{name!r} is not a dataset")
    return obj


def _listed(stored: StoredLayout) -> list[tuple[Any, ...]]:
    """A dataset's chunk index as ``_stored`` lists it (chunk offset, filter mask, address,
    size, in the index's order), or a contiguous dataset's one piece (address, size)."""
    if stored.entries is None:
        return [] if stored.at is None else [(stored.at, stored.size)]
    return stored.chunk_list()


def _stored(ds: h5py.Dataset) -> tuple[list[tuple[Any, ...]], list[tuple[int, int]]]:
    """A dataset's chunk index as comparable data, and the ``[start, end)`` of its stored
    pieces."""
    dsid = ds.id
    if ds.chunks is None:
        offset, size = dsid.get_offset(), dsid.get_storage_size()
        return ([], []) if offset is None else ([(offset, size)], [(offset, offset + size)])
    index: list[tuple[Any, ...]] = []
    dsid.chunk_iter(lambda c: index.append((c.chunk_offset, c.filter_mask, c.byte_offset, c.size)))
    return index, [(offset, offset + size) for _, _, offset, size in index]


def _stored_alike(
    tmp: Path, name: str, out: h5py.Dataset, src: h5py.Dataset
) -> list[tuple[int, int]]:
    """Where ``out`` stores its bytes, once its type, shape, filters and chunk index are
    found to be ``src``'s (a copy-patch keeps every reused chunk at its offset)."""
    index, pieces = _stored(out)
    _refuse_unlike(
        tmp,
        name,
        out.id.get_type() == src.id.get_type() and out.shape == src.shape,
        out.chunks == src.chunks
        and pipeline(out.id.get_create_plist()) == pipeline(src.id.get_create_plist()),
        index == _stored(src)[0],
    )
    return pieces


def _refuse_unlike(tmp: Path, name: str, kind: bool, layout: bool, index: bool) -> None:
    """``VerificationError`` for the first of a reused tensor's type and shape, storage layout
    and chunk index that is not its source's."""
    for alike, what in (
        (kind, "its type or shape differs from its source"),
        (layout, "its storage layout differs from its source"),
        (index, "its chunk index differs from its source's"),
    ):
        if not alike:
            raise VerificationError(tmp, f"tensor {name!r}: {what}")


class _Copied:
    """Tensors written anew, compared as stored with their sources as they come: every byte of
    each piece of ``tmp`` must be the source's at the piece's offset there (read in source
    order, in blocks of at most ``COMPARE_BLOCK``). Their spans in ``tmp`` are kept, 20 bytes
    a piece, to be found apart at the end (``apart``): HDF5 never stores two chunks in one
    place, and a chunk index entry moved onto another chunk reads that one's bytes. Each
    piece's owner is kept by its tensor's position in the tree, not its name (150k names:
    12 MB, issue 33)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.fd = os.open(tmp, os.O_RDONLY)
        self.sources: dict[Path, int] = {}
        self.starts, self.ends, self.owners = array("Q"), array("Q"), array("I")

    def compare(self, source: Path, name: str, position: int, pieces: Pieces) -> None:
        fd = self.sources.get(source)
        if fd is None:
            fd = self.sources[source] = os.open(source, os.O_RDONLY)
        pieces = sorted(pieces, key=lambda p: p[1])  # (read in source order)
        found = first_difference(self.fd, fd, pieces, COMPARE_BLOCK)
        if found is not None:
            at, short = found
            if short:
                raise VerificationError(self.tmp, f"tensor {name!r}: its stored data is cut short")
            what = f"differs from its source (stored byte at {at:,})"
            raise VerificationError(self.tmp, f"tensor {name!r} {what}")
        for at, _, size in pieces:
            self.starts.append(at)
            self.ends.append(at + size)
            self.owners.append(position)

    def apart(self, name_of: Callable[[int], str]) -> None:
        """``VerificationError`` if two tensors' pieces overlap; ``name_of``: the name of the
        tensor at a position."""
        starts = np.frombuffer(self.starts, np.uint64)
        if starts.size < 2:
            return
        order = np.argsort(starts, kind="stable")
        ends = np.frombuffer(self.ends, np.uint64)[order]
        clash = np.flatnonzero(ends[:-1] > starts[order][1:])
        if clash.size:
            i, j = (int(order[k]) for k in (clash[0], clash[0] + 1))
            name, other = name_of(self.owners[i]), name_of(self.owners[j])
            raise VerificationError(
                self.tmp, f"tensors {name!r} and {other!r} store data at the same bytes"
            )

    def close(self) -> None:
        for fd in (self.fd, *self.sources.values()):
            os.close(fd)


def _check_hash(
    tmp: Path,
    name: str,
    leaf: TensorLeaf,
    output: Callable[[], h5py.Dataset] | None,
    written: Written,
) -> None:
    """The output's dataset (``output`` opens it) must hash as its source ``leaf`` does; the
    source is read first, so that its damage is refused as its own. Without ``output`` (a
    dataset whose stored bytes are compared with the source's instead) the source's hash is
    the one kept."""
    if name in written.hashes:
        return
    want = tensor_sha256(leaf)
    if output is not None and dataset_sha256(output(), leaf.dtype) != want:
        raise VerificationError(tmp, f"tensor {name!r} differs from its source")
    written.hashes[name] = want
