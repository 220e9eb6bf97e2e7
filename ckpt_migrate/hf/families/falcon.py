"""Falcon: Hugging Face ``FalconForCausalLM`` / ``FalconModel`` <-> Cerebras ``falcon``.

Model Zoo's reference at Release_2.10.0: ``tools/checkpoint_converters/falcon.py`` picks the
converter by the HF config (lines 164-199, 244-258): ``model_type: falcon`` (the transformers
class) always takes the "180B" one, ``falcon_180b.py`` (``ConfigConverter_Falcon_180B_HF_CS20``
lines 134-551, ``..._HF_CS21`` lines 612-693 for 2.1 to 2.9, layer norms lines 36-131), built
on ``falcon_40b.py``'s grouped fused QKV (``Converter_Falcon_40B_Attention_HF_CS20`` lines
35-301, model rules lines 327-405). The 7B/40B converters serve the remote-code ``RWModel``
configs (``n_head_kv``), which transformers does not have; they are not served here.

``query_key_value`` rows are ``[kv group][its query heads..., key, value][head_dim]``, which
covers multi-query (one group), grouped-query (new decoder architecture) and the old per-head
``[q, k, v]`` layout (one group per head). HF rotates head halves, CS adjacent pairs: Model Zoo
interleaves the Q and K rows of every head (``rotary_dim`` = head size).

The CS model is GPT-J's (``FalconModelConfig(GPTJModelConfig)``, ``models/nlp/falcon/model.py``
lines 20-27), which registers its final norm under two names, ``ln_f`` and
``transformer_decoder.norm`` (one module, ``models/nlp/gptj/gptj_model.py`` lines 535-538): Model
Zoo writes both on the way to CS (``replace_final_norm``, falcon_40b.py lines 394-401 and
407-421, rules the 180B converters include) and we do too. On the way to HF a Trainer save and a
Model Zoo file hold both: ``ln_f.*`` is then a tie of ``transformer_decoder.norm.*``
(:func:`cs_ties`), and read only when it is the one present. A tied ``lm_head.weight`` that
``save_pretrained`` left out is written from the embeddings, while Model Zoo's ``lm_head`` rule
(falcon_180b.py lines 756-759) renames only a head the HF file has: the CS model's state dict has
the head and the Trainer loads strictly (docs/MODELZOO_PARITY.md §5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ckpt_migrate.hf.mapping import MappingError, Out, Shape, missing_inputs, rename

NAMES = ("falcon", "falcon-headless")
HF_MODEL_TYPES = ("falcon",)
# The transformers class of each name (``config.json`` ``architectures``).
ARCHITECTURES = {"falcon": "FalconForCausalLM", "falcon-headless": "FalconModel"}

# Model Zoo: falcon_180b.py lines 267-291 and 631-635, HF defaults filled in first.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 65024,
    "hidden_size": 4544,
    "num_hidden_layers": 32,
    "num_attention_heads": 71,
    "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.02,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "num_kv_heads": None,
    "alibi": False,
    "new_decoder_architecture": False,
    "multi_query": True,
    "parallel_attn": True,
    "bias": False,
    "max_position_embeddings": 2048,
    "rope_scaling": None,
    "num_ln_in_parallel_attn": None,
    "ffn_hidden_size": None,
    "activation": "gelu",
    "tie_word_embeddings": True,
}
# Model Zoo: falcon_180b.py lines 292-305 and 636-640, CS defaults filled in first.
CS_DEFAULTS: dict[str, Any] = {
    "position_embedding_type": "rotary",
    "rope_theta": 10000.0,
    "embedding_dropout_rate": 0.1,
    "share_embedding_weights": True,
    "nonlinearity": "gelu",
    "max_position_embeddings": 1024,
    "attention_module": "aiayn_attention",
    "attention_type": "scaled_dot_product",
    "use_untied_layer_norm": False,
    "extra_attention_params": {"num_kv_groups": 1},
    "pos_scaling_factor": 1.0,
    "use_bias_in_output": False,
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": False,
    "attention_dropout_rate": 0.0,
    "residual_dropout_rate": 0.0,
    "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.02,
    "norm_type": "layernorm",
}
# Model Zoo: falcon_180b.py lines 181-264 and 502-512, CS fields that must hold these values.
CS_FIXED: dict[str, Any] = {
    "position_embedding_type": "rotary",
    "nonlinearity": "gelu",
    "use_bias_in_output": False,
    "attention_module": "multiquery_attention",
    "attention_type": "scaled_dot_product",
    "embedding_dropout_rate": 0.0,
    "norm_type": "layernorm",
}
MUP_FIELDS = (
    "mup_base_hidden_size",
    "mup_base_filter_size",
    "output_logits_alpha",
    "output_logits_scale",
    "scale_qk_dot_by_d",
    "scale_output_logits_by_d",
    "attention_logits_alpha",
)
BIAS_FIELDS = ("use_projection_bias_in_attention", "use_ffn_bias_in_attention", "use_ffn_bias")
EMBED = "embedding_layer.word_embeddings.weight"
HEAD = "lm_head.weight"
# The CS model's second name of its final norm (copy -> the name the plan reads), see above.
LN_F = {f"ln_f.{p}": f"transformer_decoder.norm.{p}" for p in ("weight", "bias")}
# Model Zoo drops ALiBi slopes on the way to HF (falcon_180b.py lines 42-47 and 719-723).
CS_DROPPED = ("embedding_layer.position_embed_helper.slopes", "relative_pe_helper.slopes")


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise MappingError(f"{name}: this family serves {', '.join(NAMES)}")


def _get(cfg: Mapping[str, Any], key: str, defaults: Mapping[str, Any]) -> Any:
    return cfg[key] if key in cfg else defaults.get(key)


def _hf_layout(hf: Mapping[str, Any]) -> tuple[int, bool]:
    """(KV groups, two layer norms) of an HF config.

    Model Zoo: falcon_180b.py lines 332-393 (``num_kv_heads``: 1 for the old multi-query
    layout, one per head for the old per-head layout) and 491-500 (``use_untied_layer_norm``
    when the new decoder architecture has ``num_ln_in_parallel_attn`` == 2)."""
    if hf["alibi"]:
        raise MappingError("alibi: CS Falcon supports rotary embeddings only (Model Zoo)")
    if not hf["parallel_attn"]:
        raise MappingError("parallel_attn: sequential Falcon blocks have no CS equivalent")
    heads = hf["num_attention_heads"]
    new = hf["new_decoder_architecture"]
    norms = hf["num_ln_in_parallel_attn"]
    if new:
        groups = hf["num_kv_heads"] if hf["num_kv_heads"] is not None else heads
        return groups, norms in (None, 2)
    if norms == 2:
        raise MappingError("num_ln_in_parallel_attn: 2 needs new_decoder_architecture")
    return (1 if hf["multi_query"] else heads), False


def _rope(hf: Mapping[str, Any]) -> tuple[float, float]:
    """(theta, linear scaling factor) from ``rope_parameters`` (transformers 5) or the older
    ``rope_theta`` / ``rope_scaling``. Model Zoo: falcon_180b.py lines 642-681 (only the
    linear kind is carried here)."""
    params = dict(hf.get("rope_parameters") or {})
    legacy = dict(hf.get("rope_scaling") or {})
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    kind = params.get("rope_type", legacy.get("type", legacy.get("rope_type", "default")))
    if kind not in ("default", "linear"):
        raise MappingError(f"rope_parameters: rope_type {kind!r} is not supported")
    factor = params.get("factor", legacy.get("factor", 1.0)) if kind == "linear" else 1.0
    return float(theta), float(factor)


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: falcon_180b.py lines 134-551 and 612-693 (rules, defaults, post-conversion
    ``rotary_dim`` = head size, ``filter_size`` = 4 * ``hidden_size``)."""
    _check_name(name)
    hf = {**HF_DEFAULTS, **hf_config}
    if hf.get("model_type", "falcon") != "falcon":
        raise MappingError(f"model_type: expected 'falcon', got {hf['model_type']!r}")
    hidden = hf["hidden_size"]
    if hf["ffn_hidden_size"] not in (None, 4 * hidden):
        raise MappingError(f"ffn_hidden_size: CS Falcon needs 4 * hidden_size ({4 * hidden})")
    if hf["activation"] != "gelu":
        raise MappingError(f"activation: CS Falcon needs gelu, got {hf['activation']!r}")
    groups, untied = _hf_layout(hf)
    theta, factor = _rope(hf)
    cs = {
        "vocab_size": hf["vocab_size"],
        "hidden_size": hidden,
        "filter_size": 4 * hidden,
        "num_heads": hf["num_attention_heads"],
        "extra_attention_params": {"num_kv_groups": groups},
        "num_hidden_layers": hf["num_hidden_layers"],
        "max_position_embeddings": hf["max_position_embeddings"],
        "position_embedding_type": "rotary",
        "rope_theta": theta,
        "pos_scaling_factor": factor,
        "rotary_dim": hidden // hf["num_attention_heads"],
        "share_embedding_weights": hf["tie_word_embeddings"],
        "attention_dropout_rate": hf["attention_dropout"],
        "residual_dropout_rate": hf["hidden_dropout"],
        "layer_norm_epsilon": hf["layer_norm_epsilon"],
        "initializer_range": hf["initializer_range"],
        **dict.fromkeys(BIAS_FIELDS, hf["bias"]),
        "use_untied_layer_norm": untied,
        # Model Zoo: falcon_180b.py lines 314-330, the post-conversion CS defaults.
        "embedding_dropout_rate": 0.0,
        "nonlinearity": "gelu",
        "attention_module": "multiquery_attention",
        "attention_type": "scaled_dot_product",
        "loss_scaling": "num_tokens",
        "use_bias_in_output": False,
    }
    if factor != 1.0:
        cs["pos_scaling_type"] = "linear"
    return cs


