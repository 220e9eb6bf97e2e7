"""LLaMA (1, 2, Code Llama, WizardLM) and Mistral: HF ``LlamaForCausalLM`` / ``LlamaModel`` and
``MistralForCausalLM`` / ``MistralModel`` <-> CS ``GPT2LMHeadModel`` configured as LLaMA.

Model Zoo (tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``):
``llama.py`` (``Converter_LlamaModel_HF_CS`` lines 305-459, ``Converter_LlamaAttention_HF_CS``
lines 38-302, ``ConfigConverter_LLaMa_HF_CS19/20/21`` lines 564-833, 883-961, 1026-1143) and
``mistral.py`` (the same rules plus ``sliding_window``, lines 92-110). CS and HF lay out the
rotary halves of each head differently, so Q and K rows are permuted (see
:func:`interleave_rotary`). Mixtral (``mixtral.py`` of this package) reuses the attention, norm
and config rules defined here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.llama_like import LLAMA, MISTRAL
from ckpt_migrate.hf import mup
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

_ROPE_DEFAULT_THETA = 10000.0  # HF LlamaConfig / MistralConfig and CS GPT2LMHeadModel default

# Model Zoo llama.py lines 693-706: HF fields absent from config.json take these values.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "max_position_embeddings": 2048,
    "rope_scaling": None,
}
# Model Zoo llama.py lines 707-721 and 902-904, 1050-1054: CS fields absent from the model
# section take the CS model's defaults (so a config without them fails the checks below).
CS_DEFAULTS: dict[str, Any] = {
    "share_embedding_weights": True,
    "max_position_embeddings": 1024,
    "position_embedding_type": "learned",
    "layer_norm_epsilon": 1.0e-5,
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "nonlinearity": "gelu",
    "use_ffn_bias": True,
    "use_bias_in_output": False,
    "norm_first": True,
    "norm_type": "layernorm",
    "pos_scaling_factor": 1.0,
}
# Model Zoo llama.py lines 579-690 and 887-889: CS fields that must hold one value (HF has no
# equivalent); checked when present (after CS_DEFAULTS), written on import (lines 724-741).
CS_FIXED: dict[str, Any] = {
    "position_embedding_type": "rotary",
    "use_position_embedding": True,
    "embedding_dropout_rate": 0.0,
    "embedding_layer_norm": False,
    "attention_type": "scaled_dot_product",
    "use_projection_bias_in_attention": False,
    "use_ffn_bias_in_attention": False,
    "use_ffn_bias": False,
    "attention_dropout_rate": 0.0,
    "dropout_rate": 0.0,
    "use_bias_in_output": False,
    "fixed_sparse_attention": None,
    "norm_first": True,
    "use_ff_layer1_dropout": False,
    "use_rms_norm": True,
    "norm_type": "rmsnorm",
}
_CS_WRITTEN_FIXED = tuple(
    k for k in CS_FIXED if k not in ("use_position_embedding", "use_rms_norm")
)
CS_MAPPED = frozenset(
    {
        "vocab_size", "hidden_size", "num_heads", "num_hidden_layers", "max_position_embeddings",
        "filter_size", "nonlinearity", "rope_theta", "layer_norm_epsilon", "initializer_range",
        "share_embedding_weights", "attention_module", "extra_attention_params", "rotary_dim",
        "pos_scaling_factor", "pos_scaling_type", "pos_scaling_extra_args",
        "attention_sliding_window_length",
    }
)  # fmt: skip
# Fields with no effect on the weights or the HF config (precision, loss, initialisers, name).
CS_IGNORED = frozenset(
    {
        "name", "mixed_precision", "fp16_type", "boundary_casting", "loss_scaling", "loss_weight",
        "attention_softmax_fp32", "attention_kernel", "compute_eval_metrics", "initializer",
        "embedding_initializer", "output_layer_initializer", "ffn_initializer",
        "ffn_output_layer_initializer", "attention_initializer", "use_bfloat16", "dtype",
        "precision_opt_level", "label_smoothing", "z_loss_coef",
    }
)  # fmt: skip
_GLU_HF_TO_CS = {"silu": "swiglu", "relu": "reglu", "gelu": "geglu"}  # llama.py lines 743-770
_GLU_CS_TO_HF = {cs: hf for hf, cs in _GLU_HF_TO_CS.items()}
# The model types with their own config field: Mistral's sliding window, LLaMA's bias flags.
_SLIDING, _BIAS_FLAGS = MISTRAL.hf.model_types[0], LLAMA.hf.model_types[0]  # type: ignore[union-attr]


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


# --------------------------------------------------------------------------- config


def cs_model_checked(cs_model: Mapping[str, Any], extra: frozenset[str] = frozenset()) -> dict:
    """The CS model section with Model Zoo's CS defaults filled in, after refusing what HF
    LLaMA cannot express (Model Zoo llama.py lines 579-690 assert_factory_fn rules, 772-805
    rotary_dim checks; mup.py for muP). ``extra`` names fields a caller maps itself."""
    cs = {**CS_DEFAULTS, **cs_model}
    if "norm_type" not in cs_model and cs_model.get("use_rms_norm") is True:
        cs["norm_type"] = "rmsnorm"  # a pre-2.0 spelling of the same model
    mup.refuse(cs_model, NAMES[0])
    for key, value in CS_FIXED.items():
        if key in cs and cs[key] != value:
            raise MappingError(f"{key}={cs[key]!r}: HF LLaMA needs {value!r}")
    for key in cs_model:
        if key not in CS_MAPPED | CS_FIXED.keys() | CS_IGNORED | mup.fields(NAMES[0]) | extra:
            raise MappingError(f"{key}: CS model field not supported by the HF LLaMA mapping")
    for key in ("vocab_size", "hidden_size", "num_heads", "num_hidden_layers", "filter_size"):
        if key not in cs:
            raise MappingError(f"{key}: required in the CS model section")
    if cs.get("rotary_dim") is None:
        raise MappingError("rotary_dim: must be specified (Model Zoo llama.py line 803)")
    if cs["rotary_dim"] != cs["hidden_size"] // cs["num_heads"]:
        raise MappingError("rotary_dim: must be hidden_size // num_heads to be compatible with HF")
    if cs["nonlinearity"] not in _GLU_CS_TO_HF:
        raise MappingError(f"nonlinearity={cs['nonlinearity']!r}: not a GLU activation HF maps")
    return cs


def kv_heads_cs(cs: Mapping[str, Any], family: str = "LLaMA") -> int:
    """Model Zoo llama.py lines 933-957: ``aiayn_attention`` means MHA, ``multiquery_attention``
    takes ``extra_attention_params.num_kv_groups`` key/value heads."""
    module = cs.get("attention_module", "aiayn_attention")
    extra = dict(cs.get("extra_attention_params") or {})
    if set(extra) - {"num_kv_groups"}:
        raise MappingError(f"extra_attention_params: unsupported keys {sorted(set(extra))}")
    if module == "aiayn_attention":
        if "num_kv_groups" in extra:
            raise MappingError("extra_attention_params.num_kv_groups: conflicts with MHA")
        return int(cs["num_heads"])
    if module == "multiquery_attention":
        groups = int(extra["num_kv_groups"])
        if cs["num_heads"] % groups:
            raise MappingError("extra_attention_params.num_kv_groups: must divide num_heads")
        return groups
    raise MappingError(f"attention_module={module!r}: not supported for {family}")


def rope_to_hf(cs: Mapping[str, Any]) -> dict[str, Any]:
    """Model Zoo llama.py lines 1109-1123: ``pos_scaling_factor`` 1.0 means no scaling, else
    ``{type, factor, **pos_scaling_extra_args}``. Written both as ``rope_theta`` /
    ``rope_scaling`` (transformers 4) and ``rope_parameters`` (transformers 5); the scaling type
    goes under ``rope_type``, which both read (Model Zoo writes ``type`` except for llama3)."""
    theta = float(cs.get("rope_theta", _ROPE_DEFAULT_THETA))
    if cs["pos_scaling_factor"] == 1.0:
        scaling = None
        params: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    else:
        scaling = {
            "rope_type": cs.get("pos_scaling_type", "linear"),
            "factor": cs["pos_scaling_factor"],
            **dict(cs.get("pos_scaling_extra_args") or {}),
        }
        params = {**scaling, "rope_theta": theta}
    return {"rope_theta": theta, "rope_scaling": scaling, "rope_parameters": params}


def rope_to_cs(hf: Mapping[str, Any], default_theta: float) -> dict[str, Any]:
    """Model Zoo llama.py lines 1056-1108 (``convert_pi``) and 665 (``rope_theta``), reading the
    transformers 5 ``rope_parameters`` or the transformers 4 ``rope_theta`` / ``rope_scaling``."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or None
    if scaling is None and params.get("rope_type", params.get("type", "default")) != "default":
        scaling = params
    theta = params.get("rope_theta", hf.get("rope_theta", default_theta))
    out: dict[str, Any] = {"rope_theta": float(theta), "pos_scaling_factor": 1.0}
    if scaling is None:
        return out
    kind = str(scaling.get("type", scaling.get("rope_type"))).lower()
    if kind not in ("linear", "yarn", "llama3", "longrope"):
        raise MappingError(f"rope_scaling: type {kind!r} not supported (linear, yarn, llama3)")
    out.update(pos_scaling_factor=scaling["factor"], pos_scaling_type=kind)
    rest = {k: v for k, v in scaling.items() if k not in ("type", "rope_type", "factor")}
    rest.pop("rope_theta", None)
    if kind == "yarn":  # Model Zoo keeps only this one (llama.py lines 1080-1087)
        rest = {"original_max_position_embeddings": scaling["original_max_position_embeddings"]}
    if kind != "linear":
        out["pos_scaling_extra_args"] = rest
    return out


