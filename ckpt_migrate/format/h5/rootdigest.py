"""A group's attributes as one multiset digest of ``(name, text)`` pairs (issue 33).

The sum modulo 2¹²⁸ of each pair's XXH3-128 digest: independent of order, and a pair can be
taken out again by subtracting its own. ``engine.rootverify`` compares a root edit's output
with its source this way; the source's digest is taken while the reader reads the root
(``read_checkpoint(root_digest=True)``), so the source's 188k attributes are not read twice.
A pair is a scalar string attribute's name and text, or a name alone for any other attribute
(``attrtable``'s None), whose value is then compared through h5py (``other``).
"""

from __future__ import annotations

from typing import Any, Protocol

import xxhash

MOD = 1 << 128
_SLICE = 1 << 20  # characters of a text encoded at once


def pair_hash(name: str, text: str | bytes | None) -> int:
    """A pair's digest; ``text`` may be given as its UTF-8 bytes. Hashed piece by piece, a
    long text encoded a slice at a time (UTF-8 encodes each code point alone): the pair joined
    into one string first held four copies of a 27 MB ``__spec__`` at once. XXH3-128, as the
    copies' digests (``splitcopy``): the digest finds what an edit changed by mistake, and
    BLAKE2b took 1.9 µs a pair against 0.4 (188k pairs a side at 150k tensors, issue 33)."""
    head = name.encode("utf-8", "surrogatepass") + b"\0"
    if text is None:
        return xxhash.xxh3_128_intdigest(head)
    if len(text) < _SLICE:  # in one call, the same digest (0.23 µs a leaf's pair, not 0.55)
        raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
        return xxhash.xxh3_128_intdigest(head + b"\1" + raw)
    hashed = xxhash.xxh3_128(head + b"\1")
    if isinstance(text, bytes):
        hashed.update(text)
    else:
        for at in range(0, len(text), _SLICE):
            hashed.update(text[at : at + _SLICE].encode("utf-8", "surrogatepass"))
    return hashed.intdigest()


class BlockRecord(Protocol):
    """What each block of the root's storage held (``heapblocks.Recorded``)."""

    def without(self, names: set[str]) -> Any: ...


class RootDigest:
    """The digest and count of the pairs added, the names of those that are not text, and
    (``keep_pairs``) each pair's own digest by name, so that any of them can be taken out; a
    name not kept is remembered by its hash only (``seen``): an edit of such an attribute
    cannot be taken out, and the caller reads both files instead."""

    def __init__(self, remember: bool = True) -> None:
        self.remember = remember  # (a digest only compared, never taken from, needs no names)
        self.digest = self.count = 0
        self.other: list[str] = []
        self.pairs: dict[str, int] = {}
        self.hashes: set[int] = set()
        # What each block of a dense root's storage held, as its reader read it
        # (``heapblocks``): the check of a root edit reads again only the blocks it changed
        self.blocks: BlockRecord | None = None

    def add(self, name: str, text: str | None, keep_pair: bool = True) -> None:
        value = pair_hash(name, text)
        self.digest = (self.digest + value) % MOD
        self.count += 1
        if text is None:
            self.other.append(name)
        if not self.remember:
            return
        if keep_pair:
            self.pairs[name] = value
        else:
            self.hashes.add(hash(name))

    def holds(self, name: str, text: str | bytes) -> bool:
        """Whether the pair added as ``name`` is ``text`` (or its UTF-8 bytes)."""
        value = self.pairs.get(name)
        return value is not None and value == pair_hash(name, text)

    def without(self, names: set[str]) -> RootDigest | None:
        """The digest of the pairs whose name is not in ``names`` (and the record of its blocks,
        those that may hold them marked: ``heapblocks.Recorded.without``); None when one of
        them was added without its pair kept."""
        out = RootDigest()
        out.digest, out.count = self.digest, self.count
        out.blocks = None if self.blocks is None else self.blocks.without(names)
        out.other = [n for n in self.other if n not in names]
        for name in names:
            value = self.pairs.get(name)
            if value is None:
                if hash(name) in self.hashes:
                    return None
                continue
            out.digest = (out.digest - value) % MOD
            out.count -= 1
        return out
