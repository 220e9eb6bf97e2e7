"""A legacy (format 0.1–0.4) leaf's dataset: one root dataset per leaf, named by the leaf's name
as ``urllib.parse.quote(name, safe='')`` writes it (FORMAT.md §3), declared once for the
reader, the writer and the verification of what was written."""

from __future__ import annotations

import re
from urllib.parse import quote

# The names ``quote(name, safe="")`` leaves as they are (its always-safe characters): most.
_UNQUOTED = re.compile(r"[A-Za-z0-9_.~-]*")


def stored_name(name: str) -> str:
    """The dataset name of the leaf ``name`` (the same string where quoting changes nothing)."""
    return name if _UNQUOTED.fullmatch(name) else quote(name, safe="")
