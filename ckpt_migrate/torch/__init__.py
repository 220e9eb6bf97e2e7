"""The torch-shaped API (``load``/``save``/``to_torch``/``from_torch``), lazy tensors, modules.

The only room that imports torch. This face is lazy, like the package's: the CLI and model
directories import it at no cost, and torch is loaded by the first use of a name.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "load": "api",
    "save": "api",
    "to_torch": "api",
    "from_torch": "api",
    "from_python": "api",
    "to_python": "api",
    "is_module": "modules",
    "module_diff": "modules",
    "LazyTensor": "lazy",
    "is_lazy": "lazy",
    "materialize": "lazy",
    "moved": "map_location",
    "storage_to_tensor": "lazy",
    "tensor_to_storage": "lazy",
    "torch_dtype": "lazy",
    "placeholder": "stream",
    "save_streaming": "stream",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
