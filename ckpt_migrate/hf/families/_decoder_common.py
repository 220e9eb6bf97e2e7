"""What the GPT-J, CodeGen, GPT-NeoX, Falcon and BLOOM families share (kept out of family
discovery by the leading underscore): config checks, the GPT-J backbone's CS defaults and the
(HF, CS) name pairs of their blocks. They are the rules Model Zoo's five converters
(``tools/checkpoint_converters/`` at Release_2.10.0) spell alike; each family module keeps its
own facts and cites its converter. Their tensor table is built by ``hf/layouts/gptj_like.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckpt_migrate.hf import mup
from ckpt_migrate.hf.mapping import MappingError, Shape

Shapes = Mapping[str, Shape]  # tensor name -> shape
Config = Mapping[str, Any]
Pairs = Sequence[tuple[str, str]]  # (HF name, CS name)

EMBED = "embedding_layer.word_embeddings.weight"
HEAD = "lm_head.weight"
# The CS GPT-J model's defaults (GPT-J, CodeGen and GPT-NeoX), as Model Zoo fills them in before
# converting: gptj_hf_cs.py lines 529-546, salesforce_codegen_hf_cs.py lines 689-706,
# gpt_neox_hf_cs.py lines 808-825 and 1035-1039.
GPTJ_CS_DEFAULTS: dict[str, Any] = {
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
    # models/nlp/gptj/gptj_model.py lines 69-71). Model Zoo's CS config leaves the field out.
    "position_embedding_type": "rotary",
    "attention_type": "scaled_dot_product",
    "embedding_layer_norm": False,
    "fixed_sparse_attention": None,
    "use_ff_layer1_dropout": False,
    "norm_type": "layernorm",
    "use_position_embedding": True,
    "rope_theta": 10000.0,
}
_OWN: Any = object()  # a fixed field whose value is the family's (:func:`gptj_fixed`)
# CS GPT-J fields a rotary GPT-J-backbone converter fixes to one value (gptj_hf_cs.py lines
# 451-509, salesforce_codegen_hf_cs.py lines 563-669, gpt_neox_hf_cs.py lines 666-788), in the
# order they are checked: the values all three need, and ``_OWN`` where they differ.
_GPTJ_FIXED: dict[str, Any] = {
    "position_embedding_type": "rotary",
    "use_position_embedding": True,
    "embedding_dropout_rate": _OWN,
    "attention_type": "scaled_dot_product",
    "use_projection_bias_in_attention": _OWN,
    "use_ffn_bias_in_attention": _OWN,
    "use_ffn_bias": True,
    "use_bias_in_output": _OWN,
    "embedding_layer_norm": False,
    "fixed_sparse_attention": None,
    "norm_first": True,
    "use_ff_layer1_dropout": False,
    "use_untied_layer_norm": _OWN,
    "norm_type": "layernorm",
    "rope_theta": 10000.0,  # the HF models hard-code base 10000
    "pos_scaling_factor": _OWN,
}
# CS fields GPT-J and CodeGen fix alike besides those (gptj_hf_cs.py lines 451-509,
# salesforce_codegen_hf_cs.py lines 563-669): no attention biases, one layer norm; the HF models
# have no RoPE scaling (Model Zoo does not check ``pos_scaling_factor``).
GPTJ_STYLE_FIXED: dict[str, Any] = {
    "use_projection_bias_in_attention": False,
    "use_ffn_bias_in_attention": False,
    "use_untied_layer_norm": False,
    "pos_scaling_factor": 1.0,
}
# The HF config fields GPT-J and CodeGen spell alike, with the defaults both converters fill in
# (gptj_hf_cs.py lines 512-528, salesforce_codegen_hf_cs.py lines 672-688) but the dropouts
# (:func:`gptj_style_hf_defaults`).
_GPTJ_STYLE_HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50400,
    "n_positions": 2048,
    "n_embd": 4096,
    "n_layer": 28,
    "n_head": 16,
    "rotary_dim": 64,
    "n_inner": None,
    "activation_function": "gelu_new",
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": False,
    "scale_attn_weights": True,
}
# HF GPT-J-style names (GPT-J, CodeGen) of the embeddings and the final norm. Model Zoo:
# gptj_hf_cs.py lines 86-101, salesforce_codegen_hf_cs.py lines 249-264.
GPTJ_STYLE_TOP: Pairs = (
    ("wte.weight", EMBED),
    ("ln_f.weight", "transformer_decoder.norm.weight"),
    ("ln_f.bias", "transformer_decoder.norm.bias"),
)


def gptj_style_hf_defaults(dropout: float) -> dict[str, Any]:
    """The HF GPT-J-style defaults with ``dropout`` for the residual, embedding and attention
    dropouts (``resid_pdrop``, ``embd_pdrop``, ``attn_pdrop``)."""
    rates = dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop"), dropout)
    return {**_GPTJ_STYLE_HF_DEFAULTS, **rates}


def params(modules: Pairs, kinds: Sequence[str] = ("weight", "bias")) -> list[tuple[str, str]]:
    """(HF, CS) names of each (HF, CS) module's parameters ``kinds``."""
    return [(f"{hf}.{kind}", f"{cs}.{kind}") for hf, cs in modules for kind in kinds]


