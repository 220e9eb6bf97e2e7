"""The tensor tables of the GPT-2-like layout: GPT-2 itself (Model Zoo:
``src/cerebras/modelzoo/tools/checkpoint_converters/gpt2_hf_cs.py`` at tag Release_2.10.0,
``Converter_GPT2Model_HF_CS17`` lines 45-475 and the ``*_HF_CS21`` converters, lines
1035-1130), and StarCoder, SantaCoder, BTLM and JAIS, whose Model Zoo converters inherit those
GPT-2 rules (starcoder.py line 274, santacoder.py line 207, btlm_hf_cs.py lines 36-38,
jais_hf_cs.py lines 36-38) and differ in the attention and the MLP.

``{p}`` is the HF body's prefix: ``transformer.`` for the ``*LMHeadModel``/``*ForCausalLM``
classes, none for the headless ``*Model`` ones.

Two contexts read the config for them: GPT-2's own (:func:`gpt2`, which checks every tensor's
shape against the config), and :func:`on_layout` for the families built on the GPT-2 rules,
whose records list the ``features`` of their HF config it reads (:data:`FEATURES`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckpt_migrate.hf import config_table, unconverted
from ckpt_migrate.hf.config_ops import swiglu
from ckpt_migrate.hf.heads import Head, lm_head
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
from ckpt_migrate.hf.table import (
    BOTH,
    TO_CS,
    TO_HF,
    Feature,
    Group,
    Query,
    Row,
    Table,
    checked,
    pair,
    row,
)
from ckpt_migrate.hf.table import features as read_features

L, H = "transformer_decoder.layers.{i}.", "{p}h.{i}."  # one layer, CS and HF
EMBEDDING = "embedding_layer.word_embeddings.weight"
HEADS = ((EMBEDDING, "lm_head.weight"), ("{p}wte.weight", "lm_head.weight"))  # CS, HF
# HF attention buffers the GPT-2 rules drop (gpt2_hf_cs.py lines 304-309, exists="left").
HF_ATTN_BUFFERS = r"(?:transformer\.)?h\.\d+\.attn\.(?:masked_bias|bias)"
# GPT-2's own head (gpt2_hf_cs.py): a tied head imported as the embedding under a second name
# (lines 768-790), a fresh one float32 of the config's shape (lines 367-394).
GPT2_HEAD = lm_head(
    "GPT-2 LM head",
    Head(missing="lm_head.weight is missing and tie_word_embeddings is false"),
)
# The head of the families built on the GPT-2 layout (StarCoder, SantaCoder, BTLM, JAIS): the
# head row writes the HF embedding, a tied head is imported as a copy of it (gpt2_hf_cs.py
# lines 777-781 and 386-387), a fresh one takes its shape and dtype (lines 388-390).
LAYOUT_HEAD = lm_head(
    "GPT-2 layout LM head",
    Head(True, "copy", "like", "lm_head.weight: missing and tie_word_embeddings is false"),
)


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
# no longer has them); the head (:data:`GPT2_HEAD`).
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
    (:data:`LAYOUT_HEAD`, which writes ``wte`` on export). Checked: a
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


# --------------------------------------------------------------------------- GPT-2's context


def _layers(cfg: Mapping[str, Any], key: str) -> int:
    if not isinstance(cfg.get(key), int):
        raise MappingError(f"the config has no integer {key}")
    return int(cfg[key])


def _dims(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[int, ...]:
    try:
        return tuple(int(cfg[k]) for k in keys)
    except (KeyError, TypeError, ValueError):
        raise MappingError(f"the config needs integer {', '.join(keys)}") from None


def _check_shapes(have: Mapping[str, Shape], want: Mapping[str, Shape]) -> None:
    """A tensor whose shape contradicts the config (a wrong config, or another model)."""
    for key, shape in want.items():
        if key in have and tuple(have[key]) != shape:
            raise MappingError(f"{key} has shape {tuple(have[key])}, the config implies {shape}")


def _cs_shapes(cs_model: Mapping[str, Any], layers: int) -> dict[str, Shape]:
    v, h = _dims(cs_model, ("vocab_size", "hidden_size"))
    f = int(cs_model.get("filter_size") or 4 * h)
    out = {EMBEDDING: (v, h), "lm_head.weight": (v, h)}
    if cs_model.get("max_position_embeddings") is not None:
        p = int(cs_model["max_position_embeddings"])
        out["embedding_layer.position_embeddings.embed.weight"] = (p, h)
    for i in range(layers):
        pre = f"transformer_decoder.layers.{i}."
        for x in ("q", "k", "v", "output"):
            out[f"{pre}self_attn.proj_{x}_dense_layer.weight"] = (h, h)
            out[f"{pre}self_attn.proj_{x}_dense_layer.bias"] = (h,)
        for norm in ("norm1", "norm3"):
            out[f"{pre}{norm}.weight"] = out[f"{pre}{norm}.bias"] = (h,)
        out[f"{pre}ffn.ffn.0.linear_layer.weight"] = (f, h)
        out[f"{pre}ffn.ffn.0.linear_layer.bias"] = (f,)
        out[f"{pre}ffn.ffn.1.linear_layer.weight"] = (h, f)
        out[f"{pre}ffn.ffn.1.linear_layer.bias"] = (h,)
    out["transformer_decoder.norm.weight"] = out["transformer_decoder.norm.bias"] = (h,)
    return out


def _hf_shapes(hf_config: Mapping[str, Any], layers: int, pre: str) -> dict[str, Shape]:
    v, h, p = _dims(hf_config, ("vocab_size", "n_embd", "n_positions"))
    f = int(hf_config.get("n_inner") or 4 * h)
    out = {f"{pre}wte.weight": (v, h), f"{pre}wpe.weight": (p, h), "lm_head.weight": (v, h)}
    for i in range(layers):
        b = f"{pre}h.{i}."
        out |= {f"{b}attn.c_attn.weight": (h, 3 * h), f"{b}attn.c_attn.bias": (3 * h,)}
        out |= {f"{b}attn.c_proj.weight": (h, h), f"{b}attn.c_proj.bias": (h,)}
        out |= {f"{b}mlp.c_fc.weight": (h, f), f"{b}mlp.c_fc.bias": (f,)}
        out |= {f"{b}mlp.c_proj.weight": (f, h), f"{b}mlp.c_proj.bias": (h,)}
        for norm in ("ln_1", "ln_2"):
            out[f"{b}{norm}.weight"] = out[f"{b}{norm}.bias"] = (h,)
    out[f"{pre}ln_f.weight"] = out[f"{pre}ln_f.bias"] = (h,)
    return out


def gpt2(q: Query, *, headless: str) -> Ctx:
    """What the :data:`GPT2` table reads: the layers, the prefix (the ``headless`` name's
    class has none), whether the head is tied and the model headless, the shape of a new head;
    MappingError when a tensor's shape contradicts the config."""
    config, pre = q.config, hf_prefix(q.name == headless)
    if q.to_hf:
        layers = _layers(config, "num_hidden_layers")
        _check_shapes(q.shapes, _cs_shapes(config, layers))
        tied, dims = config.get("share_embedding_weights", True), {}
    else:
        layers = _layers(config, "n_layer")
        _check_shapes(q.shapes, _hf_shapes(config, layers, pre))
        tied = config.get("tie_word_embeddings", True)
        dims = {"head_shape": (int(config["vocab_size"]), int(config["n_embd"]))}
    flags = {"tied"} if tied else set()
    flags |= {"headless"} if q.name == headless else set()
    return Ctx(q.shapes, layers, pre, frozenset(flags), dims)


