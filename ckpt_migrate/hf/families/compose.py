"""Composite families: a model made of models other rules convert, each under a key prefix
(the catalogue record's ``hf.parts``). One operation, :func:`prefixed`, carries a part's plan
into the composite's key space; nothing here knows a tensor of its own.

DPO (Model Zoo, tag Release_2.10.0, ``tools/checkpoint_converters/dpo.py``): the CS model is
``policy_model.model.`` + the policy's own CS keys, and ``ref_model.model.`` + the same
(``DPO_Converter``, lines 97-141: the HF -> CS direction writes the reference model as a copy
of the policy; CS -> HF drops it). The policy's family is the CS config's ``model_name``, or on
import the family of the HF ``config.json`` (``ConfigConverter_DPO_HF_CS21``, lines 205-246),
one of ``SUPPORTED_DPO_MODELS`` (lines 32-47); the config is the family's plus ``model_name``
and ``dpo: {beta: 0.1, reference_free: false}`` (lines 297-303).

The config of a composite with one part is that part's config plus the record's
``cs_fields``; a composite of several parts would need a config rule of its own (none yet).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import ModuleType
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue import Part
from ckpt_migrate.hf import families
from ckpt_migrate.hf.mapping import MappingError, Out, Shape
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)


def prefixed(out: Out, inputs: str, output: str) -> Out:
    """``out`` with ``inputs`` before each input name and ``output`` before its own."""
    return replace(out, name=output + out.name, inputs=tuple(inputs + i for i in out.inputs))


def _within(names: Mapping[str, Shape], prefix: str) -> dict[str, Shape]:
    return {n[len(prefix) :]: s for n, s in names.items() if n.startswith(prefix)}


def _record(name: str) -> catalogue.Record:
    record = catalogue.by_name(name)
    if record is None or record.hf is None or not record.hf.parts:
        raise MappingError(f"model name {name!r} is not one of {', '.join(NAMES)}")
    return record


def _parts(name: str, config: Mapping[str, Any]) -> list[tuple[Part, str, ModuleType]]:
    """(part, its Model Zoo name, the rules module converting it) of composite ``name``."""
    out = []
    by_name = families.by_name()
    for part, inner in catalogue.parts_of(_record(name), dict(config)):
        where = "config.json's architectures and model_type"
        if part.name_field:
            where = f"the CS config's {part.name_field} (import: {where})"
        if inner is None:
            raise MappingError(f"{name}: {where} does not name the model it holds")
        if inner not in by_name or (part.names and inner not in part.names):
            known = ", ".join(part.names or sorted(by_name))
            raise MappingError(f"{name}: {where} names {inner!r}; it holds one of: {known}")
        out.append((part, inner, by_name[inner]))
    return out


def _one(name: str, config: Mapping[str, Any]) -> tuple[Part, str, ModuleType]:
    parts = _parts(name, config)
    if len(parts) != 1:
        raise MappingError(f"{name}: no config rule for a composite of {len(parts)} models")
    return parts[0]


def _inner_config(name: str, cs_model: Mapping[str, Any]) -> dict[str, Any]:
    """The part's own CS config: the composite's fields and the part's name field left out."""
    record = _record(name)
    own = {*record.hf.cs_fields, *(p.name_field for p in record.hf.parts if p.name_field)}
    return {k: v for k, v in cs_model.items() if k not in own}


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The part's ``config.json`` (dpo.py lines 248-258: the family's own converter)."""
    _, inner, module = _one(name, cs_model)
    return module.config_to_hf(_inner_config(name, cs_model), inner)


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The part's CS config, its name under ``name_field`` and the composite's own fields."""
    part, inner, module = _one(name, hf_config)
    out = module.config_to_cs(hf_config, inner)
    if part.name_field:
        out[part.name_field] = inner
    return {**out, **_record(name).hf.cs_fields}


def plan_to_hf(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> list[Out]:
    """Each part's plan on the CS tensors under its prefix, carried to the HF one (copies, such
    as DPO's reference model, are not read: ``hf.cs_dropped``)."""
    cfg = _inner_config(name, cs_model)
    plan: list[Out] = []
    for part, inner, module in _parts(name, cs_model):
        inner_plan = module.plan_to_hf(_within(cs, part.cs_prefix), cfg, inner)
        plan += [prefixed(o, part.cs_prefix, part.hf_prefix) for o in inner_plan]
    return plan


def plan_to_cs(hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str) -> list[Out]:
    """Each part's plan on the HF tensors under its prefix, written under its CS prefix and
    again under each of its ``copies``."""
    plan: list[Out] = []
    for part, inner, module in _parts(name, hf_config):
        inner_plan = module.plan_to_cs(_within(hf, part.hf_prefix), hf_config, inner)
        for cs_prefix in (part.cs_prefix, *part.copies):
            plan += [prefixed(o, part.hf_prefix, cs_prefix) for o in inner_plan]
    return plan
