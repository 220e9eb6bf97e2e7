"""Round-trip YAML editing that keeps comments, key order, quoting and the file's indentation.

ruamel.yaml (round-trip mode) is imported lazily, so ``--help`` and checkpoint-only upgrades
never load it. One quirk of its comment model is handled here: the comment lines *above* a key
are stored with the end-of-line comment of the key before it. Removing, moving or inserting a
key therefore re-attaches those lines, so no comment is lost or lands above the wrong key.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ckpt_migrate.config import yaml_budget, yaml_headings, yaml_repeats
from ckpt_migrate.errors import CkptIOError, UsageError


@dataclass(frozen=True)
class Style:
    """How the source file was laid out, so the output looks like it."""

    mapping: int = 2
    sequence: int = 2
    offset: int = 0
    booleans: tuple[str, str] = ("false", "true")
    repeats: tuple[yaml_repeats.Repeat, ...] = ()  # keys given twice, read once


_KEY_LINE = re.compile(r"^( *)([^\s#-][^:#]*):(\s|$)")
_DASH_LINE = re.compile(r"^( *)- ")


def guess_style(text: str) -> Style:
    """Indentation of nested mappings and of block sequences, and the spelling of booleans."""
    mapping = None
    offset = None
    last_key_col = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        dash = _DASH_LINE.match(line)
        if dash and offset is None and last_key_col is not None:
            offset = max(len(dash.group(1)) - last_key_col, 0)
        key = _KEY_LINE.match(line)
        if key:
            col = len(key.group(1))
            if mapping is None and last_key_col is not None and col > last_key_col:
                mapping = col - last_key_col
            last_key_col = col
    mapping = mapping or 2
    offset = 0 if offset is None else offset
    capital = len(re.findall(r":\s+(?:True|False)\b", text))
    lower = len(re.findall(r":\s+(?:true|false)\b", text))
    booleans = ("False", "True") if capital > lower else ("false", "true")
    return Style(mapping=mapping, sequence=offset + 2, offset=offset, booleans=booleans)


# Model Zoo reads a params.yaml with PyYAML (YAML 1.1, e.g. Release_1.9.1
# modelzoo/common/run_utils/cli_parser.py line 31): ``yes``/``no``/``on``/``off`` are booleans
# there, strings to YAML 1.2. Read as strings, ``add_summaries: off`` would switch a callback on.
_BOOL_TAG, _FLOAT_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
_YAML11_BOOL = re.compile(r"^(?:yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF)$")


def _yaml(style: Style | None = None, *, repeats: bool = False) -> Any:
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.allow_duplicate_keys = repeats  # (each repeating its first value: yaml_repeats.find)
    y.Constructor, y.Representer = _round_trip_classes()
    y.preserve_quotes = True
    _ = y.resolver.versioned_resolver  # (YAML 1.2's resolvers first: one more is added)
    y.resolver.add_version_implicit_resolver((1, 2), _BOOL_TAG, _YAML11_BOOL, list("yYnNoO"))
    y.width = 4096  # never re-wrap long lines
    if style is not None:
        y.indent(mapping=style.mapping, sequence=style.sequence, offset=style.offset)
        y.boolean_representation = list(style.booleans)
    return y


@functools.cache
def _round_trip_classes() -> tuple[type, type]:
    """ruamel's round-trip constructor and representer, with a float read from the file
    written back as its own text: ruamel re-formats it from a width and a precision, which
    moved the last digit (``8.436676240964464e-05`` became ``…463e-05``). A float a step
    computes is written as :func:`yaml11_float` spells it. (Subclasses: ruamel's
    ``add_constructor`` would change every ruamel user of the process.)"""
    from ruamel.yaml.constructor import RoundTripConstructor
    from ruamel.yaml.representer import RoundTripRepresenter
    from ruamel.yaml.scalarfloat import ScalarFloat

    class Constructor(RoundTripConstructor):
        def construct_yaml_float(self, node: Any) -> Any:
            value = super().construct_yaml_float(node)
            if isinstance(value, ScalarFloat):
                value._source_text = node.value
            return value

    class Representer(RoundTripRepresenter):
        pass

    Constructor.add_constructor(_FLOAT_TAG, Constructor.construct_yaml_float)
    Representer.add_representer(float, _represent_float)
    Representer.add_representer(ScalarFloat, _represent_float)
    return Constructor, Representer


def yaml11_float(value: float) -> str:
    """A float as text that YAML 1.1 readers (PyYAML, which Model Zoo loads configs with) also
    read as a float: the mantissa always has a dot (``2e-05`` is a string to PyYAML, whose float
    pattern needs one; ``2.0e-05`` is a float to both), infinities and NaN as ``.inf``/``.nan``.
    """
    if value != value:
        return ".nan"
    if value in (float("inf"), float("-inf")):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + e + exponent


def _represent_float(representer: Any, value: float) -> Any:
    text = getattr(value, "_source_text", None) or yaml11_float(value)
    return representer.represent_scalar(_FLOAT_TAG, text)


MAX_CONFIG_BYTES = 1 << 20  # Model Zoo's params.yaml files are a few KiB; ruamel reads ~100 KiB/s


def read_config(path: Path) -> str:
    """The text of a YAML config, refused in one line if missing, unreadable, not UTF-8 or
    too large to be a config."""
    p = Path(path)
    try:
        if p.exists() and not p.is_file():  # (a named pipe's read waits for a writer)
            raise UsageError(p, "is not a regular file", "pass the run's params.yaml")
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise UsageError(
                p, f"is over {MAX_CONFIG_BYTES:,} bytes: not a config", "pass the run's params.yaml"
            )
        return p.read_bytes().decode("utf-8")  # (its line endings as they are)
    except FileNotFoundError:
        raise UsageError(path, "no such config file", "check the path") from None
    except UnicodeDecodeError as exc:
        fix = "pass the run's params.yaml"
        raise UsageError(path, f"cannot read the config ({exc})", fix) from None
    except OSError as exc:  # (its permissions, the disk: not what it holds)
        raise CkptIOError.reading(path, exc) from None


def line_ending(text: str) -> str:
    """``"\r\n"`` where every line of ``text`` ends so (a config saved on Windows), else
    ``"\n"``. ruamel is given LF text (``load``): given CRLF, it keeps a carriage return in
    some tokens and not in others, and an upgraded config is written back with the source's
    endings (``config.upgrade``)."""
    crlf = text.count("\r\n")
    return "\r\n" if crlf and crlf == text.count("\n") else "\n"


def load(text: str, source: Path | None = None) -> tuple[Any, Style]:
    """The document as ruamel round-trip objects (a mapping at the top), and its style."""
    from ruamel.yaml.constructor import DuplicateKeyError
    from ruamel.yaml.error import YAMLError

    if line_ending(text) == "\r\n":
        text = text.replace("\r\n", "\n")
    yaml_budget.check_text(text, source)
    repeats: tuple[yaml_repeats.Repeat, ...] = ()
    try:
        try:
            data = _yaml().load(text)
        except DuplicateKeyError:
            repeats = yaml_repeats.find(text, source)
            data = _yaml(repeats=True).load(text)
    except YAMLError as exc:
        raise UsageError(
            source, f"not valid YAML ({yaml_budget.problem(exc)})", "fix the config file"
        ) from None
    except RecursionError:
        raise UsageError(
            source, "nested too deeply to be a config", "fix the config file"
        ) from None
    if not is_map(data):
        raise UsageError(source, "config is not a YAML mapping", "pass a Model Zoo params.yaml")
    yaml_budget.check_tree(data, source)
    style = guess_style(text)
    return data, replace(style, repeats=repeats) if repeats else style


def dump(data: Any, style: Style) -> str:
    import io

    _reindent(data, 0, style, set())
    out = io.StringIO()
    _yaml(style).dump(data, out)
    return out.getvalue()


def _reindent(node: Any, col: int, style: Style, seen: set[int]) -> None:
    """Shift the comment lines of mappings that moved to another column (e.g. a legacy
    section now under ``trainer.init``) by as much as their keys moved."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if is_map(node):
        orig = getattr(getattr(node, "lc", None), "col", None)
        if orig is not None and orig != col:
            _shift_comments(node, col - orig)
        for key, value in node.items():
            if is_map(value):
                _drop_popped_start(node, key, value)
                _reindent(value, col + style.mapping, style, seen)
            elif is_seq(value):
                _reindent(value, col, style, seen)
    elif is_seq(node):
        for item in node:
            if is_map(item) or is_seq(item):
                _reindent(item, col + style.sequence, style, seen)