# ------------------------------------------------- the families built on the GPT-2 rules


def _learned(q: Query, hf: Mapping[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """Learned positions, ``wpe`` (starcoder.py lines 696-707, santacoder.py)."""
    return {"learned"}, {}


def _multi_query(q: Query, hf: Mapping[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """StarCoder's attention: multi-query (``mq``) or not, the heads and the rows of Q, K and V
    in an MQA ``c_attn`` (starcoder.py lines 98-168); on import MappingError when a ``c_attn``
    does not pack Q, K and V."""
    embed, heads, mq = hf["n_embd"], hf["n_head"], bool(hf["multi_query"])
    d_head = embed // heads
    if not q.to_hf:
        rows = embed + 2 * d_head if mq else 3 * embed
        pre = hf_prefix(q.name.endswith("-headless"))
        for i in range(hf["n_layer"]):
            for suffix in BOTH:
                src = f"{pre}h.{i}.attn.c_attn.{suffix}"
                if src in q.shapes and q.shapes[src][0] != rows:
                    raise MappingError(
                        f"{src}: {q.shapes[src]} does not pack Q, K and V ({rows} rows)"
                    )
    dims = {"heads": heads, "rows": (0, embed, embed + d_head, embed + 2 * d_head)}
    return ({"mq"} if mq else set()), dims


def _mask_positions(q: Query, hf: Mapping[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """SantaCoder's generated causal mask: its positions, on export (santacoder.py lines
    156-168)."""
    return set(), ({"positions": hf["n_positions"]} if q.to_hf else {})


def _alibi(q: Query, hf: Mapping[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """BTLM's ALiBi slopes (``relative_pe.slopes`` -> ``embedding_layer.position_embed_helper
    .slopes``, btlm_hf_cs.py lines 386-394) or learned positions."""
    alibi = hf.get("position_embedding_type", "learned") == "alibi"
    return ({"alibi"} if alibi else {"learned"}), {}


def _swiglu(q: Query, hf: Mapping[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """BTLM's SwiGLU second input ``mlp.c_fc2`` (btlm_hf_cs.py lines 50-60)."""
    return ({"glu"} if swiglu(hf.get("activation_function", "gelu_new")) else set()), {}


FEATURES: dict[str, Feature] = {
    "learned positions": _learned,
    "multi-query": _multi_query,
    "causal mask": _mask_positions,
    "alibi": _alibi,
    "swiglu": _swiglu,
}


def on_layout(
    q: Query, *, features: Sequence[str], hf_defaults: Mapping[str, Any] | None = None
) -> Ctx:
    """The context of a table :func:`on_gpt2_layout` builds (StarCoder, SantaCoder, BTLM,
    JAIS): the layers and the record's ``features`` (:data:`FEATURES`), read from the HF
    config (on export the one the record's config table gives) over ``hf_defaults``; the head
    tied per the config (``share_embedding_weights`` of the CS config on export,
    ``tie_word_embeddings`` of the HF one on import). On import the HF attention buffers are
    dropped (gpt2_hf_cs.py lines 304-309), on export a headless model's CS ``lm_head`` (Model
    Zoo's ``*Model_HF_CS21`` note), and ``ln_f.*`` and a tied ``lm_head`` are ties
    (the record's ties, :func:`~ckpt_migrate.hf.unconverted.cs_ties`)."""
    headless = q.name.endswith("-headless")
    hf = config_table.to_hf(q.config, q.name) if q.to_hf else q.config
    hf = {**(hf_defaults or {}), **hf}
    flags, dims = read_features(q, hf, features, FEATURES)
    key = "share_embedding_weights" if q.to_hf else "tie_word_embeddings"
    tied = bool(q.config.get(key, True))
    flags |= ({"tied"} if tied else set()) | ({"headless"} if headless else set())
    if q.to_hf:
        dropped = r"lm_head\.weight" if headless else None
        ties = unconverted.cs_ties(q.shapes, q.config, q.name)
    else:
        dropped, ties = HF_ATTN_BUFFERS, {}
    pre = hf_prefix(headless)
    return Ctx(q.shapes, hf["n_layer"], pre, frozenset(flags), dims, dropped, ties)
