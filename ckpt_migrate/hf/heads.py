"""The language-model head as one table operation, :func:`lm_head`: renamed when untied, a tie
when the config shares it with the embeddings, newly initialised when a headless HF model has
none.

A head row's names are ``(embedding, head)`` on each side, ``(embedding, head, head bias)``
where the context's ``head bias`` flag may be set (the GPT-J backbone). The flags of ``ctx``
say whether the config ties the head (``tied``) and whether the HF model is a headless
``*Model`` class (``headless``); ``ctx.dims["hf_head"]`` is an HF head name other than the
row's (GPT-NeoX's ``embed_out``). Model Zoo's converters differ in four facts, which each
table declares (:class:`Head`); one order of decisions serves all four, and the golden plans
(``tests/test_hf_golden.py``) hold each table's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import numpy as np

from ckpt_migrate.hf.mapping import MappingError, Out, Shape, rename, same_shape
from ckpt_migrate.hf.ops import Ctx, Op


@dataclass(frozen=True)
class Head:
    """What a layout's converters do with the head where Model Zoo's differ.

    ``embedding``: the head row writes the HF embedding on export too (the families built on
    the GPT-2 layout: a tied file may hold only the CS head, gpt2_hf_cs.py lines 354-365).
    ``tie``: a tied CS head on import is the embedding ``renamed`` (one tensor, stored once),
    a ``copy`` (stored twice), or ``checked`` equal to an HF head the file keeps (LLaMA).
    ``fresh``: a headless untied model's new head is float32 of the config's shape
    (``config``: ``ctx.dims["head_shape"]``, else the CS config's vocabulary and width) or
    takes the embedding's shape and dtype (``like``). ``missing``: the refusal of an untied
    head the HF file lacks (None: the head is read anyway, and the table's check names it)."""

    embedding: bool = False
    tie: Literal["renamed", "copy", "checked"] = "renamed"
    fresh: Literal["config", "like"] = "config"
    missing: str | None = None


def normal_head(shape: Shape, dtype: Any) -> np.ndarray:
    """A new ``lm_head``: Model Zoo initialises the missing head of an untied headless model
    with ``normal(0, 0.02)`` (``post_model_convert``, gpt2_hf_cs.py lines 376-394,
    gptj_hf_cs.py lines 222-226, salesforce_codegen_hf_cs.py lines 384-392, gpt_neox_hf_cs.py
    lines 485-490, falcon_40b.py lines 471-478, bloom_hf_cs.py lines 378-382, llama.py lines
    411-451); seeded here, so repeatable."""
    return np.random.default_rng(0).normal(0.0, 0.02, shape).astype(dtype)


def _fresh(facts: Head, embedding: str, head: str, ctx: Ctx) -> Out:
    note = "new head, N(0, 0.02)"
    if facts.fresh == "like":
        build = lambda w: normal_head(w.shape, w.dtype)  # noqa: E731
        return Out(head, (embedding,), build, infer=same_shape, note=note)
    cs = ctx.dims.get("cs", {})
    shape = tuple(ctx.dims.get("head_shape") or (cs["vocab_size"], cs["hidden_size"]))
    return Out(head, (), partial(normal_head, shape, np.float32), shape=shape, note=note)


def zero_bias(name: str, size: int) -> Out:
    """A float32 zero head bias (Model Zoo's on the way to CS, HF's value of a missing one)."""
    return Out(name, (), partial(np.zeros, (size,), np.float32), shape=(size,), note="zeros")


def _to_hf(facts: Head, srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """The HF embedding (``facts.embedding``: the CS embedding, or tied the CS head when the
    file has only that); an untied head renamed (``save_pretrained`` leaves a tied one out and
    HF ties it on load; a headless model has none: gpt2_hf_cs.py line 302, llama.py lines
    502-517); with ``head bias`` the bias, or the zeros HF would initialise it to when CS lacks
    it (``use_bias_in_output: false``)."""
    (emb, head, *bias), (wte, hf_head, *hf_bias) = srcs, dsts
    outs = []
    if facts.embedding:
        only_head = ctx.has("tied") and emb not in ctx.available and head in ctx.available
        outs.append(rename(head if only_head else emb, wte))
    if ctx.has("headless"):
        return outs
    if ctx.has("!tied"):
        outs.append(rename(head, ctx.dims.get("hf_head", hf_head)))
    if ctx.has("head bias"):
        vocab = ctx.dims["cs"]["vocab_size"]
        have = bias[0] in ctx.available
        outs.append(rename(bias[0], hf_bias[0]) if have else zero_bias(hf_bias[0], vocab))
    return outs


def _head_to_cs(facts: Head, embed: str, hf_head: str, head: str, ctx: Ctx) -> Out:
    """The CS head, always (the CS model has one and the Trainer loads strictly): tied and
    ``checked``, the embedding checked against a head the file keeps; the HF head when the file
    has it (rule ``lm_head`` ``replaceKey``, gpt2_hf_cs.py lines 1085-1088, starcoder.py lines
    755-758, santacoder.py 503-506, btlm_hf_cs.py 433-436, jais_hf_cs.py 436-439); tied, the
    embedding (gpt2_hf_cs.py lines 768-790: Model Zoo's 2.1+ converters leave a tied head
    ``save_pretrained`` left out out of the CS file, which its own ``load_state_dict`` then
    refuses, docs/MODELZOO_PARITY.md §5); headless, a new head; else refused."""
    if ctx.has("tied") and facts.tie == "checked":
        return tied(embed, hf_head, head) if hf_head in ctx.available else rename(embed, head)
    if ctx.has("!headless") and hf_head in ctx.available:
        return rename(hf_head, head)
    if ctx.has("tied") and facts.tie == "copy":
        return Out(head, (embed,), np.copy, infer=same_shape, note="tied to the embedding")
    if ctx.has("tied"):
        return rename(embed, head)
    if ctx.has("headless"):
        return _fresh(facts, embed, head, ctx)
    if facts.missing is not None:
        raise MappingError(facts.missing)
    return rename(hf_head, head)


def _to_cs(facts: Head, srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """The CS head (:func:`_head_to_cs`) and with ``head bias`` its bias (a headless model's:
    zeros)."""
    (embed, hf_head, *hf_bias), (_, head, *bias) = srcs, dsts
    outs = [_head_to_cs(facts, embed, ctx.dims.get("hf_head", hf_head), head, ctx)]
    if ctx.has("head bias") and ctx.has("headless"):
        outs.append(zero_bias(bias[0], ctx.dims["cs"]["vocab_size"]))
    elif ctx.has("head bias"):
        outs.append(rename(hf_bias[0], bias[0]))
    return outs


def lm_head(name: str, facts: Head = Head()) -> Op:
    """The head operation of a layout whose converters decide as ``facts`` say."""
    return Op(name, partial(_to_hf, facts), partial(_to_cs, facts))


def _same(a: np.ndarray, b: np.ndarray, names: tuple[str, str]) -> np.ndarray:
    if a.shape != b.shape or not np.array_equal(a, b):
        raise MappingError(f"{names[1]}: expected tied to {names[0]}, but the values differ")
    return a


def tied(keep: str, also: str, dst: str) -> Out:
    """``dst`` from ``keep``, reading ``also`` to check it holds the same values: a tied HF
    ``lm_head`` kept in a state dict (``save_pretrained`` leaves it out) is the embeddings."""
    return Out(
        dst, (keep, also), lambda a, b: _same(a, b, (keep, also)), infer=lambda a, b: a, note="tied"
    )
