"""The registry of the Hugging Face rules of every family (the contract:
``ckpt_migrate.hf.mapping.Family``), read from the catalogue: ``families.<rules name>`` is the
rules of that ``Hf.module`` name (``from ckpt_migrate.hf.families import gpt2``), and
:func:`by_name`, :func:`by_model_type`, :func:`modules` find them. The rules are built on first
use (``hf/served.py``): building them reads every layout's tables and config operations, which
a command that converts no Hugging Face model does not pay (``cli/commands`` imports the
pipeline, and so this module, for every command)."""

from __future__ import annotations

import importlib
from functools import cache

from ckpt_migrate.hf.mapping import Family


@cache
def _rules() -> dict[str, Family]:
    served = importlib.import_module("ckpt_migrate.hf.served")
    return served.build(__name__, by_name)


def __getattr__(name: str) -> Family:
    """``from ckpt_migrate.hf.families import <rules name>``."""
    if not name.startswith("__") and name in _rules():
        return _rules()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def modules() -> list[Family]:
    """The rules of every rules name, in name order."""
    return [_rules()[m] for m in sorted(_rules())]


def by_name() -> dict[str, Family]:
    """Model Zoo model name -> its rules."""
    return {name: rules for rules in modules() for name in rules.NAMES}


def by_model_type() -> dict[str, Family]:
    """``config.json`` ``model_type`` -> the rules that import it."""
    return {t: rules for rules in modules() for t in rules.HF_MODEL_TYPES}
