"""A Hugging Face model as one directory, or as several: Model Zoo's multi-model converters
(``BaseCheckpointConverter_UnpackedHF_PackedCS``, tag Release_2.10.0, ``base_converter.py``
lines 1063-1296: Dragon+, LLaVA) read and write one sub-directory per model, each with its own
``config.json`` and weights. Inside this tool such a model's HF names are
``<directory>/<name>`` and its config maps each directory to its ``config.json``
(``hf/compose.py``); here they are split into directories and joined back.

The export streams every directory's tensors in one pass (the plan is ordered by directory),
into sub-directories of the one temporary directory ``outdir.atomic_dir`` renames into place:
a kill leaves no directory that looks complete.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_migrate.hf import safetensors_io as st
from ckpt_migrate.hf.mapping import Out

ONE = ("",)  # a model in one directory


def of(module: Any, name: str) -> tuple[str, ...]:
    """The sub-directories the rules of ``name`` write (``ONE``: none)."""
    found = getattr(module, "directories", None)
    return (found(name) if found else ()) or ONE


def _dir(name: str) -> str:
    head, slash, _ = name.partition("/")
    return head if slash else ""


def grouped(plan: list[Out], dirs: tuple[str, ...]) -> list[Out]:
    """The plan ordered by directory (each directory's outputs in their order)."""
    if dirs == ONE:
        return plan
    return sorted(plan, key=lambda o: dirs.index(_dir(o.name)))


def _bare(name: str, directory: str) -> str:
    return name[len(directory) + 1 :] if directory else name


def _entries_in(entries: list[st.Entry], directory: str) -> list[st.Entry]:
    """The entries of one directory of a model split in several, named from there."""
    return [
        st.Entry(_bare(e.name, directory), e.dtype, e.shape)
        for e in entries
        if _dir(e.name) == directory
    ]


def write(
    tmp: Path,
    dirs: tuple[str, ...],
    hf_config: dict[str, Any],
    entries: list[st.Entry],
    arrays: Iterator[tuple[str, np.ndarray]],
    max_shard: int,
    main_dtype: Callable[[list[st.Entry]], str],
    after: Callable[[], None],
) -> st.Written:
    """Each directory's shards and ``config.json`` (``hf_config``: by directory unless one),
    every file read back; ``after`` runs once all tensors are written. Takes ``entries``: the
    list is emptied, its entries let go of before the files are read back (``st.verify``
    checks them by the write's record). Returns what was written, file names relative to
    ``tmp``, and each safetensors file's record (``total.sizes``: ``total.tensors``)."""
    total = st.Written()
    configs = {"": hf_config} if dirs == ONE else hf_config
    parts = [entries[:]] if dirs == ONE else [_entries_in(entries, d) for d in dirs]
    entries.clear()
    for directory in dirs:
        mine = parts.pop(0)
        where = tmp / directory if directory else tmp
        where.mkdir(exist_ok=True)
        # the last directory takes the rest, so that the writer's check for one more ends
        # the generator (and whatever it holds) before the files are read back
        rest = arrays if directory == dirs[-1] else islice(arrays, len(mine))
        some = ((_bare(n, directory), a) for n, a in rest)
        written = st.write_stream(where, mine, some, max_shard)
        config = configs[directory]
        config.setdefault("dtype", main_dtype(mine))
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        (where / "config.json").write_text(text, encoding="utf-8")
        del mine
        st.verify(where, written)
        prefix = f"{directory}/" if directory else ""
        total.files += [prefix + f for f in (*written.files, "config.json")]
        total.sizes.update({prefix + f: sizes for f, sizes in written.sizes.items()})
        total.total_size += written.total_size
    after()
    return total


def read(src: Path, dirs: tuple[str, ...], read_config, read_tensors) -> tuple[dict, dict]:
    """(config, tensors) of an HF model in ``dirs`` (``ONE``: ``src`` itself): by directory,
    the names prefixed ``<directory>/``."""
    if dirs == ONE:
        return read_config(src), read_tensors(src)
    configs, tensors = {}, {}
    for directory in dirs:
        configs[directory] = read_config(src / directory)
        found = read_tensors(src / directory)
        tensors.update({f"{directory}/{n}": t for n, t in found.items()})
    return configs, tensors
