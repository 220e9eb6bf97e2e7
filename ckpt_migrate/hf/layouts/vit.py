"""The tensor table of CLIP-ViT: Cerebras ``ViTClassificationModel`` (``vit_model.`` +
``classifier``) <-> Hugging Face ``CLIPVisionModelWithProjection`` (``vision_model.`` +
``visual_projection``), and its context.

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:
``clip_vit.py`` (tensor rules ``Converter_CLIPViT_Core_HF_CS21`` lines 34-210, the position
table's row order lines 212-236, the projection as the CS classifier
``Converter_CLIPViT_Projection_HF_CS21`` lines 249-272). Every tensor is renamed but the
position table: HF keeps the class token's row first, CS last (``position_embeddings_convert``,
lines 212-236), so its rows are rotated by one each way (:data:`CLASS_ROW`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.encoders import layers_of
from ckpt_migrate.hf.layouts.bert_like import inputs_on_side
from ckpt_migrate.hf.mapping import Out, same_shape
from ckpt_migrate.hf.ops import Ctx, Op
from ckpt_migrate.hf.table import TO_CS, TO_HF, Group, Query, Table, pair, row


def _rolled(shift: int) -> Callable[[Sequence[str], Sequence[str], Ctx], list[Out]]:
    def build(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
        def rows(x: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(np.roll(x, shift, axis=0))

        return [
            Out(d, (s,), rows, infer=same_shape, note="class-token row moved")
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
CLIP = Table(
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


def context(q: Query) -> Ctx:
    """Model Zoo: Converter_CLIPViT_Projection_HF_CS21 either way: the layers, once the record's
    config table accepted the config (HF's ``position_ids`` buffer, when a file has it, is
    dropped: lines 39-41)."""
    if q.to_hf:
        config_table.to_hf(q.config, q.name)
        cfg = q.config
    else:
        cfg = config_table.to_cs(q.config, q.name)
    layers = layers_of(cfg, "num_hidden_layers", 12)
    return Ctx(q.shapes, layers, dims={"side": "CS" if q.to_hf else "HF"})
