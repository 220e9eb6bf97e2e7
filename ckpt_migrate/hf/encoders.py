"""What the encoder families' tables and contexts share (BERT, RoBERTa, ESM-2, T5, CLIP-ViT):
config checks, tied copies, and the MLM decoder of BERT and RoBERTa.

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``: the MLM
decoder rules are ``bert.py`` lines 569-589 (``cls.predictions.decoder`` ->
``bert_mlm_head.classifier.ffn.0.linear_layer``, ``cls.predictions.bias`` dropped), 602-629
(the bias written twice to HF) and 716-739 (a missing word embedding read from the tied decoder
weight); ``roberta.py`` lines 70-90 are the same rules under ``lm_head``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ckpt_migrate.hf.mapping import MappingError, Out, Shape, rename

CS_MLM = "bert_mlm_head.classifier.ffn.0.linear_layer"


def layers_of(config: Mapping[str, Any], key: str, default: int) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or value < 0:
        raise MappingError(f"{key}={value!r}: expected a layer count")
    return value


# ----------------------------------------------------------------------------- tied copies


def bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bits (NaNs, e.g. pruned weights of a sparse CS run, compare equal)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.itemsize in (1, 2, 4, 8):
        bits = np.dtype(f"u{a.dtype.itemsize}")
        return bool(np.array_equal(a.view(bits), b.view(bits)))
    return a.tobytes() == b.tobytes()


def tied_copies(names: Sequence[str]) -> Callable[..., np.ndarray]:
    """Build for tied tensors: the first, after checking every other copy is identical."""

    def build(*xs: np.ndarray) -> np.ndarray:
        for other, x in zip(names[1:], xs[1:]):
            if not bitwise_equal(x, xs[0]):
                raise MappingError(f"{other} should be tied to {names[0]} but differs from it")
        return xs[0]

    return build


def first_of(*shapes: Shape) -> Shape:
    return shapes[0]


def tied(dst: str, srcs: Sequence[str]) -> Out:
    """``dst`` from ``srcs[0]``, reading the tied copies ``srcs[1:]`` to check they agree (HF
    side: an import reads each HF tensor once per output)."""
    if len(srcs) == 1:
        return rename(srcs[0], dst)
    return Out(dst, tuple(srcs), tied_copies(srcs), infer=first_of, note="tied copies checked")


def first_ignoring_rest(dst: str, srcs: Sequence[str], note: str) -> Out:
    """``dst`` from ``srcs[0]``; ``srcs[1:]`` are read and dropped as Model Zoo drops them."""
    return Out(dst, tuple(srcs), lambda x, *_: x, infer=first_of, note=note)


def present(names: Sequence[str], available: Mapping[str, Shape]) -> list[str]:
    return [n for n in names if n in available]


def one_of(copies: Sequence[str], available: Mapping[str, Shape]) -> tuple[str, dict[str, str]]:
    """CS side: the tied copy to read (the first the checkpoint has) and the others it has, as
    ``cs_ties`` entries (copy -> the one read; the pipeline checks they are equal). A Trainer
    save holds every name of a tied module; Model Zoo's HF -> CS leaves the copies out."""
    found = present(copies, available)
    if not found:
        return copies[0], {}  # the table's check names it missing
    return found[0], {c: found[0] for c in found[1:]}


# ----------------------------------------------------------------------------- MLM decoder


def mlm_word(cs: Mapping[str, Shape], share: bool, cs_word: str) -> tuple[str, dict[str, str]]:
    """The CS tensor the HF word embeddings come from, and the ``cs_ties``. Tied
    (``share_embedding_weights``), the word embeddings and the MLM decoder weight are one tensor:
    a Trainer save holds both names, Model Zoo's HF -> CS file only the word embeddings (it
    reads the decoder weight when the word embeddings are absent, bert.py lines 716-739)."""
    if not share:
        return cs_word, {}
    return one_of([cs_word, f"{CS_MLM}.weight"], cs)


def mlm_to_hf(
    cs: Mapping[str, Shape], share: bool, cs_word: str, hf_word: str, hf_head: str
) -> list[Out]:
    """Word embeddings and the MLM decoder, CS -> HF.

    Tied: HF saves only the embeddings and ``<head>.bias`` (``save_pretrained`` leaves the tied
    decoder weight and bias out); the CS decoder weight, when present, is a ``cs_ties`` copy
    (:func:`mlm_word`). Untied: both weights are renamed and the decoder bias is written twice,
    as ``decoder.bias`` and ``bias`` (bert.py lines 602-629)."""
    w, b = f"{CS_MLM}.weight", f"{CS_MLM}.bias"
    if share:
        return [rename(mlm_word(cs, share, cs_word)[0], hf_word), rename(b, f"{hf_head}.bias")]
    return [
        rename(cs_word, hf_word),
        rename(w, f"{hf_head}.decoder.weight"),
        rename(b, f"{hf_head}.decoder.bias"),
        rename(b, f"{hf_head}.bias"),
    ]


def mlm_weights_to_cs(
    hf: Mapping[str, Shape], tie: bool, cs_word: str, hf_word: str, hf_head: str
) -> list[Out]:
    """Word embeddings and the MLM decoder weight, HF -> CS, as Model Zoo writes them: the CS
    decoder weight only when the HF file has ``<head>.decoder.weight`` (bert.py lines 569-578,
    roberta.py lines 70-79 rename what is there). ``save_pretrained`` leaves a tied one out, and
    so does Model Zoo's CS file; a state dict or an old ``.bin`` keeps it, checked equal."""
    dec_w = f"{hf_head}.decoder.weight"
    if dec_w in hf:
        word = tied(cs_word, [hf_word, dec_w]) if tie else rename(hf_word, cs_word)
        return [word, rename(dec_w, f"{CS_MLM}.weight")]
    if tie:
        return [rename(hf_word, cs_word)]
    raise MappingError(f"{dec_w} is missing and tie_word_embeddings is false")


def mlm_bias_to_cs(hf: Mapping[str, Shape], hf_head: str) -> Out:
    """The MLM decoder bias, HF -> CS: from ``decoder.bias`` when the file has it (``<head>.bias``
    is then read and dropped, bert.py line 589), else from ``<head>.bias``. Ours on purpose:
    transformers saves only ``<head>.bias`` (the tie of ``decoder.bias``), which Model Zoo drops,
    losing the trained bias (BERT: no CS bias at all; RoBERTa: zeros, roberta.py lines
    183-192)."""
    dec_b, bias = f"{hf_head}.decoder.bias", f"{hf_head}.bias"
    if dec_b in hf:
        return first_ignoring_rest(f"{CS_MLM}.bias", [dec_b, *present([bias], hf)], "renamed")
    return rename(bias, f"{CS_MLM}.bias")
