"""The tensor tables of the GPT-2-like layout: GPT-2 itself (Model Zoo:
``src/cerebras/modelzoo/tools/checkpoint_converters/gpt2_hf_cs.py`` at tag Release_2.10.0,
``Converter_GPT2Model_HF_CS17`` lines 45-475 and the ``*_HF_CS21`` converters, lines
1035-1130), and StarCoder, SantaCoder, BTLM and JAIS, whose Model Zoo converters inherit those
GPT-2 rules (starcoder.py line 274, santacoder.py line 207, btlm_hf_cs.py lines 36-38,
jais_hf_cs.py lines 36-38) and differ in the attention and the MLP.

``{p}`` is the HF body's prefix: ``transformer.`` for the ``*LMHeadModel``/``*ForCausalLM``
classes, none for the headless ``*Model`` ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckpt_migrate.hf.heads import GPT2_HEAD, LAYOUT_HEAD
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import (
    CAUSAL_MASK,
    CONV1D,
    FUSED_CONV1D,
    FUSED_ROWS,
    PER_HEAD,
    RENAME,
    SECOND_NAME,
    Ctx,
    Op,
)
from ckpt_migrate.hf.table import BOTH, TO_CS, TO_HF, Group, Row, Table, checked, pair, row

L, H = "transformer_decoder.layers.{i}.", "{p}h.{i}."  # one layer, CS and HF
EMBEDDING = "embedding_layer.word_embeddings.weight"
HEADS = ((EMBEDDING, "lm_head.weight"), ("{p}wte.weight", "lm_head.weight"))  # CS, HF
# HF attention buffers the GPT-2 rules drop (gpt2_hf_cs.py lines 304-309, exists="left").
HF_ATTN_BUFFERS = r"(?:transformer\.)?h\.\d+\.attn\.(?:masked_bias|bias)"


def qkv(fused: str, op: Op = FUSED_CONV1D, letters: str = "qkv", when: str | None = None) -> Row:
    """CS ``proj_{x}_dense_layer`` of each ``x`` in ``letters`` <-> the fused HF module (the
    split of a fused attention, gpt2_hf_cs.py lines 113-151)."""
    cs = tuple(f"{L}self_attn.proj_{x}_dense_layer.{{s}}" for x in letters)
    return Row(cs, (f"{H}attn.{fused}.{{s}}",), op, BOTH, when)


def hf_prefix(headless: bool) -> str:
    """The ``*Model`` (headless) HF classes have no ``transformer.`` prefix (Model Zoo's
    ``*Model_HF_CS21`` vs ``*ForCausalLM``/``*LMHeadModel`` converters)."""
    return "" if headless else "transformer."


def mlp(op: Op, glu: bool = False) -> tuple[Row, ...]:
    """A GPT-2 block after its norms: ``c_proj`` -> ``proj_output_dense_layer`` (gpt2_hf_cs.py
    line 52), ``mlp.c_fc``/``c_proj`` -> ``ffn.ffn.0``/``1`` (lines 277-294); with ``glu``,
    BTLM's ``mlp.c_fc2`` -> ``ffn.ffn.0.linear_layer_for_glu`` (btlm_hf_cs.py lines 50-60)
    when the config's flags hold ``glu``."""
    glu_row = pair(L + "ffn.ffn.0.linear_layer_for_glu", H + "mlp.c_fc2", op, "glu")
    return (
        pair(L + "self_attn.proj_output_dense_layer", H + "attn.c_proj", op),
        pair(L + "ffn.ffn.0.linear_layer", H + "mlp.c_fc", op),
        *((glu_row,) if glu else ()),
        pair(L + "ffn.ffn.1.linear_layer", H + "mlp.c_proj", op),
    )


