"""The rules of the models a multi-directory composite holds that are no Model Zoo name of their
own: each is an existing family's table and config rules, less what the part lacks. A
catalogue ``Part`` names them (``Part.name``) as it names a Model Zoo family.

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:

* ``bert-model`` (Dragon+'s query and context encoders, ``dragon_plus.py`` lines 47-111: a
  ``BertModel``, ``Converter_BertModel_WithoutOptionalModel_HF_CS21``'s renames with no
  ``bert.``/``bert_encoder.`` prefix; the pooler is dropped both ways, lines 85-91 and 117-120;
  config ``ConfigConverter_Dragon_HF_CS`` lines 289-337: BERT's plus ``projection_dim`` <->
  ``add_pooling_layer``, ``architectures: [BertModel]``).
* ``clip-vision`` (LLaVA's image tower, ``llava.py`` lines 48-78: HF ``CLIPVisionModel``,
  ``Converter_CLIPViT_Core_HF_CS21``; CLIP-ViT's table without ``visual_projection``, config
  ``ConfigConverter_CLIPViT_HF_CS21``).
* ``llava-projector`` (``llava.py`` lines 135-191: HF ``model.mm_projector.{2i}`` <-> CS
  ``ffn.{i}.linear_layer``, the even ``nn.Sequential`` slots being LLaVA's linears) and the
  LLaVA config fields of the text model's ``config.json`` (``ConfigConverter_LLaMaProjector_
  HF_CS22`` lines 626-838, ``ConfigConverter_LLaVA_HF_CS22`` lines 377-623).
* ``mmsimple-projector``: the same projector and config fields in MM-Simple LLaVA's CS config
  layout (``mm_simple.py`` lines 288-452).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ckpt_migrate.catalogue.bert_config import BERT_HF_DEFAULTS
from ckpt_migrate.catalogue.bert_like import BERT
from ckpt_migrate.catalogue.keyless import CLIP_VIT
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.encoders import layers_of
from ckpt_migrate.hf.layouts import bert_like, vit
from ckpt_migrate.hf.mapping import MappingError, Out, Shape, rename
from ckpt_migrate.hf.ops import Ctx, Op
from ckpt_migrate.hf.table import TO_CS, TO_HF, Group, Query, Table, pair, plans, row

Config = Mapping[str, Any]
# The Model Zoo names whose config rules the parts run: BERT's pretraining model, CLIP-ViT.
_PRETRAINING = {cls: name for name, cls in BERT.hf.architectures.items()}["BertForPreTraining"]
_CLIP = CLIP_VIT.name


@dataclass(frozen=True)
class PartRules:
    """A part's rules: the contract of ``hf/mapping.py`` (``Family``)."""

    config_to_hf: Callable[[Config, str], dict[str, Any]]
    config_to_cs: Callable[[Config, str], dict[str, Any]]
    plan_to_hf: Callable[[Mapping[str, Shape], Config, str], list[Out]]
    plan_to_cs: Callable[[Mapping[str, Shape], Config, str], list[Out]]


# ------------------------------------------------------------------ bert-model (Dragon+)


def _bert_model_to_hf(cs: Config, name: str) -> dict[str, Any]:
    """BERT's config (its pretraining converter, as dragon_plus.py line 292) as a ``BertModel``;
    ``add_pooling_layer`` -> ``projection_dim`` (lines 333-337)."""
    out = config_table.to_hf(
        {k: v for k, v in cs.items() if k != "add_pooling_layer"}, _PRETRAINING
    )
    out["architectures"] = ["BertModel"]
    if "add_pooling_layer" in cs:
        out["projection_dim"] = out["hidden_size"] if cs["add_pooling_layer"] else 0
    return out


