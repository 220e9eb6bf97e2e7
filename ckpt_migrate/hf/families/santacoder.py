"""SantaCoder: HF remote-code ``GPT2LMHeadCustomModel`` (``-headless``: ``GPT2CustomModel``,
``config.json`` ``model_type`` "gpt2", ``modeling_gpt2_mq.py``) <-> CS ``GPT2LMHeadModel``
configured as SantaCoder.

Model Zoo: santacoder.py (tag Release_2.10.0). The HF class is not in ``transformers``: the HF
side is what Model Zoo's converter writes. Conv1D weights (transposed), a separate ``q_attn`` and
a fused ``kv_attn`` (one K and one V head, multi-query). ``HF_MODEL_TYPES`` is empty: "gpt2" is
the GPT-2 family's; the pipeline must tell SantaCoder by ``architectures``. The config rules
(the GPT-2 ones Model Zoo's converter inherits, and its own) are the record's table
(``catalogue/gpt2_config.py``), the tensor table in ``hf/layouts/gpt2_like.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.layouts import gpt2_like
from ckpt_migrate.hf.layouts.gpt2_like import check_name, layout_context
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)

config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs

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
