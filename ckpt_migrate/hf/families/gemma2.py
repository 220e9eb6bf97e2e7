"""Gemma 2: HF ``Gemma2ForCausalLM`` <-> CS ``GPT2LMHeadModel`` configured as Gemma 2 (sandwich
RMS norms, GeGLU, rotary, logit soft-capping, sliding window every other layer).

Model Zoo (tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``):
``gemma2.py`` (``Converter_Gemma2_WithoutOptionalModel_HF_CS23`` lines 41-215, the config rules
``ConfigConverter_Gemma2_HF_CS23`` lines 218-781, ``Converter_Gemma2ForCausalLM_HF_CS23`` lines
784-795). The attention is LLaMA's (``Converter_LlamaAttention_HF_CS``, llama.py lines 38-302:
Q and K rows interleaved for rotary, here :mod:`.llama`'s helpers). Every HF RMS norm computes
``x * (1 + w)``; Model Zoo folds the 1 into the CS weight (gemma2.py lines 163-190), so norms are
the one place a Gemma 2 tensor's data changes: ``w + 1`` on import, ``w - 1`` on export, in the
tensor's own dtype as torch computes it. A float weight whose ``w + 1`` rounds (|w| small
against 1) does not come back bit for bit; transformers initialises the norms to 0, which does.

Not mirrored: Model Zoo (and so this mapping) maps HF's default ``layer_types`` (sliding window
on layers 0, 2, ...) to ``sliding_window_every_other_decoder_layer: true``, which CS up to 2.9
and 2.10's default ``full_attention_first`` apply to layers 1, 3, ... (layers/TransformerDecoder.py
lines 166-169 at Release_2.7.1, lines 174-186 at Release_2.10.0): weights are unaffected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.llama_config import CS_IGNORED
from ckpt_migrate.hf import mup
from ckpt_migrate.hf.config_llama import kv_heads_cs
from ckpt_migrate.hf.layouts import llama_like
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.ops import shift as shift
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
MODEL_TYPE = HF_MODEL_TYPES[0]
ARCHITECTURES = catalogue.hf_architectures(__name__)

# Model Zoo gemma2.py lines 438-464: HF fields absent from config.json take these values.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 256000,
    "hidden_size": 3072,
    "intermediate_size": 24576,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
    "query_pre_attn_scalar": 224,
    "sliding_window": 4096,
}
# Model Zoo gemma2.py lines 468-512: CS fields absent from the model section take these values
# (so a section that leaves out a Gemma 2 setting fails the checks below, as in Model Zoo).
CS_DEFAULTS: dict[str, Any] = {
    "embeddings_scale": 1.0, "embedding_layer_norm": False, "embedding_dropout_rate": None,
    "share_embedding_weights": True, "position_embedding_type": "learned",
    "max_position_embeddings": 1024, "position_embedding_offset": 0, "rotary_dim": None,
    "rope_theta": 10000, "pos_scaling_factor": 1.0, "hidden_size": 768, "num_hidden_layers": 12,
    "dropout_rate": 0.1, "norm_type": "layernorm", "layer_norm_epsilon": 1e-5, "norm_first": True,
    "norm_first_sandwich": False, "num_heads": 12, "attention_module": "aiayn_attention",
    "extra_attention_params": {}, "attention_type": "scaled_dot_product",
    "attention_dropout_rate": None, "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True, "attention_sliding_window_length": None,
    "sliding_window_every_other_decoder_layer": False, "attention_sink_tokens": None,
    "attention_qk_norm_layer": None, "attention_inner_dim": None,
    "scale_qk_dot_by_layer_idx": False, "attention_logit_softcapping": None,
    "filter_size": 3072, "nonlinearity": "gelu", "use_ffn_bias": True,
    "use_bias_in_output": False, "use_ff_layer1_dropout": False, "final_logit_softcapping": None,
    "attention_logits_alpha": 1,
}  # fmt: skip
# Model Zoo gemma2.py lines 359-433 (assert_factory_fn rules, CS side): the one value HF Gemma 2
# can express; a tuple lists several.
CS_FIXED: dict[str, Any] = {
    "position_embedding_type": "rotary",
    "dropout_rate": 0.0,
    "sliding_window_every_other_decoder_layer": True,
    "norm_first": True,
    "norm_first_sandwich": True,
    "use_bias_in_output": False,
    "embedding_dropout_rate": (None, 0.0),
    "position_embedding_offset": 0,
    "use_ffn_bias": False,
    "embedding_layer_norm": False,
    "attention_type": "scaled_dot_product",
    "norm_type": "rmsnorm",
    "use_ff_layer1_dropout": False,
}
# Ours: CS fields Model Zoo drops without a rule whose other values HF Gemma 2 cannot express
# (rope scaling, attention sinks, QK norms, per-layer QK scaling, fixed sparsity, SWA on the
# even layers only being HF's pattern).
CS_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "pos_scaling_factor": (1.0,),
    "attention_sink_tokens": (None,),
    "attention_qk_norm_layer": (None,),
    "scale_qk_dot_by_layer_idx": (False,),
    "fixed_sparse_attention": (None,),
    "sliding_window_every_other_decoder_layer_pattern": ("sliding_window_first",),
}
CS_MAPPED = frozenset(
    {
        "vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "attention_module",
        "extra_attention_params", "max_position_embeddings", "layer_norm_epsilon", "rope_theta",
        "final_logit_softcapping", "attention_logit_softcapping",
        "attention_sliding_window_length", "nonlinearity", "share_embedding_weights",
        "filter_size", "attention_inner_dim", "attention_dropout_rate",
        "use_projection_bias_in_attention", "use_ffn_bias_in_attention", "rotary_dim",
        "embeddings_scale", "attention_logits_alpha", "initializer_range",
        # no effect with rotary positions (Model Zoo drops them too)
        "num_relative_attention_buckets", "alibi_trainable_slopes", "attention_qk_norm_eps",
    }
)  # fmt: skip
_GLU_HF_TO_CS = {"silu": "swiglu", "relu": "reglu", "gelu": "geglu"}  # gemma2.py lines 678-683
_GLU_CS_TO_HF = {"swiglu": "silu", "reglu": "relu", "geglu": "gelu"}  # gemma2.py line 690


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise MappingError(f"{name}: not a Gemma 2 model name")


# --------------------------------------------------------------------------- config


def _refuse_unsupported(cs_model: Mapping[str, Any], cs: Mapping[str, Any]) -> None:
    """Model Zoo gemma2.py lines 359-433 (fixed CS fields); ours: muP, the fields in
    :data:`CS_NEUTRAL` and any field no rule knows (Model Zoo drops those silently)."""
    mup.refuse(cs_model, NAMES[0])  # gemma2.py has no muP conversion: refused, as Model Zoo does
    for key, value in CS_FIXED.items():
        allowed = value if isinstance(value, tuple) else (value,)
        if cs[key] not in allowed:
            raise MappingError(f"{key}={cs[key]!r}: HF Gemma 2 needs {value!r}")
    for key, allowed in CS_NEUTRAL.items():
        if key in cs and cs[key] not in allowed:
            raise MappingError(f"{key}={cs[key]!r}: HF Gemma 2 cannot express it")
    known = CS_MAPPED | CS_FIXED.keys() | CS_NEUTRAL.keys() | mup.fields(NAMES[0])
    for key in cs_model:
        if key not in known | CS_IGNORED:
            raise MappingError(f"{key}: CS model field not supported by the HF Gemma 2 mapping")


def cs_checked(cs_model: Mapping[str, Any]) -> dict[str, Any]:
    """The CS model section with Model Zoo's defaults, checked (gemma2.py lines 701-744:
    ``embeddings_scale`` must be ``hidden_size ** 0.5``, ``attention_inner_dim`` defaults to
    ``hidden_size``, ``rotary_dim`` is required, ``attention_dropout_rate`` defaults to
    ``dropout_rate``; lines 591-610 ``rotary_dim`` is the head size; lines 640-663 the two
    attention bias flags agree)."""
    cs = {**CS_DEFAULTS, **cs_model}
    if "vocab_size" not in cs:
        raise MappingError("vocab_size: required in the CS model section")
    _refuse_unsupported(cs_model, cs)
    scale, want = float(cs["embeddings_scale"]), cs["hidden_size"] ** 0.5
    if abs(scale - want) > 1e-6 + 2.0e-7 * want:
        raise MappingError(f"embeddings_scale={scale!r}: must be hidden_size**0.5 ({want})")
    if cs["attention_inner_dim"] is None:
        cs["attention_inner_dim"] = cs["hidden_size"]
    if cs["rotary_dim"] is None:
        raise MappingError("rotary_dim: must be specified (Model Zoo gemma2.py line 736)")
    if cs["attention_inner_dim"] % cs["num_heads"]:
        raise MappingError("attention_inner_dim: must be divisible by num_heads")
    if cs["rotary_dim"] != cs["attention_inner_dim"] // cs["num_heads"]:
        raise MappingError("rotary_dim: must be attention_inner_dim // num_heads for HF")
    if cs["attention_dropout_rate"] is None:
        cs["attention_dropout_rate"] = cs["dropout_rate"]
    if cs["use_projection_bias_in_attention"] != cs["use_ffn_bias_in_attention"]:
        raise MappingError(
            "use_ffn_bias_in_attention: must equal use_projection_bias_in_attention (HF has one "
            "attention_bias)"
        )
    if cs["nonlinearity"] not in _GLU_CS_TO_HF:
        raise MappingError(f"nonlinearity={cs['nonlinearity']!r}: not a GLU activation HF maps")
    return cs


def kv_heads(cs: Mapping[str, Any]) -> int:
    """Model Zoo gemma2.py lines 565-589, LLaMA's rule (``config_llama.kv_heads_cs``):
    ``aiayn_attention`` is MHA, ``multiquery_attention`` has
    ``extra_attention_params.num_kv_groups`` key/value heads."""
    return kv_heads_cs(cs, "Gemma 2")


def query_pre_attn_scalar(cs: Mapping[str, Any]) -> int | float:
    """Model Zoo gemma2.py lines 766-772: ``head size / attention_logits_alpha ** 2``. Written as
    an int when it is one up to rounding (transformers 5's ``Gemma2Config`` accepts only ints;
    Model Zoo writes the float)."""
    value = (cs["attention_inner_dim"] / cs["num_heads"]) / float(cs["attention_logits_alpha"]) ** 2
    nearest = round(value)
    return int(nearest) if math.isclose(value, nearest, rel_tol=1e-9) else value


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``config.json`` of ``Gemma2ForCausalLM`` (Model Zoo gemma2.py lines 221-327 renames,
    540-589 GQA, 612-638 ``head_dim``, 640-663 ``attention_bias``, 665-699 GLU, 766-772
    ``query_pre_attn_scalar``). ``rope_theta`` is also written as transformers 5's
    ``rope_parameters``; ``initializer_range`` is carried (ours, Model Zoo drops it)."""
    _check_name(name)
    cs = cs_checked(cs_model)
    theta = float(cs["rope_theta"])
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURES[name]],
        "model_type": MODEL_TYPE,
        "vocab_size": cs["vocab_size"],
        "hidden_size": cs["hidden_size"],
        "num_hidden_layers": cs["num_hidden_layers"],
        "num_attention_heads": cs["num_heads"],
        "num_key_value_heads": kv_heads(cs),
        "max_position_embeddings": cs["max_position_embeddings"],
        "rms_norm_eps": cs["layer_norm_epsilon"],
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "final_logit_softcapping": cs["final_logit_softcapping"],
        "attn_logit_softcapping": cs["attention_logit_softcapping"],
        "sliding_window": cs["attention_sliding_window_length"],
        "hidden_activation": _GLU_CS_TO_HF[cs["nonlinearity"]],
        "tie_word_embeddings": bool(cs["share_embedding_weights"]),
        "intermediate_size": cs["filter_size"],
        "head_dim": cs["attention_inner_dim"] // cs["num_heads"],
        "attention_dropout": cs["attention_dropout_rate"],
        "attention_bias": bool(cs["use_projection_bias_in_attention"]),
        "query_pre_attn_scalar": query_pre_attn_scalar(cs),
    }
    if "initializer_range" in cs:
        out["initializer_range"] = cs["initializer_range"]
    return out