def _drop_popped_start(parent: Any, key: Any, child: Any) -> None:
    """ruamel keeps the comment lines above a nested mapping's first key twice: as the
    mapping's start and in its parent's entry for ``key``. Once :func:`_pop_start_lines` moved
    them, the parent's copy would print them a second time."""
    if not (hasattr(parent, "ca") and hasattr(child, "ca")):  # (a plain dict a step built)
        return
    entry = parent.ca.items.get(key)
    start = child.ca.comment[1] if child.ca.comment and len(child.ca.comment) > 1 else None
    if entry and len(entry) > 3 and entry[3] and start == []:
        entry[3] = None


def _shift_comments(m: Any, shift: int) -> None:
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    start = m.ca.comment[1] if m.ca.comment and len(m.ca.comment) > 1 else None
    if start:
        start[:] = [  # (in place: a parent's entry may print them, yaml_headings.put)
            CommentToken(tok.value, CommentMark(max(_column(tok) + shift, 0))) for tok in start
        ]
    for key in list(m):
        tok = _token(m, key)
        if tok is None:
            continue
        head, rest = _split(tok.value)
        if rest:
            tok.value = (
                head + "\n" + "".join(_shift_line(line, shift) for line in rest.splitlines(True))
            )


def _column(tok: Any) -> int:
    mark = getattr(tok, "start_mark", None)
    return getattr(mark, "column", None) or getattr(tok, "_column", None) or 0


