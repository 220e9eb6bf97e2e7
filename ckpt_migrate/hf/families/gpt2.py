"""GPT-2: Cerebras ``GPT2LMHeadModel`` <-> Hugging Face ``GPT2LMHeadModel`` / ``GPT2Model``.

Model Zoo: ``src/cerebras/modelzoo/tools/checkpoint_converters/gpt2_hf_cs.py`` at tag
Release_2.10.0 (``Converter_GPT2LMHeadModel_HF_CS21`` and ``Converter_GPT2Model_HF_CS21``, built
on the CS17 rules, lines 45-475 and 1035-1130; config rules ``ConfigConverter_GPT2Model_HF_CS17``
lines 477-660, refined by ``*_HF_CS18`` / ``*_HF_CS20`` / ``*_HF_CS21``, lines 668-1032).

The config rules are the record's table (``catalogue/gpt2_config.py``), run by
``hf/config_table.py``. muP: Model Zoo converts a muP GPT-2 to standard parametrisation on the
way to HF (``supports_mup_conversion``; ``mup.py``); so does ``export-hf``, before the rules run
(``hf/mup.py``), so a muP config reaching ``config_to_hf`` is refused naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.layouts import gpt2_like
from ckpt_migrate.hf.layouts.gpt2_like import hf_prefix
from ckpt_migrate.hf.mapping import (
    MappingError,
    Shape,
)
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)
ARCHITECTURES = catalogue.hf_architectures(__name__)
_NAME_OF = {cls: name for name, cls in ARCHITECTURES.items()}
_HEADLESS = _NAME_OF["GPT2Model"]
config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise MappingError(f"the gpt2 family does not serve model {name!r}")


# --------------------------------------------------------------------------- tensors

TABLE = gpt2_like.GPT2


def _layers(cfg: Mapping[str, Any], key: str) -> int:
    if not isinstance(cfg.get(key), int):
        raise MappingError(f"the config has no integer {key}")
    return int(cfg[key])


def _prefix(name: str) -> str:
    """GPT2LMHeadModel keeps the body under ``transformer.``; GPT2Model has no prefix."""
    return hf_prefix(name == _HEADLESS)


def _dims(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[int, ...]:
    try:
        return tuple(int(cfg[k]) for k in keys)
    except (KeyError, TypeError, ValueError):
        raise MappingError(f"the config needs integer {', '.join(keys)}") from None


def _check_shapes(have: Mapping[str, Shape], want: Mapping[str, Shape]) -> None:
    """A tensor whose shape contradicts the config (a wrong config, or another model)."""
    for key, shape in want.items():
        if key in have and tuple(have[key]) != shape:
            raise MappingError(f"{key} has shape {tuple(have[key])}, the config implies {shape}")


def _cs_shapes(cs_model: Mapping[str, Any], layers: int) -> dict[str, Shape]:
    v, h = _dims(cs_model, ("vocab_size", "hidden_size"))
    f = int(cs_model.get("filter_size") or 4 * h)
    out = {"embedding_layer.word_embeddings.weight": (v, h), "lm_head.weight": (v, h)}
    if cs_model.get("max_position_embeddings") is not None:
        p = int(cs_model["max_position_embeddings"])
        out["embedding_layer.position_embeddings.embed.weight"] = (p, h)
    for i in range(layers):
        pre = f"transformer_decoder.layers.{i}."
        for x in ("q", "k", "v", "output"):
            out[f"{pre}self_attn.proj_{x}_dense_layer.weight"] = (h, h)
            out[f"{pre}self_attn.proj_{x}_dense_layer.bias"] = (h,)
        for norm in ("norm1", "norm3"):
            out[f"{pre}{norm}.weight"] = out[f"{pre}{norm}.bias"] = (h,)
        out[f"{pre}ffn.ffn.0.linear_layer.weight"] = (f, h)
        out[f"{pre}ffn.ffn.0.linear_layer.bias"] = (f,)
        out[f"{pre}ffn.ffn.1.linear_layer.weight"] = (h, f)
        out[f"{pre}ffn.ffn.1.linear_layer.bias"] = (h,)
    out["transformer_decoder.norm.weight"] = out["transformer_decoder.norm.bias"] = (h,)
    return out


def _hf_shapes(hf_config: Mapping[str, Any], layers: int, pre: str) -> dict[str, Shape]:
    v, h, p = _dims(hf_config, ("vocab_size", "n_embd", "n_positions"))
    f = int(hf_config.get("n_inner") or 4 * h)
    out = {f"{pre}wte.weight": (v, h), f"{pre}wpe.weight": (p, h), "lm_head.weight": (v, h)}
    for i in range(layers):
        b = f"{pre}h.{i}."
        out |= {f"{b}attn.c_attn.weight": (h, 3 * h), f"{b}attn.c_attn.bias": (3 * h,)}
        out |= {f"{b}attn.c_proj.weight": (h, h), f"{b}attn.c_proj.bias": (h,)}
        out |= {f"{b}mlp.c_fc.weight": (h, f), f"{b}mlp.c_fc.bias": (f,)}
        out |= {f"{b}mlp.c_proj.weight": (f, h), f"{b}mlp.c_proj.bias": (h,)}
        for norm in ("ln_1", "ln_2"):
            out[f"{b}{norm}.weight"] = out[f"{b}{norm}.bias"] = (h,)
    out[f"{pre}ln_f.weight"] = out[f"{pre}ln_f.bias"] = (h,)
    return out


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """What the GPT-2 table (:data:`~ckpt_migrate.hf.layouts.gpt2_like.GPT2`) reads: the
    layers, the prefix, whether the head is tied and the model headless, the shape of a new
    head; MappingError when a tensor's shape contradicts the config."""
    _check_name(name)
    headless, pre = name == _HEADLESS, _prefix(name)
    if direction == TO_HF:
        layers = _layers(config, "num_hidden_layers")
        _check_shapes(shapes, _cs_shapes(config, layers))
        tied, dims = config.get("share_embedding_weights", True), {}
    else:
        layers = _layers(config, "n_layer")
        _check_shapes(shapes, _hf_shapes(config, layers, pre))
        tied = config.get("tie_word_embeddings", True)
        dims = {"head_shape": (int(config["vocab_size"]), int(config["n_embd"]))}
    flags = {"tied"} if tied else set()
    flags |= {"headless"} if headless else set()
    return Ctx(shapes, layers, pre, frozenset(flags), dims)


plan_to_hf, plan_to_cs = plans(TABLE, context)
