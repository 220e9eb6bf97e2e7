"""Read a file's HDF5 metadata once in a child (``children.start``) before this one touches it.

Python checks stop most damaged files with one line (``boundary``, ``budgets``, ``io.damaged``),
but some damage makes HDF5 itself crash or loop inside its C code, where no exception or budget
can reach: a flipped byte in a global-heap reference sent ``H5Aread`` of a variable-length string
into an endless loop (fuzz seed 5), a damaged attribute crashed it with SIGSEGV (seed 24). So the
metadata walk every reader needs anyway (every link, every attribute value, every chunk index) is
done first in a child process. The child reports progress through a pipe; the parent refuses
the file (exit 2) if the child dies by a signal or makes no progress for :data:`STALL_SECONDS`
(10, or ``CKPT_MIGRATE_STALL_SECONDS``: raise it for metadata on a filesystem that can pause
for longer). A legitimate file costs one extra pass over its metadata (benchmarks/README.md);
of its data, only datasets of one number (shape ``()``, never chunked) are read, their values
handed to the reader.

The children also take the boundary's checks (``boundary``: links, types, storage
descriptions) and walk the chunk indexes, measuring what each dataset stores (the
decompression budget, and stored bytes inside the file). A clean walk hands the total and each
dataset's facts (``Findings``) to the parent, and where every stored piece lies to ``overlaps``
(``overlaps.remember``), so that the parent neither repeats those checks nor walks a chunk
index; a walk that met a problem leaves naming it to the parent's ``check_self_contained``.

A walk comes in two parts. The first reads every object and attribute; the second walks the
chunk indexes, which a reader of the structure never touches (chunked datasets are never
scalars, the only datasets a reader decodes). ``preflight(path, defer=True)`` returns after
the first part with the second still running (``Findings.rest``): an upgrade by clone, which
reads no chunk index, edits its output meanwhile and waits for the verdict only before
publishing it (``H5Handle.walked``; every read of tensor data waits too).
"""

from __future__ import annotations

import atexit
import contextlib
import marshal
import os
import select
import signal
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import h5py

from ckpt_migrate.errors import CkptIOError, CorruptCheckpointError
from ckpt_migrate.format.h5 import children, linktable, overlaps, preflight_outline
from ckpt_migrate.format.h5.boundary import link_problem
from ckpt_migrate.format.h5.facts import FromFiles, LinksFile, Shared
from ckpt_migrate.format.h5.identity import file_identity
from ckpt_migrate.format.h5.io import forbid_plugin_loading, prefetch
from ckpt_migrate.format.h5.metadata_cache import bounded_metadata_cache
from ckpt_migrate.format.h5.walkreads import (
    END,
    FIRST,
    LINKS,
    OBJECTS,
    ROOTED,
    SECOND,
    TICK,
    WALKED,
    WALKED_EVERY,
    HardLinks,
    Heard,
    Refused,
    dataset_facts,
    measure_all,
    named_groups,
    read_attributes,
    read_root_attributes,
)
from ckpt_migrate.format.progress import Progress

Scope = Literal["full", "outline", "storage", "root", "spec"]
STALL_SECONDS = float(os.environ.get("CKPT_MIGRATE_STALL_SECONDS", "10"))
FIX = "the file is damaged; use another copy"


@dataclass(frozen=True)
class Findings:
    """What a clean walk learnt: the bytes the datasets store, and each dataset's facts (by
    its name from the root: ``facts.Shared.fact``'s tuple of its address, numpy dtype string,
    shape or None, ``{attribute: scalar value}``, and ``[value]`` for a number or boolean of
    shape ``()``) for the readers, which then need not open it. A legacy reader takes each
    as it builds its leaf (``Facts.take``): they are the reader's, read once. ``rest``: the
    second part of the walk, still running (``preflight(defer=True)``); until it has finished
    (``Rest.finish``), ``stored`` counts the chunked datasets by their declared bytes (an
    estimate: LZ4 may store less, edge chunks more)."""

    stored: int
    datasets: Mapping[str, tuple]  # (read at the first look-up: ``facts.Deferred``)
    rest: Rest | None = None
    links: LinksFile | None = field(default=None, compare=False)  # ``H5Handle.addresses``


