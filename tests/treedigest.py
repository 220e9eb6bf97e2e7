"""A canonical, torch-free description of a neutral tree, for comparing trees in tests.

Tensors are described by dtype, shape and the sha256 of their stored bytes; a tie names the
first position of its leaf, so two trees compare equal only if they tie the same places.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from ckpt_migrate.tree import (
    DictNode,
    ExternalLeaf,
    FullTensorLeaf,
    MissingLeaf,
    NamedTupleNode,
    Node,
    OpaqueLeaf,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
    first_positions,
)


def _value(v: Any) -> Any:
    if isinstance(v, float):
        return {"float": repr(v), "signbit": math.copysign(1.0, v) < 0}
    return {type(v).__name__: v}


def describe(
    root: Node,
    *,
    missing_as_none: bool = False,
    numpy_as_tensor: bool = False,
    namedtuple_as_tuple: bool = False,
) -> Any:
    firsts = first_positions(root)

    def leaf(n: Any, path: tuple) -> Any:
        first = firsts[id(n)]
        if first.path != path:
            return {"tied_to": first.name}
        if isinstance(n, TensorLeaf):
            data = np.ascontiguousarray(n.data.read())
            return {
                "tensor": n.dtype,
                "numpy": n.numpy and not numpy_as_tensor,
                "shape": list(n.shape),
                "sha256": hashlib.sha256(data.tobytes()).hexdigest(),
                "stored": str(data.dtype),
            }
        if isinstance(n, ValueLeaf):
            return _value(n.value)
        if isinstance(n, MissingLeaf):
            return _value(None) if missing_as_none else {"missing": n.name}
        if isinstance(n, FullTensorLeaf):
            return {"full": n.dtype, "shape": list(n.shape), "fill": _value(n.fill_value)}
        if isinstance(n, OpaqueLeaf):
            return {"opaque": hashlib.sha256(n.payload).hexdigest()}
        assert isinstance(n, ExternalLeaf)
        return {"external": n.kind}

    def walk(n: Node, path: tuple) -> Any:
        if isinstance(n, DictNode):
            return {
                "dict": n.ordered,
                "items": [[type(k).__name__, k, walk(v, (*path, k))] for k, v in n.items],
            }
        if isinstance(n, SeqNode):
            return {n.kind: [walk(v, (*path, i)) for i, v in enumerate(n.items)]}
        if isinstance(n, NamedTupleNode):
            kids = [walk(v, (*path, i)) for i, v in enumerate(n.items)]
            return {"tuple": kids} if namedtuple_as_tuple else {"namedtuple": n.name, "items": kids}
        return leaf(n, path)

    return walk(root, ())
