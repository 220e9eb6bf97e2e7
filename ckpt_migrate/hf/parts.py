"""The tensor rules of the models a multi-directory composite holds that are no Model Zoo name
of their own: each is an existing family's table, less what the part lacks; their config tables
are ``catalogue/parts_config.py``'s (run by ``hf/config_table.py``). A catalogue ``Part`` names
them (``Part.name``) as it names a Model Zoo family.

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:
``bert-model`` is ``dragon_plus.py`` lines 47-111 (a ``BertModel``: BERT's renames with no
``bert.``/``bert_encoder.`` prefix, the pooler dropped both ways, lines 85-91 and 117-120);
``clip-vision`` ``llava.py`` lines 48-78 (CLIP-ViT's table without ``visual_projection``);
the projectors ``llava.py`` lines 135-191 (HF ``model.mm_projector.{2i}`` <-> CS
``ffn.{i}.linear_layer``: LLaVA's linears are the even ``nn.Sequential`` slots), under
MM-Simple LLaVA's prefix too (``mm_simple.py`` lines 288-452).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.config_parts import projector_layers
from ckpt_migrate.hf.encoders import layers_of
from ckpt_migrate.hf.layouts import bert_like, vit
from ckpt_migrate.hf.mapping import MappingError, Out, Shape, rename
from ckpt_migrate.hf.ops import Ctx, Op
from ckpt_migrate.hf.table import TO_CS, TO_HF, Group, Query, Table, pair, plans, row

Config = Mapping[str, Any]


@dataclass(frozen=True)
class PartRules:
    """A part's rules: the contract of ``hf/mapping.py`` (``Family``)."""

    config_to_hf: Callable[[Config, str], dict[str, Any]]
    config_to_cs: Callable[[Config, str], dict[str, Any]]
    plan_to_hf: Callable[[Mapping[str, Shape], Config, str], list[Out]]
    plan_to_cs: Callable[[Mapping[str, Shape], Config, str], list[Out]]


# ------------------------------------------------------------------ bert-model (Dragon+)


BERT_MODEL_TABLE = Table(
    groups={
        "encoder": bert_like.ENCODER,
        "layers": bert_like.encoder_layers(("attention.output.LayerNorm", "output.LayerNorm")),
        "words": Group((row(*bert_like.WORD),)),
    },
    order=dict.fromkeys((TO_HF, TO_CS), ("encoder", "layers", "words")),
    check=bert_like.inputs_on_side,
)


def _layers_context(q: Query, flags: frozenset[str] = frozenset()) -> Ctx:
    """The layers of an encoder part (on import, once its config table accepted the config)
    and ``flags``."""
    cfg = q.config if q.to_hf else config_table.to_cs(q.config, q.name)
    layers = layers_of(cfg, "num_hidden_layers", 12)
    return Ctx(q.shapes, layers, "", flags, {"side": "CS" if q.to_hf else "HF"})


# --------------------------------------------------------------- clip-vision (LLaVA tower)


CLIP_VISION_TABLE = Table(
    groups={
        **vit.CLIP.groups,
        "tail": Group(vit.CLIP.groups["tail"].rows[:1]),  # post_layernorm, no projection
    },
    order=vit.CLIP.order,
    check=vit.CLIP.check,
)


_clip_vision_to_hf_plan, _clip_vision_to_cs_plan = plans(CLIP_VISION_TABLE, _layers_context)
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


def _projector_context(q: Query) -> Ctx:
    side = "CS" if q.to_hf else "HF"
    return Ctx(q.shapes, projector_layers(q.config, q.to_hf), dims={"side": side})


_CONFIG = (config_table.to_hf, config_table.to_cs)  # each part's table (catalogue/parts_config)
RULES: dict[str, PartRules] = {
    "bert-model": PartRules(
        *_CONFIG, *plans(BERT_MODEL_TABLE, partial(_layers_context, flags=frozenset({"segments"})))
    ),
    "clip-vision": PartRules(*_CONFIG, _clip_vision_to_hf_plan, _clip_vision_plan_to_cs),
    "llava-projector": PartRules(*_CONFIG, *plans(PROJECTOR_TABLE, _projector_context)),
    "mmsimple-projector": PartRules(*_CONFIG, *plans(PROJECTOR_TABLE, _projector_context)),
}
