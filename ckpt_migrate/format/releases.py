"""The known releases, their on-disk format, and how a file tells which one wrote it.

Facts from FORMAT.md §1.1–1.3: formats 0.1–0.3 were written by 1.7–1.9 without
``__cstorch_version__``; 2.0 wrote 0.4 without it; 2.1–2.4 wrote 0.4 with it; 2.5–2.10 write 0.5
(JSON treespec, ``__TYPE__`` tags).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ckpt_migrate.errors import CorruptCheckpointError, NewerThanToolError, UsageError


@dataclass(frozen=True)
class Release:
    name: str  # "2.10"
    format: float  # on-disk format version, the root attribute __version__
    cstorch_version: str | None  # __cstorch_version__ this release writes; None before 2.1
    spec_encoding: str  # "dill-treespec" (hex of a pickled torch TreeSpec) or "json-treespec"
    type_tags: str  # how a dataset says what it holds
    spec_torch: str  # which torch TreeSpec the pickle imitates: "plain" (<=2.0) or "dataclass"

    @property
    def version(self) -> Version:
        return Version(self.name)

    @property
    def legacy(self) -> bool:
        return self.format < 0.5


_FLAGS = "none: is_none/is_string/is_scalar/is_constructible/filepath flags"
_H5_NUMPY = "__H5_TYPE__; torch tensors tagged NumpyArrayH5Type"
_H5 = "__H5_TYPE__; torch tensors tagged TorchTensorH5Type"
_TYPE = "__TYPE__ = serializer class name"

RELEASES: tuple[Release, ...] = (
    Release("1.7", 0.1, None, "dill-treespec", _FLAGS, "plain"),
    Release("1.8", 0.2, None, "dill-treespec", _FLAGS, "plain"),
    Release("1.9", 0.3, None, "dill-treespec", _H5_NUMPY, "plain"),
    Release("2.0", 0.4, None, "dill-treespec", _H5, "plain"),
    *(Release(f"2.{m}", 0.4, f"2.{m}.0", "dill-treespec", _H5, "dataclass") for m in range(1, 5)),
    *(Release(f"2.{m}", 0.5, f"2.{m}.0", "json-treespec", _TYPE, "none") for m in range(5, 11)),
)
BY_NAME = {r.name: r for r in RELEASES}
LATEST = RELEASES[-1]
KNOWN_FORMATS = (0.1, 0.2, 0.3, 0.4, 0.5)
# A 0.5 file without __cstorch_version__ (the real loader does not need it) is taken as the first
# release of that format, so an upgrade still walks every later hop.
# Only upgrade, plan and check take --from: the hint names them, so it is true wherever it shows.
FROM_HINT = "name the release with --from R (upgrade, plan, check)"
_FORMAT_FALLBACK = {0.1: "1.7", 0.2: "1.8", 0.3: "1.9", 0.4: "2.0", 0.5: "2.5"}


def known_names() -> str:
    return ", ".join(r.name for r in RELEASES)


def get(name: str) -> Release:
    """A release by name: ``"2.10"``, ``"2.10.0"``, ``"cs-2.1"`` or ``"latest"``."""
    text = name.strip().lower().removeprefix("cs-")
    if text in ("latest", "current"):
        return LATEST
    try:
        v = Version(text)
    except InvalidVersion:
        v = None
    if v is not None and f"{v.major}.{v.minor}" in BY_NAME:
        return BY_NAME[f"{v.major}.{v.minor}"]
    if v is not None and v > LATEST.version:
        raise UsageError(
            None,
            f"release {name!r} is newer than this ckpt-migrate knows (newest {LATEST.name})",
            "upgrade ckpt-migrate, or name a known release",
        )
    raise UsageError(None, f"unknown release {name!r}", f"known releases: {known_names()}, latest")


_F32 = struct.Struct("<f")


def format_matches(a: float, b: float) -> bool:
    """Equal, or equal as float32: a script may have stored ``np.float32(0.4)``."""
    if abs(a - b) < 1e-9:
        return True
    return max(abs(a), abs(b)) < 1e3 and _F32.pack(a) == _F32.pack(b)


@dataclass(frozen=True)
class Detected:
    """What a file's root attributes say about who wrote it."""

    format: float
    cstorch_version: str | None
    release: Release | None  # None: a release newer than this tool knows
    # the release the root alone names (``__cstorch_version__``, or format 0.5's first), where
    # ``release`` differs: by --from, or by ``__metadata__``
    said: Release | None = None
    # the last ``__metadata__`` entry's version, where it chose ``release`` (``trainer_release``)
    metadata_version: str | None = None

    @property
    def reading(self) -> str | None:
        """Why the file is read as another release than its stamp says (None: it is not)."""
        if self.said is None or self.release is None:
            return None
        if self.metadata_version is None:
            return (
                f"the file says it is release {self.said.name} (__cstorch_version__ "
                f"{self.cstorch_version}); it is read as {self.release.name}, as --from says, "
                "and the hops start there"
            )
        writer = (
            f"in a file cerebras.pytorch {self.cstorch_version} wrote"
            if self.cstorch_version
            else f"in a format {self.format} file that names no release (else read as "
            f"{self.said.name})"
        )
        who = (
            f"Model Zoo's converter to cs-{self.release.name}"
            if self.cstorch_version
            else "Model Zoo's Trainer"
        )
        return (
            f"its model is release {self.release.name} {writer}: the last __metadata__ entry "
            f"says version {self.metadata_version!r}, as {who} writes it and as Model Zoo "
            f"reads it; it is read as "
            f"{self.release.name} and the hops start there (--from {self.said.name} reads it as "
            f"{self.said.name})"
        )

    @property
    def label(self) -> str:
        if self.release is not None:
            return self.release.name
        return self.cstorch_version or f"format {self.format}"


