"""Output directories named like files: ``upgrade -o out.mdl`` or ``export-hf ckpt
model.safetensors`` made a directory of that name. The command line refuses such a name where
no directory has it yet, with one to use instead (the Python API takes any name it is given)."""

from __future__ import annotations

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
