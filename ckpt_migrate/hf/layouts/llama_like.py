"""The tensor tables of the LLaMA-like layout: LLaMA and Mistral (Model Zoo, tag
Release_2.10.0: ``llama.py``, ``mistral.py``), Mixtral (``mixtral.py``, the LLaMA rules with
experts) and Gemma 2 (``gemma2.py``, the LLaMA rules with offset norms and more of them).

``{p}`` is ``model.`` for the ``*ForCausalLM`` classes, nothing for the base models (Model Zoo
llama.py lines 502-517: ``EquivalentSubkey("model.", "")`` only in the LM-head converter).

One context, :func:`decoder`, reads the config for all of them; each record declares what its
table needs beyond LLaMA's (Mixtral's experts, Gemma 2's attention biases).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckpt_migrate.catalogue.config import CS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.config_llama import kv_heads_cs
from ckpt_migrate.hf.experts import EXPERTS
from ckpt_migrate.hf.heads import Head, lm_head
from ckpt_migrate.hf.ops import NORM_OFFSET, RENAME, SECOND_NAME, Ctx, Op, rotary, second_name
from ckpt_migrate.hf.table import TO_CS, TO_HF, Group, Query, Row, Table, inputs_present, row

L, H = "transformer_decoder.layers.{i}.", "{p}layers.{i}."  # one layer, CS and HF
EMBED = "embedding_layer.word_embeddings.weight"
Q_ROTARY, K_ROTARY = rotary("heads"), rotary("kv")  # K has the key/value heads
# The head of LLaMA, Mistral, Mixtral and Gemma 2: a tied head the HF file keeps is checked equal
# to the embeddings, a fresh one takes their shape and dtype (Model Zoo llama.py lines 411-451).
LLAMA_HEAD = lm_head("LLaMA LM head", Head(tie="checked", fresh="like"))

# One LLaMA decoder layer: Model Zoo llama.py lines 42-69 and 342-390 (Q and K rows permuted
# for rotary, lines 157-294).
ATTENTION_AND_NORMS: tuple[Row, ...] = (
    row(L + "self_attn.proj_q_dense_layer.weight", H + "self_attn.q_proj.weight", Q_ROTARY),
    row(L + "self_attn.proj_k_dense_layer.weight", H + "self_attn.k_proj.weight", K_ROTARY),
    row(L + "self_attn.proj_v_dense_layer.weight", H + "self_attn.v_proj.weight"),
    row(L + "self_attn.proj_output_dense_layer.weight", H + "self_attn.o_proj.weight"),
    row(L + "norm1.weight", H + "input_layernorm.weight"),
    row(L + "norm3.weight", H + "post_attention_layernorm.weight"),
)
MLP: tuple[Row, ...] = (
    row(L + "ffn.ffn.0.linear_layer.weight", H + "mlp.up_proj.weight"),
    row(L + "ffn.ffn.0.linear_layer_for_glu.weight", H + "mlp.gate_proj.weight"),
    row(L + "ffn.ffn.1.linear_layer.weight", H + "mlp.down_proj.weight"),
)


def llama_table(layer: Sequence[Row], norm: Op = RENAME) -> Table:
    """The embeddings, the final norm (through ``norm``; on import also under its second CS
    name ``ln_f``, Model Zoo llama.py lines 395-409), the head
    (:data:`LLAMA_HEAD`), then each layer's ``layer`` rows. Every input
    must exist (refused naming five); source tensors no row reads are for the pipeline to
    report."""
    final = row("transformer_decoder.norm.weight", "{p}norm.weight", norm)
    copy = row(
        "ln_f.weight", "{p}norm.weight", SECOND_NAME if norm is RENAME else second_name(norm)
    )
    heads = row((EMBED, "lm_head.weight"), ("{p}embed_tokens.weight", "lm_head.weight"), LLAMA_HEAD)
    return Table(
        groups={
            "embeddings": Group((row(EMBED, "{p}embed_tokens.weight"),)),
            "final norm": Group((final,)),
            "final norm's second name": Group((copy,)),
            "head": Group((heads,)),
            "layers": Group(tuple(layer), per_layer=True),
        },
        order={
            TO_HF: ("embeddings", "final norm", "head", "layers"),
            TO_CS: ("embeddings", "final norm", "final norm's second name", "head", "layers"),
        },
        check=inputs_present("missing tensors: {names}", most=5),
    )


LLAMA = llama_table(ATTENTION_AND_NORMS + MLP)
# Gemma 2: attention with optional biases (Q/K rows and biases permuted for rotary, llama.py
# lines 157-294), the MLP gate first, four norms with HF's offset (Model Zoo gemma2.py lines
# 56-190).
GEMMA2 = llama_table(
    (
        *(
            row(
                f"{L}self_attn.proj_{cs}_dense_layer.{kind}",
                f"{H}self_attn.{x}_proj.{kind}",
                op,
                when=when,
            )
            for x, cs, op in (
                ("q", "q", Q_ROTARY),
                ("k", "k", K_ROTARY),
                ("v", "v", RENAME),
                ("o", "output", RENAME),
            )
            for kind, when in (("weight", None), ("bias", "bias"))
        ),
        row(L + "ffn.ffn.0.linear_layer_for_glu.weight", H + "mlp.gate_proj.weight"),
        row(L + "ffn.ffn.0.linear_layer.weight", H + "mlp.up_proj.weight"),
        row(L + "ffn.ffn.1.linear_layer.weight", H + "mlp.down_proj.weight"),
        row(L + "norm1.weight", H + "input_layernorm.weight", NORM_OFFSET),
        row(L + "norm1_post.weight", H + "post_attention_layernorm.weight", NORM_OFFSET),
        row(L + "norm3.weight", H + "pre_feedforward_layernorm.weight", NORM_OFFSET),
        row(L + "norm3_post.weight", H + "post_feedforward_layernorm.weight", NORM_OFFSET),
    ),
    NORM_OFFSET,
)
# Mixtral: LLaMA's attention and norms, then the layer's router and experts (:data:`EXPERTS`).
MIXTRAL = llama_table((*ATTENTION_AND_NORMS, row(L, H, EXPERTS)))


def decoder(
    q: Query,
    *,
    family: str = "LLaMA",
    experts: bool = False,
    bias: bool = False,
) -> Ctx:
    """The context of a :func:`llama_table`: the heads and key/value heads (rotary rows are
    permuted per head; llama.py lines 157-294), the prefix, whether the head is tied
    (``share_embedding_weights``) and the model headless, from the CS config the record's table
    accepted (export) or the one it gives (import). With ``experts``, their number and on
    import the FFN width (Mixtral: transformers 5's fused ``gate_up_proj`` stacks gate and up
    rows, mixtral.py lines 172-300); with ``bias``, whether the attention has biases (Gemma 2,
    gemma2.py lines 56-190). ``family`` names it when its attention is refused."""
    if q.to_hf:
        cfg = config_table.source(CS, q.config, q.name)
    else:
        cfg = config_table.to_cs(q.config, q.name)
    dims: dict[str, Any] = {}
    if experts:
        dims["experts"] = int(cfg["moe"]["num_experts"])
        if not q.to_hf:
            dims["inter"] = int(cfg["filter_size"])
    dims |= {"heads": cfg["num_heads"], "kv": kv_heads_cs(cfg, family)}
    headless = q.name.endswith("-headless")
    flags = {"tied"} if cfg["share_embedding_weights"] else set()
    flags |= ({"headless"} if headless else set()) | (
        {"bias"} if bias and cfg["use_projection_bias_in_attention"] else set()
    )
    prefix = "" if headless else "model."
    return Ctx(q.shapes, cfg["num_hidden_layers"], prefix, frozenset(flags), dims)