def preflight(
    path: Path, *, defer: bool = False, scope: Scope = "full", progress: Progress | None = None
) -> Findings | None:
    """Raise ``CorruptCheckpointError`` if reading ``path``'s metadata crashes or hangs HDF5.

    ``scope``: what the caller will read through HDF5, and so what the child tries first:
    ``"full"`` every object (below), ``"outline"`` the root's attributes and every link but
    no object behind one, ``"storage"`` the outline, then as its second part what a copy of
    the datasets would carry out of the file, from their headers' bytes (``storagescan``: an
    upgrade that edits only the root), ``"root"`` only the release's root attributes
    (``preflight_outline.ROOT_NAMES``), ``"spec"`` those and the ``__spec__``, then as its
    second part the root's links (``plan_from_root``)
    (``preflight_outline``: one child; ``Findings.datasets`` is then empty).

    Returns what the walk found (``Findings``), or None when a child met a problem it does
    not name (a damaged structure, a budget exceeded): the parent's own checks, which are safe
    to run once the children survived the same walk, then say what it is. ``defer``: return
    after the walk's first part (the module's docstring).

    The objects are dealt out to children (``_workers``: one per core, at most two): the walk
    is HDF5 work on one object at a time. A walk begun by :func:`start` for the same, unchanged
    file is collected instead (``progress``: told of the first part's objects walked)."""
    try:
        walk = _early.pop(file_identity(path), None) if scope == "full" else None
    except OSError:  # gone: the reader names it
        walk = None
    walk = walk or _Walk.begin(path, scope)
    walk.progress = progress
    try:
        if defer and (first := walk.follow(path, FIRST)) is not None:
            walk.report(done=True)
            return Findings(first, walk.facts_found(), Rest(walk), walk.links_found())
        found = walk.conclude(path)
        walk.report(done=True)
    except BaseException:
        walk.cancel()
        raise
    walk.cancel()  # (ended: closes the pipe and the facts files)
    return found


class Rest:
    """The second part of a walk, running on (``Findings.rest``)."""

    def __init__(self, walk: _Walk) -> None:
        self._walk: _Walk | None = walk

    def finish(self, path: Path) -> int | None:
        """Wait for it: the bytes the datasets store, None when a child met a problem (the
        caller names it), ``CorruptCheckpointError`` if HDF5 crashed or hung."""
        walk, self._walk = self._walk, None
        if walk is None:
            raise RuntimeError("the walk was already finished or cancelled")
        try:
            found = walk.conclude(path, facts=False)  # (the reader took them after the first part)
        finally:
            walk.cancel()
        return None if found is None else found.stored

    def links(self, path: Path) -> dict[str, int] | None:
        """The root's links as an outline child read them (``preflight_outline``: each name
        and the address of its object), once it has said so; None when it read none, ended or
        stalled first, or wrote what they are not (the caller then reads them itself)."""
        walk = self._walk
        if walk is None or walk.links < 0:
            return None
        try:
            count = walk.follow(path, LINKS)
            with os.fdopen(os.dup(walk.links), "rb") as fh:
                fh.seek(0)
                found = marshal.loads(fh.read()) if count is not None and count >= 0 else None
        except (CorruptCheckpointError, OSError, EOFError, ValueError, TypeError):
            return None
        if type(found) is not dict or len(found) != count:
            return None
        return found if all(type(k) is str and type(v) is int for k, v in found.items()) else None

    def cancel(self) -> None:
        if self._walk is not None:
            self._walk.cancel()
            self._walk = None


def start(path: Path) -> tuple[int, ...] | None:
    """Begin ``preflight(path)`` now, for a caller that has other work (its imports) to do
    before it reads ``path``; a file that cannot be opened, or walked for want of a process,
    is left to the reader to name. Returns the walk's key for ``cancel_started`` (None)."""
    try:
        identity = file_identity(path)
        if not h5py.is_hdf5(str(path)):
            return None
    except OSError:
        return None
    if identity not in _early:
        try:
            _early[identity] = _Walk.begin(path)
        except CkptIOError:
            return None
    return identity


def cancel_started(key: tuple[int, ...] | None) -> None:
    """End the walk ``start`` began under ``key`` if no read has collected it (a caller that
    gave up before reading the file leaves no children walking it)."""
    walk = None if key is None else _early.pop(key, None)
    if walk is not None:
        walk.cancel()


