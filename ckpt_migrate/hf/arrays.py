"""Building a plan's outputs one at a time: each output's dtype from its inputs, casts between
float dtypes (bf16 stored as int16), and the fused input kept across the outputs cut from it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ckpt_migrate.errors import UsageError
from ckpt_migrate.hf.mapping import MappingError, Shape

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def check_dtype(dtype: str | None) -> None:
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise UsageError(None, f"--dtype {dtype!r} is not one of {', '.join(FLOAT_DTYPES)}")


def cast(array: np.ndarray, src: str, dst: str | None) -> np.ndarray:
    """``array`` (in ``src``'s storage dtype; bf16 as int16) as ``dst``'s storage dtype.
    bf16 <- float32 rounds to nearest even, as torch does; ints and bools are never cast."""
    if dst is None or dst == src or src not in FLOAT_DTYPES:
        return array
    value = bf16_to_f32(array) if src == "bfloat16" else array.astype(np.float32)
    if dst == "bfloat16":
        return f32_to_bf16(value)
    return value.astype(np.float16 if dst == "float16" else np.float32)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 stored as its 16-bit pattern, as float32."""
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(value: np.ndarray, like: Any = np.int16) -> np.ndarray:
    """float32 as bf16's 16-bit pattern (viewed as ``like``), rounded to nearest even as torch
    rounds (NaN stays NaN)."""
    bits = value.view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))
    rounded = np.where(np.isnan(value), bits | np.uint32(0x400000), rounded)
    return (rounded >> 16).astype(np.uint16).view(like)


def out_dtype(inputs: tuple[str, ...], dtypes: Mapping[str, str], default: str) -> str:
    """The dtype of an output: its inputs' (they must agree), ``default`` if it has none."""
    seen = {dtypes[i] for i in inputs}
    if len(seen) > 1:
        raise MappingError(f"inputs {', '.join(inputs)} have different dtypes {sorted(seen)}")
    return seen.pop() if seen else default


class LastRead:
    """``read`` keeping the last input read: the outputs a plan cuts from one fused tensor (Q,
    K and V of a ``c_attn``, the experts of a fused MoE weight) come one after another, so the
    fused tensor is read once. The kept array is read-only and dropped before another is read:
    at most one input more than the output being built is held."""

    def __init__(self, read: Callable[[str], np.ndarray]) -> None:
        self._read = read
        self._name: str | None = None
        self._array: np.ndarray | None = None

    def __call__(self, name: str) -> np.ndarray:
        if name != self._name or self._array is None:
            self._name, self._array = None, None
            array = self._read(name)
            array.flags.writeable = False
            self._name, self._array = name, array
        return self._array


def shapes_of(plan: list[Any], shapes: Mapping[str, Shape]) -> dict[str, Shape]:
    """Each output's shape, one tuple for all outputs of one shape: a tuple each for 112k
    outputs, kept until the export is read back, was 5.5 MB (issue 33)."""
    out, seen = {}, {}
    for o in plan:
        shape = tuple(int(d) for d in o.out_shape(shapes))
        out[o.name] = seen.setdefault(shape, shape)
    return out
