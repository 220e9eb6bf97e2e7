"""The one interpreter of the Hugging Face config tables (``catalogue/config.py``): a family's
record declares its table (``Hf.config``), a composite's part its own (``catalogue/
parts_config.py``, run by the part's name), :func:`to_hf` runs it reading the CS ``model:``
section, :func:`to_cs` reading ``config.json``, step by step in the table's order.

A step reads the *source* (the config given, with the table's defaults filled in as the steps
reach them) and writes the *output*. The named operations are each a pair: what the operation
does exporting (CS -> HF) and importing (HF -> CS), in ``config_ops.py`` (the GPT-2-like
families'), ``config_gptj.py`` (the GPT-J backbone's), ``config_llama.py`` (the LLaMA-like
families'), ``config_gemma2.py`` (Gemma 2's), ``config_bert.py`` (the BERT-like families') and
``config_t5.py`` (T5's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.config import (
    CS,
    HF,
    Defaults,
    Fixed,
    Like,
    Op,
    Renames,
    Required,
    Step,
    Written,
)
from ckpt_migrate.catalogue.parts_config import PART_CONFIGS
from ckpt_migrate.hf import (
    config_bert,
    config_gemma2,
    config_gptj,
    config_llama,
    config_ops,
    config_parts,
    config_t5,
)
from ckpt_migrate.hf.config_ops import State
from ckpt_migrate.hf.mapping import MappingError

OPS = {
    **config_ops.OPS,
    **config_gptj.OPS,
    **config_llama.OPS,
    **config_bert.OPS,
    **config_t5.OPS,
    **config_gemma2.OPS,
    **config_parts.OPS,
}


def _checked(side: str, names: tuple[str, ...], label: str, config: Mapping, name: str) -> dict:
    if name not in names:
        raise MappingError(f"{name}: not a {label} model name")
    return run(side, config, name)


def serving(names: tuple[str, ...], label: str) -> tuple[Callable, Callable]:
    """:func:`to_hf` and :func:`to_cs` of rules that serve ``names`` only: another
    name is refused as not one of the family's (``label``)."""
    return partial(_checked, CS, names, label), partial(_checked, HF, names, label)


def run(side: str, config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The output of ``name``'s table read from ``side``."""
    return _state(side, config, name).out


# ``to_hf(cs_model, name)``: ``config.json`` of ``name`` from its CS ``model:`` section;
# ``to_cs(hf_config, name)``: its CS ``model:`` section from its ``config.json``.
to_hf, to_cs = partial(run, CS), partial(run, HF)


def source(side: str, config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The config given, with the defaults the table filled in, once the table accepted it
    (what a tensor table's context reads)."""
    return _state(side, config, name).src


def tables() -> dict[str, tuple[Step, ...]]:
    """Every config table: each served name's (its record's) and each part's."""
    served = {n.name: r.hf.config for n, r in catalogue.model_names() if r.hf and n.hf}
    return {**{n: t for n, t in served.items() if t}, **PART_CONFIGS}


def unread(hf_config: Mapping[str, Any], name: str) -> list[str]:
    """The keys of ``config.json`` that ``name``'s table never reads on import: what a CS
    model config has no place for (the token ids, transformers' own fields, a field of
    someone's), left out of the import."""
    read = _state(HF, hf_config, name).src
    return [k for k in hf_config if k not in getattr(read, "read", hf_config)]


class Reading(dict):
    """A config whose keys a table asks for are noted in ``read`` (shared by the tables a
    ``Like`` step runs, and kept when ``Defaults`` fills some in)."""

    def __init__(self, data: Mapping[str, Any], read: set[str] | None = None) -> None:
        super().__init__(data)
        self.read = set() if read is None else read

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def _state(side: str, config: Mapping[str, Any], name: str, read: set | None = None) -> State:
    record = catalogue.by_name(name)
    served = record is not None and any(n.name == name and n.hf for n in record.names)
    if name in PART_CONFIGS:
        table, record = PART_CONFIGS[name], None
    elif record is None or record.hf is None or not record.hf.config or not served:
        raise MappingError(f"{name}: no Hugging Face config table (not served by the HF rules)")
    else:
        table = record.hf.config
    state = State(side, Reading(config, read), {}, name, record)
    for step in table:
        _STEPS[type(step)](step, state)
    return state


def _renames(step: Renames, s: State) -> None:
    if step.side not in (None, s.side):
        return
    for hf_key, cs_key in step.pairs:
        key, to = (cs_key, hf_key) if s.side == CS else (hf_key, cs_key)
        if key in s.src and not (step.skip_none and s.src[key] is None):
            s.out[to] = s.src[key]


def _defaults(step: Defaults, s: State) -> None:
    if step.side == s.side:
        merged = {**s.src, **step.values} if step.over else {**step.values, **s.src}
        s.src = Reading(merged, getattr(s.src, "read", None))


def _fixed(step: Fixed, s: State) -> None:
    if step.side != s.side:
        return
    for key, want in step.values.items():
        got = s.src.get(key, want)
        allowed = want if isinstance(want, tuple) else (want,)
        if got in allowed or (step.empty_is_none and want is None and got in ({}, [])):
            continue
        raise MappingError(step.message.format(key=key, got=got, want=want, allowed=(want,)))


def _written(step: Written, s: State) -> None:
    if step.side == s.side:
        s.out.update({k: v for k, v in step.values.items() if step.over or k not in s.out})


def _like(step: Like, s: State) -> None:
    skip = step.skip if s.side == CS else ()
    given = {k: v for k, v in s.src.items() if k not in skip}
    s.out.update(_state(s.side, given, step.name, getattr(s.src, "read", None)).out)


def _required(step: Required, s: State) -> None:
    if step.side == s.side:
        for key in step.keys:
            if key not in s.src:
                raise MappingError(step.message.format(key=key))


def _op(step: Op, s: State) -> None:
    export, import_ = OPS[step.name]
    fn = export if s.side == CS else import_
    if fn is not None:
        fn(s, **step.args)


_STEPS: dict[type, Callable[[Any, State], None]] = {
    Renames: _renames,
    Defaults: _defaults,
    Fixed: _fixed,
    Written: _written,
    Required: _required,
    Like: _like,
    Op: _op,
}
