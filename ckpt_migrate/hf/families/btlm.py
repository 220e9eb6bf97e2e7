"""BTLM: HF remote-code ``BTLMLMHeadModel`` (``-headless``: ``BTLMModel``, ``model_type`` "btlm",
``cerebras/btlm-3b-8k-base``) <-> CS ``GPT2LMHeadModel`` configured as BTLM.

Model Zoo: btlm_hf_cs.py (tag Release_2.10.0). GPT-2 layout (Conv1D weights, transposed; fused
``c_attn``), plus ALiBi slopes, a SwiGLU second input ``c_fc2`` and muP fields in the config,
which HF BTLM implements natively (no muP -> sP rescaling, ``attempt_mup_to_sp`` is false). The
HF class is not in ``transformers``. ``jais.py`` reuses this module's functions (Model Zoo's
jais_hf_cs.py is the same converter with other names).

muP: ``output_logits_scale = mup_output_alpha * mup_width_scale``; ``mup_width_scale`` is the
CS *optimizer*'s ``adjust_learning_rate.decoder_kernel`` (btlm_hf_cs.py lines 203-283).
:func:`cs_optimizer` gives that section; :func:`config_to_hf` reads ``decoder_kernel`` from the
model section when the pipeline copies it there, as Model Zoo does (lines 209-228), else 1.0
(Model Zoo's default, lines 186-187; HF logits are the same: BTLM multiplies the two).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_migrate.hf.families.santacoder import (
    GPT2_CS_FIXED,
    GPT2_RENAMES,
    gpt2_config_to_cs,
    gpt2_config_to_hf,
)
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
    tied,
    tied_cs,
)
from ckpt_migrate.hf.mapping import MappingError, Out, Shape


@dataclass(frozen=True)
class Spec:
    """What differs between BTLM and JAIS."""

    names: tuple[str, ...]
    model_type: str
    architectures: tuple[str, str]  # (LM head class, headless class)
    hf_post: Mapping[str, Any]


BTLM = Spec(
    names=("btlm", "btlm-headless"),
    model_type="btlm",
    architectures=("BTLMLMHeadModel", "BTLMModel"),
    # btlm_hf_cs.py lines 189-201.
    hf_post={
        "use_cache": True,
        "auto_map": {
            "AutoConfig": "cerebras/btlm-3b-8k-base--configuration_btlm.BTLMConfig",
            "AutoModel": "cerebras/btlm-3b-8k-base--modeling_btlm.BTLMModel",
            "AutoModelForCausalLM": "cerebras/btlm-3b-8k-base--modeling_btlm.BTLMLMHeadModel",
        },
    },
)
NAMES: tuple[str, ...] = BTLM.names
HF_MODEL_TYPES: tuple[str, ...] = ("btlm",)

# (HF, CS) renames of btlm_hf_cs.py lines 150-182, ahead of the GPT-2 rules.
RENAMES: tuple[tuple[str, str], ...] = (
    ("position_embedding_type", "position_embedding_type"),
    ("mup_scale_qk_dot_by_d", "scale_qk_dot_by_d"),
    ("mup_embeddings_scale", "embeddings_scale"),
    ("scale_attn_by_inverse_layer_idx", "scale_qk_dot_by_layer_idx"),
    *GPT2_RENAMES,
)
CS_FIXED = {k: v for k, v in GPT2_CS_FIXED.items() if k != "position_embedding_type"}
POSITIONS = ("alibi", "learned")  # what the HF class implements
# CS 2.3+ muP fields (mup.py lines 106-126) the BTLM/JAIS rules do not map.
NEW_MUP = ("output_logits_alpha", "scale_output_logits_by_d", "attention_logits_alpha")


def config_to_cs(hf_config: Mapping[str, Any], name: str, spec: Spec = BTLM) -> dict[str, Any]:
    """Model Zoo: btlm_hf_cs.py lines 141-283 and 299-351 on top of the GPT-2 rules:
    ``alibi_scaling`` -> ``pos_scaling_factor`` (null -> 1.0, fixed linear factor only),
    ``mup_output_alpha * mup_width_scale`` -> ``output_logits_scale``, muP and ALiBi fields
    renamed."""
    check_name(name, spec.names)
    hf = {"mup_width_scale": 1.0, "alibi_scaling": None, **hf_config}
    cs = gpt2_config_to_cs(hf, RENAMES, (spec.model_type,))
    _check_positions(cs.get("position_embedding_type", "learned"))
    scaling = hf["alibi_scaling"]
    if scaling is not None and scaling.get("train_seq_len") is not None:
        raise MappingError("alibi_scaling.train_seq_len (dynamic linear scaling) is not supported")
    cs["pos_scaling_factor"] = 1.0 if scaling is None else scaling["factor"]
    if "mup_output_alpha" in hf:
        cs["output_logits_scale"] = hf["mup_output_alpha"] * hf["mup_width_scale"]
    return cs


def cs_optimizer(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """The CS ``optimizer`` fields BTLM's muP needs (btlm_hf_cs.py lines 252-259)."""
    return {"adjust_learning_rate": {"decoder_kernel": hf_config.get("mup_width_scale", 1.0)}}


