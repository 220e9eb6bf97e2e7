"""The headers of a legacy checkpoint's datasets scanned for their facts (``headerfacts``),
on two cores where there are many (issue 33): ``format.read.read_outline`` of a legacy file.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import signal
import struct
from collections.abc import Iterable
from functools import partial
from pathlib import Path

from ckpt_migrate.format.h5 import children
from ckpt_migrate.format.h5.facts import Deferred, OutlineTooShort
from ckpt_migrate.format.h5.fractalheap import Unknown
from ckpt_migrate.format.h5.headerfacts import HeaderReader
from ckpt_migrate.format.h5.headers import HeaderError
from ckpt_migrate.format.h5.storagescan import Undecided

PARALLEL = 4_000  # datasets from which a second process scans half (12k: plan 1.22 -> 0.97 s)
WORKERS = max(1, min(2, len(os.sched_getaffinity(0))))

Found = tuple[dict[str, tuple], int]  # (facts by name, bytes stored)


def scan(path: Path, datasets: dict[str, int], base: int = 0) -> Found | None:
    """The facts of every dataset of ``datasets`` (name -> its header's address relative to
    ``base``, the superblock's) in ``preflight.Findings``' shape, and the bytes they store (each
    object once: a tie's names share it); None when one is not answered (``headerfacts``'
    docstring says which). A :class:`Scan` collected at once."""
    begun = Scan(path, datasets, base, share=0.5)
    try:
        return begun.result()
    finally:
        begun.cancel()


class Scan:
    """A scan begun, collected by :meth:`result` (``scan``'s answer).

    From :data:`PARALLEL` datasets on, with a second core, a child (forked, or a new
    interpreter from a caller of ``children.SPAWN_RESIDENT`` or more) begins at once on the
    ``share`` of the objects that ``_part`` deals it (a tie's names stay together), and
    ``result`` reads the rest in this process: the work is Python's, about 28 µs a dataset,
    5.3 s at 188k on one core. A caller with other work to do meanwhile (the legacy reader
    decodes the spec) gives the child the larger share."""

    def __init__(self, path: Path, datasets: dict[str, int], base: int, share: float) -> None:
        self.path, self.datasets, self.base = path, datasets, base
        self.pid: int | None = None
        self.read_end = -1
        self.cut = int(share * 256)
        if len(datasets) < PARALLEL or WORKERS < 2:
            return
        theirs = self._dealt(child=True)
        dealt = _dealt_file(theirs) if children.spawns() else -1  # (else forked, as below)
        with children.forking:
            read_end, write_end = os.pipe()
            try:
                if dealt < 0:
                    pid = children.fork()
                else:
                    pid = children.spawn(_hand_over_dealt, path, (base,), (write_end, dealt))
            except OSError:  # (no process to spare: this one scans them all)
                for fd in (read_end, write_end, dealt):
                    if fd >= 0:
                        os.close(fd)
                return
            if pid == 0:  # the child: scan its part, hand it over, never return into the caller
                work = partial(_hand_over, path, theirs, base, write_end)
                children.end_child(work, (read_end,))
            self.pid, self.read_end = pid, read_end
            os.close(write_end)
            if dealt >= 0:
                os.close(dealt)
            try:  # (within ``forking``: what ``fork`` held is this thread's to put back)
                children.release()
            except BaseException:  # (a Ctrl-C held since the fork: no child left scanning)
                self.cancel()
                raise

    def result(self) -> Found | None:
        if self.pid is None:
            return _scan(self.path, self.datasets.items(), self.base)
        try:
            mine = _scan(self.path, self._dealt(child=False), self.base)
            if mine is None:
                return None
            # (loaded as read: the bytes whole beside what they load, and a list of the
            # child's names, were 7 MiB of a legacy read-back's peak at 150k, issue 33)
            with os.fdopen(os.dup(self.read_end), "rb") as handed:
                try:
                    other = marshal.load(handed)
                except (EOFError, ValueError, TypeError):
                    other = None
            status = self.cancel(kill=False)  # (it has handed its part over: it ends by itself)
        finally:
            self.cancel()
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            return None
        if other is None:
            return None
        # The child's facts named by this process's names (its own would be 9 MB more at
        # 150k), in another order than ``datasets``': the facts are looked up by name
        theirs = (n for n, a in self.datasets.items() if self._childs(a))
        try:
            mine[0].update(zip(theirs, other[0], strict=True))
        except ValueError:  # (not as many as were dealt to it)
            return None
        return mine[0], mine[1] + other[1]

    def _dealt(self, child: bool) -> list[tuple[str, int]]:
        """The (name, address) of the datasets ``_part`` deals to the child, or to this
        process, in ``datasets``' order (the child hands its facts over in it). A list: made
        as the scan goes, the part's tuples landed among the facts, 3 MB more at 150k."""
        return [(n, a) for n, a in self.datasets.items() if self._childs(a) == child]

    def _childs(self, address: int) -> bool:
        """Whether ``_part`` deals the object at ``address`` to the child."""
        return _part(address) < self.cut

    def cancel(self, kill: bool = True) -> int:
        """Wait for the child to end (``kill``: end it first, the caller gives up on it); its
        exit status (0 when there is none). Idempotent."""
        if self.pid is None:
            return 0
        pid, self.pid = self.pid, None
        os.close(self.read_end)
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return os.waitpid(pid, 0)[1]


def _hand_over(path: Path, datasets: list[tuple[str, int]], base: int, write_end: int) -> None:
    """(The child's scan:) the facts of ``datasets``, in their order and unnamed, and the
    bytes they store, to ``write_end``."""
    found = _scan(path, datasets, base)
    with os.fdopen(write_end, "wb") as out:
        out.write(marshal.dumps(found and (list(found[0].values()), found[1])))


def _dealt_file(datasets: list[tuple[str, int]]) -> int:
    """An anonymous file of ``datasets`` (by ``marshal``), for a spawned child to read: a
    forked one has them in memory (written and read back, 0.1 s more at 150k)."""
    fd = children.anonymous_file()
    with os.fdopen(os.dup(fd), "wb") as out:
        marshal.dump(datasets, out)
    return fd


def _hand_over_dealt(path: Path, base: int, write_end: int, dealt: int) -> None:
    """(A spawned child's scan:) :func:`_hand_over` of the datasets ``_dealt_file`` wrote."""
    with os.fdopen(dealt, "rb") as fh:
        fh.seek(0)
        datasets = marshal.load(fh)
    _hand_over(path, datasets, base, write_end)


class Later(Deferred):
    """The facts of a scan begun (``Scan``), collected at the first look-up (``Deferred``).
    ``OutlineTooShort`` at every look-up when the scan does not answer."""

    def __init__(self, begun: Scan) -> None:
        self.begun = begun
        self.found: Found | None = None
        self.asked = False

    def collected(self) -> dict[str, tuple]:
        if not self.asked:
            self.asked = True
            self.found = self.begun.result()
        if self.found is None:
            raise OutlineTooShort("the datasets' headers")
        return self.found[0]

    def stored(self) -> int:
        """The bytes the datasets store."""
        self.collected()
        assert self.found is not None  # (else ``collected`` raised)
        return self.found[1]


def _part(address: int) -> int:
    """A byte that deals addresses out evenly, whatever their alignment (Fibonacci hashing)."""
    return (address * 0x9E3779B1 >> 16) & 0xFF


def _scan(path: Path, datasets: Iterable[tuple[str, int]], base: int) -> Found | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = HeaderReader(fd, os.fstat(fd).st_size, base)
        facts: dict[str, tuple] = {}
        known: dict[int, tuple] = {}
        stored = 0
        for name, address in datasets:
            fact = known.get(address)
            if fact is None:
                try:
                    fact, size_stored = reader.dataset(address)
                except (Undecided, HeaderError, Unknown, struct.error, ValueError, IndexError):
                    return None
                known[address] = fact
                stored += size_stored
            facts[name] = fact
        return facts, stored
    finally:
        os.close(fd)
