"""The language-model head as table operations: renamed when untied, a tie when the config
shares it with the embeddings, newly initialised when a headless HF model has none.

A head row's names are ``(embedding, head)`` on each side. The flags of ``ctx`` say whether the
config ties the two (``tied``) and whether the HF model is a headless ``*Model`` class
(``headless``). Four dialects, as Model Zoo's converters differ: GPT-2's own rules (the embedding
is a row of its own both ways, a tied head imported as the embedding under a second name, a
fresh head float32 of the config's shape); those of the families built on the GPT-2 layout (the
head writes the HF embedding, a tied head is imported as a copy, a fresh head takes the
embedding's shape and dtype); the GPT-J backbone's (a head bias, a head the HF file names
otherwise); LLaMA's (a tied head the file keeps is checked equal). They share the export of an
untied head and the fresh head's draw (:func:`random_head`, :func:`normal_head`); which of them
decides first on import differs, and the golden plans (``tests/test_hf_golden.py``) hold each.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from ckpt_migrate.hf.mapping import MappingError, Out, Shape, rename
from ckpt_migrate.hf.ops import Ctx, Op


def normal_head(shape: Shape, dtype: Any) -> np.ndarray:
    """A new ``lm_head``: Model Zoo initialises the missing head of an untied headless model
    with ``normal(0, 0.02)`` (``post_model_convert``, gpt2_hf_cs.py lines 376-394); seeded
    here, so repeatable."""
    return np.random.default_rng(0).normal(0.0, 0.02, shape).astype(dtype)


def _untied_to_hf(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """An untied LM head is renamed; a tied one is not written (``save_pretrained`` leaves tied
    weights out) and not read (a tie); the headless model has none (gpt2_hf_cs.py line 302,
    dropped; Model Zoo llama.py lines 502-517)."""
    if ctx.has("!tied") and ctx.has("!headless"):
        return [rename(srcs[1], dsts[1])]
    return []


def _gpt2_to_cs(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """CS ``lm_head`` always: HF's when the file has it (rule ``lm_head`` ``replaceKey``,
    gpt2_hf_cs.py lines 1085-1088), else the embedding's tensor under a second name when tied
    (lines 768-790), else, headless, newly initialised (lines 367-394)."""
    (wte, head), cs_head = srcs, dsts[1]
    if head in ctx.available and ctx.has("!headless"):
        return [rename(head, cs_head)]
    if ctx.has("tied"):
        return [rename(wte, cs_head)]
    if ctx.has("headless"):
        return [random_head(cs_head, tuple(ctx.dims["head_shape"]), "initialised")]
    raise MappingError("lm_head.weight is missing and tie_word_embeddings is false")


# GPT-2's own head rules (gpt2_hf_cs.py).
GPT2_HEAD = Op("GPT-2 LM head", _untied_to_hf, _gpt2_to_cs)


def _layout_to_hf(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """HF embedding and head. Untied: both renamed (headless: the head is dropped, Model Zoo's
    converter note). Tied: the head is not written; the embedding is the CS embedding, or the
    CS head when the file has only that (gpt2_hf_cs.py lines 354-365). Model Zoo's 2.1+
    converted files have no ``lm_head`` when tied (see :func:`_layout_to_cs`): read too."""
    (emb, head), (wte, hf_head) = srcs, dsts
    if ctx.has("!tied"):
        return [rename(emb, wte)] + ([] if ctx.has("headless") else [rename(head, hf_head)])
    return [rename(emb if emb in ctx.available or head not in ctx.available else head, wte)]


def _layout_to_cs(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """CS ``lm_head.weight``, always written (the CS model has one). From HF ``lm_head.weight``
    when the file has it (rule ``lm_head`` ``replaceKey``, gpt2_hf_cs.py lines 1085-1088,
    starcoder.py lines 755-758, santacoder.py lines 503-506, btlm_hf_cs.py lines 433-436,
    jais_hf_cs.py lines 436-439); else, tied, a copy of ``wte`` (gpt2_hf_cs.py lines 777-781
    and 386-387); else, headless and untied, initialised N(0, 0.02) as lines 388-390 do.

    Different from Model Zoo on purpose: its 2.1+ LM-head converters (``*_HF_CS21``) leave a
    tied head that ``save_pretrained`` left out out of the CS file (only its 1.8-2.0 converter
    adds it back, gpt2_hf_cs.py lines 768-790), and Model Zoo's own ``GPT2LMHeadModel`` then
    refuses that file: ``load_state_dict`` (strict, trainer/callbacks/model.py lines 85-99)
    reports ``Missing key(s) in state_dict: "lm_head.weight"``."""
    (wte, head), cs_head = srcs, dsts[1]
    if ctx.has("!headless") and head in ctx.available:
        return [rename(head, cs_head)]
    if ctx.has("tied"):
        return [Out(cs_head, (wte,), np.copy, infer=lambda s: s, note="tied to wte")]
    if ctx.has("!headless"):
        raise MappingError("lm_head.weight: missing and tie_word_embeddings is false")
    return [_fresh_like(wte, cs_head)]


def _fresh_like(embedding: str, head: str) -> Out:
    """A new head of the embedding's shape and dtype, N(0, 0.02) (:func:`normal_head`)."""

    def init(w: np.ndarray) -> np.ndarray:
        return normal_head(w.shape, w.dtype)

    return Out(head, (embedding,), init, infer=lambda s: s, note="new head, N(0, 0.02)")