def _shift_line(line: str, shift: int) -> str:
    body = line.lstrip(" ")
    if not body.startswith("#"):
        return line
    return " " * max(len(line) - len(body) + shift, 0) + body


def is_map(value: Any) -> bool:
    return isinstance(value, Mapping)


def is_seq(value: Any) -> bool:
    return isinstance(value, list)


def new_map(items: Any = ()) -> Any:
    from ruamel.yaml.comments import CommentedMap

    out = CommentedMap()
    for key, value in dict(items).items():
        out[key] = value
    return out


def new_seq(items: Any = ()) -> Any:
    from ruamel.yaml.comments import CommentedSeq

    return CommentedSeq(list(items))


def _token(m: Any, key: Any) -> Any:
    entry = m.ca.items.get(key)
    return entry[2] if entry and len(entry) > 2 else None


def _split(value: str, col: int | None = None) -> tuple[str, str]:
    """A key's comment token: (its end-of-line comment, the comment lines that follow). Given
    the key's column ``col``, comment lines indented past it continue the end-of-line comment
    (``max_steps: 476837  # … 2T tokens.`` with ``# steps = 2T / …`` aligned below it)."""
    head, _, rest = value.partition("\n")
    while col is not None and head.strip() and rest:
        line, _, after = rest.partition("\n")
        body = line.lstrip(" ")
        if not body.startswith("#") or len(line) - len(body) <= col:
            break
        head, rest = f"{head}\n{line}", after
    return head, rest


def key_col(m: Any, key: Any = ...) -> int | None:
    """The column ``key`` (by default the first key of ``m``) stood at in the file (None for
    a key a step added, or an empty mapping)."""
    try:
        return int(m.lc.key(next(iter(m)) if key is ... else key)[1])
    except (AttributeError, KeyError, StopIteration, TypeError):
        return None


def _append_lines(m: Any, key: Any, rest: str) -> None:
    """Put comment lines after ``key`` (before whatever follows it)."""
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    tok = _token(m, key)
    if tok is not None:
        tok.value = tok.value + rest if tok.value.endswith("\n") else tok.value + "\n" + rest
        return
    entry = m.ca.items.setdefault(key, [None, None, None, None])
    entry[2] = CommentToken("\n" + rest, CommentMark(0))


def _prepend_lines(m: Any, rest: str) -> None:
    """Put comment lines at the start of mapping ``m`` (before its first key)."""
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    if m.ca.comment is None:
        m.ca.comment = [None, []]
    if m.ca.comment[1] is None:
        m.ca.comment[1] = []
    for line in rest.splitlines():
        stripped = line.strip()
        col = len(line) - len(line.lstrip())
        m.ca.comment[1].append(
            CommentToken((stripped + "\n") if stripped else "\n", CommentMark(col))
        )


def carry_start_comments(src: Any, dst: Any, shift: int) -> None:
    """Move the comment lines that open mapping ``src`` (left there as its keys were taken)
    to the start of ``dst``, ``shift`` columns further right."""
    lines = _pop_start_lines(src)
    if lines.strip():
        _prepend_lines(dst, "".join(_shift_line(line, shift) for line in lines.splitlines(True)))


