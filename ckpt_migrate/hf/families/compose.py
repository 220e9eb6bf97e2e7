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
``cs_fields``. A composite of several Hugging Face models (Model Zoo's
``BaseCheckpointConverter_UnpackedHF_PackedCS``, ``base_converter.py`` lines 1063-1296, and
``BaseConfigConverter_UnpackedHF_PackedCS``, lines 1800-1945: Dragon+, LLaVA, MM-Simple LLaVA)
keeps each in a sub-directory: its HF names are ``<directory>/<name>``, its HF config maps each
directory to its ``config.json`` (the parts sharing a directory merged, in order), and each
part's CS config is the section ``Part.config`` of the composite's (``None``: its own fields).
A part's rules are another Model Zoo name's, or a part's own (``hf/families/parts.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import ModuleType
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue import Part
from ckpt_migrate.hf import families
from ckpt_migrate.hf.families import parts as part_rules
from ckpt_migrate.hf.mapping import MappingError, Out, Shape
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)


def prefixed(out: Out, inputs: str, output: str, strip: tuple[str, str] = ("", "")) -> Out:
    """``out`` with ``inputs`` before each input name and ``output`` before its own, each
    first stripped of the part's own prefix on its side (``strip``: inputs', output's)."""

    def moved(name: str, side: int, prefix: str) -> str:
        own = strip[side]
        return prefix + (name[len(own) :] if own and name.startswith(own) else name)

    return replace(
        out, name=moved(out.name, 1, output), inputs=tuple(moved(i, 0, inputs) for i in out.inputs)
    )


def _within(names: Mapping[str, Shape], prefix: str, own: str = "") -> dict[str, Shape]:
    """The names under ``prefix``, as the part's rules spell them (``own`` before each)."""
    return {own + n[len(prefix) :]: s for n, s in names.items() if n.startswith(prefix)}


def _record(name: str) -> catalogue.Record:
    record = catalogue.by_name(name)
    if record is None or record.hf is None or not record.hf.parts:
        raise MappingError(f"model name {name!r} is not one of {', '.join(NAMES)}")
    return record


def _parts(name: str, config: Mapping[str, Any]) -> list[tuple[Part, str, ModuleType]]:
    """(part, its Model Zoo name, the rules module converting it) of composite ``name``."""
    out = []
    by_name: dict[str, Any] = {**families.by_name(), **part_rules.RULES}
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


def directories(name: str) -> tuple[str, ...]:
    """The HF sub-directories of composite ``name``, in order (none: one HF directory)."""
    found = (p.directory for p in _record(name).hf.parts if p.directory)
    return tuple(dict.fromkeys(found))


def _cs_section(name: str, cs_model: Mapping[str, Any], part: Part) -> dict[str, Any]:
    """A directory part's CS config: its section less the composite's own fields there."""
    own = catalogue.section(_record(name).hf.cs_fields, part.config)
    mine = catalogue.section(dict(cs_model), part.config)
    if part.config is not None and not mine:
        raise MappingError(f"{name}: the model config has no {part.config} section")
    return {k: v for k, v in mine.items() if part.config is None or k not in own}


def _hf_view(part: Part, inner: str, hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """A directory part's HF config: its directory's ``config.json``; another Model Zoo name's
    rules see it without the composite's class (Model Zoo sets the part's ``model_type``,
    llava.py lines 598-604)."""
    cfg = catalogue.part_config(part, dict(hf_config), cs_side=False)
    if inner in part_rules.RULES:
        return cfg
    return {k: v for k, v in cfg.items() if k not in ("model_type", "architectures")}


def _merged(base: Any, more: Any) -> Any:
    """``more`` over ``base``, sections merged key by key (lists of one length item by item)."""
    if isinstance(base, Mapping) and isinstance(more, Mapping):
        return {**base, **{k: _merged(base[k], v) if k in base else v for k, v in more.items()}}
    if isinstance(base, list) and isinstance(more, list) and len(base) == len(more):
        return [_merged(a, b) for a, b in zip(base, more, strict=True)]
    return more


def _nested(key: str | None, value: dict[str, Any]) -> dict[str, Any]:
    """``value`` at the dotted ``key`` (``0``: the one item of a list)."""
    for step in reversed(key.split(".")) if key else ():
        value = [value] if step == "0" else {step: value}
    return value


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
    """The part's ``config.json`` (dpo.py lines 248-258: the family's own converter); with
    directories, each directory's (its parts' configs merged in order)."""
    if not directories(name):
        _, inner, module = _one(name, cs_model)
        return module.config_to_hf(_inner_config(name, cs_model), inner)
    out: dict[str, dict[str, Any]] = {d: {} for d in directories(name)}
    for part, inner, module in _parts(name, cs_model):
        out[part.directory].update(module.config_to_hf(_cs_section(name, cs_model, part), inner))
    return out


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The part's CS config, its name under ``name_field`` and the composite's own fields;
    with directories, each part's CS config at its section."""
    if directories(name):
        out: dict[str, Any] = {}
        for part, inner, module in _parts(name, hf_config):
            cs = module.config_to_cs(_hf_view(part, inner, hf_config), inner)
            out = _merged(out, _nested(part.config, cs))
        return _merged(out, _record(name).hf.cs_fields)
    part, inner, module = _one(name, hf_config)
    out = module.config_to_cs(hf_config, inner)
    if part.name_field:
        out[part.name_field] = inner
    return {**out, **_record(name).hf.cs_fields}


def plan_to_hf(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> list[Out]:
    """Each part's plan on the CS tensors under its prefix, carried to the HF one (copies, such
    as DPO's reference model, are not read: ``hf.cs_dropped``)."""
    split = bool(directories(name))
    cfg = _inner_config(name, cs_model)
    plan: list[Out] = []
    for part, inner, module in _parts(name, cs_model):
        if split:
            cfg = _cs_section(name, cs_model, part)
        inner_plan = module.plan_to_hf(_within(cs, part.cs_prefix, part.inner_cs), cfg, inner)
        strip = (part.inner_cs, "")
        plan += [prefixed(o, part.cs_prefix, part.hf_prefix, strip) for o in inner_plan]
    return plan


def plan_to_cs(hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str) -> list[Out]:
    """Each part's plan on the HF tensors under its prefix, written under its CS prefix and
    again under each of its ``copies``."""
    split = bool(directories(name))
    plan: list[Out] = []
    for part, inner, module in _parts(name, hf_config):
        cfg = _hf_view(part, inner, hf_config) if split else hf_config
        inner_plan = module.plan_to_cs(_within(hf, part.hf_prefix), cfg, inner)
        strip = ("", part.inner_cs)
        for cs_prefix in (part.cs_prefix, *part.copies):
            plan += [prefixed(o, part.hf_prefix, cs_prefix, strip) for o in inner_plan]
    return plan
