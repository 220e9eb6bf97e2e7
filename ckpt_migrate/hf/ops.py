"""The operations of the Hugging Face tensor tables: each maps some CS tensors to some HF
tensors and knows its inverse, as the ``migrations/`` hops' ``KeyRename`` does (and as
transformers' ``conversion_mapping.py`` declares ``WeightRenaming``/``WeightConverter``).

An :class:`Op` is two plan builders: ``forward(cs_names, hf_names, ctx)`` gives the
:class:`~ckpt_migrate.hf.mapping.Out` of each HF name (export), ``backward(hf_names, cs_names,
ctx)`` those of the CS names (import); :meth:`Op.inverse` swaps them. The table interpreter
(``hf/table.py``) names the tensors; an operation only builds them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckpt_migrate.hf.arrays import bf16_to_f32, f32_to_bf16
from ckpt_migrate.hf.mapping import (
    MappingError,
    Out,
    Shape,
    rename,
    same_shape,
    sections,
    transpose,
)


@dataclass(frozen=True)
class Ctx:
    """What an operation may know beyond the names: the source side's tensors (name -> shape),
    the model's dimensions and flags the family reads from its config."""

    available: Mapping[str, Shape]
    layers: int = 0
    prefix: str = ""
    flags: frozenset[str] = frozenset()
    dims: Mapping[str, Any] = field(default_factory=dict)
    # for a table that checks its plan: source tensors left out on purpose (a full-match
    # pattern) and those that are copies of one the plan reads (copy -> original)
    dropped: str | None = None
    ties: Mapping[str, str] = field(default_factory=dict)
    cs_prefix: str = ""  # ``{c}`` in a CS pattern (BERT's ``bert_encoder.`` or ``bert.``)

    def has(self, flag: str) -> bool:
        """``flag``, or ``"!flag"`` for its absence."""
        return flag[1:] not in self.flags if flag.startswith("!") else flag in self.flags


Builder = Callable[[Sequence[str], Sequence[str], Ctx], list[Out]]
Split = Callable[[np.ndarray, str, Mapping[str, Any]], np.ndarray]
Join = Callable[[np.ndarray, np.ndarray, np.ndarray, Mapping[str, Any]], np.ndarray]
Rows = Callable[[int, str, Mapping[str, Any]], int]


@dataclass(frozen=True)
class Op:
    """An operation: ``forward`` builds HF outputs from CS inputs, ``backward`` the reverse."""

    name: str
    forward: Builder
    backward: Builder

    def inverse(self) -> Op:
        return Op(f"inverse of {self.name}", self.backward, self.forward)