def _rope_theta(hf: Mapping[str, Any]) -> float:
    """``rope_theta`` (Model Zoo gemma2.py lines 263-266), read from transformers 5's
    ``rope_parameters`` too; Gemma 2 in Model Zoo has no rope scaling, so any is refused."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or {}
    for spec in (params, scaling):
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind != "default":
            raise MappingError(f"rope_parameters: rope type {kind!r} not supported for Gemma 2")
    return float(params.get("rope_theta", hf["rope_theta"]))


def _check_hf(hf: Mapping[str, Any]) -> None:
    """Ours: what Model Zoo drops without a rule but the CS model cannot hold: another layer
    pattern than HF's alternating default, bidirectional attention."""
    default = [
        "sliding_attention" if (i + 1) % 2 else "full_attention"
        for i in range(hf["num_hidden_layers"])
    ]
    if hf.get("layer_types") not in (None, default):
        raise MappingError("layer_types: CS alternates sliding and full attention only")
    if hf.get("use_bidirectional_attention"):
        raise MappingError("use_bidirectional_attention: CS Gemma 2 is causal")
    kv = hf["num_key_value_heads"]
    if kv is None or hf["num_attention_heads"] % kv:
        raise MappingError("num_key_value_heads: must divide num_attention_heads")


def _glu_to_cs(activation: str) -> str:
    """Model Zoo gemma2.py lines 674-688: any ``gelu_*`` (HF's ``gelu_pytorch_tanh``) is CS
    ``geglu``, whose GELU is the exact one (an approximation Model Zoo accepts)."""
    base = "gelu" if activation.startswith("gelu_") else activation
    if base not in _GLU_HF_TO_CS:
        raise MappingError(f"hidden_activation={activation!r}: not a GLU-able activation in CS")
    return _GLU_HF_TO_CS[base]


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The CS ``model:`` section (Model Zoo ``ConfigConverter_Gemma2_HF_CS23``, HF -> CS: the
    renames of lines 221-327, GQA lines 549-564, ``attention_inner_dim`` lines 621-625, the
    written defaults lines 513-522, ``rotary_dim``, ``embeddings_scale`` and
    ``attention_logits_alpha`` lines 755-765)."""
    _check_name(name)
    if hf_config.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise MappingError(f"model_type={hf_config['model_type']!r}: expected 'gemma2'")
    hf = {**HF_DEFAULTS, **hf_config}
    _check_hf(hf)
    heads, kv, head_dim = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    cs: dict[str, Any] = {
        "vocab_size": hf["vocab_size"],
        "hidden_size": hf["hidden_size"],
        "num_hidden_layers": hf["num_hidden_layers"],
        "num_heads": heads,
    }
    if kv == heads:
        cs["attention_module"] = "aiayn_attention"
    else:
        cs["extra_attention_params"] = {"num_kv_groups": kv}
        cs["attention_module"] = "multiquery_attention"
    cs.update(
        max_position_embeddings=hf["max_position_embeddings"],
        layer_norm_epsilon=hf["rms_norm_eps"],
        rope_theta=_rope_theta(hf),
        final_logit_softcapping=hf["final_logit_softcapping"],
        attention_logit_softcapping=hf["attn_logit_softcapping"],
        attention_sliding_window_length=hf["sliding_window"],
        nonlinearity=_glu_to_cs(hf["hidden_activation"]),
        share_embedding_weights=bool(hf["tie_word_embeddings"]),
        filter_size=hf["intermediate_size"],
        attention_inner_dim=head_dim * heads,
        attention_dropout_rate=hf["attention_dropout"],
        use_projection_bias_in_attention=bool(hf["attention_bias"]),
        use_ffn_bias_in_attention=bool(hf["attention_bias"]),
        initializer_range=hf["initializer_range"],
        rotary_dim=head_dim,
        embeddings_scale=hf["hidden_size"] ** 0.5,
    )
    if head_dim != hf["query_pre_attn_scalar"]:
        cs["attention_logits_alpha"] = (head_dim / hf["query_pre_attn_scalar"]) ** 0.5
    cs.update(
        norm_first=True,
        norm_first_sandwich=True,
        sliding_window_every_other_decoder_layer=True,
        position_embedding_type="rotary",
        norm_type="rmsnorm",
        use_ffn_bias=False,
        dropout_rate=0.0,
    )
    return cs


# --------------------------------------------------------------------------- tensors


TABLE = llama_like.GEMMA2


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """The heads and key/value heads (rotary rows permuted per head), attention biases, a tied
    head (``share_embedding_weights`` of the checked CS config, or of the one
    :func:`config_to_cs` gives). On export a tied head is not written (nor read:
    :func:`cs_ties`), ``ln_f`` is not read (gemma2.py line 160); on import the final norm is
    written as both ``transformer_decoder.norm`` and ``ln_f`` (gemma2.py lines 185-190), and a
    tied head absent from the HF files is written from the embeddings (ours: the CS model's
    state dict has it and CS loads strictly; Model Zoo's rule, line 154, only copies an
    ``lm_head`` the files have)."""
    if direction == TO_HF:
        _check_name(name)
        cfg = cs_checked(config)
        bias = bool(cfg["use_projection_bias_in_attention"])
        kv = kv_heads(cfg)
    else:
        cfg = config_to_cs(config, name)
        kv = cfg.get("extra_attention_params", {}).get("num_kv_groups", cfg["num_heads"])
        bias = cfg["use_projection_bias_in_attention"]
    flags = ({"tied"} if cfg["share_embedding_weights"] else set()) | ({"bias"} if bias else set())
    dims = {"heads": cfg["num_heads"], "kv": kv}
    return Ctx(shapes, cfg["num_hidden_layers"], "model.", frozenset(flags), dims)


plan_to_hf, plan_to_cs = plans(TABLE, context)
