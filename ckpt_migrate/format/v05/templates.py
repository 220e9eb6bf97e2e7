"""The leaves' ``__metadata__`` documents of a format 0.5 root, known by template (issue 33).

cstorch writes one JSON document per leaf (FORMAT.md §4.3). The thousands of tensors of a
checkpoint share a few dtypes and shapes, so their documents differ by the leaf's name alone:
with the name taken out, a few templates, each decoded from JSON once (``Templates.known``).

A number scalar's document differs by its value too. The optimizer's list of parameter ids is
one scalar per parameter (``optimizer.param_groups.0.params.N``, value N: 37,536 of them in the
sweep's 150k-tensor MoE checkpoint), and each was decoded from JSON as a template of its own:
about 0.2 s of the 2.0 s of ``plan`` there, and the 4,096 templates kept were theirs. Such a
document is known by the template with its value's number token taken out too
(``Templates.number``): the token of another document in its place is decoded as JSON decodes
a number, and nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ckpt_migrate.format.v05 import treespec as treespec_json

T = TypeVar("T")

# A JSON number token as ``json.loads`` reads it (``json.scanner.NUMBER_RE``): an int without
# a fraction or an exponent, else a float. Longer tokens are left to JSON (Python refuses ints
# of more than 4,300 digits; JSON then says the document is not valid).
_NUMBER = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_LONGEST = 64
_KEY = '"scalar_value": '  # (as ``json.dumps`` writes a key and its separator)
_SCALAR = "ScalarSerializer"


@dataclass(frozen=True, slots=True)
class _NumberTemplate:
    """A number scalar's template around its value's token, and its metadata but the value."""

    head: str
    tail: str
    metadata: dict[str, Any]


class Templates(Generic[T]):
    """What a reader made of the documents of leaves serialized alone, by their template: the
    document with the leaf's name taken out. Only a name JSON writes as it is, found exactly
    in the four places cstorch writes it (the spec's structure and string, ``__objects__``,
    the metadata's key), is taken out: nothing else in the document can then depend on it,
    and the spec and ``__objects__`` of any text of the same template are the single leaf's of
    its own name."""

    LIMIT = 4096  # templates kept (distinct dtypes, shapes and serializers)
    NUMBERS = 16  # number scalars' templates kept (a scalar's name and indentation make one)

    def __init__(self) -> None:
        self.known: dict[str, T] = {}  # (one shared by every leaf of the template)
        self.numbers: list[_NumberTemplate] = []

    @staticmethod
    def template(name: str, text: str) -> str | None:
        """``text`` with ``name`` taken out, or None where that would not be safe."""
        if not treespec_json.plain(name) or "\0" in text or text.count(name) != 4:
            return None
        return text.replace(name, "\0")

    def learn(self, template: str, made: T) -> T:
        if len(self.known) < self.LIMIT:
            self.known[template] = made
        return made

    def number(self, template: str) -> dict[str, Any] | None:
        """The metadata of the number scalar whose template is ``template``, as JSON decodes
        it: a template learnt (``learn_number``) with a number token in its value's place."""
        for known in self.numbers:
            head, tail = known.head, known.tail
            end = len(template) - len(tail)
            if end - len(head) > _LONGEST or not (
                template.startswith(head) and template.endswith(tail)
            ):
                continue
            value = _number(template[len(head) : end])
            if value is not None:
                return {**known.metadata, "scalar_value": value}
        return None

    def learn_number(self, template: str, metadata: dict[str, Any]) -> bool:
        """Whether ``metadata``, decoded from the document of ``template``, is a number scalar's
        (its template then learnt, if there is room): its value follows its key once in the
        document, as a number token that decodes to it."""
        value = metadata.get("scalar_value")
        if type(value) not in (int, float) or metadata.get("__TYPE__") != _SCALAR:
            return False
        at = template.find(_KEY)
        if at < 1 or template[at - 1] == "\\" or template.find(_KEY, at + 1) >= 0:
            return False  # (a key escaped inside a string, or twice)
        start = at + len(_KEY)
        token = _NUMBER.match(template, start)
        if token is None or _number(token.group()) != value:
            return False
        head, tail = template[:start], template[token.end() :]
        if not tail or tail[0] in "0123456789.eE+-":
            return False
        if len(self.numbers) < self.NUMBERS:
            self.numbers.append(_NumberTemplate(head, tail, dict(metadata)))
        return True


def _number(token: str) -> int | float | None:
    """``token`` decoded as ``json.loads`` decodes a number; None if it is not one."""
    found = _NUMBER.fullmatch(token) if len(token) <= _LONGEST else None
    if found is None:
        return None
    whole, fraction, exponent = found.groups()
    if fraction or exponent:
        return float(whole + (fraction or "") + (exponent or ""))
    return int(whole)
