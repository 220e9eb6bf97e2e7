"""GPT-J: Hugging Face ``GPTJForCausalLM`` / ``GPTJModel`` <-> Cerebras GPT-J (``gptj``).

Model Zoo's reference is ``tools/checkpoint_converters/gptj_hf_cs.py`` at Release_2.10.0
(``Converter_GPTJ_Headless_HF_CS17`` lines 82-156, ``Converter_GPTJ_LMHeadModel_HF_CS17``
lines 302-317, ``ConfigConverter_GPTJModel_HF_CS17`` lines 391-621; the CS20/CS23 classes
lines 712-826 serve 2.0 to 2.9 unchanged, with ``norm_type: layernorm`` asserted). Every tensor
is a rename: HF GPT-J rotates every two channels exactly like CS rotary, so no permutation.

The CS model registers its final norm under two names, ``ln_f`` and ``transformer_decoder.norm``
(one module, ``models/nlp/gptj/gptj_model.py`` lines 535-538): Model Zoo writes both on the way
to CS (``replace_final_norm``, gptj_hf_cs.py lines 94-101 and 158-172) and we do too. On the way
to HF a Trainer save and a Model Zoo file hold both: ``ln_f.*`` is then a tie of
``transformer_decoder.norm.*`` (:func:`cs_ties`), and read only when it is the one present. A
tied ``lm_head.weight`` that ``save_pretrained`` left out is written from the embeddings, while
Model Zoo's ``lm_head`` rule (lines 305-309) renames only a head the HF file has: the CS model's
state dict has the head and the Trainer loads strictly (docs/MODELZOO_PARITY.md §5).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ckpt_migrate.hf.mapping import MappingError, Out, Shape, missing_inputs, rename

NAMES = ("gptj", "gptj-headless")
HF_MODEL_TYPES = ("gptj",)
# The transformers class of each name (``config.json`` ``architectures``).
ARCHITECTURES = {"gptj": "GPTJForCausalLM", "gptj-headless": "GPTJModel"}

# Model Zoo: gptj_hf_cs.py lines 512-528, HF defaults filled in before converting.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50400,
    "n_positions": 2048,
    "n_embd": 4096,
    "n_layer": 28,
    "n_head": 16,
    "rotary_dim": 64,
    "n_inner": None,
    "activation_function": "gelu_new",
    "resid_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "attn_pdrop": 0.1,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": False,
    "scale_attn_weights": True,
}
# Model Zoo: gptj_hf_cs.py lines 529-546, CS defaults filled in before converting.
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
    # Not in Model Zoo's defaults: the CS model's own (``GPTJSubModelConfig``,
    # models/nlp/gptj/gptj_model.py lines 69-71). Model Zoo's CS config leaves the field out
    # (its rule, lines 402-406, is ``exists="right"``).
    "position_embedding_type": "rotary",
    "attention_type": "scaled_dot_product",
    "embedding_layer_norm": False,
    "fixed_sparse_attention": None,
    "use_ff_layer1_dropout": False,
    "norm_type": "layernorm",
    "use_position_embedding": True,
    "rope_theta": 10000.0,
    "pos_scaling_factor": 1.0,
}
# Model Zoo: gptj_hf_cs.py lines 451-509 and 742-751, CS fields that must hold these values.
CS_FIXED: dict[str, Any] = {
    "position_embedding_type": "rotary",
    "use_position_embedding": True,
    "attention_type": "scaled_dot_product",
    "use_projection_bias_in_attention": False,
    "use_ffn_bias_in_attention": False,
    "use_ffn_bias": True,
    "embedding_layer_norm": False,
    "fixed_sparse_attention": None,
    "norm_first": True,
    "use_ff_layer1_dropout": False,
    "use_untied_layer_norm": False,
    "norm_type": "layernorm",
    "rope_theta": 10000.0,  # HF GPT-J hard-codes base 10000 (Model Zoo does not check)
    "pos_scaling_factor": 1.0,  # HF GPT-J has no RoPE scaling (Model Zoo does not check)
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
# (HF name inside a block ``h.N.``, CS name inside ``transformer_decoder.layers.N.``).
# Model Zoo: gptj_hf_cs.py lines 39-71 (attention) and 112-148 (norm, ffn).
LAYER_PAIRS = (
    ("ln_1.weight", "norm1.weight"),
    ("ln_1.bias", "norm1.bias"),
    ("attn.q_proj.weight", "self_attn.proj_q_dense_layer.weight"),
    ("attn.k_proj.weight", "self_attn.proj_k_dense_layer.weight"),
    ("attn.v_proj.weight", "self_attn.proj_v_dense_layer.weight"),
    ("attn.out_proj.weight", "self_attn.proj_output_dense_layer.weight"),
    ("mlp.fc_in.weight", "ffn.ffn.0.linear_layer.weight"),
    ("mlp.fc_in.bias", "ffn.ffn.0.linear_layer.bias"),
    ("mlp.fc_out.weight", "ffn.ffn.1.linear_layer.weight"),
    ("mlp.fc_out.bias", "ffn.ffn.1.linear_layer.bias"),
)
# Model Zoo: gptj_hf_cs.py lines 86-101 (embeddings, final norm).
TOP_PAIRS = (
    ("wte.weight", "embedding_layer.word_embeddings.weight"),
    ("ln_f.weight", "transformer_decoder.norm.weight"),
    ("ln_f.bias", "transformer_decoder.norm.bias"),
)
# HF buffers older transformers saved and Model Zoo skips (gptj_hf_cs.py lines 151-155).
HF_DROPPED = re.compile(r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)")
EMBED = "embedding_layer.word_embeddings.weight"
HEAD = "lm_head.weight"
# The CS model's second name of its final norm (copy -> the name the plan reads), see above.
LN_F = {f"ln_f.{p}": f"transformer_decoder.norm.{p}" for p in ("weight", "bias")}


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise MappingError(f"{name}: this family serves {', '.join(NAMES)}")


def _get(cfg: Mapping[str, Any], key: str, defaults: Mapping[str, Any]) -> Any:
    return cfg[key] if key in cfg else defaults.get(key)


def _check_cs(cs: Mapping[str, Any]) -> None:
    """Reject CS settings HF GPT-J cannot express, naming the field (Model Zoo asserts them)."""
    for key in MUP_FIELDS:
        if cs.get(key) not in (None, False):
            raise MappingError(f"{key}: muP models are not supported for GPT-J")
    if cs.get("embeddings_scale") not in (None, 1, 1.0):
        raise MappingError("embeddings_scale: muP models are not supported for GPT-J")
    for key, value in CS_FIXED.items():
        if _get(cs, key, CS_DEFAULTS) != value:
            raise MappingError(
                f"{key}: HF GPT-J needs {value!r}, got {_get(cs, key, CS_DEFAULTS)!r}"
            )


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: gptj_hf_cs.py lines 391-621 (rules, defaults, ``n_inner`` = 4 * ``n_embd``)."""
    _check_name(name)
    hf = {**HF_DEFAULTS, **hf_config}
    if hf.get("model_type", "gptj") != "gptj":
        raise MappingError(f"model_type: expected 'gptj', got {hf['model_type']!r}")
    if hf["scale_attn_weights"] is not True:
        raise MappingError("scale_attn_weights: HF GPT-J must scale attention weights")
    return {
        "vocab_size": hf["vocab_size"],
        "hidden_size": hf["n_embd"],
        "num_heads": hf["n_head"],
        "num_hidden_layers": hf["n_layer"],
        "max_position_embeddings": hf["n_positions"],
        "filter_size": hf["n_inner"] if hf["n_inner"] is not None else 4 * hf["n_embd"],
        "rotary_dim": hf["rotary_dim"],
        "position_embedding_type": "rotary",
        "embedding_dropout_rate": hf["embd_pdrop"],
        "share_embedding_weights": hf["tie_word_embeddings"],
        "nonlinearity": hf["activation_function"],
        "attention_dropout_rate": hf["attn_pdrop"],
        "residual_dropout_rate": hf["resid_pdrop"],
        "layer_norm_epsilon": hf["layer_norm_epsilon"],
        "initializer_range": hf["initializer_range"],
        # Model Zoo: gptj_hf_cs.py lines 549-558, the post-conversion CS defaults.
        "use_untied_layer_norm": False,
        "use_ffn_bias_in_attention": False,
        "use_projection_bias_in_attention": False,
        "use_ffn_bias": True,
        "use_bias_in_output": True,
        "attention_type": "scaled_dot_product",
    }


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: gptj_hf_cs.py lines 391-621 read from CS to HF. ``use_bias_in_output`` is
    copied under its CS name as Model Zoo does (rule lines 485-488, default false from lines
    529-546); transformers keeps it as an unused attribute (HF GPT-J always has a head bias)."""
    _check_name(name)
    _check_cs(cs_model)
    if "rotary_dim" not in cs_model:
        raise MappingError("rotary_dim: a CS GPT-J config must give it")
    cs = {**CS_DEFAULTS, **cs_model}
    return {
        "architectures": [ARCHITECTURES[name]],
        "model_type": "gptj",
        "vocab_size": cs["vocab_size"],
        "n_positions": cs["max_position_embeddings"],
        "n_embd": cs["hidden_size"],
        "n_layer": cs["num_hidden_layers"],
        "n_head": cs["num_heads"],
        "rotary_dim": cs["rotary_dim"],
        "n_inner": cs["filter_size"],
        "activation_function": cs["nonlinearity"],
        "resid_pdrop": cs["residual_dropout_rate"],
        "embd_pdrop": cs["embedding_dropout_rate"],
        "attn_pdrop": cs["attention_dropout_rate"],
        "layer_norm_epsilon": cs["layer_norm_epsilon"],
        "initializer_range": cs["initializer_range"],
        "tie_word_embeddings": cs["share_embedding_weights"],
        "use_bias_in_output": cs["use_bias_in_output"],
    }


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
    """Model Zoo: gptj_hf_cs.py lines 222-226, an untied head HF lacks is drawn N(0, 0.02) in
    float32 (seeded here, so repeatable)."""

    def build() -> np.ndarray:
        return np.random.default_rng(0).normal(0.0, 0.02, shape).astype(np.float32)

    return build


def _zero_bias(size: int) -> Callable[[], np.ndarray]:
    """A float32 zero head bias (Model Zoo creates one on the way to CS; HF initialises a
    missing one to zeros)."""
    return lambda: np.zeros((size,), dtype=np.float32)


def _source(cs: Mapping[str, Shape], cs_name: str, tied: bool) -> str:
    """The CS tensor to read for ``cs_name``: itself, else the copy of it that exists (``ln_f.*``
    for the final norm; the head for tied embeddings, Model Zoo lines 319-338)."""
    copies = {v: k for k, v in LN_F.items()} | ({EMBED: HEAD} if tied else {})
    copy = copies.get(cs_name)
    return copy if cs_name not in cs and copy in cs else cs_name


def cs_ties(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """CS tensors that copy another one the plan reads, when both are present: ``ln_f.*`` of
    ``transformer_decoder.norm.*`` (one module, see above) and ``lm_head.weight`` when
    ``share_embedding_weights`` (Model Zoo: gptj_hf_cs.py ``pre_model_convert``, lines
    319-338); HF's ``save_pretrained`` does not store a tied head either."""
    ties = dict(LN_F)
    if _get(cs_model, "share_embedding_weights", CS_DEFAULTS):
        ties[HEAD] = EMBED
    return {k: v for k, v in ties.items() if k in cs and v in cs}


