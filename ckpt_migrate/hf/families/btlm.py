"""BTLM: HF remote-code ``BTLMLMHeadModel`` (``-headless``: ``BTLMModel``, ``model_type`` "btlm",
``cerebras/btlm-3b-8k-base``) <-> CS ``GPT2LMHeadModel`` configured as BTLM.

Model Zoo: btlm_hf_cs.py (tag Release_2.10.0). GPT-2 layout (Conv1D weights, transposed; fused
``c_attn``), plus ALiBi slopes, a SwiGLU second input ``c_fc2`` and muP fields in the config,
which HF BTLM implements natively (no muP -> sP rescaling, ``attempt_mup_to_sp`` is false). The
HF class is not in ``transformers``. ``jais.py`` reuses this module's functions (Model Zoo's
jais_hf_cs.py is the same converter with other names).

muP: ``output_logits_scale = mup_output_alpha * mup_width_scale``; ``mup_width_scale`` is the
CS *optimizer*'s ``adjust_learning_rate.decoder_kernel`` (btlm_hf_cs.py lines 203-283).
:func:`cs_optimizer` gives that section; ``config_to_hf`` reads ``decoder_kernel`` from the
model section when the pipeline copies it there, as Model Zoo does (lines 209-228), else 1.0
(Model Zoo's default, lines 186-187; HF logits are the same: BTLM multiplies the two). The
config rules are the record's table (``catalogue/gpt2_config.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.config_ops import swiglu
from ckpt_migrate.hf.layouts import gpt2_like
from ckpt_migrate.hf.layouts.gpt2_like import check_name, layout_context
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped


@dataclass(frozen=True)
class Spec:
    """What differs between BTLM and JAIS on the tensor side: the names served."""

    names: tuple[str, ...]


def spec_of(module: str) -> Spec:
    """The :class:`Spec` of the rules module ``module`` (its ``__name__``)."""
    return Spec(catalogue.hf_names(module))


BTLM = spec_of(__name__)
NAMES: tuple[str, ...] = BTLM.names
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs


def cs_optimizer(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """The CS ``optimizer`` fields BTLM's muP needs (btlm_hf_cs.py lines 252-259)."""
    return {"adjust_learning_rate": {"decoder_kernel": hf_config.get("mup_width_scale", 1.0)}}


TABLE = gpt2_like.BTLM


def context(
    direction: str,
    shapes: Mapping[str, Shape],
    config: Mapping[str, Any],
    name: str,
    spec: Spec = BTLM,
) -> Ctx:
    """What the BTLM table reads (of the HF config; on export the one :func:`config_to_hf`
    gives): ALiBi slopes (``relative_pe.slopes`` -> ``embedding_layer.position_embed_helper
    .slopes``, lines 386-394) or learned positions, and SwiGLU's ``mlp.c_fc2`` (lines 50-60).
    No ``attn.bias`` buffers are generated (``generate_hf_biases=False``, line 65)."""
    headless = check_name(name, spec.names)
    hf_config = config_to_hf(config, name) if direction == TO_HF else config
    layers = hf_config["n_layer"]
    alibi = hf_config.get("position_embedding_type", "learned") == "alibi"
    flags = {"alibi"} if alibi else {"learned"}
    if swiglu(hf_config.get("activation_function", "gelu_new")):
        flags.add("glu")
    return layout_context(direction, shapes, config, headless, layers, frozenset(flags))


plan_to_hf, plan_to_cs = plans(TABLE, context)
