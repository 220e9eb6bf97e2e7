"""Format 0.5 structure: torch's JSON treespec (protocol 1) inside the root ``__spec__``.

FORMAT.md §4.2. The root attribute is ``json.dumps([structure, treespec_string], indent=4)``;
``treespec_string`` is ``torch.utils._pytree.treespec_dumps`` output. It is parsed here as plain
JSON: no module named in it is ever imported (torch's own decoder imports modules for
``defaultdict`` contexts).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_migrate.errors import CkptError, CorruptCheckpointError, UnsupportedContentError
from ckpt_migrate.format import budgets
from ckpt_migrate.format.tree import (
    DictNode,
    Key,
    MissingLeaf,
    NamedTupleNode,
    Node,
    SeqNode,
    is_leaf,
)

PROTOCOL = 1
_LEAF_JSON = {"type": None, "context": None, "children_spec": []}
_PLAIN = re.compile(r"[A-Za-z0-9_.\-]*")  # characters ``json.dumps`` leaves as they are
_SINGLE_HEAD, _SINGLE_TAIL = json.dumps(
    [PROTOCOL, {"type": "builtins.dict", "context": '["@"]', "children_spec": [_LEAF_JSON]}]
).split("@")
_SEQ_TYPES = {"builtins.list": "list", "builtins.tuple": "tuple", "builtins.set": "set"}
_SEQ_NAMES = {kind: name for name, kind in _SEQ_TYPES.items()}
_LEAF_TEXT = json.dumps(_LEAF_JSON)


def parse(text: str, path: str | Path | None = None) -> Node:
    """The tree described by a treespec string; every leaf is a ``MissingLeaf`` named per §2.2."""
    return parse_named(text, path)[0]


def parse_named(text: str, path: str | Path | None = None) -> tuple[Node, bool]:
    """``parse``, and whether two leaves share a name (``tree.name_collisions`` says which)."""
    return build(decode(text, path), path)


def decode(text: str, path: str | Path | None = None) -> list[Any]:
    """A treespec string as JSON, each node as ``build`` takes it: a caller that lets go of
    ``text`` then (15 MB at 150k leaves) does not hold it while the tree is built."""
    try:
        decoded = json.loads(text, object_hook=_spec_node)
    except RecursionError:
        raise budgets.too_deep(path, "__spec__") from None
    except (ValueError, TypeError) as exc:
        raise CorruptCheckpointError(path, f"__spec__ treespec is not valid JSON ({exc})") from None
    if type(decoded) is not list or len(decoded) != 2:
        raise CorruptCheckpointError(path, "__spec__ treespec is not a [protocol, node] pair")
    return decoded


def _dropped(pairs: list[tuple[str, Any]]) -> None:
    return None


@dataclass(slots=True)
class Spec:
    """A format 0.5 root's ``__spec__`` text decoded as JSON: its treespec string (decoded by
    ``decode``), or the error met; ``nbytes``: the text's size. A reader decodes it as soon as
    it has the text, which is then not held while the rest of the root is read (27 MB at 150k
    leaves, issue 33)."""

    nbytes: int
    treespec: Any = None
    error: CkptError | None = None

    @staticmethod
    def of(text: str, path: Path) -> Spec:
        nbytes = len(text) if text.isascii() else len(text.encode())
        try:
            # (the first element, the leaves' names by module, is checked as JSON, not kept:
            # 9 MB of the decode's peak at 150k leaves)
            return Spec(nbytes, json.loads(text, object_pairs_hook=_dropped)[1])
        except RecursionError:
            return Spec(nbytes, error=budgets.too_deep(path, "__spec__"))
        except (KeyError, ValueError, TypeError, IndexError):
            return Spec(nbytes, error=Spec.unreadable(path))

    @staticmethod
    def unreadable(path: Path) -> CorruptCheckpointError:
        return CorruptCheckpointError(path, "format 0.5 file without a readable __spec__")


def build(
    decoded: list[Any],
    path: str | Path | None = None,
    leaf: Callable[[str], Node] = MissingLeaf,
) -> tuple[Node, bool]:
    """``decode``'s answer as a tree and whether two of its leaves share a name; each leaf
    is ``leaf`` of its name, made in flatten order. The JSON nodes are let go of as their
    subtrees are built (``decoded`` is emptied): the decoded document and the tree were both
    whole at once, 30 MB at 150k leaves (issue 33)."""
    proto, node = decoded
    decoded.clear()
    if proto != PROTOCOL:
        raise UnsupportedContentError(
            path, f"treespec protocol {proto!r} is not supported (only {PROTOCOL})"
        )
    parser = _Parser(path, leaf)
    return parser.node(node, 0, "", False), parser.shared


def _spec_node(d: dict[str, Any]) -> _SpecNode:
    """A JSON object of the treespec as the parser takes it: a leaf's (``_LEAF_JSON``, 188k of
    them at 150k tensors) as one shared node, any other as its own ``_SpecNode``."""
    if d.get("type", _SpecNode) is None:
        kids = d.get("children_spec")
        if type(kids) is list and not kids:
            return _LEAF
    return _SpecNode(d)


class _SpecNode:
    """A treespec node as JSON gives it, kept as three slots rather than a dictionary while
    the whole document is decoded (225k nodes at 150k leaves: a third of the memory)."""

    __slots__ = ("context", "keyed", "kids", "kind")

    def __init__(self, d: dict[str, Any]) -> None:
        self.keyed = "type" in d and "children_spec" in d
        self.kind, self.context, self.kids = d.get("type"), d.get("context"), d.get("children_spec")


_LEAF = _SpecNode({"type": None, "children_spec": []})


class _Parser:
    """JSON nodes to tree nodes, within the node and depth budgets, each leaf named as it is
    made (the name ``tree.iter_leaves`` gives its position: a walk less per read, 150k leaves)."""

    def __init__(self, path: str | Path | None, leaf: Callable[[str], Node] = MissingLeaf):
        self.path, self.leaf = path, leaf
        self.visited = 0
        self.names: set[str] = set()  # (the leaves' below a loose dict: ``dict_keys``)
        self.shared = False
        # A short context's keys, checked, by its text: 37k optimizer states' dicts at 150k
        # tensors share one (``["step", "exp_avg", "exp_avg_sq"]``), decoded 37k times
        self.contexts: dict[str, tuple[tuple[Key, ...], bool]] = {}
        self.words: dict[str, str] = {}

    def malformed(self, what: str = "has a malformed node") -> CorruptCheckpointError:
        return CorruptCheckpointError(self.path, f"__spec__ treespec {what}")

    def node(self, obj: Any, depth: int, name: str, loose: bool) -> Node:
        """The tree node of ``obj``, named ``name``; ``loose``: whether a dict above it has
        keys whose names could meet (``dict_keys``)."""
        self.visited += 1
        if self.visited > budgets.MAX_SPEC_NODES:
            raise budgets.too_many_nodes(self.path)
        if depth > budgets.MAX_DEPTH:
            raise budgets.too_deep(self.path, repr(budgets.short(name)))
        if type(obj) is not _SpecNode or not obj.keyed:
            raise self.malformed()
        kind, kids = obj.kind, obj.kids
        if type(kids) is not list or not (kind is None or type(kind) is str):
            raise self.malformed()
        if kind is None:
            if kids:
                raise self.malformed("leaf has children")
            if loose:
                self.shared = self.shared or name in self.names
                self.names.add(name)
            return self.leaf(name)
        prefix = f"{name}." if depth else ""
        deeper = depth + 1
        if kind in ("builtins.dict", "collections.OrderedDict"):
            keys, meet = self.dict_keys(kind, obj.context, len(kids), name)
            obj.context = None
            loose = loose or meet
            items = [
                (k, self.node(kid, deeper, f"{prefix}{k}", loose))
                for k, kid in zip(keys, _taken(kids))
            ]
            return DictNode(items, ordered=kind == "collections.OrderedDict")
        # (refused before its children are named: the real writer names a defaultdict's
        # leaves after its context, ``d.<class 'list'>.0``, not after their positions)
        if kind not in _SEQ_TYPES and kind not in ("collections.namedtuple", "NestedObject"):
            raise self.unsupported(kind, name)
        items = [
            self.node(kid, deeper, f"{prefix}{i}", loose) for i, kid in enumerate(_taken(kids))
        ]
        if kind in _SEQ_TYPES:
            return SeqNode(_SEQ_TYPES[kind], items)  # type: ignore[arg-type]
        label = obj.context if isinstance(obj.context, str) else "namedtuple"
        return NamedTupleNode(label, tuple(f"_{i}" for i in range(len(items))), items)

    def unsupported(self, kind: str, name: str) -> UnsupportedContentError:
        """A container ckpt-migrate does not read, and truly why (FORMAT.md §4.2)."""
        where = repr(budgets.short(name or "<root>"))
        if kind == "collections.deque":
            # (the real 2.10 writes one without a maxlen, context null, and reads it back as a
            # deque; with a maxlen its save fails: fixtures/real-cstorch-2.10/refused/)
            why = "a deque, which ckpt-migrate does not read (its tree holds lists, not deques)"
            fix = "re-save the state dict with a list in its place (list(the_deque))"
        elif kind == "collections.defaultdict":
            why = "which ckpt-migrate does not read (reading it imports code the file names)"
            fix = "re-save the state dict with a dict in its place"
        else:
            why = "which ckpt-migrate does not know"
            fix = "re-save the state dict with a dict or list in its place"
        return UnsupportedContentError(
            self.path, f"__spec__ uses container type {kind!r} at {where}, {why}", fix
        )

    def dict_keys(
        self, kind: str, context: Any, count: int, name: str = ""
    ) -> tuple[tuple[Key, ...], bool]:
        """A dict's keys, and whether a name below one of them could be a name below another:
        only where a key holds a dot, or two keys read alike (``1`` and ``"1"``). Elsewhere
        two names part at the first key they differ by, so that only the leaves below such
        keys are kept to be checked (a set of 188k leaves' names was 8 MiB of a 150k-tensor
        read's peak, the optimizer's 150k states having no such keys, issue 33)."""
        known = self.contexts.get(context) if type(context) is str else None
        if known is not None:
            if len(known[0]) != count:
                raise self.malformed(f"{kind} context does not match children")
            return known
        keys = _json_context(context, self.path)
        if not isinstance(keys, list) or len(keys) != count:
            raise self.malformed(f"{kind} context does not match children")
        for i, k in enumerate(keys):
            if type(k) is str:
                # (one object per distinct key: each dict's context is its own JSON document,
                # and 150k leaves' keys were 150k strings of a few dozen words, 15 MB; kept
                # here, not interned: the interpreter's table only grows, 3.75 MB at 112k)
                keys[i] = self.words.setdefault(k, k)
            elif type(k) is not int:
                # (the real writer saves None, bool and float keys, and its loader reads them)
                raise UnsupportedContentError(
                    self.path,
                    f"the dict at {budgets.short(name or '<root>')!r} has a key {k!r} of type "
                    f"{type(k).__name__}, which ckpt-migrate does not read (it reads str and "
                    "int keys)",
                    "re-save the state dict with that key as a str (or an int) with the "
                    "library that wrote the file",
                )
        meet = any(type(k) is str and "." in k for k in keys)
        known = tuple(keys), meet or len({str(k) for k in keys}) < count
        if len(context) <= CONTEXT_KEPT_CHARS and len(self.contexts) < CONTEXTS_KEPT:
            self.contexts[context] = known
        return known


CONTEXTS_KEPT = 4096  # distinct dict contexts remembered (``_Parser.dict_keys``)
CONTEXT_KEPT_CHARS = 1024  # (the largest, a model's keys, is decoded once anyway)


def _taken(kids: list[Any]) -> Iterator[Any]:
    """``kids`` one by one, each let go of by the list as it is given (``build``)."""
    for i, kid in enumerate(kids):
        kids[i] = None
        yield kid


def _json_context(context: Any, path: str | Path | None) -> Any:
    if not isinstance(context, str):
        raise CorruptCheckpointError(path, "__spec__ treespec context is not a JSON string")
    try:
        return json.loads(context)
    except ValueError:
        raise CorruptCheckpointError(path, "__spec__ treespec context is not valid JSON") from None


# --------------------------------------------------------------------------- writing


# Pieces of a text joined into one chunk at a time (``_Text``).
SPILL_EVERY = 4096


class _Text:
    """A long text written piece by piece, its pieces joined every ``SPILL_EVERY`` of them
    (each chunk through ``encode``): the 27 MB ``__spec__`` of 188k leaves was a million small
    strings held at once, then twice more as the treespec and its JSON string (issue 33)."""

    __slots__ = ("append", "chunks", "encode", "pieces", "sink")

    def __init__(
        self, encode: Callable[[str], str] | None = None, sink: io.BytesIO | None = None
    ) -> None:
        self.pieces: list[str] = []
        self.append = self.pieces.append
        self.chunks: list[str] = []
        self.encode = encode
        self.sink = sink  # (where each chunk goes as UTF-8, if given, instead of ``chunks``)

    def spill(self) -> None:
        """Join the pieces so far, if there are enough of them (called between pieces)."""
        if len(self.pieces) >= SPILL_EVERY:
            self._join()

    def _join(self) -> None:
        chunk = "".join(self.pieces)
        self.pieces.clear()
        chunk = chunk if self.encode is None else self.encode(chunk)
        if self.sink is None:
            self.chunks.append(chunk)
        else:
            self.sink.write(chunk.encode("utf-8"))

    def text(self) -> str:
        self._join()
        return "".join(self.chunks)


def _json_string_body(text: str) -> str:
    """``json.dumps(text)`` without its quotes: the escaping is character by character, so
    that of a whole text is that of its chunks put end to end."""
    return json.dumps(text)[1:-1]


def dumps(node: Node) -> str:
    """``treespec_dumps``: the protocol-1 JSON string, ``json.dumps([1, {"type": ...,
    "context": ..., "children_spec": [...]}])`` written piece by piece (no dictionary per
    node: 225k of them at 150k leaves)."""
    out = _Text()
    _dump_into(node, out)
    return out.text()


def _dump_into(node: Node, out: _Text) -> None:
    out.append(f"[{PROTOCOL}, ")
    _treespec(node, out)
    out.append("]")


def _treespec(node: Node, out: _Text) -> None:
    """torch's ``_treespec_to_json`` of ``node`` (key order type, context, children_spec)."""
    if is_leaf(node):
        out.append(_LEAF_TEXT)
        return
    if isinstance(node, DictNode):
        kind = "collections.OrderedDict" if node.ordered else "builtins.dict"
        out.append(f'{{"type": "{kind}", "context": ')
        _keys_context(node, out)
        kids = [v for _, v in node.items]
    elif isinstance(node, SeqNode):
        kind, kids = _SEQ_NAMES[node.kind], node.items
        out.append(f'{{"type": "{kind}", "context": "null"')
    else:
        raise UnsupportedContentError(
            None,
            f"namedtuple {node.name!r} cannot be written in format 0.5 (only classes registered "
            "with the real library can)",
            "it is written as a tuple instead; call as_tuples() first",
        )
    out.append(', "children_spec": [')
    for i, kid in enumerate(kids):
        if i:
            out.append(", ")
        _treespec(kid, out)
        out.spill()
    out.append("]}")


