"""Loading a checkpoint's states into a model, an optimizer and other components.

What the Trainer's ``LoadCheckpointStates`` does, with the missing and unexpected keys returned
(and logged) instead of discarded (MODELZOO_HISTORY.md §4.4). A strict load checks every
component first, so that a failure loads nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ckpt_migrate.torch as torch_room
from ckpt_migrate.errors import StateMismatchError

log = logging.getLogger("ckpt_migrate.model_dir.manager")

SHOWN_KEYS = 8  # keys named in a one-line message; the full lists are returned


@dataclass
class LoadedCheckpoint:
    """What ``CheckpointManager.load`` read and what it could not load."""

    path: Path
    step: int | None
    state: dict[str, Any]  # the selected top-level states (and every ``__``-prefixed key)
    missing_keys: dict[str, list[str]] = field(default_factory=dict)  # per component
    unexpected_keys: dict[str, list[str]] = field(default_factory=dict)
    missing_states: list[str] = field(default_factory=list)  # components the file has no state for
    skipped_states: list[str] = field(default_factory=list)  # states in the file not selected

    @property
    def complete(self) -> bool:
        """True when every component got every key it expects and nothing else."""
        return not (
            self.missing_states
            or any(self.missing_keys.values())
            or any(self.unexpected_keys.values())
        )


def load_components(
    path: Path, state: dict, result: LoadedCheckpoint, components: dict[str, Any], strict: bool
) -> None:
    """Check every component first (so a strict failure loads nothing), then load them."""
    plan: list[tuple[str, Any, Any]] = []
    absent: list[str] = []
    missing: dict[str, list[str]] = {}
    unexpected: dict[str, list[str]] = {}
    for name, obj in components.items():
        if obj is None:
            continue
        if not callable(getattr(obj, "load_state_dict", None)):
            raise TypeError(f"{name}: a {type(obj).__name__} has no load_state_dict")
        if name not in result.state:
            if name in state:
                log.info("%s: %s not loaded: not among the selected states", path, name)
            else:
                absent.append(name)
            continue
        value = result.state[name]
        if torch_room.is_module(obj):
            miss, extra, shapes = torch_room.module_diff(obj, value, path, name)
            if shapes:
                raise StateMismatchError(
                    path,
                    f"{name}: {len(shapes)} tensor(s) of another shape: {names(shapes)}",
                    "the checkpoint is of another model configuration",
                )
            if miss:
                missing[name] = miss
            if extra:
                unexpected[name] = extra
        plan.append((name, obj, value))
    if strict and (absent or missing or unexpected):
        problems = [f"has no {n!r} state (it has: {names(state)})" for n in absent]
        problems += [key_report(n, missing.get(n, []), unexpected.get(n, [])) for n in components]
        raise StateMismatchError(
            path,
            "; ".join(p for p in problems if p),
            "pass strict=False to load the rest and get the missing and unexpected keys back",
            missing=missing,
            unexpected=unexpected,
        )
    for name in absent:
        result.missing_states.append(name)
        log.warning("%s: has no %r state; the %s is left as it is", path, name, name)
    for name, obj, value in plan:
        if torch_room.is_module(obj):
            keys = obj.load_state_dict(value, strict=strict)
            miss, extra = list(keys.missing_keys), list(keys.unexpected_keys)
            if miss or extra:
                result.missing_keys[name], result.unexpected_keys[name] = miss, extra
                log.warning("%s: loaded non-strictly: %s", path, key_report(name, miss, extra))
        else:
            obj.load_state_dict(value)


def key_report(name: str, missing: list[str], unexpected: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key(s) ({names(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s) ({names(unexpected)})")
    return f"{name}: " + " and ".join(parts) if parts else ""


def names(items: Iterable[Any]) -> str:
    items = [str(i) for i in items]
    shown = ", ".join(items[:SHOWN_KEYS])
    more = len(items) - SHOWN_KEYS
    return shown + (f" (+{more} more)" if more > 0 else "")


def is_meta(key: Any) -> bool:
    """Keys such as ``__metadata__``: kept in every subset, as the Trainer does."""
    return isinstance(key, str) and key.startswith("__")


def parse_states(states: str | Iterable[str]) -> tuple[str, ...] | None:
    """None for "all"; else the names, from a comma-separated string or an iterable."""
    if isinstance(states, str):
        if states.strip() == "all":
            return None
        names = [s.strip() for s in states.split(",")]
    else:
        names = list(states)
        if any(not isinstance(s, str) for s in names):
            raise TypeError(f"state names must be strings, not {names!r}")
    names = [s for s in names if s]
    if not names:
        raise ValueError("name at least one state, or pass 'all'")
    if "all" in names:
        raise ValueError("'all' cannot be combined with other state names")
    return tuple(dict.fromkeys(names))
