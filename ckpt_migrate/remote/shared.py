"""Which bytes of a staged object-store upgrade are the source's, and which are its own.

The mirror (``remote.upgrade``) holds the source's metadata and small datasets; its *holes*,
the tensor data ranges (``splitcopy.data_ranges`` of every dataset, at least ``MIN_RANGE``
each), were never fetched and read as zeros. The engine upgrades the mirror by copy-patch: the
stored bytes of every dataset it keeps stay at their offsets, HDF5 writes only metadata (and
new small datasets), past the source's end or in space freed during the edit, never inside a
dataset's data. So the output's bytes are

* the source's at the same offsets wherever a hole is and the edit wrote nothing: every hole,
  also those of datasets the result no longer names (the local upgrade copies their bytes
  too, so the object is the local output byte for byte). Checked: inside the holes the staged
  file is still all zeros, and no dataset of the output straddles a hole's edge;
* the source's unchanged metadata (found by comparing the staged file with the mirror);
* everything else, the output's own bytes, uploaded: the edited metadata, and the data of the
  datasets outside the holes, small ones or ones the edit wrote anew.

Data outside the holes that a hole would have fed is refused (``VerificationError``): a
stored chunk copied from a hole is all zeros (a real LZ4 chunk never is: its header holds its
size), and unfiltered data written anew may have been decoded from one. LZ4 data decoded from a
hole fails in HDF5 itself. (Until issue 34 every data range of the output had to be inside a
hole, which refused the real writers' files: HDF5 packs small datasets, Adam's ``step``
scalars or LZ4 chunks of zeros, into small-data blocks that often adjoin a large dataset's
chunks, and the two, merged into one range, were not a hole.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py

from ckpt_migrate.engine.splitcopy import MIN_RANGE, complement, data_ranges, merge_spans
from ckpt_migrate.errors import UsageError, VerificationError

COMPARE = 4 << 10  # unchanged metadata is found in blocks of this size
ZERO_RUN = 64  # a chunk written anew this long and all zeros was copied from a hole
SCAN = 8 << 20  # the staged file's holes are checked in reads of at most this much

Span = tuple[int, int]


@dataclass(frozen=True)
class Stored:
    """One dataset's stored data."""

    spans: list[Span]  # merged within the dataset, never across datasets
    filtered: bool  # through a filter (LZ4): data decoded from a hole fails in HDF5


@dataclass
class Layout:
    """The staged output described for the object store."""

    shared: list[Span]  # output bytes that are the source's at the same offsets
    own_data: int = 0  # bytes of tensor data uploaded (outside the holes, or written anew)
    datasets: dict[str, Stored] = field(default_factory=dict)  # the output's data, by dataset


def stored_data(fileobj: Any, name: str) -> dict[str, Stored]:
    """Each dataset's stored data, from the metadata alone; a dataset under several names
    once."""
    out: dict[str, Stored] = {}
    seen: set[int] = set()
    try:
        with h5py.File(fileobj, "r") as f:

            def visit(path: str, obj: Any) -> None:
                if isinstance(obj, h5py.Dataset):
                    addr = h5py.h5o.get_info(obj.id).addr
                    if addr not in seen:
                        seen.add(addr)
                        filters = obj.id.get_create_plist().get_nfilters()
                        out[path] = Stored(data_ranges([obj], 0), filters > 0)

            f.visititems(visit)
    except OSError as exc:
        raise UsageError(name, f"not a readable HDF5 checkpoint ({exc})") from None
    return out


def layout(staged: Path, mirror: Path, holes: list[Span], size: int) -> Layout:
    """Which bytes of ``staged`` (the upgrade of ``mirror``, a source of ``size`` bytes with
    ``holes`` never fetched) the object copies from the source; raises ``VerificationError``
    where the staged bytes cannot be the upgrade's."""
    out_size = staged.stat().st_size
    with open(staged, "rb") as f:
        spans = stored_data(f, str(staged))
    own = _check_data(staged, mirror, holes, size, spans)
    inside = [(a, min(b, out_size)) for a, b in holes if a < out_size]
    _check_untouched(staged, inside)
    shared = merge_spans(inside + unchanged_ranges(staged, mirror, holes, size))
    return Layout(shared, own, spans)


def _check_data(
    staged: Path, mirror: Path, holes: list[Span], size: int, spans: dict[str, Stored]
) -> int:
    """Every dataset's data is inside a hole or outside all of them; returns the bytes outside
    (uploaded). Data outside the holes is either the mirror's bytes at the same offset (a small
    dataset, fetched) or written anew, which no hole may have fed."""
    own = 0
    with open(staged, "rb") as new, open(mirror, "rb") as old:
        for name, stored in spans.items():
            for a, b in stored.spans:
                if any(ha <= a and b <= hb for ha, hb in holes):
                    continue
                if any(a < hb and ha < b for ha, hb in holes):
                    raise VerificationError(
                        str(staged),
                        f"{name}: stored data [{a}, {b}) straddles the edge of the source's "
                        "tensor bytes, which were not fetched",
                        "download the checkpoint and upgrade it locally",
                    )
                own += b - a
                new.seek(a)
                body = new.read(b - a)
                old.seek(a)
                if b <= size and body == old.read(b - a):
                    continue  # in place, fetched with the metadata
                _check_new(staged, name, stored, a, b, body)
    return own


def _check_new(staged: Path, name: str, stored: Stored, a: int, b: int, body: bytes) -> None:
    """Data the edit wrote: refused where it may come from a hole (see the module's note)."""
    zeros = b - a >= ZERO_RUN and not body.strip(b"\0")
    if zeros or (not stored.filtered and b - a >= MIN_RANGE):
        raise VerificationError(
            str(staged),
            f"{name}: stored data [{a}, {b}) was written anew from tensor bytes an object-store "
            "upgrade does not fetch",
            "download the checkpoint and upgrade it locally",
        )


def _check_untouched(staged: Path, holes: list[Span]) -> None:
    """The edit wrote nothing inside the holes: the staged file reads zeros there (its own holes,
    skipped with ``SEEK_DATA``, or the zeros copied from the mirror's)."""
    fd = os.open(staged, os.O_RDONLY)
    try:
        for a, b in holes:
            pos = a
            while pos < b:
                try:
                    pos = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError:  # ENXIO: no data past pos
                    break
                if pos >= b:
                    break
                block = os.pread(fd, min(SCAN, b - pos), pos)
                if block.strip(b"\0"):
                    raise VerificationError(
                        str(staged),
                        f"the upgrade wrote inside the source's tensor bytes [{a}, {b})",
                        "download the checkpoint and upgrade it locally",
                    )
                pos += len(block)
    finally:
        os.close(fd)


def unchanged_ranges(staged: Path, mirror: Path, holes: list[Span], size: int) -> list[Span]:
    """Metadata blocks (``COMPARE`` bytes) the upgrade left as they were in the source."""
    out: list[Span] = []
    limit = min(size, staged.stat().st_size)
    with open(staged, "rb") as new, open(mirror, "rb") as old:
        for a, b in complement(holes, size):
            for lo in range(a, min(b, limit), COMPARE):
                hi = min(b, limit, lo + COMPARE)
                new.seek(lo)
                old.seek(lo)
                if new.read(hi - lo) == old.read(hi - lo):
                    out.append((lo, hi))
    return merge_spans(out)
