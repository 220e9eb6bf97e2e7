"""Mixtral: HF ``MixtralForCausalLM`` / ``MixtralModel`` <-> CS ``GPT2LMHeadModel`` configured as
Mixtral (a sparse mixture-of-experts FFN).

Model Zoo (tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/mixtral.py``):
the attention, norms, embeddings and head are LLaMA's (lines 39-124, reusing
``Converter_LlamaAttention_HF_CS``; here :mod:`.llama`'s rules), the router is renamed (lines
96-104) and each expert projection is fused across experts on dimension 1 (lines 172-300,
``moe_optimized_impl_rules`` / ``convert_expert_weights``). The config adds ``moe`` (lines
458-510; the record's table, ``catalogue/llama_config.py``). HF tensors are named as
transformers saves them (``block_sparse_moe.experts.<e>.w1`` ..., which transformers 5 fuses
into ``mlp.experts.gate_up_proj`` when it loads them); the fused transformers 5 state-dict names
are accepted on import too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.config import CS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.config_llama import kv_heads_cs
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

config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise MappingError(f"{name}: not a Mixtral model name")


# --------------------------------------------------------------------------- tensors


TABLE = llama_like.MIXTRAL


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """LLaMA's context (``llama.context``) with the experts: their number and, on import, the
    FFN width (transformers 5's fused ``gate_up_proj`` stacks gate and up rows)."""
    if direction == TO_HF:
        _check_name(name)
        cfg = config_table.source(CS, config, name)
        experts = int(cfg["moe"]["num_experts"])
        dims = {"experts": experts}
        tied = cfg["share_embedding_weights"]
    else:
        cfg = config_to_cs(config, name)
        experts, inter = int(cfg["moe"]["num_experts"]), int(cfg["filter_size"])
        dims = {"experts": experts, "inter": inter}
        tied = config.get("tie_word_embeddings", False)
    dims |= {"heads": cfg["num_heads"], "kv": kv_heads_cs(cfg)}
    flags = ({"tied"} if tied else set()) | ({"headless"} if llama.headless(name) else set())
    return Ctx(shapes, cfg["num_hidden_layers"], llama.hf_prefix(name), frozenset(flags), dims)


plan_to_hf, plan_to_cs = plans(TABLE, context)
