"""The named operations of the parts' config tables (``catalogue/parts_config.py``), each a
pair as in ``config_ops.py``: (exporting, importing). Model Zoo, tag Release_2.10.0,
``src/cerebras/modelzoo/tools/checkpoint_converters/``: ``dragon_plus.py``, ``llava.py``,
``mm_simple.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ckpt_migrate.catalogue.parts_config import LLAVA_HF_DEFAULTS
from ckpt_migrate.hf.config_ops import Fn, State
from ckpt_migrate.hf.mapping import MappingError

_MLP = re.compile(r"mlp(\d+)x_gelu")


def _pooler_to_hf(s: State, default: int) -> None:
    """dragon_plus.py lines 333-337: ``add_pooling_layer`` -> ``projection_dim``."""
    if "add_pooling_layer" in s.src:
        s.out["projection_dim"] = s.out["hidden_size"] if s.src["add_pooling_layer"] else 0


def _pooler_to_cs(s: State, default: int) -> None:
    """dragon_plus.py lines 322-331: a pooler width other than ``hidden_size`` is refused."""
    if "projection_dim" in s.src:
        width = s.src["projection_dim"]
        if width and width != s.src.get("hidden_size", default):
            raise MappingError(f"projection_dim={width}: CS's pooler is hidden_size wide")
        s.out["add_pooling_layer"] = bool(width)


def _section(s: State, key: str) -> None:
    """The config's ``key`` section when it has one (a ``CLIPConfig``'s ``vision_config``)."""
    s.src = s.src.get(key, s.src)


def need(config: Mapping[str, Any], path: str) -> Any:
    """The value at the dotted ``path`` (a number steps into a list), or MappingError."""
    found: Any = config
    for step in path.split("."):
        try:
            found = found[int(step)] if isinstance(found, list) else found[step]
        except (KeyError, IndexError, TypeError, ValueError):
            raise MappingError(f"{path}: missing from the config") from None
    return found


def projector_layers(config: Mapping[str, Any], to_hf: bool) -> int:
    """The LLaVA projector's linear layers: CS, its ``layers_units`` (MM-Simple's section,
    mm_simple.py lines 200-202, or LLaVA's); HF, the ``N`` of ``mm_projector_type``
    ``mlp<N>x_gelu``."""
    if to_hf:
        if "image_model_list" in config:
            return len(need(config, "image_model_list.global_image_projection.layers_units"))
        return len(need(config, "projector.image_model.layers_units"))
    hf = {**LLAVA_HF_DEFAULTS, **config}
    found = _MLP.fullmatch(str(hf["mm_projector_type"]))
    if found is None:
        raise MappingError(
            f"mm_projector_type={hf['mm_projector_type']!r}: Model Zoo converts mlp<N>x_gelu only"
        )
    return int(found.group(1))


def _type_to_hf(s: State) -> None:
    """llava.py lines 718-740: the projector is a FeedForwardNetwork of GELU layers."""
    proj = need(s.src, "projector.image_model")
    acts = list(proj.get("layers_activation", []))
    if proj.get("name") != "FeedForwardNetwork" or acts != ["gelu"] * (len(acts) - 1) + [None]:
        raise MappingError(
            f"projector.image_model: LLaVA's is a FeedForwardNetwork of gelu layers, got {proj}"
        )
    s.out["mm_projector_type"] = f"mlp{len(acts)}x_gelu"


def _type_to_cs(s: State) -> None:
    projector_layers(s.src, to_hf=False)


def _select_layer_to_hf(s: State) -> None:
    layer = int(s.src["image_feature_select_layer_idx"])
    s.out["mm_vision_select_layer"] = layer if layer < 0 else layer + 1


def _select_layer_to_cs(s: State) -> None:
    if int(s.src["mm_vision_select_layer"]) == 0:
        raise MappingError("mm_vision_select_layer=0 selects the embeddings (llava.py line 736)")


def _layer_index(s: State) -> None:
    layer = int(s.src["mm_vision_select_layer"])
    s.out["image_feature_select_layer_idx"] = layer if layer < 0 else layer - 1


def _flags(s: State, flags: tuple[str, ...]) -> None:
    for flag in flags:
        if s.src.get(flag):
            raise MappingError(f"{flag}: Model Zoo converts only false (llava.py lines 655-664)")


def _projector_to_hf(s: State) -> None:
    s.out["mm_hidden_size"] = need(s.src, "image_model.hidden_size")


def _projector_to_cs(s: State) -> None:
    count = projector_layers(s.src, to_hf=False)
    s.out["projector"] = {
        "image_model": {
            "name": "FeedForwardNetwork",
            "input_unit": s.src["mm_hidden_size"],
            "layers_units": [s.src["hidden_size"]] * count,
            "layers_activation": ["gelu"] * (count - 1) + [None],
            "use_bias": True,
        }
    }


def _freeze_to_hf(s: State) -> None:
    s.out["tune_mm_mlp_adapter"] = "^text_model" in s.src.get("freeze", [])


def _freeze_to_cs(s: State) -> None:
    s.out["freeze"] = ["^image_model", *(["^text_model"] if s.src["tune_mm_mlp_adapter"] else [])]


def _as_llava(s: State) -> None:
    """mm_simple.py lines 365-403: MM-Simple's CS config read as LLaVA's."""
    images = need(s.src, "image_model_list")
    encoder = need(images, "image_models.0.image_encoder")
    s.src = {
        "projector": {"image_model": need(images, "global_image_projection")},
        "image_model": encoder,
        "image_feature_select_mode": images.get("image_feature_select_mode", "patch"),
        "image_feature_select_layer_idx": encoder.get("image_layer_idx", -2),
        "freeze": s.src.get("freeze", []),
    }


def _sections(s: State) -> None:
    """mm_simple.py lines 405-452: LLaVA's CS fields moved under ``image_model_list``."""
    out = s.out
    del out["image_start_idx"]
    layer = out.pop("image_feature_select_layer_idx")
    out["image_model_list"] = {
        "image_models": [{"image_encoder": {"image_layer_idx": layer}}],
        "image_feature_select_mode": out.pop("image_feature_select_mode"),
        "global_image_projection": out.pop("projector")["image_model"],
    }


OPS: dict[str, tuple[Fn, Fn]] = {
    "pooler width": (_pooler_to_hf, _pooler_to_cs),
    "section": (None, _section),
    "llava projector type": (_type_to_hf, _type_to_cs),
    "llava select layer": (_select_layer_to_hf, _select_layer_to_cs),
    "llava flags": (None, _flags),
    "llava projector": (_projector_to_hf, _projector_to_cs),
    "llava freeze": (_freeze_to_hf, _freeze_to_cs),
    "llava layer index": (None, _layer_index),
    "mmsimple as llava": (_as_llava, None),
    "mmsimple sections": (None, _sections),
}
