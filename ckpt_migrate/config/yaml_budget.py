"""What reading a config may cost: a few lines of YAML must not buy minutes of CPU or a deep
recursion (aliases expanded, brackets nested), and a YAML error is told as its problem and
where it stands."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any

from ckpt_migrate.errors import UsageError

MAX_VALUES = 100_000  # a config's values counted with every alias expanded
MAX_DEPTH = 64


def check_text(text: str, source: Any) -> None:
    """Refuse brackets nested past ``MAX_DEPTH`` before ruamel reads them (its scanner is
    quadratic in that depth: 3,000 took 12 s)."""
    if _flow_depth(text) > MAX_DEPTH:
        raise UsageError(source, f"nested more than {MAX_DEPTH} deep", "fix the config file")


def check_tree(data: Any, source: Any) -> None:
    """Refuse a document that stands for more than ``MAX_VALUES`` values or nests past
    ``MAX_DEPTH`` once its aliases are expanded."""
    _expanded(data, 0, {}, source)


def problem(exc: Exception) -> str:
    """ruamel's problem and where it stands (``found duplicate key "a" … at line 3, column
    3``), not the first line of its report, which is the context (``while constructing a
    mapping``)."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if not problem:
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(str(problem).split()) + where


def _flow_depth(text: str) -> int:
    """How deep ``text`` nests ``[``/``{`` collections: a bracket counts where a collection
    may begin (at a line's start, after an indicator or after a counted bracket), not inside a
    word or a quoted string."""
    depth = deepest = 0
    counted = -1  # where the last counted bracket stands
    for m in re.finditer(r"[\[{\]}]", text):
        i = m.start()
        if m.group() in "]}":
            depth = max(depth - 1, 0)
            continue
        start = text.rfind("\n", 0, i) + 1
        before = text[start:i].rstrip(" \t")
        if not before or before[-1] in ":,-?" or start + len(before) - 1 == counted:
            depth, counted = depth + 1, i
            deepest = max(deepest, depth)
    return deepest


def _expanded(node: Any, depth: int, sizes: dict[int, int], source: Any) -> int:
    """How many values ``node`` stands for with its aliases expanded (what ``plain`` and the
    hops walk), refused past ``MAX_VALUES`` or ``MAX_DEPTH``: a config of a few lines must not
    buy minutes of CPU (ruamel's round trip shares an aliased value, never expands it)."""
    if isinstance(node, Mapping):
        children: Any = itertools.chain.from_iterable(node.items())
    elif isinstance(node, (list, tuple)):
        children = node
    else:
        return 1
    if id(node) in sizes:
        return sizes[id(node)]
    if depth == MAX_DEPTH:
        raise UsageError(source, f"nested more than {MAX_DEPTH} deep", "fix the config file")
    total = 1 + sum(_expanded(c, depth + 1, sizes, source) for c in children)
    if total > MAX_VALUES:
        raise UsageError(
            source,
            f"holds more than {MAX_VALUES:,} values once its aliases are expanded",
            "pass the run's params.yaml (a few hundred values), without nested aliases",
        )
    sizes[id(node)] = total
    return total
