"""What the preflight walk learnt of each dataset, handed to the readers (``preflight.Findings``):
a tensor's dtype, shape, address and scalar attributes (and a single number's value), so that
reading a checkpoint's structure opens none of its datasets a second time (each open and
attribute read costs 30-50 µs, and a checkpoint has thousands of tensors). A fact that does not
look right is not used: the reader opens the dataset as it always did.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import weakref
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DatasetFacts:
    address: int  # of its object header: equal for two names of one dataset (a tie)
    dtype: np.dtype
    shape: tuple[int, ...] | None  # None: a dataset without data (an empty dataspace)
    attrs: dict[str, Any]  # its scalar strings, numbers and booleans, as Python values
    value: tuple[int | float | bool] | None = None  # (its one number or boolean, of shape ())


@dataclass(frozen=True)
class Facts:
    """``datasets``: by name from the root, as the walk wrote them. ``proven``: the caller
    proves every tensor's dataset itself (the engine's read-back of its own output: by address
    or hash), so a format 0.5 tensor may be taken from its metadata alone. ``links``: an
    outline read (``read_checkpoint(outline=True)``): the names of the file's links, and no
    dataset may be opened; a format 0.5 tensor is taken from its metadata if a link of its
    name exists (``OutlineTooShort`` where a leaf needs its dataset opened). ``described``: a
    legacy file's outline, whose ``datasets`` are read from their headers (``headerfacts``,
    perhaps still being read: ``headerscan.Later``, which waits for them at its first
    look-up). A legacy reader lets go of each dataset's facts as it takes them (``take``).
    ``aliased``: the addresses more than one link names (None: not known), where a reader
    shares one leaf among the names. ``alike``: each leaf decoded is handed to it with its
    name, and the leaf it returns is kept (``compare.check_written``)."""

    datasets: Mapping[str, Any] = field(default_factory=dict)
    proven: bool = False
    alike: Callable[[str, Any], Any] | None = None
    links: AbstractSet[str] | None = None  # (the link table's keys, not a copy of 150k)
    described: bool = False  # a legacy outline's: ``datasets`` read from the headers
    aliased: AbstractSet[int] | None = None

    def dataset(self, name: str) -> DatasetFacts | None:
        return _checked(self.datasets.get(name))

    def take(self, name: str) -> DatasetFacts | None:
        """``dataset``, let go of where ``datasets`` can (a dict, ``headerscan.Later``): a
        legacy reader takes each dataset's facts once, and at 188k datasets they are 40 MB,
        the tree built from them as much again (issue 33). The reader's own facts only."""
        pop = getattr(self.datasets, "pop", None)
        return self.dataset(name) if pop is None else _checked(pop(name, None))


# The fields of a dataset's raw facts (``Shared.fact``'s tuple, ``preflight.Findings``).
ADDRESS, DTYPE, SHAPE, ATTRS, VALUE = range(5)


def _checked(raw: Any) -> DatasetFacts | None:
    """The raw facts of a dataset as ``DatasetFacts``; None where they do not look right."""
    if not isinstance(raw, tuple) or len(raw) not in (4, 5):
        return None
    try:
        dtype = _dtype(raw[DTYPE])
        shape = None if raw[SHAPE] is None else _shape(raw[SHAPE])
        address, attrs = int(raw[ADDRESS]), raw[ATTRS]
    except (TypeError, ValueError):
        return None
    if dtype.kind not in "biuf" or not isinstance(attrs, dict):
        return None
    value = raw[VALUE] if len(raw) > VALUE else None
    if not (
        shape == ()
        and isinstance(value, list)
        and len(value) == 1
        and type(value[0]) is {"b": bool, "f": float}.get(dtype.kind, int)
    ):
        value = None
    return DatasetFacts(address, dtype, shape, attrs, None if value is None else (value[0],))


def _shape(dims: Any) -> tuple[int, ...]:
    """One tuple for equal shapes: a checkpoint's thousands of tensors have a few (a tuple
    each was 6 MiB of a legacy read at 150k tensors, issue 33)."""
    shape = tuple(map(int, dims))
    if len(_SHAPES) < Shared.KEPT:
        return _SHAPES.setdefault(shape, shape)
    return _SHAPES.get(shape, shape)


_SHAPES: dict[tuple[int, ...], tuple[int, ...]] = {}


class Shared:
    """One ``make(key)`` (a str, list, dict) for equal keys of the same ``types`` (True equals
    1), for the facts of many datasets, which readers only read: at 188k datasets a dict and
    a list each cost 60 MB (issue 33). Never for a float (-0.0 equals 0.0)."""

    KEPT = 4096  # distinct keys remembered

    def __init__(self) -> None:
        self.known: dict[tuple[type, Any, tuple], Any] = {}

    def __call__(self, make: type, key: Any, types: tuple = ()) -> Any:
        if float in types:
            return make(key)
        try:
            known = self.known.get((make, key, types))
        except TypeError:  # (a full tensor's shape, a list)
            return make(key)
        if known is None:
            known = make(key)
            if len(self.known) < self.KEPT:
                self.known[make, key, types] = known
        return known

    def fact(
        self, address: int, dtype: str, shape: Any, attrs: dict[str, Any], value: Any = None
    ) -> tuple:
        """A dataset's raw facts (``preflight.Findings.datasets``' shape), its parts shared: a
        tuple (``ADDRESS``, ``DTYPE``, ``SHAPE``, ``ATTRS`` and, for one number or boolean of
        shape ``()``, ``VALUE``: ``[value]``). A tuple, not a dictionary: 150 bytes less a
        dataset, 28 MB at 188k (issue 33)."""
        fact = (
            address,
            self(str, dtype),
            None if shape is None else self(list, tuple(shape)),
            self(dict, tuple(attrs.items()), tuple(map(type, attrs.values()))),
        )
        return fact if value is None else (*fact, [value])


