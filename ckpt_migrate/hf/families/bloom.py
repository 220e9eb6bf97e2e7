"""BLOOM: Hugging Face ``BloomForCausalLM`` / ``BloomModel`` <-> Cerebras ``bloom`` (the GPT-2
backbone configured with ALiBi and an embedding layer norm).

Model Zoo's reference is ``tools/checkpoint_converters/bloom_hf_cs.py`` at Release_2.10.0
(``Converter_Bloom_Attention_HF_CS17`` lines 41-201, ``Converter_BloomModel_HF_CS17`` lines
204-417, ``ConfigConverter_BloomModel_HF_CS17`` lines 460-715, the CS21 classes lines 946-1062
for 2.1 to 2.9). HF fuses Q, K and V per head (``query_key_value`` rows are
``[head][q|k|v][head_dim]``); ALiBi has no weights in HF, while CS stores its slopes, which
Model Zoo computes on the way to CS and drops on the way back (lines 309-329, 970-982).

The CS model is GPT-2's (``BloomModelConfig(GPT2ModelConfig)``, ``models/nlp/bloom/model.py``
lines 20-27), which registers its final norm under two names, ``ln_f`` and
``transformer_decoder.norm`` (one module, ``models/nlp/gpt2/gpt2_model.py`` lines 910 and 965):
Model Zoo writes both on the way to CS (``replace_final_norm``, bloom_hf_cs.py lines 276-282 and
293-307) and we do too. On the way to HF a Trainer save and a Model Zoo file hold both:
``ln_f.*`` is then a tie of ``transformer_decoder.norm.*`` (:func:`cs_ties`), and read only when
it is the one present. A tied ``lm_head.weight`` that ``save_pretrained`` left out is written from
the embeddings, while Model Zoo's ``lm_head`` rule (lines 1020-1023) renames only a head the HF
file has: the CS model's state dict has the head and the Trainer loads strictly
(docs/MODELZOO_PARITY.md §5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ckpt_migrate.hf.mapping import MappingError, Out, Shape, missing_inputs, rename

NAMES = ("bloom", "bloom-headless")
HF_MODEL_TYPES = ("bloom",)
# The transformers class of each name (``config.json`` ``architectures``).
ARCHITECTURES = {"bloom": "BloomForCausalLM", "bloom-headless": "BloomModel"}

# Model Zoo: bloom_hf_cs.py lines 612-625, HF defaults filled in first.
HF_DEFAULTS: dict[str, Any] = {
    "tie_word_embeddings": True,
    "vocab_size": 250880,
    "hidden_size": 64,
    "n_layer": 2,
    "n_head": 8,
    "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.02,
    "apply_residual_connection_post_layernorm": False,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
}
# Model Zoo: bloom_hf_cs.py lines 626-628, CS defaults filled in first.
CS_DEFAULTS: dict[str, Any] = {"share_embedding_weights": True, "embedding_layer_norm": False}
# Model Zoo: bloom_hf_cs.py lines 470-609 and 915-924, CS fields that must hold these values
# when present (``embedding_layer_norm`` always, through its default).
CS_FIXED: dict[str, Any] = {
    "position_embedding_type": "alibi",
    "use_position_embedding": True,
    "embedding_layer_norm": True,
    "attention_type": "scaled_dot_product",
    "attention_module": "aiayn_attention",
    "use_rms_norm": False,
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True,
    "nonlinearity": "gelu",
    "norm_first": True,
    "use_bias_in_output": False,
    "fixed_sparse_attention": None,
    "use_ff_layer1_dropout": False,
    "alibi_trainable_slopes": False,
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
# (HF name inside ``h.N.``, CS name inside ``transformer_decoder.layers.N.``).
# Model Zoo: bloom_hf_cs.py lines 47-53 (dense) and 236-275 (norms, mlp).
LAYER_PAIRS = tuple(
    (f"{hf}.{w}", f"{cs}.{w}")
    for hf, cs in (
        ("input_layernorm", "norm1"),
        ("post_attention_layernorm", "norm3"),
        ("self_attention.dense", "self_attn.proj_output_dense_layer"),
        ("mlp.dense_h_to_4h", "ffn.ffn.0.linear_layer"),
        ("mlp.dense_4h_to_h", "ffn.ffn.1.linear_layer"),
    )
    for w in ("weight", "bias")
)
# Model Zoo: bloom_hf_cs.py lines 209-226 and 276-282 (embeddings, their norm, final norm).
TOP_PAIRS = (
    ("word_embeddings.weight", "embedding_layer.word_embeddings.weight"),
    ("word_embeddings_layernorm.weight", "embedding_ln_f.weight"),
    ("word_embeddings_layernorm.bias", "embedding_ln_f.bias"),
    ("ln_f.weight", "transformer_decoder.norm.weight"),
    ("ln_f.bias", "transformer_decoder.norm.bias"),
)
EMBED = "embedding_layer.word_embeddings.weight"
HEAD = "lm_head.weight"
# The CS model's second name of its final norm (copy -> the name the plan reads), see above.
LN_F = {f"ln_f.{p}": f"transformer_decoder.norm.{p}" for p in ("weight", "bias")}
SLOPES = "embedding_layer.position_embed_helper.slopes"  # 2.1+ (Model Zoo line 975)
CS_DROPPED = (SLOPES, "relative_pe_helper.slopes")  # the second is the 2.0 spelling


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise MappingError(f"{name}: this family serves {', '.join(NAMES)}")


def _check_cs(cs: Mapping[str, Any]) -> None:
    """Reject CS settings HF BLOOM cannot express, naming the field (Model Zoo lines 470-690)."""
    for key in MUP_FIELDS:
        if cs.get(key) not in (None, False):
            raise MappingError(f"{key}: muP models are not supported for BLOOM")
    if cs.get("embeddings_scale") not in (None, 1, 1.0):
        raise MappingError("embeddings_scale: muP models are not supported for BLOOM")
    merged = {**CS_DEFAULTS, **cs}
    for key, value in CS_FIXED.items():
        if key in merged and merged[key] != value:
            raise MappingError(f"{key}: HF BLOOM needs {value!r}, got {merged[key]!r}")
    for key in ("hidden_size", "num_heads", "num_hidden_layers", "vocab_size", "dropout_rate"):
        if key not in cs:
            raise MappingError(f"{key}: a CS BLOOM config must give it")
    if cs.get("filter_size", 4 * cs["hidden_size"]) != 4 * cs["hidden_size"]:
        raise MappingError("filter_size: HF BLOOM needs 4 * hidden_size")
    if cs.get("attention_inner_dim") not in (None, cs["hidden_size"]):
        raise MappingError("attention_inner_dim: HF BLOOM needs it equal to hidden_size")
    # Model Zoo lines 685-687: the embedding dropout defaults to dropout_rate, and must be 0.
    if cs.get("embedding_dropout_rate", cs["dropout_rate"]) != 0.0:
        raise MappingError("embedding_dropout_rate: HF BLOOM has no embedding dropout")


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: bloom_hf_cs.py lines 460-715 (rules, defaults, ``n_embed`` alias, post
    ``filter_size`` = 4 * ``hidden_size``). ``embedding_dropout_rate: 0.0`` is written too so
    that the CS config converts back (Model Zoo would default it to ``dropout_rate``)."""
    _check_name(name)
    hf = {**HF_DEFAULTS, **hf_config}
    if hf.get("model_type", "bloom") != "bloom":
        raise MappingError(f"model_type: expected 'bloom', got {hf['model_type']!r}")
    if hf.get("n_embed") is not None:
        hf["hidden_size"] = hf["n_embed"]
    if hf["apply_residual_connection_post_layernorm"]:
        raise MappingError("apply_residual_connection_post_layernorm: CS BLOOM needs false")
    return {
        "vocab_size": hf["vocab_size"],
        "hidden_size": hf["hidden_size"],
        "num_heads": hf["n_head"],
        "num_hidden_layers": hf["n_layer"],
        "share_embedding_weights": hf["tie_word_embeddings"],
        "layer_norm_epsilon": hf["layer_norm_epsilon"],
        "initializer_range": hf["initializer_range"],
        "attention_dropout_rate": hf["attention_dropout"],
        "dropout_rate": hf["hidden_dropout"],
        "filter_size": 4 * hf["hidden_size"],
        "embedding_dropout_rate": 0.0,
        # Model Zoo: bloom_hf_cs.py lines 630-641, the post-conversion CS defaults.
        "position_embedding_type": "alibi",
        "use_ffn_bias_in_attention": True,
        "use_projection_bias_in_attention": True,
        "use_ffn_bias": True,
        "use_bias_in_output": False,
        "attention_type": "scaled_dot_product",
        "embedding_layer_norm": True,
    }


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: bloom_hf_cs.py lines 460-715 read from CS to HF (``attention_dropout``
    defaults to ``dropout_rate``, lines 688-689)."""
    _check_name(name)
    _check_cs(cs_model)
    cs = {**CS_DEFAULTS, **cs_model}
    return {
        "architectures": [ARCHITECTURES[name]],
        "model_type": "bloom",
        "vocab_size": cs["vocab_size"],
        "hidden_size": cs["hidden_size"],
        "n_layer": cs["num_hidden_layers"],
        "n_head": cs["num_heads"],
        "layer_norm_epsilon": cs.get("layer_norm_epsilon", 1e-5),
        "initializer_range": cs.get("initializer_range", 0.02),
        "hidden_dropout": cs["dropout_rate"],
        "attention_dropout": cs.get("attention_dropout_rate", cs["dropout_rate"]),
        "apply_residual_connection_post_layernorm": False,
        "tie_word_embeddings": cs["share_embedding_weights"],
    }


def alibi_slopes(heads: int) -> list[float]:
    """Model Zoo: bloom_hf_cs.py lines 309-329, the ALiBi paper's slopes; for a head count that
    is not a power of two, the closest power's slopes then every other one of twice that."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(heads).is_integer():
        return power_of_2(heads)
    closest = 2 ** math.floor(math.log2(heads))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: heads - closest]


