"""JSON documents read from beside a checkpoint: a Hugging Face ``config.json``, a shard
index, a safetensors header. Whatever they hold, a malformed document is a ``ValueError``,
which every reader turns into a one-line refusal naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ckpt_migrate.errors import CkptIOError, CorruptCheckpointError

MAX_BYTES = 100_000_000  # a shard index or a safetensors header (safetensors' own header limit)


def loads(data: str | bytes) -> Any:
    """``json.loads``, with nesting deeper than Python decodes (``[[[[…``, which CPython's
    decoder meets as a ``RecursionError``) a ``ValueError`` like any other malformed JSON."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply to decode") from None


def read(path: Path, limit: int) -> Any:
    """The JSON document in ``path``; a ``ValueError`` if it is over ``limit`` bytes (read
    whole, it would cost as much memory), not UTF-8 or malformed, an ``OSError`` if
    unreadable."""
    if path.stat().st_size > limit:
        raise ValueError(f"over {limit:,} bytes")
    if not path.is_file():  # (a named pipe's read waits for a writer)
        raise ValueError("not a regular file")
    return loads(path.read_text(encoding="utf-8"))


def shard_names(index: Path) -> list[str]:
    """The files a Hugging Face shard index (``*.index.json``) maps tensors to, sorted: plain
    names of files beside it, never a path out of its directory. Refused in one line where it
    is not such an index."""
    try:
        doc = read(index, MAX_BYTES)
    except ValueError as exc:
        raise CorruptCheckpointError(index, f"unreadable index ({exc})") from None
    except OSError as exc:
        raise CkptIOError.reading(index, exc) from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise CorruptCheckpointError(index, "not a shard index (no weight_map object)")
    names = set(weight_map.values())
    for name in names:
        if not isinstance(name, str) or Path(name).name != name or name in ("", "..", "."):
            raise CorruptCheckpointError(
                index,
                f"its weight_map names {name!r}, not a file of its directory",
                "put the shards beside their index and name them by file name",
            )
    return sorted(names)
