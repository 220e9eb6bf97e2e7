"""The hops' declared inputs (``hops.hop.InputSpec``), as the command line gives them.

An input is declared once, in the hop module that reads it. ``upgrade``, ``upgrade-dir`` and
``plan`` offer every one as an option (``cli.options.offer_hop_inputs``), the Model Zoo
scripts too, with Model Zoo's spellings as aliases (``cli.script_options``), and ``to_inputs``
turns what was given into the engine's inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from ckpt_migrate.errors import CkptError, UsageError
from ckpt_migrate.format import releases
from ckpt_migrate.hops import graph
from ckpt_migrate.hops.hop import InputSpec


def specs() -> tuple[InputSpec, ...]:
    """Every input some hop declares as an option, once per name, in graph order."""
    found: dict[str, InputSpec] = {}
    for hop in graph.load().hops:
        for spec in hop.inputs:
            if spec.option:
                found.setdefault(spec.name, spec)
    return tuple(found.values())


def to_inputs(values: dict[str, Any]) -> dict[str, Any]:
    """The engine's inputs for the hop options given (None or False: not given). A choice
    outside its list, an input without one it needs, or two that exclude each other is a usage
    error, raised before any file is read."""
    declared = {spec.name: spec for spec in specs()}
    inputs = {n: v for n, v in values.items() if v is not None and v is not False}  # 0 counts
    for name, value in inputs.items():
        spec = declared.get(name)
        if spec is None:
            continue
        if spec.choices and value not in spec.choices:
            raise UsageError(
                None, f"{spec.flag} must be {' or '.join(spec.choices)}, not {value!r}"
            )
        for other in spec.needs:
            if other not in inputs:
                shown = declared[other]
                wanted = " or ".join(shown.choices) if shown.choices else "a value"
                raise UsageError(None, f"{spec.flag} needs {shown.flag} {wanted}")
        for other in spec.excludes:
            if other in inputs:
                raise UsageError(None, f"{spec.flag} and {declared[other].flag} exclude each other")
    return inputs


def unused(given: dict[str, Any], chains: Iterable[tuple[str | None, str | None]]) -> list[str]:
    """A line for each hop option ``given`` that no hop of the runs' ``chains`` (source and
    target release names) takes: it did nothing (a ``--data-iter-dir`` given for a 2.0 file
    was passed over without a word)."""
    names = [name for name, value in given.items() if value is not None and value is not False]
    if not names:
        return []
    hops, used = graph.load(), set()
    for source, target in chains:
        if source and target and source != target:
            with contextlib.suppress(CkptError):  # (a chain that cannot be walked did not run)
                for hop in hops.path(releases.get(source), releases.get(target)):
                    used.update(spec.name for spec in hop.inputs)
    declared = {spec.name: spec for spec in specs()}
    lines = []
    for name in names:
        spec = declared.get(name)
        if spec is None or name in used:
            continue
        takers = [
            f"{h.source} → {h.target}" for h in hops.hops if any(s.name == name for s in h.inputs)
        ]
        lines.append(
            f"{spec.flag} was not used: it is for the {' and '.join(takers)} hop, which no "
            "checkpoint here needed"
        )
    return lines
