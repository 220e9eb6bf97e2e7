"""CLIP-ViT: Cerebras ``ViTClassificationModel`` (``vit_model.`` + ``classifier``) <-> Hugging
Face ``CLIPVisionModelWithProjection`` (``vision_model.`` + ``visual_projection``).

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:
``clip_vit.py`` (tensor rules ``Converter_CLIPViT_Core_HF_CS21`` lines 34-210, the position
table's row order lines 212-236, the projection as the CS classifier
``Converter_CLIPViT_Projection_HF_CS21`` lines 249-272, config rules
``ConfigConverter_CLIPViT_HF_CS21`` lines 406-523 over ``vit.py``'s
``ConfigConverter_ViT_Core_HF_CS21`` lines 429-673 and ``ConfigConverter_ViT_HF_CS21`` lines
676-700). ``registry.py`` line 223 serves ``clip-vit`` with the projection converter only.

Every tensor is renamed but the position table: HF keeps the class token's row first, CS last
(``position_embeddings_convert``, lines 212-236), so its rows are rotated by one each way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ckpt_migrate import catalogue
from ckpt_migrate.hf.families._bert_common import check_name, expect, layers_of
from ckpt_migrate.hf.layouts.bert_like import inputs_on_side
from ckpt_migrate.hf.mapping import MappingError, Out, Shape
from ckpt_migrate.hf.ops import Ctx, Op
from ckpt_migrate.hf.table import TO_CS, TO_HF, Group, Table, pair, plans, row
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
MODEL_TYPE = HF_MODEL_TYPES[0]
ARCHITECTURES = catalogue.hf_architectures(__name__)

# (CS field, HF field) copied as they are (vit.py lines 443-507, clip_vit.py lines 432-444).
RENAMED = (
    ("hidden_size", "hidden_size"),
    ("num_hidden_layers", "num_hidden_layers"),
    ("layer_norm_epsilon", "layer_norm_eps"),
    ("num_heads", "num_attention_heads"),
    ("attention_dropout_rate", "attention_dropout"),
    ("filter_size", "intermediate_size"),
    ("initializer_range", "initializer_range"),
    ("num_channels", "num_channels"),
    ("num_classes", "projection_dim"),
)
SQUARE = (("image_size", "image_size"), ("patch_size", "patch_size"))  # CS [s, s] <-> HF s
# HF defaults Model Zoo fills in (vit.py lines 522-540 less clip_vit.py lines 463-478).
HF_DEFAULTS: dict[str, Any] = {
    "attention_dropout": 0.0,
    "hidden_act": "quick_gelu",
    "hidden_size": 768,
    "image_size": 224,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-5,
    "num_attention_heads": 12,
    "num_channels": 3,
    "num_hidden_layers": 12,
    "patch_size": 32,
    "projection_dim": 512,
}
# The CS fields HF CLIP can express only so (assert rules, vit.py lines 437-441 and 478-504,
# clip_vit.py lines 414-455; its CS defaults, lines 480-495 and 501-516). ``norm_first``,
# ``prepend_cls_token`` and no pooler are ours: CLIP is pre-LN with a class token and no pooler
# (Model Zoo writes them, lines 501-516, without checking them).
CS_FIXED: dict[str, Any] = {
    "use_post_embed_layer_norm": True,
    "use_embed_proj_bias": False,
    "use_bias_in_output": False,
    "position_embedding_type": "learned",
    "attention_type": "scaled_dot_product",
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True,
    "use_conv_patchified_embedding": True,
    "prepend_cls_token": True,
    "use_encoder_pooler_layer": False,
    "norm_first": True,
}
CS_WRITTEN = {**CS_FIXED, "dropout_rate": 0.0}  # clip_vit.py lines 501-516
# hidden_act <-> nonlinearity where the spellings differ (vit.py lines 591-623)
_ACT_TO_CS = {"silu": "swiglu", "gelu_pytorch_tanh": "gelu_new"}
_ACT_TO_HF = {cs: hf for hf, cs in _ACT_TO_CS.items()}


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: ConfigConverter_CLIPViT_HF_CS21, HF -> CS (``dropout_rate`` 0: HF CLIP has
    no hidden dropout)."""
    check_name(name, NAMES)
    hf = {**HF_DEFAULTS, **hf_config}
    if hf.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise MappingError(f"model_type={hf['model_type']!r}: expected {MODEL_TYPE!r}")
    wanted = ARCHITECTURES[name]
    for cls in hf.get("architectures") or [wanted]:
        if cls != wanted:
            raise MappingError(
                f"architectures={cls!r}: Model Zoo's {name} converter is {wanted}'s "
                "(registry.py line 223), whose visual_projection is the CS classifier"
            )
    out = {cs: hf[h] for cs, h in RENAMED}
    out.update({cs: [hf[h], hf[h]] for cs, h in SQUARE})
    out["nonlinearity"] = _ACT_TO_CS.get(hf["hidden_act"], hf["hidden_act"])
    return {**out, **CS_WRITTEN}


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The same converter, CS -> HF. CS ``dropout_rate`` has no HF CLIP field (dropped, lines
    450-451); a non-square image or patch is refused (vit.py lines 576-589)."""
    check_name(name, NAMES)
    cs = {**CS_FIXED, "num_classes": 512, **cs_model}
    expect(cs, CS_FIXED, "HF CLIP")
    out: dict[str, Any] = {"architectures": [ARCHITECTURES[name]], "model_type": MODEL_TYPE}
    out.update({h: cs[c] for c, h in RENAMED if c in cs})
    for c, h in SQUARE:
        if c in cs:
            width, height = cs[c]
            if width != height:
                raise MappingError(f"{c}={cs[c]!r}: HF CLIP needs a square {h}")
            out[h] = width
    if "nonlinearity" in cs:
        out["hidden_act"] = _ACT_TO_HF.get(cs["nonlinearity"], cs["nonlinearity"])
    return out


def _rolled(shift: int) -> Callable[[Sequence[str], Sequence[str], Ctx], list[Out]]:
    def build(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
        def rows(x: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(np.roll(x, shift, axis=0))

        return [
            Out(d, (s,), rows, infer=lambda shape: shape, note="class-token row moved")
            for s, d in zip(srcs, dsts, strict=True)
        ]

    return build


# The position table: the class token's row first in HF, last in CS (lines 212-236).
CLASS_ROW = Op("class-token position row moved", _rolled(1), _rolled(-1))

_LAYER = (
    ("self_attn.proj_q_dense_layer", "self_attn.q_proj"),
    ("self_attn.proj_k_dense_layer", "self_attn.k_proj"),
    ("self_attn.proj_v_dense_layer", "self_attn.v_proj"),
    ("self_attn.proj_output_dense_layer", "self_attn.out_proj"),
    ("ffn.ffn.0.linear_layer", "mlp.fc1"),
    ("ffn.ffn.1.linear_layer", "mlp.fc2"),
    ("norm1", "layer_norm1"),
    ("norm2", "layer_norm2"),
)
_C, _H = "vit_model.", "vision_model."
_LAYER_C, _LAYER_H = _C + "encoder.transformer_encoder.layers.{i}.", _H + "encoder.layers.{i}."

# Renames (clip_vit.py lines 38-209 under ``vision_model.``/``vit_model.``, lines 253-270; the
# projection, lines 262-270, has no bias in HF CLIP), the position table last.
TABLE = Table(
    groups={
        "embeddings": Group(
            (
                row(_C + "embedding_layer.cls_embedding", _H + "embeddings.class_embedding"),
                row(
                    _C + "embedding_layer.linear_proj.weight",
                    _H + "embeddings.patch_embedding.weight",
                ),
                pair(_C + "embedding_layer.post_embed_ln", _H + "pre_layrnorm"),
            )
        ),
        "layers": Group(
            tuple(pair(_LAYER_C + cs, _LAYER_H + hf) for cs, hf in _LAYER), per_layer=True
        ),
        "tail": Group(
            (
                pair(_C + "encoder.transformer_encoder.norm", _H + "post_layernorm"),
                row("classifier.classifier.ffn.0.linear_layer.weight", "visual_projection.weight"),
            )
        ),
        "positions": Group(
            (
                row(
                    _C + "embedding_layer.position_embeddings.weight",
                    _H + "embeddings.position_embedding.weight",
                    CLASS_ROW,
                ),
            )
        ),
    },
    order=dict.fromkeys((TO_HF, TO_CS), ("embeddings", "layers", "tail", "positions")),
    check=inputs_on_side,
)


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: Converter_CLIPViT_Projection_HF_CS21 either way: the layers (HF's
    ``position_ids`` buffer, when a file has it, is dropped: lines 39-41)."""
    to_hf = direction == TO_HF
    cfg = config_to_hf(config, name) if to_hf else config_to_cs(config, name)
    layers = layers_of(config if to_hf else cfg, "num_hidden_layers", 12)
    return Ctx(shapes, layers, dims={"side": "CS" if to_hf else "HF"})


plan_to_hf, plan_to_cs = plans(TABLE, context)
