"""Which Hugging Face rules convert a model, and what the pipeline asks of them: the rules
(``hf/families.py``, by the catalogue's ``hf.module``), the tensors no rule converts, and the layer
counts a config may declare. Shared by export and import."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckpt_migrate.errors import UnsupportedContentError, UsageError
from ckpt_migrate.hf import families
from ckpt_migrate.hf.mapping import Family, MappingError


def family_for(name: str) -> Family:
    """The rules that serve model ``name`` (``hf/families.py``); a one-line error naming
    ``--model``."""
    table = families.by_name()
    if canonical_name(name) in table:
        return table[canonical_name(name)]
    known = ", ".join(sorted(table)) or "none yet"
    raise UsageError(
        None,
        f"no Hugging Face conversion rules for model {name!r}",
        f"pass --model with one of: {known}",
    )


def canonical_name(name: str) -> str:
    """``name`` as the rules spell it (model names are case-insensitive)."""
    folded = {k.lower(): k for k in families.by_name()}
    return folded.get(name.strip().lower(), name)


def mapping_failed(path: Path | None, exc: MappingError) -> UnsupportedContentError:
    return UnsupportedContentError(path, str(exc))


def strip_model_prefix(names: list[str]) -> dict[str, str]:
    """Bare CS name -> stored name: 1.8-2.0 saves (and files upgraded from them) carry a
    ``model.`` prefix inside the ``model`` state (Model Zoo strips it either way,
    ``helper.py`` ``Build_HF_CS_Converter_WithOptionalModel``)."""
    prefixed = bool(names) and all(n.startswith("model.") for n in names)
    return {(n[len("model.") :] if prefixed else n): n for n in names}


def refuse_unused(
    src: Path, unused: list[str], name: str, drop: bool, what: str = "tensor"
) -> None:
    """Tensors the family's rules do not convert are an error unless dropped by name."""
    if unused and not drop:
        raise UnsupportedContentError(
            src,
            f"{len(unused)} {what}(s) the {name} rules do not convert: "
            + ", ".join(unused[:4])
            + (" ..." if len(unused) > 4 else ""),
            "pass --drop-unmatched-keys (drop_unmatched_keys=True) to leave them out",
        )


# Config fields that say how many layers a plan walks (HF and CS spellings).
_LAYER_COUNTS = (
    "n_layer",
    "n_layers",
    "num_layers",
    "num_hidden_layers",
    "num_decoder_layers",
    "encoder_num_hidden_layers",
    "decoder_num_hidden_layers",
)


def check_layer_counts(path: Path, config: Mapping[str, Any], tensors: int, depth: int = 4) -> None:
    """A config may not declare more layers than the file has tensors: the plan walks every
    declared layer, so a crafted count would buy minutes of CPU before any tensor is missed.
    Sections are checked too, ``depth`` levels down (a composite's parts,
    ``hf/compose.py``, are at most four: MM-Simple's image encoder). A count that is true or
    false is refused too: Python takes it for 1 or 0, and it went through to the other side's
    config as a boolean."""
    for key in _LAYER_COUNTS:
        value = config.get(key)
        if isinstance(value, bool):
            raise UnsupportedContentError(path, f"{key} is {str(value).lower()}, not a layer count")
        if isinstance(value, int) and not 0 <= value <= tensors:
            raise UnsupportedContentError(
                path, f"{key} is {value}, but the model has {tensors} tensors"
            )
    for value in config.values() if depth else ():
        for section in value if isinstance(value, list) else [value]:
            if isinstance(section, Mapping):
                check_layer_counts(path, section, tensors, depth - 1)


def plain(result: Any) -> dict[str, Any]:
    """A result dataclass as JSON-ready data: paths as strings."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(result).items()}
