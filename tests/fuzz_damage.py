"""Targeted damage (issue #36): a chunk index entry's stored size or address, an LZ4 frame
header, or bytes of an object header of a fixture, run through every entry point, each outcome
counted by class; prints one JSON summary line. Used by ``test_fuzz.py`` (a few hundred cases,
in a subprocess so that a crash in HDF5 shows as a signal) and ``benchmarks/fuzz_damage.py``
(thousands).

``--wide`` (opt in: the default cases stay those of each seed) adds the real 2.6–2.9 files to
the fixtures and a fifth kind, ``metadata``: bytes anywhere outside tensor data (superblock,
headers past their first 256 bytes, heaps, B-tree nodes, a legacy spec's hex).

Allowed outcomes: ``equal`` (success, every tensor equal to the undamaged file's), ``refused``
(a one-line error, exit 2) and, for an upgrade, ``carried`` (success, the damage copied as
stored and reported so: reading the output's tensors is refused as reading the source's is).
Forbidden: ``wrong`` (success with other values), ``self_different`` (``verify F F`` finds a
difference), ``internal`` (any other exception: exit 1) and a refusal with another exit code.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import lzma
import random
import shutil
import struct
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h5py

from ckpt_migrate.cli import commands
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.errors import CkptError
from ckpt_migrate.format.compare import tensor_sha256
from ckpt_migrate.format.deep_check import deep_check
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import TensorLeaf, iter_leaves

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KINDS = ("stored_size", "address", "frame_header", "object_header")
WIDE_KINDS = (*KINDS, "metadata")
VERBS = ("load", "verify", "check_deep", "upgrade", "upgrade_full", "upgrade_manifest")
FORBIDDEN = ("wrong", "self_different", "internal", "bad_exit")


@dataclass(frozen=True)
class Chunk:
    dataset: str
    ndim: int
    offset: int  # byte offset of the stored chunk
    size: int
    lz4: bool  # the dataset's only filter is LZ4 and this chunk went through it


@dataclass
class Anatomy:
    """Where a fixture keeps its chunks and object headers."""

    data: bytes
    chunks: list[Chunk]
    headers: list[int]  # object header addresses
    stored: list[tuple[int, int]]  # (start, end) of every chunk and contiguous block


LATER = frozenset({"numpy_scalars.mdl"})  # (fixtures added after the seeds were recorded)


def sources(wide_dir: Path | None = None) -> list[Path]:
    """The fixtures damaged; ``wide_dir``: with the real 2.6–2.9 files unpacked there."""
    # (the seeds the tests and benchmarks/README.md replay index this list: a fixture added
    # later, numpy_scalars.mdl, is left out so that each seed still damages the same file)
    found = sorted(FIXTURES.glob("release-*.mdl")) + sorted(
        p for p in (FIXTURES / "real-cstorch-2.10").glob("*.mdl") if p.name not in LATER
    )
    if wide_dir is not None:
        for packed in sorted((FIXTURES / "real-cstorch-2.6-2.9").glob("*.mdl.xz")):
            unpacked = wide_dir / packed.name.removesuffix(".xz")
            if not unpacked.exists():
                unpacked.write_bytes(lzma.decompress(packed.read_bytes()))
            found.append(unpacked)
    return found


def anatomy(path: Path) -> Anatomy:
    chunks: list[Chunk] = []
    headers: list[int] = []
    stored: list[tuple[int, int]] = []
    with h5py.File(path, "r", locking=False) as f:

        def visit(name: bytes, info: h5py.h5l.LinkInfo) -> None:
            if info.type != h5py.h5l.TYPE_HARD:
                return
            headers.append(info.u)
            obj = h5py.h5o.open(f.id, name)
            if not isinstance(obj, h5py.h5d.DatasetID):
                return
            if obj.get_create_plist().get_layout() == 1 and obj.get_offset() is not None:
                stored.append((obj.get_offset(), obj.get_offset() + obj.get_storage_size()))
            if obj.get_create_plist().get_layout() != 2:
                return
            dcpl = obj.get_create_plist()
            only_lz4 = [dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters())] == [32004]
            ndim = len(obj.shape)

            def chunk(c: h5py.h5d.StoreInfo) -> None:
                lz4 = only_lz4 and c.filter_mask == 0
                chunks.append(Chunk(name.decode(), ndim, c.byte_offset, c.size, lz4))

            obj.chunk_iter(chunk)

        headers.append(h5py.h5o.get_info(f["/"].id).addr)
        f.id.links.visit(visit, info=True)
    stored += [(c.offset, c.offset + c.size) for c in chunks]
    return Anatomy(path.read_bytes(), chunks, headers, sorted(stored))


def _index_key(data: bytes, chunk: Chunk) -> int | None:
    """Where the v1 B-tree key of ``chunk`` starts (size u32, mask u32, offsets), found from
    the chunk address after it; None where the file keeps another kind of chunk index."""
    key = 8 + 8 * (chunk.ndim + 1)
    at = data.find(struct.pack("<Q", chunk.offset))
    while at != -1:
        if at >= key and struct.unpack_from("<I", data, at - key)[0] == chunk.size:
            return at - key
        at = data.find(struct.pack("<Q", chunk.offset), at + 1)
    return None


def damage(rng: random.Random, body: Anatomy, kind: str) -> bytes | None:
    """One damaged copy of the fixture, or None if it has nothing of that kind."""
    out = bytearray(body.data)
    if kind == "metadata":
        at = _outside(rng, body)
        for _ in range(rng.choice([1, 1, 2, 4])):
            out[min(at + rng.randrange(8), len(out) - 1)] = rng.randrange(256)
        return bytes(out)
    if kind == "object_header":
        at = rng.choice(body.headers) + rng.randrange(256)
        for _ in range(rng.choice([1, 1, 2, 4])):
            out[min(at + rng.randrange(8), len(out) - 1)] = rng.randrange(256)
        return bytes(out)
    pool = [c for c in body.chunks if c.lz4] if kind == "frame_header" else body.chunks
    if not pool:
        return None
    chunk = rng.choice(pool)
    if kind == "frame_header":
        at = chunk.offset + rng.randrange(16)
        out[at] = (out[at] + rng.randrange(1, 256)) % 256
        return bytes(out)
    key = _index_key(body.data, chunk)
    if key is None:
        return None
    if kind == "stored_size":
        size = chunk.size
        new = rng.choice([size // 2, size - 1, size + 1, rng.randrange(size), size + 4096, 0])
        struct.pack_into("<I", out, key, max(0, new))
    else:
        other = rng.choice(body.chunks).offset
        address = chunk.offset
        new = rng.choice(
            [other, address + rng.randrange(-64, 65), address ^ (1 << rng.randrange(24))]
        )
        struct.pack_into("<Q", out, key + 8 + 8 * (chunk.ndim + 1), max(0, new))
    return bytes(out)


def _outside(rng: random.Random, body: Anatomy) -> int:
    """A byte offset of the file outside its tensor data."""
    starts = [start for start, _ in body.stored]
    while True:
        at = rng.randrange(len(body.data))
        i = bisect.bisect_right(starts, at) - 1
        if i < 0 or at >= body.stored[i][1]:
            return at


def damaged_files(
    rng: random.Random, bodies: dict[Path, Anatomy], kinds: tuple[str, ...] = KINDS
) -> Iterator[tuple[Path, str, bytes]]:
    """Endless (fixture, kind of damage, damaged bytes), in the order ``rng`` makes them."""
    while True:
        src = rng.choice(list(bodies))
        kind = rng.choice(kinds)
        data = damage(rng, bodies[src], kind)
        if data is not None and data != bodies[src].data:
            yield src, kind, data


def nth_case(seed: int, index: int, wide_dir: Path | None = None) -> tuple[Path, str, bytes]:
    """Case ``index`` of a worker seeded ``seed`` (``main`` numbers them from 0): a forbidden
    outcome a benchmark run reports, made again for a test (``wide_dir``: of a ``--wide``
    run, the real 2.6–2.9 files unpacked there)."""
    bodies = {p: anatomy(p) for p in sources(wide_dir)}
    kinds = KINDS if wide_dir is None else WIDE_KINDS
    return next(itertools.islice(damaged_files(random.Random(seed), bodies, kinds), index, None))


def tensor_hashes(path: Path) -> dict[str, str]:
    """Every tensor of a checkpoint by name: its dtype, shape and the sha256 of its decoded
    bytes (the ``load`` path's reads: ``read_slab``); a bfloat16 tensor read as int16 has the
    same bytes."""
    with read_checkpoint(path) as ckpt:
        return {
            ref.name: f"{ref.leaf.dtype} {ref.leaf.shape} {tensor_sha256(ref.leaf)}"
            for ref in iter_leaves(ckpt.root)
            if isinstance(ref.leaf, TensorLeaf)
        }


def outcome(verb: str, case: Path, want: dict[str, str] | None, out: Path) -> tuple[str, str]:
    """(class, detail) of one entry point on one damaged file; ``want``: the tensor hashes the
    verb gives for the undamaged file (None: it refuses that file)."""
    try:
        if verb == "load":
            return _compared(tensor_hashes(case), want)
        if verb == "verify":
            res = commands.verify(case, case)
            return ("equal", "") if res["identical"] else ("self_different", str(res))
        if verb == "check_deep":
            error = deep_check(case).error()
            return (
                ("refused", str(error))
                if error is not None
                else _compared(tensor_hashes(case), want)
            )
        return _upgraded(verb, case, want, out)
    except CkptError as exc:
        return ("refused", str(exc)) if exc.exit_code == 2 else ("bad_exit", str(exc))
    except Exception as exc:  # what is forbidden: an internal error on a damaged file
        return "internal", f"{type(exc).__name__}: {exc}"


def _upgraded(verb: str, case: Path, want: dict[str, str] | None, out: Path) -> tuple[str, str]:
    manifest = out / "manifest.json" if verb == "upgrade_manifest" else None
    opts = UpgradeOptions(
        output_dir=out,
        allow_missing=True,
        verify="full" if verb == "upgrade_full" else "index",
        inputs={"drop_dataloader_state": True},  # 1.8/1.9: write, not refuse
        manifest=manifest,  # (every tensor decoded and hashed: --verify full's checks too)
    )
    try:
        res = upgrade(case, opts)
        if res.status == "failed":
            return ("refused", res.error or "") if res.exit_code == 2 else ("bad_exit", res.error)
        result = out / case.name
        if res.output is None:  # a file at the target release, nowhere to put it
            return "equal", ""
        try:
            got = tensor_hashes(result)
        except CkptError as exc:
            if "copied as stored" in (res.tensor_data or ""):
                return "carried", str(exc)
            return "wrong", f"{res.tensor_data}: {exc}"
        if manifest is not None:
            listed = json.loads(manifest.read_text())["tensors"]
            untrue = sorted(n for n, h in listed.items() if not got[n].endswith(f" {h}"))
            if untrue or not set(listed) <= set(got):
                return "wrong", f"the manifest's hashes are not the output's: {untrue[:3]}"
        return _compared(got, want)
    finally:
        for leftover in out.iterdir():
            leftover.unlink()


def baseline(verb: str, src: Path, workdir: Path) -> dict[str, str] | None:
    """What ``verb`` makes of the undamaged ``src``: its tensors' hashes (of the output, for an
    upgrade), None if it refuses the file."""
    try:
        if not verb.startswith("upgrade"):
            return tensor_hashes(src)
        out = workdir / "baseline"
        out.mkdir(exist_ok=True)
        opts = UpgradeOptions(
            output_dir=out, allow_missing=True, inputs={"drop_dataloader_state": True}
        )
        # a copy of its own: a worker beside this one may upgrade the same fixture, and an
        # upgrade refuses a source another upgrade holds
        own = workdir / f"original-{src.name}"
        shutil.copyfile(src, own)
        try:
            res = upgrade(own, opts)
            return tensor_hashes(res.output) if res.output is not None else None
        finally:
            own.unlink()
            for leftover in out.iterdir():
                leftover.unlink()
    except CkptError:
        return None


def _compared(got: dict[str, str], want: dict[str, str] | None) -> tuple[str, str]:
    if want is None:
        return "wrong", "accepted a file whose undamaged original is refused"
    return ("equal", "") if got == want else ("wrong", _diff(got, want))


def _diff(got: dict[str, str], want: dict[str, str]) -> str:
    names = sorted(n for n in set(got) | set(want) if got.get(n) != want.get(n))
    return f"{len(names)} tensor(s) differ: {names[:3]}"


def main(
    seed: int,
    count: int,
    workdir: Path,
    verbs: tuple[str, ...] = VERBS,
    *,
    rotate: bool = False,
    wide: bool = False,
) -> dict:
    """``count`` damaged files through every verb of ``verbs``; ``rotate``: through the first
    and one of the others in turn (the test suite's budget); ``wide``: the module's ``--wide``."""
    rng = random.Random(seed)
    bodies = {p: anatomy(p) for p in sources(workdir if wide else None)}
    kinds_of = {"upgrade" if v.startswith("upgrade") else "load" for v in verbs}
    base = {(k, p): baseline(k, p, workdir) for k in kinds_of for p in bodies}
    wants = {
        (v, p): base["upgrade" if v.startswith("upgrade") else "load", p]
        for v in verbs
        for p in bodies
    }
    counts: dict[str, Counter] = {v: Counter() for v in verbs}
    kinds: Counter = Counter()
    forbidden: list[str] = []
    out = workdir / "out"
    out.mkdir()
    slowest = 0.0
    seconds: Counter = Counter()
    cases = 0
    for src, kind, data in damaged_files(rng, bodies, WIDE_KINDS if wide else KINDS):
        if cases == count:
            break
        case = workdir / f"{src.stem}.{cases}.mdl"
        case.write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        chosen = (verbs[0], verbs[1 + cases % (len(verbs) - 1)]) if rotate else verbs
        for verb in chosen:
            start = time.monotonic()
            cls, detail = outcome(verb, case, wants[verb, src], out)
            slowest = max(slowest, time.monotonic() - start)
            seconds[verb] += time.monotonic() - start
            counts[verb][cls] += 1
            if cls in FORBIDDEN:
                forbidden.append(f"{src.name} {kind} #{cases} {verb}: {cls}: {detail}")
        if forbidden and forbidden[-1].split(" #", 1)[1].startswith(f"{cases} "):
            case.rename(workdir / f"forbidden-{case.name}")  # kept for a look
            case.write_bytes(data)
        if hashlib.sha256(case.read_bytes()).hexdigest() != digest:
            forbidden.append(f"{src.name} {kind} #{cases}: the source changed")
        case.unlink()
        kinds[kind] += 1
        cases += 1
    return {
        "cases": cases,
        "kinds": dict(kinds),
        "outcomes": {v: dict(c) for v, c in counts.items()},
        "forbidden": forbidden,
        "slowest_s": round(slowest, 2),
        "seconds": {v: round(t, 1) for v, t in seconds.items()},
    }


if __name__ == "__main__":
    flags = {"--rotate", "--wide"}
    args = [a for a in sys.argv[1:] if a not in flags]
    verbs = tuple(args[3].split(",")) if len(args) > 3 else VERBS
    print(
        json.dumps(
            main(
                int(args[0]),
                int(args[1]),
                Path(args[2]),
                verbs,
                rotate="--rotate" in sys.argv,
                wide="--wide" in sys.argv,
            )
        )
    )