def _cs_layout(cs: Mapping[str, Any]) -> tuple[int, bool]:
    """(KV groups, two layer norms) of a CS config, checked as Model Zoo does
    (falcon_180b.py lines 395-424 biases, 449-465 filter size, 502-538 layout)."""
    for key in MUP_FIELDS:
        if cs.get(key) not in (None, False):
            raise MappingError(f"{key}: muP models are not supported for Falcon")
    if cs.get("embeddings_scale") not in (None, 1, 1.0):
        raise MappingError("embeddings_scale: muP models are not supported for Falcon")
    for key in ("hidden_size", "num_heads", "filter_size"):
        if key not in cs:
            raise MappingError(f"{key}: a CS Falcon config must give it")
    for key, value in CS_FIXED.items():
        if _get(cs, key, CS_DEFAULTS) != value:
            got = _get(cs, key, CS_DEFAULTS)
            raise MappingError(f"{key}: HF Falcon needs {value!r}, got {got!r}")
    if len({_get(cs, key, CS_DEFAULTS) for key in BIAS_FIELDS}) != 1:
        raise MappingError(f"{BIAS_FIELDS[0]}: HF Falcon needs {', '.join(BIAS_FIELDS)} equal")
    hidden, heads = cs["hidden_size"], cs["num_heads"]
    if cs["filter_size"] != 4 * hidden:
        raise MappingError(f"filter_size: HF Falcon needs 4 * hidden_size ({4 * hidden})")
    if cs.get("rotary_dim", hidden // heads) != hidden // heads:
        raise MappingError(f"rotary_dim: HF Falcon rotates whole heads ({hidden // heads})")
    groups = _get(cs, "extra_attention_params", CS_DEFAULTS).get("num_kv_groups", 1)
    untied = bool(_get(cs, "use_untied_layer_norm", CS_DEFAULTS))
    if not untied and groups not in (1, heads):
        raise MappingError(
            "use_untied_layer_norm: false needs num_kv_groups of 1 or num_heads in HF Falcon"
        )
    if cs.get("pos_scaling_type", "linear") != "linear":
        raise MappingError(f"pos_scaling_type: {cs['pos_scaling_type']!r} is not supported")
    return groups, untied


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: falcon_180b.py lines 134-551 and 612-693 read from CS to HF (lines 514-538:
    untied norms mean the new decoder architecture, else multi-query or per-head MHA).

    As Model Zoo writes them: the three CS bias switches under their CS names (its rules, lines
    215-229 with ``convert_bias`` lines 411-424, copy them so; transformers keeps them as unused
    attributes) besides HF's ``bias``, which Model Zoo leaves out; ``rope_scaling`` null without
    scaling (``convert_pi``, lines 682-684), else the ``rope_parameters`` mapping (transformers 5
    reads ``rope_scaling`` as its alias, so the two must agree) where Model Zoo writes the legacy
    ``{"type": "linear", "factor": f}`` (lines 685-689)."""
    _check_name(name)
    groups, untied = _cs_layout(cs_model)
    cs = {**CS_DEFAULTS, **cs_model}
    rope: dict[str, Any] = {"rope_theta": float(cs["rope_theta"]), "rope_type": "default"}
    if cs["pos_scaling_factor"] != 1.0:
        rope.update(rope_type="linear", factor=cs["pos_scaling_factor"])
    return {
        "architectures": [ARCHITECTURES[name]],
        "model_type": "falcon",
        "vocab_size": cs["vocab_size"],
        "hidden_size": cs["hidden_size"],
        "ffn_hidden_size": cs["filter_size"],
        "activation": "gelu",
        "num_attention_heads": cs["num_heads"],
        "num_kv_heads": groups,
        "num_hidden_layers": cs["num_hidden_layers"],
        "max_position_embeddings": cs["max_position_embeddings"],
        "attention_dropout": cs["attention_dropout_rate"],
        "hidden_dropout": cs["residual_dropout_rate"],
        "layer_norm_epsilon": cs["layer_norm_epsilon"],
        "initializer_range": cs["initializer_range"],
        "bias": bool(cs["use_ffn_bias"]),
        "alibi": False,
        "parallel_attn": True,
        "new_decoder_architecture": untied,
        "multi_query": groups == 1,
        "num_ln_in_parallel_attn": 2 if untied else None,
        "rope_theta": float(cs["rope_theta"]),
        "rope_parameters": rope,
        "rope_scaling": dict(rope) if rope["rope_type"] == "linear" else None,
        "tie_word_embeddings": cs["share_embedding_weights"],
        **{key: cs[key] for key in BIAS_FIELDS},
    }


def _interleave(t: np.ndarray, rotary_dim: int) -> np.ndarray:
    """Model Zoo: falcon_40b.py lines 71-95, per head the two rotary halves
    ``[x0..x(n-1), y0..y(n-1)]`` become pairs ``[x0, y0, x1, y1, ...]``; ``t`` is
    [heads, head_dim, ...]."""
    heads, rest = t.shape[0], t.shape[2:]
    rot = t[:, :rotary_dim].reshape(heads, 2, rotary_dim // 2, *rest).swapaxes(1, 2)
    return np.concatenate([rot.reshape(heads, rotary_dim, *rest), t[:, rotary_dim:]], axis=1)


def _deinterleave(t: np.ndarray, rotary_dim: int) -> np.ndarray:
    """Model Zoo: falcon_40b.py lines 97-126, the inverse of :func:`_interleave`."""
    heads, rest = t.shape[0], t.shape[2:]
    rot = t[:, :rotary_dim].reshape(heads, rotary_dim // 2, 2, *rest).swapaxes(1, 2)
    return np.concatenate([rot.reshape(heads, rotary_dim, *rest), t[:, rotary_dim:]], axis=1)


def _unfuse(x: np.ndarray, which: str, groups: int, head_dim: int) -> np.ndarray:
    """Model Zoo: falcon_40b.py lines 128-201, ``query_key_value`` viewed as
    [groups, group size + 2, head_dim, ...]: the group's query heads, then its key, then its
    value; Q and K get their rotary rows interleaved."""
    rest = x.shape[1:]
    t = x.reshape(groups, -1, head_dim, *rest)
    size = t.shape[1] - 2
    part = {"q": t[:, :size], "k": t[:, size : size + 1], "v": t[:, size + 1 :]}[which]
    part = part.reshape(-1, head_dim, *rest)
    if which != "v":
        part = _interleave(part, head_dim)
    return np.ascontiguousarray(part.reshape(-1, *rest))


def _fuse(q: np.ndarray, k: np.ndarray, v: np.ndarray, groups: int, head_dim: int) -> np.ndarray:
    """Model Zoo: falcon_40b.py lines 203-283, the inverse of :func:`_unfuse`."""
    rest = q.shape[1:]
    q = _deinterleave(q.reshape(-1, head_dim, *rest), head_dim)
    k = _deinterleave(k.reshape(-1, head_dim, *rest), head_dim)
    parts = [t.reshape(groups, -1, head_dim, *rest) for t in (q, k, v)]
    return np.concatenate(parts, axis=1).reshape(-1, *rest)


def _layer_pairs(untied: bool, bias: bool) -> list[tuple[str, str]]:
    """(HF, CS) names inside a block. Model Zoo: falcon_180b.py lines 48-127 (norms),
    falcon_40b.py lines 372-393 (mlp; dense via the attention rules, lines 41-47)."""
    norms = (
        [("ln_attn", "norm1"), ("ln_mlp", "norm3")] if untied else [("input_layernorm", "norm1")]
    )
    linear = [
        ("self_attention.dense", "self_attn.proj_output_dense_layer"),
        ("mlp.dense_h_to_4h", "ffn.ffn.0.linear_layer"),
        ("mlp.dense_4h_to_h", "ffn.ffn.1.linear_layer"),
    ]
    out = [(f"{h}.{w}", f"{c}.{w}") for h, c in norms for w in ("weight", "bias")]
    return out + [
        (f"{h}.{w}", f"{c}.{w}") for h, c in linear for w in ("weight", "bias")[: 1 + bias]
    ]


def _pairs(layers: int, prefix: str, untied: bool, bias: bool) -> list[tuple[str, str]]:
    """(HF name, CS name) of every renamed tensor; ``prefix`` is ``transformer.`` or empty."""
    out = [
        (prefix + "word_embeddings.weight", EMBED),
        (prefix + "ln_f.weight", "transformer_decoder.norm.weight"),
        (prefix + "ln_f.bias", "transformer_decoder.norm.bias"),
    ]
    for i in range(layers):
        out += [
            (f"{prefix}h.{i}.{h}", f"transformer_decoder.layers.{i}.{c}")
            for h, c in _layer_pairs(untied, bias)
        ]
    return out


def _qkv_plans(cs: Mapping[str, Any], prefix: str, groups: int, bias: bool) -> tuple[list, list]:
    """(HF -> CS unfusing, CS -> HF fusing) of every layer's ``query_key_value``."""
    heads, head_dim = cs["num_heads"], cs["hidden_size"] // cs["num_heads"]
    rows = {"q": heads * head_dim, "k": groups * head_dim, "v": groups * head_dim}
    to_cs, to_hf = [], []
    for i in range(cs["num_hidden_layers"]):
        for kind in ("weight", "bias")[: 1 + bias]:
            fused = f"{prefix}h.{i}.self_attention.query_key_value.{kind}"
            names = [
                f"transformer_decoder.layers.{i}.self_attn.proj_{w}_dense_layer.{kind}"
                for w in "qkv"
            ]
            for which, cs_name in zip("qkv", names, strict=True):
                to_cs.append(
                    Out(
                        cs_name,
                        (fused,),
                        lambda x, w=which: _unfuse(x, w, groups, head_dim),
                        infer=lambda s, n=rows[which]: (n, *s[1:]),
                        note=f"{which.upper()} of the grouped fused query_key_value",
                    )
                )
            to_hf.append(
                Out(
                    fused,
                    tuple(names),
                    lambda q, k, v: _fuse(q, k, v, groups, head_dim),
                    infer=lambda q, k, v: (q[0] + k[0] + v[0], *q[1:]),
                    note="Q, K, V fused per KV group, rotary rows de-interleaved",
                )
            )
    return to_cs, to_hf


def _finish(plan: list[Out], source: Mapping[str, Shape]) -> list[Out]:
    """Every input the plan reads exists. Source tensors no rule reads are left to the
    pipeline's ``unused_inputs`` check; the hooks below name the expected ones."""
    missing = missing_inputs(plan, source)
    if missing:
        raise MappingError(f"{missing[0]}: the checkpoint lacks this tensor")
    return plan


def _random_head(shape: Shape) -> Callable[[], np.ndarray]:
    """Model Zoo: falcon_40b.py lines 471-478, an untied head HF lacks is drawn N(0, 0.02) in
    float32 (seeded here, so repeatable)."""

    def build() -> np.ndarray:
        return np.random.default_rng(0).normal(0.0, 0.02, shape).astype(np.float32)

    return build


def _source(cs: Mapping[str, Shape], cs_name: str, tied: bool) -> str:
    """The CS tensor to read for ``cs_name``: itself, else the copy of it that exists (``ln_f.*``
    for the final norm; the head for tied embeddings, Model Zoo falcon_40b.py lines 561-580)."""
    copies = {v: k for k, v in LN_F.items()} | ({EMBED: HEAD} if tied else {})
    copy = copies.get(cs_name)
    return copy if cs_name not in cs and copy in cs else cs_name


def cs_ties(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """CS tensors that copy another one the plan reads, when both are present: ``ln_f.*`` of
    ``transformer_decoder.norm.*`` (one module, see above) and ``lm_head.weight`` when
    ``share_embedding_weights`` (Model Zoo: falcon_40b.py ``pre_model_convert``, lines
    561-580); HF's ``save_pretrained`` does not store a tied head either."""
    ties = dict(LN_F)
    if _get(cs_model, "share_embedding_weights", CS_DEFAULTS):
        ties[HEAD] = EMBED
    return {k: v for k, v in ties.items() if k in cs and v in cs}


def cs_dropped(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """CS tensors Model Zoo leaves out on the way to HF, with the reason: the head of a
    headless model (converter note, lines 89-98 of falcon.py)."""
    out = {n: "ALiBi slopes, which HF computes itself" for n in CS_DROPPED if n in cs}
    if name.endswith("-headless"):
        ties = cs_ties(cs, cs_model, name)
        why = "the headless HF model has no lm_head (Model Zoo drops it)"
        out.update({n: why for n in (HEAD, "lm_head.bias") if n in cs and n not in ties})
    return out


def plan_to_cs(hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str) -> list[Out]:
    """Model Zoo: falcon_180b.py lines 36-131 and 568-588, renames and grouped QKV unfusing, the
    final norm under both names (falcon_40b.py lines 407-421); a headless model gets a new head
    (falcon_40b.py lines 461-481): the embeddings when tied, else N(0, 0.02). A tied head the HF
    file lacks is the embeddings (module docstring)."""
    cfg = config_to_cs(hf_config, name)
    headless = name.endswith("-headless")
    prefix = "" if headless else "transformer."
    groups, bias = cfg["extra_attention_params"]["num_kv_groups"], cfg["use_ffn_bias"]
    pairs = _pairs(cfg["num_hidden_layers"], prefix, cfg["use_untied_layer_norm"], bias)
    plan = [rename(h, c) for h, c in pairs]
    source = {out.name: out.inputs[0] for out in plan}
    plan += [rename(source[norm], copy) for copy, norm in LN_F.items()]
    plan += _qkv_plans(cfg, prefix, groups, bias)[0]
    embed = prefix + "word_embeddings.weight"
    tied = cfg["share_embedding_weights"]
    if headless and not tied:
        shape = (cfg["vocab_size"], cfg["hidden_size"])
        plan.append(Out(HEAD, (), _random_head(shape), shape=shape, note="N(0, 0.02)"))
    elif headless:
        plan.append(rename(embed, HEAD))
    else:
        plan.append(rename(HEAD if HEAD in hf or not tied else embed, HEAD))
    return _finish(plan, hf)


def plan_to_hf(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> list[Out]:
    """Model Zoo: falcon_180b.py lines 36-131 and 568-588, renames (``norm1``/``norm3`` become
    ``ln_attn``/``ln_mlp`` with untied norms, else ``input_layernorm``; of whichever copy of the
    embeddings and the final norm exists, :func:`_source`) and grouped QKV fusing; a tied head
    is not written (HF ties it on load)."""
    _check_name(name)
    groups, untied = _cs_layout(cs_model)
    cfg = {**CS_DEFAULTS, **cs_model}
    headless = name.endswith("-headless")
    prefix = "" if headless else "transformer."
    bias = bool(cfg["use_ffn_bias"])
    tied = bool(cfg["share_embedding_weights"])
    pairs = _pairs(cfg["num_hidden_layers"], prefix, untied, bias)
    plan = [rename(_source(cs, c, tied), h) for h, c in pairs]
    plan += _qkv_plans(cfg, prefix, groups, bias)[1]
    if not headless and not tied:
        plan.append(rename(HEAD, HEAD))
    return _finish(plan, cs)
