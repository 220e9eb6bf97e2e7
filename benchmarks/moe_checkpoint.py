"""Synthetic mixture-of-experts training checkpoints: many tensors, for the tensor-count sweep.

``layers`` x ``experts`` x 3 expert weights (``w1``, ``w2``, ``w3``) of ``rows`` x ``cols``
float32, each with Adam's ``exp_avg`` and ``exp_avg_sq`` and a 0-d ``step``: four tensors per
parameter, as in a Model Zoo ``decoder-only-with-moe`` checkpoint (issue 33 measured 16 x 64 x 3
= 3,072 parameters, 12,288 tensors). Releases 2.1+ get the Trainer's ``__metadata__`` list.
Data is made on read (seeded), one tensor in memory at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

WEIGHTS = ("w1", "w2", "w3")
TENSORS_PER_PARAM = 4  # the parameter, exp_avg, exp_avg_sq, step


@dataclass(frozen=True)
class MoEShape:
    layers: int
    experts: int
    rows: int
    cols: int

    @classmethod
    def for_tensors(cls, tensors: int, rows: int, cols: int) -> MoEShape:
        """About ``tensors`` tensors in 16 layers (fewer for small counts)."""
        params = max(3, tensors // TENSORS_PER_PARAM)
        layers = min(16, max(1, params // 48))
        experts = max(1, math.ceil(params / (layers * len(WEIGHTS))))
        return cls(layers, experts, rows, cols)

    @property
    def tensors(self) -> int:
        return self.layers * self.experts * len(WEIGHTS) * TENSORS_PER_PARAM


def moe_tree(shape: MoEShape, release: str, global_step: int = 1000) -> Any:
    """The neutral tree of a training checkpoint of ``release`` (data generated on read)."""
    from ckpt_migrate.format.tree import (
        DataSource,
        DictNode,
        MemoryData,
        SeqNode,
        TensorLeaf,
        ValueLeaf,
    )

    @dataclass(eq=False)
    class Seeded(DataSource):
        seed: int
        shape: tuple[int, ...]

        def read(self) -> np.ndarray:
            return np.random.default_rng(self.seed).standard_normal(self.shape, np.float32)

        def describe(self) -> str:
            return f"seeded({self.seed})"

    dims = (shape.rows, shape.cols)
    model: list[tuple[str, Any]] = []
    state: list[tuple[Any, Any]] = []
    seed = 0
    for layer in range(shape.layers):
        for expert in range(shape.experts):
            for w in WEIGHTS:
                name = f"model.layers.{layer}.moe.experts.{expert}.{w}.weight"
                model.append((name, TensorLeaf("float32", dims, Seeded(seed, dims))))
                moments = [
                    (m, TensorLeaf("float32", dims, Seeded(seed + k + 1, dims)))
                    for k, m in enumerate(("exp_avg", "exp_avg_sq"))
                ]
                step = TensorLeaf("float32", (), MemoryData(np.array(global_step, np.float32)))
                state.append((len(state), DictNode([("step", step), *moments])))
                seed += 3
    groups = SeqNode(
        "list",
        [
            DictNode(
                [
                    ("lr", ValueLeaf(1e-4)),
                    ("betas", SeqNode("tuple", [ValueLeaf(0.9), ValueLeaf(0.95)])),
                    ("eps", ValueLeaf(1e-8)),
                    ("weight_decay", ValueLeaf(0.1)),
                    ("params", SeqNode("list", [ValueLeaf(i) for i in range(len(state))])),
                ]
            )
        ],
    )
    optimizer = DictNode([("state", DictNode(state)), ("param_groups", groups)])
    items: list[tuple[str, Any]] = [
        ("model", DictNode(model)),
        ("optimizer", optimizer),
        ("global_step", ValueLeaf(global_step)),
    ]
    if release not in ("1.7", "1.8", "1.9", "2.0"):
        params = DictNode([("model", DictNode([("num_experts", ValueLeaf(shape.experts))]))])
        version, name = ValueLeaf(f"{release}.0"), ValueLeaf("moe")
        entry = DictNode([("version", version), ("model_name", name), ("params", params)])
        items.append(("__metadata__", SeqNode("list", [entry])))
    return DictNode(items)


def generate(path: Path, shape: MoEShape, release: str) -> dict[str, Any]:
    """Write the checkpoint of ``shape`` as ``release`` writes it (past 65,535 leaves in format
    0.5 the root does not track attribute creation order: ``h5root.tracks_order``)."""
    from ckpt_migrate.format.tree import iter_leaves
    from ckpt_migrate.format.write import write_checkpoint

    tree = moe_tree(shape, release)
    leaves = sum(1 for _ in iter_leaves(tree))
    write_checkpoint(tree, path, release)
    return {"tensors": shape.tensors, "leaves": leaves, "file_bytes": path.stat().st_size}