def config_to_hf(cs_model: Mapping[str, Any], name: str, spec: Spec = BTLM) -> dict[str, Any]:
    """Model Zoo: btlm_hf_cs.py lines 141-351, CS -> HF: ``pos_scaling_factor`` 1.0 -> null,
    else ``{type: linear, factor}``; ``output_logits_scale / decoder_kernel`` ->
    ``mup_output_alpha`` and ``decoder_kernel`` -> ``mup_width_scale`` (lines 263-280)."""
    headless = check_name(name, spec.names)
    cs = {"decoder_kernel": 1.0, "pos_scaling_factor": 1.0, **cs_model}
    found = [k for k in NEW_MUP if cs.get(k) is not None]
    found += [k for k, v in cs.items() if k.startswith("mup_base_") and v is not None]
    if found:
        raise MappingError(f"CS 2.3+ muP field {found[0]} is not supported for {name}")
    _check_positions(cs.get("position_embedding_type", "learned"))
    _glu(cs.get("nonlinearity", "gelu"))
    hf = gpt2_config_to_hf(cs, RENAMES, CS_FIXED)
    factor = cs["pos_scaling_factor"]
    hf["alibi_scaling"] = None if factor == 1.0 else {"type": "linear", "factor": factor}
    if "output_logits_scale" in cs:
        hf["mup_output_alpha"] = cs["output_logits_scale"] / cs["decoder_kernel"]
        hf["mup_width_scale"] = cs["decoder_kernel"]
    arch = spec.architectures[1 if headless else 0]
    post = {"model_type": spec.model_type, **spec.hf_post}
    return {**hf, "architectures": [arch], **{k: v for k, v in post.items() if k not in hf}}


def _check_positions(kind: str) -> None:
    if kind not in POSITIONS:
        raise MappingError(f"position_embedding_type={kind!r} is not supported (only {POSITIONS})")


def _pairs(p: str, layers: int, alibi: bool, glu: bool) -> list[Pair]:
    """Conv1D weights transposed (GPT-2 ``transpose_key_if_2D``); ``relative_pe.slopes`` ->
    ``embedding_layer.position_embed_helper.slopes`` (lines 386-394) with ALiBi, ``wpe`` without;
    ``mlp.c_fc2`` -> ``ffn.ffn.0.linear_layer_for_glu`` (lines 50-60) for SwiGLU."""
    pairs = embedding_pairs(p, learned=not alibi) + final_norm_pairs(p)
    if alibi:
        pairs.append(
            (f"{p}relative_pe.slopes", "embedding_layer.position_embed_helper.slopes", False)
        )
    for i in range(layers):
        h, c = hf_layer(p, i), cs_layer(i)
        pairs += layer_norm_pairs(h, c)
        pairs += both(f"{h}attn.c_proj", f"{c}self_attn.proj_output_dense_layer", True)
        pairs += both(f"{h}mlp.c_fc", f"{c}ffn.ffn.0.linear_layer", True)
        if glu:
            pairs += both(f"{h}mlp.c_fc2", f"{c}ffn.ffn.0.linear_layer_for_glu", True)
        pairs += both(f"{h}mlp.c_proj", f"{c}ffn.ffn.1.linear_layer", True)
    return pairs


