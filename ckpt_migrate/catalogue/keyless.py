"""Families without a key table: not decoder or encoder LMs of the tabulated layouts. Every hop
applies only its model-independent steps, as Model Zoo's fallback converters do
(``convert_checkpoint.py`` ``get_model_converter``), and their keys are not checked.

Names and registry names: tag Release_2.10.0, ``tools/checkpoint_converters/registry.py``
lines 173-378 (CLIP-ViT runs as ``vision_transformer``, MM-Simple-LLaVA as
``multimodal_simple``; Dragon has no registry entry).
"""

from __future__ import annotations

from ckpt_migrate.catalogue.record import Name, Record

CLIP_VIT = Record("clip-vit", None, names=(Name("clip-vit", "vision_transformer", 9, since="2.1"),))
DPO = Record("dpo", None, names=(Name("dpo", "dpo", 13, since="2.1"),))
DRAGON = Record("dragon", None, names=(Name("dragon", None, 14, since="2.3"),))
LLAVA = Record("llava", None, names=(Name("llava", "llava", 27, since="2.2"),))
MMSIMPLE_LLAVA = Record(
    "mmsimple-llava",
    None,
    names=(Name("mmsimple-llava", "multimodal_simple", 28, since="2.3"),),
    more_names=(("multimodal_simple", "multimodal_simple"),),
)
