"""``verify`` of two checkpoints with no dataset opened by HDF5 where their headers answer
(issue 33).

``verify`` compares tensors stored alike by their stored bytes (``compare.compare_trees``).
Through HDF5 each pair cost two opens, two walks of the chunk index and the property lists,
and the trees were read only after the preflight walk of every dataset of both files (85 s
for two files of 150k small tensors, against 5 s for the upgrade that made one from the
other). Here both trees are read as ``plan`` reads them (``read.read_outline``: the root, the
links, a legacy file's datasets described from their headers) while both walks run in the
children, each tensor's storage is read from its object header and chunk index
(``h5.storedheader``), and the bytes are compared where they lie. The first file's chunks are
checked as a read of them would check them (``h5.chunks``: the index against the grid, each
LZ4 frame, and no chunk starting inside other data or metadata, ``h5.overlaps``, its map made
from the same headers), and each tensor's dataset against its metadata, as the full read
checks it.

A pair the headers do not vouch for (stored otherwise or with other bytes, a layout or
filter they do not read, a check that fails) is compared as before, through HDF5, once both
walks have ended (``ThroughHDF5``). The verdict waits for both walks too. Nothing is refused
here: a file whose datasets HDF5 cannot read (a damaged fill value or attribute message,
which the headers read here do not look at), a damaged chunk, any problem met, gets no answer
(``compare`` returns None), and the comparison through HDF5 refuses it as it always did, in
its own words.
"""

from __future__ import annotations

import math
from array import array
from pathlib import Path

import h5py
import numpy as np

from ckpt_migrate.errors import CkptError
from ckpt_migrate.format.checkpoint import Checkpoint
from ckpt_migrate.format.compare import Comparison, ThroughHDF5, compare_trees
from ckpt_migrate.format.h5 import overlaps, preflight
from ckpt_migrate.format.h5.chunks import LZ4, Layout, frames_problem, index_problem
from ckpt_migrate.format.h5.headerfacts import HeaderReader
from ckpt_migrate.format.h5.identity import file_identity, watch
from ckpt_migrate.format.h5.stored import Pieces, chunk_pieces, first_difference, whole_piece
from ckpt_migrate.format.h5.storedfile import NotRead, StoredFile
from ckpt_migrate.format.h5.storedheader import StoredLayout
from ckpt_migrate.format.progress import Count, Progress
from ckpt_migrate.format.read import read_outline
from ckpt_migrate.format.tree import H5Data, TensorLeaf
from ckpt_migrate.format.v05.read import check_storage, stored_as_declared

BLOCK = 4 << 20  # bytes compared at once
READ_HEADERS = "read headers"  # the progress of the first file's datasets' headers read


class NotAnswered(Exception):
    """The headers do not vouch for a pair: it is compared through HDF5."""


class Abandoned(Exception):
    """A file's walk met a problem: the comparison through HDF5 names it."""


def compare(a: Path, b: Path, progress: Progress | None = None) -> Comparison | None:
    """``compare_trees`` of the checkpoints at ``a`` and ``b``, each pair from the headers
    where they answer (module doc); None where the trees are not read so (a leaf only a full
    read gives), and wherever a file is refused: the comparison through HDF5 refuses it then,
    in its own words."""
    try:
        # (each file as it was when first looked at: a verdict on a file written meanwhile is
        # on neither version)
        unchanged = watch(a, b, voids="the comparison does not hold")
    except OSError:
        return None
    begun = [preflight.start(b), preflight.start(a)]
    try:
        left = read_outline(a, legacy=True, progress=progress)
        if left is None:
            return None
        with left:
            right = read_outline(b, legacy=True, progress=progress)
            if right is None:
                return None
            with right, _Pairs(left, right, progress) as pairs:
                found = compare_trees(left.root, right.root, progress=progress, stored=pairs)
                pairs.walked()
    except (Abandoned, CkptError, OSError):  # (a file gone meanwhile: named there too)
        return None
    finally:
        for key in begun:
            preflight.cancel_started(key)
    unchanged()
    return found


def _tensor(side: StoredFile, leaf: TensorLeaf, name: str) -> StoredLayout:
    """The storage of the dataset of ``leaf``, where it holds what the leaf's metadata
    declares (``v05.read.stored_as_declared``), else ``NotAnswered``."""
    try:
        found = side.named(name)
    except NotRead:
        raise NotAnswered from None
    if found.dtype is None or found.compact:
        raise NotAnswered
    try:
        if not stored_as_declared(found.dtype, found.shape, leaf.dtype, tuple(leaf.shape)):
            raise NotAnswered
    except ValueError:  # (a dtype name the tool does not know: the full read names it)
        raise NotAnswered from None
    return found


