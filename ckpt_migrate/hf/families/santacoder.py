"""SantaCoder: HF remote-code ``GPT2LMHeadCustomModel`` (``-headless``: ``GPT2CustomModel``,
``config.json`` ``model_type`` "gpt2", ``modeling_gpt2_mq.py``) <-> CS ``GPT2LMHeadModel``
configured as SantaCoder.

Model Zoo: santacoder.py (tag Release_2.10.0). The HF class is not in ``transformers``: the HF
side is what Model Zoo's converter writes. Conv1D weights (transposed), a separate ``q_attn`` and
a fused ``kv_attn`` (one K and one V head, multi-query). ``HF_MODEL_TYPES`` is empty: "gpt2" is
the GPT-2 family's; the pipeline must tell SantaCoder by ``architectures``. The GPT-2 config
rules Model Zoo's converter inherits are in ``_gpt2_layout.py``, the tensor table in
``hf/layouts/gpt2_like.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.hf import mup
from ckpt_migrate.hf.families._gpt2_layout import (
    GPT2_CS_FIXED,
    GPT2_RENAMES,
    check_name,
    expect,
    gpt2_config_to_cs,
    gpt2_config_to_hf,
)
from ckpt_migrate.hf.layouts import gpt2_like
from ckpt_migrate.hf.layouts.gpt2_like import layout_context
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)

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
    are refused (the export folds them to sP first, ``hf/mup.py``, as Model Zoo's mup.py does)."""
    headless = check_name(name, NAMES)
    expect(cs_model, "attention_module", ("multiquery_attention",), "CS")
    expect(cs_model, "extra_attention_params", ({"num_kv_groups": 1},), "CS")
    mup.refuse(cs_model, name)
    hf = gpt2_config_to_hf(cs_model, GPT2_RENAMES + _LAYER_IDX, GPT2_CS_FIXED)
    arch = "GPT2CustomModel" if headless else "GPT2LMHeadCustomModel"
    return {**hf, "architectures": [arch], **{k: v for k, v in _HF_POST.items() if k not in hf}}


TABLE = gpt2_like.SANTACODER


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """What the SantaCoder table reads: the layers and, on export, the positions of the
    generated causal mask (from the HF config :func:`config_to_hf` gives)."""
    headless = check_name(name, NAMES)
    hf_config = config_to_hf(config, name) if direction == TO_HF else config
    layers = hf_config["n_layer"]
    dims = {"positions": hf_config["n_positions"]} if direction == TO_HF else {}
    flags = frozenset({"learned"})
    return layout_context(direction, shapes, config, headless, layers, flags, dims)


plan_to_hf, plan_to_cs = plans(TABLE, context)
