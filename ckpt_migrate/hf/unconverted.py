"""The source tensors a conversion leaves out on purpose, from the catalogue: one function for
every family, in place of per-family hooks.

* :func:`cs_ties`: CS names of a tensor the file holds under several names (the layout's
  ties, ``catalogue/layouts.py``, while the config turns them on). The conversion reads the
  first present in the originals-first order; the others are copies the export checks equal.
  Model Zoo: a tied head is the embeddings (``pre_model_convert``: gpt2_hf_cs.py lines
  441-460, gptj_hf_cs.py lines 319-338, gpt_neox_hf_cs.py 584-603, bloom_hf_cs.py 742-761,
  falcon_40b.py 561-580, salesforce_codegen_hf_cs.py 480-499), ``ln_f`` the final norm's
  second name (gpt2_model.py lines 911 and 962-972), BERT's MLM decoder the word embeddings
  (bert.py lines 716-739), T5's three embedding names one tensor (t5.py lines 1098-1168).
* :func:`cs_dropped`: CS tensors the export leaves out (the record's ``hf.cs_dropped``, e.g.
  ALiBi slopes HF computes), and the head of a ``-headless`` export unless it is a tie (Model
  Zoo's ``*Model_HF_CS21`` converter notes: "the language model head will be dropped";
  gpt2_hf_cs.py lines 408-417, llama.py 489-495, gptj_hf_cs.py 245-254).
* :func:`hf_dropped`: HF tensors the import leaves out (the record's ``hf.hf_dropped``:
  buffers transformers regenerates, repeats Model Zoo skips).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue import Drop, Record, Tie
from ckpt_migrate.hf.mapping import MappingError, Shape

HEAD = ("lm_head.weight", "lm_head.bias")
HEADLESS_WHY = "the headless HF model has no lm_head (Model Zoo drops it)"


def _record(name: str) -> Record:
    record = catalogue.by_name(name)
    if record is None or record.hf is None:
        raise MappingError(f"no Hugging Face rules for model {name!r}")
    return record


def _groups(ties: tuple[Tie, ...], config: Mapping[str, Any]) -> list[list[str]]:
    """The names of each tied tensor, originals first (a tie's ``b`` before its ``a``), the
    ties a config field turns off left out (on by default)."""
    groups: list[list[str]] = []
    for tie in ties:
        if tie.config_flag is not None and not config.get(tie.config_flag, True):
            continue
        group = next((g for g in groups if tie.a in g or tie.b in g), None)
        if group is None:
            groups.append([tie.b, tie.a])
        else:
            group += [n for n in (tie.b, tie.a) if n not in group]
    return groups


def tie_groups(record: Record, config: Mapping[str, Any]) -> list[list[str]]:
    """The CS names of each tensor ``record`` ties while ``config`` ties it, originals first."""
    return _groups(record.ties, config)


def cs_ties(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """CS copy -> the CS name the conversion reads, for every tied tensor the file holds under
    more than one name (a composite's: its parts', under their prefixes)."""
    ties: dict[str, str] = {}
    for group in _groups(_record(name).ties, cs_model):
        present = [n for n in group if n in cs]
        ties.update({copy: present[0] for copy in present[1:]})
    for prefix, inner, within, cfg in _parts(cs, cs_model, name, cs_side=True):
        ties.update({prefix + c: prefix + o for c, o in cs_ties(within, cfg, inner).items()})
    return ties


def _parts(names: Mapping[str, Shape], config: Mapping[str, Any], name: str, cs_side: bool):
    """(prefix, inner name, the names under the prefix without it, the part's config) of each
    part of a composite family whose inner name the config gives, one the part may hold (never
    the composite itself: no recursion on a config naming it)."""
    for part, inner in catalogue.parts_of(_record(name), dict(config)):
        prefix = part.cs_prefix if cs_side else part.hf_prefix
        allowed = inner in part.names if part.names else inner != name
        if inner is not None and allowed and catalogue.by_name(inner) is not None:
            within = {n[len(prefix) :]: s for n, s in names.items() if n.startswith(prefix)}
            yield prefix, inner, within, catalogue.part_config(part, dict(config), cs_side)


def _matching(drops: tuple[Drop, ...], names: Mapping[str, Shape], config: Mapping[str, Any]):
    out: dict[str, str] = {}
    for drop in drops:
        if drop.when is not None:
            field, value, default = drop.when
            if config.get(field, default) != value:
                continue
        pattern = re.compile(drop.pattern)
        out.update({n: drop.why for n in names if pattern.fullmatch(n)})
    return out


def cs_dropped(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """CS tensor -> why the export leaves it out."""
    hf = _record(name).hf
    out = _matching(hf.cs_dropped if hf else (), cs, cs_model)
    if name.endswith("-headless"):
        ties = cs_ties(cs, cs_model, name)
        out.update({n: HEADLESS_WHY for n in HEAD if n in cs and n not in ties})
    for prefix, inner, within, cfg in _parts(cs, cs_model, name, cs_side=True):
        out.update({prefix + n: why for n, why in cs_dropped(within, cfg, inner).items()})
    return out


def hf_dropped(hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str) -> dict[str, str]:
    """HF tensor -> why the import leaves it out."""
    side = _record(name).hf
    out = _matching(side.hf_dropped if side else (), hf, hf_config)
    for prefix, inner, within, cfg in _parts(hf, hf_config, name, cs_side=False):
        out.update({prefix + n: why for n, why in hf_dropped(within, cfg, inner).items()})
    return out
