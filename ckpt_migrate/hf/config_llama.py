"""The named operations of the LLaMA-like families' config tables
(``catalogue/llama_config.py``), each a pair as in ``config_ops.py``: (exporting, importing).

Model Zoo (tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``):
``llama.py`` (``ConfigConverter_LLaMa_HF_CS19/20/21``, lines 564-833, 883-961, 1026-1143),
``mixtral.py`` (lines 458-510).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate.hf import mup
from ckpt_migrate.hf.config_ops import Fn, State
from ckpt_migrate.hf.mapping import MappingError

_ROPE_DEFAULT_THETA = 10000.0  # HF LlamaConfig / MistralConfig and CS GPT2LMHeadModel default
_GLU_HF_TO_CS = {"silu": "swiglu", "relu": "reglu", "gelu": "geglu"}  # llama.py lines 743-770
_GLU_CS_TO_HF = {cs: hf for hf, cs in _GLU_HF_TO_CS.items()}


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


def _kv_heads_to_hf(s: State, label: str = "LLaMA") -> None:
    s.out["num_key_value_heads"] = kv_heads_cs(s.src, label)


def _kv_heads_to_cs(s: State) -> None:
    """llama.py lines 917-932: as many key/value heads as heads is MHA, fewer is GQA."""
    heads, kv = s.src["num_attention_heads"], s.src["num_key_value_heads"]
    if kv == heads:
        s.out["attention_module"] = "aiayn_attention"
        return
    if heads % kv:
        raise MappingError("num_key_value_heads: must divide num_attention_heads")
    s.out.update(
        attention_module="multiquery_attention", extra_attention_params={"num_kv_groups": kv}
    )


def _kv_heads_default(s: State) -> None:
    """HF: no ``num_key_value_heads`` is one per head."""
    if s.src.get("num_key_value_heads") is None:
        s.src["num_key_value_heads"] = s.src["num_attention_heads"]


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


def _rope_to_hf(s: State, theta: float) -> None:
    s.out.update(rope_to_hf(s.src))


def _rope_to_cs(s: State, theta: float) -> None:
    s.out.update(rope_to_cs(s.src, theta))


def _rms_norm_flag(s: State) -> None:
    """A pre-2.0 spelling of the same model: ``use_rms_norm: true`` without ``norm_type``."""
    if "norm_type" not in s.src and s.src.get("use_rms_norm") is True:
        s.src["norm_type"] = "rmsnorm"


def _known_fields(s: State, known: frozenset[str], as_name: str, label: str = "LLaMA") -> None:
    """Ours: a CS field no rule knows is refused (Model Zoo drops it silently)."""
    allowed = known | mup.fields(as_name)
    for key in s.src:
        if key not in allowed:
            raise MappingError(f"{key}: CS model field not supported by the HF {label} mapping")


def _rotary_is_head_size(s: State) -> None:
    """llama.py lines 772-805: ``rotary_dim`` given, and the whole head."""
    if s.src.get("rotary_dim") is None:
        raise MappingError("rotary_dim: must be specified (Model Zoo llama.py line 803)")
    if s.src["rotary_dim"] != s.src["hidden_size"] // s.src["num_heads"]:
        raise MappingError("rotary_dim: must be hidden_size // num_heads to be compatible with HF")


def _rotary_dim(s: State) -> None:
    """llama.py lines 817-819, falcon_180b.py: ``rotary_dim`` is the head size."""
    s.out["rotary_dim"] = s.src["hidden_size"] // s.src["num_attention_heads"]


def _no_biases(s: State) -> None:
    """What Model Zoo does not check but the CS model cannot hold: biases, a head size other
    than hidden_size // num_attention_heads (CS rotary_dim, llama.py lines 784-790)."""
    for key in ("attention_bias", "mlp_bias"):
        if s.src.get(key):
            raise MappingError(f"{key}: CS LLaMA has no projection biases")
    head_dim = s.src.get("head_dim")
    if head_dim is not None and head_dim != s.src["hidden_size"] // s.src["num_attention_heads"]:
        raise MappingError("head_dim: must be hidden_size // num_attention_heads for CS")


def _head_dim(s: State) -> None:
    """``head_dim`` written out, for the HF config classes that do not derive it from the
    hidden size and heads; on import :func:`_no_biases` checks it is the head size."""
    s.out["head_dim"] = s.src["hidden_size"] // s.src["num_heads"]


def _glu_to_hf(s: State, hf: str, any_gelu: bool = False) -> None:
    """llama.py lines 743-770: CS GLU nonlinearities are HF's gated activations."""
    if s.src["nonlinearity"] not in _GLU_CS_TO_HF:
        raise MappingError(f"nonlinearity={s.src['nonlinearity']!r}: not a GLU activation HF maps")
    s.out[hf] = _GLU_CS_TO_HF[s.src["nonlinearity"]]


def _glu_to_cs(s: State, hf: str, any_gelu: bool = False) -> None:
    """``any_gelu``: any ``gelu_*`` (Gemma 2's ``gelu_pytorch_tanh``) is CS ``geglu``, whose
    GELU is the exact one, an approximation Model Zoo accepts (gemma2.py lines 674-688)."""
    activation = s.src[hf]
    base = "gelu" if any_gelu and activation.startswith("gelu_") else activation
    if base not in _GLU_HF_TO_CS:
        raise MappingError(f"{hf}={activation!r}: not a GLU-able activation in CS")
    s.out["nonlinearity"] = _GLU_HF_TO_CS[base]