def gptj_style_layer(*attention: tuple[str, str]) -> list[tuple[str, str]]:
    """(HF, CS) names inside a GPT-J-style block: the norm, the family's ``attention`` pairs,
    the MLP (Model Zoo: gptj_hf_cs.py lines 112-148, salesforce_codegen_hf_cs.py 275-303)."""
    mlp = [("mlp.fc_in", "ffn.ffn.0.linear_layer"), ("mlp.fc_out", "ffn.ffn.1.linear_layer")]
    return [*params([("ln_1", "norm1")]), *attention, *params(mlp)]


def megatron_layer(dense: str, norms: Pairs, bias: bool = True) -> list[tuple[str, str]]:
    """(HF, CS) names inside a block of GPT-NeoX, Falcon, BLOOM: the ``norms``, the attention's
    output ``dense`` and the MLP, whose biases only with ``bias``."""
    linear = [
        (dense, "self_attn.proj_output_dense_layer"),
        ("mlp.dense_h_to_4h", "ffn.ffn.0.linear_layer"),
        ("mlp.dense_4h_to_h", "ffn.ffn.1.linear_layer"),
    ]
    return params(norms) + params(linear, ("weight", "bias")[: 1 + bias])


def gptj_fixed(**own: Any) -> dict[str, Any]:
    """The CS fields a GPT-J-backbone family needs at one value: the shared ones and the
    family's ``own`` ones, in the checking order."""
    if any(_GPTJ_FIXED.get(key) is not _OWN for key in own):
        raise TypeError(f"not all of {sorted(own)} are a family's own fixed fields")
    return {k: v for k, v in {**_GPTJ_FIXED, **own}.items() if v is not _OWN}


def check_name(name: str, names: Sequence[str]) -> None:
    """Refuse a model name the family does not serve."""
    if name not in names:
        raise MappingError(f"{name}: this family serves {', '.join(names)}")


def get(cfg: Config, key: str, defaults: Config) -> Any:
    """``cfg[key]``, else its default (None without one)."""
    return cfg[key] if key in cfg else defaults.get(key)


def hf_with_defaults(hf_config: Config, defaults: Config, model_type: str) -> dict[str, Any]:
    """The HF config over the family's defaults, refused unless its ``model_type`` (if given)
    is the family's."""
    hf = {**defaults, **hf_config}
    if hf.get("model_type", model_type) != model_type:
        raise MappingError(f"model_type: expected {model_type!r}, got {hf['model_type']!r}")
    return hf


