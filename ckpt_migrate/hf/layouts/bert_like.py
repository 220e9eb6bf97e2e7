"""The tensor tables of the BERT-like layout: BERT and its fine-tuning heads, RoBERTa and
ESM-2 (Model Zoo, tag Release_2.10.0: ``bert.py``, ``bert_finetune.py``, ``roberta.py``,
``esm2.py``, the latter two on the BERT rules they inherit).

One context, :func:`encoder`, reads the config for all of them; each record declares its
prefixes, the defaults it reads over, the flags of each of its names (BERT's heads) and the
features of its config (:data:`FEATURES`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ckpt_migrate.hf.config_bert import num_segments
from ckpt_migrate.hf.encoders import (
    CS_MLM,
    layers_of,
    mlm_bias_to_cs,
    mlm_to_hf,
    mlm_weights_to_cs,
    one_of,
    tied,
)
from ckpt_migrate.hf.mapping import Out, rename
from ckpt_migrate.hf.ops import RENAME, Ctx, Op, nothing, rotary
from ckpt_migrate.hf.table import (
    TO_CS,
    TO_HF,
    Feature,
    Group,
    Query,
    Row,
    Table,
    inputs_present,
    pair,
    row,
)
from ckpt_migrate.hf.table import features as read_features


def _old_norm_names(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """A layer norm's ``weight``/``bias`` read as ``gamma``/``beta`` when the file has only
    those (bert.py lines 51-66; transformers 5 ``save_pretrained`` writes ESM's ``LayerNorm``
    so)."""
    outs = []
    for src, dst in zip(srcs, dsts, strict=True):
        stem, _, leaf = src.rpartition(".")
        old = f"{stem}.{'gamma' if leaf == 'weight' else 'beta'}"
        outs.append(rename(old if src not in ctx.available and old in ctx.available else src, dst))
    return outs


# A layer norm: renamed; on import read from its ``gamma``/``beta`` spelling if that is the one.
LAYER_NORM = Op("layer norm (gamma/beta on import)", RENAME.forward, _old_norm_names)


def _esm_head_to_hf(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """Tied, the word embeddings come from whichever of the two tied CS names the file has;
    ``save_pretrained`` leaves the tied ``lm_head.decoder.weight`` out, and so does this plan
    (the other name is a tie). Untied, both are renamed."""
    (word, decoder), (hf_word, hf_decoder) = srcs, dsts
    if ctx.has("tied"):
        return [rename(one_of([word, decoder], ctx.available)[0], hf_word)]
    return [rename(word, hf_word), rename(decoder, hf_decoder)]


def _esm_head_to_cs(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """Tied, the CS MLM decoder weight is written from the word embeddings when the HF file lacks
    ``lm_head.decoder.weight`` (ours on purpose: Model Zoo renames only what the file has,
    esm2.py lines 286-295, while ``Esm2PretrainModel``'s state dict holds the tied weight under
    both names and CS loads strictly); a file that has it must hold the same values."""
    (hf_word, hf_decoder), (word, decoder) = srcs, dsts
    if ctx.has("tied"):
        copies = [hf_word, *([hf_decoder] if hf_decoder in ctx.available else [])]
        return [tied(word, copies), tied(decoder, copies)]
    return [rename(hf_word, word), rename(hf_decoder, decoder)]


# The word embeddings and the MLM decoder weight, tied or not.
ESM_HEAD = Op("ESM-2 MLM decoder", _esm_head_to_hf, _esm_head_to_cs)


# Every input the plan names must exist (the message names the source side, ``ctx.dims["side"]``,
# "CS" or "HF"): the check of the encoders' tables, CLIP-ViT's and T5's.
inputs_on_side = inputs_present("{side} tensor {first} is missing ({count} missing)")


def _mlm_to_hf(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """Word embeddings and the MLM decoder, CS -> HF (:func:`~ckpt_migrate.hf.encoders.
    mlm_to_hf`: tied, from whichever tied CS name the file has)."""
    head = ctx.dims["mlm"]
    return mlm_to_hf(ctx.available, ctx.has("tied"), srcs[0], dsts[0], head)


def _mlm_to_cs(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """Word embeddings, the MLM decoder weight and its bias, HF -> CS
    (:func:`~ckpt_migrate.hf.encoders.mlm_weights_to_cs`, ``mlm_bias_to_cs``);
    with ``zero bias``, a file without either bias gets a zero one of ``vocab_size`` (RoBERTa,
    roberta.py lines 183-192)."""
    head = ctx.dims["mlm"]
    outs = mlm_weights_to_cs(ctx.available, ctx.has("tied"), dsts[0], srcs[0], head)
    if ctx.has("!zero bias") or {f"{head}.decoder.bias", f"{head}.bias"} & set(ctx.available):
        return [*outs, mlm_bias_to_cs(ctx.available, head)]
    vocab = int(ctx.dims["cfg"]["vocab_size"])
    zeros = Out(
        f"{CS_MLM}.bias",
        (f"{head}.dense.bias",),
        lambda b: np.zeros((vocab,), dtype=b.dtype),
        shape=(vocab,),
        note="zeros: the HF file has no MLM decoder bias",
    )
    return [*outs, zeros]


# The word embeddings with the MLM decoder (``ctx.dims["mlm"]`` names the HF head:
# ``cls.predictions`` for BERT, ``lm_head`` for RoBERTa), tied or not.
MLM = Op("MLM decoder", _mlm_to_hf, _mlm_to_cs)


def _zero_segments(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """Without CS segment embeddings, HF gets a zero ``token_type_embeddings`` of one row
    (roberta.py lines 173-181; its dtype is the position table's, which it reads for it)."""

    def build(positions: np.ndarray) -> np.ndarray:
        return np.zeros((1, positions.shape[1]), dtype=positions.dtype)

    note = "zeros: CS has no segment embeddings"
    return [Out(dsts[0], (srcs[0],), build, infer=lambda s: (1, s[1]), note=note)]


ZERO_SEGMENTS = Op("zero segment embeddings", _zero_segments, nothing)

E, BL, BH = "{c}embedding_layer.", "{c}transformer_encoder.layers.{i}.", "{p}encoder.layer.{i}."
WORD = ("{c}embedding_layer.word_embeddings.weight", "{p}embeddings.word_embeddings.weight")
POSITIONS = (E + "position_embeddings.embed.weight", "{p}embeddings.position_embeddings.weight")
# The BERT encoder (Converter_BertModel_CS16_CS17, bert.py lines 82-242; 2.1 spelling
# ``position_embeddings.embed.weight``, lines 1241-1254); layer norms read as ``gamma``/``beta``
# on import when so stored (Converter_BertLayerNorm_HF_CS, bert.py lines 39-66).
ENCODER = Group(
    (
        row(*POSITIONS),
        row(
            E + "segment_embeddings.weight",
            "{p}embeddings.token_type_embeddings.weight",
            when="segments",
        ),
        pair("{c}embed_ln_f", "{p}embeddings.LayerNorm", LAYER_NORM),
    )
)


def encoder_layers(norms: tuple[str, str], query_key: Sequence[Row] = ()) -> Group:
    """One encoder layer (bert.py lines 155-221): query and key (``query_key`` rows instead when
    the family permutes them), value, output, the attention norm (``norms[0]``) -> ``norm1``, the
    FFN, the output norm (``norms[1]``) -> ``norm2``."""
    query_key = query_key or (
        pair(BL + "self_attn.proj_q_dense_layer", BH + "attention.self.query"),
        pair(BL + "self_attn.proj_k_dense_layer", BH + "attention.self.key"),
    )
    return Group(
        (
            *query_key,
            pair(BL + "self_attn.proj_v_dense_layer", BH + "attention.self.value"),
            pair(BL + "self_attn.proj_output_dense_layer", BH + "attention.output.dense"),
            pair(BL + "norm1", BH + norms[0], LAYER_NORM),
            pair(BL + "ffn.ffn.0.linear_layer", BH + "intermediate.dense"),
            pair(BL + "ffn.ffn.1.linear_layer", BH + "output.dense"),
            pair(BL + "norm2", BH + norms[1], LAYER_NORM),
        ),
        per_layer=True,
    )


_TRANSFORM = "bert_mlm_head.mlm_transform."


def _bert_like(heads: Sequence[Row]) -> Table:
    """The encoder, its layers, then ``heads`` (pooler, task heads, the MLM decoder: in the
    order the hand-written plans wrote them, the same both ways). Every input must exist
    (:func:`inputs_on_side`)."""
    order = ("encoder", "layers", "heads")
    return Table(
        groups={
            "encoder": ENCODER,
            "layers": encoder_layers(("attention.output.LayerNorm", "output.LayerNorm")),
            "heads": Group(tuple(heads)),
        },
        order={TO_HF: order, TO_CS: order},
        check=inputs_on_side,
    )


# BERT's pretraining model and its fine-tuning models (bert.py lines 549-629, bert_finetune.py
# lines 51-54 and 447-453): the pooler (pretraining and sequence classification), the MLM
# transform, NSP head and MLM decoder (pretraining), the QA or classifier head (the others),
# whose word embeddings are renamed.
BERT = _bert_like(
    (
        pair("{c}pooler.pooler.ffn.0.linear_layer", "{p}pooler.dense", when="pooler"),
        pair(_TRANSFORM + "ffn.ffn.0.linear_layer", "cls.predictions.transform.dense", when="mlm"),
        pair(_TRANSFORM + "ln", "cls.predictions.transform.LayerNorm", LAYER_NORM, "mlm"),
        pair("bert_cls_head.classifier.ffn.0.linear_layer", "cls.seq_relationship", when="mlm"),
        pair("classifier", "qa_outputs", when="qa"),
        pair("classifier", "classifier", when="classifier"),
        row(*WORD, MLM, when="mlm"),
        row(*WORD, when="!mlm"),
    )
)
# RoBERTa (roberta.py lines 50-90 and 173-192): no pooler; the MLM transform under ``lm_head``;
# a zero segment table for HF when CS has none; the MLM decoder.
ROBERTA = _bert_like(
    (
        pair(_TRANSFORM + "ffn.ffn.0.linear_layer", "lm_head.dense"),
        pair(_TRANSFORM + "ln", "lm_head.layer_norm", LAYER_NORM),
        row(
            POSITIONS[0],
            "{p}embeddings.token_type_embeddings.weight",
            ZERO_SEGMENTS,
            when="!segments",
        ),
        row(*WORD, MLM),
    )
)


# ESM-2: positions (absolute only, bert.py lines 1244-1252), the embedding norm when
# ``emb_layer_norm_before`` (esm2.py lines 74-80), per layer query and key (rotary rows permuted
# per head, esm2.py lines 46-73 and 127-215), ``attention.LayerNorm`` -> ``norm1`` and
# ``LayerNorm`` -> ``norm2`` (lines 89-111), the final encoder norm (lines 112-123), the MLM
# transform (lines 266-285) and decoder bias (lines 296-315), then the word embeddings and the
# decoder weight. The HF ``position_ids`` buffer Model Zoo writes (esm2.py lines 235-250) is
# not: transformers 5 regenerates it.
_ROTARY = rotary("heads")
_QUERY_KEY = tuple(
    pair(BL + f"self_attn.proj_{x}_dense_layer", BH + f"attention.self.{hf}", op, when)
    for x, hf in (("q", "query"), ("k", "key"))
    for op, when in ((_ROTARY, "rotary"), (RENAME, "!rotary"))
)
ESM2 = Table(
    groups={
        "embeddings": Group(
            (
                row(*POSITIONS, when="!rotary"),
                pair("{c}embed_ln_f", "{p}embeddings.layer_norm", LAYER_NORM, "norm"),
            )
        ),
        "layers": encoder_layers(("attention.LayerNorm", "LayerNorm"), _QUERY_KEY),
        "head": Group(
            (
                pair("{c}transformer_encoder.norm", "{p}encoder.emb_layer_norm_after", LAYER_NORM),
                pair(_TRANSFORM + "ffn.ffn.0.linear_layer", "lm_head.dense"),
                pair(_TRANSFORM + "ln", "lm_head.layer_norm", LAYER_NORM),
                row(f"{CS_MLM}.bias", "lm_head.bias"),
                row(
                    (WORD[0], f"{CS_MLM}.weight"),
                    (WORD[1], "lm_head.decoder.weight"),
                    ESM_HEAD,
                ),
            )
        ),
    },
    order={TO_HF: ("embeddings", "layers", "head"), TO_CS: ("embeddings", "layers", "head")},
    check=inputs_on_side,
)


# ----------------------------------------------------------------------------- the context


def _segments(q: Query, cfg: Mapping[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """Segment embeddings, which a RoBERTa CS model may lack (HF then gets a zero table of one
    row, roberta.py lines 413-434); an HF model always has them."""
    return ({"segments"} if not q.to_hf or num_segments(cfg) > 0 else set()), {}


def _rotary(q: Query, cfg: Mapping[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """ESM-2's rotary positions: query and key rows permuted per head (esm2.py lines
    127-215), or learned ones."""
    rotary = cfg["position_embedding_type"] == "rotary"
    heads = int(cfg["num_heads" if q.to_hf else "num_attention_heads"]) if rotary else 0
    return ({"rotary"} if rotary else set()), {"heads": heads}


def _embedding_norm(q: Query, cfg: Mapping[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """ESM-2's embedding norm (``embedding_layer_norm``/``emb_layer_norm_before``)."""
    norm = cfg["embedding_layer_norm" if q.to_hf else "emb_layer_norm_before"]
    return ({"norm"} if norm else set()), {}


def _config(q: Query, cfg: Mapping[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """The config itself (RoBERTa's MLM bias reads ``vocab_size``, roberta.py lines 183-192)."""
    return set(), {"cfg": cfg}


FEATURES: dict[str, Feature] = {
    "segments": _segments,
    "rotary": _rotary,
    "embedding norm": _embedding_norm,
    "config": _config,
}


def encoder(
    q: Query,
    *,
    prefix: str,
    cs_prefix: str,
    defaults: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None,
    flags: Sequence[str] = (),
    by_name: Mapping[str, tuple[str, ...]] | None = None,
    cs_prefixes: Mapping[str, str] | None = None,
    features: Sequence[str] = (),
    mlm: str | None = None,
) -> Ctx:
    """The context of a BERT-like table, either way: the layers, the word embeddings tied to
    the MLM decoder (``share_embedding_weights``/``tie_word_embeddings``), read from the config
    over the record's ``defaults`` (CS, HF); the HF ``prefix`` and the CS one (``cs_prefix``,
    or a name's own in ``cs_prefixes``: BertPretrainModel names its encoder ``bert_encoder``,
    the fine-tuning models ``bert``, bert.py line 544, bert_finetune.py line 47); the
    record's ``flags``, those of the name (``by_name``: which heads it has) and those of its
    ``features`` (:data:`FEATURES`); the MLM head's HF name (``mlm``)."""
    cfg = {**(defaults[0 if q.to_hf else 1] if defaults else {}), **q.config}
    layers = layers_of(cfg, "num_hidden_layers", 12)
    tied = cfg.get("share_embedding_weights" if q.to_hf else "tie_word_embeddings", True)
    found, dims = read_features(q, cfg, features, FEATURES)
    found |= {*flags, *(by_name or {}).get(q.name, ()), *({"tied"} if tied else ())}
    dims |= {"side": "CS" if q.to_hf else "HF"} | ({"mlm": mlm} if mlm else {})
    cs_at = (cs_prefixes or {}).get(q.name, cs_prefix)
    return Ctx(q.shapes, layers, prefix, frozenset(found), dims, cs_prefix=cs_at)