def config_to_hf_common(cs: Mapping[str, Any], model_type: str, name: str) -> dict[str, Any]:
    """Model Zoo llama.py lines 577-674 (renames), 743-770 (GLU), 933-957 (GQA), 1109-1123."""
    causal, base = catalogue.hf_classes(model_type)
    return {
        "architectures": [base if headless(name) else causal],
        "model_type": model_type,
        "vocab_size": cs["vocab_size"],
        "hidden_size": cs["hidden_size"],
        "intermediate_size": cs["filter_size"],
        "num_hidden_layers": cs["num_hidden_layers"],
        "num_attention_heads": cs["num_heads"],
        "num_key_value_heads": kv_heads_cs(cs),
        "hidden_act": _GLU_CS_TO_HF[cs["nonlinearity"]],
        "max_position_embeddings": cs["max_position_embeddings"],
        "initializer_range": cs.get("initializer_range", 0.02),
        "rms_norm_eps": cs["layer_norm_epsilon"],
        "tie_word_embeddings": bool(cs["share_embedding_weights"]),
        **rope_to_hf(cs),
    }


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``config.json`` of ``LlamaForCausalLM`` / ``MistralForCausalLM`` (or the base model for
    ``-headless``). Mistral adds ``sliding_window`` (Model Zoo mistral.py lines 96-110)."""
    model_type = _model_type(name)
    cs = cs_model_checked(cs_model)
    out = config_to_hf_common(cs, model_type, name)
    window = cs.get("attention_sliding_window_length")
    if model_type == _SLIDING:
        out["sliding_window"] = window
    elif window is not None:
        raise MappingError("attention_sliding_window_length: LLaMA has no sliding window")
    if model_type == _BIAS_FLAGS:
        out.update(attention_bias=False, mlp_bias=False)
    return out


def check_hf_config(hf: Mapping[str, Any]) -> None:
    """What Model Zoo does not check but the CS model cannot hold: biases, a head size other
    than hidden_size // num_attention_heads (CS rotary_dim, llama.py lines 784-790)."""
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            raise MappingError(f"{key}: CS LLaMA has no projection biases")
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim != hf["hidden_size"] // hf["num_attention_heads"]:
        raise MappingError("head_dim: must be hidden_size // num_attention_heads for CS")