def _bool_to_hf(s: State, hf: str, cs: str, side: str | None = None) -> None:
    """A field copied as a bool (``side``: only reading that side)."""
    if side in (None, s.side):
        s.out[hf] = bool(s.src[cs])


def _bool_to_cs(s: State, hf: str, cs: str, side: str | None = None) -> None:
    if side in (None, s.side):
        s.out[cs] = bool(s.src[hf])


# MoE settings HF Mixtral's router cannot express (softmax over the experts, top-k, renormalised
# top-k weights, no bias, no shared or null expert): Model Zoo layers/SparseMoEBlock.py.
_MOE_FIXED: dict[str, tuple[Any, ...]] = {
    "num_shared_experts": (None, 0),
    "routing_algorithm": ("learned",),
    "router_selection_nonlinearity": ("softmax",),
    "expert_weighting_nonlinearity": ("softmax",),
    "expert_weighting_normalization": (True,),
    "router_use_bias": (False, None),
    "null_expert_bias": (None, 0, 0.0),
    "probability_before_ffn": (False,),
}
_MOE_MAPPED = frozenset({"num_experts", "top_k", "load_balancing_loss_coef"})
_MOE_IGNORED = frozenset(
    {"moe_implementation", "router_fp32", "gate_initializer", "sinkhorn_n_iters"}
)


def moe_checked(cs_model: Mapping[str, Any]) -> dict[str, Any]:
    """The CS ``moe`` section, refused where HF Mixtral cannot express it."""
    moe = dict(cs_model.get("moe") or {})
    if not moe.get("num_experts"):
        raise MappingError("moe.num_experts: required for Mixtral")
    for key, allowed in _MOE_FIXED.items():
        if key in moe and moe[key] not in allowed:
            raise MappingError(f"moe.{key}={moe[key]!r}: HF Mixtral needs {allowed[0]!r}")
    for key in moe:
        if key not in _MOE_FIXED.keys() | _MOE_MAPPED | _MOE_IGNORED:
            raise MappingError(f"moe.{key}: not supported by the HF Mixtral mapping")
    return moe


def _moe_to_hf(s: State) -> None:
    """mixtral.py lines 462-510: ``moe`` -> ``num_local_experts``, ``num_experts_per_tok``,
    ``router_aux_loss_coef``."""
    moe = moe_checked(s.src)
    s.out.update(
        num_local_experts=moe["num_experts"],
        num_experts_per_tok=moe.get("top_k", 1),
        router_aux_loss_coef=moe.get("load_balancing_loss_coef", 0.0),
    )


def _moe_to_cs(s: State) -> None:
    """The CS ``moe`` also names the fused expert layout the plan writes
    (``moe_implementation: optimized``): Model Zoo writes that layout without saying so, and
    2.10's default is another."""
    s.out["moe"] = {
        "num_experts": s.src.get("num_local_experts", 8),
        "top_k": s.src.get("num_experts_per_tok", 2),
        "load_balancing_loss_coef": s.src.get("router_aux_loss_coef", 0.001),
        "moe_implementation": "optimized",
    }


def _layer_types(window: Any, layers: int) -> list[str]:
    """The ``layer_types`` transformers makes by default: every layer sliding when there is a
    window, else every one full."""
    return ["sliding_attention" if window is not None else "full_attention"] * layers


def _uniform_layer_types_to_hf(s: State) -> None:
    """transformers' ``layer_types`` (a kind of attention per layer) written out: CS Mistral's
    sliding window applies to every layer alike."""
    window = s.src.get("attention_sliding_window_length")
    s.out["layer_types"] = _layer_types(window, s.src["num_hidden_layers"])


def _uniform_layer_types_to_cs(s: State) -> None:
    """Only the default ``layer_types`` converts: the CS model has one kind of attention."""
    want = _layer_types(s.src.get("sliding_window"), s.src["num_hidden_layers"])
    if s.src.get("layer_types") not in (None, want):
        raise MappingError(
            "layer_types: CS applies one kind of attention (sliding window or none) to every layer"
        )


OPS: dict[str, tuple[Fn, Fn]] = {
    "rms norm flag": (_rms_norm_flag, None),
    "known fields": (_known_fields, None),
    "rotary dim is the head size": (_rotary_is_head_size, None),
    "kv heads default": (None, _kv_heads_default),
    "no biases": (None, _no_biases),
    "glu activation": (_glu_to_hf, _glu_to_cs),
    "bool": (_bool_to_hf, _bool_to_cs),
    "rotary dim": (None, _rotary_dim),
    "rope": (_rope_to_hf, _rope_to_cs),
    "kv heads": (_kv_heads_to_hf, _kv_heads_to_cs),
    "moe": (_moe_to_hf, _moe_to_cs),
    "uniform layer types": (_uniform_layer_types_to_hf, _uniform_layer_types_to_cs),
    "head dim": (_head_dim, None),
}