# The head rules of the families built on the GPT-2 layout (StarCoder, SantaCoder, BTLM, JAIS).
LAYOUT_HEAD = Op("GPT-2 layout LM head", _layout_to_hf, _layout_to_cs)


def random_head(name: str, shape: Shape, note: str = "N(0, 0.02)") -> Out:
    """An untied head HF lacks, drawn N(0, 0.02) in float32 (:func:`normal_head`) as Model Zoo
    does (gpt2_hf_cs.py lines 367-394, gptj_hf_cs.py lines 222-226,
    salesforce_codegen_hf_cs.py lines 384-392, gpt_neox_hf_cs.py lines 485-490, falcon_40b.py
    lines 471-478, bloom_hf_cs.py lines 378-382)."""

    def build() -> np.ndarray:
        return normal_head(shape, np.float32)

    return Out(name, (), build, shape=shape, note=note)


def zero_bias(name: str, size: int) -> Out:
    """A float32 zero head bias (Model Zoo's on the way to CS, HF's value of a missing one)."""
    return Out(name, (), partial(np.zeros, (size,), np.float32), shape=(size,), note="zeros")


def _decoder_to_hf(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """An untied head written as the HF head (``ctx.dims["hf_head"]`` when the family names it
    otherwise; HF ties a tied one on load; a headless model has none); with the ``head bias`` flag
    the head bias, or the zeros HF would initialise it to when CS lacks it
    (``use_bias_in_output: false``)."""
    (_, head, bias), (_, hf_head, hf_bias) = srcs, dsts
    if ctx.has("headless"):
        return []
    outs = [] if ctx.has("tied") else [rename(head, ctx.dims.get("hf_head", hf_head))]
    if ctx.has("head bias"):
        vocab = ctx.dims["cs"]["vocab_size"]
        outs.append(rename(bias, hf_bias) if bias in ctx.available else zero_bias(hf_bias, vocab))
    return outs


def _decoder_to_cs(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """CS head always: the HF head (``ctx.dims["hf_head"]``), or the embeddings when tied and
    the file lacks it (Model Zoo renames only a head the file has, but the CS model's state dict
    has it and the Trainer loads strictly, docs/MODELZOO_PARITY.md §5), and with ``head bias``
    its bias. A headless model gets the embeddings when tied, else :func:`random_head`, and
    with ``head bias`` a :func:`zero_bias`."""
    (embed, hf_head, hf_bias), (_, head, bias) = srcs, dsts
    hf_head = ctx.dims.get("hf_head", hf_head)
    cs = ctx.dims["cs"]
    if ctx.has("!headless"):
        source = hf_head if hf_head in ctx.available or ctx.has("!tied") else embed
        return [rename(source, head)] + ([rename(hf_bias, bias)] if ctx.has("head bias") else [])
    new = rename(embed, head) if ctx.has("tied") else None
    outs = [new or random_head(head, (cs["vocab_size"], cs["hidden_size"]))]
    return outs + ([zero_bias(bias, cs["vocab_size"])] if ctx.has("head bias") else [])


# The head rules of the GPT-J backbone's families (GPT-J, CodeGen, GPT-NeoX, Falcon, BLOOM):
# names (embedding, head, head bias) each side.
DECODER_HEAD = Op("decoder LM head", _decoder_to_hf, _decoder_to_cs)


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


def _llama_to_cs(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """A tied head is the embeddings under a second name (checked equal when the HF file keeps
    it); the base model has no head, so it gets the embeddings (tied) or a random one (Model
    Zoo llama.py lines 411-451)."""
    (emb, head), cs_head = srcs, dsts[1]
    if ctx.has("headless") and ctx.has("!tied"):
        return [_fresh_like(emb, cs_head)]
    if ctx.has("tied"):
        return [tied(emb, head, cs_head) if head in ctx.available else rename(emb, cs_head)]
    return [rename(head, cs_head)]


# The head rules of LLaMA, Mistral, Mixtral and Gemma 2: names (embedding, head) each side.
LLAMA_HEAD = Op("LLaMA LM head", _untied_to_hf, _llama_to_cs)
