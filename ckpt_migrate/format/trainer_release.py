"""The release a Model Zoo checkpoint's model is at, by the last entry of its ``__metadata__``.

``__cstorch_version__`` names the ``cerebras.pytorch`` that wrote the file; Model Zoo names the
release of what is inside by the ``version`` of the last ``__metadata__`` entry. The two differ
where a newer library wrote an older model: Model Zoo's CS→CS converters append
``{version: "<X.Y>.0"}`` for their target format (``update_ckpt_metadata``, Model Zoo
Release_2.10.0 ``tools/checkpoint_converters/base_converter.py`` line 2502), so a 2.10
``cszoo checkpoint convert --tgt-fmt cs-2.1`` writes a 0.5 file stamped ``2.10.0`` whose model
keys and ``version`` are 2.1's. Model Zoo reads the release from that ``version`` alone: its
``cs-auto`` source format (``tools/convert_checkpoint.py`` line 288) and the Trainer's
``check_compatibility`` (``trainer/callbacks/checkpoint.py`` line 235), which rejects the file
on 2.10. ``ckpt-migrate`` takes it too, where it names a release older than the stamp and not
older than 2.1 (the first release whose Trainer wrote the list), or any release from 2.1 on in a
0.5 file without a stamp (which alone would be read as 2.5): the hops start there.

A read takes the last entry from the tree it built; ``check``, which builds none, reads only the
named leaves: format 0.5 keeps a string in its leaf's root attribute, format 0.4 in the
``string_value`` attribute of the leaf's dataset. Anything else there makes no claim, and
``--from`` overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass

import h5py
from packaging.version import InvalidVersion, Version

from ckpt_migrate import jsonfile
from ckpt_migrate.format import releases
from ckpt_migrate.format.h5 import attrs as h5attrs
from ckpt_migrate.format.legacy.names import stored_name
from ckpt_migrate.format.tree import DictNode, Node, SeqNode, ValueLeaf

KEY = "__metadata__"
FIRST = releases.BY_NAME["2.1"]  # the first release whose Trainer wrote ``__metadata__``
_MAX_ENTRIES = 10_000  # (one entry a conversion; a list longer than this makes no claim)
_MAX_TEXT = 1 << 16
_ABSENT = object()


@dataclass(frozen=True)
class Claim:
    """What the file's ``__metadata__`` says of its model's release."""

    release: releases.Release
    version: str  # the entry's own text, e.g. "2.1.0"
    entry: int  # which entry (the last)


def in_tree(root: Node, detected: releases.Detected) -> Claim | None:
    """The release the tree's ``__metadata__`` names, where older than the stamp's (or where a
    0.5 file has no stamp)."""
    if not _may_claim(detected):
        return None
    entries = root.get(KEY) if isinstance(root, DictNode) else None
    if not isinstance(entries, SeqNode) or not entries.items:
        return None
    last = entries.items[-1]
    version = last.get("version") if isinstance(last, DictNode) else None
    if not isinstance(version, ValueLeaf) or not isinstance(version.value, str):
        return None
    return _judged(version.value, len(entries.items) - 1, detected)


def in_file(f: h5py.File, detected: releases.Detected) -> Claim | None:
    """``in_tree`` for a file whose tree is not read (``check``): the leaves
    ``__metadata__.<i>.version`` read by name, ``i`` = 0, 1, … while present."""
    if not _may_claim(detected):
        return None
    last = last_entry(f, detected.format)
    if last is None or last[1] is None:
        return None
    return _judged(last[1], last[0], detected)


def last_entry(f: h5py.File, fmt: float) -> tuple[int, str | None] | None:
    """(position, version text or None where it is no plain string) of the last
    ``__metadata__`` entry's ``version`` leaf; None where there is none or too many. The
    preflight child of ``check`` tries the same reads first (``preflight_outline``)."""
    last: tuple[int, str | None] | None = None
    for i in range(_MAX_ENTRIES):
        found = _version_text(f, f"{KEY}.{i}.version", fmt)
        if found is _ABSENT:
            return last
        last = (i, found)  # type: ignore[assignment]
    return None


def _may_claim(detected: releases.Detected) -> bool:
    """A stamp after 2.1, or a 0.5 file with none (taken as 2.5, the first 0.5 release)."""
    if detected.release is None:
        return False
    if detected.cstorch_version is None:
        return detected.format >= 0.5
    return detected.release.version > FIRST.version


def _judged(text: str, entry: int, detected: releases.Detected) -> Claim | None:
    assert detected.release is not None
    try:
        said = Version(text)
    except InvalidVersion:
        return None
    release = releases.BY_NAME.get(f"{said.major}.{said.minor}")
    if release is None or release == detected.release or release.version < FIRST.version:
        return None
    if detected.cstorch_version is not None and release.version > detected.release.version:
        return None  # (a model newer than the library that wrote it: the stamp stands)
    return Claim(release, text, entry)


def reading(detected: releases.Detected, claim: Claim | None) -> releases.Detected:
    """``detected`` read as the release ``claim`` names (the stamp's kept as ``said``)."""
    if claim is None:
        return detected
    return releases.Detected(
        detected.format, detected.cstorch_version, claim.release, detected.release, claim.version
    )


def _version_text(f: h5py.File, name: str, fmt: float) -> object:
    """The string leaf ``name``: its text, None where it is no plain string, ``_ABSENT``
    where the file has no such leaf."""
    if fmt < 0.5:
        stored = stored_name(name)
        link = f.get(stored, getlink=True)  # (the link itself, not followed)
        if link is None:
            return _ABSENT
        dataset = f[stored] if isinstance(link, h5py.HardLink) else None
        if not isinstance(dataset, h5py.Dataset):
            return None
        return _short(h5attrs.get_text(dataset, "string_value"))
    md = _leaf_metadata(f, name)
    if md is _ABSENT:
        return _ABSENT
    if isinstance(md, dict) and md.get("__TYPE__") == "LinkedObject":
        # (one object at two places: the later one names the first, which holds the text)
        first = md.get("key")
        md = _leaf_metadata(f, first) if isinstance(first, str) else None
    if not isinstance(md, dict) or md.get("__TYPE__") != "StringSerializer":
        return None
    return _short(md.get("string_value"))


def _leaf_metadata(f: h5py.File, name: str) -> object:
    """A 0.5 leaf's own metadata from its root attribute (None where it is unreadable)."""
    raw = h5attrs.get_text(f, f"{name}.__metadata__", _ABSENT)
    if raw is _ABSENT:
        return _ABSENT
    if not isinstance(raw, str) or len(raw) > _MAX_TEXT:
        return None
    try:
        document = jsonfile.loads(raw)
    except ValueError:
        return None
    return document.get(f"{name}.__metadata__") if isinstance(document, dict) else None


def _short(value: object) -> str | None:
    return value if isinstance(value, str) and len(value) <= 64 else None
