"""The provenance record ``__ckpt_migrate__``: a root attribute the real loader ignores.

Its value is a JSON list, one record per ckpt-migrate step that produced the file (an upgrade, a
conversion), oldest first; an upgrade appends its record to the source's list.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from ckpt_migrate import jsonfile
from ckpt_migrate._version import __version__
from ckpt_migrate.format.h5.io import attr_text

PROVENANCE_ATTR = "__ckpt_migrate__"


def record(source_name: str, **fields: Any) -> dict[str, Any]:
    """A new record: who wrote the file and when, from which source, plus ``fields``."""
    return {
        "tool": "ckpt-migrate",
        "version": __version__,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "source_name": source_name,
        **fields,
    }


def read(attrs: Any) -> list[dict]:
    """The records of a file's root attributes ([] when it has none or they are unreadable)."""
    raw = attrs.get(PROVENANCE_ATTR)
    if raw is None:
        return []
    try:
        value = jsonfile.loads(attr_text(raw))
    except (ValueError, TypeError):
        return []
    return value if isinstance(value, list) else []


def sources(records: list[dict]) -> list[str] | None:
    """The releases the records' upgrades began at, oldest first (None: no such record)."""
    found = [r.get("source_release") for r in records if isinstance(r, dict)]
    return [r for r in found if isinstance(r, str)] or None
