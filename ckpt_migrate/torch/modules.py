"""``torch.nn.Module`` checks for loading states into modules (``model_dir.loading``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ckpt_migrate.errors import StateMismatchError


def is_module(obj: Any) -> bool:
    return isinstance(obj, torch.nn.Module)


def module_diff(
    module: Any, value: Any, path: Path, name: str
) -> tuple[list[str], list[str], list[str]]:
    """Missing keys, unexpected keys and shape mismatches of ``value`` against ``module``."""
    if not isinstance(value, Mapping):
        raise StateMismatchError(
            path, f"state {name!r} is a {type(value).__name__}, not a state dict of a module"
        )
    own = module.state_dict()
    missing = [k for k in own if k not in value]
    unexpected = [k for k in value if k not in own]
    shapes = [
        f"{k} {tuple(value[k].shape)} in the file, {tuple(own[k].shape)} in the model"
        for k in own
        if k in value
        and isinstance(value[k], torch.Tensor)
        and isinstance(own[k], torch.Tensor)
        and value[k].shape != own[k].shape
    ]
    return missing, unexpected, shapes
