"""Outputs named as the other kind: ``upgrade -o out.mdl`` or ``export-hf ckpt
model.safetensors`` made a directory of that name, and ``to-torch ckpt outdir/`` a file named
``outdir`` (typer's ``Path`` drops the trailing separator). The command line refuses such a name,
with one to use instead (the Python API takes any name it is given)."""

from __future__ import annotations

import os
from pathlib import Path

from ckpt_migrate.errors import UsageError

CHECKPOINT_SUFFIXES = (".mdl", ".h5", ".hdf5")
HF_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".json", *CHECKPOINT_SUFFIXES)


def refuse_a_file_name(given: Path, suffixes: tuple[str, ...], why: str, option: str = "") -> None:
    """Refuse ``given`` (a local directory to create) if its name ends like a file's:
    ``why`` says what the command writes, ``option`` prefixes the name suggested instead."""
    if given.suffix.lower() in suffixes and not given.is_dir():
        raise UsageError(
            given,
            f"is named like a file, but {why}",
            f"name a directory, e.g. {option}{given.with_suffix('')}",
        )


def path(value: str) -> str:
    """A path argument as typed, its trailing separator kept for ``file_to_write`` (the parser
    of an argument; its name is what the help shows: ``<path>``)."""
    return value


def file_to_write(given: str, source: Path, suffix: str) -> Path:
    """The file a converter is to write, as typed: a name ending in a separator, or an existing
    directory, is refused with a file inside it to name instead (``source``'s stem, ``suffix``)."""
    named = Path(given)
    is_dir = os.path.isdir(named)  # (False for a name the system refuses: the writer names it)
    if is_dir or given.endswith(("/", os.sep)):
        why = "is a directory" if is_dir else "ends with a separator: a directory's name"
        raise UsageError(
            named,
            f"{why}, but this command writes one file",
            f"name the file to write, e.g. {named / (source.stem + suffix)}",
        )
    return named
