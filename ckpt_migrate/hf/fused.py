"""The fused attention layouts of the GPT-J backbone's Hugging Face models, each a named
operation that knows its inverse (:func:`~ckpt_migrate.hf.ops.fused_qkv`): CodeGen's Q, V, K
packed per model-parallel shard; GPT-NeoX's and BLOOM's Q, K, V fused per head and Falcon's per
KV group, one operation (:func:`per_group`); and BLOOM's ALiBi slopes, which HF recomputes and
CS stores.

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:
``salesforce_codegen_hf_cs.py``, ``gpt_neox_hf_cs.py``, ``bloom_hf_cs.py``, ``falcon_40b.py``
(cited per declaration). The tables that use them are in ``hf/layouts/gptj_like.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ckpt_migrate.hf.ops import Op, Rows, deinterleave, fused_qkv, interleave, made_on_import

# --------------------------------------------------------------------------- CodeGen

MP_NUM = 4  # HF CodeGen hard-codes 4 shards (salesforce_codegen_hf_cs.py line 40)
QKV_ORDER = {"q": 0, "v": 1, "k": 2}  # within a shard (lines 132-142)


def _codegen_unpack(x: np.ndarray, which: str, _dims: Mapping[str, Any]) -> np.ndarray:
    """salesforce_codegen_hf_cs.py lines 132-145, ``qkv_proj`` [3E, E] viewed as [4, 3E/4, E];
    each shard's rows are its Q, V, K slices of E/4 rows."""
    dim = x.shape[-1]
    local = dim // MP_NUM
    start = QKV_ORDER[which] * local
    return np.ascontiguousarray(
        x.reshape(MP_NUM, -1, dim)[:, start : start + local].reshape(-1, dim)
    )


def _codegen_pack(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, _dims: Mapping[str, Any]
) -> np.ndarray:
    """salesforce_codegen_hf_cs.py lines 171-190, the inverse of :func:`_codegen_unpack`."""
    dim = q.shape[-1]
    parts = [t.reshape(MP_NUM, -1, dim) for t in (q, v, k)]
    return np.concatenate(parts, axis=1).reshape(-1, dim)


CODEGEN_QKV = fused_qkv(
    _codegen_unpack,
    _codegen_pack,
    ("of the mp_num=4 packed qkv_proj", "Q, V, K packed per mp_num=4 shard"),
)

# ------------------------------------------------------------- GPT-NeoX, BLOOM and Falcon


def per_group(
    groups: str, rotary: str | None, notes: tuple[str, str], rows: Rows | None = None
) -> Op:
    """Q, K, V fused per group (``ctx.dims[groups]`` groups): each group's query heads, then its
    key head, then its value head, ``dims["head_dim"]`` rows a head (default: a third of a
    group, one query head). With ``rotary``, the first ``dims[rotary]`` rows of each Q and K
    head are de-interleaved into HF's halves (:func:`~ckpt_migrate.hf.ops.deinterleave`)."""

    def unfuse(x: np.ndarray, which: str, dims: Mapping[str, Any]) -> np.ndarray:
        rest = x.shape[1:]
        t = x.reshape(dims[groups], -1, *rest)
        size = dims.get("head_dim", t.shape[1] // 3)
        start = {"q": 0, "k": t.shape[1] - 2 * size, "v": t.shape[1] - size}[which]
        part = t[:, start : t.shape[1] - 2 * size if which == "q" else start + size]
        part = part.reshape(-1, size, *rest)
        if rotary is not None and which != "v":
            part = interleave(part, dims[rotary])
        return np.ascontiguousarray(part.reshape(-1, *rest))

    def fuse(q: np.ndarray, k: np.ndarray, v: np.ndarray, dims: Mapping[str, Any]) -> np.ndarray:
        rest, count = q.shape[1:], dims[groups]
        if rotary is not None:
            size = dims.get("head_dim", q.shape[0] // count)
            q, k = (deinterleave(t.reshape(-1, size, *rest), dims[rotary]) for t in (q, k))
        parts = [t.reshape(count, -1, *rest) for t in (q, k, v)]
        return np.concatenate(parts, axis=1).reshape(-1, *rest)

    return fused_qkv(unfuse, fuse, notes, rows)


# GPT-NeoX: per head, rotary rows (gpt_neox_hf_cs.py lines 79-136, 156-303).
NEOX_QKV = per_group(
    "heads",
    "rotary_dim",
    (
        "of the per-head fused query_key_value",
        "Q, K, V fused per head, rotary rows de-interleaved",
    ),
)
# Falcon: per KV group, whole heads rotate (falcon_40b.py lines 71-126, 128-283).
FALCON_QKV = per_group(
    "groups",
    "head_dim",
    (
        "of the grouped fused query_key_value",
        "Q, K, V fused per KV group, rotary rows de-interleaved",
    ),
    lambda _, which, dims: dims["rows"][which],
)
# BLOOM: per head, no rotary (bloom_hf_cs.py lines 95-168).
BLOOM_QKV = per_group(
    "heads", None, ("of the per-head fused query_key_value", "Q, K, V fused per head")
)


def alibi_slopes(heads: int) -> list[float]:
    """bloom_hf_cs.py lines 309-329, the ALiBi paper's slopes; for a head count that is not a
    power of two, the closest power's slopes then every other one of twice that."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(heads).is_integer():
        return power_of_2(heads)
    closest = 2 ** math.floor(math.log2(heads))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: heads - closest]


def _slopes(dims: Mapping[str, Any]) -> np.ndarray:
    """The ALiBi slopes as the CS model stores them: float32 [heads, 1] (bloom_hf_cs.py lines
    387-391)."""
    heads = dims["heads"]
    return np.asarray(alibi_slopes(heads), dtype=np.float32).reshape(heads, 1)


ALIBI_SLOPES = made_on_import(_slopes, "ALiBi slopes")
