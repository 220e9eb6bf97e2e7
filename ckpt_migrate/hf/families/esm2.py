"""ESM-2: Cerebras ``Esm2PretrainModel`` (a ``BertPretrainModel`` with a pre-LN encoder, a final
encoder norm and no NSP head) <-> Hugging Face ``EsmForMaskedLM``.

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:
``esm2.py`` (encoder ``Converter_Esm2Model_WithoutOptionalModel_HF_CS21`` lines 39-250, head
``Converter_Esm2PretrainModel_WithoutOptionalModel_HF_CS21`` lines 253-348, config
``ConfigConverter_Esm2_HF_CS21`` lines 358-604), built on the BERT rules of ``bert.py`` it
inherits (``Converter_BertModel_CS16_CS17`` lines 78-243, the 2.1 ``position_embeddings.embed``
rename lines 1238-1254, ``ConfigConverter_Bert_HF_CS17`` / ``_CS21`` lines 807-955 and
1223-1228). ``registry.py`` line 232 names the model ``esm-2``.

Data changes: with rotary positions the query and key rows are permuted per head (CS
interleaves the rotary pairs, HF keeps them as two halves; esm2.py lines 127-215, the same
permutation as LLaMA's, :func:`~ckpt_migrate.hf.ops.interleave_rotary`). Everything else is a
rename. The tensor table is ``hf/layouts/bert_like.py``'s ``ESM2``.

HF tensors with no CS counterpart: the contact-prediction head (``esm.contact_head.regression``,
dropped by Model Zoo too, esm2.py lines 316-320; an export leaves it out and transformers
initialises it anew) and the rotary ``inv_freq`` buffer (esm2.py lines 81-88), which
transformers recomputes from the config. ``save_pretrained`` of transformers 5 writes the
encoder layer norms as ``LayerNorm.gamma`` / ``.beta`` and the buffer under the literal name
``esm.encoder.layer.*.attention.self.rotary_embeddings.inv_freq`` (the reverse of its ESM load
renames); an import reads both spellings (as Model Zoo's ``Converter_BertLayerNorm_HF_CS``,
bert.py lines 39-67), an export writes the state-dict names (``.weight`` / ``.bias``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.hf import mup
from ckpt_migrate.hf.families import bert
from ckpt_migrate.hf.families._bert_common import (
    check_name,
    expect,
    layers_of,
    with_defaults,
)
from ckpt_migrate.hf.layouts import bert_like
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
ARCHITECTURES = catalogue.hf_architectures(__name__)


# CS model field <-> HF config field, copied when present (ConfigConverter_Bert_HF_CS17, bert.py
# lines 822-930; esm2.py lines 380-399 add the ESM fields). Not ``hidden_act``: ESM's rule for
# ``encoder_nonlinearity`` only asserts gelu (esm2.py lines 368-371) and EsmConfig has none.
RENAMED = (
    ("vocab_size", "vocab_size"),
    ("share_embedding_weights", "tie_word_embeddings"),
    ("hidden_size", "hidden_size"),
    ("num_heads", "num_attention_heads"),
    ("num_hidden_layers", "num_hidden_layers"),
    ("filter_size", "intermediate_size"),
    ("dropout_rate", "hidden_dropout_prob"),
    ("attention_dropout_rate", "attention_probs_dropout_prob"),
    ("layer_norm_epsilon", "layer_norm_eps"),
    ("initializer_range", "initializer_range"),
    ("embedding_layer_norm", "emb_layer_norm_before"),
    ("token_dropout", "token_dropout"),
    ("mask_token_id", "mask_token_id"),
    ("pad_token_id", "pad_token_id"),
)
# HF defaults Model Zoo fills in (bert.py lines 933-947, esm2.py lines 409-416); the position
# type is EsmConfig's default (Model Zoo leaves a missing one unconverted).
HF_DEFAULTS: dict[str, Any] = {
    **bert.HF_DEFAULTS,
    "mask_token_id": None,
    "pad_token_id": None,
    "token_dropout": False,
    "emb_layer_norm_before": False,
    "position_embedding_type": "absolute",
}
# CS defaults Model Zoo fills in (bert.py lines 948-953, esm2.py lines 417-426); the position
# type is BertModelConfig's default (models/nlp/bert/bert_model.py).
CS_DEFAULTS: dict[str, Any] = {
    "share_embedding_weights": True,
    "encoder_nonlinearity": "gelu",
    "disable_nsp": False,
    "pad_token_id": 0,
    "mask_padding_in_positional_embed": False,
    "use_final_layer_norm": False,
    "token_dropout": False,
    "embedding_layer_norm": True,
    "position_embedding_type": "learned",
}
# CS fields with the one value HF ESM can express: esm2.py lines 368-379 and 400-403, bert.py
# lines 900-929; ``norm_first`` and ``attention_module`` are ours (HF ESM is a pre-LN encoder
# with plain multi-head attention; Model Zoo does not check them).
CS_REQUIRED: dict[str, Any] = {
    "encoder_nonlinearity": "gelu",
    "use_final_layer_norm": True,
    "disable_nsp": True,
    "attention_type": "scaled_dot_product",
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True,
    "use_ffn_bias_in_mlm": True,
    "use_output_bias_in_mlm": True,
    "norm_first": True,
    "attention_module": "aiayn_attention",
}
# HF fields Model Zoo requires (bert.py lines 884-895); ``is_folding_model`` is ours (ESMFold is
# another class, ``EsmForProteinFolding``).
HF_REQUIRED: dict[str, Any] = {
    "hidden_act": "gelu",
    "is_decoder": False,
    "add_cross_attention": False,
    "is_folding_model": False,
}
_ROPE_THETA = 10000.0  # CS BertModelConfig and HF EsmConfig default

# ----------------------------------------------------------------------------- config


def _rotary_dim_ok(cs: Mapping[str, Any]) -> None:
    """esm2.py lines 457-476: a rotary model converts only when ``rotary_dim`` is the head size.
    Ours: an absent ``rotary_dim`` fails too (CS then rotates a quarter of each head,
    bert_model.py lines 293-294, which HF cannot)."""
    if cs["position_embedding_type"] != "rotary":
        return
    if cs.get("rotary_dim") != cs["hidden_size"] // cs["num_heads"]:
        raise MappingError(
            f"rotary_dim={cs.get('rotary_dim')!r}: must be hidden_size // num_heads for HF"
        )


def _positions_to_hf(cs: Mapping[str, Any]) -> tuple[str, int]:
    """HF ``position_embedding_type`` and ``max_position_embeddings`` (esm2.py lines 494-569):
    rotary stays rotary; learned needs ``mask_padding_in_positional_embed`` and becomes absolute,
    whose table HF sizes MSL + ``pad_token_id`` + 1."""
    kind, msl = cs["position_embedding_type"], cs["max_position_embeddings"]
    if kind == "rotary":
        return "rotary", msl
    if kind != "learned":
        raise MappingError(f"position_embedding_type={kind!r}: HF ESM has rotary or absolute")
    if cs["mask_padding_in_positional_embed"] is not True:
        raise MappingError(
            "mask_padding_in_positional_embed: must be true for learned positions (HF ESM)"
        )
    return "absolute", msl + cs["pad_token_id"] + 1


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: ConfigConverter_Esm2_HF_CS21 (esm2.py lines 358-604), CS -> HF. Its
    ``post_config_convert`` skips BERT's pooler and MLM defaults (lines 581-604) and adds
    ``is_folding_model: False``, ``esmfold_config: None`` (lines 427-432). ``rope_theta`` is
    ours (Model Zoo has no rule for it; a non-default one would be lost). ``model_type`` is
    ``esm``: Model Zoo writes ``bert`` (the BERT post default of bert.py line 955 that its ESM
    subclass does not override), which transformers would build as a BERT model."""
    check_name(name, NAMES)
    mup.refuse(cs_model, name)
    cs = with_defaults(cs_model, CS_DEFAULTS)
    expect(cs, CS_REQUIRED, "HF")
    for key in ("mlm_nonlinearity", "pooler_nonlinearity"):  # esm2.py 372-375, bert.py 864-867
        wanted = "gelu" if key == "mlm_nonlinearity" else "tanh"
        if cs.get(key) not in (None, wanted):
            raise MappingError(f"{key}={cs[key]!r}: only {wanted!r} converts to HF")
    for key in ("hidden_size", "num_heads", "max_position_embeddings"):
        if key not in cs:
            raise MappingError(f"{key}: required in the CS model section")
    if cs["token_dropout"] and cs.get("mask_token_id") is None:  # esm2.py lines 478-492
        raise MappingError("mask_token_id: required when token_dropout is true")
    _rotary_dim_ok(cs)
    kind, table = _positions_to_hf(cs)
    out: dict[str, Any] = {"architectures": [ARCHITECTURES[name]], "model_type": "esm"}
    out.update({hf: cs[key] for key, hf in RENAMED if key in cs})
    out.update(
        position_embedding_type=kind,
        max_position_embeddings=table,
        rope_theta=float(cs.get("rope_theta", _ROPE_THETA)),
        is_folding_model=False,
        esmfold_config=None,
    )
    return out


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: the same converter, HF -> CS. Absolute positions become ``learned`` with
    ``mask_padding_in_positional_embed`` and a table of ``max_position_embeddings`` -
    ``pad_token_id`` - 1 (esm2.py lines 494-545); rotary ones get ``rotary_dim`` = head size
    (lines 590-594). The CS side gets ``use_final_layer_norm``, ``disable_nsp`` (lines 433-438)
    and ``freeze_ffn_bias_in_glu: False`` (bert.py line 1228). ``emb_layer_norm_before: null``
    (EsmConfig's default) is written as false (CS ``embedding_layer_norm`` is a bool)."""
    check_name(name, NAMES)
    if hf_config.get("model_type", "esm") != "esm":
        raise MappingError(f"model_type={hf_config['model_type']!r}: expected 'esm'")
    hf = with_defaults(hf_config, HF_DEFAULTS)
    expect(hf, HF_REQUIRED, "CS")
    if hf["token_dropout"] and hf["mask_token_id"] is None:
        raise MappingError("mask_token_id: required when token_dropout is true")
    out = {key: hf[h] for key, h in RENAMED if h in hf}
    out["encoder_nonlinearity"] = hf["hidden_act"]  # bert.py lines 856-859
    out["embedding_layer_norm"] = bool(hf["emb_layer_norm_before"])
    kind, table = hf["position_embedding_type"], hf["max_position_embeddings"]
    if kind == "rotary":
        out.update(position_embedding_type="rotary", max_position_embeddings=table)
        out["rotary_dim"] = hf["hidden_size"] // hf["num_attention_heads"]
    elif kind == "absolute":
        if hf["pad_token_id"] is None:
            raise MappingError("pad_token_id: required to size CS's position table")
        out.update(
            position_embedding_type="learned",
            mask_padding_in_positional_embed=True,
            max_position_embeddings=table - hf["pad_token_id"] - 1,
        )
    else:
        raise MappingError(f"position_embedding_type={kind!r}: CS ESM-2 has rotary or learned")
    out["rope_theta"] = float(hf.get("rope_theta", _ROPE_THETA))  # ours, see config_to_hf
    out.update(use_final_layer_norm=True, disable_nsp=True, freeze_ffn_bias_in_glu=False)
    return out


# ----------------------------------------------------------------------------- tensors

TABLE = bert_like.ESM2


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: Converter_Esm2PretrainModel_HF_CS21 either way: the layers, rotary positions
    (query and key rows permuted per head) or learned ones, the embedding norm
    (``embedding_layer_norm``/``emb_layer_norm_before``), the word embeddings tied to the MLM
    decoder (``share_embedding_weights``/``tie_word_embeddings``)."""
    check_name(name, NAMES)
    to_hf = direction == TO_HF
    cfg = with_defaults(config, CS_DEFAULTS if to_hf else HF_DEFAULTS)
    layers = layers_of(cfg, "num_hidden_layers", 12)
    rotary = cfg["position_embedding_type"] == "rotary"
    heads = int(cfg["num_heads" if to_hf else "num_attention_heads"]) if rotary else 0
    norm = bool(cfg["embedding_layer_norm" if to_hf else "emb_layer_norm_before"])
    tied = cfg["share_embedding_weights" if to_hf else "tie_word_embeddings"]
    flags = {f for f, on in (("rotary", rotary), ("norm", norm), ("tied", tied)) if on}
    dims = {"heads": heads, "side": "CS" if to_hf else "HF"}
    return Ctx(shapes, layers, "esm.", frozenset(flags), dims, cs_prefix="bert_encoder.")


plan_to_hf, plan_to_cs = plans(TABLE, context)
