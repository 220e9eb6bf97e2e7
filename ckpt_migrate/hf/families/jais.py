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

from ckpt_migrate.hf.families import btlm
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

JAIS = btlm.spec_of(
    __name__,
    # jais_hf_cs.py lines 189-204.
    {
        "_name_or_path": "inceptionai/jais-30b-v3",
        "use_cache": True,
        "auto_map": {
            "AutoConfig": "inceptionai/jais-30b-v3--configuration_jais.JAISConfig",
            "AutoModel": "inceptionai/jais-30b-v3--modeling_jais.JAISModel",
            "AutoModelForCausalLM": "inceptionai/jais-30b-v3--modeling_jais.JAISLMHeadModel",
            "AutoModelForQuestionAnswering": (
                "inceptionai/jais-30b-v3--modeling_jais.JAISForQuestionAnswering"
            ),
            "AutoModelForSequenceClassification": (
                "inceptionai/jais-30b-v3--modeling_jais.JAISForSequenceClassification"
            ),
            "AutoModelForTokenClassification": (
                "inceptionai/jais-30b-v3--modeling_jais.JAISForTokenClassification"
            ),
        },
    },
)
NAMES: tuple[str, ...] = JAIS.names
HF_MODEL_TYPES: tuple[str, ...] = (JAIS.model_type,)


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: jais_hf_cs.py lines 141-354 (as btlm.config_to_cs)."""
    return btlm.config_to_cs(hf_config, name, JAIS)


def cs_optimizer(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """The muP ``decoder_kernel`` for the CS optimizer section (see the module note)."""
    return btlm.cs_optimizer(hf_config)


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: jais_hf_cs.py lines 141-354, CS -> HF (as btlm.config_to_hf)."""
    return btlm.config_to_hf(cs_model, name, JAIS)


TABLE = btlm.TABLE


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: jais_hf_cs.py lines 36-138 and 374-475 (as ``btlm.context``)."""
    return btlm.context(direction, shapes, config, name, JAIS)


plan_to_hf, plan_to_cs = plans(TABLE, context)