# GPT-2: ``wte``, ``wpe`` (``position_embeddings.embed`` from 2.1, lines 1040-1050); per layer
# ``ln_1``/``ln_2`` -> ``norm1``/``norm3`` and the Conv1D ``c_proj``, ``c_fc``, ``c_proj``
# transposed (``transpose_key_if_2D``, lines 230-310); ``ln_f`` -> ``transformer_decoder.norm``
# and, on import, ``ln_f`` too (one module at two places, gpt2_model.py lines 911 and 962-972;
# ``replace_final_norm``, lines 323-337); Q, K, V fused into Conv1D ``c_attn`` (lines 113-202;
# the ``attn.bias``/``attn.masked_bias`` buffers it generates are not written: transformers 5
# no longer has them); the head (:data:`~ckpt_migrate.hf.heads.GPT2_HEAD`).
GPT2 = Table(
    groups={
        "embeddings": Group(
            (
                row(EMBEDDING, "{p}wte.weight"),
                row("embedding_layer.position_embeddings.embed.weight", "{p}wpe.weight"),
            )
        ),
        "layers": Group(
            (
                pair(L + "norm1", H + "ln_1"),
                pair(L + "self_attn.proj_output_dense_layer", H + "attn.c_proj", CONV1D),
                pair(L + "norm3", H + "ln_2"),
                *mlp(CONV1D)[1:],
            ),
            per_layer=True,
            order={TO_HF: ("layer", "suffix", "row"), TO_CS: ("layer", "suffix", "row")},
        ),
        "final norm": Group((pair("transformer_decoder.norm", "{p}ln_f"),)),
        "final norm's second name": Group((pair("ln_f", "{p}ln_f", SECOND_NAME),)),
        "attention": Group(
            (qkv("c_attn"),),
            per_layer=True,
            order={TO_HF: ("layer", "suffix"), TO_CS: ("layer", "piece", "suffix")},
        ),
        "head": Group((row(HEADS[0], HEADS[1], GPT2_HEAD),)),
    },
    order={
        TO_HF: ("embeddings", "layers", "final norm", "attention", "head"),
        TO_CS: (
            "embeddings",
            "layers",
            "final norm",
            "final norm's second name",
            "attention",
            "head",
        ),
    },
)


def on_gpt2_layout(block: tuple[Row, ...], attention: tuple[Row, ...]) -> Table:
    """A family built on the GPT-2 rules: ``wte`` (``embedding_layer.word_embeddings``,
    gpt2_hf_cs.py lines 234-240), ``wpe`` in the 2.1 spelling when positions are learned
    (starcoder.py lines 696-707), ``ln_f``, BTLM's ALiBi slopes (btlm_hf_cs.py lines 386-394),
    per layer ``ln_1``/``ln_2`` (-> ``norm1``/``norm3``, gpt2_hf_cs.py lines 259-276) then
    ``block``, then ``attention``; on import ``ln_f`` under its second name too; the head
    (:data:`~ckpt_migrate.hf.heads.LAYOUT_HEAD`, which writes ``wte`` on export). Checked: a
    source tensor no row reads is an error (:func:`~ckpt_migrate.hf.table.checked`)."""
    positions = "embedding_layer.position_embeddings.embed.weight"
    slopes = "embedding_layer.position_embed_helper.slopes"
    return Table(
        groups={
            "embedding": Group((row(EMBEDDING, "{p}wte.weight"),)),
            "positions": Group((row(positions, "{p}wpe.weight", when="learned"),)),
            "final norm": Group((pair("transformer_decoder.norm", "{p}ln_f"),)),
            "alibi": Group((row(slopes, "{p}relative_pe.slopes", RENAME, when="alibi"),)),
            "layers": Group(
                (pair(L + "norm1", H + "ln_1"), pair(L + "norm3", H + "ln_2"), *block),
                per_layer=True,
            ),
            "attention": Group(attention, per_layer=True),
            "final norm's second name": Group((pair("ln_f", "{p}ln_f", SECOND_NAME),)),
            "head": Group((row(HEADS[0], HEADS[1], LAYOUT_HEAD),)),
        },
        order={
            TO_HF: ("positions", "final norm", "alibi", "layers", "attention", "head"),
            TO_CS: (
                "embedding",
                "positions",
                "final norm",
                "alibi",
                "layers",
                "attention",
                "final norm's second name",
                "head",
            ),
        },
        check=checked,
    )


