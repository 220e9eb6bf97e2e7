"""A checkpoint as read from disk: the neutral tree plus what the file said about itself."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_migrate.format.releases import Detected, Release
from ckpt_migrate.format.tree import MissingLeaf, Node, iter_leaves

_GRAPH_ARGUMENT = re.compile(r"__.+\.arg_\d+")


@dataclass
class Checkpoint:
    root: Node
    detected: Detected
    path: Path | None = None
    unreferenced: list[str] = field(default_factory=list)  # datasets the spec does not name
    provenance: list[dict[str, Any]] = field(default_factory=list)  # earlier ckpt-migrate runs
    warnings: list[str] = field(default_factory=list)
    had_tensor_scalar_dict: bool = False  # 1.7-era spec node, read as a plain dict
    handle: Any = None  # h5io.H5Handle kept open for lazy reads
    data_bytes: int | None = 0  # bytes the datasets store, the rest is metadata (None: unmeasured)
    outline: bool = False  # read from the root and links alone (``read.read_outline``)

    @property
    def release(self) -> Release | None:
        return self.detected.release

    @property
    def format(self) -> float:
        return self.detected.format

    @property
    def missing(self) -> list[str]:
        """Leaf names the spec lists but the file has no data for."""
        return [ref.name for ref in iter_leaves(self.root) if isinstance(ref.leaf, MissingLeaf)]

    @property
    def strays(self) -> list[str]:
        """The datasets no leaf names, but a legacy graph tensor's arguments (``__<name>.arg_<i>``,
        FORMAT.md §3.2): a 1.9 save leaves those beside the tensors, and every loader ignores
        them; the others are someone's."""
        return [n for n in self.unreferenced if not _GRAPH_ARGUMENT.fullmatch(n)]

    def ready_to_read(self) -> None:
        """Where the tree is read from a file, its walk ended and the map of overlapping data
        made (``H5Handle.ready_to_read``) before the first tensor's read, which would make it
        unsaid and beside what the read holds."""
        if self.handle is not None:
            self.handle.ready_to_read()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
