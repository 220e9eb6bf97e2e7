"""The tensor tables of the GPT-J backbone: GPT-J, CodeGen and GPT-NeoX (Model Zoo, tag
Release_2.10.0: ``gptj_hf_cs.py``, ``salesforce_codegen_hf_cs.py``, ``gpt_neox_hf_cs.py``),
whose rules Model Zoo's converters spell alike: renamed (HF, CS) pairs, the family's fused
Q/K/V, the final norm under its second CS name, the head (and its bias).

Each table is its family's (HF, CS) name pairs, as Model Zoo's five converters spell them
alike, built into a table by :func:`decoder_table`; the fused Q/K/V layouts are named operations
(``hf/fused.py``). One context, :func:`decoder`, reads the config for all five (Falcon's
grouped attention is a feature its record lists); their catalogue records name table and
context (``Hf.tensors``). All these CS models register their final norm under
two names, ``ln_f`` and ``transformer_decoder.norm`` (one module: ``models/nlp/gptj/
gptj_model.py`` lines 535-538, which CodeGen, GPT-NeoX and Falcon use; ``models/nlp/gpt2/
gpt2_model.py`` lines 910 and 965 for BLOOM). Model Zoo writes both on the way to CS
(``replace_final_norm``) and so does the table; on the way to HF ``ln_f.*`` is a tie of
``transformer_decoder.norm.*``, read only when it is the one present.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.config_gptj import falcon_cs_layout
from ckpt_migrate.hf.fused import ALIBI_SLOPES, BLOOM_QKV, CODEGEN_QKV, FALCON_QKV, NEOX_QKV
from ckpt_migrate.hf.heads import lm_head
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import RENAME_EXISTING, SECOND_NAME, Ctx, Op
from ckpt_migrate.hf.table import (
    BOTH,
    TO_CS,
    TO_HF,
    Feature,
    Group,
    Query,
    Row,
    Table,
    inputs_present,
    row,
)
from ckpt_migrate.hf.table import features as read_features

Pairs = Sequence[tuple[str, str]]  # (HF name, CS name)
EMBED = "embedding_layer.word_embeddings.weight"
HEAD = "lm_head.weight"
HEAD_BIAS = "lm_head.bias"
# The CS model's second name of its final norm (copy -> the name the plan reads), see above.
LN_F = {f"ln_f.{p}": f"transformer_decoder.norm.{p}" for p in ("weight", "bias")}
L = "transformer_decoder.layers.{i}."
# The head of the GPT-J backbone's families: (embedding, head, head bias) each side; a tied head
# is the embedding renamed, a fresh one float32 of the config's shape.
DECODER_HEAD = lm_head("decoder LM head")


def decoder_table(
    top: Pairs,
    layer: Sequence[tuple[str, ...]],
    block: str = "h",
    attention: Sequence[Row] = (),
    made: Sequence[Row] = (),
) -> Table:
    """The table of a GPT-J-backbone family: the ``top`` pairs under the HF prefix ``{p}``, the
    ``layer`` pairs inside each HF ``{p}{block}.N.`` and CS ``transformer_decoder.layers.N.``
    (read on export from the copy that exists; a third item is the row's ``when``), the
    ``attention`` rows (fused Q/K/V), the rows of tensors ``made`` on import, then the head
    (:data:`DECODER_HEAD`); on import the final norm's second name after
    the renames. Every input must exist; source tensors no row reads are
    left to the pipeline's unused-tensor rule."""
    hf_of = {cs: hf for hf, cs in top}
    heads = ((EMBED, HEAD, HEAD_BIAS), ("{p}" + hf_of[EMBED], HEAD, HEAD_BIAS))
    return Table(
        groups={
            "top": Group(tuple(row(cs, "{p}" + hf, RENAME_EXISTING) for hf, cs in top)),
            "layers": Group(
                tuple(
                    row(L + cs, f"{{p}}{block}.{{i}}.{hf}", RENAME_EXISTING, when=(*when, None)[0])
                    for hf, cs, *when in layer
                ),
                per_layer=True,
            ),
            "final norm's second name": Group(
                tuple(row(copy, "{p}" + hf_of[norm], SECOND_NAME) for copy, norm in LN_F.items())
            ),
            "attention": Group(tuple(attention), per_layer=True),
            "made": Group(tuple(made)),
            "head": Group((row(*heads, DECODER_HEAD),)),
        },
        order={
            TO_HF: ("top", "layers", "attention", "made", "head"),
            TO_CS: ("top", "layers", "final norm's second name", "attention", "made", "head"),
        },
        check=inputs_present("{first}: the checkpoint lacks this tensor"),
    )


def qkv_row(fused: str, op: Op, kinds: tuple[str, ...] = BOTH, when: str | None = None) -> Row:
    """The CS Q, K and V of each of ``kinds`` <-> the HF ``{p}``-prefixed ``fused`` (with
    ``{i}`` and ``{kind}`` fields) through ``op`` (:func:`~ckpt_migrate.hf.ops.fused_qkv`)."""
    cs = tuple(f"{L}self_attn.proj_{w}_dense_layer.{{s}}" for w in "qkv")
    return Row(cs, ("{p}" + fused.format(i="{i}", kind="{s}"),), op, kinds, when)


def cs_config(q: Query, defaults: Mapping[str, Any]) -> Mapping[str, Any]:
    """The CS config a :func:`decoder_context` reads: on import the one the record's config
    table gives; on export the config over the family's ``defaults``, once the table accepted
    it."""
    if not q.to_hf:
        return config_table.to_cs(q.config, q.name)
    config_table.to_hf(q.config, q.name)
    return {**defaults, **q.config}


def decoder_context(
    shapes: Mapping[str, Shape],
    cs: Mapping[str, Any],
    name: str,
    prefix: str,
    *,
    bias: bool = False,
    dims: Mapping[str, Any] | None = None,
    flags: frozenset[str] = frozenset(),
) -> Ctx:
    """The context of a :func:`decoder_table`, from the CS config ``cs`` (the family's defaults
    filled in; on import the one its ``config_to_cs`` gives): the HF ``prefix`` unless the model
    is headless, the head tied (``share_embedding_weights``), a head ``bias``, the family's
    ``flags`` and ``dims``, and the copies
    read when only they exist (the final norm's ``ln_f``, a tied model's head for its
    embeddings: Model Zoo's ``pre_model_convert``)."""
    layers = cs["num_hidden_layers"]
    headless, tied = name.endswith("-headless"), bool(cs["share_embedding_weights"])
    flags = flags | ({"headless"} if headless else set())
    flags |= ({"tied"} if tied else set()) | ({"head bias"} if bias else set())
    copies = {v: k for k, v in LN_F.items()} | ({EMBED: HEAD} if tied else {})
    all_dims = {"cs": cs, "copies": copies, **(dims or {})}
    pre = "" if headless else prefix
    return Ctx(shapes, layers, pre, frozenset(flags), all_dims)


def _grouped(q: Query, cfg: Mapping[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """Falcon's attention (falcon_180b.py lines 36-131 and 568-588): norms untied or not
    (``ln_attn``/``ln_mlp`` or ``input_layernorm``), the linear layers' biases, and the rows of
    Q, K and V in the grouped fused ``query_key_value`` (:data:`~ckpt_migrate.hf.fused.
    FALCON_QKV`)."""
    groups, untied = falcon_cs_layout(cfg)
    heads, head_dim = cfg["num_heads"], cfg["hidden_size"] // cfg["num_heads"]
    rows = {"q": heads * head_dim, "k": groups * head_dim, "v": groups * head_dim}
    flags = ({"untied"} if untied else set()) | ({"bias"} if cfg["use_ffn_bias"] else set())
    return flags, {"groups": groups, "head_dim": head_dim, "rows": rows}


FEATURES: dict[str, Feature] = {"grouped attention": _grouped}


def decoder(
    q: Query,
    *,
    defaults: Mapping[str, Any],
    prefix: str = "transformer.",
    bias: bool = False,
    dims: Mapping[str, str] | None = None,
    legacy_head: str | None = None,
    features: Sequence[str] = (),
) -> Ctx:
    """The context of the GPT-J backbone's families (their records' ``Hf.tensors``): the CS
    config (:func:`cs_config`, over the family's ``defaults``), the HF ``prefix``, a head
    ``bias``, the ``dims`` the family's fused attention reads (dim -> CS config field) and its
    ``features`` (:data:`FEATURES`).
    With a ``legacy_head`` (GPT-NeoX's ``embed_out.weight``, the name Model Zoo writes and
    transformers' ``save_pretrained`` still saves, read back as ``lm_head``; gpt_neox_hf_cs.py
    lines 568-574): an untied head is exported under it; on import ``lm_head`` is read unless
    only the legacy name is there."""
    cfg = cs_config(q, defaults)
    flags, values = read_features(q, cfg, features, FEATURES)
    values |= {dim: cfg[field] for dim, field in (dims or {}).items()}
    if legacy_head is not None:
        values["hf_head"] = legacy_head
        if not q.to_hf and (legacy_head not in q.shapes or HEAD in q.shapes):
            values["hf_head"] = HEAD
    ctx_flags = frozenset(flags)
    return decoder_context(q.shapes, cfg, q.name, prefix, bias=bias, dims=values, flags=ctx_flags)


# ----------------------------------------------------------------------------- the tables
# (HF name, CS name[, when]) pairs: the HF names inside a block ``{p}<block>.N.``, the CS ones
# inside ``transformer_decoder.layers.N.``; the top pairs under ``{p}``.


def params(modules: Pairs, kinds: Sequence[str] = BOTH) -> list[tuple[str, str]]:
    """(HF, CS) names of each (HF, CS) module's parameters ``kinds``."""
    return [(f"{hf}.{kind}", f"{cs}.{kind}") for hf, cs in modules for kind in kinds]


def gptj_style_layer(*attention: tuple[str, str]) -> list[tuple[str, str]]:
    """(HF, CS) names inside a GPT-J-style block: the norm, the family's ``attention`` pairs,
    the MLP (Model Zoo: gptj_hf_cs.py lines 112-148, salesforce_codegen_hf_cs.py 275-303)."""
    mlp = [("mlp.fc_in", "ffn.ffn.0.linear_layer"), ("mlp.fc_out", "ffn.ffn.1.linear_layer")]
    return [*params([("ln_1", "norm1")]), *attention, *params(mlp)]


def megatron_layer(dense: str, norms: Pairs) -> list[tuple[str, str]]:
    """(HF, CS) names inside a block of GPT-NeoX and BLOOM: the ``norms``, the attention's
    output ``dense`` and the MLP."""
    linear = [
        (dense, "self_attn.proj_output_dense_layer"),
        ("mlp.dense_h_to_4h", "ffn.ffn.0.linear_layer"),
        ("mlp.dense_4h_to_h", "ffn.ffn.1.linear_layer"),
    ]
    return params(norms) + params(linear)


# HF GPT-J-style names (GPT-J, CodeGen) of the embeddings and the final norm. Model Zoo:
# gptj_hf_cs.py lines 86-101, salesforce_codegen_hf_cs.py lines 249-264.
GPTJ_STYLE_TOP: Pairs = (
    ("wte.weight", EMBED),
    ("ln_f.weight", "transformer_decoder.norm.weight"),
    ("ln_f.bias", "transformer_decoder.norm.bias"),
)
_OUT_PROJ = ("attn.out_proj.weight", "self_attn.proj_output_dense_layer.weight")

# GPT-J: renames only; HF GPT-J rotates every two channels exactly like CS rotary (gptj_hf_cs.py
# lines 39-71 attention, 112-148 norm and ffn).
GPTJ = decoder_table(
    GPTJ_STYLE_TOP,
    gptj_style_layer(
        *((f"attn.{p}_proj.weight", f"self_attn.proj_{p}_dense_layer.weight") for p in "qkv"),
        _OUT_PROJ,
    ),
)
# CodeGen: Q, V, K packed per shard into ``qkv_proj`` (no bias; salesforce_codegen_hf_cs.py lines
# 42-62), ``out_proj`` (lines 63-69), GPT-J-style names otherwise (lines 275-303).
CODEGEN = decoder_table(
    GPTJ_STYLE_TOP,
    gptj_style_layer(_OUT_PROJ),
    attention=[qkv_row("h.{i}.attn.qkv_proj.{kind}", CODEGEN_QKV, ("weight",))],
)
# GPT-NeoX: embeddings and final norm (gpt_neox_hf_cs.py lines 335-354), dense (41-47), norms
# and ffn (365-406), Q/K/V fused per head (48-68).
GPT_NEOX = decoder_table(
    (
        ("embed_in.weight", EMBED),
        ("final_layer_norm.weight", "transformer_decoder.norm.weight"),
        ("final_layer_norm.bias", "transformer_decoder.norm.bias"),
    ),
    megatron_layer(
        "attention.dense", [("input_layernorm", "norm1"), ("post_attention_layernorm", "norm3")]
    ),
    "layers",
    [qkv_row("layers.{i}.attention.query_key_value.{kind}", NEOX_QKV)],
)
# BLOOM: embeddings, their norm and the final norm (bloom_hf_cs.py lines 209-226, 276-282),
# dense (47-53), norms and mlp (236-275), Q/K/V fused per head (54-74); the ALiBi slopes made on
# import, 2.1+ name (lines 387-391, 975).
BLOOM = decoder_table(
    (
        ("word_embeddings.weight", EMBED),
        ("word_embeddings_layernorm.weight", "embedding_ln_f.weight"),
        ("word_embeddings_layernorm.bias", "embedding_ln_f.bias"),
        ("ln_f.weight", "transformer_decoder.norm.weight"),
        ("ln_f.bias", "transformer_decoder.norm.bias"),
    ),
    megatron_layer(
        "self_attention.dense",
        [("input_layernorm", "norm1"), ("post_attention_layernorm", "norm3")],
    ),
    attention=[qkv_row("h.{i}.self_attention.query_key_value.{kind}", BLOOM_QKV)],
    made=[row("embedding_layer.position_embed_helper.slopes", (), ALIBI_SLOPES)],
)
# Falcon: embeddings (falcon_40b.py lines 334-342), final norm (395-401); norms two with untied
# layer norms, else one (falcon_180b.py lines 48-127), mlp (falcon_40b.py lines 372-393; dense via
# the attention rules, lines 41-47), the linear layers' biases only with ``use_ffn_bias``; Q, K,
# V fused per KV group (lines 48-68).
_FALCON_LINEAR = (
    ("self_attention.dense", "self_attn.proj_output_dense_layer"),
    ("mlp.dense_h_to_4h", "ffn.ffn.0.linear_layer"),
    ("mlp.dense_4h_to_h", "ffn.ffn.1.linear_layer"),
)
_FALCON_QKV = "h.{i}.self_attention.query_key_value.{kind}"
FALCON = decoder_table(
    (("word_embeddings.weight", EMBED), *GPTJ_STYLE_TOP[1:]),
    (
        *((*pair, "untied") for pair in params([("ln_attn", "norm1"), ("ln_mlp", "norm3")])),
        *((*pair, "!untied") for pair in params([("input_layernorm", "norm1")])),
        *(
            (f"{h}.{k}", f"{c}.{k}", "bias" if k == "bias" else None)
            for h, c in _FALCON_LINEAR
            for k in BOTH
        ),
    ),
    attention=[
        qkv_row(_FALCON_QKV, FALCON_QKV, ("weight",)),
        qkv_row(_FALCON_QKV, FALCON_QKV, ("bias",), when="bias"),
    ],
)