class _Pairs:
    """``compare.StoredAlike`` of two outline reads: each pair from the headers where they
    vouch for it, else through HDF5 (``ThroughHDF5``) once both walks have ended."""

    def __init__(self, first: Checkpoint, second: Checkpoint, progress: Progress | None) -> None:
        self.checkpoints = (first, second)
        self.through = ThroughHDF5()
        self.from_headers = 0
        self.first: StoredFile | None = None
        self.second: StoredFile | None = None
        self.shared: np.ndarray | None = None
        try:
            self.first = StoredFile.of_handle(first.handle)
            self.second = StoredFile.of_handle(second.handle)
            if self.first is not None:
                self.shared = self._overlapping(self.first, progress)
        except BaseException:
            self.close()
            raise

    @property
    def matched(self) -> int:
        return self.from_headers + self.through.matched

    def __enter__(self) -> _Pairs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for side in (self.first, self.second):
            if side is not None:
                side.close()
        self.first = self.second = None
        self.through.close()

    def equal(self, x: TensorLeaf, y: TensorLeaf) -> bool:
        try:
            return self._from_headers(x, y)
        except NotAnswered:
            pass
        self.walked()
        for ckpt, leaf in zip(self.checkpoints, (x, y), strict=True):
            _check_declared(ckpt, leaf)
        return self.through.equal(x, y)

    def walked(self) -> None:
        """Wait for both files' walks (each file's own, begun by ``compare``); ``Abandoned``
        where one met a problem."""
        for ckpt in self.checkpoints:
            try:
                ckpt.handle.walked()
            except CkptError:
                raise Abandoned from None

    def _from_headers(self, x: TensorLeaf, y: TensorLeaf) -> bool:
        """True where both are stored alike with the same bytes (``NotAnswered`` anywhere
        else), the first's chunks checked."""
        a, b = x.data, y.data
        first, second = self.first, self.second
        if first is None or second is None or self.shared is None:
            raise NotAnswered
        if not isinstance(a, H5Data) or not isinstance(b, H5Data):
            raise NotAnswered
        if a.handle is not self.checkpoints[0].handle or b.handle is not self.checkpoints[1].handle:
            raise NotAnswered
        one, two = _tensor(first, x, a.name), _tensor(second, y, b.name)
        self._check(one)
        if 0 in x.shape:  # (no bytes: equal by dtype and shape, and counted as the
            return True  # comparison through HDF5 counts it, with the tensors it hashed)
        pieces = _pieces(two, one)
        if pieces is None:
            raise NotAnswered
        try:
            if first_difference(second.fd, first.fd, pieces, BLOCK) is not None:
                raise NotAnswered  # (other bytes may decode alike: hashed through HDF5)
        except (OSError, OverflowError):  # (an address past what a file can hold: damage)
            raise NotAnswered from None
        self.from_headers += 1
        return True

    def _check(self, stored: StoredLayout) -> None:
        """``NotAnswered`` unless the first file's tensor reads whole without a problem
        ``h5.chunks`` would refuse (through HDF5, it is then refused in its words)."""
        assert self.first is not None and self.shared is not None
        if stored.chunks is None:
            if stored.at is not None and np.isin(np.uint64(stored.at), self.shared):
                raise NotAnswered  # (data inside other data or the metadata)
            return
        shape, index = stored.shape, stored.entries
        assert shape is not None and index is not None and stored.dtype is not None
        size = math.prod(stored.chunks) * stored.dtype.itemsize
        layout = Layout(shape, stored.chunks, size, stored.filters)
        if layout.problem() is not None or any(x >= shape[0] for x in index.flat[:: index.ndim]):
            raise NotAnswered  # (entries past the extent: HDF5 lists none, nor did a writer)
        problem = index_problem(layout, (0, shape[0]), index, self.shared)
        if problem is None and len(index):
            if layout.filters != (LZ4,):
                raise NotAnswered  # (checked by decoding through HDF5)
            problem = frames_problem(self.first.fd, layout, index)
        if problem is not None:
            raise NotAnswered

    def _overlapping(self, side: StoredFile, progress: Progress | None) -> np.ndarray | None:
        """``overlaps.shared_starts`` of the first file, from every object's stored pieces as
        the headers list them (the walk's part) and its metadata's map; None where a header
        does not answer (a group): every pair is then compared through HDF5."""
        data = overlaps.Extents()
        objects = np.unique(np.fromiter(side.addresses.values(), np.uint64, len(side.addresses)))
        reader = HeaderReader(side.fd, side.size, 0)
        count = Count(progress, READ_HEADERS, len(objects), 1000)
        for at in objects.tolist():
            count()
            try:
                found = side.at(at, reader)
            except NotRead:
                return None
            if found.entries is not None:
                for start, n in zip(found.entries.offsets, found.entries.sizes, strict=True):
                    data.add(start, start + n)
            elif found.at is not None:
                data.add(found.at, found.at + found.size)
        count.end()
        f = self.checkpoints[0].handle.file()
        root = h5py.h5o.get_info(f.id).addr
        overlaps.remember(file_identity(side.fd), data, array("Q", [*objects.tolist(), root]))
        return overlaps.shared_starts(f, progress)


def _check_declared(ckpt: Checkpoint, leaf: TensorLeaf) -> None:
    """A format 0.5 outline's tensor, whose dataset its read did not open: refused, as the
    full read refuses it, where its dataset does not hold what its metadata declares."""
    data = leaf.data
    if ckpt.detected.format < 0.5 or not isinstance(data, H5Data):
        return  # (a legacy outline's tensors are made from their datasets' headers)
    dsid = data.handle.dataset_id(data.name)
    check_storage(
        dsid.dtype, dsid.shape, leaf.dtype, tuple(leaf.shape), data.handle.path, data.name
    )


def _pieces(out: StoredLayout, src: StoredLayout) -> Pieces | None:
    """``stored.copied_pieces`` from the headers: where ``out``'s stored bytes and ``src``'s
    must be equal for both to decode alike, None where they are not stored alike."""
    if out.shape != src.shape or out.dtype != src.dtype or out.pipeline != src.pipeline:
        return None
    if out.shape is None or out.dtype is None or out.chunks != src.chunks:
        return None
    if out.chunks is None:
        size = math.prod(out.shape) * out.dtype.itemsize
        return whole_piece(out.at, src.at, size, out.size, src.size)
    if 0 in out.shape or out.entries is None or src.entries is None:
        return None
    return chunk_pieces(sorted(out.chunk_list()), sorted(src.chunk_list()), out.shape, out.chunks)
