"""The contract between the Hugging Face pipeline and the per-family rules.

A family's rules (``ckpt_migrate/hf/families.py``) map one model family both ways. They never
read a tensor: from the tensor names and shapes of one side and the model config they return a
*plan*, a list of :class:`Out`, each naming the input tensors one output tensor is built from
and a numpy function that builds it. The pipeline walks the plan one output at a time, reading
only that output's inputs, so peak memory stays near the largest tensor. A family builds its
plans from a declared tensor table (``hf/table.py``, the tables in ``hf/layouts/``, the
operations in ``hf/ops.py``; a composite from its parts', ``hf/compose.py``).

CS names are the model state's names *without* the ``model.`` prefix, as Cerebras releases 2.1
to 2.10 spell them (the key layout is the same across those releases: the 2.0 -> 2.1 renames
are the last model-key change for the decoder and encoder LMs, Model Zoo's ``*_HF_CS21``
converters serve ``cs-2.1`` … ``cs-2.9``). The CS config is the ``model:`` section as a plain
dict (legacy layout field names; the pipeline extracts it from a 2.3+ trainer layout too).
HF names are ``state_dict()`` names of the ``transformers`` model class named in
``config.json``'s ``architectures``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

Shape = tuple[int, ...]
Build = Callable[..., np.ndarray]
Infer = Callable[..., Shape]  # input shapes -> the output's shape, no data


def identity(x: np.ndarray) -> np.ndarray:
    return x


def same_shape(shape: Shape) -> Shape:
    """``Out.infer`` of an output shaped as its one input: one function for all (a lambda
    each was a function object, about 150 bytes, per output; issue 33's plans have 150k)."""
    return shape


@dataclass(frozen=True, slots=True)  # slots: 150k outputs at issue 33's scale
class Out:
    """One output tensor: ``build(*[read(i) for i in inputs])``.

    Its shape must be known before any data is read (safetensors writes the header first):
    ``shape`` when the plan knows it, else ``infer(*input_shapes)``. The constructors below set
    ``infer``; a custom ``build`` must give one of the two."""

    name: str
    inputs: tuple[str, ...]
    build: Build = identity
    shape: Shape | None = None
    infer: Infer | None = None
    note: str = field(default="", compare=False)  # what the step does, for --dry-run / reports
    dtype: str | None = None  # of an output built from no input (else its inputs')

    def out_shape(self, shapes: Mapping[str, Shape]) -> Shape:
        """The output's shape from the input shapes (no data read)."""
        if self.shape is not None:
            return tuple(self.shape)
        if self.infer is not None:
            return tuple(self.infer(*(tuple(shapes[i]) for i in self.inputs)))
        if self.build is identity and len(self.inputs) == 1:
            return tuple(shapes[self.inputs[0]])
        raise MappingError(f"{self.name}: the plan gives neither shape nor infer")


def rename(src: str, dst: str) -> Out:
    return Out(dst, (src,), identity, infer=same_shape, note="renamed")


def transpose(src: str, dst: str) -> Out:
    """A 2-D weight transposed (HF ``Conv1D`` stores ``[in, out]``, torch ``Linear`` ``[out,
    in]``); a 1-D bias is renamed."""
    return Out(dst, (src,), _transpose_2d, infer=_transposed_shape, note="transposed")


def _transposed_shape(s: Shape) -> Shape:
    return (s[1], s[0]) if len(s) == 2 else s


def _transpose_2d(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.T) if x.ndim == 2 else x


def chunk(src: str, dst: str, index: int, pieces: int, axis: int = 0) -> Out:
    """Piece ``index`` of ``pieces`` equal pieces of ``src`` along ``axis`` (unfusing)."""

    def build(x: np.ndarray) -> np.ndarray:
        if x.shape[axis] % pieces:
            raise ValueError(f"{src}: dimension {axis} ({x.shape[axis]}) not divisible by {pieces}")
        return np.ascontiguousarray(np.split(x, pieces, axis=axis)[index])

    def infer(s: Shape) -> Shape:
        out = list(s)
        out[axis] = s[axis] // pieces
        return tuple(out)

    return Out(dst, (src,), build, infer=infer, note=f"piece {index + 1} of {pieces}")


def sections(src: str, dst: str, start: int, stop: int, axis: int = 0) -> Out:
    """Rows (or columns) ``start:stop`` of ``src`` along ``axis`` (unequal pieces, e.g. GQA)."""

    def build(x: np.ndarray) -> np.ndarray:
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, stop)
        return np.ascontiguousarray(x[tuple(index)])

    def infer(s: Shape) -> Shape:
        out = list(s)
        out[axis] = len(range(*slice(start, stop).indices(s[axis])))
        return tuple(out)

    return Out(dst, (src,), build, infer=infer, note=f"rows {start}:{stop}")


class Family(Protocol):
    """What a family's rules provide (``hf/served.py``'s ``Rules`` and ``Composite``)."""

    NAMES: tuple[str, ...]  # Model Zoo model names it serves (``models/names.py`` spelling)
    HF_MODEL_TYPES: tuple[str, ...]  # ``config.json`` ``model_type`` values it imports

    def config_to_hf(self, cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
        """The ``config.json`` dict (with ``architectures`` and ``model_type``)."""

    def config_to_cs(self, hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
        """The CS ``model:`` section (legacy layout field names)."""

    def plan_to_hf(
        self, cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str
    ) -> list[Out]:
        """HF tensors from CS model tensors (names without ``model.``, with shapes)."""

    def plan_to_cs(
        self, hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str
    ) -> list[Out]:
        """CS model tensors (names without ``model.``) from HF tensors."""


class MappingError(ValueError):
    """A tensor or config field the family's rules cannot convert (the message names it)."""


def run(plan: Sequence[Out], read: Callable[[str], np.ndarray]):
    """Build each output of ``plan`` in order, yielding ``(name, array)``; ``read(name)`` gives an
    input tensor (the pipeline reads it from the file, tests from a dict). Holds one output's
    inputs at a time."""
    seen: set[str] = set()
    for out in plan:
        if out.name in seen:
            raise MappingError(f"the plan writes {out.name} twice")
        seen.add(out.name)
        yield out.name, build_one(out, read)


def build_one(out: Out, read: Callable[[str], np.ndarray]) -> np.ndarray:
    """One output of a plan, its shape checked against the one the plan gives. A plain call,
    not a generator: no suspended frame keeps the previous output alive while the next one is
    built."""
    inputs = [read(name) for name in out.inputs]
    expected = out.out_shape({n: tuple(x.shape) for n, x in zip(out.inputs, inputs)})
    value = out.build(*inputs)
    del inputs
    if tuple(value.shape) != expected:
        raise MappingError(f"{out.name}: built shape {value.shape}, expected {expected}")
    return value


def unused_inputs(plan: Sequence[Out], available: Mapping[str, Shape]) -> list[str]:
    """Tensors of the source side no output reads (a lossy conversion unless opted in).
    (Struck from a table made at its size: a set of the plan's inputs grew by doubling, 12
    MiB for a moment at 150k tensors, issue 33.)"""
    left = dict.fromkeys(available)
    for out in plan:
        for name in out.inputs:
            left.pop(name, None)
    return sorted(left)


def missing_inputs(plan: Sequence[Out], available: Mapping[str, Shape]) -> list[str]:
    """Inputs the plan names that the source side does not have."""
    return sorted({name for out in plan for name in out.inputs if name not in available})
