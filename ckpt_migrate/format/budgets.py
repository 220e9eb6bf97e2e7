"""Budgets: limits on what a file may declare, which no legitimate checkpoint comes near and a
crafted one hits at once (README "The file is the whole world").

A checkpoint's cost to read should follow its size on disk. Three things a file declares could
break that, and each has a budget here:

- **Spec nodes.** A pickle can reference one record many times, so a 17 KB legacy ``__spec__``
  can describe a tree of 2^60 nodes. Real state dicts have thousands of leaves; the budget is a
  million nodes after expansion, checked while expanding.
- **Nesting depth.** Readers and writers walk the tree recursively. Real state dicts are under
  ten deep, but the real library writes far deeper ones: cstorch 2.10's ``save`` (torch 2.4)
  writes a state nested up to 330 containers deep at Python's default recursion limit (its
  ``treespec_dumps`` recursion ends there), more under a raised limit, and its ``load`` reads
  back up to 494 (its JSON decode of the treespec ends there). :data:`MAX_DEPTH` is that 494:
  whatever the real loader reads, ckpt-migrate reads, upgrades and writes; a deeper tree is
  refused as unsupported (no real loader reads it back), never as damage. Walking that deep
  takes a few frames a level, so importing this module raises Python's recursion limit to
  :data:`RECURSION_LIMIT` (never lowers it); a crafted spec nested deeper than that still ends
  in a ``RecursionError`` of the JSON decoder, reported as the same refusal.
- **Declared bytes.** A dataset's shape says how many bytes reading it produces. Stored bytes
  expand at most by the compression ratio of a filter (deflate tops out near 1032:1, LZ4 near
  255:1), so a tensor declaring more than :data:`MAX_EXPANSION` times its stored bytes (plus a
  small slack for unwritten small datasets) was not written by a checkpoint writer, and reading
  it would let a 6 KB file allocate gigabytes or a ``verify`` hash terabytes of fill value. The
  same ratio bounds all tensors of the file together, constant (``full``) tensors included, so
  ``to-torch``/``load`` cannot be made to materialise more than the file could hold.
- **Chunk grid.** HDF5 decodes whole chunks, so what a read costs is the chunks covering the
  tensor, not its shape: a tensor of 32 bytes in one 4 GiB chunk (``maxshape=None`` lets a
  chunk exceed the data) costs 4 GiB a read. A grid past the tensor's bytes times 2 per axis
  (edge chunks never reach that) plus :data:`CHUNK_SLACK` (h5py's own chunks are at most
  1 MiB) is refused.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from ckpt_migrate.errors import CorruptCheckpointError, UnsupportedContentError
from ckpt_migrate.format.dtypes import itemsize
from ckpt_migrate.format.tree import FullTensorLeaf, Node, TensorLeaf, iter_leaves, leaf_objects

MAX_SPEC_NODES = 1_000_000
MAX_DEPTH = 494  # (what cstorch 2.10's load reads back; module doc)
# Python frames enough for every recursive walk of a tree ``MAX_DEPTH`` deep (a few a level)
RECURSION_LIMIT = 8 * MAX_DEPTH + 1000
MAX_EXPANSION = 1100
DATASET_SLACK = 64 * 1024
TOTAL_SLACK = 256 * 1024 * 1024
CHUNK_SLACK = 32 * 1024 * 1024
# (h5repack without the LZ4 plugin drops every LZ4 dataset, with a warning only)
H5REPACK = (
    "HDF5_PLUGIN_PATH=$(python -c 'import hdf5plugin; print(hdf5plugin.PLUGIN_PATH)') h5repack"
)
_REPACK = f"{H5REPACK} -l CONTI FILE NEW.mdl"
CHUNK_FIX = f"write it again in chunks no larger than the tensor: {_REPACK}"
UNSTORED_FIX = f"write it again with every value stored ({_REPACK}), or use another copy"

FIX = "the file is damaged or was not written by a checkpoint writer"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def allow_depth() -> None:
    """Let Python recurse as deep as a tree of ``MAX_DEPTH`` levels needs (module doc)."""
    if sys.getrecursionlimit() < RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)


allow_depth()


def short(where: str) -> str:
    """A place in the tree as an error names it: at most 60 characters of it."""
    return where if len(where) <= 60 else where[:60] + "…"


def too_deep(path: str | Path | None, where: str) -> UnsupportedContentError:
    """A tree nested past ``MAX_DEPTH``: deeper than the real library reads back, so not
    called damaged (a writer under a raised recursion limit can make one)."""
    return UnsupportedContentError(
        path,
        f"the state tree is nested more than {MAX_DEPTH} containers deep at {where}, deeper "
        "than cerebras.pytorch 2.10 itself reads back, so ckpt-migrate does not read it",
        f"re-save the state with at most {MAX_DEPTH} levels of nesting",
    )


def too_many_nodes(path: str | Path | None) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        path, f"the state tree expands to more than {MAX_SPEC_NODES:,} nodes", FIX
    )


def dataset_problem(declared: int, stored: int) -> str | None:
    """Why a dataset declaring ``declared`` bytes with ``stored`` bytes on disk is refused."""
    if declared <= stored * MAX_EXPANSION + DATASET_SLACK:
        return None
    return (
        f"declares {human_bytes(declared)} but stores {human_bytes(stored)}, more than "
        f"{MAX_EXPANSION}:1, which no compression reaches"
    )


def check_declared(root: Node, path: str | Path, file_size: int) -> None:
    """Refuse a tree with a negative dimension, or whose tensors (stored and constant, each
    object once) together declare more than the file could hold."""
    declared = 0
    seen: set[int] = set()
    for leaf in leaf_objects(root):  # (named only if refused: 0.24 -> 0.08 s at 188k leaves)
        kind = type(leaf)
        if kind is not TensorLeaf and kind is not FullTensorLeaf:
            continue
        at = id(leaf)
        if at in seen:
            continue
        seen.add(at)
        shape = leaf.shape
        if shape and min(shape) < 0:
            name = next(ref.name for ref in iter_leaves(root) if ref.leaf is leaf)
            raise CorruptCheckpointError(
                path, f"tensor {name!r} has a negative dimension {list(shape)}", FIX
            )
        declared += math.prod(shape) * itemsize(leaf.dtype)
    if declared > file_size * MAX_EXPANSION + TOTAL_SLACK:
        raise CorruptCheckpointError(
            path,
            f"its tensors declare {human_bytes(declared)} in all, more than {MAX_EXPANSION} "
            f"times the file's {human_bytes(file_size)}",
            FIX,
        )


def chunk_grid_problem(
    shape: tuple[int, ...], chunks: tuple[int, ...], chunk_bytes: int
) -> str | None:
    """Why a dataset of ``shape`` in chunks of ``chunks`` (``chunk_bytes`` each) is refused:
    its chunk grid decodes to far more than it holds (module doc)."""
    if not shape or 0 in shape:
        return None
    grid = math.prod(-(-n // c) for n, c in zip(shape, chunks, strict=True)) * chunk_bytes
    held = math.prod(shape) * chunk_bytes // math.prod(chunks)
    if grid <= held * 2 ** len(shape) + CHUNK_SLACK:
        return None
    return (
        f"holds {human_bytes(held)} in chunks of {human_bytes(chunk_bytes)}, which every read "
        f"decodes whole ({human_bytes(grid)} in all)"
    )