@dataclass
class _Walk:
    """The children walking one file, the pipe they report through, and what they said."""

    pids: list[int]
    read_end: int
    facts: list[int]  # one anonymous file per child, where it writes its datasets' facts
    # one per child too, where it writes where the stored pieces of its objects lie and the
    # objects' addresses (``overlaps.remember``), and the file's identity when the walk began
    extents: list[int] = field(default_factory=list)
    identity: tuple[int, ...] | None = None
    heard: Heard = field(default_factory=Heard)  # what the children said
    links: int = -1  # an outline child's: where it writes the root's links (``Rest.links``)
    hard_links: list[int] = field(default_factory=list)  # a full walk's (``Findings.links``)
    progress: Progress | None = None  # told of the stage the walk is at (``Heard.stage``)
    children: int = 0

    @classmethod
    def begin(cls, path: Path, scope: Scope = "full") -> _Walk:
        with children.forking:
            return cls._begin(path, scope)

    @classmethod
    def _begin(cls, path: Path, scope: Scope) -> _Walk:
        read_end, write_end = os.pipe()
        walk = cls([], read_end, [])
        workers = _workers(path, scope)
        # (where the other children name the groups they meet, for the first to walk: ``_walk``)
        groups = os.pipe() if workers > 1 else (-1, -1)
        try:
            with contextlib.suppress(OSError):  # (gone: the reader names it)
                walk.identity = file_identity(path)
            if scope in ("outline", "storage", "spec"):
                walk.links = children.anonymous_file()
            for part in range(workers):
                walk.facts.append(children.anonymous_file())
                walk.extents.append(children.anonymous_file())
                if scope == "full":
                    walk.hard_links.append(children.anonymous_file())
                mine, other = (groups[1], groups[0]) if part else groups
                fds = [write_end, walk.facts[part], walk.extents[part], mine, walk.links]
                fds.append(walk.hard_links[part] if scope == "full" else -1)
                pid = children.start(_child, path, (scope, part, workers), fds)
                if pid == 0:  # a forked child: walk, report, never return into the caller's code
                    work = partial(_child, path, scope, part, workers, *fds)
                    children.end_child(work, close=(read_end, other))
                walk.pids.append(pid)
                walk.children = len(walk.pids)
                children.release()
        except BaseException:
            walk.cancel()
            raise
        finally:
            for fd in (write_end, *groups):
                if fd >= 0:
                    os.close(fd)
        return walk

    def follow(self, path: Path, until: bytes | None) -> int | None:
        """Read the children's ticks and words until each has said ``until`` (then return the
        bytes stored that they reported with it) or all have closed the pipe (None). Raises
        ``CorruptCheckpointError`` if they make no progress for :data:`STALL_SECONDS`."""
        while True:
            if until is not None:
                said = self.heard.said(until)
                if len(said) == len(self.pids):
                    return sum(sum(int(n) for n in w.split(b",")) for w in said)
            ready, _, _ = select.select([self.read_end], [], [], STALL_SECONDS)
            if not ready:
                raise CorruptCheckpointError(
                    path,
                    f"HDF5 made no progress reading the file's metadata for {STALL_SECONDS:.0f} s",
                    FIX,
                )
            data = os.read(self.read_end, 65536)
            if not data:
                return None
            self.heard.take(data)
            self.report(waiting=until is None)

    def report(self, done: bool = False, waiting: bool = False) -> None:
        """Tell ``progress`` how far the walk is (``Heard.tell``)."""
        if self.progress is not None:
            self.heard.tell(self.progress, self.children, done=done, waiting=waiting)

    def conclude(self, path: Path, facts: bool = True) -> Findings | None:
        """Wait for every child to end and judge the walk: ``Findings`` (without the datasets'
        facts unless ``facts``), or None for a problem the parent's own checks are to name;
        ``CorruptCheckpointError`` for a crash or a hang."""
        self.follow(path, None)
        statuses = [os.waitpid(pid, 0)[1] for pid in self.pids]
        self.pids = []
        for status in statuses:
            if os.WIFSIGNALED(status):
                name = signal.Signals(os.WTERMSIG(status)).name
                raise CorruptCheckpointError(
                    path, f"HDF5 crashed ({name}) reading the file's metadata", FIX
                )
        firsts, seconds = self.heard.said(FIRST), self.heard.said(SECOND)
        if any(os.WEXITSTATUS(status) for status in statuses) or not (
            len(firsts) == len(seconds) == len(statuses)
        ):
            return None
        stored = sum(int(w.split(b",")[0]) for w in firsts)
        stored += sum(int(w) for w in seconds)
        self._remember_extents(path)
        if not facts:
            return Findings(stored, {})
        return Findings(stored, self.facts_found(), links=self.links_found())

    def facts_found(self) -> FromFiles:
        return FromFiles([os.dup(fd) for fd in self.facts])

    def links_found(self) -> LinksFile | None:
        return LinksFile([os.dup(fd) for fd in self.hard_links]) if self.hard_links else None

    def _remember_extents(self, path: Path) -> None:
        """Hand ``overlaps`` where the children found the stored pieces, and the objects (a
        reader's chunk checks then do not walk every index again), if the file is still the
        one walked; a child's account cut short leaves ``overlaps`` to walk it itself."""
        data, objects = overlaps.Extents(), array("Q")
        try:
            if self.identity is None or file_identity(path) != self.identity:
                return
            for fd in self.extents:
                with os.fdopen(os.dup(fd), "rb") as fh:
                    fh.seek(0)
                    raw = fh.read()
                at = data.extend_from_bytes(raw)
                if (len(raw) - at) % 8:
                    return
                objects.frombytes(raw[at:])
        except (OSError, ValueError):
            return
        overlaps.remember(self.identity, data, objects)

    def cancel(self) -> None:
        """No child may walk on after its parent has gone (Ctrl-C) or given up on it.
        Idempotent: every child is waited for, every descriptor closed."""
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in self.pids:
            os.waitpid(pid, 0)
        self.pids = []
        for fd in [self.read_end, *self.facts, *self.extents, *self.hard_links, self.links]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.read_end, self.facts, self.extents, self.links = -1, [], [], -1
        self.hard_links = []


