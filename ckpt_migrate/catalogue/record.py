"""What one catalogue record declares: a model family, as Model Zoo's converters and this tool's
rooms see it (names, CS key layout, detection signature, ties, config markers, the Hugging Face
side). Declarations only: the rooms that act on a family (``models/``, ``config/``, the hops,
``hf/``) read these records and hold no family of their own.

Sources are cited where each record is declared (``gpt2_like.py`` ... ``keyless.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckpt_migrate.catalogue.config import Step
from ckpt_migrate.catalogue.mup import Mup


@dataclass(frozen=True)
class Tie:
    """Two CS key suffixes (whole dotted segments) holding one tensor, while ``config_flag``
    (a model config key, default true) is on; ``None``: always."""

    a: str
    b: str
    config_flag: str | None = None


@dataclass(frozen=True)
class Layout:
    """A CS key layout several families share: its key vocabulary (``models/keys`` pattern
    syntax) and its ties."""

    name: str
    keys: tuple[str, ...]
    ties: tuple[Tie, ...] = ()


@dataclass(frozen=True)
class Name:
    """One model name Model Zoo 2.10's converter registry knows (``registry.py``, tag
    Release_2.10.0, lines 173-333), spelled as there; or (``position`` None) one only this
    tool's Hugging Face rules serve (an HF model type of an existing CS layout)."""

    name: str
    registry: str | None  # trainer.init.model.name (registry.yaml / _model_aliases); None: none
    position: int | None  # its place in registry.py's listing (converters, then aliases);
    # None: a name Model Zoo does not have, served by this tool's Hugging Face rules only
    since: str | None = None  # oldest release its converters convert from (None: alias_of's)
    alias_of: str | None = None  # the registry key whose converter list an alias shares
    headless: bool = False  # the model without lm_head (Model Zoo's *Model_HF_CS* converters)
    hf: bool = True  # served by the record's Hugging Face rules


@dataclass(frozen=True)
class Signature:
    """Detection from key names (``models/detect.FEATURES``): anchors that must be present, and
    for each further feature whether the family's keys show it."""

    anchors: tuple[str, ...]
    expected: dict[str, bool]


@dataclass(frozen=True)
class Drop:
    """Tensors a conversion leaves out on purpose (full matches of the regex ``pattern``), with
    the reason the report gives; ``when``: only while the config's ``(field, value, default)``
    holds."""

    pattern: str
    why: str
    when: tuple[str, Any, Any] | None = None


@dataclass(frozen=True)
class Absent:
    """A CS tensor that Model Zoo's own HF → CS import leaves out, so its CS files lack it:
    ``names`` are the names of the one tensor (a tie group: absent only when the file has none
    of them), ``shape`` the model config fields giving its shape, ``why`` where Model Zoo drops
    it. ``zeros``: the export writes zeros in its place (the model stays usable; ``holds``
    says what the output then holds); else the HF tensors built from it are left out, a model
    that is not usable, refused unless ``--allow-missing-tensors``."""

    names: tuple[str, ...]
    shape: tuple[str, ...]
    why: str
    holds: str
    zeros: bool = False
    models: tuple[str, ...] = ()  # the Model Zoo names it concerns (empty: every one)


@dataclass(frozen=True)
class Part:
    """A model a composite family holds, converted by another Model Zoo name's rules: its CS
    key prefix and HF key prefix; ``name`` the name whose rules convert it, or ``None``: the
    one the CS config's ``name_field`` gives (HF side: ``config.json``'s architecture or
    ``model_type``), which must be one of ``names``. ``copies``: further CS prefixes the import
    writes the same tensors under (DPO's reference model).

    A composite of several Hugging Face models (Model Zoo's ``UnpackedHF_PackedCS``
    converters, ``base_converter.py`` lines 1063-1296) puts each in a sub-directory: its
    ``hf_prefix`` is ``<directory>/``. ``config``: the dotted key of the part's section in the
    CS model config (``None``: the composite's own fields, the part's rules see them all).
    ``inner_cs``: the CS prefix the part's rules write, which ``cs_prefix`` replaces."""

    cs_prefix: str
    hf_prefix: str = ""
    name: str | None = None
    name_field: str | None = None
    names: tuple[str, ...] = ()
    copies: tuple[str, ...] = ()
    config: str | None = None
    inner_cs: str = ""

    @property
    def directory(self) -> str | None:
        """The HF sub-directory holding this part (``None``: the composite's own)."""
        head, slash, _ = self.hf_prefix.partition("/")
        return head if slash else None


