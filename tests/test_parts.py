"""The object-store part program (remote/parts.py), run on bytes in memory: every object obeys
S3's part rules and the final object is exactly the output, for many random layouts."""

from __future__ import annotations

import random

import pytest

from ckpt_migrate.engine.extents import Extents, Own, Shared
from ckpt_migrate.remote.parts import SOURCE, UPLOAD, Program, Ref, pieces, plan

MIN, MAX = 1000, 40_000  # small stand-ins for 5 MiB and 5 GiB


def layout(rng: random.Random, size: int) -> Extents:
    """Own ranges of 1..300 bytes scattered among shared ones, sometimes at the very start."""
    parts: list[Shared | Own] = []
    pos = 0 if rng.random() < 0.5 else rng.randrange(1, 300)
    if pos:
        parts.append(Own(0, pos))
    while pos < size:
        shared = min(size - pos, rng.randrange(1, 3 * MIN))
        parts.append(Shared(pos, pos, shared))
        pos += shared
        own = min(size - pos, rng.randrange(1, 300))
        if own:
            parts.append(Own(pos, own))
            pos += own
    return Extents(size, tuple(parts))


def build(prog: Program, source: bytes, output: bytes) -> bytes:
    """The store's view: each object is the concatenation of its parts, checked for the rules."""
    objects: dict[int, tuple[int, bytes]] = {}

    def part(ref: Ref) -> bytes:
        if ref.obj == SOURCE:
            return source[ref.start + ref.delta : ref.end + ref.delta]
        if ref.obj == UPLOAD:
            return output[ref.start : ref.end]
        start, data = objects[ref.obj]  # an earlier chain object
        return data[ref.start - start : ref.end - start]

    def obj(refs: list[Ref]) -> bytes:
        for i, ref in enumerate(refs):
            assert ref.size <= MAX
            assert ref.size >= MIN or i == len(refs) - 1, (i, ref)
        assert [r.start for r in refs[1:]] == [r.end for r in refs[:-1]]  # contiguous
        return b"".join(part(r) for r in refs)

    for chain in prog.chains:
        objects[chain.number] = (chain.start, obj(chain.parts))
        assert len(objects[chain.number][1]) == chain.end - chain.start
    return obj(prog.final)


@pytest.mark.parametrize("seed", range(40))
def test_program_builds_the_output_within_the_rules(seed):
    rng = random.Random(seed)
    size = rng.randrange(1, 200_000)
    extents = layout(rng, size)
    source = rng.randbytes(size)
    output = bytearray(source)
    own = 0
    for p in extents.parts:
        if isinstance(p, Own):
            output[p.dst : p.dst + p.length] = rng.randbytes(p.length)
            own += p.length
    prog = plan(extents, MIN, MAX, chain_limit=8 * MIN)
    assert build(prog, source, bytes(output)) == bytes(output)
    # Uploads: the changed bytes and at most one first part.
    assert prog.uploaded() <= own + MIN
    # Shared bytes that are here already (outside ``remote``) go with the changes around them:
    # the same output, no more uploads than those bytes, fewer chain steps.
    remote = [(p.dst, p.dst + p.length) for p in extents.parts[::3] if isinstance(p, Shared)]
    here = sum(
        r.size
        for r in pieces(extents)
        if r.obj == SOURCE and not any(a < r.end and r.start < b for a, b in remote)
    )
    local = plan(extents, MIN, MAX, chain_limit=8 * MIN, remote=remote)
    assert build(local, source, bytes(output)) == bytes(output)
    assert local.uploaded() <= own + MIN + here
    assert len(local.chains) <= len(prog.chains)


def test_many_small_ranges_between_changes_take_no_chain_step_each():
    """A 1.9 checkpoint of 7,312 small tensors: its unchanged ranges between header changes are
    each under 5 MiB, and each took a chain step copying 5-16 MiB (3,881 steps, 41 GB copied
    by the store for a 76 MB object). Those of metadata, here already, go with the changes;
    tensor data is still copied by the store, never fetched."""
    parts: list[Shared | Own] = []
    pos = 0
    for _ in range(400):
        parts += [Shared(pos, pos, 600), Own(pos + 600, 20)]
        pos += 620
    extents = Extents(pos, tuple(parts))
    data = random.Random(2).randbytes(pos)
    remote = [(p.dst, p.dst + p.length) for p in parts[0:80:2]]  # tensor data, not fetched
    before = plan(extents, MIN, MAX, chain_limit=8 * MIN)  # (every shared byte remote)
    assert len(before.chains) >= 390
    prog = plan(extents, MIN, MAX, chain_limit=8 * MIN, remote=remote)
    assert build(prog, data, data) == data
    assert len(prog.chains) <= 2 * 40  # a step for a tensor's range, one for the change after
    copied = {(r.start, r.end) for c in prog.chains for r in c.parts if r.obj == SOURCE}
    copied |= {(r.start, r.end) for r in prog.final if r.obj == SOURCE}
    assert {(a, b) for a, b in remote if a >= MIN} <= copied  # (the first part is uploaded)


def test_unchanged_object_is_copied_in_slices():
    size = 3 * MAX + 5
    prog = plan(Extents(size, (Shared(0, 0, size),)), MIN, MAX)
    assert prog.uploaded() == 0 and not prog.chains
    assert len(prog.final) == 4
    data = random.Random(1).randbytes(size)
    assert build(prog, data, data) == data
