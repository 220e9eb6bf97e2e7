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
A part's rules are another Model Zoo name's, or a part's own (``hf/parts.py``).

:class:`Composite` is the one interpreter of every composite record: the registry
(``hf/families.py``, through ``hf/served.py``) builds one per rules name whose records declare
parts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue import Part
from ckpt_migrate.hf import parts as part_rules
from ckpt_migrate.hf import unconverted
from ckpt_migrate.hf.mapping import MappingError, Out, Shape


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


class Composite:
    """The rules of the composite records of one rules name (``Hf.module``): each part's
    rules (``rules()``: Model Zoo name -> rules, the registry's; or a part's own,
    ``hf/parts.py``) run under the part's prefixes and config section."""

    def __init__(self, module: str, qualified: str, rules: Callable[[], Mapping[str, Any]]) -> None:
        self.__name__ = qualified
        self.NAMES: tuple[str, ...] = catalogue.hf_names(module)
        self.HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(module)
        self._rules = rules
        self.cs_ties = unconverted.cs_ties
        self.cs_dropped = unconverted.cs_dropped
        self.hf_dropped = unconverted.hf_dropped

    def __repr__(self) -> str:
        return f"<composite rules {self.__name__}>"

    def _record(self, name: str) -> catalogue.Record:
        record = catalogue.by_name(name)
        if record is None or record.hf is None or not record.hf.parts:
            raise MappingError(f"model name {name!r} is not one of {', '.join(self.NAMES)}")
        return record

    def _parts(self, name: str, config: Mapping[str, Any]) -> list[tuple[Part, str, Any]]:
        """(part, its Model Zoo name, the rules converting it) of composite ``name``."""
        out = []
        by_name: dict[str, Any] = {**self._rules(), **part_rules.RULES}
        for part, inner in catalogue.parts_of(self._record(name), dict(config)):
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

    def directories(self, name: str) -> tuple[str, ...]:
        """The HF sub-directories of composite ``name``, in order (none: one HF directory)."""
        found = (p.directory for p in self._record(name).hf.parts if p.directory)
        return tuple(dict.fromkeys(found))

    def _cs_section(self, name: str, cs_model: Mapping[str, Any], part: Part) -> dict[str, Any]:
        """A directory part's CS config: its section less the composite's own fields there."""
        own = catalogue.section(self._record(name).hf.cs_fields, part.config)
        mine = catalogue.section(dict(cs_model), part.config)
        if part.config is not None and not mine:
            raise MappingError(f"{name}: the model config has no {part.config} section")
        return {k: v for k, v in mine.items() if part.config is None or k not in own}

    def _one(self, name: str, config: Mapping[str, Any]) -> tuple[Part, str, Any]:
        parts = self._parts(name, config)
        if len(parts) != 1:
            raise MappingError(f"{name}: no config rule for a composite of {len(parts)} models")
        return parts[0]

    def _inner_config(self, name: str, cs_model: Mapping[str, Any]) -> dict[str, Any]:
        """The part's own CS config: the composite's fields and the part's name field left
        out."""
        record = self._record(name)
        own = {*record.hf.cs_fields, *(p.name_field for p in record.hf.parts if p.name_field)}
        return {k: v for k, v in cs_model.items() if k not in own}

    def config_to_hf(self, cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
        """The part's ``config.json`` (dpo.py lines 248-258: the family's own converter); with
        directories, each directory's (its parts' configs merged in order)."""
        if not self.directories(name):
            _, inner, rules = self._one(name, cs_model)
            return rules.config_to_hf(self._inner_config(name, cs_model), inner)
        out: dict[str, dict[str, Any]] = {d: {} for d in self.directories(name)}
        for part, inner, rules in self._parts(name, cs_model):
            cfg = self._cs_section(name, cs_model, part)
            out[part.directory].update(rules.config_to_hf(cfg, inner))
        return out

    def config_to_cs(self, hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
        """The part's CS config, its name under ``name_field`` and the composite's own fields;
        with directories, each part's CS config at its section."""
        if self.directories(name):
            out: dict[str, Any] = {}
            for part, inner, rules in self._parts(name, hf_config):
                cs = rules.config_to_cs(_hf_view(part, inner, hf_config), inner)
                out = _merged(out, _nested(part.config, cs))
            return _merged(out, self._record(name).hf.cs_fields)
        part, inner, rules = self._one(name, hf_config)
        out = rules.config_to_cs(hf_config, inner)
        if part.name_field:
            out[part.name_field] = inner
        return {**out, **self._record(name).hf.cs_fields}

    def plan_to_hf(
        self, cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str
    ) -> list[Out]:
        """Each part's plan on the CS tensors under its prefix, carried to the HF one (copies,
        such as DPO's reference model, are not read: ``hf.cs_dropped``)."""
        split = bool(self.directories(name))
        cfg = self._inner_config(name, cs_model)
        plan: list[Out] = []
        for part, inner, rules in self._parts(name, cs_model):
            if split:
                cfg = self._cs_section(name, cs_model, part)
            inner_plan = rules.plan_to_hf(_within(cs, part.cs_prefix, part.inner_cs), cfg, inner)
            strip = (part.inner_cs, "")
            plan += [prefixed(o, part.cs_prefix, part.hf_prefix, strip) for o in inner_plan]
        return plan

    def plan_to_cs(
        self, hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str
    ) -> list[Out]:
        """Each part's plan on the HF tensors under its prefix, written under its CS prefix and
        again under each of its ``copies``."""
        split = bool(self.directories(name))
        plan: list[Out] = []
        for part, inner, rules in self._parts(name, hf_config):
            cfg = _hf_view(part, inner, hf_config) if split else hf_config
            inner_plan = rules.plan_to_cs(_within(hf, part.hf_prefix), cfg, inner)
            strip = ("", part.inner_cs)
            for cs_prefix in (part.cs_prefix, *part.copies):
                plan += [prefixed(o, part.hf_prefix, cs_prefix, strip) for o in inner_plan]
        return plan
