"""What each block of a root's attribute heap held, so that a root edit's check reads again
only the blocks the edit changed (issue 33).

A format 0.5 root keeps its attributes (one per leaf) in a fractal heap's direct blocks
(``fractalheap``), each string's text in a global heap collection. A root edit
(``engine.rootedit``) clones the source and rewrites a few root attributes through HDF5, which
rewrites the blocks and collections those live in and no other. Its check (``engine.rootverify``)
compares the output's root with the source's as a multiset digest of ``(name, text)`` pairs
(``rootdigest``); reading the output's 188k attributes again was 0.7 s of a 150k-leaf root
edit's 5 s.

``Recorded`` keeps, as the source's root is read, each direct block's own digest (XXH3-128 of
its bytes), its pairs' part of the root's digest and count, the names of its attributes that
are not text, the collections its texts are in and the hashes of its attributes' names; and
each collection's digest. ``Checked`` then vouches, in the output, for a block at the same
address whose bytes and whose texts' collections are byte for byte the source's, holding no
attribute the edit wrote or removed: its attributes are the ones the source's read took from
the same bytes, so its part of the digest is added without reading them. Every other block is
read as before. A block vouched for twice is read instead (the duplicate is then found).
"""

from __future__ import annotations

import copy
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import xxhash

from ckpt_migrate.format.h5 import fractalheap
from ckpt_migrate.format.h5.rootdigest import MOD, RootDigest

_NAME_BITS = 0xFFFFFFFF  # (a name's hash kept in 32 bits: a collision only reads a block)


class Source(Protocol):
    def collection_bytes(self, at: int) -> bytes: ...


class Blocks(fractalheap.Blocks, Protocol):
    """What ``attrtable`` tells of a root's dense storage as it reads it."""

    vouched: int  # attributes vouched for, not taken
    counted: Callable[[int], object] | None  # told of each block's attributes vouched for

    def bind(self, source: Source) -> None:
        """The file being read (where a collection's bytes are read from)."""

    def name(self, name: str) -> None:
        """An attribute named ``name`` is being taken."""

    def collection(self, at: int, data: bytes | None) -> None:
        """A text of the attribute being taken is in the collection at ``at``; ``data``: its
        bytes, where they were read for it (else None: read for an earlier one)."""


_M64 = (1 << 64) - 1


@dataclass(frozen=True)
class _Block:
    digest: int  # XXH3-128 of the block's bytes (its checksum field read as zero)
    pairs: int  # its pairs' part of the root's digest
    count: int
    other: tuple[str, ...]  # its attributes that are not text
    collections: tuple[int, ...]  # where its texts are
    names: tuple[int, int]  # its attributes' names' hashes: ``Recorded.names[a:b]``


