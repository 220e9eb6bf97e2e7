"""StarCoder and its fine-tunes (OctoCoder, WizardCoder, SQLCoder): HF ``GPTBigCodeForCausalLM``
(``-headless``: ``GPTBigCodeModel``) <-> CS ``GPT2LMHeadModel`` configured as StarCoder.

Model Zoo: starcoder.py (tag Release_2.10.0; registry.py lines 300-331 alias the fine-tunes to
it). GPTBigCode uses ``nn.Linear`` (no Conv1D transposes), learned positions and multi-query
attention; ``c_attn`` packs ``[q (hidden), k (head_dim), v (head_dim)]``. The GPT-2 config
rules Model Zoo's converter inherits (``Converter_GPT2Model_HF_CS17``) and its own are the record's
config table (``catalogue/gpt2_config.py``), the tensor table in ``hf/layouts/gpt2_like.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.gpt2_config import STARCODER_HF_DEFAULTS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.layouts import gpt2_like
from ckpt_migrate.hf.layouts.gpt2_like import check_name, hf_prefix, layout_context
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import BOTH, TO_CS, TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)

config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs


def _shape(hf_config: Mapping[str, Any]) -> tuple[int, int, int, int, bool]:
    cfg = {**STARCODER_HF_DEFAULTS, **hf_config}
    embed, heads = cfg["n_embd"], cfg["n_head"]
    return cfg["n_layer"], embed, heads, embed // heads, bool(cfg["multi_query"])


TABLE = gpt2_like.STARCODER


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """What the StarCoder table reads: multi-query (``mq``) or not, the heads, the rows of Q, K
    and V in an MQA ``c_attn`` (starcoder.py lines 98-168); on import MappingError when a
    ``c_attn`` does not pack Q, K and V. On export the HF config is the one
    :func:`config_to_hf` gives."""
    headless = check_name(name, NAMES)
    hf_config = config_to_hf(config, name) if direction == TO_HF else config
    layers, embed, heads, d_head, mq = _shape(hf_config)
    if direction == TO_CS:
        rows = embed + 2 * d_head if mq else 3 * embed
        for i in range(layers):
            for suffix in BOTH:
                src = f"{hf_prefix(headless)}h.{i}.attn.c_attn.{suffix}"
                if src in shapes and shapes[src][0] != rows:
                    raise MappingError(
                        f"{src}: {shapes[src]} does not pack Q, K and V ({rows} rows)"
                    )
    flags = frozenset({"learned", "mq"} if mq else {"learned"})
    dims = {"heads": heads, "rows": (0, embed, embed + d_head, embed + 2 * d_head)}
    return layout_context(direction, shapes, config, headless, layers, flags, dims)


plan_to_hf, plan_to_cs = plans(TABLE, context)
