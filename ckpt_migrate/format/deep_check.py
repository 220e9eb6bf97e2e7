"""``check --deep``: decode every chunk of every tensor of a checkpoint, streaming, and name each
damaged tensor (issue #36).

An upgrade copies tensor data as stored (a clone, a copy, or the stored chunks of a rewrite): it
proves the output holds the source's bytes, not that those bytes decode. This reads every
tensor in slabs of at most ``COPY_BLOCK_BYTES`` through ``h5.io.read_slab`` (whose chunk checks,
``h5.chunks``, refuse what a filter did not produce), keeps nothing, and goes on past a damaged
tensor to the next, so that one run names all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ckpt_migrate.errors import CorruptCheckpointError
from ckpt_migrate.format import dtypes
from ckpt_migrate.format.checkpoint import Checkpoint
from ckpt_migrate.format.h5.identity import watch
from ckpt_migrate.format.h5.io import iter_slabs, read_slab
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import H5Data, TensorLeaf, iter_leaves


@dataclass
class DeepReport:
    path: Path
    tensors: int = 0  # tensors decoded (a tied tensor once)
    bytes_decoded: int = 0
    damaged: list[tuple[str, str]] = field(default_factory=list)  # (tensor, its problem)
    fixes: list[str | None] = field(default_factory=list)  # each damaged tensor's way out, in order

    def to_json(self) -> dict:
        return {
            "path": str(self.path),
            "tensors_decoded": self.tensors,
            "bytes_decoded": self.bytes_decoded,
            "damaged": [
                {"tensor": name, "problem": why, "fix": fix}
                for (name, why), fix in zip(self.damaged, self.fixes)
            ],
        }

    def error(self) -> CorruptCheckpointError | None:
        """The one-line refusal a file with tensors that do not decode gets (None if there are
        none). Its fix is theirs where they share one (a chunk a writer never stored is not
        damage: a rewrite that stores it mends the file)."""
        if not self.damaged:
            return None
        names = ", ".join(repr(name) for name, _ in self.damaged[:3])
        more = f" and {len(self.damaged) - 3} more" if len(self.damaged) > 3 else ""
        fixes = set(self.fixes)
        shared = fixes.pop() if len(fixes) == 1 else None
        return CorruptCheckpointError(
            self.path,
            f"{len(self.damaged)} of {self.tensors} tensors do not decode: {names}{more}",
            shared or "the file is damaged; use another copy",
        )


def deep_check(path: str | Path, progress: Progress | None = None) -> DeepReport:
    """Decode every tensor of the checkpoint at ``path`` (see the module docstring)."""
    with read_checkpoint(path, progress=progress) as ckpt:
        if progress is not None:
            ckpt.ready_to_read()
        unchanged = watch(Path(path), voids="the check does not hold")
        report = check_tensors(ckpt, progress)
        unchanged()  # (a verdict on a file written meanwhile is on neither version)
        return report


def check_tensors(ckpt: Checkpoint, progress: Progress | None = None) -> DeepReport:
    """Decode every tensor of an open checkpoint; ``progress`` hears of it as phase ``decode``,
    in bytes."""
    report = DeepReport(Path(ckpt.path or ckpt.handle.path))
    leaves: dict[int, tuple[str, TensorLeaf]] = {}
    for ref in iter_leaves(ckpt.root):
        if isinstance(ref.leaf, TensorLeaf) and isinstance(ref.leaf.data, H5Data):
            leaves.setdefault(id(ref.leaf), (ref.name, ref.leaf))
    total = sum(leaf.nbytes for _, leaf in leaves.values())
    for name, leaf in leaves.values():
        report.tensors += 1
        problem = _decode(leaf)
        if problem is not None:
            report.damaged.append((name, problem.problem))
            report.fixes.append(problem.fix)
        report.bytes_decoded += leaf.nbytes
        if progress is not None:
            progress("decode", report.bytes_decoded, total)
    return report


def _decode(leaf: TensorLeaf) -> CorruptCheckpointError | None:
    data = leaf.data
    assert isinstance(data, H5Data)
    try:
        ds = data.handle.dataset(data.name)
        for sl in iter_slabs(tuple(ds.shape), dtypes.by_name(leaf.dtype).storage.itemsize):
            read_slab(ds, sl)
    except CorruptCheckpointError as exc:  # (a layout it does not read is refused, not damage)
        return exc
    return None