class LinksLater(AbstractSet[str]):
    """The names of the root's links for an outline read (``Facts.links``), taken at their
    first use from ``take`` (the preflight child's, read while this process reads the root's
    attributes: ``format.read.read_outline``); ``found()``: each name and the address of its
    object. ``OutlineTooShort`` when ``take`` gives none."""

    def __init__(self, take: Callable[[], dict[str, int] | None]) -> None:
        self._take: Callable[[], dict[str, int] | None] | None = take
        self._found: dict[str, int] | None = None

    def found(self) -> dict[str, int]:
        if self._found is None:
            take, self._take = self._take, None
            found = None if take is None else take()
            if found is None:
                raise OutlineTooShort("the root's links")
            self._found = found
        return self._found

    def __contains__(self, name: object) -> bool:
        return name in self.found()

    def __iter__(self) -> Iterator[str]:
        return iter(self.found())

    def __len__(self) -> int:
        return len(self.found())


def link_names(links: AbstractSet[str]) -> AbstractSet[str]:
    """``Facts.links`` as a plain set of names (a ``LinksLater``'s taken now)."""
    return links.found().keys() if isinstance(links, LinksLater) else links


class Deferred(Mapping[str, Any]):
    """Datasets' facts collected at the first look-up (``collected``): a legacy reader decodes
    its spec first, and holds the facts only once the pickle's records have been let go. Both
    at once were the 1.9 → 2.10 rewrite's peak at 150k tensors (issue 33)."""

    def collected(self) -> dict[str, tuple]:
        raise NotImplementedError

    def __getitem__(self, name: str) -> tuple:
        return self.collected()[name]

    def pop(self, name: str, default: Any = None) -> Any:
        """The facts of ``name``, let go of (``Facts.take``)."""
        return self.collected().pop(name, default)

    def get(self, name: str, default: Any = None) -> Any:
        return self.collected().get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self.collected())

    def __len__(self) -> int:
        return len(self.collected())


class FromFiles(Deferred):
    """The datasets' facts the preflight children wrote (``marshal``), read from their files
    at the first look-up (``Deferred``; the files are this object's own descriptors, closed
    once read or with it)."""

    def __init__(self, fds: list[int]) -> None:
        self._fds = fds
        self._datasets: dict[str, tuple] | None = None
        self._closing = weakref.finalize(self, _close_all, fds)

    def collected(self) -> dict[str, tuple]:
        if self._datasets is None:
            datasets: dict[str, tuple] = {}
            try:
                for fd in self._fds:
                    with os.fdopen(os.dup(fd), "rb") as fh:
                        fh.seek(0)
                        raw = fh.read()
                    datasets.update(marshal.loads(raw) if raw else {})
                    del raw
            finally:
                self._closing()
            self._datasets = datasets
        return self._datasets


class LinksFile:
    """Every hard link of the file, as a full walk's children wrote them
    (``walkreads.HardLinks``): name -> the address of the object it names, HDF5's walk of the
    links (``io.object_addresses``) without walking them again (1.8 s at 188k links). Read at
    the first call, once (the files are this object's own descriptors); None where they are
    not all there (a group's), or not as written."""

    def __init__(self, fds: list[int]) -> None:
        self._fds = fds
        self._closing = weakref.finalize(self, _close_all, fds)

    def __call__(self) -> dict[str, int] | None:
        found: dict[str, int] = {}
        try:
            for fd in self._fds:
                with os.fdopen(os.dup(fd), "rb") as fh:
                    fh.seek(0)
                    count = len(found)
                    while type(piece := marshal.load(fh)) is dict:
                        found.update(piece)
                    if type(piece) is not int or piece != len(found) - count:
                        return None
        except (OSError, EOFError, ValueError, TypeError):
            return None
        finally:
            self._closing()
        return found if all(type(k) is str and type(v) is int for k, v in found.items()) else None


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class OutlineTooShort(Exception):
    """An outline read met what only the full walk may read (a dataset to open, a legacy
    format, a link that is no leaf's): ``read_checkpoint`` reads the file in full instead."""


_DTYPES: dict[str, np.dtype] = {}


def _dtype(text: str) -> np.dtype:
    """``np.dtype(text)``, remembered: a checkpoint has a handful (1 µs a tensor otherwise)."""
    known = _DTYPES.get(text) if isinstance(text, str) else None
    if known is None:
        known = np.dtype(text)
        if isinstance(text, str) and len(_DTYPES) < 256:
            _DTYPES[text] = known
    return known
