"""``--json`` text: what ``json.JSONEncoder(indent=2, default=str).iterencode`` writes, the
same characters, made faster.

With an indent the standard library encodes in Python, a generator per container and a
``yield`` per token: ``inspect --json`` of 188k leaves spent 0.35 s there (issue 33). Here a
container of many entries (or of the first two levels) is written in pieces of ``BATCH``
entries, each entry by a plain recursive function appending to one list, its strings escaped
by the standard library's C function (``encode_basestring_ascii``). The rules are the
standard library's (``json.encoder._make_iterencode``): a string, None, True, False, an int,
a float (NaN and the infinities as ``NaN``, ``Infinity``, ``-Infinity``), a list or tuple, a
dict (keys: a string, a float, True/False/None, an int); anything else is encoded as what
``default`` returns. ``tests/test_json_text.py`` holds the two equal.
"""

from __future__ import annotations

import json.encoder
from collections.abc import Callable, Iterator
from typing import Any

INDENT = "  "
BATCH = 1024  # entries of a large container written into one piece
_escape = json.encoder.encode_basestring_ascii
_float = float.__repr__
_int = int.__repr__


def pieces(data: Any, default: Callable[[Any], Any] = str) -> Iterator[str]:
    """The text of ``data`` as ``json.JSONEncoder(indent=2, default=default)`` writes it, in
    pieces of at most ``BATCH`` entries of a container."""
    yield from _pieces(data, 0, default)


def _streamed(o: Any, level: int) -> bool:
    """Whether ``o`` is written entry by entry (a large container, or one of the first two
    levels, where a large one may lie below), not whole."""
    return isinstance(o, (list, tuple, dict)) and len(o) > 0 and (level < 2 or len(o) > BATCH)


def _pieces(o: Any, level: int, default: Callable[[Any], Any]) -> Iterator[str]:
    if _streamed(o, level):
        dict_ = isinstance(o, dict)
        newline = "\n" + INDENT * (level + 1)
        out = ["{" if dict_ else "["]
        for i, item in enumerate(o.items() if dict_ else o):
            out.append(newline if i == 0 else "," + newline)
            if dict_:
                out.append(_key(item[0]) + ": ")
                item = item[1]
            if _streamed(item, level + 1):
                yield "".join(out)
                out.clear()
                yield from _pieces(item, level + 1, default)
            else:
                _encode(item, level + 1, out, default)
            if len(out) >= BATCH:
                yield "".join(out)
                out.clear()
        out.append("\n" + INDENT * level + ("}" if dict_ else "]"))
        yield "".join(out)
        return
    out: list[str] = []
    _encode(o, level, out, default)
    yield "".join(out)


def _encode(o: Any, level: int, out: list[str], default: Callable[[Any], Any]) -> None:
    if isinstance(o, str):
        out.append(_escape(o))
    elif o is None:
        out.append("null")
    elif o is True:
        out.append("true")
    elif o is False:
        out.append("false")
    elif isinstance(o, int):
        out.append(_int(o))
    elif isinstance(o, float):
        out.append(_number(o))
    elif isinstance(o, (list, tuple, dict)):
        keyed = isinstance(o, dict)
        if not o:
            out.append("{}" if keyed else "[]")
            return
        newline = "\n" + INDENT * (level + 1)
        between = "," + newline
        out.append(("{" if keyed else "[") + newline)
        first = True
        for item in o.items() if keyed else o:
            if not first:
                out.append(between)
            first = False
            if keyed:
                key, item = item
                out.append((_escape(key) if type(key) is str else _key(key)) + ": ")
            if type(item) is str:  # (most values: an entry's name and description)
                out.append(_escape(item))
            else:
                _encode(item, level + 1, out, default)
        out.append("\n" + INDENT * level + ("}" if keyed else "]"))
    else:
        _encode(default(o), level, out, default)


def _key(key: Any) -> str:
    """A dict key as the standard library writes it (``skipkeys`` false: others refused)."""
    if isinstance(key, str):
        return _escape(key)
    if isinstance(key, float):
        return _escape(_number(key))
    if key is True:
        return '"true"'
    if key is False:
        return '"false"'
    if key is None:
        return '"null"'
    if isinstance(key, int):
        return _escape(_int(key))
    raise TypeError(f"keys must be str, int, float, bool or None, not {key.__class__.__name__}")


def _number(o: float) -> str:
    if o != o:
        return "NaN"
    if o == float("inf"):
        return "Infinity"
    if o == -float("inf"):
        return "-Infinity"
    return _float(o)
