"""The fused attention layouts of the GPT-J backbone's Hugging Face models, each a named
operation that knows its inverse (:func:`~ckpt_migrate.hf.ops.fused_qkv`): CodeGen's Q, V, K
packed per model-parallel shard, GPT-NeoX's and BLOOM's Q, K, V fused per head, Falcon's per
KV group; and BLOOM's ALiBi slopes, which HF recomputes and CS stores.

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:
``salesforce_codegen_hf_cs.py``, ``gpt_neox_hf_cs.py``, ``bloom_hf_cs.py``, ``falcon_40b.py``
(cited per function). The tables that use them are in ``hf/layouts/gptj_like.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ckpt_migrate.hf.ops import deinterleave, fused_qkv, interleave, made_on_import

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

# --------------------------------------------------------------------------- GPT-NeoX


def _neox_unfuse(x: np.ndarray, which: str, dims: Mapping[str, Any]) -> np.ndarray:
    """gpt_neox_hf_cs.py lines 156-216, ``query_key_value`` viewed as [heads, 3, head_size,
    ...]; Q and K get their rotary rows interleaved (lines 79-104,
    :func:`~ckpt_migrate.hf.ops.interleave`), V not."""
    heads, rotary_dim = dims["heads"], dims["rotary_dim"]
    t = x.reshape(heads, 3, -1, *x.shape[1:])[:, "qkv".index(which)]
    if which != "v":
        t = interleave(t, rotary_dim)
    return np.ascontiguousarray(t.reshape(-1, *x.shape[1:]))


def _neox_fuse(q: np.ndarray, k: np.ndarray, v: np.ndarray, dims: Mapping[str, Any]) -> np.ndarray:
    """gpt_neox_hf_cs.py lines 218-303, the inverse of :func:`_neox_unfuse` (lines 106-136,
    :func:`~ckpt_migrate.hf.ops.deinterleave`)."""
    heads, rotary_dim = dims["heads"], dims["rotary_dim"]
    rest = q.shape[1:]
    parts = [t.reshape(heads, -1, *rest) for t in (q, k, v)]
    parts[0] = deinterleave(parts[0], rotary_dim)
    parts[1] = deinterleave(parts[1], rotary_dim)
    return np.concatenate(parts, axis=1).reshape(-1, *rest)


NEOX_QKV = fused_qkv(
    _neox_unfuse,
    _neox_fuse,
    (
        "of the per-head fused query_key_value",
        "Q, K, V fused per head, rotary rows de-interleaved",
    ),
)

# --------------------------------------------------------------------------- Falcon


def _falcon_unfuse(x: np.ndarray, which: str, dims: Mapping[str, Any]) -> np.ndarray:
    """falcon_40b.py lines 128-201, ``query_key_value`` viewed as [groups, group size + 2,
    head_dim, ...]: the group's query heads, then its key, then its value; Q and K get their
    rotary rows interleaved (lines 71-95, :func:`~ckpt_migrate.hf.ops.interleave`)."""
    groups, head_dim = dims["groups"], dims["head_dim"]
    rest = x.shape[1:]
    t = x.reshape(groups, -1, head_dim, *rest)
    size = t.shape[1] - 2
    part = {"q": t[:, :size], "k": t[:, size : size + 1], "v": t[:, size + 1 :]}[which]
    part = part.reshape(-1, head_dim, *rest)
    if which != "v":
        part = interleave(part, head_dim)
    return np.ascontiguousarray(part.reshape(-1, *rest))


def _falcon_fuse(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, dims: Mapping[str, Any]
) -> np.ndarray:
    """falcon_40b.py lines 203-283, the inverse of :func:`_falcon_unfuse` (lines 97-126,
    :func:`~ckpt_migrate.hf.ops.deinterleave`)."""
    groups, head_dim = dims["groups"], dims["head_dim"]
    rest = q.shape[1:]
    q = deinterleave(q.reshape(-1, head_dim, *rest), head_dim)
    k = deinterleave(k.reshape(-1, head_dim, *rest), head_dim)
    parts = [t.reshape(groups, -1, head_dim, *rest) for t in (q, k, v)]
    return np.concatenate(parts, axis=1).reshape(-1, *rest)


FALCON_QKV = fused_qkv(
    _falcon_unfuse,
    _falcon_fuse,
    (
        "of the grouped fused query_key_value",
        "Q, K, V fused per KV group, rotary rows de-interleaved",
    ),
    lambda _, which, dims: dims["rows"][which],
)

# --------------------------------------------------------------------------- BLOOM


def _bloom_unfuse(x: np.ndarray, which: str, dims: Mapping[str, Any]) -> np.ndarray:
    """bloom_hf_cs.py lines 95-127, ``query_key_value`` viewed as [heads, 3, head_dim, ...];
    Q, K, V are 0, 1, 2."""
    heads = dims["heads"]
    part = x.reshape(heads, 3, -1, *x.shape[1:])[:, "qkv".index(which)]
    return np.ascontiguousarray(part).reshape(-1, *x.shape[1:])


def _bloom_fuse(q: np.ndarray, k: np.ndarray, v: np.ndarray, dims: Mapping[str, Any]) -> np.ndarray:
    """bloom_hf_cs.py lines 129-168, the inverse of :func:`_bloom_unfuse`."""
    heads = dims["heads"]
    parts = [t.reshape(heads, 1, -1, *t.shape[1:]) for t in (q, k, v)]
    return np.concatenate(parts, axis=1).reshape(-1, *q.shape[1:])


BLOOM_QKV = fused_qkv(
    _bloom_unfuse,
    _bloom_fuse,
    ("of the per-head fused query_key_value", "Q, K, V fused per head"),
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
