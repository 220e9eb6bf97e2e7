"""The name tables: every name ``--model``, ``convert_checkpoint.py`` and a config's own model
name may use, with the family whose steps apply and Model Zoo's registry name, as the catalogue
(``ckpt_migrate/catalogue``) declares them.

Model Zoo 2.10 knows 54 converter model names: the keys of ``converters`` plus the aliases added
below it (tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/
registry.py``, lines 173-333). :data:`MODELZOO_NAMES` lists them all, spelled and ordered as
there. Families are key layouts (MODELZOO_HISTORY.md §3.5): :data:`GPT_STYLE` are the decoder
LMs of one ``GPT2LMHeadModel`` layout, :data:`KEYLESS` the families without a key table (every
hop applies only its model-independent steps, as Model Zoo's fallback converters do).
``-headless`` names are the same models without ``lm_head``; they share the family's steps.

Registry names (``trainer.init.model.name`` from 2.4 on): ``registry.yaml`` and
``_model_aliases`` (Release_2.10.0 registry.py lines 338-378); ``None`` where Model Zoo has none.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ckpt_migrate import catalogue
from ckpt_migrate.errors import UsageError


@dataclass(frozen=True)
class ModelName:
    """One Model Zoo converter model name."""

    name: str  # as Model Zoo 2.10's converter registry spells it
    family: str  # the key/config family whose steps apply
    registry: str | None  # Model Zoo registry name (trainer.init.model.name), None: none
    headless: bool = False  # the model without lm_head

    @property
    def modelzoo_from(self) -> str:
        """The oldest release Model Zoo 2.10 converts this model's checkpoints from (1.7 for
        names it has since 1.6): the oldest ``cs-X.Y`` among the ``formats()`` of the name's
        converters, below which it offers no fallback either (``convert_checkpoint.py``
        ``_get_oldest_converter_version`` and ``get_model_converter``). This tool converts
        from every release; older files of these models do not exist."""
        return MODELZOO_FROM[_ALIAS_OF.get(self.name, self.name)]


# Decoder LMs: one GPT2LMHeadModel key layout, configured per family.
GPT_STYLE: tuple[str, ...] = catalogue.layout_families(catalogue.DECODER)
# Families without a key table: only the model-independent steps apply.
KEYLESS: tuple[str, ...] = tuple(r.name for r in catalogue.families() if r.layout is None)
FAMILIES: tuple[str, ...] = tuple(r.name for r in catalogue.families())

MODELZOO_NAMES: tuple[ModelName, ...] = tuple(
    ModelName(n.name, r.family, n.registry, n.headless) for n, r in catalogue.modelzoo_names()
)

# The oldest release each Model Zoo 2.10 converter list converts from (see
# ModelName.modelzoo_from), per registry key; aliases share their target's list.
MODELZOO_FROM: dict[str, str] = {
    n.name: n.since for n, _ in catalogue.modelzoo_names() if n.since is not None
}
_ALIAS_OF: dict[str, str] = {
    n.name: n.alias_of for n, _ in catalogue.modelzoo_names() if n.alias_of is not None
}

# Further names this tool accepts: registry spellings and common aliases, and the names only
# its Hugging Face rules serve (a CS checkpoint of the family they name).
_MORE_NAMES: dict[str, tuple[str, str | None]] = {
    **{name: (r.family, registry) for r in catalogue.RECORDS for name, registry in r.more_names},
    **{n.name: (r.family, n.registry) for n, r in catalogue.model_names() if n.position is None},
}

# name (lower case) -> (family, registry name or None)
MODEL_NAMES: dict[str, tuple[str, str | None]] = {
    **{m.name.lower(): (m.family, m.registry) for m in MODELZOO_NAMES},
    **_MORE_NAMES,
}
# Families whose Model Zoo name follows from the family alone (no variants to tell apart).
NAME_FROM_FAMILY: dict[str, str] = {
    r.name: r.registry for r in catalogue.families() if r.registry is not None
}


def known_names() -> str:
    return ", ".join(m.name for m in MODELZOO_NAMES) + ", " + ", ".join(_MORE_NAMES)


def resolve_name(name: str) -> tuple[str, str | None]:
    """``(family, registry name)`` for a model name (case-insensitive); a clear error for an
    unknown one."""
    key = name.strip().lower()
    if key in MODEL_NAMES:
        return MODEL_NAMES[key]
    close = difflib.get_close_matches(key, MODEL_NAMES, n=3, cutoff=0.8)
    guess = f"did you mean {' or '.join(close)}? " if close else ""
    raise UsageError(None, f"unknown model {name!r}", f"{guess}known models: {known_names()}")


def canonical_family(name: str) -> tuple[str, str | None]:
    """``(family, variant)``: the variant is the name as given (lower case) when it is not the
    family's own name, else None."""
    family, _ = resolve_name(name)
    key = name.strip().lower()
    return family, None if key == family else key


def config_group(family: str) -> str:
    """The families sharing ``family``'s config keys (GPT-J, NeoX and CodeGen: one model class
    in Model Zoo), by the name of one of them."""
    record = catalogue.by_family(family) if family in FAMILIES else None
    return (record.config_group if record else None) or family
