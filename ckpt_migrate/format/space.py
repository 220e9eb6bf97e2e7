"""What a written checkpoint occupies beyond its tensors' bytes: upper bounds, measured.

The metadata an output gains per leaf, in bytes: a part of its own and a part per character of
its name (the name is in its link, its attributes and the spec), by the way the output is made
and the target's format (0.5 writes a ``__metadata__`` document per leaf): a rewrite writes
every dataset anew (as a new checkpoint is written), a copy-patch moves the source's datasets
and rewrites their attributes, a root edit rewrites at most the spec and a few root
attributes. Upper bounds of outputs measured from 10 to 30,000 leaves, names of 5 to 70
characters (``benchmarks/bench_space.py``; ``tests/test_space_estimate.py`` holds them to 1.2x
+ 1 MiB).
"""

from __future__ import annotations

HEADROOM = 64 << 10  # for what no leaf accounts for: the superblock, the root, the spec's framing
NEW_METADATA = {  # strategy -> {target format 0.5: (per leaf, per name character)}
    "rewrite": {True: (3150, 9), False: (2080, 8)},
    "copy-patch": {True: (1300, 9), False: (200, 8)},
    "root-edit": {True: (160, 2), False: (160, 2)},
}


def new_checkpoint_bound(tensor_bytes: int, leaves: int, name_chars: int, format05: bool) -> int:
    """An upper bound of a checkpoint written anew: its tensors as they are, or compressed
    (LZ4's worst case adds 1/255 of a block, its filter 16 bytes a chunk: within 1/64), and
    a rewrite's metadata."""
    per_leaf, per_char = NEW_METADATA["rewrite"][format05]
    return tensor_bytes + tensor_bytes // 64 + per_leaf * leaves + per_char * name_chars + HEADROOM
