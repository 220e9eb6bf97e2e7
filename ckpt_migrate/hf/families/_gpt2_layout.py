"""GPT-2 config rules, shared by the GPT-2 family (``gpt2.py``) and the families built on it
(``starcoder.py``, ``santacoder.py``, ``btlm.py``, ``jais.py``). Not a family: no ``NAMES``.
Their tensor tables are in ``hf/layouts/gpt2_like.py``.

Model Zoo (tag Release_2.10.0): the config rules of ``ConfigConverter_GPT2Model_HF_CS17`` and
``_CS20`` (gpt2_hf_cs.py lines 477-656 and 916-925), which the StarCoder, SantaCoder, BTLM and
JAIS converters inherit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckpt_migrate.hf.mapping import MappingError

# ---- config rules -----------------------------------------------------------------------------

# (HF key, CS key) of the rules that only rename (gpt2_hf_cs.py lines 486-573).
GPT2_RENAMES: tuple[tuple[str, str], ...] = (
    ("vocab_size", "vocab_size"),
    ("embd_pdrop", "embedding_dropout_rate"),
    ("tie_word_embeddings", "share_embedding_weights"),
    ("n_embd", "hidden_size"),
    ("n_head", "num_heads"),
    ("n_layer", "num_hidden_layers"),
    ("n_positions", "max_position_embeddings"),
    ("n_inner", "filter_size"),
    ("activation_function", "nonlinearity"),
    ("attn_pdrop", "attention_dropout_rate"),
    ("resid_pdrop", "dropout_rate"),
    ("rotary_dim", "rotary_dim"),
    ("layer_norm_epsilon", "layer_norm_epsilon"),
    ("initializer_range", "initializer_range"),
)
# CS fields accepted with one value only (assert_factory_fn, lines 487-585 and 920-923).
GPT2_CS_FIXED: dict[str, Any] = {
    "norm_type": "layernorm",
    "position_embedding_type": "learned",
    "use_position_embedding": True,
    "embedding_layer_norm": False,
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True,
    "use_bias_in_output": False,
    "fixed_sparse_attention": None,
    "norm_first": True,
    "use_ff_layer1_dropout": False,
}


def with_defaults(config: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Model Zoo's ``pre_convert_defaults``: a key the config lacks takes the default."""
    return {**defaults, **config}


def expect(config: Mapping[str, Any], key: str, allowed: Sequence[Any], side: str) -> None:
    """Model Zoo's ``assert_factory_fn`` (base_converter.py lines 1603-1640)."""
    if key in config and config[key] not in allowed:
        raise MappingError(f"{side} {key}={config[key]!r} is not supported (only {allowed})")


def gpt2_config_to_cs(
    hf_config: Mapping[str, Any], renames: Sequence[tuple[str, str]], model_types: Sequence[str]
) -> dict[str, Any]:
    """GPT-2 rules HF -> CS: ``tie_word_embeddings`` defaults to true (lines 596-600),
    ``n_inner: null`` becomes ``4 * n_embd`` (lines 648-650), ``scale_attn_weights`` gives
    ``attention_type`` (lines 618-623); ``reorder_and_upcast_attn`` and (unless renamed)
    ``scale_attn_by_inverse_layer_idx`` must be false (lines 586-593)."""
    hf = with_defaults(hf_config, {"tie_word_embeddings": True})
    expect(hf, "model_type", model_types, "HF")
    expect(hf, "reorder_and_upcast_attn", (False,), "HF")
    if "scale_attn_by_inverse_layer_idx" not in dict(renames):
        expect(hf, "scale_attn_by_inverse_layer_idx", (False,), "HF")
    if hf.get("n_inner") is None:
        hf["n_inner"] = 4 * hf["n_embd"]
    cs = {c: hf[h] for h, c in renames if h in hf}
    if "scale_attn_weights" in hf:
        cs["attention_type"] = "scaled_dot_product" if hf["scale_attn_weights"] else "dot_product"
    return {**cs, "use_bias_in_output": False}


def gpt2_config_to_hf(
    cs_model: Mapping[str, Any], renames: Sequence[tuple[str, str]], fixed: Mapping[str, Any]
) -> dict[str, Any]:
    """GPT-2 rules CS -> HF: fixed-value fields asserted, the dropout rates default to
    ``dropout_rate`` (lines 651-655), ``attention_type`` gives ``scale_attn_weights`` (lines
    624-638)."""
    cs = with_defaults(cs_model, {"share_embedding_weights": True})
    for key, value in fixed.items():
        expect(cs, key, (value,), "CS")
    for key in ("embedding_dropout_rate", "attention_dropout_rate"):
        if key not in cs and "dropout_rate" in cs:
            cs[key] = cs["dropout_rate"]
    hf = {h: cs[c] for h, c in renames if c in cs}
    if "attention_type" in cs:
        if cs["attention_type"] not in ("scaled_dot_product", "dot_product"):
            raise MappingError(f"attention_type={cs['attention_type']!r} is not supported")
        hf["scale_attn_weights"] = cs["attention_type"] == "scaled_dot_product"
    return hf


# ---- names -----------------------------------------------------------------------------------


def check_name(name: str, names: Sequence[str]) -> bool:
    """Whether ``name`` (one of ``names``) is the headless model; MappingError if unknown."""
    if name not in names:
        raise MappingError(f"model name {name!r} is not one of {', '.join(names)}")
    return name.endswith("-headless")
