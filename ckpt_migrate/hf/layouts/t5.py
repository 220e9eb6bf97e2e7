"""The tensor table of the T5 layout: T5 and the models Model Zoo converts with its rules
(``transformer``, ``ul2``, ``flan-ul2``). Model Zoo, tag Release_2.10.0, ``t5.py``: layer rules
``Converter_T5_CS16_CS17`` lines 40-380, HF specifics ``Converter_T5_HF_CS17`` lines 612-697,
tying ``Converter_T5_CS18_CS20`` lines 1064-1178, the 2.1 relative-bias rename lines 1248-1302.
Every tensor is renamed; the shared embeddings are one operation. Its context is :func:`context`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ckpt_migrate.hf.config_t5 import hf_head_shared, hf_scales_tied, nonlinearity_to_hf
from ckpt_migrate.hf.encoders import layers_of, one_of, present, tied
from ckpt_migrate.hf.layouts.bert_like import inputs_on_side
from ckpt_migrate.hf.mapping import MappingError, Out, Shape, rename
from ckpt_migrate.hf.ops import Ctx, Op
from ckpt_migrate.hf.table import TO_CS, TO_HF, Group, Query, Row, Table, row


def _embeddings_to_hf(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """transformers ties ``encoder/decoder.embed_tokens`` to ``shared`` always and ``lm_head``
    when the config shares it; ``save_pretrained`` writes only ``shared.weight`` for them, so we
    do too, from the first of the tied CS names the file has (Model Zoo takes any one that is
    not None, lines 1128-1168; with ``share_embedding_weights`` the lm_head is one of them); the
    others are ties. Untied, ``lm_head.weight`` is renamed."""
    (enc, dec, head), (shared, _, _, hf_head) = srcs, dsts
    copies = [enc, dec, head] if ctx.has("tied") else [enc, dec]
    outs = [rename(one_of(copies, ctx.available)[0], shared)]
    return outs if ctx.has("tied") else [*outs, rename(head, hf_head)]


def _embeddings_to_cs(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    """CS gets the encoder and decoder word embeddings and the lm_head, as Model Zoo writes them
    from a file that has ``encoder/decoder.embed_tokens`` (lines 648-668, 1162-1168): from
    ``shared.weight`` and any tied copies the HF file carries (checked equal), the lm_head from
    ``lm_head.weight`` when untied. Ours on purpose: Model Zoo drops ``shared.weight`` (line
    628, ``exists="left"``), so from a ``save_pretrained`` file, which holds only that one, its
    CS file has no embeddings at all."""
    (shared, enc_hf, dec_hf, head), (enc, dec, cs_head) = srcs, dsts
    copies = [shared, *present([enc_hf, dec_hf], ctx.available)]
    if ctx.has("tied"):
        copies += present([head], ctx.available)
    outs = [tied(enc, copies), tied(dec, copies)]
    if ctx.has("tied"):
        return [*outs, tied(cs_head, copies)]
    if head in ctx.available:
        return [*outs, rename(head, cs_head)]
    if ctx.has("head shared"):  # (transformers 5: shared, not rescaled: CS's untied lm_head)
        return [*outs, tied(cs_head, copies)]
    raise MappingError("lm_head.weight is missing and the config does not tie it (untied T5)")


# The one embedding tensor (encoder, decoder and, tied, the lm_head).
SHARED_EMBEDDINGS = Op("T5 shared embeddings", _embeddings_to_hf, _embeddings_to_cs)

_ATTENTION = (("q", "proj_q_dense_layer"), ("k", "proj_k_dense_layer"), ("v", "proj_v_dense_layer"))
_ATTENTION += (("o", "proj_output_dense_layer"),)


def _stack(stack: str) -> dict[str, Group]:
    """One stack's groups (t5.py lines 73-328): the relative attention bias (2.1 spelling), the
    blocks, the final norm. HF numbers a decoder block's sublayers 0 self attention, 1 cross
    attention, 2 feed-forward; CS names the norms norm1..norm3. Gated, CS
    ``linear_layer_for_glu`` is HF ``wi_0`` (the activated half) and ``linear_layer`` ``wi_1``;
    else ``linear_layer`` is ``wi`` (lines 223-271, 335-380)."""
    c, h = f"{stack}.layers.{{i}}.", f"{stack}.block.{{i}}.layer."
    decoder = stack == "decoder"
    ff = 2 if decoder else 1
    rows: list[Row] = [
        row(f"{c}self_attn.{cs}.weight", f"{h}0.SelfAttention.{hf}.weight") for hf, cs in _ATTENTION
    ]
    rows.append(row(f"{c}norm1.weight", f"{h}0.layer_norm.weight"))
    if decoder:
        rows += [
            row(f"{c}multihead_attn.{cs}.weight", f"{h}1.EncDecAttention.{hf}.weight")
            for hf, cs in _ATTENTION
        ]
        rows.append(row(f"{c}norm2.weight", f"{h}1.layer_norm.weight"))
    f = f"{c}ffn.ffn."
    rows += [
        row(f"{c}norm{ff + 1}.weight", f"{h}{ff}.layer_norm.weight"),
        row(
            f"{f}0.linear_layer_for_glu.weight", f"{h}{ff}.DenseReluDense.wi_0.weight", when="gated"
        ),
        row(f"{f}0.linear_layer.weight", f"{h}{ff}.DenseReluDense.wi_1.weight", when="gated"),
        row(f"{f}0.linear_layer.weight", f"{h}{ff}.DenseReluDense.wi.weight", when="!gated"),
        row(f"{f}1.linear_layer.weight", f"{h}{ff}.DenseReluDense.wo.weight"),
    ]
    bias = row(
        f"{stack}_embeddings.position_embed_helper.relative_attention_bias.weight",
        f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
    )
    return {
        f"{stack} bias": Group((bias,)),
        f"{stack} layers": Group(tuple(rows), per_layer=True, layers=stack),
        f"{stack} norm": Group((row(f"{stack}.norm.weight", f"{stack}.final_layer_norm.weight"),)),
    }


_EMBEDDINGS = row(
    (
        "encoder_embeddings.word_embeddings.weight",
        "decoder_embeddings.word_embeddings.weight",
        "lm_head.weight",
    ),
    (
        "shared.weight",
        "encoder.embed_tokens.weight",
        "decoder.embed_tokens.weight",
        "lm_head.weight",
    ),
    SHARED_EMBEDDINGS,
)
_ORDER = (
    *(f"{stack} {part}" for stack in ("encoder", "decoder") for part in ("bias", "layers", "norm")),
    "embeddings",
)
# The encoder stack, the decoder stack, then the embeddings (and head), the same both ways;
# ``ctx.dims`` gives each stack's layer count.
T5 = Table(
    groups={**_stack("encoder"), **_stack("decoder"), "embeddings": Group((_EMBEDDINGS,))},
    order={TO_HF: _ORDER, TO_CS: _ORDER},
    check=inputs_on_side,
)


def _refuse_positions(cs: Mapping[str, Shape]) -> None:
    """Learned or sinusoidal absolute positions (the ``transformer`` model) have no HF T5 home
    (t5.py lines 707-728)."""
    for name in cs:
        if re.fullmatch(r"(?:encoder|decoder)_embeddings\.position_embeddings\..*", name):
            raise MappingError(f"{name}: position_embedding_type absolute has no HF T5 equivalent")


def context(q: Query, *, defaults: tuple[Mapping[str, Any], Mapping[str, Any]]) -> Ctx:
    """Model Zoo: Converter_T5_HF_CS21 (t5.py lines 1341-1408, 1485-1489) either way: the
    encoder and decoder layer counts, gated feed-forward layers, the lm_head shared with the
    embeddings (``share_embedding_weights``; on import :func:`~ckpt_migrate.hf.config_t5.
    hf_scales_tied`), read over the record's ``defaults`` (CS, HF)."""
    if q.to_hf:
        _refuse_positions(q.shapes)
        cfg = {**defaults[0], **q.config}
        keys = ("encoder_num_hidden_layers", "decoder_num_hidden_layers")
    else:
        cfg = {**defaults[1], **q.config}
        keys = ("num_layers", "num_decoder_layers")
    enc = layers_of(cfg, keys[0], 6)
    dec = enc if cfg.get(keys[1]) is None else layers_of(cfg, keys[1], enc)
    if q.to_hf:
        gated = nonlinearity_to_hf(cfg).startswith("gated-")
        tied, shared = cfg["share_embedding_weights"], False
    else:
        gated, tied = str(cfg["feed_forward_proj"]).startswith("gated-"), hf_scales_tied(cfg)
        shared = hf_head_shared(cfg)
    flags = {f for f, on in (("gated", gated), ("tied", tied)) if on}
    flags |= {"head shared"} if shared and not tied else set()
    dims = {"encoder": enc, "decoder": dec, "side": "CS" if q.to_hf else "HF"}
    return Ctx(q.shapes, 0, "", frozenset(flags), dims)