_early: dict[tuple[int, ...], _Walk] = {}  # by the file's identity: a changed file is walked anew


@atexit.register
def _cancel_early() -> None:
    for key in list(_early):
        cancel_started(key)


WORKERS = max(1, min(2, len(os.sched_getaffinity(0))))
ONE_CHILD_RATIO = 1024  # (a fork copies the caller's page tables: bench_caller_size.py)


def _workers(path: Path, scope: Scope) -> int:
    """One child where the caller holds ``ONE_CHILD_RATIO`` times the file or more."""
    with contextlib.suppress(OSError):  # (gone: the reader names it)
        if scope == "full" and os.stat(path).st_size * ONE_CHILD_RATIO > children.resident():
            return WORKERS
    return 1


def _child(path: Path, scope: Scope, part: int, parts: int, tick: int, *fds: int) -> None:
    """A child's walk, forked or spawned (``fds``: the files ``_Walk._begin`` gives it)."""
    facts, extents, groups, links, hard_links = fds
    if scope == "full":
        _walk(path, tick, part, parts, facts, extents, hard_links, groups)
    else:
        preflight_outline.walk(path, tick, scope, links)


def _walk(
    path: Path,
    tick: int,
    part: int,
    parts: int,
    facts_fd: int,
    extents_fd: int,
    links_fd: int,
    groups_fd: int = -1,
) -> None:
    """Walk part ``part`` of ``parts``: read the metadata of every ``parts``-th object the
    root links, from the ``part``-th; part 0 also reads the root's attributes, writes the
    root's hard links to ``links_fd`` (``Findings.links``), and walks every object inside a
    group, each once (the other parts name the groups they meet to ``groups_fd``, which part 0
    reads after its own share). Write the objects' facts (``Findings.datasets``) to
    ``facts_fd`` and say ``M<stored>,<declared>;`` (the bytes stored by the datasets measured
    so far, and declared by those left for the second part); then walk the chunk indexes left,
    write where the stored pieces of these objects lie, and the objects' addresses (the
    root's in part 0), to ``extents_fd`` and say ``=<stored>;``."""
    forbid_plugin_loading()
    file_bytes = os.stat(path).st_size
    stored = declared = 0
    pieces = overlaps.Extents()
    objects: set[int] = set()
    facts: dict[str, tuple] = {}
    shared = Shared()  # (handed over by ``marshal``, which keeps an object shared once)
    # The chunked datasets whose index the second part walks, by name: an open dataset keeps its
    # header and index in memory (41 MB per thousand datasets of a 12k-tensor checkpoint, issue
    # 33), so they are opened again then, one at a time.
    later: list[tuple[bytes, int]] = []  # (and the bytes each declares)
    # HDF5's metadata cache capped as the readers cap theirs: at its default (32 MiB of headers on
    # disk, several times that decoded) each child grew by 7.5 KB per dataset, to 600-760 MB at 150k
    # tensors (issue 33).
    with bounded_metadata_cache(h5py.File(path, "r", locking=False, rdcc_nbytes=0)) as f:
        if part == 0:
            read_root_attributes(f, path, tick)
        else:  # (the root's link nodes read ahead for both children's walks of them, below)
            linktable.prefetch_root(f, path)
        mine: list[tuple[bytes, int]] = []  # (name, object address): every parts-th object
        every = HardLinks(links_fd)
        within = b""  # (the group whose links ``take`` is given, with its "/")

        def take(name: bytes, info: h5py.h5l.LinkInfo) -> None:
            if link_problem(path, "", info) is not None:
                raise Refused  # a link out of the file: never followed
            if part == 0 and not within and info.type == h5py.h5l.TYPE_HARD:
                every.add(name, info.u)
            if info.type == h5py.h5l.TYPE_HARD and info.u not in objects:
                objects.add(info.u)  # an object under several names (a tie) counts once
                if within or len(objects) % parts == part:  # (a group's: all its walker's)
                    mine.append((within + name, info.u))
                if len(objects) % 1000 == 0:  # 150k links take seconds on a busy machine
                    os.write(tick, ROOTED if part == 0 and not within else TICK)

        # The root's own links, in HDF5's own order: by name, HDF5 first builds a sorted table
        # of a group's links (a root of 150k links took it longer than the stall limit on a
        # busy machine); not ``visit``, which reads each object's header to know whether it is
        # a group (0.12 s for 7,647 links, 1.4 s for 188k: 5 ms and 0.13 s this way).
        f.id.links.iterate(take, info=True, order=h5py.h5.ITER_NATIVE)
        if part == 0:
            os.write(tick, b"%s%d%s" % (OBJECTS, len(objects), END))
        prefetch(path, [address for _, address in mine])

        def enter(group: h5py.h5g.GroupID, name: bytes) -> None:
            """Its links' objects added to ``mine`` (this walk's, here in part 0)."""
            nonlocal within
            within = name + b"/"
            group.links.iterate(take, info=True, order=h5py.h5.ITER_NATIVE)
            within = b""
            every.incomplete = True  # (its links are not the root's)

        i = 0
        while i < len(mine) or (part == 0 and groups_fd >= 0):
            if i == len(mine):  # the others' shares walked: the groups they met
                for name in named_groups(groups_fd):
                    enter(h5py.h5o.open(f.id, name), name)
                groups_fd = -1
                continue
            name, address = mine[i]
            i += 1
            obj = h5py.h5o.open(f.id, name)
            if not isinstance(obj, h5py.h5d.DatasetID):
                read_attributes(obj, tick)
                if isinstance(obj, h5py.h5g.GroupID) and part == 0:
                    enter(obj, name)
                elif isinstance(obj, h5py.h5g.GroupID):  # part 0 walks it (each object once)
                    os.write(groups_fd, name + b"\0")
                    every.incomplete = True
            else:
                at = address, path, file_bytes, tick, pieces, shared
                fact, size, chunked = dataset_facts(obj, *at)
                facts[name.decode("utf-8", "surrogateescape")] = fact
                if chunked:
                    later.append((name, size))
                    declared += size
                else:
                    stored += size
            if i % WALKED_EVERY == 0:  # progress
                os.write(tick, WALKED)
        if part and groups_fd >= 0:
            os.close(groups_fd)  # (part 0 reads on)
        every.close()
        with os.fdopen(os.dup(facts_fd), "wb") as fh:
            fh.write(marshal.dumps(facts))
        os.write(tick, b"%s%d,%d%s" % (FIRST, stored, declared, END))
        os.nice(10)  # the rest runs beside the parent's work, which comes first
        rest = measure_all(f, later, file_bytes, pieces, tick)
        addresses = array("Q", [address for _, address in mine])
        if part == 0:
            addresses.append(h5py.h5o.get_info(f.id).addr)
    with os.fdopen(os.dup(extents_fd), "wb") as fh:
        fh.write(pieces.to_bytes() + addresses.tobytes())
    os.write(tick, b"%s%d%s" % (SECOND, rest, END))