def hf_header(architectures: Mapping[str, str], name: str, model_type: str) -> dict[str, Any]:
    """The first two ``config.json`` fields: the transformers class of ``name``, the type."""
    return {"architectures": [architectures[name]], "model_type": model_type}


def check_cs(
    cs: Config,
    label: str,
    fixed: Config,
    defaults: Config,
    *,
    name: str,
    required: Sequence[str] = (),
) -> None:
    """Reject CS settings HF ``label`` cannot express, naming the field: muP (``hf/mup.py``;
    the export folds it first where it can), a ``required`` field missing, then a field of
    ``fixed`` whose value (or default) is not the one HF can express (the family cites Model
    Zoo's rules). ``name``: the model name (which muP fields it has)."""
    mup.refuse(cs, name)
    require(cs, required, label)
    for key, value in fixed.items():
        got = get(cs, key, defaults)
        if got != value:
            raise MappingError(f"{key}: HF {label} needs {value!r}, got {got!r}")


def require(cs: Config, keys: Sequence[str], label: str) -> None:
    """Fields a CS config must give (no default on either side)."""
    for key in keys:
        if key not in cs:
            raise MappingError(f"{key}: a CS {label} config must give it")


def gptj_style_to_cs(hf: Config, label: str) -> dict[str, Any]:
    """The CS model of a GPT-J-style HF config (GPT-J, CodeGen; defaults filled in). Model Zoo:
    gptj_hf_cs.py lines 391-621 (post-conversion defaults 549-558), salesforce_codegen_hf_cs.py
    lines 552-740 (708-718); ``n_inner`` defaults to 4 * ``n_embd``."""
    if hf["scale_attn_weights"] is not True:
        raise MappingError(f"scale_attn_weights: HF {label} must scale attention weights")
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
        "use_untied_layer_norm": False,
        "use_ffn_bias_in_attention": False,
        "use_projection_bias_in_attention": False,
        "use_ffn_bias": True,
        "use_bias_in_output": True,
        "attention_type": "scaled_dot_product",
    }


def gptj_style_to_hf(cs_model: Config, defaults: Config, label: str) -> dict[str, Any]:
    """The GPT-J-style HF fields of a checked CS config (the same rules read from CS to HF);
    ``rotary_dim`` has no default."""
    require(cs_model, ("rotary_dim",), label)
    cs = {**defaults, **cs_model}
    return {
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
    }


def rope_factor(params: Config, legacy: Config) -> float:
    """The linear RoPE scaling factor (1 without scaling) of transformers 5 ``rope_parameters``
    or the older ``rope_scaling``; any other kind is refused (Model Zoo: gpt_neox_hf_cs.py lines
    1041-1080, falcon_180b.py lines 642-681, which only the linear kind is carried of)."""
    kind = params.get("rope_type", legacy.get("type", legacy.get("rope_type", "default")))
    if kind not in ("default", "linear"):
        raise MappingError(f"rope_parameters: rope_type {kind!r} is not supported")
    return params.get("factor", legacy.get("factor", 1.0)) if kind == "linear" else 1.0


def check_scaling_type(cs: Config) -> None:
    """Only linear position scaling converts (``pos_scaling_type`` absent means linear)."""
    if cs.get("pos_scaling_type", "linear") != "linear":
        raise MappingError(f"pos_scaling_type: {cs['pos_scaling_type']!r} is not supported")


def hf_rope(factor: float, **fields: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(``rope_parameters``, ``rope_scaling``): ``fields`` and the kind, linear with ``factor``
    when it is not 1; ``rope_scaling`` is null without scaling, as Model Zoo writes it
    (``convert_pi``), else the same mapping (transformers 5 reads it as an alias)."""
    rope: dict[str, Any] = {**fields, "rope_type": "default"}
    if factor != 1.0:
        rope.update(rope_type="linear", factor=factor)
    return rope, dict(rope) if rope["rope_type"] == "linear" else None
