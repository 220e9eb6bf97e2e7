"""T5 (and the models Model Zoo converts with the T5 rules: ``transformer``, ``ul2``,
``flan-ul2``): Cerebras ``T5ForConditionalGeneration`` <-> Hugging Face
``T5ForConditionalGeneration``.

Model Zoo, tag Release_2.10.0: ``src/cerebras/modelzoo/tools/checkpoint_converters/t5.py``
(layer rules ``Converter_T5_CS16_CS17`` lines 40-380, HF specifics ``Converter_T5_HF_CS17``
lines 612-697, tying ``Converter_T5_CS18_CS20`` lines 1064-1178, the 2.1 relative-bias rename
``Converter_T5_CS20_CS21`` lines 1248-1302 and ``Converter_T5_WithoutOptionalModel_HF_CS21``
lines 1341-1408, config rules ``ConfigConverter_T5_HF_CS17`` / ``_CS18`` / ``_CS20`` lines
813-1057 and 1223-1235). ``registry.py`` lines 307-321 map ``ul2``, ``flan-ul2`` and
``transformer`` to the T5 converters.

Every tensor is renamed; Model Zoo changes no data. In particular the tied lm_head is not
rescaled: both CS (``models/nlp/t5/t5_model.py`` lines 1038-1041) and HF multiply the decoder
output by ``d_model**-0.5`` when the embeddings are shared, and neither does when not.

``transformer`` converts only when its config is T5's (relative positions, RMSNorm, no biases):
Model Zoo asserts that (lines 879-920, 1226-1235) and HF T5 has no sinusoidal or learned
absolute positions; other configs are refused naming the field.

muP: Model Zoo's ``*_HF_CS23`` converters (lines 1433-1494, ``mup.py`` lines 149-191 and
586-700) rescale a muP T5 to standard parametrisation on export; so does ``export-hf`` before
these rules run (``hf/mup.py``), so a muP config reaching them is refused naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.hf import mup
from ckpt_migrate.hf.families._bert_common import (
    check_name,
    expect,
    layers_of,
    with_defaults,
)
from ckpt_migrate.hf.layouts import t5 as t5_layout
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
MODEL_TYPE = HF_MODEL_TYPES[0]
# One entry: the pipeline imports a T5ForConditionalGeneration as ``t5`` (the others export alike).
ARCHITECTURES = catalogue.hf_architectures(__name__)

# HF defaults Model Zoo fills in before converting (t5.py lines 923-939).
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32128,
    "d_model": 512,
    "d_kv": 64,
    "d_ff": 2048,
    "num_layers": 6,
    "num_heads": 8,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "dropout_rate": 0.1,
    "layer_norm_epsilon": 1e-6,
    "feed_forward_proj": "relu",
    "tie_word_embeddings": True,
}
# CS defaults Model Zoo fills in (t5.py lines 941-956, 1055-1057, 1233-1234).
CS_DEFAULTS: dict[str, Any] = {
    "use_projection_bias_in_attention": False,
    "relative_attention_num_buckets": 32,
    "share_embedding_weights": True,
    "layer_norm_epsilon": 1.0e-5,
    "position_embedding_type": "relative",
    "use_dropout_outside_residual_path": True,
    "share_encoder_decoder_embedding": True,
    "use_pre_encoder_decoder_dropout": False,
    "use_pre_encoder_decoder_layer_norm": True,
    "use_ffn_bias": False,
    "use_transformer_initialization": False,
    "norm_type": "rmsnorm",
}
# CS defaults HF T5 can take any value of (the rest of CS_DEFAULTS it can express only so)
_FREE = frozenset(
    {"relative_attention_num_buckets", "share_embedding_weights", "layer_norm_epsilon"}
)
# The one value HF T5 can express (assert_factory_fn rules, t5.py lines 842-920, 1047-1052,
# 1226-1231), plus T5ForConditionalGenerationModelConfig fields HF T5 has no weights for (ours).
CS_REQUIRED: dict[str, Any] = {
    **{k: v for k, v in CS_DEFAULTS.items() if k not in _FREE},
    "tie_encoder_decoder": False,
    "attention_module": "aiayn_attention",
}
HF_REQUIRED: dict[str, Any] = {"is_encoder_decoder": True, "relative_attention_max_distance": 128}
# (CS field, HF field) copied as they are (t5.py lines 822-870).
RENAMED = (
    ("src_vocab_size", "vocab_size"),
    ("d_model", "d_model"),
    ("d_kv", "d_kv"),
    ("d_ff", "d_ff"),
    ("encoder_num_hidden_layers", "num_layers"),
    ("decoder_num_hidden_layers", "num_decoder_layers"),
    ("num_heads", "num_heads"),
    ("relative_attention_num_buckets", "relative_attention_num_buckets"),
    ("dropout_rate", "dropout_rate"),
    ("layer_norm_epsilon", "layer_norm_epsilon"),
)
# Gated activations (t5.py lines 966-993); the others keep their name.
_GATED_TO_CS = {"gated-silu": "swiglu", "gated-relu": "reglu", "gated-gelu": "geglu"}
_GATED_TO_HF = {cs: hf for hf, cs in _GATED_TO_CS.items()}
_PLAIN = ("relu", "gelu")

# ----------------------------------------------------------------------------- config


def _nonlinearity_to_hf(cs: Mapping[str, Any]) -> str:
    """``encoder_nonlinearity`` -> ``feed_forward_proj``; the decoder's must be the same
    (t5.py lines 966-1008)."""
    act = cs.get("encoder_nonlinearity", "relu")
    dec = cs.get("decoder_nonlinearity")
    if dec is not None and dec != act:
        raise MappingError(f"decoder_nonlinearity={dec!r}: HF T5 uses encoder_nonlinearity={act!r}")
    if act in _GATED_TO_HF:
        return _GATED_TO_HF[act]
    if act in _PLAIN:
        return act
    raise MappingError(f"encoder_nonlinearity={act!r}: no HF T5 feed_forward_proj for it")


def _nonlinearity_to_cs(hf: Mapping[str, Any]) -> str:
    proj = hf["feed_forward_proj"]
    if proj in _GATED_TO_CS:
        return _GATED_TO_CS[proj]
    if proj in _PLAIN:
        return proj
    raise MappingError(f"feed_forward_proj={proj!r}: CS T5 supports relu, gelu and gated variants")


def hf_scales_tied(hf: Mapping[str, Any]) -> bool:
    """Whether the HF model shares the lm_head with the embeddings (and so rescales by
    ``d_model**-0.5``). transformers 5 keeps that in ``scale_decoder_outputs`` and always writes
    ``tie_word_embeddings: true``; older releases use ``tie_word_embeddings`` (Model Zoo reads
    that one, t5.py lines 850-857)."""
    if "scale_decoder_outputs" in hf:
        return bool(hf["scale_decoder_outputs"])
    return bool(hf.get("tie_word_embeddings", True))


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: ConfigConverter_T5_HF_CS21 (t5.py lines 1330-1338), CS -> HF. Besides Model
    Zoo's ``tie_word_embeddings`` we write ``scale_decoder_outputs`` (transformers 5's name for
    the same switch, see :func:`hf_scales_tied`)."""
    check_name(name, NAMES)
    mup.refuse(cs_model, name)  # not folded: catalogue/mup.py T5_MUP
    cs = with_defaults(cs_model, CS_DEFAULTS)
    expect(cs, CS_REQUIRED, "HF")
    tgt = cs.get("tgt_vocab_size")
    if tgt is not None and tgt != cs.get("src_vocab_size", tgt):
        raise MappingError(f"tgt_vocab_size={tgt}: HF T5 has one vocabulary (src_vocab_size)")
    relu_dropout = cs.get("relu_dropout_rate")
    if relu_dropout is not None and relu_dropout != cs.get("dropout_rate", relu_dropout):
        raise MappingError(f"relu_dropout_rate={relu_dropout}: HF T5 uses dropout_rate for it")
    out: dict[str, Any] = {"architectures": [ARCHITECTURES[NAMES[0]]], "model_type": MODEL_TYPE}
    out.update({hf: cs[key] for key, hf in RENAMED if key in cs})
    out["feed_forward_proj"] = _nonlinearity_to_hf(cs)
    out["tie_word_embeddings"] = out["scale_decoder_outputs"] = cs["share_embedding_weights"]
    return out


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The same converter, HF -> CS; the CS side gets ``src/tgt_max_position_embeddings`` 512
    and ``norm_type: rmsnorm`` (t5.py lines 958-964, 1235)."""
    check_name(name, NAMES)
    if hf_config.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise MappingError(f"model_type={hf_config['model_type']!r}: expected 't5'")
    hf = with_defaults(hf_config, HF_DEFAULTS)
    expect(hf, HF_REQUIRED, "CS")
    out = {key: hf[name_] for key, name_ in RENAMED if name_ in hf}
    out["encoder_nonlinearity"] = out["decoder_nonlinearity"] = _nonlinearity_to_cs(hf)
    out["share_embedding_weights"] = hf_scales_tied(hf)
    out["src_max_position_embeddings"] = out["tgt_max_position_embeddings"] = 512
    out["norm_type"] = "rmsnorm"
    return out


# ----------------------------------------------------------------------------- tensors

TABLE = t5_layout.T5


def _refuse_positions(cs: Mapping[str, Shape]) -> None:
    """Learned or sinusoidal absolute positions (the ``transformer`` model) have no HF T5 home
    (t5.py lines 707-728)."""
    for name in cs:
        if re.fullmatch(r"(?:encoder|decoder)_embeddings\.position_embeddings\..*", name):
            raise MappingError(f"{name}: position_embedding_type absolute has no HF T5 equivalent")


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: Converter_T5_HF_CS21 (t5.py lines 1341-1408, 1485-1489) either way: the
    encoder and decoder layer counts, gated feed-forward layers, the lm_head shared with the
    embeddings (``share_embedding_weights``; on import :func:`hf_scales_tied`)."""
    check_name(name, NAMES)
    if direction == TO_HF:
        _refuse_positions(shapes)
        cfg = with_defaults(config, CS_DEFAULTS)
        keys = ("encoder_num_hidden_layers", "decoder_num_hidden_layers")
    else:
        cfg = with_defaults(config, HF_DEFAULTS)
        keys = ("num_layers", "num_decoder_layers")
    enc = layers_of(cfg, keys[0], 6)
    dec = enc if cfg.get(keys[1]) is None else layers_of(cfg, keys[1], enc)
    if direction == TO_HF:
        gated = _nonlinearity_to_hf(cfg).startswith("gated-")
        tied = cfg["share_embedding_weights"]
    else:
        gated, tied = str(cfg["feed_forward_proj"]).startswith("gated-"), hf_scales_tied(cfg)
    flags = {f for f, on in (("gated", gated), ("tied", tied)) if on}
    dims = {"encoder": enc, "decoder": dec, "side": "CS" if direction == TO_HF else "HF"}
    return Ctx(shapes, 0, "", frozenset(flags), dims)


plan_to_hf, plan_to_cs = plans(TABLE, context)