def readable_as(release: Release, fmt: float) -> bool:
    """Whether a file of format ``fmt`` can be read as ``release`` (``--from``): one of its own
    format, or a 2.0+ model in a newer container, as Model Zoo's converters write with a newer
    library (``trainer_release``; its HF → CS converters write no ``__metadata__`` to tell)."""
    if format_matches(release.format, fmt):
        return True
    return release.format >= 0.4 and release.format < fmt


def detect(path: str | Path, version_attr: float | None, cstorch_attr: str | None) -> Detected:
    """FORMAT.md §1.3: ``__version__`` (default 0.1), then ``__cstorch_version__``, then the
    fallback map."""
    fmt = 0.1 if version_attr is None else float(version_attr)
    known = next((f for f in KNOWN_FORMATS if format_matches(f, fmt)), None)
    if known is None:
        # Formats are tenths (0.1 ... 0.5); a newer one would be too. Anything else is damage.
        if fmt > KNOWN_FORMATS[-1] and fmt < 100 and abs(fmt * 10 - round(fmt * 10)) < 1e-6:
            raise NewerThanToolError(
                path,
                f"checkpoint format {fmt} is newer than this tool knows "
                f"(newest {KNOWN_FORMATS[-1]}, "
                f"release {LATEST.name})",
                "upgrade ckpt-migrate",
            )
        raise CorruptCheckpointError(
            path, f"unknown checkpoint format version {fmt!r}", "is this a malformed checkpoint?"
        )
    if cstorch_attr:
        try:
            v = Version(cstorch_attr)
        except InvalidVersion:
            raise CorruptCheckpointError(
                path, f"__cstorch_version__ {cstorch_attr!r} is not a version", FROM_HINT
            ) from None
        rel = BY_NAME.get(f"{v.major}.{v.minor}")
        if rel is None and v > LATEST.version:
            return Detected(known, cstorch_attr, None)
        if rel is None or not format_matches(rel.format, known):
            raise CorruptCheckpointError(
                path,
                f"__cstorch_version__ {cstorch_attr} does not match format {known}",
                FROM_HINT,
            )
        return Detected(known, cstorch_attr, rel)
    return Detected(known, None, BY_NAME[_FORMAT_FALLBACK[known]])
