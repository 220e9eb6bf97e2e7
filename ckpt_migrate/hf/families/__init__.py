"""One module per model family (the contract: ``ckpt_migrate.hf.mapping.Family``), found by
name: every module here that defines ``NAMES`` serves those Model Zoo model names."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def modules() -> list[ModuleType]:
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            module = importlib.import_module(f"{__name__}.{info.name}")
            if hasattr(module, "NAMES"):
                found.append(module)
    return found


def by_name() -> dict[str, ModuleType]:
    """Model Zoo model name -> its family module."""
    return {name: module for module in modules() for name in module.NAMES}


def by_model_type() -> dict[str, ModuleType]:
    """``config.json`` ``model_type`` -> the family module that imports it."""
    return {t: module for module in modules() for t in module.HF_MODEL_TYPES}
