"""A family's tensors as a table, and the one interpreter that runs it either way.

A :class:`Table` is named :class:`Group` s of :class:`Row` s. A row pairs CS name patterns with
HF name patterns and the :class:`~ckpt_migrate.hf.ops.Op` between them; patterns hold ``{p}``
(the HF prefix, e.g. ``transformer.``), ``{c}`` (a CS prefix), ``{i}`` (the layer of a
per-layer group) and ``{s}`` (each of the row's ``suffixes``). Export (``to_hf``) runs each
row's operation, import (``to_cs``) its inverse from the other side.

Plan order is an output fact (safetensors shards and the CS tree are written in plan order),
and the hand-written rules this replaces emitted each direction in its own order. So a table
names its groups' order per direction (a group left out of one direction's order is not run
that way: another group's operation writes those tensors), and a group sorts its outputs by the
axes it names per direction: ``layer``, ``row``, ``suffix`` and ``piece`` (which output of one
operation).

A table runs in a :class:`~ckpt_migrate.hf.ops.Ctx` (the layers, the prefix, the flags its rows'
``when`` read, the dims its operations read) that a *context* builds from a :class:`Query` (the
direction, the source side's shapes and config, the model name) and the parameters a catalogue
record declares (``Hf.tensors``); one context serves each layout group (``hf/layouts/``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ckpt_migrate.hf.mapping import MappingError, Out, Shape, missing_inputs
from ckpt_migrate.hf.ops import RENAME, Ctx, Op

TO_HF, TO_CS = "to_hf", "to_cs"
AXES = ("layer", "row", "suffix", "piece")
BOTH = ("weight", "bias")
Check = Callable[[list[Out], Ctx], list[Out]]  # the plan, or MappingError


@dataclass(frozen=True)
class Row:
    """CS patterns <-> HF patterns through ``op``; only when ``ctx.has(when)`` if given."""

    cs: tuple[str, ...]
    hf: tuple[str, ...]
    op: Op = RENAME
    suffixes: tuple[str, ...] = ("",)
    when: str | None = None


def row(cs: str | Sequence[str], hf: str | Sequence[str], op: Op = RENAME, **kw) -> Row:
    """A :class:`Row` from one pattern or several on each side."""
    return Row(_many(cs), _many(hf), op, **kw)


def pair(cs: str, hf: str, op: Op = RENAME, when: str | None = None) -> Row:
    """Weight and bias of one module (``cs``/``hf`` without the ``.weight``)."""
    return Row((cs + ".{s}",), (hf + ".{s}",), op, BOTH, when)


def _many(x: str | Sequence[str]) -> tuple[str, ...]:
    return (x,) if isinstance(x, str) else tuple(x)


@dataclass(frozen=True)
class Group:
    """Rows run once, or once per layer (``ctx.layers``, or ``ctx.dims[layers]``); outputs sorted
    by ``order`` (per direction)."""

    rows: tuple[Row, ...]
    per_layer: bool = False
    order: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    layers: str | None = None  # ``ctx.dims[layers]`` layers instead of ``ctx.layers`` (T5's stacks)

    def axes(self, direction: str) -> tuple[str, ...]:
        return self.order.get(direction, AXES)


@dataclass(frozen=True)
class Table:
    """A family's tensors: its groups, their order per direction, and the check of the plan
    (:func:`checked`, or the family's own; none leaves it to the pipeline's unused-tensor
    rule)."""

    groups: Mapping[str, Group]
    order: Mapping[str, tuple[str, ...]]
    check: Check | None = None

    def plan(self, direction: str, ctx: Ctx) -> list[Out]:
        """Every output of ``direction`` in the table's order, checked by ``check``."""
        groups = (self.groups[name] for name in self.order[direction])
        plan = [out for group in groups for out in _run(group, direction, ctx)]
        return self.check(plan, ctx) if self.check else plan


Plan = Callable[[Mapping[str, Shape], Mapping[str, Any], str], list[Out]]


@dataclass(frozen=True)
class Query:
    """What a context reads to build the :class:`~ckpt_migrate.hf.ops.Ctx` of a table: the
    ``direction``, the source side's tensor ``shapes``, its ``config`` (the CS ``model:``
    section exporting, ``config.json`` importing) and the model ``name``."""

    direction: str
    shapes: Mapping[str, Shape]
    config: Mapping[str, Any]
    name: str

    @property
    def to_hf(self) -> bool:
        return self.direction == TO_HF


Context = Callable[[Query], Ctx]
Feature = Callable[[Query, Mapping[str, Any]], tuple[set[str], dict[str, Any]]]


