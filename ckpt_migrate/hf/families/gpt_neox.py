"""GPT-NeoX: Hugging Face ``GPTNeoXForCausalLM`` / ``GPTNeoXModel`` <-> Cerebras ``gpt-neox``
(the GPT-J backbone configured as NeoX: parallel residual with two layer norms).

Model Zoo's reference is ``tools/checkpoint_converters/gpt_neox_hf_cs.py`` at Release_2.10.0
(``Converter_GPT_Neox_Attention_HF_CS17`` lines 37-328, ``Converter_GPT_Neox_Headless_HF_CS17``
lines 331-501, ``Converter_GPT_Neox_LMHeadModel_HF_CS17`` lines 564-603,
``ConfigConverter_GPT_Neox_HF_CS17`` lines 656-870 and ``ConfigConverter_GPT_Neox_HF_CS21``
lines 1011-1093, which serves 2.1 to 2.9). HF fuses Q, K and V per head
(``query_key_value`` rows are ``[head][q|k|v][head_size]``) and rotates the first ``rotary_dim``
channels of a head as two halves, while CS rotates adjacent pairs: Model Zoo interleaves the
rotary rows of Q and K (lines 79-136).

The CS model is GPT-J's (``GPTNeoXModelConfig(GPTJModelConfig)``, ``models/nlp/gptj/model.py``
lines 402-410), which registers its final norm under two names, ``ln_f`` and
``transformer_decoder.norm`` (one module, ``models/nlp/gptj/gptj_model.py`` lines 535-538): Model
Zoo writes both on the way to CS (``replace_final_norm``, gpt_neox_hf_cs.py lines 345-354 and
421-435) and we do too. On the way to HF a Trainer save and a Model Zoo file hold both: ``ln_f.*``
is then a tie of ``transformer_decoder.norm.*`` (:func:`cs_ties`), and read only when it is the
one present. A tied head that ``save_pretrained`` left out is written from the embeddings, while
Model Zoo's ``embed_out`` rule (lines 568-574) renames only a head the HF file has: the CS model's
state dict has the head and the Trainer loads strictly (docs/MODELZOO_PARITY.md §5).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ckpt_migrate.hf.mapping import MappingError, Out, Shape, missing_inputs, rename

NAMES = ("gpt-neox", "gpt-neox-headless")
HF_MODEL_TYPES = ("gpt_neox",)
# The transformers class of each name (``config.json`` ``architectures``).
ARCHITECTURES = {"gpt-neox": "GPTNeoXForCausalLM", "gpt-neox-headless": "GPTNeoXModel"}

# Model Zoo: gpt_neox_hf_cs.py lines 791-807 and 1030-1034, HF defaults filled in first.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50432,
    "hidden_size": 6144,
    "num_hidden_layers": 44,
    "num_attention_heads": 64,
    "intermediate_size": 24576,
    "hidden_act": "gelu",
    "max_position_embeddings": 2048,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "use_parallel_residual": True,
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
    "attention_bias": True,
}
# Model Zoo: gpt_neox_hf_cs.py lines 808-825 and 1035-1039, CS defaults filled in first.
CS_DEFAULTS: dict[str, Any] = {
    "max_position_embeddings": 1024,
    "embedding_dropout_rate": 0.1,
    "share_embedding_weights": True,
    "residual_dropout_rate": 0.1,
    "nonlinearity": "gelu",
    "layer_norm_epsilon": 1.0e-5,
    "use_ffn_bias": False,
    "use_untied_layer_norm": False,
    "attention_dropout_rate": 0.1,
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "initializer_range": 0.02,
    "use_bias_in_output": False,
    "norm_first": True,
    "pos_scaling_factor": 1.0,
    # Not in Model Zoo's defaults: the CS model's own (``GPTJSubModelConfig``,
    # models/nlp/gptj/gptj_model.py lines 69-71). Model Zoo's CS config leaves the field out
    # (its rule, lines 666-669, only checks a value the CS config gives).
    "position_embedding_type": "rotary",
    "attention_type": "scaled_dot_product",
    "embedding_layer_norm": False,
    "fixed_sparse_attention": None,
    "use_ff_layer1_dropout": False,
    "norm_type": "layernorm",
    "use_position_embedding": True,
    "rope_theta": 10000.0,
}
# Model Zoo: gpt_neox_hf_cs.py lines 666-788 and 929-938, CS fields that must hold these values
# (``rope_theta``: Model Zoo asserts HF ``rotary_emb_base`` == 10000, line 756-759).
CS_FIXED: dict[str, Any] = {
    "position_embedding_type": "rotary",
    "use_position_embedding": True,
    "embedding_dropout_rate": 0.0,
    "attention_type": "scaled_dot_product",
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True,
    "use_bias_in_output": False,
    "embedding_layer_norm": False,
    "fixed_sparse_attention": None,
    "norm_first": True,
    "use_ff_layer1_dropout": False,
    "use_untied_layer_norm": True,
    "norm_type": "layernorm",
    "rope_theta": 10000.0,
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
# (HF name inside ``layers.N.``, CS name inside ``transformer_decoder.layers.N.``).
# Model Zoo: gpt_neox_hf_cs.py lines 41-47 (dense) and 365-406 (norms, ffn).
LAYER_PAIRS = tuple(
    (f"{hf}.{w}", f"{cs}.{w}")
    for hf, cs in (
        ("input_layernorm", "norm1"),
        ("post_attention_layernorm", "norm3"),
        ("attention.dense", "self_attn.proj_output_dense_layer"),
        ("mlp.dense_h_to_4h", "ffn.ffn.0.linear_layer"),
        ("mlp.dense_4h_to_h", "ffn.ffn.1.linear_layer"),
    )
    for w in ("weight", "bias")
)
# Model Zoo: gpt_neox_hf_cs.py lines 335-354 (embeddings, final norm).
TOP_PAIRS = (
    ("embed_in.weight", "embedding_layer.word_embeddings.weight"),
    ("final_layer_norm.weight", "transformer_decoder.norm.weight"),
    ("final_layer_norm.bias", "transformer_decoder.norm.bias"),
)
# HF buffers older transformers saved and Model Zoo skips (lines 410-418).
HF_DROPPED = re.compile(
    r"(gpt_neox\.)?layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)"
)
EMBED = "embedding_layer.word_embeddings.weight"
HEAD = "lm_head.weight"
# The CS model's second name of its final norm (copy -> the name the plan reads), see above.
LN_F = {f"ln_f.{p}": f"transformer_decoder.norm.{p}" for p in ("weight", "bias")}
LEGACY_HEAD = "embed_out.weight"  # the name in HF files (transformers 5 loads it as lm_head)


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise MappingError(f"{name}: this family serves {', '.join(NAMES)}")


def _get(cfg: Mapping[str, Any], key: str, defaults: Mapping[str, Any]) -> Any:
    return cfg[key] if key in cfg else defaults.get(key)


def _check_cs(cs: Mapping[str, Any]) -> None:
    """Reject CS settings HF GPT-NeoX cannot express, naming the field."""
    for key in MUP_FIELDS:
        if cs.get(key) not in (None, False):
            raise MappingError(f"{key}: muP models are not supported for GPT-NeoX")
    if cs.get("embeddings_scale") not in (None, 1, 1.0):
        raise MappingError("embeddings_scale: muP models are not supported for GPT-NeoX")
    for key, value in CS_FIXED.items():
        if _get(cs, key, CS_DEFAULTS) != value:
            got = _get(cs, key, CS_DEFAULTS)
            raise MappingError(f"{key}: HF GPT-NeoX needs {value!r}, got {got!r}")
    for key in ("rotary_dim", "hidden_size", "num_heads"):
        if key not in cs:
            raise MappingError(f"{key}: a CS GPT-NeoX config must give it")
    if cs["rotary_dim"] % 2:
        raise MappingError(f"rotary_dim: must be even, got {cs['rotary_dim']}")


def _rope(hf: Mapping[str, Any]) -> tuple[float, float, float]:
    """(theta, rotary fraction, linear scaling factor) from transformers 5 ``rope_parameters``
    or the older ``rotary_pct`` / ``rotary_emb_base`` / ``rope_scaling`` fields.

    Model Zoo: gpt_neox_hf_cs.py lines 752-759 (``rotary_pct``, base 10000 asserted) and
    1041-1080 (``rope_scaling``; only the linear kind is carried here)."""
    params = dict(hf.get("rope_parameters") or {})
    legacy = dict(hf.get("rope_scaling") or {})
    theta = params.get("rope_theta", hf.get("rotary_emb_base", 10000.0))
    fraction = params.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))
    kind = params.get("rope_type", legacy.get("type", legacy.get("rope_type", "default")))
    if kind not in ("default", "linear"):
        raise MappingError(f"rope_parameters: rope_type {kind!r} is not supported")
    if theta != 10000:
        raise MappingError(f"rope_parameters: rope_theta must be 10000 (Model Zoo), got {theta}")
    factor = params.get("factor", legacy.get("factor", 1.0)) if kind == "linear" else 1.0
    return float(theta), float(fraction), float(factor)


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: gpt_neox_hf_cs.py lines 656-870 and 1011-1093 (rules and defaults)."""
    _check_name(name)
    hf = {**HF_DEFAULTS, **hf_config}
    if hf.get("model_type", "gpt_neox") != "gpt_neox":
        raise MappingError(f"model_type: expected 'gpt_neox', got {hf['model_type']!r}")
    if hf["use_parallel_residual"] is not True:
        raise MappingError("use_parallel_residual: CS GPT-NeoX needs the parallel residual")
    if hf["attention_bias"] is not True:
        raise MappingError("attention_bias: CS GPT-NeoX needs attention biases")
    _, fraction, factor = _rope(hf)
    head_size = hf["hidden_size"] // hf["num_attention_heads"]
    cs = {
        "vocab_size": hf["vocab_size"],
        "hidden_size": hf["hidden_size"],
        "num_heads": hf["num_attention_heads"],
        "num_hidden_layers": hf["num_hidden_layers"],
        "max_position_embeddings": hf["max_position_embeddings"],
        "filter_size": hf["intermediate_size"],
        "nonlinearity": hf["hidden_act"],
        "layer_norm_epsilon": hf["layer_norm_eps"],
        "attention_dropout_rate": hf["attention_dropout"],
        "residual_dropout_rate": hf["hidden_dropout"],
        "rotary_dim": int(head_size * fraction),
        "initializer_range": hf["initializer_range"],
        "share_embedding_weights": hf["tie_word_embeddings"],
        "position_embedding_type": "rotary",
        "pos_scaling_factor": factor,
        # Model Zoo: gpt_neox_hf_cs.py lines 835-847, the post-conversion CS defaults.
        "attention_type": "scaled_dot_product",
        "use_untied_layer_norm": True,
        "use_projection_bias_in_attention": True,
        "use_ffn_bias_in_attention": True,
        "use_ffn_bias": True,
        "use_bias_in_output": False,
        "embedding_dropout_rate": 0.0,
    }
    if factor != 1.0:
        cs["pos_scaling_type"] = "linear"
    return cs


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: gpt_neox_hf_cs.py lines 656-870 and 1011-1093 read from CS to HF;
    ``rotary_pct`` = ``rotary_dim`` / head size (lines 866-870). Written both as transformers 5
    ``rope_parameters`` and as the older ``rotary_pct`` / ``rotary_emb_base`` / ``rope_scaling``
    fields: ``rope_scaling`` is null without scaling, as Model Zoo writes it (``convert_pi``,
    lines 1082-1084); with scaling it is the ``rope_parameters`` mapping (transformers 5 reads
    ``rope_scaling`` as its alias, so the two must agree), where Model Zoo writes the legacy
    ``{"type": "linear", "factor": f}`` (lines 1085-1089)."""
    _check_name(name)
    _check_cs(cs_model)
    cs = {**CS_DEFAULTS, **cs_model}
    if cs.get("pos_scaling_type", "linear") != "linear":
        raise MappingError(f"pos_scaling_type: {cs['pos_scaling_type']!r} is not supported")
    fraction = cs["rotary_dim"] / (cs["hidden_size"] // cs["num_heads"])
    rope: dict[str, Any] = {"rope_theta": 10000.0, "partial_rotary_factor": fraction}
    rope["rope_type"] = "default"
    if cs["pos_scaling_factor"] != 1.0:
        rope.update(rope_type="linear", factor=cs["pos_scaling_factor"])
    return {
        "architectures": [ARCHITECTURES[name]],
        "model_type": "gpt_neox",
        "vocab_size": cs["vocab_size"],
        "hidden_size": cs["hidden_size"],
        "num_attention_heads": cs["num_heads"],
        "num_hidden_layers": cs["num_hidden_layers"],
        "max_position_embeddings": cs["max_position_embeddings"],
        "intermediate_size": cs["filter_size"],
        "hidden_act": cs["nonlinearity"],
        "layer_norm_eps": cs["layer_norm_epsilon"],
        "attention_dropout": cs["attention_dropout_rate"],
        "hidden_dropout": cs["residual_dropout_rate"],
        "initializer_range": cs["initializer_range"],
        "tie_word_embeddings": cs["share_embedding_weights"],
        "use_parallel_residual": True,
        "attention_bias": True,
        "rope_parameters": rope,
        "rotary_pct": fraction,
        "rotary_emb_base": 10000,
        "rope_scaling": dict(rope) if rope["rope_type"] == "linear" else None,
    }


def _interleave(t: np.ndarray, rotary_dim: int) -> np.ndarray:
    """Model Zoo: gpt_neox_hf_cs.py lines 79-104, per head ``[x0..x(n-1), y0..y(n-1)]`` of the
    first ``rotary_dim`` rows becomes ``[x0, y0, x1, y1, ...]``; ``t`` is [heads, head_size,
    ...]."""
    heads, rest = t.shape[0], t.shape[2:]
    rot = t[:, :rotary_dim].reshape(heads, 2, rotary_dim // 2, *rest).swapaxes(1, 2)
    return np.concatenate([rot.reshape(heads, rotary_dim, *rest), t[:, rotary_dim:]], axis=1)


def _deinterleave(t: np.ndarray, rotary_dim: int) -> np.ndarray:
    """Model Zoo: gpt_neox_hf_cs.py lines 106-136, the inverse of :func:`_interleave`."""
    heads, rest = t.shape[0], t.shape[2:]
    rot = t[:, :rotary_dim].reshape(heads, rotary_dim // 2, 2, *rest).swapaxes(1, 2)
    return np.concatenate([rot.reshape(heads, rotary_dim, *rest), t[:, rotary_dim:]], axis=1)


def _unfuse(x: np.ndarray, which: int, heads: int, rotary_dim: int) -> np.ndarray:
    """Model Zoo: gpt_neox_hf_cs.py lines 156-216, ``query_key_value`` viewed as
    [heads, 3, head_size, ...]; Q (0) and K (1) get their rotary rows interleaved, V (2) not."""
    t = x.reshape(heads, 3, -1, *x.shape[1:])[:, which]
    if which < 2:
        t = _interleave(t, rotary_dim)
    return np.ascontiguousarray(t.reshape(-1, *x.shape[1:]))


def _fuse(q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int, rotary_dim: int) -> np.ndarray:
    """Model Zoo: gpt_neox_hf_cs.py lines 218-303, the inverse of :func:`_unfuse`."""
    rest = q.shape[1:]
    parts = [t.reshape(heads, -1, *rest) for t in (q, k, v)]
    parts[0], parts[1] = _deinterleave(parts[0], rotary_dim), _deinterleave(parts[1], rotary_dim)
    return np.concatenate(parts, axis=1).reshape(-1, *rest)


def _cs_attn(i: int, which: str, kind: str) -> str:
    return f"transformer_decoder.layers.{i}.self_attn.proj_{which}_dense_layer.{kind}"


def _qkv_plans(layers: int, prefix: str, heads: int, rotary_dim: int) -> tuple[list, list]:
    """(HF -> CS unfusing, CS -> HF fusing) of every layer's ``query_key_value``."""
    to_cs, to_hf = [], []
    for i in range(layers):
        for kind in ("weight", "bias"):
            fused = f"{prefix}layers.{i}.attention.query_key_value.{kind}"
            for j, which in enumerate("qkv"):
                to_cs.append(
                    Out(
                        _cs_attn(i, which, kind),
                        (fused,),
                        lambda x, j=j: _unfuse(x, j, heads, rotary_dim),
                        infer=lambda s: (s[0] // 3, *s[1:]),
                        note=f"{which.upper()} of the per-head fused query_key_value",
                    )
                )
            to_hf.append(
                Out(
                    fused,
                    tuple(_cs_attn(i, w, kind) for w in "qkv"),
                    lambda q, k, v: _fuse(q, k, v, heads, rotary_dim),
                    infer=lambda q, k, v: (q[0] + k[0] + v[0], *q[1:]),
                    note="Q, K, V fused per head, rotary rows de-interleaved",
                )
            )
    return to_cs, to_hf


def _pairs(layers: int, prefix: str) -> list[tuple[str, str]]:
    """(HF name, CS name) of every renamed tensor; ``prefix`` is ``gpt_neox.`` or empty."""
    out = [(prefix + hf, cs) for hf, cs in TOP_PAIRS]
    for i in range(layers):
        out += [
            (f"{prefix}layers.{i}.{hf}", f"transformer_decoder.layers.{i}.{cs}")
            for hf, cs in LAYER_PAIRS
        ]
    return out


def _finish(plan: list[Out], source: Mapping[str, Shape]) -> list[Out]:
    """Every input the plan reads exists. Source tensors no rule reads are left to the
    pipeline's ``unused_inputs`` check; the hooks below name the expected ones."""
    missing = missing_inputs(plan, source)
    if missing:
        raise MappingError(f"{missing[0]}: the checkpoint lacks this tensor")
    return plan


def _random_head(shape: Shape) -> Callable[[], np.ndarray]:
    """Model Zoo: gpt_neox_hf_cs.py lines 485-490, an untied head HF lacks is drawn N(0, 0.02) in
    float32 (seeded here, so repeatable)."""

    def build() -> np.ndarray:
        return np.random.default_rng(0).normal(0.0, 0.02, shape).astype(np.float32)

    return build


def _source(cs: Mapping[str, Shape], cs_name: str, tied: bool) -> str:
    """The CS tensor to read for ``cs_name``: itself, else the copy of it that exists (``ln_f.*``
    for the final norm; the head for tied embeddings, Model Zoo lines 584-603)."""
    copies = {v: k for k, v in LN_F.items()} | ({EMBED: HEAD} if tied else {})
    copy = copies.get(cs_name)
    return copy if cs_name not in cs and copy in cs else cs_name


def cs_ties(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """CS tensors that copy another one the plan reads, when both are present: ``ln_f.*`` of
    ``transformer_decoder.norm.*`` (one module, see above) and ``lm_head.weight`` when
    ``share_embedding_weights`` (Model Zoo: gpt_neox_hf_cs.py ``pre_model_convert``, lines
    584-603); HF's ``save_pretrained`` does not store a tied head either."""
    ties = dict(LN_F)
    if _get(cs_model, "share_embedding_weights", CS_DEFAULTS):
        ties[HEAD] = EMBED
    return {k: v for k, v in ties.items() if k in cs and v in cs}


def cs_dropped(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """CS tensors Model Zoo leaves out on the way to HF, with the reason: the head of a
    headless model (converter note, lines 507-516)."""
    out: dict[str, str] = {}
    if name.endswith("-headless"):
        ties = cs_ties(cs, cs_model, name)
        why = "the headless HF model has no lm_head (Model Zoo drops it)"
        out.update({n: why for n in (HEAD, "lm_head.bias") if n in cs and n not in ties})
    return out


def hf_dropped(hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str) -> dict[str, str]:
    """HF buffers older transformers saved and Model Zoo skips (lines 410-418)."""
    return {n: "a buffer Hugging Face regenerates" for n in hf if HF_DROPPED.fullmatch(n)}


def plan_to_cs(hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str) -> list[Out]:
    """Model Zoo: gpt_neox_hf_cs.py lines 331-419 and 564-582, renames and Q/K/V unfusing, the
    final norm under both names (lines 421-435); the head is ``lm_head`` (``embed_out`` before
    transformers 5); a headless model gets a new head (lines 475-490): the embeddings when tied,
    else N(0, 0.02). A tied head the HF file lacks is the embeddings (module docstring)."""
    cfg = config_to_cs(hf_config, name)
    headless = name.endswith("-headless")
    prefix = "" if headless else "gpt_neox."
    layers = cfg["num_hidden_layers"]
    plan = [rename(h, c) for h, c in _pairs(layers, prefix)]
    source = {out.name: out.inputs[0] for out in plan}
    plan += [rename(source[norm], copy) for copy, norm in LN_F.items()]
    plan += _qkv_plans(layers, prefix, cfg["num_heads"], cfg["rotary_dim"])[0]
    embed = prefix + "embed_in.weight"
    head = LEGACY_HEAD if LEGACY_HEAD in hf and HEAD not in hf else HEAD
    tied = cfg["share_embedding_weights"]
    if headless and not tied:
        shape = (cfg["vocab_size"], cfg["hidden_size"])
        plan.append(Out(HEAD, (), _random_head(shape), shape=shape, note="N(0, 0.02)"))
    elif headless:
        plan.append(rename(embed, HEAD))
    else:
        plan.append(rename(head if head in hf or not tied else embed, HEAD))
    return _finish(plan, hf)


def plan_to_hf(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> list[Out]:
    """Model Zoo: gpt_neox_hf_cs.py lines 331-419 and 564-603, renames (of whichever copy of the
    embeddings and the final norm exists, :func:`_source`) and Q/K/V fusing; a tied head is not
    written (HF ties it on load). An untied head is ``embed_out.weight``, the name
    Model Zoo writes and transformers' ``save_pretrained`` still saves (it reads it back as
    ``lm_head``)."""
    config_to_hf(cs_model, name)
    cfg = {**CS_DEFAULTS, **cs_model}
    headless = name.endswith("-headless")
    prefix = "" if headless else "gpt_neox."
    layers = cfg["num_hidden_layers"]
    tied = bool(cfg["share_embedding_weights"])
    plan = [rename(_source(cs, c, tied), h) for h, c in _pairs(layers, prefix)]
    plan += _qkv_plans(layers, prefix, cfg["num_heads"], cfg["rotary_dim"])[1]
    if not headless and not tied:
        plan.append(rename(HEAD, LEGACY_HEAD))
    return _finish(plan, cs)