def _unfuse(x: np.ndarray, which: int, heads: int) -> np.ndarray:
    """Model Zoo: bloom_hf_cs.py lines 95-127, ``query_key_value`` viewed as
    [heads, 3, head_dim, ...]; Q, K, V are 0, 1, 2."""
    return np.ascontiguousarray(x.reshape(heads, 3, -1, *x.shape[1:])[:, which]).reshape(
        -1, *x.shape[1:]
    )


def _fuse(q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int) -> np.ndarray:
    """Model Zoo: bloom_hf_cs.py lines 129-168, the inverse of :func:`_unfuse`."""
    parts = [t.reshape(heads, 1, -1, *t.shape[1:]) for t in (q, k, v)]
    return np.concatenate(parts, axis=1).reshape(-1, *q.shape[1:])


def _qkv_plans(layers: int, prefix: str, heads: int) -> tuple[list, list]:
    """(HF -> CS unfusing, CS -> HF fusing) of every layer's ``query_key_value``."""
    to_cs, to_hf = [], []
    for i in range(layers):
        for kind in ("weight", "bias"):
            fused = f"{prefix}h.{i}.self_attention.query_key_value.{kind}"
            names = [
                f"transformer_decoder.layers.{i}.self_attn.proj_{w}_dense_layer.{kind}"
                for w in "qkv"
            ]
            for j, cs_name in enumerate(names):
                to_cs.append(
                    Out(
                        cs_name,
                        (fused,),
                        lambda x, j=j: _unfuse(x, j, heads),
                        infer=lambda s: (s[0] // 3, *s[1:]),
                        note=f"{'QKV'[j]} of the per-head fused query_key_value",
                    )
                )
            to_hf.append(
                Out(
                    fused,
                    tuple(names),
                    lambda q, k, v: _fuse(q, k, v, heads),
                    infer=lambda q, k, v: (q[0] + k[0] + v[0], *q[1:]),
                    note="Q, K, V fused per head",
                )
            )
    return to_cs, to_hf


def _pairs(layers: int, prefix: str) -> list[tuple[str, str]]:
    """(HF name, CS name) of every renamed tensor; ``prefix`` is ``transformer.`` or empty."""
    out = [(prefix + hf, cs) for hf, cs in TOP_PAIRS]
    for i in range(layers):
        out += [
            (f"{prefix}h.{i}.{hf}", f"transformer_decoder.layers.{i}.{cs}")
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
    """Model Zoo: bloom_hf_cs.py lines 378-382, an untied head HF lacks is drawn N(0, 0.02) in
    float32 (seeded here, so repeatable)."""

    def build() -> np.ndarray:
        return np.random.default_rng(0).normal(0.0, 0.02, shape).astype(np.float32)

    return build


def _source(cs: Mapping[str, Shape], cs_name: str, tied: bool) -> str:
    """The CS tensor to read for ``cs_name``: itself, else the copy of it that exists (``ln_f.*``
    for the final norm; the head for tied embeddings, Model Zoo lines 742-761)."""
    copies = {v: k for k, v in LN_F.items()} | ({EMBED: HEAD} if tied else {})
    copy = copies.get(cs_name)
    return copy if cs_name not in cs and copy in cs else cs_name


def cs_ties(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """CS tensors that copy another one the plan reads, when both are present: ``ln_f.*`` of
    ``transformer_decoder.norm.*`` (one module, see above) and ``lm_head.weight`` when
    ``share_embedding_weights`` (Model Zoo: bloom_hf_cs.py ``pre_model_convert``, lines
    742-761); HF's ``save_pretrained`` does not store a tied head either."""
    ties = dict(LN_F)
    if cs_model.get("share_embedding_weights", CS_DEFAULTS["share_embedding_weights"]):
        ties[HEAD] = EMBED
    return {k: v for k, v in ties.items() if k in cs and v in cs}


def cs_dropped(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """CS tensors Model Zoo leaves out on the way to HF, with the reason: the head of a
    headless model (converter note, lines 405-413)."""
    out = {n: "ALiBi slopes, which HF computes itself" for n in CS_DROPPED if n in cs}
    if name.endswith("-headless"):
        ties = cs_ties(cs, cs_model, name)
        why = "the headless HF model has no lm_head (Model Zoo drops it)"
        out.update({n: why for n in (HEAD, "lm_head.bias") if n in cs and n not in ties})
    return out


def plan_to_cs(hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str) -> list[Out]:
    """Model Zoo: bloom_hf_cs.py lines 204-399 and 724-786, renames, Q/K/V unfusing and the
    ALiBi slopes (float32 [heads, 1], lines 387-391 and 774-778), the final norm under both
    names (lines 293-307); a headless model gets a new head (lines 368-383): the embeddings when
    tied, else N(0, 0.02). A tied head the HF file lacks is the embeddings (module docstring)."""
    cfg = config_to_cs(hf_config, name)
    headless = name.endswith("-headless")
    prefix = "" if headless else "transformer."
    layers, heads = cfg["num_hidden_layers"], cfg["num_heads"]
    plan = [rename(h, c) for h, c in _pairs(layers, prefix)]
    source = {out.name: out.inputs[0] for out in plan}
    plan += [rename(source[norm], copy) for copy, norm in LN_F.items()]
    plan += _qkv_plans(layers, prefix, heads)[0]
    slopes = np.asarray(alibi_slopes(heads), dtype=np.float32).reshape(heads, 1)
    plan.append(Out(SLOPES, (), lambda: slopes.copy(), shape=(heads, 1), note="ALiBi slopes"))
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
    """Model Zoo: bloom_hf_cs.py lines 204-291 and 724-740, renames (of whichever copy of the
    embeddings and the final norm exists, :func:`_source`) and Q/K/V fusing; the slopes are
    dropped (HF recomputes them) and a tied head is not written."""
    config_to_hf(cs_model, name)
    cfg = {**CS_DEFAULTS, **cs_model}
    headless = name.endswith("-headless")
    prefix = "" if headless else "transformer."
    layers, heads = cfg["num_hidden_layers"], cfg["num_heads"]
    tied = bool(cfg["share_embedding_weights"])
    plan = [rename(_source(cs, c, tied), h) for h, c in _pairs(layers, prefix)]
    plan += _qkv_plans(layers, prefix, heads)[1]
    if not headless and not tied:
        plan.append(rename(HEAD, HEAD))
    return _finish(plan, cs)
