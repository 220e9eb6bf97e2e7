"""One function per CLI verb, each a thin call into the engine (like Alembic's ``command.py``).

They return plain data; ``cli.py`` decides how to print it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import outline
from .reader import read_checkpoint


def inspect(path: str | Path) -> dict[str, Any]:
    with read_checkpoint(path) as ckpt:
        data = outline.report(ckpt)
        data["outline"] = outline.outline_lines(ckpt.root)
    return data


def to_torch(src: str | Path, dst: str | Path, *, allow_missing: bool = False) -> dict[str, Any]:
    from .api import to_torch as convert

    out = convert(src, dst, allow_missing=allow_missing)
    return {"source": str(src), "output": str(out)}


def from_torch(src: str | Path, dst: str | Path, release: str | None = None) -> dict[str, Any]:
    from .api import from_torch as convert

    rep = convert(src, dst, release)
    return {
        "source": str(src),
        "output": str(rep.path),
        "release": rep.release.name,
        "format": rep.release.format,
        "tensors": rep.tensors,
        "tensor_bytes": rep.tensor_bytes,
        "notes": rep.notes,
    }