def _bert_model_to_cs(hf: Config, name: str) -> dict[str, Any]:
    """The reverse; a pooler width other than ``hidden_size`` is refused (lines 322-331)."""
    out = config_table.to_cs(hf, _PRETRAINING)
    if "projection_dim" in hf:
        width = hf["projection_dim"]
        if width and width != hf.get("hidden_size", BERT_HF_DEFAULTS["hidden_size"]):
            raise MappingError(f"projection_dim={width}: CS's pooler is hidden_size wide")
        out["add_pooling_layer"] = bool(width)
    return out


BERT_MODEL_TABLE = Table(
    groups={
        "encoder": bert_like.ENCODER,
        "layers": bert_like.encoder_layers(("attention.output.LayerNorm", "output.LayerNorm")),
        "words": Group((row(*bert_like.WORD),)),
    },
    order=dict.fromkeys((TO_HF, TO_CS), ("encoder", "layers", "words")),
    check=bert_like.inputs_on_side,
)


def _bert_model_context(q: Query) -> Ctx:
    cfg = q.config if q.to_hf else _bert_model_to_cs(q.config, q.name)
    layers = layers_of(cfg, "num_hidden_layers", 12)
    return Ctx(q.shapes, layers, "", frozenset({"segments"}), {"side": "CS" if q.to_hf else "HF"})


# --------------------------------------------------------------- clip-vision (LLaVA tower)


def _clip_vision_to_hf(cs: Config, name: str) -> dict[str, Any]:
    """CLIP-ViT's config as a ``CLIPVisionModel`` (no projection; ``projection_dim`` kept as
    Model Zoo writes it, from ``num_classes``)."""
    return {**config_table.to_hf(cs, _CLIP), "architectures": ["CLIPVisionModel"]}


def _clip_vision_to_cs(hf: Config, name: str) -> dict[str, Any]:
    """CLIP-ViT's config rules; a ``CLIPConfig`` gives its ``vision_config`` (llava.py lines
    603-604)."""
    hf = hf.get("vision_config", hf)
    proj = CLIP_VIT.hf.architectures[_CLIP]
    return config_table.to_cs({**hf, "architectures": [proj]}, _CLIP)


CLIP_VISION_TABLE = Table(
    groups={
        **vit.CLIP.groups,
        "tail": Group(vit.CLIP.groups["tail"].rows[:1]),  # post_layernorm, no projection
    },
    order=vit.CLIP.order,
    check=vit.CLIP.check,
)


def _clip_vision_context(q: Query) -> Ctx:
    cfg = q.config if q.to_hf else _clip_vision_to_cs(q.config, q.name)
    layers = layers_of(cfg, "num_hidden_layers", 12)
    return Ctx(q.shapes, layers, dims={"side": "CS" if q.to_hf else "HF"})


_clip_vision_to_hf_plan, _clip_vision_to_cs_plan = plans(CLIP_VISION_TABLE, _clip_vision_context)
_TOWER = "vision_model."


def _clip_vision_plan_to_cs(hf: Mapping[str, Shape], config: Config, name: str) -> list[Out]:
    """The export writes ``vision_model.`` names (Model Zoo's, llava.py line 57, and
    transformers 4's); transformers 5 saves a ``CLIPVisionModel`` without that prefix (and
    loads either): a file of bare names is read as such."""
    if any(n.startswith(_TOWER) for n in hf):
        return _clip_vision_to_cs_plan(hf, config, name)
    plan = _clip_vision_to_cs_plan({_TOWER + n: s for n, s in hf.items()}, config, name)
    bare = [tuple(i.removeprefix(_TOWER) for i in o.inputs) for o in plan]
    return [replace(o, inputs=inputs) for o, inputs in zip(plan, bare, strict=True)]


# ------------------------------------------------------------ llava-projector (and config)

_SLOT = re.compile(r"mm_projector\.(\d+)\.")


def _slot(name: str, scale: Callable[[int], int]) -> str:
    return _SLOT.sub(lambda m: f"mm_projector.{scale(int(m.group(1)))}.", name)


