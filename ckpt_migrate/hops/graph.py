"""The migration graph: every hop module of ``ckpt_migrate.migrations``, validated at load time.

A valid graph has one step per hop, no cycle, exactly one newest release, no gap between
known releases, and every release reachable from the oldest. A broken graph fails with a
message naming the offending modules.
"""

from __future__ import annotations

import importlib
import itertools
import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from ckpt_migrate.errors import CkptError, UsageError
from ckpt_migrate.format import releases
from ckpt_migrate.format.releases import Release
from ckpt_migrate.hops.hop import Hop


class GraphError(CkptError):
    """The migration steps themselves are inconsistent (a bug in ckpt-migrate or a plugin)."""

    exit_code = 1


@dataclass(frozen=True)
class Graph:
    hops: tuple[Hop, ...]  # ordered oldest → newest
    newest: str

    def path(self, source: Release, target: Release) -> list[Hop]:
        """The hops from ``source`` to ``target``, in order; backward hops for an older target,
        refused at the first hop that cannot be undone."""
        if target.version < source.version:
            return self._down_path(source, target)
        out: list[Hop] = []
        current = source.name
        by_source = {h.source: h for h in self.hops}
        while current != target.name:
            hop = by_source[current]
            out.append(hop)
            current = hop.target
        return out

    def _down_path(self, source: Release, target: Release) -> list[Hop]:
        forward = self.path(target, source)
        for hop in reversed(forward):
            if hop.down_operations is None:
                return _refuse_down(source, target, hop, self.oldest_down(source))
        return [hop.reverse() for hop in reversed(forward)]

    def oldest_down(self, source: Release) -> str:
        """The oldest release a ``source`` checkpoint can be downgraded to."""
        current = source.name
        by_target = {h.target: h for h in self.hops}
        while current in by_target and by_target[current].down_operations is not None:
            current = by_target[current].source
        return current


def _refuse_down(source: Release, target: Release, hop: Hop, oldest: str) -> list[Hop]:
    why = hop.down_refusal or "downgrades end at 2.0: the 1.x hops are one way here"
    fix = (
        f"choose release {oldest} or a later one"
        if oldest != source.name
        else "keep the checkpoint at its release"
    )
    raise UsageError(
        None,
        f"cannot downgrade from {source.name} to {target.name}: {hop.target} → "
        f"{hop.source} is not offered ({why})",
        fix,
    )


def validate(hops: Iterable[Hop], known: tuple[Release, ...] = releases.RELEASES) -> Graph:
    hops = list(hops)
    names = [r.name for r in known]
    problems: list[str] = []
    by_pair: dict[tuple[str, str], list[str]] = {}
    by_source: dict[str, list[Hop]] = {}
    for h in hops:
        by_pair.setdefault((h.source, h.target), []).append(h.module)
        by_source.setdefault(h.source, []).append(h)
        for rel in (h.source, h.target):
            if rel not in names:
                problems.append(f"{h.module} names unknown release {rel!r}")
    for (s, t), mods in by_pair.items():
        if len(mods) > 1:
            problems.append(f"duplicate step {s}→{t} in {', '.join(mods)}")
    for s, hs in by_source.items():
        targets = {h.target for h in hs}
        if len(targets) > 1:
            problems.append(
                f"release {s} has several next steps: {', '.join(h.module for h in hs)}"
            )
    for h in hops:
        if (
            h.source in names
            and h.target in names
            and names.index(h.target) <= names.index(h.source)
        ):
            problems.append(f"{h.module} goes backwards ({h.source}→{h.target}): a cycle")
    cycle = _find_cycle(hops)
    if cycle:
        problems.append("cycle through " + " → ".join(cycle))
    sinks = {h.target for h in hops} - {h.source for h in hops}
    if len(sinks) != 1 and hops:
        problems.append(f"expected one newest release, found {sorted(sinks) or 'none'}")
    for a, b in itertools.pairwise(names):
        if (a, b) not in by_pair:
            nearby = [
                h.module for h in hops if a in (h.source, h.target) or b in (h.source, h.target)
            ]
            problems.append(
                f"gap: no step {a}→{b}" + (f" (see {', '.join(nearby)})" if nearby else "")
            )
    if problems:
        raise GraphError(None, "invalid migration graph: " + "; ".join(dict.fromkeys(problems)))
    ordered = sorted(hops, key=lambda h: names.index(h.source))
    return Graph(tuple(ordered), ordered[-1].target if ordered else names[-1])


def _find_cycle(hops: list[Hop]) -> list[str]:
    edges: dict[str, list[str]] = {}
    for h in hops:
        edges.setdefault(h.source, []).append(h.target)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in edges.get(node, []):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if state.get(nxt) is None:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in list(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def discover(package: str = "ckpt_migrate.migrations") -> list[Hop]:
    """Import every module of ``package`` and read its hop declaration."""
    pkg = importlib.import_module(package)
    hops = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        if not hasattr(module, "SOURCE") or not hasattr(module, "TARGET"):
            raise GraphError(None, f"migration module {module.__name__} lacks SOURCE/TARGET")
        hops.append(Hop.from_module(module))
    return hops


@lru_cache(maxsize=4)
def load(package: str = "ckpt_migrate.migrations") -> Graph:
    return validate(discover(package))
