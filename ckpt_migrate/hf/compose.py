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
from functools import partial
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue import Part
from ckpt_migrate.catalogue.config import CS, HF
from ckpt_migrate.hf import parts as part_rules
from ckpt_migrate.hf import unconverted
from ckpt_migrate.hf.mapping import MappingError, Out, Shape
from ckpt_migrate.hf.table import TO_CS, TO_HF


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
        # the contract's four (hf/mapping.py Family): each direction of the one interpreter
        for direction in (TO_HF, TO_CS):
            setattr(self, "config_" + direction, partial(self.config, direction))
            setattr(self, "plan_" + direction, partial(self.plan, direction))
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

    def _inner_config(self, name: str, cs_model: Mapping[str, Any]) -> dict[str, Any]:
        """The part's own CS config: the composite's fields and the part's name field left
        out."""
        record = self._record(name)
        own = {*record.hf.cs_fields, *(p.name_field for p in record.hf.parts if p.name_field)}
        return {k: v for k, v in cs_model.items() if k not in own}

    def _view(self, side: str, name: str, config: Mapping[str, Any], part: Part, inner: str) -> Any:
        """What a part's rules read of the composite's ``side`` config: CS, its section (one
        HF directory: the composite's config less its own fields); HF, its directory's
        ``config.json`` (one HF directory: all of it)."""
        split = bool(self.directories(name))
        if side == CS:
            return (
                self._cs_section(name, config, part) if split else self._inner_config(name, config)
            )
        return _hf_view(part, inner, config) if split else config

    def config(self, direction: str, config: Mapping[str, Any], name: str) -> dict[str, Any]:
        """Each part's config converted by its rules and placed on the other side: HF, in its
        directory's ``config.json`` (the parts sharing one merged in order); CS, at its section,
        its name under ``name_field``, with the composite's own fields. With one HF directory,
        one part (dpo.py lines 248-258: the family's own converter)."""
        src, dst = _SIDES[direction]
        found = self._parts(name, config)
        if not self.directories(name) and len(found) != 1:
            raise MappingError(f"{name}: no config rule for a composite of {len(found)} models")
        out: dict[str, Any] = {}
        for part, inner, rules in found:
            view = self._view(src, name, config, part, inner)
            converted = getattr(rules, "config_" + direction)(view, inner)
            if dst == HF:
                (out.setdefault(part.directory, {}) if part.directory else out).update(converted)
                continue
            out = _merged(out, _nested(part.config, converted))
            if part.name_field:
                out[part.name_field] = inner
        return _merged(out, self._record(name).hf.cs_fields) if dst == CS else out

    def plan(
        self, direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
    ) -> list[Out]:
        """Each part's plan on the source tensors under its prefix, carried to its prefix on the
        other side (CS: also to each of its ``copies``, such as DPO's reference model, which
        the export does not read: ``hf.cs_dropped``)."""
        src, dst = _SIDES[direction]
        plan: list[Out] = []
        for part, inner, rules in self._parts(name, config):
            view = self._view(src, name, config, part, inner)
            (head, own), (_, inner_dst) = _prefix(part, src), _prefix(part, dst)
            got = getattr(rules, "plan_" + direction)(_within(shapes, head, own), view, inner)
            for target in _targets(part, dst):
                plan += [prefixed(o, head, target, (own, inner_dst)) for o in got]
        return plan


_SIDES = {TO_HF: (CS, HF), TO_CS: (HF, CS)}  # direction -> (source side, target side)


def _prefix(part: Part, side: str) -> tuple[str, str]:
    """(the part's key prefix on ``side``, the prefix its rules write there)."""
    return (part.cs_prefix, part.inner_cs) if side == CS else (part.hf_prefix, "")


def _targets(part: Part, side: str) -> tuple[str, ...]:
    """The prefixes a part's tensors are written under on ``side``."""
    return (part.cs_prefix, *part.copies) if side == CS else (part.hf_prefix,)
