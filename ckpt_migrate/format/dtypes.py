"""Tensor dtypes: torch name, the numpy dtype stored on disk, and the RtFx code of format 0.5.

bfloat16 has no numpy dtype; every format stores its raw 16-bit pattern as int16
(FORMAT.md §3.3, §4.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # torch name without the "torch." prefix
    storage: np.dtype  # dtype of the HDF5 dataset
    rtfx: int | None  # RtFx proto code written by 0.5 (None: the real writer refuses it)
    since: str | None = None  # the first release whose torch has it (None: every release's)


_TABLE = [
    DType("float32", np.dtype("<f4"), 11),
    DType("float64", np.dtype("<f8"), 12),
    DType("float16", np.dtype("<f2"), 10),
    DType("bfloat16", np.dtype("<i2"), 15),
    DType("int64", np.dtype("<i8"), 5),
    DType("int32", np.dtype("<i4"), 4),
    DType("int16", np.dtype("<i2"), 3),
    DType("int8", np.dtype("i1"), None),
    DType("uint8", np.dtype("u1"), 6),
    # torch has these from 2.3, and release 2.3 is the first to run on it: Model Zoo's
    # requirements.txt pins torch 2.0.1 / 2.1.1 / 2.2.1 / 2.3.0 at Release_2.0.3 / 2.1.1 /
    # 2.2.1 / 2.3.1; an older release could not build such a tensor from the stored array.
    DType("uint16", np.dtype("<u2"), 7, since="2.3"),
    DType("uint32", np.dtype("<u4"), 8, since="2.3"),
    DType("uint64", np.dtype("<u8"), 9, since="2.3"),
    DType("bool", np.dtype("bool"), 1),
]
BY_NAME = {d.name: d for d in _TABLE}
_ITEMSIZES = {d.name: d.storage.itemsize for d in _TABLE}


def by_name(name: str) -> DType:
    """Look up ``"float32"`` or ``"torch.float32"``."""
    key = name.removeprefix("torch.")
    try:
        return BY_NAME[key]
    except KeyError:
        raise ValueError(f"unsupported tensor dtype {name!r}") from None


def itemsize(name: str) -> int:
    """``by_name(name).storage.itemsize``, one look-up: asked once per tensor (150k of them)."""
    size = _ITEMSIZES.get(name)
    return by_name(name).storage.itemsize if size is None else size


def from_storage(np_dtype: np.dtype, is_bfloat16: bool = False) -> DType:
    """The dtype of a dataset holding ``np_dtype`` (int16 + is_bfloat16 means bf16)."""
    np_dtype = np.dtype(np_dtype)
    if is_bfloat16:
        if np_dtype.itemsize != 2:
            raise ValueError(f"is_bfloat16 set on a {np_dtype} dataset")
        return BY_NAME["bfloat16"]
    if np_dtype.kind == "b":
        return BY_NAME["bool"]
    for d in _TABLE:
        if d.name != "bfloat16" and d.storage == np_dtype.newbyteorder("<"):
            return d
    raise ValueError(f"unsupported dataset dtype {np_dtype}")
