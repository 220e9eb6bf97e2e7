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

from ckpt_migrate import catalogue
from ckpt_migrate.hf import mup
from ckpt_migrate.hf.families import _gpt2_layout as layout
from ckpt_migrate.hf.layouts import gpt2_like
from ckpt_migrate.hf.layouts.gpt2_like import layout_context
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped


@dataclass(frozen=True)
class Spec:
    """What differs between BTLM and JAIS."""

    names: tuple[str, ...]
    model_type: str
    architectures: tuple[str, str]  # (LM head class, headless class)
    hf_post: Mapping[str, Any]


def spec_of(module: str, hf_post: Mapping[str, Any]) -> Spec:
    """The :class:`Spec` of the rules module ``module`` (its ``__name__``): names, model type
    and classes from the catalogue."""
    names = catalogue.hf_names(module)
    model_type = catalogue.hf_model_types(module)[0]
    return Spec(names, model_type, catalogue.hf_classes(model_type), hf_post)


BTLM = spec_of(
    __name__,
    # btlm_hf_cs.py lines 189-201.
    {
        "use_cache": True,
        "auto_map": {
            "AutoConfig": "cerebras/btlm-3b-8k-base--configuration_btlm.BTLMConfig",
            "AutoModel": "cerebras/btlm-3b-8k-base--modeling_btlm.BTLMModel",
            "AutoModelForCausalLM": "cerebras/btlm-3b-8k-base--modeling_btlm.BTLMLMHeadModel",
        },
    },
)
NAMES: tuple[str, ...] = BTLM.names
HF_MODEL_TYPES: tuple[str, ...] = (BTLM.model_type,)

# (HF, CS) renames of btlm_hf_cs.py lines 150-182, ahead of the GPT-2 rules.
RENAMES: tuple[tuple[str, str], ...] = (
    ("position_embedding_type", "position_embedding_type"),
    ("mup_scale_qk_dot_by_d", "scale_qk_dot_by_d"),
    ("mup_embeddings_scale", "embeddings_scale"),
    ("scale_attn_by_inverse_layer_idx", "scale_qk_dot_by_layer_idx"),
    *layout.GPT2_RENAMES,
)
CS_FIXED = {k: v for k, v in layout.GPT2_CS_FIXED.items() if k != "position_embedding_type"}
POSITIONS = ("alibi", "learned")  # what the HF class implements


def config_to_cs(hf_config: Mapping[str, Any], name: str, spec: Spec = BTLM) -> dict[str, Any]:
    """Model Zoo: btlm_hf_cs.py lines 141-283 and 299-351 on top of the GPT-2 rules:
    ``alibi_scaling`` -> ``pos_scaling_factor`` (null -> 1.0, fixed linear factor only),
    ``mup_output_alpha * mup_width_scale`` -> ``output_logits_scale``, muP and ALiBi fields
    renamed."""
    layout.check_name(name, spec.names)
    hf = {"mup_width_scale": 1.0, "alibi_scaling": None, **hf_config}
    cs = layout.gpt2_config_to_cs(hf, RENAMES, (spec.model_type,))
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
    headless = layout.check_name(name, spec.names)
    cs = {"decoder_kernel": 1.0, "pos_scaling_factor": 1.0, **cs_model}
    mup.refuse(cs, name)  # 2.3+ muP beyond the HF class's own (catalogue: mup_native)
    _check_positions(cs.get("position_embedding_type", "learned"))
    _glu(cs.get("nonlinearity", "gelu"))
    hf = layout.gpt2_config_to_hf(cs, RENAMES, CS_FIXED)
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


def _glu(activation: str) -> bool:
    if activation.endswith("glu") and activation != "swiglu":
        raise MappingError(f"nonlinearity={activation!r} is not supported (HF has swiglu only)")
    return activation == "swiglu"


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
    headless = layout.check_name(name, spec.names)
    hf_config = config_to_hf(config, name, spec) if direction == TO_HF else config
    layers = hf_config["n_layer"]
    alibi = hf_config.get("position_embedding_type", "learned") == "alibi"
    flags = {"alibi"} if alibi else {"learned"}
    if _glu(hf_config.get("activation_function", "gelu_new")):
        flags.add("glu")
    return layout_context(direction, shapes, config, headless, layers, frozenset(flags))


plan_to_hf, plan_to_cs = plans(TABLE, context)
