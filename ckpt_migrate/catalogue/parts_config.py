"""The config tables of the models a composite holds that are no Model Zoo name of their own
(``keyless.py``'s ``Part(name=...)``), in the vocabulary of ``config.py``: each is another
name's table (:class:`~ckpt_migrate.catalogue.config.Like`) and what the part changes, or the
LLaVA projector's own. ``hf/config_table.py`` runs them as it runs a record's.

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:

* ``bert-model``: Dragon+'s encoders, ``ConfigConverter_Dragon_HF_CS`` (``dragon_plus.py``
  lines 289-337): BERT's pretraining rules (line 292) as a ``BertModel``,
  ``add_pooling_layer`` <-> ``projection_dim`` (lines 322-337).
* ``clip-vision``: LLaVA's image tower, ``ConfigConverter_CLIPViT_HF_CS21`` as a
  ``CLIPVisionModel`` (``llava.py`` lines 48-78); a ``CLIPConfig`` gives its ``vision_config``
  (lines 603-604).
* ``llava-projector``: the LLaVA fields of the text model's ``config.json``
  (``ConfigConverter_LLaMaProjector_HF_CS22`` lines 626-838, ``ConfigConverter_LLaVA_HF_CS22``
  lines 377-623).
* ``mmsimple-projector``: the same fields in MM-Simple LLaVA's CS layout (``mm_simple.py``
  lines 288-452).
"""

from __future__ import annotations

from typing import Any

from ckpt_migrate.catalogue.bert_config import BERT_HF_DEFAULTS
from ckpt_migrate.catalogue.config import CS, HF, Defaults, Like, Op, Renames, Required, Written
from ckpt_migrate.catalogue.keyless import CLIP_VIT

# the CS fields ConfigConverter_LLaVA_HF_CS22 adds (llava.py lines 396-406)
LLAVA_CS_DEFAULTS: dict[str, Any] = {
    "loss_weight": 1.0,
    "loss_scaling": "num_tokens",
    "label_smoothing": 0.0,
    "z_loss_eps": 0.0,
    "image_start_idx": 1,
}
# the HF fields ConfigConverter_LLaMaProjector_HF_CS22 writes (llava.py lines 699-716)
LLAVA_HF_FIXED: dict[str, Any] = {
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "use_cache": True,
    "architectures": ["LlavaLlamaForCausalLM"],
    "model_type": "llava",
    "mm_use_im_patch_token": False,
    "mm_use_im_start_end": False,
    "image_aspect_ratio": "pad",
    "freeze_mm_mlp_adapter": False,
    "freeze_mm_vision_resampler": False,
    "tune_mm_vision_resampler": False,
    "unfreeze_mm_vision_tower": False,
}
# HF defaults before converting (llava.py lines 673-687)
LLAVA_HF_DEFAULTS: dict[str, Any] = {
    "mm_vision_select_feature": "patch",
    "mm_vision_select_layer": -2,
    "mm_projector_type": "mlp2x_gelu",
    "tune_mm_mlp_adapter": False,
}

PART_CONFIGS: dict[str, tuple] = {  # part name -> its steps (``config.Step``)
    "bert-model": (
        Like("bert", skip=("add_pooling_layer",)),
        Written(CS, {"architectures": ["BertModel"]}, over=True),
        Op("pooler width", {"default": BERT_HF_DEFAULTS["hidden_size"]}),
    ),
    "clip-vision": (
        Op("section", {"key": "vision_config"}),
        Defaults(HF, {"architectures": [CLIP_VIT.hf.architectures[CLIP_VIT.name]]}, over=True),
        Like(CLIP_VIT.name),
        Written(CS, {"architectures": ["CLIPVisionModel"]}, over=True),
    ),
    # the text model's LLaVA fields: the projector's type and width, the image tower's width,
    # the selected feature and layer (a non-negative CS index counts HF's embedding output: +1),
    # ``freeze`` (llava.py lines 492-539, 606-622, 655-664, 718-805)
    "llava-projector": (
        Required(
            HF,
            ("mm_hidden_size",),
            "{key}: text_model/config.json lacks LLaVA's fields (mm_hidden_size, "
            "mm_projector_type, ...): start from a LLaVA config.json (llava.py lines 351-367)",
        ),
        Defaults(HF, LLAVA_HF_DEFAULTS),
        Defaults(
            CS,
            {"image_feature_select_mode": "patch", "image_feature_select_layer_idx": -2},
        ),
        Op("llava projector type"),
        Op("llava select layer"),
        Op("llava flags", {"flags": ("mm_use_im_start_end", "mm_use_im_patch_token")}),
        Renames((("mm_vision_select_feature", "image_feature_select_mode"),)),
        Op("llava projector"),
        Op("llava freeze"),
        Op("llava layer index"),
        Written(HF, LLAVA_CS_DEFAULTS),
        Written(CS, LLAVA_HF_FIXED),
    ),
    # LLaVA's, its CS fields under ``image_model_list`` (mm_simple.py lines 365-452): the
    # encoder's selected layer, the selection mode and the projection; no ``image_start_idx``
    "mmsimple-projector": (
        Op("mmsimple as llava"),
        Like("llava-projector"),
        Op("mmsimple sections"),
    ),
}
