"""The model catalogue: one record per model family, grouped by CS key layout
(``gpt2_like``, ``gptj_like``, ``llama_like``, ``bert_like``, ``t5``, ``keyless``).

Every room that needs to know about a family reads it here: ``models/names`` (names, aliases,
registry names), ``models/detect`` (key vocabulary, signatures), ``models/ties``,
``config/upgrade`` (config markers), the hops' per-family rules, ``hf/`` (which rules,
model types, architectures) and ``convert_checkpoint.py list-converters``. No other module
spells a family's name.

:data:`RECORDS` is in the order detection prefers a family when two match equally well (GPT-J
before CodeGen) and ``--model`` lists them; :func:`modelzoo_names` in Model Zoo's own order.
"""

from __future__ import annotations

from typing import Any

from ckpt_migrate.catalogue.bert_like import BERT, ESM2, ROBERTA
from ckpt_migrate.catalogue.gpt2_like import BTLM, GPT2, JAIS, SANTACODER, STARCODER
from ckpt_migrate.catalogue.gptj_like import BLOOM, CODEGEN, FALCON, GPT_NEOX, GPTJ
from ckpt_migrate.catalogue.keyless import CLIP_VIT, DPO, DRAGON, LLAVA, MMSIMPLE_LLAVA
from ckpt_migrate.catalogue.layouts import BERT_ENCODER, DECODER, ENCODER_DECODER, LAYOUTS
from ckpt_migrate.catalogue.llama_like import GEMMA2, LLAMA, MINISTRAL, MISTRAL, MIXTRAL
from ckpt_migrate.catalogue.record import (
    Absent,
    Drop,
    Hf,
    Layout,
    Name,
    NormFlag,
    Part,
    Record,
    Signature,
    Tie,
)
from ckpt_migrate.catalogue.t5 import T5

__all__ = [
    "BERT",
    "BERT_ENCODER",
    "DECODER",
    "ENCODER_DECODER",
    "GPT2",
    "LAYOUTS",
    "RECORDS",
    "T5",
    "Absent",
    "Drop",
    "Hf",
    "Layout",
    "Name",
    "NormFlag",
    "Part",
    "Record",
    "Signature",
    "Tie",
    "by_family",
    "by_name",
    "families",
    "hf_architectures",
    "hf_classes",
    "hf_model_types",
    "hf_modules",
    "hf_name",
    "hf_name_of",
    "hf_names",
    "hf_support",
    "layout_families",
    "model_names",
    "modelzoo_names",
    "parts_of",
]

RECORDS: tuple[Record, ...] = (
    GPT2,
    GPTJ,
    GPT_NEOX,
    CODEGEN,
    LLAMA,
    BLOOM,
    FALCON,
    BTLM,
    JAIS,
    STARCODER,
    SANTACODER,
    MISTRAL,
    MIXTRAL,
    GEMMA2,
    BERT,
    ROBERTA,
    T5,
    CLIP_VIT,
    DPO,
    DRAGON,
    ESM2,
    LLAVA,
    MMSIMPLE_LLAVA,
    MINISTRAL,
)


def families() -> tuple[Record, ...]:
    """The records whose own steps apply (RoBERTa takes BERT's: not one of them)."""
    return tuple(r for r in RECORDS if r.steps_of is None)


def layout_families(layout: Layout) -> tuple[str, ...]:
    """The families of a CS key layout."""
    return tuple(r.name for r in families() if r.layout is layout)


_BY_NAME = {r.name: r for r in RECORDS}


def by_family(family: str) -> Record:
    """The record named ``family`` (KeyError if none)."""
    return _BY_NAME[family]


def modelzoo_names() -> tuple[tuple[Name, Record], ...]:
    """Every Model Zoo converter name with its record, in Model Zoo's order."""
    pairs = [(n, r) for n, r in model_names() if n.position is not None]
    return tuple(sorted(pairs, key=lambda p: p[0].position or 0))


def model_names() -> tuple[tuple[Name, Record], ...]:
    """Every model name with its record: Model Zoo's and those only this tool serves."""
    return tuple((n, r) for r in RECORDS for n in r.names)


def by_name(name: str) -> Record | None:
    """The record serving a Model Zoo name or further accepted name (case-insensitive)."""
    key = name.strip().lower()
    for record in RECORDS:
        spelled = [n.name for n in record.names] + [m for m, _ in record.more_names]
        if key in (s.lower() for s in spelled):
            return record
    return None


def _hf_sides(module: str | None = None) -> list[tuple[Record, Hf]]:
    """(record, its HF side) of every record, or of those ``module`` converts (a rules name,
    ``Hf.module``, or a dotted name ending in one)."""
    short = None if module is None else module.rsplit(".", 1)[-1]
    return [(r, r.hf) for r in RECORDS if r.hf is not None and short in (None, r.hf.module)]