@dataclass(frozen=True)
class Tensors:
    """How a family's tensors convert: its ``table`` and the ``context`` that reads the config
    for it, each named ``<module>.<name>`` of ``hf/layouts/`` (the context is shared by a
    layout group), and the facts of this family the context reads (``params``: the CS
    defaults, the HF prefix, the config fields the table's operations read ...)."""

    table: str
    context: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Hf:
    """The Hugging Face side: the name of its rules (``hf/families.py``; records sharing it are
    converted by one set of rules), the ``config.json`` ``model_type``\\ s it imports, each
    name's architecture class, its tensors (``tensors``) and config (``config``) tables."""

    module: str
    model_types: tuple[str, ...] = ()
    architectures: dict[str, str] = field(default_factory=dict)
    by_architecture: bool = False  # import picks the name from ``architectures`` first
    cs_dropped: tuple[Drop, ...] = ()  # CS tensors the export leaves out
    hf_dropped: tuple[Drop, ...] = ()  # HF tensors the import leaves out
    cs_absent: tuple[Absent, ...] = ()  # CS tensors Model Zoo's import leaves out
    notes: tuple[str, ...] = ()  # how it differs from Model Zoo (``list-converters``)
    # config.json values the import only approximates: (field, the value converted exactly,
    # what the CS model computes instead); another value is imported with that warning
    approximates: tuple[tuple[str, Any, str], ...] = ()
    parts: tuple[Part, ...] = ()  # a composite: the models it holds (``hf/compose.py``)
    cs_fields: dict[str, Any] = field(default_factory=dict)  # composite's own CS config fields
    mup: Mup | None = None  # its muP; with multipliers: the export folds them (hf/mup.py)
    mup_native: tuple[str, ...] = ()  # muP-named fields its HF config carries itself
    config: tuple[Step, ...] = ()  # its config table (``catalogue/config.py``)
    tensors: Tensors | None = None  # its tensor table and context (None: a composite's parts)
    config_label: str | None = None  # refuse another name's config as not this family's
    # CS optimizer fields its HF config carries: (dotted CS optimizer key, HF field, default)
    cs_optimizer: tuple[tuple[str, str, Any], ...] = ()


@dataclass(frozen=True)
class NormFlag:
    """The 1.9 boolean that 2.0 replaced by ``norm_type`` (MODELZOO_HISTORY.md §3.6): the flag,
    the ``norm_type`` it means when true, and the ``norm_type`` written when it is absent
    (``None``: none, the 2.0 default applies)."""

    flag: str
    when_true: str
    when_absent: str | None


@dataclass(frozen=True)
class Record:
    """One model family."""

    name: str  # the family name hops and ``--model`` resolution use
    layout: Layout | None  # its CS key layout; None: no key table (model-independent steps only)
    names: tuple[Name, ...] = ()
    steps_of: str | None = None  # another family whose steps apply (RoBERTa: BERT's)
    more_names: tuple[tuple[str, str | None], ...] = ()  # further accepted names -> registry
    registry: str | None = None  # registry name when the family alone decides it
    config_group: str | None = None  # families sharing config keys (one Model Zoo class)
    extra_keys: tuple[str, ...] = ()  # keys beyond its layout's
    signature: Signature | None = None
    config_markers: frozenset[str] = frozenset()  # model config keys only it has
    marker_veto: frozenset[str] = frozenset()  # ... unless one of these is there too
    norm_flag: NormFlag | None = None
    same_keys_as: str | None = None  # a family with its CS keys but another HF layout
    hf: Hf | None = None
    extra_ties: tuple[Tie, ...] = ()  # ties beyond its layout's

    @property
    def ties(self) -> tuple[Tie, ...]:
        return (*(self.layout.ties if self.layout else ()), *self.extra_ties)

    @property
    def family(self) -> str:
        """The family whose steps apply."""
        return self.steps_of or self.name
