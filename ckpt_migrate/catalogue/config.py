"""The vocabulary of a family's Hugging Face config table (``Hf.config``): the rules Model Zoo's
``ConfigConverter_*`` classes declare (``base_converter.py`` at tag Release_2.10.0:
``EquivalentSubkey`` renames, ``assert_factory_fn`` fixed values, ``pre_convert_defaults`` /
``post_convert_defaults``), as data. One interpreter (``hf/config_table.py``) runs a table either
way, step by step in its order: each step says what it does when the config is read from its
``side`` ("cs": the CS ``model:`` section, exporting; "hf": ``config.json``, importing) and what
it writes on the other side. What is not a rename is an :class:`Op`, named: the interpreter
knows each one's two directions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CS, HF = "cs", "hf"  # the side a config is read from

# (HF key, CS key): the sizes transformers' LLaMA-style and GPT-NeoX configs spell alike.
DECODER_SIZES: tuple[tuple[str, str], ...] = (
    ("vocab_size", "vocab_size"),
    ("hidden_size", "hidden_size"),
    ("num_attention_heads", "num_heads"),
    ("num_hidden_layers", "num_hidden_layers"),
    ("max_position_embeddings", "max_position_embeddings"),
    ("intermediate_size", "filter_size"),
)


@dataclass(frozen=True)
class Renames:
    """(HF key, CS key) pairs copied each way when the source has the key; ``skip_none``: a
    null value is not copied; ``side``: copied only reading that side."""

    pairs: tuple[tuple[str, str], ...]
    skip_none: bool = False
    side: str | None = None


@dataclass(frozen=True)
class Defaults:
    """Values a ``side`` config lacks, filled in before the later steps read it; ``over``: the
    values replace the config's own."""

    side: str
    values: dict[str, Any]
    over: bool = False


@dataclass(frozen=True)
class Fixed:
    """Fields a ``side`` config may hold with one value only, or any of a tuple's (when it has
    them); refused with ``message`` (``{key}``, ``{got}``, ``{want}``, ``{allowed}``: the one
    value in a tuple); ``empty_is_none``: ``{}``/``[]`` pass for None."""

    side: str
    values: dict[str, Any]
    message: str
    empty_is_none: bool = False


@dataclass(frozen=True)
class Written:
    """Fields written on the side opposite ``side`` (reading ``side``) unless a step wrote them
    (``over``: whatever a step wrote)."""

    side: str
    values: dict[str, Any]
    over: bool = False


@dataclass(frozen=True)
class Required:
    """Fields a ``side`` config must give, refused with ``message`` (``{key}``)."""

    side: str
    keys: tuple[str, ...]
    message: str


@dataclass(frozen=True)
class Like:
    """The table of ``name`` (a Model Zoo name's, or a part's) run on the config, its output
    written; ``skip``: CS fields that table does not read (the including table's own)."""

    name: str
    skip: tuple[str, ...] = ()


@dataclass(frozen=True)
class Op:
    """A named operation (``hf/config_ops.py``) with its arguments."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)


Step = Renames | Defaults | Fixed | Written | Required | Like | Op