def _keys_context(node: DictNode, out: _Text) -> None:
    """``json.dumps(json.dumps(node.keys()))`` a key at a time: escaping is character by
    character, so the outer document's escape of each key's piece, end to end, is that of the
    whole (made at once, the key list of a 150k-item dict was 45 MB of texts held together,
    the peak of an import, issue 33)."""
    out.append('"[')
    for i, key in enumerate(node.keys()):
        out.append(_json_string_body(", " + json.dumps(key) if i else json.dumps(key)))
        out.spill()
    out.append(']"')


def plain(name: str) -> bool:
    """Whether ``json.dumps`` writes ``name`` as it is (no character escaped)."""
    return _PLAIN.fullmatch(name) is not None


def single_leaf_spec(name: str) -> str:
    """The spec ``cstorch.save`` writes into a leaf's ``__metadata__``: a dict of one leaf,
    ``name``; each leaf of a checkpoint has its own. A name JSON writes as it is (the common
    case) is put in place: two ``json.dumps`` calls per leaf were 10 % of reading 150k leaves."""
    if plain(name):
        return _SINGLE_HEAD + name + _SINGLE_TAIL
    node = {"type": "builtins.dict", "context": json.dumps([name]), "children_spec": [_LEAF_JSON]}
    return json.dumps([PROTOCOL, node])


