"""``load``'s ``map_location``, as ``torch.load`` takes it, for tensors a checkpoint keeps on the
CPU (location ``"cpu"``): a device or its name, a dict from locations to devices, or a function
of (storage, location) that returns the storage to use, or None for the one it was given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ckpt_migrate.torch.lazy import materialize

STORED_AT = "cpu"  # every tensor of a checkpoint is the CPU's


def moved(state: Any, map_location: Any) -> Any:
    """``state`` with each tensor moved as ``map_location`` says (the same objects where it
    says nothing to do)."""
    move = mover(map_location)
    return state if move is None else _map(state, move, {})


def mover(map_location: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What to do with each tensor (None: nothing, each stays lazy on the CPU)."""
    if isinstance(map_location, dict):
        map_location = map_location.get(STORED_AT, STORED_AT)
    if callable(map_location):
        return lambda t: _by_function(materialize(t), map_location)
    if map_location in (None, "cache") or str(map_location) == STORED_AT:
        return None
    return lambda t: t.to(map_location)


def _by_function(t: torch.Tensor, fn: Callable[[Any, str], Any]) -> torch.Tensor:
    storage = fn(t.untyped_storage(), STORED_AT)
    if storage is None:
        return t
    if isinstance(storage, torch.TypedStorage):
        storage = storage.untyped()
    out = torch.empty(0, dtype=t.dtype, device=storage.device)
    return out.set_(storage, t.storage_offset(), t.size(), t.stride())


def _map(obj: Any, fn: Any, done: dict[int, Any]) -> Any:
    """``obj`` with ``fn`` of each tensor; one tensor under several names (a tie) moved once."""
    if isinstance(obj, torch.Tensor):
        if id(obj) not in done:
            done[id(obj)] = fn(obj)
        return done[id(obj)]
    if isinstance(obj, dict):
        return type(obj)((k, _map(v, fn, done)) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set)) and not hasattr(obj, "_fields"):
        return type(obj)(_map(v, fn, done) for v in obj)
    return obj