def features(
    q: Query, cfg: Mapping[str, Any], chosen: Sequence[str], known: Mapping[str, Feature]
) -> tuple[set[str], dict[str, Any]]:
    """The flags and dims of the ``chosen`` features (a record's, named in ``known``) of the
    config ``cfg``."""
    flags: set[str] = set()
    dims: dict[str, Any] = {}
    for name in chosen:
        more, values = known[name](q, cfg)
        flags |= more
        dims |= values
    return flags, dims


def plans(table: Table, context: Context, names: tuple[str, ...] = ()) -> tuple[Plan, Plan]:
    """A family's ``plan_to_hf`` and ``plan_to_cs`` (the contract of ``hf/mapping.py``):
    ``table`` run each way (:func:`plan`) in the ``context`` the family reads from the config
    (``names``: the names the rules serve)."""
    return partial(plan, TO_HF, table, context, names), partial(plan, TO_CS, table, context, names)


def plan(
    direction: str,
    table: Table,
    context: Context,
    names: tuple[str, ...],
    shapes: Mapping[str, Shape],
    config: Mapping[str, Any],
    name: str,
) -> list[Out]:
    """``table``'s plan of ``direction`` from the source side's ``shapes`` and ``config``; a
    name the rules do not serve (``names``, when given) is refused."""
    if names and name not in names:
        raise MappingError(f"model name {name!r} is not one of {', '.join(names)}")
    return table.plan(direction, context(Query(direction, shapes, config, name)))


def _run(group: Group, direction: str, ctx: Ctx) -> list[Out]:
    axes = group.axes(direction)
    tagged: list[tuple[tuple[int, ...], Out]] = []
    count = ctx.layers if group.layers is None else int(ctx.dims[group.layers])
    for layer in range(count) if group.per_layer else (0,):
        for r, rule in enumerate(group.rows):
            if rule.when is not None and not all(ctx.has(w) for w in rule.when.split()):
                continue
            for s, suffix in enumerate(rule.suffixes):
                cs, hf = _fill(rule.cs, ctx, layer, suffix), _fill(rule.hf, ctx, layer, suffix)
                src, dst = (cs, hf) if direction == TO_HF else (hf, cs)
                op = rule.op if direction == TO_HF else rule.op.inverse()
                outs = op.forward(src, dst, ctx)
                for piece, out in enumerate(outs):
                    at = {"layer": layer, "row": r, "suffix": s, "piece": piece}
                    tagged.append((tuple(at[a] for a in axes), out))
    return [out for _, out in sorted(tagged, key=lambda t: t[0])]


def _fill(patterns: tuple[str, ...], ctx: Ctx, layer: int, suffix: str) -> tuple[str, ...]:
    return tuple(p.format(p=ctx.prefix, c=ctx.cs_prefix, i=layer, s=suffix) for p in patterns)


def inputs_present(message: str, most: int | None = None) -> Check:
    """A table's check that every input its plan reads exists, else MappingError(``message``)
    formatted with the missing names (``first``; ``names``, the first ``most`` of them
    comma-separated; ``count``) and the source side (``side``, ``ctx.dims["side"]``). Source
    tensors no row reads are left to the pipeline's unused-tensor rule (``hf/unconverted.py``
    names those Model Zoo drops) unless the table's check is :func:`checked`. Each layout
    group words its message as its hand-written rules did; the golden plans hold them."""

    def check(plan: list[Out], ctx: Ctx) -> list[Out]:
        missing = missing_inputs(plan, ctx.available)
        if missing:
            names = ", ".join(missing[:most])
            side = ctx.dims.get("side")
            raise MappingError(
                message.format(first=missing[0], names=names, count=len(missing), side=side)
            )
        return plan

    return check


_ALL_PRESENT = inputs_present("missing tensors: {names}")


def checked(plan: list[Out], ctx: Ctx) -> list[Out]:
    """The plan, or MappingError naming the inputs it lacks or the source tensors no rule
    converts (those ``ctx.dropped`` full-matches are left out on purpose, ``ctx.ties`` are
    copies the pipeline checks)."""
    available = ctx.available
    _ALL_PRESENT(plan, ctx)
    used = {i for out in plan for i in out.inputs} | set(ctx.ties)
    skip = re.compile(ctx.dropped) if ctx.dropped else None
    unknown = [n for n in available if n not in used and not (skip and skip.fullmatch(n))]
    if unknown:
        raise MappingError(f"no rule converts: {', '.join(sorted(unknown))}")
    return plan
