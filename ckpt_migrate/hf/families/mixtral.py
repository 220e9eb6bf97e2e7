"""Mixtral: HF ``MixtralForCausalLM`` / ``MixtralModel`` <-> CS ``GPT2LMHeadModel`` configured as
Mixtral (a sparse mixture-of-experts FFN).

Model Zoo (tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/mixtral.py``):
the attention, norms, embeddings and head are LLaMA's (lines 39-124, reusing
``Converter_LlamaAttention_HF_CS``; here :mod:`.llama`'s rules), the router is renamed (lines
96-104) and each expert projection is fused across experts on dimension 1 (lines 172-300,
``moe_optimized_impl_rules`` / ``convert_expert_weights``). The config adds ``moe`` (lines
458-510). HF tensors are named as transformers saves them (``block_sparse_moe.experts.<e>.w1``
..., which transformers 5 fuses into ``mlp.experts.gate_up_proj`` when it loads them); the fused
transformers 5 state-dict names are accepted on import too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.hf.families import llama
from ckpt_migrate.hf.layouts import llama_like
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
MODEL_TYPE = HF_MODEL_TYPES[0]

_DEFAULT_THETA = 1e6  # HF MixtralConfig's rope_theta default
# MoE settings HF Mixtral's router cannot express (softmax over the experts, top-k, renormalised
# top-k weights, no bias, no shared or null expert): Model Zoo layers/SparseMoEBlock.py.
_MOE_FIXED: dict[str, tuple[Any, ...]] = {
    "num_shared_experts": (None, 0),
    "routing_algorithm": ("learned",),
    "router_selection_nonlinearity": ("softmax",),
    "expert_weighting_nonlinearity": ("softmax",),
    "expert_weighting_normalization": (True,),
    "router_use_bias": (False, None),
    "null_expert_bias": (None, 0, 0.0),
    "probability_before_ffn": (False,),
}
_MOE_MAPPED = frozenset({"num_experts", "top_k", "load_balancing_loss_coef"})
_MOE_IGNORED = frozenset(
    {"moe_implementation", "router_fp32", "gate_initializer", "sinkhorn_n_iters"}
)


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise MappingError(f"{name}: not a Mixtral model name")


def _moe_checked(cs_model: Mapping[str, Any]) -> dict[str, Any]:
    moe = dict(cs_model.get("moe") or {})
    if not moe.get("num_experts"):
        raise MappingError("moe.num_experts: required for Mixtral")
    for key, allowed in _MOE_FIXED.items():
        if key in moe and moe[key] not in allowed:
            raise MappingError(f"moe.{key}={moe[key]!r}: HF Mixtral needs {allowed[0]!r}")
    for key in moe:
        if key not in _MOE_FIXED.keys() | _MOE_MAPPED | _MOE_IGNORED:
            raise MappingError(f"moe.{key}: not supported by the HF Mixtral mapping")
    return moe


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``config.json`` of ``MixtralForCausalLM`` / ``MixtralModel``: LLaMA's rules, plus
    ``sliding_window`` and ``moe`` -> ``num_local_experts``, ``num_experts_per_tok``,
    ``router_aux_loss_coef`` (Model Zoo mixtral.py lines 462-510)."""
    _check_name(name)
    cs = llama.cs_model_checked(cs_model, frozenset({"moe"}))
    moe = _moe_checked(cs_model)
    return {
        **llama.config_to_hf_common(cs, MODEL_TYPE, name),
        "sliding_window": cs.get("attention_sliding_window_length"),
        "num_local_experts": moe["num_experts"],
        "num_experts_per_tok": moe.get("top_k", 1),
        "router_aux_loss_coef": moe.get("load_balancing_loss_coef", 0.0),
    }


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The CS ``model:`` section (Model Zoo ``ConfigConverter_Mixtral_HF_CS23``). ``moe`` also
    names the fused expert layout the plan writes (``moe_implementation: optimized``): Model Zoo
    writes that layout without saying so, and 2.10's default is another."""
    _check_name(name)
    if hf_config.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise MappingError(f"model_type={hf_config['model_type']!r}: expected 'mixtral'")
    cs = llama.config_to_cs_common(hf_config, _DEFAULT_THETA)
    cs["attention_sliding_window_length"] = hf_config.get("sliding_window")
    cs["moe"] = {
        "num_experts": hf_config.get("num_local_experts", 8),
        "top_k": hf_config.get("num_experts_per_tok", 2),
        "load_balancing_loss_coef": hf_config.get("router_aux_loss_coef", 0.001),
        "moe_implementation": "optimized",
    }
    return cs


# --------------------------------------------------------------------------- tensors


TABLE = llama_like.MIXTRAL


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """LLaMA's context (``llama.context``) with the experts: their number and, on import, the
    FFN width (transformers 5's fused ``gate_up_proj`` stacks gate and up rows)."""
    if direction == TO_HF:
        _check_name(name)
        cfg = llama.cs_model_checked(config, frozenset({"moe"}))
        experts = int(_moe_checked(config)["num_experts"])
        dims = {"experts": experts}
        tied = cfg["share_embedding_weights"]
    else:
        cfg = config_to_cs(config, name)
        experts, inter = int(cfg["moe"]["num_experts"]), int(cfg["filter_size"])
        dims = {"experts": experts, "inter": inter}
        tied = config.get("tie_word_embeddings", False)
    dims |= {"heads": cfg["num_heads"], "kv": llama.kv_heads_cs(cfg)}
    flags = ({"tied"} if tied else set()) | ({"headless"} if llama.headless(name) else set())
    return Ctx(shapes, cfg["num_hidden_layers"], llama.hf_prefix(name), frozenset(flags), dims)


plan_to_hf, plan_to_cs = plans(TABLE, context)
