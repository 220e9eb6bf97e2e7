"""SantaCoder: HF remote-code ``GPT2LMHeadCustomModel`` (``-headless``: ``GPT2CustomModel``,
``config.json`` ``model_type`` "gpt2", ``modeling_gpt2_mq.py``) <-> CS ``GPT2LMHeadModel``
configured as SantaCoder.

Model Zoo: santacoder.py (tag Release_2.10.0). The HF class is not in ``transformers``: the HF
side is what Model Zoo's converter writes. Conv1D weights (transposed), a separate ``q_attn`` and
a fused ``kv_attn`` (one K and one V head, multi-query). ``HF_MODEL_TYPES`` is empty: "gpt2" is
the GPT-2 family's; the pipeline must tell SantaCoder by ``architectures``.

The second half holds Model Zoo's GPT-2 config rules (``ConfigConverter_GPT2Model_HF_CS17`` and
``_CS20``, gpt2_hf_cs.py lines 477-656 and 916-925), shared with ``btlm.py`` and ``jais.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ckpt_migrate.hf.families.starcoder import (
    HF_ATTN_BUFFERS,
    Pair,
    both,
    check_name,
    checked,
    conv1d_join,
    conv1d_split,
    cs_layer,
    cs_tie_map,
    embedding_pairs,
    expect,
    final_norm_copies,
    final_norm_pairs,
    head_dropped,
    head_dropped_map,
    hf_layer,
    hf_prefix,
    layer_norm_pairs,
    lm_head_to_cs,
    lm_head_to_hf,
    pairs_to_cs,
    pairs_to_hf,
    reject_mup,
    tied,
    tied_cs,
    with_defaults,
)
from ckpt_migrate.hf.mapping import MappingError, Out, Shape

NAMES: tuple[str, ...] = ("santacoder", "santacoder-headless")
HF_MODEL_TYPES: tuple[str, ...] = ()

# santacoder.py lines 328-391 (the CS21 class drops ``use_bfloat16``, lines 414-416).
_HF_POST = {
    "attention_head_type": "multiquery",
    "scale_attn_by_inverse_layer_idx": False,
    "scale_attn_weight": True,  # sic: Model Zoo's spelling, HF's default applies
    "auto_map": {
        "AutoConfig": "configuration_gpt2_mq.GPT2CustomConfig",
        "AutoModelForCausalLM": "modeling_gpt2_mq.GPT2LMHeadCustomModel",
    },
    "model_type": "gpt2",
    "reorder_and_upcast_attn": False,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "torch_dtype": "float32",
    "transformers_version": "4.24.0",
    "use_cache": True,
}
_CS_POST = {
    "use_bias_in_output": False,
    "position_embedding_type": "learned",
    "attention_module": "multiquery_attention",
    "softmax_dtype_fp32": False,
    "scale_by_layer_index": False,
    "extra_attention_params": {"num_kv_groups": 1},
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True,
    "loss_scaling": "num_tokens",
}
_LAYER_IDX = (("scale_attn_by_inverse_layer_idx", "scale_qk_dot_by_layer_idx"),)


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: santacoder.py lines 323-391 on top of the GPT-2 rules: ``attention_head_type``
    must be "multiquery"; ``scale_attn_by_inverse_layer_idx`` -> ``scale_qk_dot_by_layer_idx``."""
    check_name(name, NAMES)
    expect(hf_config, "attention_head_type", ("multiquery",), "HF")
    cs = gpt2_config_to_cs(hf_config, GPT2_RENAMES + _LAYER_IDX, ("gpt2",))
    return {**cs, **{k: v for k, v in _CS_POST.items() if k not in cs}}


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: santacoder.py lines 323-391, CS -> HF: ``attention_module`` must be
    "multiquery_attention" and ``extra_attention_params`` ``{num_kv_groups: 1}``; muP configs
    are refused (Model Zoo converts them to sP first, mup.py; not implemented)."""
    headless = check_name(name, NAMES)
    expect(cs_model, "attention_module", ("multiquery_attention",), "CS")
    expect(cs_model, "extra_attention_params", ({"num_kv_groups": 1},), "CS")
    reject_mup(cs_model)
    hf = gpt2_config_to_hf(cs_model, GPT2_RENAMES + _LAYER_IDX, GPT2_CS_FIXED)
    arch = "GPT2CustomModel" if headless else "GPT2LMHeadCustomModel"
    return {**hf, "architectures": [arch], **{k: v for k, v in _HF_POST.items() if k not in hf}}


def _pairs(p: str, layers: int) -> list[Pair]:
    """Conv1D weights transposed (``transpose_key_if_2D``, santacoder.py lines 42-55 for
    ``c_proj`` and ``q_attn``, the inherited GPT-2 ``ffn_converter`` for the MLP)."""
    pairs = embedding_pairs(p, learned=True) + final_norm_pairs(p)
    for i in range(layers):
        h, c = hf_layer(p, i), cs_layer(i)
        pairs += layer_norm_pairs(h, c)
        pairs += both(f"{h}attn.q_attn", f"{c}self_attn.proj_q_dense_layer", True)
        pairs += both(f"{h}attn.c_proj", f"{c}self_attn.proj_output_dense_layer", True)
        pairs += both(f"{h}mlp.c_fc", f"{c}ffn.ffn.0.linear_layer", True)
        pairs += both(f"{h}mlp.c_proj", f"{c}ffn.ffn.1.linear_layer", True)
    return pairs


def plan_to_cs(hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str) -> list[Out]:
    """CS tensors; ``kv_attn`` is transposed and chunked in two (santacoder.py lines 98-119).
    The HF ``attn.bias``/``attn.masked_bias`` buffers are dropped (gpt2_hf_cs.py 304-309).
    ``ln_f.*`` is written besides ``transformer_decoder.norm.*``, as Model Zoo does
    (:func:`~ckpt_migrate.hf.families.starcoder.final_norm_copies`); the head as
    :func:`~ckpt_migrate.hf.families.starcoder.lm_head_to_cs`."""
    headless = check_name(name, NAMES)
    p = hf_prefix(headless)
    layers = hf_config["n_layer"]
    plan = pairs_to_cs(_pairs(p, layers))
    for i in range(layers):
        for suffix in ("weight", "bias"):
            src, c = f"{hf_layer(p, i)}attn.kv_attn.{suffix}", cs_layer(i)
            for j, x in enumerate("kv"):
                plan.append(conv1d_split(src, f"{c}self_attn.proj_{x}_dense_layer.{suffix}", j, 2))
    plan += final_norm_copies(p) + lm_head_to_cs(hf, p, tied(hf_config), headless)
    return checked(plan, hf, HF_ATTN_BUFFERS)


def plan_to_hf(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> list[Out]:
    """HF tensors; K and V fused into ``kv_attn`` (santacoder.py lines 121-154), and the
    ``attn.bias`` (uint8 causal mask ``[1, 1, P, P]``) and ``attn.masked_bias`` (-1e4) buffers
    generated as lines 156-168 do."""
    headless = check_name(name, NAMES)
    p = hf_prefix(headless)
    hf_config = config_to_hf(cs_model, name)
    layers, positions = hf_config["n_layer"], hf_config["n_positions"]
    plan = pairs_to_hf(_pairs(p, layers))
    for i in range(layers):
        h, c = hf_layer(p, i), cs_layer(i)
        for suffix in ("weight", "bias"):
            kv = [f"{c}self_attn.proj_{x}_dense_layer.{suffix}" for x in "kv"]
            plan.append(conv1d_join(kv, f"{h}attn.kv_attn.{suffix}"))
        plan += causal_mask_buffers(f"{h}attn.", positions)
    plan += lm_head_to_hf(cs, p, tied_cs(cs_model), headless)
    return checked(plan, cs, head_dropped(headless), cs_tie_map(cs, tied_cs(cs_model)))


def cs_ties(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """The pipeline hook: ``ln_f.*`` and a tied ``lm_head`` when the CS file has them
    (:func:`~ckpt_migrate.hf.families.starcoder.cs_tie_map`)."""
    check_name(name, NAMES)
    return cs_tie_map(cs, tied_cs(cs_model))


def cs_dropped(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """The pipeline hook: an untied headless ``lm_head`` (Model Zoo's converter note)."""
    return head_dropped_map(cs, tied_cs(cs_model), check_name(name, NAMES))


def causal_mask_buffers(attn: str, positions: int) -> list[Out]:
    """GPT-2's ``bias`` and ``masked_bias`` buffers, as Model Zoo writes them."""

    def mask() -> np.ndarray:
        return np.tril(np.ones((positions, positions), np.uint8)).reshape(1, 1, positions, -1)

    return [
        Out(f"{attn}bias", (), mask, shape=(1, 1, positions, positions), note="generated"),
        Out(f"{attn}masked_bias", (), lambda: np.array(-1e4, np.float32), shape=()),
    ]


# ---- GPT-2 config rules, shared by btlm.py and jais.py ---------------------------------------

# (HF key, CS key) of the rules that only rename (gpt2_hf_cs.py lines 486-573).
GPT2_RENAMES: tuple[tuple[str, str], ...] = (
    ("vocab_size", "vocab_size"),
    ("embd_pdrop", "embedding_dropout_rate"),
    ("tie_word_embeddings", "share_embedding_weights"),
    ("n_embd", "hidden_size"),
    ("n_head", "num_heads"),
    ("n_layer", "num_hidden_layers"),
    ("n_positions", "max_position_embeddings"),
    ("n_inner", "filter_size"),
    ("activation_function", "nonlinearity"),
    ("attn_pdrop", "attention_dropout_rate"),
    ("resid_pdrop", "dropout_rate"),
    ("rotary_dim", "rotary_dim"),
    ("layer_norm_epsilon", "layer_norm_epsilon"),
    ("initializer_range", "initializer_range"),
)
# CS fields accepted with one value only (lines 487-585 and 920-923).
GPT2_CS_FIXED: dict[str, Any] = {
    "norm_type": "layernorm",
    "position_embedding_type": "learned",
    "use_position_embedding": True,
    "embedding_layer_norm": False,
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True,
    "use_bias_in_output": False,
    "fixed_sparse_attention": None,
    "norm_first": True,
    "use_ff_layer1_dropout": False,
}


def gpt2_config_to_cs(
    hf_config: Mapping[str, Any], renames: Sequence[tuple[str, str]], model_types: Sequence[str]
) -> dict[str, Any]:
    """GPT-2 rules HF -> CS: ``tie_word_embeddings`` defaults to true (lines 596-600),
    ``n_inner: null`` becomes ``4 * n_embd`` (lines 648-650), ``scale_attn_weights`` gives
    ``attention_type`` (lines 618-623); ``reorder_and_upcast_attn`` and (unless renamed)
    ``scale_attn_by_inverse_layer_idx`` must be false (lines 586-593)."""
    hf = with_defaults(hf_config, {"tie_word_embeddings": True})
    expect(hf, "model_type", model_types, "HF")
    expect(hf, "reorder_and_upcast_attn", (False,), "HF")
    if "scale_attn_by_inverse_layer_idx" not in dict(renames):
        expect(hf, "scale_attn_by_inverse_layer_idx", (False,), "HF")
    if hf.get("n_inner") is None:
        hf["n_inner"] = 4 * hf["n_embd"]
    cs = {c: hf[h] for h, c in renames if h in hf}
    if "scale_attn_weights" in hf:
        cs["attention_type"] = "scaled_dot_product" if hf["scale_attn_weights"] else "dot_product"
    return {**cs, "use_bias_in_output": False}


def gpt2_config_to_hf(
    cs_model: Mapping[str, Any], renames: Sequence[tuple[str, str]], fixed: Mapping[str, Any]
) -> dict[str, Any]:
    """GPT-2 rules CS -> HF: fixed-value fields asserted, the dropout rates default to
    ``dropout_rate`` (lines 651-655), ``attention_type`` gives ``scale_attn_weights`` (lines
    624-638)."""
    cs = with_defaults(cs_model, {"share_embedding_weights": True})
    for key, value in fixed.items():
        expect(cs, key, (value,), "CS")
    for key in ("embedding_dropout_rate", "attention_dropout_rate"):
        if key not in cs and "dropout_rate" in cs:
            cs[key] = cs["dropout_rate"]
    hf = {h: cs[c] for h, c in renames if c in cs}
    if "attention_type" in cs:
        if cs["attention_type"] not in ("scaled_dot_product", "dot_product"):
            raise MappingError(f"attention_type={cs['attention_type']!r} is not supported")
        hf["scale_attn_weights"] = cs["attention_type"] == "scaled_dot_product"
    return hf
