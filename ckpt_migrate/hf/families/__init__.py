"""The Hugging Face rules modules (the contract: ``ckpt_migrate.hf.mapping.Family``), found
through the catalogue: each record's ``hf.module`` names the module that converts it."""

from __future__ import annotations

import importlib
from types import ModuleType

from ckpt_migrate import catalogue


def modules() -> list[ModuleType]:
    return [importlib.import_module(f"{__name__}.{m}") for m in sorted(catalogue.hf_modules())]


def by_name() -> dict[str, ModuleType]:
    """Model Zoo model name -> its family module."""
    return {name: module for module in modules() for name in module.NAMES}


def by_model_type() -> dict[str, ModuleType]:
    """``config.json`` ``model_type`` -> the family module that imports it."""
    return {t: module for module in modules() for t in module.HF_MODEL_TYPES}