def _pop_start_lines(m: Any) -> str:
    """Remove the comment lines above the first key of ``m`` and return them as text."""
    start = m.ca.comment[1] if m.ca.comment and len(m.ca.comment) > 1 else None
    if not start:
        return ""
    m.ca.comment[1] = []
    out = []
    for tok in start:
        text = tok.value if tok.value.endswith("\n") else tok.value + "\n"
        out.append(text if not text.strip() else " " * _column(tok) + text.lstrip(" "))
    return "".join(out)


def take(m: Any, key: Any) -> tuple[Any, str | None]:
    """Remove ``key`` from mapping ``m``; return its value and its end-of-line comment.

    The comment lines that stood above and below the key stay where they were.
    """
    keys = list(m)
    index = keys.index(key)
    tok = _token(m, key)
    col = key_col(m, key)
    entry = m.ca.items.pop(key, None)
    value = m.pop(key)
    above = yaml_headings.lines_before(entry)
    eol, rest = None, above + yaml_headings.trailing(value, col or 0)  # (what the value heads)
    if tok is not None:
        eol, own = _split(tok.value, col)
        eol, rest = eol.strip() or None, above + own + rest[len(above) :]
    if rest:
        if index > 0:
            _append_lines(m, keys[index - 1], rest)
        elif rest.strip():
            _prepend_lines(m, rest)
    return value, eol


def put(
    m: Any,
    key: Any,
    value: Any,
    *,
    after: Any = None,
    index: int | None = None,
    comment: str | None = None,
    above_comments: bool = False,
) -> None:
    """Set ``key`` in mapping ``m``: in place if it exists, else after ``after``, at ``index``,
    or at the end; ``comment`` becomes its end-of-line comment.

    Comment lines that stood below the key it is inserted after move below the new key, so
    they stay above the key they described. A key inserted first goes below the comment lines
    that open the mapping (a file's header), or with ``above_comments`` above them (they
    describe the keys that follow, e.g. ``# Embedding`` in a model section).
    """
    if key in m:
        text = yaml_headings.trailing(m[key], key_col(m, key) or 0)
        m[key] = value
        _end_with(m, key, text)
    else:
        keys = list(m)
        if index is None:
            index = keys.index(after) + 1 if after is not None and after in m else len(keys)
        prev = keys[index - 1] if 0 < index <= len(keys) else None
        carried = ""
        if prev is not None:
            tok = _token(m, prev)
            if tok is not None:
                head, rest = _split(tok.value, key_col(m, prev))
                if rest:
                    tok.value = head + "\n"
                    carried = rest
        if index == 0 and above_comments:
            carried = _pop_start_lines(m) + carried
        m.insert(index, key, value)
        if carried:
            _append_lines(m, key, carried)
    if comment:
        _set_eol(m, key, comment)


def _set_eol(m: Any, key: Any, comment: str) -> None:
    """``comment`` after ``key``'s value; lines after its first (a comment continued below
    the key) follow the key."""
    text = comment if comment.startswith("#") else f"# {comment}"
    tok = _token(m, key)
    if tok is not None:
        _, rest = _split(tok.value, key_col(m, key))
        tok.value = f"{text}\n{rest}"
        return
    first, _, more = text.partition("\n")
    m.yaml_add_eol_comment(first, key)
    if more:
        _append_lines(m, key, more + "\n")


def rename(m: Any, old: Any, new: Any, value: Any = ...) -> None:
    """Rename ``old`` to ``new`` at the same position, keeping its comments (and its value
    unless ``value`` is given)."""
    keys = list(m)
    index = keys.index(old)
    text = "" if value is ... else yaml_headings.trailing(m[old], key_col(m, old) or 0)
    entry = m.ca.items.pop(old, None)
    current = m.pop(old)
    m.insert(index, new, current if value is ... else value)
    if entry is not None:
        m.ca.items[new] = entry
    _end_with(m, new, text)


def _end_with(m: Any, key: Any, text: str) -> None:
    """Put ``text``, the lines that ended a value ``key`` had (heading what follows it), after
    its new value."""
    if text and not yaml_headings.append(m[key], text):
        _append_lines(m, key, text)


def plain(value: Any) -> Any:
    """Builtin Python data (dict, list, str, int, float, bool, None) for reports and JSON."""
    if is_map(value):
        return {str(k): plain(v) for k, v in value.items()}
    if is_seq(value) or isinstance(value, tuple):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value