def config_to_cs_common(hf_config: Mapping[str, Any], default_theta: float) -> dict[str, Any]:
    """Model Zoo llama.py lines 577-674, 724-741, 817-819 (rotary_dim), 917-932 (GQA)."""
    hf = {**HF_DEFAULTS, **hf_config}
    if hf.get("num_key_value_heads") is None:
        hf["num_key_value_heads"] = hf["num_attention_heads"]
    check_hf_config(hf)
    if hf["hidden_act"] not in _GLU_HF_TO_CS:
        raise MappingError(f"hidden_act={hf['hidden_act']!r}: not a GLU-able activation in CS")
    heads, kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    cs: dict[str, Any] = {
        "vocab_size": hf["vocab_size"],
        "hidden_size": hf["hidden_size"],
        "num_heads": heads,
        "num_hidden_layers": hf["num_hidden_layers"],
        "max_position_embeddings": hf["max_position_embeddings"],
        "filter_size": hf["intermediate_size"],
        "nonlinearity": _GLU_HF_TO_CS[hf["hidden_act"]],
        "layer_norm_epsilon": hf["rms_norm_eps"],
        "initializer_range": hf["initializer_range"],
        "share_embedding_weights": bool(hf["tie_word_embeddings"]),
        "rotary_dim": hf["hidden_size"] // heads,
        **rope_to_cs(hf, default_theta),
        **{k: CS_FIXED[k] for k in _CS_WRITTEN_FIXED},
    }
    if kv == heads:
        cs["attention_module"] = "aiayn_attention"
    else:
        if heads % kv:
            raise MappingError("num_key_value_heads: must divide num_attention_heads")
        cs.update(
            attention_module="multiquery_attention", extra_attention_params={"num_kv_groups": kv}
        )
    return cs


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The CS ``model:`` section (Model Zoo ``ConfigConverter_LLaMa_HF_CS21`` /
    ``ConfigConverter_Mistral_HF_CS21``)."""
    model_type = _model_type(name)
    if hf_config.get("model_type", model_type) != model_type:
        raise MappingError(f"model_type={hf_config['model_type']!r}: expected {model_type!r}")
    cs = config_to_cs_common(hf_config, _ROPE_DEFAULT_THETA)
    if model_type == _SLIDING:
        cs["attention_sliding_window_length"] = hf_config.get("sliding_window")
    return cs


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
        cfg = cs_model_checked(config)
        tied = cfg["share_embedding_weights"]
    else:
        cfg = config_to_cs(config, name)
        tied = config.get("tie_word_embeddings", False)
    dims = {"heads": cfg["num_heads"], "kv": kv_heads_cs(cfg)}
    flags = ({"tied"} if tied else set()) | ({"headless"} if headless(name) else set())
    return Ctx(shapes, cfg["num_hidden_layers"], hf_prefix(name), frozenset(flags), dims)


plan_to_hf, plan_to_cs = plans(TABLE, context)