def _each(make: Callable[[str, str], Out]) -> Builder:
    """One output per (source, target) pair of names."""

    def build(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
        return [make(s, d) for s, d in zip(srcs, dsts, strict=True)]

    return build


def nothing(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    return []


RENAME = Op("rename", _each(rename), _each(rename))
# HF ``Conv1D`` stores ``[in, out]``, torch ``Linear`` ``[out, in]`` (GPT-2's
# ``transpose_key_if_2D``, gpt2_hf_cs.py); a 1-D bias is renamed.
CONV1D = Op("Conv1D transpose", _each(transpose), _each(transpose))


def _rename_existing(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """Each source renamed, read from its copy (``ctx.dims["copies"]``) when only the copy
    exists (Model Zoo's ``pre_model_convert``: a tied model's embeddings from the head; the
    final norm from its second name ``ln_f``)."""
    copies = ctx.dims.get("copies", {})

    def existing(name: str) -> str:
        copy = copies.get(name)
        return copy if name not in ctx.available and copy in ctx.available else name

    return [rename(existing(s), d) for s, d in zip(srcs, dsts, strict=True)]


# A rename whose CS side may be read from a copy of it (the GPT-J backbone's rules).
RENAME_EXISTING = Op("rename (of the copy that exists)", _rename_existing, _each(rename))
# A second CS name of one tensor (GPT-2's ``ln_f`` beside ``transformer_decoder.norm``): written
# on import, a tie on export (``hf/unconverted.py`` checks it equals the first).
SECOND_NAME = Op("second CS name", nothing, _each(rename))


def second_name(op: Op) -> Op:
    """A second CS name of one tensor built by ``op`` on import (Gemma 2's ``ln_f``, shifted
    like ``transformer_decoder.norm``); nothing on export (a tie)."""
    return Op(f"second CS name by {op.name}", nothing, op.backward)


# ---- rotary -----------------------------------------------------------------------------------


def interleave(t: np.ndarray, rotary_dim: int) -> np.ndarray:
    """HF rotates a head's first ``rotary_dim`` rows as two halves, CS as adjacent pairs: per
    head ``[x0..x(n-1), y0..y(n-1)]`` becomes ``[x0, y0, x1, y1, ...]``; ``t`` is [heads,
    head_size, ...]. Model Zoo: gpt_neox_hf_cs.py lines 79-104, falcon_40b.py lines 71-95
    (``rotary_dim`` rows), llama.py lines 157-185 (the whole head)."""
    heads, rest = t.shape[0], t.shape[2:]
    rot = t[:, :rotary_dim].reshape(heads, 2, rotary_dim // 2, *rest).swapaxes(1, 2)
    return _with_rest(rot.reshape(heads, rotary_dim, *rest), t, rotary_dim)


def deinterleave(t: np.ndarray, rotary_dim: int) -> np.ndarray:
    """The inverse of :func:`interleave` (gpt_neox_hf_cs.py lines 106-136, falcon_40b.py 97-126,
    llama.py lines 266-294)."""
    heads, rest = t.shape[0], t.shape[2:]
    rot = t[:, :rotary_dim].reshape(heads, rotary_dim // 2, 2, *rest).swapaxes(1, 2)
    return _with_rest(rot.reshape(heads, rotary_dim, *rest), t, rotary_dim)


def _with_rest(rotated: np.ndarray, t: np.ndarray, rotary_dim: int) -> np.ndarray:
    """The rotated rows and the rest of each head; whole heads rotated: no second copy (the
    export holds one output beside its input, as before the two interleaves were one)."""
    if rotary_dim == t.shape[1]:
        return rotated
    return np.concatenate([rotated, t[:, rotary_dim:]], axis=1)


def interleave_rotary(x: np.ndarray, heads: int) -> np.ndarray:
    """HF -> CS for the Q/K rows of ``heads`` whole heads (:func:`interleave`; Model Zoo
    llama.py ``interleave_helper``, rotary_dim = head size)."""
    t = x.reshape(heads, x.shape[0] // heads, *x.shape[1:])
    return np.ascontiguousarray(interleave(t, t.shape[1]).reshape(x.shape))


def deinterleave_rotary(x: np.ndarray, heads: int) -> np.ndarray:
    """CS -> HF, the inverse of :func:`interleave_rotary` (``reverse_interleave_helper``)."""
    t = x.reshape(heads, x.shape[0] // heads, *x.shape[1:])
    return np.ascontiguousarray(deinterleave(t, t.shape[1]).reshape(x.shape))


def rotary(heads: str) -> Op:
    """Q or K rows (or bias) of ``ctx.dims[heads]`` heads: the CS rotary pairs de-interleaved
    into HF's halves on export, interleaved on import (whole heads rotate: LLaMA, Mistral,
    Mixtral, Gemma 2)."""

    def permute(fn: Callable[[np.ndarray, int], np.ndarray]) -> Builder:
        def build(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
            n = int(ctx.dims[heads])
            note = f"rotary, {n} heads"
            make = lambda x: fn(x, n)  # noqa: E731
            return [Out(d, (s,), make, infer=same_shape, note=note) for s, d in zip(srcs, dsts)]

        return build

    return Op(f"rotary ({heads})", permute(deinterleave_rotary), permute(interleave_rotary))


# ---- Gemma 2's norm offset --------------------------------------------------------------------


def shift(x: np.ndarray, delta: float) -> np.ndarray:
    """``x + delta`` in ``x``'s dtype as torch's ``weight + torch.ones_like(weight)`` computes it
    (Model Zoo gemma2.py lines 172-181): float16/32 with numpy's correctly rounded add, bf16
    (stored as its 16-bit pattern) added in float32 and rounded to nearest even."""
    if x.dtype in (np.int16, np.uint16):
        return f32_to_bf16(bf16_to_f32(x) + np.float32(delta), x.dtype)
    if x.dtype.kind != "f":
        raise MappingError(f"a norm weight of dtype {x.dtype} cannot hold Gemma 2's offset")
    return (x + x.dtype.type(delta)).astype(x.dtype)


def _shifted(delta: float) -> Builder:
    def build(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
        make = lambda x: shift(x, delta)  # noqa: E731
        note = f"{delta:+g}"
        return [Out(d, (s,), make, infer=same_shape, note=note) for s, d in zip(srcs, dsts)]

    return build


# An RMS norm weight with HF's constant 1 folded out on export, in on import (Model Zoo
# gemma2.py lines 163-190).
NORM_OFFSET = Op("Gemma 2 norm offset", _shifted(-1.0), _shifted(1.0))


# ---- fused attention --------------------------------------------------------------------------


def _conv1d_split(src: str, dst: str, index: int, pieces: int) -> Out:
    """Piece ``index`` of a fused Conv1D ``[in, pieces * out]`` as a Linear ``[out, in]``
    (``torch.chunk(transpose(w), pieces)``, gpt2_hf_cs.py lines 122-149); a bias is chunked."""
    build, infer, note = _conv1d_piece(index, pieces)
    return Out(dst, (src,), build, infer=infer, note=note)


@functools.cache
def _conv1d_piece(index: int, pieces: int) -> tuple[Callable, Callable, str]:
    """The build, shape and note of one piece, shared by every layer's (two closures and a
    note each were a third of an import's plan, about 50 MB at 150k tensors, issue 33)."""

    def build(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.split(x.T if x.ndim == 2 else x, pieces, axis=0)[index])

    def infer(s: Shape) -> Shape:
        return (s[1] // pieces, s[0]) if len(s) == 2 else (s[0] // pieces,)

    return build, infer, f"Conv1D piece {index + 1} of {pieces}"


def _conv1d_join(srcs: Sequence[str], dst: str) -> Out:
    """Linear pieces concatenated then transposed to Conv1D (gpt2_hf_cs.py lines 175-188)."""

    def build(*xs: np.ndarray) -> np.ndarray:
        joined = np.concatenate(xs, axis=0)
        return np.ascontiguousarray(joined.T) if joined.ndim == 2 else joined

    def infer(*shapes: Shape) -> Shape:
        rows = sum(s[0] for s in shapes)
        return (shapes[0][1], rows) if len(shapes[0]) == 2 else (rows,)

    return Out(dst, tuple(srcs), build, infer=infer, note="fused to Conv1D")


def _one_target(build: Callable[[Sequence[str], str], Out]) -> Builder:
    return lambda srcs, dsts, ctx: [build(srcs, dsts[0])]


def _one_source(build: Callable[[str, str, int, int], Out]) -> Builder:
    return lambda srcs, dsts, ctx: [build(srcs[0], d, j, len(dsts)) for j, d in enumerate(dsts)]


# Q, K, V (or K, V) of a Linear concatenated and transposed into one Conv1D (GPT-2's ``c_attn``).
FUSED_CONV1D = Op("fused Conv1D", _one_target(_conv1d_join), _one_source(_conv1d_split))
# Pieces stacked along dim 0 (a Linear ``[out, in]`` weight or a bias; StarCoder's MQA
# ``c_attn``), split back at the rows the family's dims name (``ctx.dims["rows"]``, cumulative).
FUSED_ROWS = Op(
    "fused rows",
    _one_target(lambda srcs, dst: _rows(srcs, dst)),
    lambda srcs, dsts, ctx: [
        sections(srcs[0], d, a, b)
        for d, a, b in zip(dsts, ctx.dims["rows"], ctx.dims["rows"][1:], strict=False)
    ],
)


def _rows(srcs: Sequence[str], dst: str) -> Out:
    def infer(*shapes: Shape) -> Shape:
        return (sum(s[0] for s in shapes), *shapes[0][1:])

    return Out(dst, tuple(srcs), lambda *xs: np.concatenate(xs, axis=0), infer=infer, note="fused")


def _pack_heads(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """Q, K, V interleaved per head ``[q_h, k_h, v_h]`` (StarCoder's MHA ``c_attn``,
    starcoder.py lines 170-235)."""
    heads, n = int(ctx.dims["heads"]), len(srcs)

    def build(*xs: np.ndarray) -> np.ndarray:
        rest = xs[0].shape[1:]
        per_head = [x.reshape(heads, x.shape[0] // heads, *rest) for x in xs]
        return np.stack(per_head, axis=1).reshape(n * xs[0].shape[0], *rest)

    infer = lambda s, *_: (n * s[0], *s[1:])  # noqa: E731
    return [Out(dsts[0], tuple(srcs), build, infer=infer, note="MHA packed")]


def _unpack_heads(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """The inverse of :func:`_pack_heads` (the index lists of starcoder.py lines 143-164)."""
    heads, n = int(ctx.dims["heads"]), len(dsts)

    def piece(index: int) -> Callable[[np.ndarray], np.ndarray]:
        def build(x: np.ndarray) -> np.ndarray:
            per_head = x.reshape(heads, n, x.shape[0] // (n * heads), *x.shape[1:])
            return np.ascontiguousarray(per_head[:, index].reshape(x.shape[0] // n, *x.shape[1:]))

        return build

    infer = lambda s: (s[0] // n, *s[1:])  # noqa: E731
    src = srcs[0]
    return [Out(d, (src,), piece(j), infer=infer, note="MHA unpacked") for j, d in enumerate(dsts)]


PER_HEAD = Op("fused per head", _pack_heads, _unpack_heads)


def fused_qkv(split: Split, join: Join, notes: tuple[str, str], rows: Rows | None = None) -> Op:
    """Q, K, V fused into one HF tensor by ``join(q, k, v, dims)``, split by ``split(x, which,
    dims)`` (``which``: "q", "k" or "v"; ``dims`` the context's) into ``rows(fused rows, which,
    dims)`` rows each (default a third); ``notes`` say what the split and the join do (the GPT-J
    backbone's ``qkv_plans``)."""
    rows = rows or (lambda n, _which, _dims: n // 3)

    def forward(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
        def build(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
            return join(q, k, v, ctx.dims)

        infer = lambda q, k, v: (q[0] + k[0] + v[0], *q[1:])  # noqa: E731
        return [Out(dsts[0], tuple(srcs), build, infer=infer, note=notes[1])]

    def backward(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
        def piece(which: str) -> Callable[[np.ndarray], np.ndarray]:
            return lambda x: split(x, which, ctx.dims)

        def infer(which: str) -> Callable[[Shape], Shape]:
            return lambda s: (rows(s[0], which, ctx.dims), *s[1:])

        return [
            Out(d, (srcs[0],), piece(w), infer=infer(w), note=f"{w.upper()} {notes[0]}")
            for w, d in zip("qkv", dsts, strict=True)
        ]

    return Op("fused Q, K, V", forward, backward)


# ---- generated buffers ------------------------------------------------------------------------


def _causal_mask(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """GPT-2's ``attn.bias`` (uint8 causal mask ``[1, 1, P, P]``) and ``attn.masked_bias``
    (-1e4) buffers, as Model Zoo's SantaCoder converter writes them (santacoder.py lines
    156-168); ``ctx.dims["positions"]`` is P."""
    positions = int(ctx.dims["positions"])

    def mask() -> np.ndarray:
        return np.tril(np.ones((positions, positions), np.uint8)).reshape(1, 1, positions, -1)

    bias, masked = dsts
    return [
        Out(bias, (), mask, shape=(1, 1, positions, positions), note="generated", dtype="uint8"),
        Out(masked, (), lambda: np.array(-1e4, np.float32), shape=(), dtype="float32"),
    ]


# HF buffers with no CS tensor: generated on export, left out on import.
CAUSAL_MASK = Op("generated causal mask", _causal_mask, nothing)


def made_on_import(make: Callable[[Mapping[str, Any]], np.ndarray], note: str) -> Op:
    """A CS tensor HF has no tensor for (HF recomputes it): left out on export (the pipeline's
    ``hf/unconverted.py`` names it), made from the context's dims on import (BLOOM's ALiBi
    slopes)."""

    def backward(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
        value = make(ctx.dims)
        return [Out(dsts[0], (), value.copy, shape=value.shape, note=note)]

    return Op(note, nothing, backward)