def _glu(activation: str) -> bool:
    if activation.endswith("glu") and activation != "swiglu":
        raise MappingError(f"nonlinearity={activation!r} is not supported (HF has swiglu only)")
    return activation == "swiglu"


def plan_to_cs(
    hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str, spec: Spec = BTLM
) -> list[Out]:
    """CS tensors; ``c_attn`` is transposed and chunked into Q, K, V (GPT-2 attention rules,
    gpt2_hf_cs.py lines 113-151, with ``generate_hf_biases=False``, btlm_hf_cs.py line 65).
    ``ln_f.*`` is written besides ``transformer_decoder.norm.*``, as Model Zoo does
    (:func:`~ckpt_migrate.hf.families.starcoder.final_norm_copies`); the head as
    :func:`~ckpt_migrate.hf.families.starcoder.lm_head_to_cs`."""
    headless = check_name(name, spec.names)
    p = hf_prefix(headless)
    layers = hf_config["n_layer"]
    alibi = hf_config.get("position_embedding_type", "learned") == "alibi"
    glu = _glu(hf_config.get("activation_function", "gelu_new"))
    plan = pairs_to_cs(_pairs(p, layers, alibi, glu))
    for i in range(layers):
        for suffix in ("weight", "bias"):
            src = f"{hf_layer(p, i)}attn.c_attn.{suffix}"
            for j, x in enumerate("qkv"):
                dst = f"{cs_layer(i)}self_attn.proj_{x}_dense_layer.{suffix}"
                plan.append(conv1d_split(src, dst, j, 3))
    plan += final_norm_copies(p) + lm_head_to_cs(hf, p, tied(hf_config), headless)
    return checked(plan, hf, HF_ATTN_BUFFERS)


def plan_to_hf(
    cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str, spec: Spec = BTLM
) -> list[Out]:
    """HF tensors; Q, K, V concatenated and transposed into ``c_attn`` (gpt2_hf_cs.py lines
    153-188); no ``attn.bias`` buffers are generated (``generate_hf_biases=False``)."""
    headless = check_name(name, spec.names)
    p = hf_prefix(headless)
    hf_config = config_to_hf(cs_model, name, spec)
    layers = hf_config["n_layer"]
    alibi = hf_config.get("position_embedding_type", "learned") == "alibi"
    glu = _glu(hf_config.get("activation_function", "gelu_new"))
    plan = pairs_to_hf(_pairs(p, layers, alibi, glu))
    for i in range(layers):
        for suffix in ("weight", "bias"):
            qkv = [f"{cs_layer(i)}self_attn.proj_{x}_dense_layer.{suffix}" for x in "qkv"]
            plan.append(conv1d_join(qkv, f"{hf_layer(p, i)}attn.c_attn.{suffix}"))
    plan += lm_head_to_hf(cs, p, tied_cs(cs_model), headless)
    return checked(plan, cs, head_dropped(headless), cs_tie_map(cs, tied_cs(cs_model)))


def cs_ties(
    cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str, spec: Spec = BTLM
) -> dict[str, str]:
    """The pipeline hook: ``ln_f.*`` and a tied ``lm_head`` when the CS file has them
    (:func:`~ckpt_migrate.hf.families.starcoder.cs_tie_map`)."""
    check_name(name, spec.names)
    return cs_tie_map(cs, tied_cs(cs_model))


def cs_dropped(
    cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str, spec: Spec = BTLM
) -> dict[str, str]:
    """The pipeline hook: an untied headless ``lm_head`` (Model Zoo's converter note)."""
    return head_dropped_map(cs, tied_cs(cs_model), check_name(name, spec.names))
