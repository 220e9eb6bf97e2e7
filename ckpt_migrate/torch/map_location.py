"""``load``'s ``map_location``, as ``torch.load`` takes it, for tensors a checkpoint keeps on the
CPU (location ``"cpu"``): a device or its name, a dict from locations to devices, or a function
of (storage, location) that returns the storage to use, or None for the one it was given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ckpt_migrate.torch.lazy import materialize

STORED_AT = "cpu"  # every tensor of a checkpoint is the CPU's


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