def hf_names(module: str) -> tuple[str, ...]:
    """The Model Zoo names the rules ``module`` (an ``Hf.module``) serve."""
    return tuple(n.name for r, _ in _hf_sides(module) for n in r.names if n.hf)


def hf_model_types(module: str) -> tuple[str, ...]:
    """The ``config.json`` ``model_type``\\ s the rules ``module`` import."""
    return tuple(t for _, hf in _hf_sides(module) for t in hf.model_types)


def hf_architectures(module: str) -> dict[str, str]:
    """Model Zoo name -> HF architecture class, for the names of a rules module."""
    return {n: a for _, hf in _hf_sides(module) for n, a in hf.architectures.items()}


def hf_classes(model_type: str) -> tuple[str, str]:
    """(LM-head class, headless class) of an HF ``model_type``."""
    record, hf = next((r, hf) for r, hf in _hf_sides() if model_type in hf.model_types)
    return hf.architectures[record.name], hf.architectures[f"{record.name}-headless"]


def hf_modules() -> tuple[str, ...]:
    """The rules names (``Hf.module``), each once."""
    return tuple(dict.fromkeys(hf.module for _, hf in _hf_sides()))


def hf_name_of(architectures: list[str]) -> str | None:
    """The Model Zoo name whose HF class is one of ``architectures`` (for the families whose
    import tells their models apart by class), else None."""
    for _, hf in _hf_sides():
        if hf.by_architecture:
            by_class = {cls: name for name, cls in hf.architectures.items()}
            for cls in architectures:
                if cls in by_class:
                    return by_class[cls]
    return None


def hf_support(name: str) -> str:
    """Whether ``export-hf`` / ``import-hf`` serve a Model Zoo name, its Hugging Face class and
    how it differs from Model Zoo's converter (``list-converters``)."""
    record = by_name(name)
    hf = None if record is None else record.hf
    key = name.strip().lower()
    own = None if record is None else next((n for n in record.names if n.name.lower() == key), None)
    if record is None or hf is None or (own is not None and not own.hf):
        return "Hugging Face: not served"
    if own is None:  # a further accepted name: the conversions take the record's own names
        registry = {m.lower(): r for m, r in record.more_names}.get(key)
        served = [n for n in record.names if n.hf]
        like = next((n for n in served if n.registry == registry), served[0])
        return f"Hugging Face: not served under this name; --model {like.name} is"
    cls = hf.architectures.get(own.name) or hf.architectures.get(record.name)
    line = "Hugging Face: export-hf and import-hf" + (f" ({cls})" if cls else "")
    return "; ".join([line, *hf.notes])


def hf_name(config: dict) -> str | None:
    """The Model Zoo name an HF ``config.json`` describes: its architecture, else the first
    name served for its ``model_type``."""
    classes = config.get("architectures") or []
    named = hf_name_of(classes)
    if named is not None:
        return named
    for record, hf in _hf_sides():
        if config.get("model_type") in hf.model_types:
            # its headless class (``LlamaModel``) tells the headless name
            headless = (n for n in record.names if n.hf and n.headless)
            by_class = (n.name for n in headless if hf.architectures.get(n.name) in classes)
            return next(by_class, None) or next(n.name for n in record.names if n.hf)
    return None


def parts_of(record: Record, config: dict) -> list[tuple[Part, str | None]]:
    """(part, the Model Zoo name whose rules convert it) of a composite family, the name from
    ``config`` (CS: the part's ``name_field``; HF: ``config.json``) where the record leaves it
    open; None when the config does not say."""
    if record.hf is None:
        return []
    out = []
    for part in record.hf.parts:
        name = part.name or (part.name_field and config.get(part.name_field)) or hf_name(config)
        out.append((part, None if name is None else str(name)))
    return out


def section(config: dict, key: str | None) -> dict:
    """The part of a composite's config a ``Part`` reads: the CS model config's section at
    the dotted ``key`` (``None``: all of it; a number steps into a list), or an HF
    directory's ``config.json``."""
    found: Any = config
    for step in key.split(".") if key else ():
        if isinstance(found, list) and step.isdigit() and int(step) < len(found):
            found = found[int(step)]
        else:
            found = found.get(step) if isinstance(found, dict) else None
    return found if isinstance(found, dict) else {}


def part_config(part: Part, config: dict, cs_side: bool) -> dict:
    """What a part's rules read of the composite's config: CS, its section; HF, its
    directory's ``config.json`` (``config`` then maps directories to theirs)."""
    if cs_side:
        return section(config, part.config)
    return section(config, part.directory)
