"""JAIS: HF remote-code ``JAISLMHeadModel`` (``model_type`` ``jais``, ``inceptionai/jais-*``) <->
CS ``GPT2LMHeadModel`` configured as JAIS.

Model Zoo: jais_hf_cs.py (tag Release_2.10.0), the BTLM converter with other names (same
tensor rules, lines 36-65; same config rules, lines 141-354), so this module runs
``btlm.py``'s functions with JAIS's :data:`JAIS` spec. Model Zoo serves ``jais`` only (registry.py
lines 273-276). The HF class is not in ``transformers``.

One difference on purpose: Model Zoo's JAIS ``pre_config_convert``/``post_config_convert``
(lines 206-264) compare the ``FormatIndices`` object with ``0``/``1``, so they never read nor
write the optimizer's ``decoder_kernel``; this module treats it as BTLM does (see ``btlm.py``).
When the pipeline passes no ``decoder_kernel`` the result is Model Zoo's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.families import btlm
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

JAIS = btlm.spec_of(__name__)
NAMES: tuple[str, ...] = JAIS.names
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs
cs_optimizer = btlm.cs_optimizer  # the muP decoder_kernel (see the module note)

TABLE = btlm.TABLE


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: jais_hf_cs.py lines 36-138 and 374-475 (as ``btlm.context``)."""
    return btlm.context(direction, shapes, config, name, JAIS)


plan_to_hf, plan_to_cs = plans(TABLE, context)