def root_spec_text(node: Node) -> str:
    """The root's ``__spec__``: ``json.dumps([structure, dumps(node)], indent=4)``, the
    structure being the tree with ``"*"`` leaves, or null if JSON cannot hold it (a set)."""
    return root_spec_bytes(node).decode("utf-8")


def root_spec_bytes(node: Node) -> bytes:
    """``root_spec_text`` as UTF-8, the bytes HDF5 stores, written piece by piece like
    ``dumps`` into one buffer (``BytesIO.getvalue`` shares it), the treespec escaped as a JSON
    string chunk by chunk (``_json_string_body``): the text's two halves, the text joined and
    its encoding were up to 54 MB at once at 150k leaves, the peak of a root edit (issue 33)."""
    out = io.BytesIO()
    out.write(b"[\n    ")
    start = out.tell()
    try:
        structure = _Text(sink=out)
        _structure(node, 1, structure)
        structure.text()
    except TypeError:
        out.seek(start)
        out.truncate()
        out.write(b"null")
    out.write(b',\n    "')
    spec = _Text(_json_string_body, sink=out)
    _dump_into(node, spec)
    spec.text()
    out.write(b'"\n]')
    return out.getvalue()


def _structure(node: Node, level: int, out: _Text) -> None:
    """``json.dumps(..., indent=4)`` of the structure of ``node`` at depth ``level``."""
    if is_leaf(node):
        out.append('"*"')
        return
    if isinstance(node, SeqNode) and node.kind == "set":
        raise TypeError("set")
    if isinstance(node, DictNode):
        entries = node.items
        opening, closing = "{", "}"
    else:
        entries = node.items  # type: ignore[union-attr]
        opening, closing = "[", "]"
    if not entries:
        out.append(opening + closing)
        return
    inner = "\n" + "    " * (level + 1)
    out.append(opening)
    keyed = opening == "{"
    for i, entry in enumerate(entries):
        out.append(("," if i else "") + inner)
        if keyed:
            key, value = entry
            out.append(_key(key) + ": ")
        else:
            value = entry
        _structure(value, level + 1, out)
        out.spill()
    out.append("\n" + "    " * level + closing)


def _key(key: Key) -> str:
    """A dict key as ``json.dumps`` writes it (an int as its decimal string)."""
    text = key if isinstance(key, str) else str(key)
    return f'"{text}"' if plain(text) else json.dumps(text)


def as_tuples(node: Node) -> Node:
    """The same tree with every namedtuple turned into a tuple (0.5 cannot name their classes)."""
    if isinstance(node, DictNode):
        return DictNode([(k, as_tuples(v)) for k, v in node.items], node.ordered)
    if isinstance(node, SeqNode):
        return SeqNode(node.kind, [as_tuples(v) for v in node.items])
    if isinstance(node, NamedTupleNode):
        return SeqNode("tuple", [as_tuples(v) for v in node.items])
    return node
