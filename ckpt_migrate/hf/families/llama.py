"""LLaMA (1, 2, Code Llama, WizardLM) and Mistral: HF ``LlamaForCausalLM`` / ``LlamaModel`` and
``MistralForCausalLM`` / ``MistralModel`` <-> CS ``GPT2LMHeadModel`` configured as LLaMA.

Model Zoo (tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``):
``llama.py`` (``Converter_LlamaModel_HF_CS`` lines 305-459, ``Converter_LlamaAttention_HF_CS``
lines 38-302, ``ConfigConverter_LLaMa_HF_CS19/20/21`` lines 564-833, 883-961, 1026-1143) and
``mistral.py`` (the same rules plus ``sliding_window``, lines 92-110). CS and HF lay out the
rotary halves of each head differently, so Q and K rows are permuted (see
:func:`interleave_rotary`). The config rules are the records' tables
(``catalogue/llama_config.py``); Mixtral (``mixtral.py`` of this package) reuses the context
defined here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.config import CS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.config_llama import kv_heads_cs
from ckpt_migrate.hf.layouts import llama_like
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.ops import deinterleave_rotary as deinterleave_rotary
from ckpt_migrate.hf.ops import interleave_rotary as interleave_rotary
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)


def _model_type(name: str) -> str:
    record = catalogue.by_name(name)
    if name not in NAMES or record is None or record.hf is None:
        raise MappingError(f"{name}: not a LLaMA/Mistral model name")
    return record.hf.model_types[0]


def headless(name: str) -> bool:
    return name.endswith("-headless")


def hf_prefix(name: str) -> str:
    """``model.`` for the ForCausalLM class, nothing for the base model (Model Zoo llama.py lines
    502-517: ``EquivalentSubkey("model.", "")`` only in the LM-head converter)."""
    return "" if headless(name) else "model."


config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs

# --------------------------------------------------------------------------- tensors

TABLE = llama_like.LLAMA


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """The heads and key/value heads (rotary rows are permuted per head), the prefix, whether
    the head is tied: on export the checked CS config's ``share_embedding_weights``, on import
    ``config.json``'s ``tie_word_embeddings`` (default false)."""
    if direction == TO_HF:
        _model_type(name)
        cfg = config_table.source(CS, config, name)
        tied = cfg["share_embedding_weights"]
    else:
        cfg = config_to_cs(config, name)
        tied = config.get("tie_word_embeddings", False)
    dims = {"heads": cfg["num_heads"], "kv": kv_heads_cs(cfg)}
    flags = ({"tied"} if tied else set()) | ({"headless"} if headless(name) else set())
    return Ctx(shapes, cfg["num_hidden_layers"], hf_prefix(name), frozenset(flags), dims)


plan_to_hf, plan_to_cs = plans(TABLE, context)