def _to_even(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    return [rename(s, _slot(d, lambda i: 2 * i)) for s, d in zip(srcs, dsts, strict=True)]


def _from_even(srcs: Sequence[str], dsts: Sequence[str], ctx: Ctx) -> list[Out]:
    return [rename(_slot(s, lambda i: 2 * i), d) for s, d in zip(srcs, dsts, strict=True)]


# LLaVA's projector is nn.Sequential(Linear, GELU, Linear, ...): linear i is slot 2i (llava.py
# lines 164-191, ``convert_projector``).
EVEN_SLOTS = Op("projector linear i <-> nn.Sequential slot 2i", _to_even, _from_even)


def _projector_present(plan: list[Out], ctx: Ctx) -> list[Out]:
    """A text model without the projector is refused: Model Zoo's import fills it with random
    values (llava.py lines 280-312), which is no conversion of the file."""
    missing = sorted({i for o in plan for i in o.inputs} - set(ctx.available))
    if missing and ctx.dims["side"] == "HF":
        raise MappingError(
            f"text_model/ has no LLaVA projector ({missing[0]} is missing); Model Zoo would "
            "start one from random values (llava.py lines 280-312): convert a LLaVA checkpoint "
            "that has model.mm_projector.*"
        )
    return bert_like.inputs_on_side(plan, ctx)


PROJECTOR_TABLE = Table(
    groups={
        "projector": Group(
            (pair("ffn.{i}.linear_layer", "model.mm_projector.{i}", EVEN_SLOTS),),
            per_layer=True,
        )
    },
    order=dict.fromkeys((TO_HF, TO_CS), ("projector",)),
    check=_projector_present,
)
_MLP = re.compile(r"mlp(\d+)x_gelu")
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


def _need(config: Config, path: str) -> Any:
    """The value at the dotted ``path`` (a number steps into a list), or MappingError."""
    found: Any = config
    for step in path.split("."):
        try:
            found = found[int(step)] if isinstance(found, list) else found[step]
        except (KeyError, IndexError, TypeError, ValueError):
            raise MappingError(f"{path}: missing from the config") from None
    return found


def _projector_layers(config: Config, direction: str) -> int:
    if direction == TO_HF:
        if "image_model_list" in config:  # MM-Simple's section (mm_simple.py lines 200-202)
            return len(_need(config, "image_model_list.global_image_projection.layers_units"))
        return len(_need(config, "projector.image_model.layers_units"))
    hf = {**LLAVA_HF_DEFAULTS, **config}
    found = _MLP.fullmatch(str(hf["mm_projector_type"]))
    if found is None:
        raise MappingError(
            f"mm_projector_type={hf['mm_projector_type']!r}: Model Zoo converts mlp<N>x_gelu only"
        )
    return int(found.group(1))


def _llava_to_hf(cs: Config, name: str) -> dict[str, Any]:
    """The LLaVA fields of ``text_model/config.json`` from the composite's CS config
    (llava.py lines 606-622, 718-805): the projector type, the image tower's width, the
    selected layer (a non-negative CS index counts HF's embedding output: +1), ``freeze``."""
    proj = _need(cs, "projector.image_model")
    acts = list(proj.get("layers_activation", []))
    if proj.get("name") != "FeedForwardNetwork" or acts != ["gelu"] * (len(acts) - 1) + [None]:
        raise MappingError(
            f"projector.image_model: LLaVA's is a FeedForwardNetwork of gelu layers, got {proj}"
        )
    layer = int(cs.get("image_feature_select_layer_idx", -2))
    return {
        **LLAVA_HF_FIXED,
        "mm_projector_type": f"mlp{len(acts)}x_gelu",
        "mm_hidden_size": _need(cs, "image_model.hidden_size"),
        "mm_vision_select_feature": cs.get("image_feature_select_mode", "patch"),
        "mm_vision_select_layer": layer if layer < 0 else layer + 1,
        "tune_mm_mlp_adapter": "^text_model" in cs.get("freeze", []),
    }


def _llava_to_cs(hf: Config, name: str) -> dict[str, Any]:
    """The composite's own CS fields from ``text_model/config.json`` (llava.py lines 492-539)."""
    if "mm_hidden_size" not in hf:  # Model Zoo assumes 64 (llava.py line 685)
        raise MappingError(
            "mm_hidden_size: text_model/config.json lacks LLaVA's fields (mm_hidden_size, "
            "mm_projector_type, ...): start from a LLaVA config.json (llava.py lines 351-367)"
        )
    hf = {**LLAVA_HF_DEFAULTS, **hf}
    count = _projector_layers(hf, TO_CS)
    layer = int(hf["mm_vision_select_layer"])
    if layer == 0:
        raise MappingError("mm_vision_select_layer=0 selects the embeddings (llava.py line 736)")
    for flag in ("mm_use_im_start_end", "mm_use_im_patch_token"):
        if hf.get(flag):
            raise MappingError(f"{flag}: Model Zoo converts only false (llava.py lines 655-664)")
    return {
        "image_feature_select_mode": hf["mm_vision_select_feature"],
        "projector": {
            "image_model": {
                "name": "FeedForwardNetwork",
                "input_unit": hf["mm_hidden_size"],
                "layers_units": [hf["hidden_size"]] * count,
                "layers_activation": ["gelu"] * (count - 1) + [None],
                "use_bias": True,
            }
        },
        "freeze": ["^image_model", *(["^text_model"] if hf["tune_mm_mlp_adapter"] else [])],
        "image_feature_select_layer_idx": layer if layer < 0 else layer - 1,
        **LLAVA_CS_DEFAULTS,
    }


def _mmsimple_to_hf(cs: Config, name: str) -> dict[str, Any]:
    """MM-Simple's CS config read as LLaVA's (mm_simple.py lines 365-403, CS -> HF), then
    LLaVA's rules."""
    images = _need(cs, "image_model_list")
    encoder = _need(images, "image_models.0.image_encoder")
    llava = {
        "projector": {"image_model": _need(images, "global_image_projection")},
        "image_model": encoder,
        "image_feature_select_mode": images.get("image_feature_select_mode", "patch"),
        "image_feature_select_layer_idx": encoder.get("image_layer_idx", -2),
        "freeze": cs.get("freeze", []),
    }
    return _llava_to_hf(llava, name)


def _mmsimple_to_cs(hf: Config, name: str) -> dict[str, Any]:
    """LLaVA's rules, then MM-Simple's layout (mm_simple.py lines 405-452, HF -> CS):
    the image encoder's selected layer, the selection mode and the projection move under
    ``image_model_list``; no ``image_start_idx``."""
    out = _llava_to_cs(hf, name)
    del out["image_start_idx"]
    layer = out.pop("image_feature_select_layer_idx")
    out["image_model_list"] = {
        "image_models": [{"image_encoder": {"image_layer_idx": layer}}],
        "image_feature_select_mode": out.pop("image_feature_select_mode"),
        "global_image_projection": out.pop("projector")["image_model"],
    }
    return out


def _projector_context(q: Query) -> Ctx:
    side = "CS" if q.to_hf else "HF"
    return Ctx(q.shapes, _projector_layers(q.config, q.direction), dims={"side": side})


RULES: dict[str, PartRules] = {
    "bert-model": PartRules(
        _bert_model_to_hf, _bert_model_to_cs, *plans(BERT_MODEL_TABLE, _bert_model_context)
    ),
    "clip-vision": PartRules(
        _clip_vision_to_hf, _clip_vision_to_cs, _clip_vision_to_hf_plan, _clip_vision_plan_to_cs
    ),
    "llava-projector": PartRules(
        _llava_to_hf, _llava_to_cs, *plans(PROJECTOR_TABLE, _projector_context)
    ),
    "mmsimple-projector": PartRules(
        _mmsimple_to_hf, _mmsimple_to_cs, *plans(PROJECTOR_TABLE, _projector_context)
    ),
}
