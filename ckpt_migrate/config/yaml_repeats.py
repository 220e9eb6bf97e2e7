"""A key a params.yaml gives twice in one mapping.

YAML 1.2 (ruamel) refuses it; Model Zoo reads its configs with PyYAML, which keeps the last
value without a word. Model Zoo itself shipped one: ``a: -0.16`` twice under
``embedding_initializer`` in ``Cerebras_GPT/256m_mup.yaml`` (Release_2.0.3 through
Release_2.10.0). Twice with the same value is read once and reported; with two values, which
one the run used is the user's to say, so it is refused, naming both lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckpt_migrate.errors import UsageError


@dataclass(frozen=True)
class Repeat:
    """``key`` (its dotted path) given again at line ``again`` with line ``first``'s value."""

    key: tuple[str, ...]
    first: int
    again: int


def find(text: str, source: Any) -> tuple[Repeat, ...]:
    """Every repeated key of ``text``, each repeating its first value; ``UsageError`` for a
    key repeated with another value. Each node is visited once (aliases are not expanded)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode

    repeats: list[Repeat] = []
    todo: list[tuple[tuple[str, ...], Any]] = [((), YAML(typ="rt").compose(text))]
    visited: set[int] = set()
    while todo:
        path, node = todo.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, SequenceNode):
            todo.extend(((*path, str(i)), item) for i, item in enumerate(node.value))
        if not isinstance(node, MappingNode):
            continue
        seen: dict[str, tuple[Any, Any]] = {}
        for key, value in node.value:
            if not isinstance(key, ScalarNode) or key.value == "<<":
                continue  # (a merge key twice: ruamel's own error says so)
            name, line = key.value, key.start_mark.line + 1
            if name in seen:
                first_key, first_value = seen[name]
                first = first_key.start_mark.line + 1
                if not _same(first_value, value):
                    where = ".".join((*path, name))
                    raise UsageError(
                        source,
                        f"key {where!r} is given twice with different values (lines {first} "
                        f"and {line}; Model Zoo's loader uses the last)",
                        "delete the one the run did not mean",
                    )
                repeats.append(Repeat((*path, name), first, line))
                continue
            seen[name] = (key, value)
            todo.append(((*path, name), value))
    return tuple(sorted(repeats, key=lambda r: r.again))


def _same(a: Any, b: Any) -> bool:
    """The two nodes say the same: the same tags and texts, the same shape."""
    pairs, compared = [(a, b)], set()
    while pairs:
        x, y = pairs.pop()
        if x is y or (id(x), id(y)) in compared:
            continue
        compared.add((id(x), id(y)))
        if type(x) is not type(y) or x.tag != y.tag:
            return False
        if isinstance(x.value, str):
            if x.value != y.value:
                return False
        elif len(x.value) != len(y.value):
            return False
        else:
            for u, v in zip(x.value, y.value):
                pairs.extend(zip(u, v) if isinstance(u, tuple) else [(u, v)])
    return True
