"""The multipart program of an output object: every unchanged range is copied by the store
(``UploadPartCopy``), only the changed bytes are uploaded, within S3's part rules.

S3's rules (docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html): every part but the
last is at least 5 MiB, no part is over 5 GiB, at most 10,000 parts. A checkpoint's changes
are small and scattered (a header every few MiB), so a change cannot simply be its own part.
The program instead grows *chain objects* server-side: a chain starts with a >= 5 MiB part
(the tail of the part before it, or, at the start of the file, 5 MiB uploaded once) and each
step is a new object ``[the previous chain object, copied] + [the next piece]``, whose last part
may be small. The final object's parts are then copies of source ranges and chain objects.
A chain is closed after ``chain_limit`` bytes, which bounds what the store copies per step.

Every chain step copies at least 5 MiB, so a small unchanged range between two changes whose
bytes are here already (metadata the upgrade fetched, not tensor data) is uploaded with the
changes around it instead: a 1.9 checkpoint of 7,312 small tensors took a chain step for each
such range (3,881 steps, 41 GB copied by the store for a 76 MB object; now 5 steps, 38 MB).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ckpt_migrate.engine.extents import Extents, Shared
from ckpt_migrate.errors import UsageError

MiB = 1 << 20
MIN_PART = 5 * MiB
MAX_PART = 5 << 30
MAX_PARTS = 10_000
CHAIN_LIMIT = 16 * MiB

SOURCE = -1  # Ref.obj: the source object, same offsets
UPLOAD = -2  # Ref.obj: output bytes sent from here (staged bytes, shared ones fetched)


@dataclass(frozen=True)
class Ref:
    """Output bytes ``[start, end)``, taken from ``obj`` (SOURCE, UPLOAD or a chain object's
    number; a chain object holds output bytes ``[Chain.start, Chain.end)``)."""

    obj: int
    start: int
    end: int
    delta: int = 0  # SOURCE: the source offset minus the output offset

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass
class Chain:
    number: int
    start: int  # the output offset of the object's first byte
    end: int
    parts: list[Ref]


@dataclass
class Program:
    chains: list[Chain] = field(default_factory=list)  # built in order, each from the last
    final: list[Ref] = field(default_factory=list)

    def uploaded(self) -> int:
        refs = [r for c in self.chains for r in c.parts] + self.final
        return sum(r.size for r in refs if r.obj == UPLOAD)

    def store_copied(self) -> int:
        refs = [r for c in self.chains for r in c.parts] + self.final
        return sum(r.size for r in refs if r.obj != UPLOAD)


def pieces(extents: Extents) -> list[Ref]:
    """The output (``engine.extents``: its shared and own ranges in order) as SOURCE and UPLOAD
    references."""
    out = []
    for part in extents.parts:
        if isinstance(part, Shared):
            out.append(Ref(SOURCE, part.dst, part.dst + part.length, part.src - part.dst))
        else:
            out.append(Ref(UPLOAD, part.dst, part.dst + part.length))
    return [r for r in out if r.size > 0]


def plan(
    extents: Extents,
    min_part: int = MIN_PART,
    max_part: int = MAX_PART,
    chain_limit: int = CHAIN_LIMIT,
    *,
    remote: Sequence[tuple[int, int]] | None = None,
) -> Program:
    """The program building the object ``extents`` describes. ``remote``: the output ranges
    whose bytes are only in the store (None: every shared byte)."""
    todo = _absorb(pieces(extents), min_part, remote)
    size = extents.size
    prog = Program()
    if todo and todo[0].size < min_part:  # nothing before it to lean on: upload a first part
        head = min(size, min_part)
        todo = [Ref(UPLOAD, 0, head)] + [
            Ref(r.obj, max(r.start, head), r.end, r.delta) for r in todo if r.end > head
        ]
    cur: Chain | None = None
    for i, piece in enumerate(todo):
        last = i == len(todo) - 1
        if piece.size >= min_part or last:
            if cur is not None:
                prog.final += _slices(Ref(cur.number, cur.start, cur.end), min_part, max_part)
                cur = None
            prog.final += _slices(piece, min_part, max_part)
            continue
        if cur is not None and cur.end - cur.start >= chain_limit:
            prog.final += _slices(Ref(cur.number, cur.start, cur.end), min_part, max_part)
            cur = None
        if cur is None:
            first = _take_tail(prog.final, min_part)
        else:
            first = _slices(Ref(cur.number, cur.start, cur.end), min_part, max_part)
        cur = Chain(len(prog.chains), first[0].start, piece.end, [*first, piece])
        prog.chains.append(cur)
    for part_list in [c.parts for c in prog.chains] + [prog.final]:
        if len(part_list) > MAX_PARTS:
            raise UsageError(None, f"an object would need {len(part_list)} parts (S3: 10,000)")
    return prog


def _absorb(todo: list[Ref], min_part: int, remote: Sequence[tuple[int, int]] | None) -> list[Ref]:
    """Small source ranges between changes, none of whose bytes is ``remote``, as uploads;
    adjacent uploads joined."""
    if remote is None:
        return todo
    spans = sorted(remote)
    ends = [b for _, b in spans]
    out: list[Ref] = []
    for i, ref in enumerate(todo):
        small = ref.obj == SOURCE and ref.size < min_part and i < len(todo) - 1
        if small and next(clipped(spans, ends, ref.start, ref.end), None) is None:
            ref = Ref(UPLOAD, ref.start, ref.end)
        if out and ref.obj == UPLOAD and out[-1].obj == UPLOAD:
            ref = Ref(UPLOAD, out.pop().start, ref.end)
        out.append(ref)
    return out


def clipped(
    spans: list[tuple[int, int]], ends: list[int], start: int, end: int
) -> Iterator[tuple[int, int]]:
    """The parts of ``spans`` (sorted, disjoint; ``ends`` their ends) in ``[start, end)``."""
    for i in range(bisect.bisect_right(ends, start), len(spans)):
        a, b = spans[i]
        if a >= end:
            break
        yield max(a, start), min(b, end)


def _take_tail(final: list[Ref], min_part: int) -> list[Ref]:
    """The first part of a new chain: the last ``min_part`` bytes of the final object so far
    (the whole last part when it could not spare them)."""
    last = final.pop()
    if last.size >= 2 * min_part:
        final.append(Ref(last.obj, last.start, last.end - min_part, last.delta))
        return [Ref(last.obj, last.end - min_part, last.end, last.delta)]
    return [last]


def _slices(ref: Ref, min_part: int, max_part: int) -> list[Ref]:
    """``ref`` as parts of at most ``max_part`` (equal pieces, each far above ``min_part``)."""
    if ref.size <= max_part:
        return [ref]
    count = -(-ref.size // max_part)
    step = -(-ref.size // count)
    return [
        Ref(ref.obj, a, min(a + step, ref.end), ref.delta) for a in range(ref.start, ref.end, step)
    ]