class Recorded:
    """The blocks of a root's dense storage as its reader read it into ``digest``. Kept in
    arrays as it is read, made into ``_Block`` records once asked (``blocks``): objects made
    among the read's 188k passing ones held their memory arenas, 20 MB at 150k leaves."""

    vouched = 0
    counted = None

    def __init__(self, digest: RootDigest) -> None:
        self.digest: RootDigest | None = digest
        self.names = array("I")
        # each block's address, digest and pairs (each as two 64-bit halves), count, first
        # name, end of its collections in ``_in``; each collection's address and digest
        self._at, self._digest, self._pairs = array("Q"), array("Q"), array("Q")
        self._count, self._names, self._ends = array("I"), array("I"), array("I")
        self._in, self._collections = array("Q"), array("Q")
        self._other: dict[int, tuple[str, ...]] = {}  # (a few blocks: ``__SUCCESS__``'s)
        self._start: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._noted: set[int] = set()
        self._blocks: dict[int, _Block] | None = None
        self.dropped: set[int] = set()  # (``without``)
        self.dropped_for: frozenset[str] | None = None

    def bind(self, source: Source) -> None:
        pass

    def name(self, name: str) -> None:
        self.names.append(hash(name) & _NAME_BITS)

    def collection(self, at: int, data: bytes | None) -> None:
        if data is not None:
            self._collections.extend((at, xxhash.xxh3_64_intdigest(data)))
        if at not in self._noted:  # (a set for the block being read, let go of after it)
            self._noted.add(at)
            self._in.append(at)

    def end(self) -> None:
        """The read is over: the digest is let go of (a root edit lets go of the pairs it
        keeps by name before HDF5 rewrites the spec, issue 33)."""
        self.digest, self._noted = None, set()

    def known(self, at: int, block: bytes) -> int | None:
        d = self.digest
        assert d is not None, "the read is over"
        self._start = (d.digest, d.count, len(d.other), len(self.names))
        self._noted = set()
        return None

    def taken(self, at: int, block: bytes, objects: int) -> None:
        d = self.digest
        assert d is not None, "the read is over"
        pairs, count, other, names = self._start
        if d.count - count != objects:  # (not the reader's digest alone: not vouched for)
            del self._in[self._ends[-1] if self._ends else 0 :]
            return
        whole, part = xxhash.xxh3_128_intdigest(block), (d.digest - pairs) % MOD
        self._at.append(at)
        self._digest.extend((whole & _M64, whole >> 64))
        self._pairs.extend((part & _M64, part >> 64))
        self._count.append(objects)
        self._names.extend((names, len(self.names)))
        self._ends.append(len(self._in))
        if len(d.other) > other:
            self._other[len(self._at) - 1] = tuple(d.other[other:])

    @property
    def blocks(self) -> dict[int, _Block]:
        """The blocks by address (one recorded twice is not vouched for)."""
        if self._blocks is None:
            found: dict[int, _Block] = {}
            twice = set()
            for i, at in enumerate(self._at):
                if at in found:
                    twice.add(at)
                d, p, n = self._digest, self._pairs, self._names
                found[at] = _Block(
                    d[2 * i] | d[2 * i + 1] << 64,
                    p[2 * i] | p[2 * i + 1] << 64,
                    self._count[i],
                    self._other.get(i, ()),
                    tuple(self._in[self._ends[i - 1] if i else 0 : self._ends[i]]),
                    (n[2 * i], n[2 * i + 1]),
                )
            for at in twice:
                del found[at]
            self._blocks = found
        return self._blocks

    @property
    def collections(self) -> dict[int, int]:
        """Each collection's digest by its address."""
        c = self._collections
        return dict(zip(c[0::2], c[1::2], strict=True))

    def without(self, names: set[str]) -> Recorded:
        """This record with the blocks that may hold one of ``names`` marked (``holding``),
        its names' hashes let go of: a root edit's check needs no more, and the 0.75 MB of
        hashes at 150k leaves were kept through the edit's peak (issue 33)."""
        out = copy.copy(self)
        out.dropped, out.dropped_for = self.holding(names), frozenset(names)
        out.names = array("I")
        return out

    def holding(self, names: set[str]) -> set[int]:
        """The addresses of the blocks that may hold an attribute of one of ``names`` (every
        block, where the names' hashes were let go of for others: ``without``)."""
        if self.dropped_for is not None:
            return self.dropped if names <= self.dropped_for else set(self.blocks)
        wanted = np.array(sorted({hash(n) & _NAME_BITS for n in names}), dtype=np.uint32)
        found = np.flatnonzero(np.isin(np.frombuffer(self.names, dtype=np.uint32), wanted))
        if not len(found):
            return set()
        return {
            at
            for at, b in self.blocks.items()
            if np.any((found >= b.names[0]) & (found < b.names[1]))
        }


class Checked:
    """Vouches for the output's blocks that are the source's (``Recorded``) and hold none of
    ``edited``, adding their part to ``digest`` (the output's)."""

    def __init__(self, source: Recorded, digest: RootDigest, edited: set[str]) -> None:
        self.source, self.digest = source, digest
        self.blocks, self.collections = source.blocks, source.collections
        self.dirty = source.holding(edited)
        self.vouched = 0
        self.counted: Callable[[int], object] | None = None
        self._file: Source | None = None
        self._collections: dict[int, int | None] = {}
        self._seen: set[int] = set()

    def bind(self, source: Source) -> None:
        self._file = source

    def name(self, name: str) -> None:
        pass

    def collection(self, at: int, data: bytes | None) -> None:
        pass

    def known(self, at: int, block: bytes) -> int | None:
        was = self.blocks.get(at)
        if was is None or at in self.dirty or at in self._seen:
            return None
        if xxhash.xxh3_128_intdigest(block) != was.digest:
            return None
        if any(self._collection(c) != self.collections.get(c) for c in was.collections):
            return None
        self._seen.add(at)
        d = self.digest
        d.digest = (d.digest + was.pairs) % MOD
        d.count += was.count
        d.other.extend(was.other)
        self.vouched += was.count
        if self.counted is not None:
            self.counted(was.count)
        return was.count

    def taken(self, at: int, block: bytes, objects: int) -> None:
        pass

    def _collection(self, at: int) -> int | None:
        if at not in self._collections:
            assert self._file is not None, "bind() first"
            try:
                data = self._file.collection_bytes(at)
            except fractalheap.Unknown:
                self._collections[at] = None
            else:
                self._collections[at] = xxhash.xxh3_64_intdigest(data)
        return self._collections[at]
