"""The tensor tables of the BERT-like layout: so far ESM-2 (Model Zoo, tag Release_2.10.0:
``esm2.py``, on the BERT rules of ``bert.py`` it inherits). BERT, RoBERTa and T5 keep their
hand-written plans for now (``hf/families/bert.py``, ``roberta.py``, ``t5.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ckpt_migrate.hf.families._bert_common import CS_MLM, finish, one_of, tied
from ckpt_migrate.hf.mapping import Out, rename
from ckpt_migrate.hf.ops import RENAME, Ctx, Op, rotary
from ckpt_migrate.hf.table import TO_CS, TO_HF, Group, Table, pair, row

CS_P, HF_P = "bert_encoder.", "esm."
L, H = CS_P + "transformer_encoder.layers.{i}.", HF_P + "encoder.layer.{i}."


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


def inputs_on_side(plan: list[Out], ctx: Ctx) -> list[Out]:
    """Every input the plan names must exist (the message names the source side,
    ``ctx.dims["side"]``, "CS" or "HF"); source tensors no row reads are for the pipeline's
    unused-tensor rule (``hf/unconverted.py`` names those Model Zoo drops)."""
    return finish(plan, ctx.available, ctx.dims["side"])


# ESM-2: positions (absolute only, bert.py lines 1244-1252), the embedding norm when
# ``emb_layer_norm_before`` (esm2.py lines 74-80), per layer query and key (rotary rows permuted
# per head, esm2.py lines 46-73 and 127-215), value, output, ``attention.LayerNorm`` ->
# ``norm1``, the FFN, ``LayerNorm`` -> ``norm2`` (lines 89-111, bert.py lines 155-221), the
# final encoder norm (lines 112-123), the MLM transform (lines 266-285) and decoder bias (lines
# 296-315), then the word embeddings and the decoder weight. The HF ``position_ids`` buffer
# Model Zoo writes (esm2.py lines 235-250) is not: transformers 5 regenerates it.
_ROTARY = rotary("heads")
ESM2 = Table(
    groups={
        "embeddings": Group(
            (
                row(
                    CS_P + "embedding_layer.position_embeddings.embed.weight",
                    HF_P + "embeddings.position_embeddings.weight",
                    when="!rotary",
                ),
                pair(CS_P + "embed_ln_f", HF_P + "embeddings.layer_norm", LAYER_NORM, "norm"),
            )
        ),
        "layers": Group(
            (
                pair(
                    L + "self_attn.proj_q_dense_layer",
                    H + "attention.self.query",
                    _ROTARY,
                    "rotary",
                ),
                pair(
                    L + "self_attn.proj_q_dense_layer", H + "attention.self.query", when="!rotary"
                ),
                pair(
                    L + "self_attn.proj_k_dense_layer", H + "attention.self.key", _ROTARY, "rotary"
                ),
                pair(L + "self_attn.proj_k_dense_layer", H + "attention.self.key", when="!rotary"),
                pair(L + "self_attn.proj_v_dense_layer", H + "attention.self.value"),
                pair(L + "self_attn.proj_output_dense_layer", H + "attention.output.dense"),
                pair(L + "norm1", H + "attention.LayerNorm", LAYER_NORM),
                pair(L + "ffn.ffn.0.linear_layer", H + "intermediate.dense"),
                pair(L + "ffn.ffn.1.linear_layer", H + "output.dense"),
                pair(L + "norm2", H + "LayerNorm", LAYER_NORM),
            ),
            per_layer=True,
        ),
        "head": Group(
            (
                pair(
                    CS_P + "transformer_encoder.norm",
                    HF_P + "encoder.emb_layer_norm_after",
                    LAYER_NORM,
                ),
                pair("bert_mlm_head.mlm_transform.ffn.ffn.0.linear_layer", "lm_head.dense"),
                pair("bert_mlm_head.mlm_transform.ln", "lm_head.layer_norm", LAYER_NORM),
                row(f"{CS_MLM}.bias", "lm_head.bias"),
                row(
                    (CS_P + "embedding_layer.word_embeddings.weight", f"{CS_MLM}.weight"),
                    (HF_P + "embeddings.word_embeddings.weight", "lm_head.decoder.weight"),
                    ESM_HEAD,
                ),
            )
        ),
    },
    order={TO_HF: ("embeddings", "layers", "head"), TO_CS: ("embeddings", "layers", "head")},
    check=inputs_on_side,
)