def cs_dropped(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """CS tensors Model Zoo leaves out on the way to HF, with the reason: the head of a
    headless model (converter note, lines 245-254)."""
    out: dict[str, str] = {}
    if name.endswith("-headless"):
        ties = cs_ties(cs, cs_model, name)
        why = "the headless HF model has no lm_head (Model Zoo drops it)"
        out.update({n: why for n in (HEAD, "lm_head.bias") if n in cs and n not in ties})
    return out


def hf_dropped(hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str) -> dict[str, str]:
    """HF buffers older transformers saved and Model Zoo skips (lines 151-155)."""
    return {n: "a buffer Hugging Face regenerates" for n in hf if HF_DROPPED.fullmatch(n)}


def plan_to_cs(hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str) -> list[Out]:
    """Model Zoo: gptj_hf_cs.py lines 82-156 and 302-317, renames, the final norm under both
    names (lines 158-172); a headless model gets a new head (lines 212-230): the embeddings
    when tied, else N(0, 0.02), and a zero bias. A tied head the HF file lacks is the
    embeddings (module docstring)."""
    cfg = config_to_cs(hf_config, name)
    headless = name.endswith("-headless")
    prefix = "" if headless else "transformer."
    plan = [rename(h, c) for h, c in _pairs(cfg["num_hidden_layers"], prefix)]
    source = {out.name: out.inputs[0] for out in plan}
    plan += [rename(source[norm], copy) for copy, norm in LN_F.items()]
    wte = prefix + "wte.weight"
    if headless:
        if cfg["share_embedding_weights"]:
            plan.append(rename(wte, "lm_head.weight"))
        else:
            shape = (cfg["vocab_size"], cfg["hidden_size"])
            plan.append(Out(HEAD, (), _random_head(shape), shape=shape, note="N(0, 0.02)"))
        size = cfg["vocab_size"]
        plan.append(Out("lm_head.bias", (), _zero_bias(size), shape=(size,), note="zeros"))
    else:
        plan.append(rename(HEAD if HEAD in hf or not cfg["share_embedding_weights"] else wte, HEAD))
        plan.append(rename("lm_head.bias", "lm_head.bias"))
    return _finish(plan, hf)


def plan_to_hf(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> list[Out]:
    """Model Zoo: gptj_hf_cs.py lines 82-156 and 302-338, renames (of whichever copy of the
    embeddings and the final norm exists, :func:`_source`); a tied head is not written (HF ties
    it on load); a head bias CS lacks (``use_bias_in_output: false``) is written as the zeros HF
    would initialise it to."""
    config_to_hf(cs_model, name)
    cfg = {**CS_DEFAULTS, **cs_model}
    headless = name.endswith("-headless")
    prefix = "" if headless else "transformer."
    tied = bool(cfg["share_embedding_weights"])
    plan = [rename(_source(cs, c, tied), h) for h, c in _pairs(cfg["num_hidden_layers"], prefix)]
    if not headless:
        if not tied:
            plan.append(rename("lm_head.weight", "lm_head.weight"))
        if "lm_head.bias" in cs:
            plan.append(rename("lm_head.bias", "lm_head.bias"))
        else:
            size = cfg["vocab_size"]
            plan.append(Out("lm_head.bias", (), _zero_bias(size), shape=(size,), note="zeros"))
    return _finish(plan, cs)
