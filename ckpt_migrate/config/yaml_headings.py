"""The comment lines that head a section (``### Model`` above ``model:``).

ruamel keeps them with the last entry of the value before, however deep (Model Zoo 2.2.0's
``Cerebras_GPT/111m_mup.yaml`` holds ``### Cerebras parameters`` in
``optimizer.adjust_learning_rate.decoder_kernel``): a value dropped or replaced lost them,
and a section moved took the next one's heading with it. :func:`trailing` takes them off a
value, :func:`append` puts them back after one, :func:`pop` takes a key's heading off before
its section moves and :func:`put` sets it above the section's new place; :func:`above` takes
the lines above a single key that moves, :func:`open_first_item` keeps a rebuilt list's
opening lines with its first item.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def trailing(value: Any, col: int) -> str:
    """Remove and return the lines that end ``value`` (the last of its comment lines, and the
    blank lines among them) standing at column ``col`` or left of it: they head what follows
    the value, not the value; "" when there are none."""
    for holder in reversed(_chain(value)):
        tok = _get(holder)
        if tok is not None:
            return _cut(tok, col)
    return ""


def append(value: Any, text: str) -> bool:
    """Put ``text`` after the whole of container ``value`` (where ruamel keeps such lines);
    False when ``value`` is no container with entries, for the caller to place it."""
    chain = _chain(value)
    if not chain or not text.strip():
        return bool(chain)
    tok = _get(chain[-1])
    if tok is None:
        _set(chain[-1], "\n" + text)
    else:
        tok.value = tok.value + text if tok.value.endswith("\n") else tok.value + "\n" + text
    return True


def pop(m: Any, key: Any, col: int) -> str:
    """Remove and return the comment lines (and blank lines before them) that stand directly
    above ``key`` of mapping ``m``, at column ``col`` or left of it; "" when there are none,
    or ``key`` is first (its lines open the mapping: a file's header stays)."""
    keys = list(m)
    index = keys.index(key)
    if index == 0:
        return ""
    prev = keys[index - 1]
    text = trailing(m[prev], col)
    tok = None if text else _get((m, prev))
    return _cut(tok, col) if tok is not None else text


def above(m: Any, key: Any, col: int) -> str:
    """Remove and return the comment lines that stand directly above ``key`` of mapping ``m``
    at column ``col`` or left of it, for them to go where the key goes (:func:`put`); ""
    for a first key (its lines open the mapping, and stay)."""
    entry = m.ca.items.get(key)
    lines = lines_before(entry)
    if lines:
        entry[1] = None
    return pop(m, key, col) + lines


def lines_before(entry: Any) -> str:
    """The comment lines ruamel keeps *with* a key (its entry's slot 1: after a flow sequence,
    the lines above the key are there, not with the value before), as text."""
    kept = (entry[1] if entry and len(entry) > 1 else None) or []
    return "".join(
        " " * (getattr(t, "column", 0) or 0) + t.value.lstrip(" ") for t in kept if t.value
    )


def end_comment(m: Any, key: Any) -> str | None:
    """``key``'s end-of-line comment, left where it is."""
    tok = _get((m, key))
    return (tok.value.partition("\n")[0].strip() or None) if tok is not None else None


def put(m: Any, key: Any, heading: str, col: int) -> None:
    """Set ``heading`` above ``key`` of mapping ``m``, its least indented line at ``col`` (the
    column ``key`` is written at), as lines before ``key`` (or opening ``m``): places the
    dump's re-indenting of moved mappings leaves alone."""
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    if not heading.strip() or key not in m:
        return
    shift = col - min(_indent(line) for line in heading.splitlines() if line.strip())
    tokens = [
        CommentToken(line.strip() + "\n" if line.strip() else "\n", CommentMark(_indent(line)))
        for line in (_shift(line, shift) for line in heading.splitlines())
    ]
    if next(iter(m)) == key:  # (above a first key ruamel prints the mapping's opening lines)
        while tokens and tokens[0].value == "\n":
            tokens.pop(0)
        if m.ca.comment is None:
            m.ca.comment = [None, []]
        m.ca.comment[1] = tokens + list(m.ca.comment[1] or [])
        return
    entry = m.ca.items.setdefault(key, [None, None, None, None])
    entry[1] = tokens + list(entry[1] or [])
    value = m[key]
    start = value.ca.comment if isinstance(value, Mapping) and hasattr(value, "ca") else None
    if entry[3] is None and start and len(start) > 1 and start[1]:
        entry[3] = start[1]  # (with an entry, ruamel prints a mapping's opening lines from it)


def open_first_item(seq: Any) -> None:
    """Move the comment lines that open sequence ``seq`` (above its first item) to the start
    of that item, a mapping, aligned with its keys: a step that rebuilds the sequence
    (``learning_rate`` into ``schedulers``) keeps its items' mappings, not the sequence."""
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    start = seq.ca.comment[1] if getattr(seq, "ca", None) and seq.ca.comment else None
    first = seq[0] if len(seq) else None
    lc = getattr(first, "lc", None)
    if not start or not isinstance(first, Mapping) or lc is None or lc.col is None:
        return
    lines = [(t.value, getattr(t, "column", 0) or 0) for t in start]
    least = min(col for value, col in lines if value.strip())
    seq.ca.comment[1] = []
    if first.ca.comment is None:
        first.ca.comment = [None, []]
    moved = [CommentToken(v, CommentMark(c - least + lc.col if v.strip() else 0)) for v, c in lines]
    first.ca.comment[1] = moved + list(first.ca.comment[1] or [])


def _cut(tok: Any, col: int) -> str:
    """Cut the trailing comment lines at ``col`` or left of it (and the blank lines among and
    before them) off the comment token ``tok``; return them."""
    head, sep, rest = tok.value.partition("\n")
    lines = rest.splitlines(True)
    start = len(lines)
    while start and (not lines[start - 1].strip() or _is_heading(lines[start - 1], col)):
        start -= 1
    if not any(line.strip() for line in lines[start:]):
        return ""
    tok.value = head + sep + "".join(lines[:start])
    return "".join(lines[start:])


def _is_heading(line: str, col: int) -> bool:
    return line.lstrip(" ").startswith("#") and _indent(line) <= col


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _shift(line: str, shift: int) -> str:
    if not line.strip():
        return line
    return " " * max(_indent(line) + shift, 0) + line.lstrip(" ")


def _chain(value: Any) -> list[tuple[Any, Any]]:
    """The last entries of ``value``, outermost first: each (container, key or index) that
    ruamel may keep the lines after the whole value with (the deepest, as read)."""
    chain: list[tuple[Any, Any]] = []
    while isinstance(value, (Mapping, list)) and len(value) and hasattr(value, "ca"):
        last = list(value)[-1] if isinstance(value, Mapping) else len(value) - 1
        chain.append((value, last))
        value = value[last]
    return chain


def _get(holder: tuple[Any, Any]) -> Any:
    container, key = holder
    entry = container.ca.items.get(key)
    slot = 0 if isinstance(container, list) else 2
    return entry[slot] if entry and len(entry) > slot else None


def _set(holder: tuple[Any, Any], text: str) -> None:
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    container, key = holder
    entry = container.ca.items.setdefault(key, [None, None, None, None])
    entry[0 if isinstance(container, list) else 2] = CommentToken(text, CommentMark(0))