# StarCoder (GPTBigCode): ``nn.Linear`` both sides (no transposes, starcoder.py lines 43-48 and
# 278-279); ``c_attn`` packs ``[q (hidden), k (head_dim), v (head_dim)]`` rows for multi-query
# attention, ``[q_h, k_h, v_h]`` per head otherwise (lines 98-235).
STARCODER = on_gpt2_layout(
    mlp(RENAME),
    (qkv("c_attn", FUSED_ROWS, when="mq"), qkv("c_attn", PER_HEAD, when="!mq")),
)
# SantaCoder: Conv1D, a separate ``q_attn`` and a fused ``kv_attn`` (santacoder.py lines
# 42-154); export generates the ``attn.bias``/``attn.masked_bias`` buffers (lines 156-168).
SANTACODER = on_gpt2_layout(
    (pair(L + "self_attn.proj_q_dense_layer", H + "attn.q_attn", CONV1D), *mlp(CONV1D)),
    (qkv("kv_attn", letters="kv"), row((), (H + "attn.bias", H + "attn.masked_bias"), CAUSAL_MASK)),
)
# BTLM and JAIS: GPT-2's Conv1D block with SwiGLU's second input (btlm_hf_cs.py lines 50-60)
# and ALiBi slopes instead of ``wpe`` when the config says so; no ``attn.bias`` buffers
# (``generate_hf_biases=False``, line 65).
BTLM = on_gpt2_layout(mlp(CONV1D, glu=True), (qkv("c_attn"),))


def layout_context(
    direction: str,
    shapes: Mapping[str, Shape],
    config: Mapping[str, Any],
    headless: bool,
    layers: int,
    flags: frozenset[str] = frozenset(),
    dims: Mapping[str, Any] | None = None,
) -> Ctx:
    """The context of a table :func:`on_gpt2_layout` builds: the head tied per the config
    (``share_embedding_weights`` of the CS ``config`` on export, ``tie_word_embeddings`` of the
    HF one on import); on import the HF attention buffers are dropped (gpt2_hf_cs.py lines
    304-309), on export a headless model's CS ``lm_head`` (Model Zoo's ``*Model_HF_CS21``
    note), and ``ln_f.*`` and a tied ``lm_head`` are ties (:func:`tie_map`)."""
    key = "share_embedding_weights" if direction == TO_HF else "tie_word_embeddings"
    tied = bool(config.get(key, True))
    flags = flags | ({"tied"} if tied else set()) | ({"headless"} if headless else set())
    if direction == TO_HF:
        dropped, ties = (r"lm_head\.weight" if headless else None), tie_map(shapes, tied)
    else:
        dropped, ties = HF_ATTN_BUFFERS, {}
    pre = hf_prefix(headless)
    return Ctx(shapes, layers, pre, frozenset(flags), dims or {}, dropped, ties)


def tie_map(cs: Mapping[str, Shape], tied: bool) -> dict[str, str]:
    """CS tensors that are copies of one the plan reads (no HF tensor of their own): ``ln_f.*``
    of ``transformer_decoder.norm.*`` (Model Zoo drops them on the way to HF, rule ``ln_f``
    ``exists="right"``, gpt2_hf_cs.py line 303), and a tied ``lm_head.weight`` of the
    embedding. Only those the file has: a Trainer-saved checkpoint (and ours) holds both, Model
    Zoo's 2.1+ converted one no tied head."""
    ties = {f"ln_f.{s}": f"transformer_decoder.norm.{s}" for s in BOTH}
    if tied and EMBEDDING in cs:
        ties["lm_head.weight"] = EMBEDDING
    return {k: v for k, v in ties.items() if k in cs and v in cs}


def check_name(name: str, names: Sequence[str]) -> bool:
    """Whether ``name`` (one of ``names``) is the headless model; MappingError if unknown."""
    if name not in names:
        raise MappingError(f"model name {name!r} is not one of {', '.join(names)}")
    return name.endswith("-headless")
