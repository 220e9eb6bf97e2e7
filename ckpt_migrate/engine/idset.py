"""A set of object ids (``id()``) kept as machine words.

An upgrade remembers which tensors it wrote, linked or proved (``copypatch.Written``): a
``set`` of ``int`` kept an object of 32 bytes and a slot of the set's table for each, 8.6 MB
at 150k tensors, made while the write allocated and freed its own objects around them, so
that the interpreter's arenas could not be given back: the read-back that follows peaked
7 MiB higher (issue 33). Here each id is 8 bytes of an array; the first question sorts them.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator

import numpy as np


class IdSet:
    """Add ids, then ask: ``in``, ``len``, iteration in ascending order. An ``add`` after a
    question is allowed (the next question sorts again)."""

    __slots__ = ("_sorted", "_words")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self._words = array("Q", ids)
        self._sorted = False

    def add(self, oid: int) -> None:
        self._words.append(oid)
        self._sorted = False

    def _ordered(self) -> array:
        if not self._sorted:
            unique = np.unique(np.frombuffer(self._words, dtype=np.uint64))
            self._words = array("Q", unique.tobytes())
            self._sorted = True
        return self._words

    def __contains__(self, oid: object) -> bool:
        words = self._ordered()
        if type(oid) is not int or not 0 <= oid < 1 << 64:
            return False
        at = bisect_left(words, oid)
        return at < len(words) and words[at] == oid

    def __len__(self) -> int:
        return len(self._ordered())

    def __iter__(self) -> Iterator[int]:
        return iter(self._ordered())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IdSet):
            return self._ordered() == other._ordered()
        if isinstance(other, (set, frozenset)):
            return len(self) == len(other) and all(oid in self for oid in other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (mutable, as a set)

    def __repr__(self) -> str:
        return f"IdSet({len(self)} ids)"
