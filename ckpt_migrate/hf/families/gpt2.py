"""GPT-2: Cerebras ``GPT2LMHeadModel`` <-> Hugging Face ``GPT2LMHeadModel`` / ``GPT2Model``.

Model Zoo: ``src/cerebras/modelzoo/tools/checkpoint_converters/gpt2_hf_cs.py`` at tag
Release_2.10.0 (``Converter_GPT2LMHeadModel_HF_CS21`` and ``Converter_GPT2Model_HF_CS21``, built
on the CS17 rules, lines 45-475 and 1035-1130; config rules ``ConfigConverter_GPT2Model_HF_CS17``
lines 477-660, refined by ``*_HF_CS18`` / ``*_HF_CS20`` / ``*_HF_CS21``, lines 668-1032).

muP: Model Zoo converts a muP GPT-2 to standard parametrisation on the way to HF
(``supports_mup_conversion``; ``mup.py``); so does ``export-hf``, before these rules run
(``hf/mup.py``), so a muP config reaching :func:`config_to_hf` is refused naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ckpt_migrate import catalogue
from ckpt_migrate.hf import mup
from ckpt_migrate.hf.families._gpt2_layout import (
    GPT2_CS_FIXED,
    GPT2_RENAMES,
    hf_prefix,
    normal_head,
)
from ckpt_migrate.hf.mapping import (
    Build,
    MappingError,
    Out,
    Shape,
    chunk,
    concat,
    rename,
    transpose,
)
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
MODEL_TYPE = HF_MODEL_TYPES[0]
ARCHITECTURES = catalogue.hf_architectures(__name__)
_NAME_OF = {cls: name for name, cls in ARCHITECTURES.items()}
_LM_HEAD, _HEADLESS = _NAME_OF["GPT2LMHeadModel"], _NAME_OF["GPT2Model"]

# The config fields copied as they are: the GPT-2 rules' ``GPT2_RENAMES`` (_gpt2_layout.py).
# CS fields HF GPT-2 can only express with one value: the GPT-2 rules' ``GPT2_CS_FIXED``
# (Model Zoo's assert_factory_fn rules, gpt2_hf_cs.py lines 487-593 and 920-923; ``norm_type``
# checked after the others here), plus the architecture fields of GPT2ModelConfig a GPT-2 HF
# model cannot have at all (ours; Model Zoo fails on them as unmatched keys).
_CS_REQUIRED: dict[str, Any] = {
    **{k: v for k, v in GPT2_CS_FIXED.items() if k != "norm_type"},
    "norm_type": GPT2_CS_FIXED["norm_type"],
    "use_rms_norm": False,
    "scale_qk_dot_by_layer_idx": False,
    "attention_sliding_window_length": None,
    "position_embedding_offset": 0,
    "pos_scaling_factor": 1.0,
}
# HF fields Model Zoo requires to be False (lines 586-593), and cross attention (extra weights).
_HF_REQUIRED = {
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "add_cross_attention": False,
}

# --------------------------------------------------------------------------- config


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise MappingError(f"the gpt2 family does not serve model {name!r}")


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The ``config.json`` of ``cs_model`` (the CS ``model:`` section).

    Model Zoo: gpt2_hf_cs.py lines 477-660; CS-side defaults ``share_embedding_weights: True``
    and the dropout rates defaulting to ``dropout_rate`` (``pre_config_convert``, lines
    640-656); ``attention_type`` becomes ``scale_attn_weights`` (lines 609-638)."""
    _check_name(name)
    cs = dict(cs_model)
    mup.refuse(cs, name)
    for key, want in _CS_REQUIRED.items():
        if key in cs and cs[key] != want and not (want is None and cs[key] in ({}, [])):
            raise MappingError(
                f"model.{key} = {cs[key]!r}: Hugging Face GPT-2 supports only {want!r}"
            )
    cs.setdefault("share_embedding_weights", True)
    if "dropout_rate" in cs:
        cs.setdefault("embedding_dropout_rate", cs["dropout_rate"])
        cs.setdefault("attention_dropout_rate", cs["dropout_rate"])
    hf: dict[str, Any] = {"architectures": [ARCHITECTURES[name]], "model_type": MODEL_TYPE}
    for hf_key, cs_key in GPT2_RENAMES:
        if cs.get(cs_key) is not None:
            hf[hf_key] = cs[cs_key]
    attention = cs.get("attention_type", "scaled_dot_product")
    if attention not in ("scaled_dot_product", "dot_product"):
        raise MappingError(
            f"model.attention_type = {attention!r}: only scaled_dot_product and dot_product "
            "convert to Hugging Face GPT-2"
        )
    hf["scale_attn_weights"] = attention == "scaled_dot_product"
    for key in ("hidden_size", "num_heads", "num_hidden_layers", "vocab_size"):
        if key not in cs:
            raise MappingError(f"model.{key} is missing from the config")
    return hf


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The CS ``model:`` section of ``config.json``.

    Model Zoo: gpt2_hf_cs.py lines 477-660: ``n_inner`` None means ``4 * n_embd`` (line 649),
    ``tie_word_embeddings`` defaults to True (line 598), ``use_bias_in_output: False`` is added
    (line 607), ``scale_attn_weights`` becomes ``attention_type``."""
    _check_name(name)
    hf = dict(hf_config)
    if hf.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise MappingError(f"config.json model_type = {hf['model_type']!r}, not gpt2")
    for key, want in _HF_REQUIRED.items():
        if hf.get(key, want) != want:
            raise MappingError(f"config.json {key} = {hf[key]!r}: only {want!r} converts")
    if hf.get("n_inner") is None:
        hf["n_inner"] = 4 * hf["n_embd"]
    hf.setdefault("tie_word_embeddings", True)
    cs: dict[str, Any] = {}
    for hf_key, cs_key in GPT2_RENAMES:
        if hf.get(hf_key) is not None:
            cs[cs_key] = hf[hf_key]
    cs["attention_type"] = (
        "scaled_dot_product" if hf.get("scale_attn_weights", True) else "dot_product"
    )
    cs["use_bias_in_output"] = False
    return cs


# --------------------------------------------------------------------------- tensors


def _layers(cfg: Mapping[str, Any], key: str) -> int:
    if not isinstance(cfg.get(key), int):
        raise MappingError(f"the config has no integer {key}")
    return int(cfg[key])


def _prefix(name: str) -> str:
    """GPT2LMHeadModel keeps the body under ``transformer.``; GPT2Model has no prefix."""
    return hf_prefix(name == _HEADLESS)


def _body_pairs(layers: int) -> list[tuple[str, str, str]]:
    """(CS name, HF name without the prefix, how) for every tensor but fused QKV and lm_head.

    Model Zoo: gpt2_hf_cs.py lines 230-310 (``wte``, ``wpe`` -> ``position_embeddings.embed``
    from 2.1, lines 1040-1050; ``ln_1``/``ln_2`` -> ``norm1``/``norm3``; Conv1D ``c_fc`` and
    ``c_proj`` transposed, ``transpose_key_if_2D``; ``ln_f`` -> ``transformer_decoder.norm``)."""
    pairs = [
        ("embedding_layer.word_embeddings.weight", "wte.weight", "rename"),
        ("embedding_layer.position_embeddings.embed.weight", "wpe.weight", "rename"),
    ]
    for i in range(layers):
        cs, hf = f"transformer_decoder.layers.{i}.", f"h.{i}."
        for p in ("weight", "bias"):
            pairs += [
                (f"{cs}norm1.{p}", f"{hf}ln_1.{p}", "rename"),
                (f"{cs}self_attn.proj_output_dense_layer.{p}", f"{hf}attn.c_proj.{p}", "t"),
                (f"{cs}norm3.{p}", f"{hf}ln_2.{p}", "rename"),
                (f"{cs}ffn.ffn.0.linear_layer.{p}", f"{hf}mlp.c_fc.{p}", "t"),
                (f"{cs}ffn.ffn.1.linear_layer.{p}", f"{hf}mlp.c_proj.{p}", "t"),
            ]
    pairs += [(f"transformer_decoder.norm.{p}", f"ln_f.{p}", "rename") for p in ("weight", "bias")]
    return pairs


def _dims(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[int, ...]:
    try:
        return tuple(int(cfg[k]) for k in keys)
    except (KeyError, TypeError, ValueError):
        raise MappingError(f"the config needs integer {', '.join(keys)}") from None


def _check_shapes(have: Mapping[str, Shape], want: Mapping[str, Shape]) -> None:
    """A tensor whose shape contradicts the config (a wrong config, or another model)."""
    for key, shape in want.items():
        if key in have and tuple(have[key]) != shape:
            raise MappingError(f"{key} has shape {tuple(have[key])}, the config implies {shape}")


def _cs_shapes(cs_model: Mapping[str, Any], layers: int) -> dict[str, Shape]:
    v, h = _dims(cs_model, ("vocab_size", "hidden_size"))
    f = int(cs_model.get("filter_size") or 4 * h)
    out = {"embedding_layer.word_embeddings.weight": (v, h), "lm_head.weight": (v, h)}
    if cs_model.get("max_position_embeddings") is not None:
        p = int(cs_model["max_position_embeddings"])
        out["embedding_layer.position_embeddings.embed.weight"] = (p, h)
    for i in range(layers):
        pre = f"transformer_decoder.layers.{i}."
        for x in ("q", "k", "v", "output"):
            out[f"{pre}self_attn.proj_{x}_dense_layer.weight"] = (h, h)
            out[f"{pre}self_attn.proj_{x}_dense_layer.bias"] = (h,)
        for norm in ("norm1", "norm3"):
            out[f"{pre}{norm}.weight"] = out[f"{pre}{norm}.bias"] = (h,)
        out[f"{pre}ffn.ffn.0.linear_layer.weight"] = (f, h)
        out[f"{pre}ffn.ffn.0.linear_layer.bias"] = (f,)
        out[f"{pre}ffn.ffn.1.linear_layer.weight"] = (h, f)
        out[f"{pre}ffn.ffn.1.linear_layer.bias"] = (h,)
    out["transformer_decoder.norm.weight"] = out["transformer_decoder.norm.bias"] = (h,)
    return out


def _qkv(i: int) -> tuple[list[str], str]:
    cs = f"transformer_decoder.layers.{i}.self_attn.proj_"
    return [f"{cs}{x}_dense_layer." for x in ("q", "k", "v")], f"h.{i}.attn.c_attn."


def _fuse_qkv_weight(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.concatenate((q, k, v), axis=0).T)


def plan_to_hf(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> list[Out]:
    """HF tensors from the CS model's tensors.

    Model Zoo: Q, K and V are concatenated and transposed into Conv1D ``c_attn`` (lines
    153-202, ``c_attn_converter_cs17_to_hf``). The ``attn.bias``/``attn.masked_bias`` buffers
    it generates (lines 190-202) are not written: transformers 5 no longer has them. A tied
    ``lm_head.weight`` is not written (``save_pretrained`` leaves tied weights out); the
    headless model has no ``lm_head`` (line 302, dropped)."""
    _check_name(name)
    layers = _layers(cs_model, "num_hidden_layers")
    _check_shapes(cs, _cs_shapes(cs_model, layers))
    pre = _prefix(name)
    plan = []
    for cs_name, hf_name, how in _body_pairs(layers):
        make = transpose if how == "t" else rename
        plan.append(make(cs_name, pre + hf_name))
    for i in range(layers):
        srcs, dst = _qkv(i)
        plan.append(
            Out(
                f"{pre}{dst}weight",
                tuple(s + "weight" for s in srcs),
                _fuse_qkv_weight,
                infer=lambda q, k, v: (q[1], q[0] + k[0] + v[0]),
                note="Q, K, V fused and transposed (Conv1D)",
            )
        )
        plan.append(concat([s + "bias" for s in srcs], f"{pre}{dst}bias"))
    tied = cs_model.get("share_embedding_weights", True)
    if name == _LM_HEAD and not tied:
        plan.append(rename("lm_head.weight", "lm_head.weight"))
    return plan


def _hf_shapes(hf_config: Mapping[str, Any], layers: int, pre: str) -> dict[str, Shape]:
    v, h, p = _dims(hf_config, ("vocab_size", "n_embd", "n_positions"))
    f = int(hf_config.get("n_inner") or 4 * h)
    out = {f"{pre}wte.weight": (v, h), f"{pre}wpe.weight": (p, h), "lm_head.weight": (v, h)}
    for i in range(layers):
        b = f"{pre}h.{i}."
        out |= {f"{b}attn.c_attn.weight": (h, 3 * h), f"{b}attn.c_attn.bias": (3 * h,)}
        out |= {f"{b}attn.c_proj.weight": (h, h), f"{b}attn.c_proj.bias": (h,)}
        out |= {f"{b}mlp.c_fc.weight": (h, f), f"{b}mlp.c_fc.bias": (f,)}
        out |= {f"{b}mlp.c_proj.weight": (f, h), f"{b}mlp.c_proj.bias": (h,)}
        for norm in ("ln_1", "ln_2"):
            out[f"{b}{norm}.weight"] = out[f"{b}{norm}.bias"] = (h,)
    out[f"{pre}ln_f.weight"] = out[f"{pre}ln_f.bias"] = (h,)
    return out


def _split_qkv_weight(index: int) -> Build:
    def build(x: np.ndarray) -> np.ndarray:
        if x.shape[1] % 3:
            raise MappingError(f"c_attn.weight of shape {x.shape}: columns not divisible by 3")
        width = x.shape[1] // 3
        return np.ascontiguousarray(x[:, index * width : (index + 1) * width].T)

    return build


def _lm_head_init(shape: Shape) -> Build:
    """The missing ``lm_head`` of an untied headless model, float32 (:func:`normal_head`)."""

    def build() -> np.ndarray:
        return normal_head(shape, np.float32)

    return build


def plan_to_cs(hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str) -> list[Out]:
    """CS model tensors from the HF tensors.

    Model Zoo: ``c_attn`` is transposed and chunked into Q, K, V (lines 113-151,
    ``c_attn_converter_hf_to_cs17``). ``lm_head.weight`` is always written: HF's when the file
    has it (rule ``lm_head`` ``replaceKey``, lines 1085-1088), else the embeddings when tied
    (``Converter_GPT2LMHeadModel_HF_CS18.post_model_convert``, lines 768-790); the headless
    model's is the embeddings when tied, else newly initialised
    (``Converter_GPT2Model_HF_CS17.post_model_convert``, lines 367-394).

    Different from Model Zoo on purpose: its 2.1+ converter ``Converter_GPT2LMHeadModel_HF_CS21``
    (lines 1079-1130) has no such ``post_model_convert``, so it leaves a tied head that
    ``save_pretrained`` left out out of the CS file, and Model Zoo's own ``GPT2LMHeadModel``
    refuses that file: ``load_state_dict`` (strict, trainer/callbacks/model.py lines 85-99)
    reports ``Missing key(s) in state_dict: "lm_head.weight"``. Here the tied head is the
    embeddings' tensor under a second name (the writer stores it once).

    ``ln_f`` is written under both of the CS model's names, ``transformer_decoder.norm`` and
    ``ln_f`` (one module at two places, ``gpt2_model.py`` lines 911 and 962-972;
    ``replace_final_norm``, lines 323-337), as Model Zoo does."""
    _check_name(name)
    layers = _layers(hf_config, "n_layer")
    _check_shapes(hf, _hf_shapes(hf_config, layers, _prefix(name)))
    pre = _prefix(name)
    plan = []
    for cs_name, hf_name, how in _body_pairs(layers):
        make = transpose if how == "t" else rename
        plan.append(make(pre + hf_name, cs_name))
    plan += [rename(f"{pre}ln_f.{p}", f"ln_f.{p}") for p in ("weight", "bias")]
    for i in range(layers):
        dsts, src = _qkv(i)
        for j, dst in enumerate(dsts):
            plan.append(
                Out(
                    dst + "weight",
                    (f"{pre}{src}weight",),
                    _split_qkv_weight(j),
                    infer=lambda s: (s[1] // 3, s[0]),
                    note=f"piece {j + 1} of 3 of c_attn, transposed",
                )
            )
            plan.append(chunk(f"{pre}{src}bias", dst + "bias", j, 3))
    tied = hf_config.get("tie_word_embeddings", True)
    if "lm_head.weight" in hf and name == _LM_HEAD:
        plan.append(rename("lm_head.weight", "lm_head.weight"))
    elif tied:
        plan.append(rename(f"{pre}wte.weight", "lm_head.weight"))
    elif name == _HEADLESS:
        shape = (int(hf_config["vocab_size"]), int(hf_config["n_embd"]))
        plan.append(
            Out("lm_head.weight", (), _lm_head_init(shape), shape=shape, note="initialised")
        )
    else:
        raise MappingError("lm_head.weight is missing and tie_word_embeddings is false")
    return plan
