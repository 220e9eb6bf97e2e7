"""The rules of every family, built from the catalogue's records (``hf/families.py`` is their
registry, and builds them on first use): :class:`Rules`, the one interpreter of a record's
tables (``Hf.tensors``, ``Hf.config``), and for composite records (``Hf.parts``) the one
interpreter of parts, :class:`~ckpt_migrate.hf.compose.Composite`. Records sharing a rules
name (``Hf.module``) are converted by one set of rules."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.hf import config_table, unconverted
from ckpt_migrate.hf.compose import Composite
from ckpt_migrate.hf.layouts import declared
from ckpt_migrate.hf.table import Table, plans


def _shared(hf: catalogue.Hf) -> tuple[Any, ...]:
    """What the records of one rules name must declare alike."""
    return hf.tensors, hf.config_label, hf.cs_optimizer


class Rules:
    """The rules of one ``hf.module`` name, read from its records: the names served, the
    ``model_type``\\ s imported, each name's class; the config table run either way by
    ``hf/config_table.py``, the tensor table by ``hf/table.py`` in the context the records
    declare (``Hf.tensors``); the tensors left out or tied, by ``hf/unconverted.py``."""

    def __init__(self, module: str, registry: str) -> None:
        sides = [r.hf for r in catalogue.RECORDS if r.hf and r.hf.module == module]
        hf = sides[0]
        if any(_shared(h) != _shared(hf) for h in sides):
            raise ValueError(f"{module}: its records declare different tensor rules")
        self.__name__ = f"{registry}.{module}"  # its name in the registry
        self.NAMES: tuple[str, ...] = catalogue.hf_names(module)
        self.HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(module)
        self.ARCHITECTURES: dict[str, str] = catalogue.hf_architectures(module)
        if hf.config_label:
            self.config_to_hf, self.config_to_cs = config_table.serving(self.NAMES, hf.config_label)
        else:
            self.config_to_hf, self.config_to_cs = config_table.to_hf, config_table.to_cs
        if hf.tensors is None:
            raise ValueError(f"{module}: its records declare no tensor table")
        self.TABLE: Table = declared(hf.tensors.table)
        self.context: Callable = partial(declared(hf.tensors.context), **hf.tensors.params)
        self.plan_to_hf, self.plan_to_cs = plans(self.TABLE, self.context, self.NAMES)
        self._optimizer = hf.cs_optimizer
        self.cs_ties = unconverted.cs_ties
        self.cs_dropped = unconverted.cs_dropped
        self.hf_dropped = unconverted.hf_dropped

    def cs_optimizer(self, hf_config: Mapping[str, Any]) -> dict[str, Any]:
        """The CS ``optimizer`` fields the HF config carries (the records' ``cs_optimizer``:
        BTLM's muP ``decoder_kernel``, btlm_hf_cs.py lines 252-259)."""
        out: dict[str, Any] = {}
        for key, field, default in self._optimizer:
            *path, last = key.split(".")
            section = out
            for step in path:
                section = section.setdefault(step, {})
            section[last] = hf_config.get(field, default)
        return out

    def __repr__(self) -> str:
        return f"<rules {self.__name__}>"


def _composite(module: str) -> bool:
    return any(r.hf and r.hf.module == module and r.hf.parts for r in catalogue.RECORDS)


def build(registry: str, by_name: Callable[[], Mapping[str, Any]]) -> dict[str, Rules | Composite]:
    """The rules of every rules name (``Hf.module``), each named ``<registry>.<rules name>``;
    a composite's parts are found through ``by_name`` (Model Zoo name -> rules)."""
    return {
        m: Composite(m, f"{registry}.{m}", by_name) if _composite(m) else Rules(m, registry)
        for m in catalogue.hf_modules()
    }
