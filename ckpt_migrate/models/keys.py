"""Model state-dict keys: patterns on whole dotted segments, and data-driven rename rules.

Release hops that rename model keys declare their rules as data (:class:`KeyRename` tables in the
hop module) and apply them with :func:`apply_renames`, as Model Zoo's CS→CS converters do with
``ConversionRule`` + ``EquivalentSubkey`` (MODELZOO_HISTORY.md §3.3), with these differences:

* a pattern matches whole dotted segments, never substrings (``my_lm_head.weight`` is not
  ``lm_head.weight``); ``.`` is never a regex wildcard (Model Zoo's ``(?:model.|)``, §3.9 #6);
* every rule accepts the optional ``model.`` prefix that 1.8's ``PyTorchBaseModel`` adds
  (§3.5: "All rules accept an optional leading ``model.``") and keeps it as it was;
* a rename moves the leaf object to its new key, in place: the tensor's data is never read or
  copied (the writer renames its dataset), and a tie (one leaf at two keys) stays a tie;
* a rename onto an existing key, two keys renamed onto one, or a rename that changes the order
  of the model's parameters while the optimizer keeps its state by parameter index (§3.8:
  "a rename that reorders parameters would silently misalign optimizer moments") is refused;
* keys no rule matches are kept as they are (the converters' catch-all copy rule).

Pattern syntax (one segment between dots): literal text; ``{a,b}`` one of the alternatives
(inside a segment, e.g. ``proj_{q,k}_dense_layer``; ``{,x}`` allows an empty one); ``#`` an
integer segment; ``*`` any one segment; ``**`` (last only) any number of further segments.
Every ``{..}``, ``#``, ``*`` and ``**`` captures; a rename's target refers to captures as
``$1``, ``$2`` … in order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ckpt_migrate.errors import UnsupportedContentError
from ckpt_migrate.format.tree import DictNode, Key, Node, SeqNode, ValueLeaf
from ckpt_migrate.models import ties

MODEL_PREFIX = "model."


# --------------------------------------------------------------------------- patterns


@dataclass(frozen=True)
class KeyPattern:
    """A key pattern on whole dotted segments (syntax in the module docstring)."""

    text: str

    @cached_property
    def _compiled(self) -> tuple[list[re.Pattern[str]], bool]:
        parts = self.text.split(".")
        rest = parts[-1] == "**"
        if rest:
            parts = parts[:-1]
        if "**" in parts:
            raise ValueError(f"{self.text!r}: '**' may only be the last segment")
        return [re.compile(_segment_regex(p)) for p in parts], rest

    @cached_property
    def expression(self) -> str:
        """One regular expression of a whole key matching the pattern (segments joined by
        dots: no segment's own expression matches a dot), for scanning many keys at once."""
        parts = self.text.split(".")
        rest = parts[-1] == "**"
        body = r"\.".join(f"(?:{_segment_regex(p)})" for p in (parts[:-1] if rest else parts))
        return body + (r"(?:\..*)?" if rest else "")

    def match(self, key: str) -> list[str] | None:
        """The captures if ``key`` matches (without any ``model.`` prefix handling), else None."""
        segments = key.split(".")
        regexes, rest = self._compiled
        if len(segments) < len(regexes) or (not rest and len(segments) != len(regexes)):
            return None
        captures: list[str] = []
        for regex, segment in zip(regexes, segments):
            m = regex.fullmatch(segment)
            if m is None:
                return None
            captures.extend(m.groups())
        if rest:
            captures.append(".".join(segments[len(regexes) :]))
        return captures


def _segment_regex(segment: str) -> str:
    if segment == "#":
        return r"(\d+)"
    if segment == "*":
        return r"([^.]+)"
    out: list[str] = []
    for token in re.split(r"(\{[^{}]*\})", segment):
        if token.startswith("{") and token.endswith("}"):
            out.append("(" + "|".join(re.escape(a) for a in token[1:-1].split(",")) + ")")
        elif token:
            if "{" in token or "}" in token:
                raise ValueError(f"unbalanced braces in pattern segment {segment!r}")
            out.append(re.escape(token))
    return "".join(out)


def matches_any(key: str, patterns: Iterable[KeyPattern]) -> KeyPattern | None:
    """The first pattern ``key`` (with or without the ``model.`` prefix) matches."""
    _, bare = split_prefix(key)
    for pattern in patterns:
        if pattern.match(bare) is not None:
            return pattern
    return None


def split_prefix(key: str) -> tuple[str, str]:
    """``("model.", rest)`` for a key with 1.8's optional prefix, else ``("", key)``."""
    if key.startswith(MODEL_PREFIX) and len(key) > len(MODEL_PREFIX):
        return MODEL_PREFIX, key[len(MODEL_PREFIX) :]
    return "", key


# --------------------------------------------------------------------------- rename rules


@dataclass(frozen=True)
class KeyRename:
    """One release's rename of a model key, as data.

    ``old`` is a pattern (module docstring), ``new`` the new key with ``$1``… for the captures.
    ``families`` limits the rule to those model families (canonical names); ``why`` says what
    the release changed, for the report.
    """

    old: str
    new: str
    families: tuple[str, ...]
    why: str

    @cached_property
    def pattern(self) -> KeyPattern:
        return KeyPattern(self.old)

    def apply(self, key: str) -> str | None:
        """The renamed key, or None if the rule does not match ``key``."""
        prefix, bare = split_prefix(key)
        captures = self.pattern.match(bare)
        if captures is None:
            return None
        new = re.sub(r"\$(\d+)", lambda m: captures[int(m.group(1)) - 1], self.new)
        return prefix + new

    def inverse(self) -> KeyRename:
        """The rule that undoes this one (for downgrades): ``new`` becomes the pattern, each
        ``$n`` standing for the n-th capture of ``old``, and ``old`` the target. Every capture
        must be used exactly once, or the rename loses what the inverse would need."""
        tokens = _capture_tokens(self.old)
        refs = [int(n) for n in re.findall(r"\$(\d+)", self.new)]
        if sorted(refs) != list(range(1, len(tokens) + 1)):
            raise ValueError(f"{self.old!r} -> {self.new!r}: not invertible")
        pattern = re.sub(r"\$(\d+)", lambda m: tokens[int(m.group(1)) - 1], self.new)
        position = {n: i + 1 for i, n in enumerate(refs)}  # capture n of old is $position[n]
        counter = iter(range(1, len(tokens) + 1))
        target = re.sub(_CAPTURE, lambda m: f"${position[next(counter)]}", self.old)
        return KeyRename(pattern, target, self.families, f"undoes: {self.why}")


# A capture of the pattern syntax: {a,b} inside a segment, or a whole #, * or ** segment.
_CAPTURE = re.compile(r"\{[^{}]*\}|(?:(?<=\.)|^)(?:\*\*|\*|#)(?=\.|$)")


def _capture_tokens(pattern: str) -> list[str]:
    return _CAPTURE.findall(pattern)


def rename_for(key: str, rules: Iterable[KeyRename]) -> tuple[str, KeyRename] | None:
    """The first rule that renames ``key`` and the new key (first match wins, like Model Zoo)."""
    for rule in rules:
        new = rule.apply(key)
        if new is not None and new != key:
            return new, rule
    return None


# --------------------------------------------------------------------------- the model state


def model_state(root: Node) -> DictNode | None:
    """The checkpoint's ``model`` state dict, if it has one."""
    if isinstance(root, DictNode):
        model = root.get("model")
        if isinstance(model, DictNode):
            return model
    return None


def model_keys(root: Node) -> list[str]:
    model = model_state(root)
    return [k for k, _ in model.items if isinstance(k, str)] if model is not None else []


def model_config(inputs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``model`` section of the ``--config`` YAML (legacy layout or 2.3+ ``trainer``)."""
    config = inputs.get("config")
    if not isinstance(config, Mapping):
        return None
    if isinstance(config.get("model"), Mapping):
        return config["model"]
    trainer = config.get("trainer")
    if isinstance(trainer, Mapping):
        init = trainer.get("init")
        if isinstance(init, Mapping) and isinstance(init.get("model"), Mapping):
            return init["model"]
    return None


def optimizer_indexed(root: Node) -> bool:
    """Whether the optimizer keeps state by parameter index (torch ``state`` / ``params``)."""
    if not isinstance(root, DictNode):
        return False
    optimizer = root.get("optimizer")
    if not isinstance(optimizer, DictNode):
        return False
    state = optimizer.get("state")
    if isinstance(state, DictNode) and any(type(k) is int for k, _ in state.items):
        return True
    groups = optimizer.get("param_groups")
    if isinstance(groups, SeqNode):
        for group in groups.items:
            params = group.get("params") if isinstance(group, DictNode) else None
            if isinstance(params, SeqNode) and any(
                isinstance(p, ValueLeaf) and type(p.value) is int for p in params.items
            ):
                return True
    return False


@dataclass(frozen=True)
class Renamed:
    old: str
    new: str
    rule: KeyRename


def plan_renames(keys: Iterable[Key], rules: Iterable[KeyRename]) -> list[Renamed]:
    rules = tuple(rules)
    out: list[Renamed] = []
    for key in keys:
        if isinstance(key, str):
            hit = rename_for(key, rules)
            if hit is not None:
                out.append(Renamed(key, hit[0], hit[1]))
    return out


def apply_renames(
    root: Node,
    rules: Iterable[KeyRename],
    *,
    target: str,
    inputs: Mapping[str, Any] | None = None,
    source_path: Any = None,
) -> tuple[list[Renamed], list[str]]:
    """Rename the keys of ``root["model"]`` in place by ``rules`` (metadata only).

    Returns the renames done and notes for the report. Refuses (``UnsupportedContentError``) a
    rename onto a key that stays, two keys renamed onto one, and a change of the parameter
    order while the optimizer keeps state by index. Names in a 2.0/2.1 sparsity optimizer state
    (``optimizer.sparsity.state`` keys, ``param_groups[*].param_names``) follow the model keys.
    """
    model = model_state(root)
    if model is None:
        return [], []
    renames = plan_renames([k for k, _ in model.items], rules)
    if not renames:
        return [], []
    mapping = {r.old: r.new for r in renames}
    keys = [k for k, _ in model.items]
    new_keys = [mapping.get(k, k) if isinstance(k, str) else k for k in keys]
    seen: dict[Key, Key] = {}
    for old, new in zip(keys, new_keys):
        if new in seen:
            first = seen[new]
            raise UnsupportedContentError(
                source_path,
                f"model keys {first!r} and {old!r} would both be named {new!r} in {target}",
                "the checkpoint mixes layouts of two releases; upgrade it from a clean save",
            )
        seen[new] = old
    notes: list[str] = []
    before = _parameter_order(keys, model, inputs)
    after = _parameter_order(new_keys, model, inputs)
    if [i for i, _ in before] != [i for i, _ in after]:
        detail = _first_move(before, after, mapping, target)
        if optimizer_indexed(root):
            raise UnsupportedContentError(
                source_path,
                f"{detail}, and the optimizer keeps its state by parameter index: its moments "
                "would be paired with the wrong parameters",
                "remove the optimizer state from a copy of the checkpoint and upgrade that "
                "(the weights carry over; the optimizer restarts)",
            )
        notes.append(f"{detail}; no optimizer state is kept by index, so nothing is misaligned")
    model.items = [(k, v) for k, (_, v) in zip(new_keys, model.items)]
    notes.extend(_rename_sparsity_names(root, mapping))
    return renames, notes


def _parameter_order(
    keys: list[Key], model: DictNode, inputs: Mapping[str, Any] | None
) -> list[tuple[int, Key]]:
    """Distinct parameters, as (identity, first key), in the order a torch module tree lists
    them (``parameters()``).

    A module's own entries come before its submodules', each group in first-seen order: that
    is how ``state_dict`` and ``parameters()`` walk a model, so grouping the keys by their
    module path gives the order the target release's model will have. One leaf at two keys, or
    two keys of one dtype and shape that a tie rule joins (models.ties), is one parameter.
    """
    leaves = {k: v for k, (_, v) in zip(keys, model.items)}
    ident = _identities(keys, leaves, model_config(inputs or {}))
    order: list[tuple[int, Key]] = []
    seen: set[int] = set()
    for key in _module_order(keys):
        if ident[key] not in seen:
            seen.add(ident[key])
            order.append((ident[key], key))
    return order


def _identities(
    keys: list[Key], leaves: dict[Key, Node], config: Mapping[str, Any] | None
) -> dict[Key, int]:
    """Union-find over keys: same leaf object, or tie partners of the same dtype and shape."""
    parent = list(range(len(keys)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    index = {k: i for i, k in enumerate(keys)}
    by_leaf: dict[int, int] = {}
    for i, key in enumerate(keys):
        j = by_leaf.setdefault(id(leaves[key]), i)
        parent[find(i)] = find(j)
        if not isinstance(key, str):
            continue
        for partner, _rule in ties.partners(key, config):
            j = index.get(partner)
            if j is not None and _same_kind(leaves[key], leaves[partner]):
                parent[find(i)] = find(j)
    return {k: find(i) for i, k in enumerate(keys)}


def _same_kind(a: Node, b: Node) -> bool:
    return (getattr(a, "dtype", None), getattr(a, "shape", None)) == (
        getattr(b, "dtype", None),
        getattr(b, "shape", None),
    )


def _module_order(keys: list[Key]) -> Iterator[Key]:
    tree: dict[str, Any] = {"": [], "children": {}}
    for key in keys:
        parts = str(key).split(".")
        node = tree
        for part in parts[:-1]:
            node = node["children"].setdefault(part, {"": [], "children": {}})
        node[""].append(key)

    def walk(node: dict[str, Any]) -> Iterator[Key]:
        yield from node[""]
        for child in node["children"].values():
            yield from walk(child)

    yield from walk(tree)


def _first_move(
    before: list[tuple[int, Key]],
    after: list[tuple[int, Key]],
    mapping: dict[str, str],
    target: str,
) -> str:
    """Say which parameter the renames move ahead of which."""
    old_key = {ident: key for ident, key in before}
    for (a, key_a), (b, _) in zip(before, after):
        if a != b:
            moved = old_key[b]
            how = f"{moved} → {mapping[moved]}" if moved in mapping else str(moved)
            return (
                f"renaming moves parameter {how} ahead of {key_a} in the {target} model's "
                "parameter order"
            )
    return f"the renames change the number of distinct parameters in {target}"


def _rename_sparsity_names(root: Node, mapping: dict[str, str]) -> list[str]:
    """2.0/2.1 sparsity keeps per-weight state under the weight's model key: rename it too."""
    notes: list[str] = []
    if not isinstance(root, DictNode):
        return notes
    optimizer = root.get("optimizer")
    sparsity = optimizer.get("sparsity") if isinstance(optimizer, DictNode) else None
    if not isinstance(sparsity, DictNode):
        return notes
    state = sparsity.get("state")
    if isinstance(state, DictNode):
        for i, (key, value) in enumerate(state.items):
            if isinstance(key, str) and key in mapping:
                state.items[i] = (mapping[key], value)
                notes.append(f"optimizer.sparsity.state.{key} → {mapping[key]} (follows the model)")
    groups = sparsity.get("param_groups")
    for g, group in enumerate(groups.items if isinstance(groups, SeqNode) else []):
        names = group.get("param_names") if isinstance(group, DictNode) else None
        if not isinstance(names, SeqNode):
            continue
        for i, leaf in enumerate(names.items):
            if isinstance(leaf, ValueLeaf) and leaf.value in mapping:
                names.items[i] = ValueLeaf(mapping[leaf.value])
                notes.append(
                    f"optimizer.sparsity.param_groups.{g}.param_names.{i}: {leaf.value} → "
                    f"{mapping[leaf.value]} (follows the model)"
                )
    return notes
