"""What the GPT-J, CodeGen, GPT-NeoX, Falcon and BLOOM families share (kept out of family
discovery by the leading underscore): config checks, the GPT-J backbone's CS defaults and the
(HF, CS) name pairs of their blocks. They are the rules Model Zoo's five converters
(``tools/checkpoint_converters/`` at Release_2.10.0) spell alike; each family module keeps its
own facts and cites its converter. Their tensor table is built by ``hf/layouts/gptj_like.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckpt_migrate.catalogue.gptj_config import GPTJ_CS_DEFAULTS as GPTJ_CS_DEFAULTS
from ckpt_migrate.catalogue.gptj_config import gptj_fixed as gptj_fixed
from ckpt_migrate.hf import mup
from ckpt_migrate.hf.config_gptj import check_scaling_type as check_scaling_type
from ckpt_migrate.hf.config_gptj import hf_rope as hf_rope
from ckpt_migrate.hf.config_gptj import rope_factor as rope_factor
from ckpt_migrate.hf.mapping import MappingError, Shape

Shapes = Mapping[str, Shape]  # tensor name -> shape
Config = Mapping[str, Any]
Pairs = Sequence[tuple[str, str]]  # (HF name, CS name)

EMBED = "embedding_layer.word_embeddings.weight"
HEAD = "lm_head.weight"
# HF GPT-J-style names (GPT-J, CodeGen) of the embeddings and the final norm. Model Zoo:
# gptj_hf_cs.py lines 86-101, salesforce_codegen_hf_cs.py lines 249-264.
GPTJ_STYLE_TOP: Pairs = (
    ("wte.weight", EMBED),
    ("ln_f.weight", "transformer_decoder.norm.weight"),
    ("ln_f.bias", "transformer_decoder.norm.bias"),
)


def params(modules: Pairs, kinds: Sequence[str] = ("weight", "bias")) -> list[tuple[str, str]]:
    """(HF, CS) names of each (HF, CS) module's parameters ``kinds``."""
    return [(f"{hf}.{kind}", f"{cs}.{kind}") for hf, cs in modules for kind in kinds]


def gptj_style_layer(*attention: tuple[str, str]) -> list[tuple[str, str]]:
    """(HF, CS) names inside a GPT-J-style block: the norm, the family's ``attention`` pairs,
    the MLP (Model Zoo: gptj_hf_cs.py lines 112-148, salesforce_codegen_hf_cs.py 275-303)."""
    mlp = [("mlp.fc_in", "ffn.ffn.0.linear_layer"), ("mlp.fc_out", "ffn.ffn.1.linear_layer")]
    return [*params([("ln_1", "norm1")]), *attention, *params(mlp)]


def megatron_layer(dense: str, norms: Pairs, bias: bool = True) -> list[tuple[str, str]]:
    """(HF, CS) names inside a block of GPT-NeoX, Falcon, BLOOM: the ``norms``, the attention's
    output ``dense`` and the MLP, whose biases only with ``bias``."""
    linear = [
        (dense, "self_attn.proj_output_dense_layer"),
        ("mlp.dense_h_to_4h", "ffn.ffn.0.linear_layer"),
        ("mlp.dense_4h_to_h", "ffn.ffn.1.linear_layer"),
    ]
    return params(norms) + params(linear, ("weight", "bias")[: 1 + bias])


def check_name(name: str, names: Sequence[str]) -> None:
    """Refuse a model name the family does not serve."""
    if name not in names:
        raise MappingError(f"{name}: this family serves {', '.join(names)}")


def get(cfg: Config, key: str, defaults: Config) -> Any:
    """``cfg[key]``, else its default (None without one)."""
    return cfg[key] if key in cfg else defaults.get(key)


def hf_with_defaults(hf_config: Config, defaults: Config, model_type: str) -> dict[str, Any]:
    """The HF config over the family's defaults, refused unless its ``model_type`` (if given)
    is the family's."""
    hf = {**defaults, **hf_config}
    if hf.get("model_type", model_type) != model_type:
        raise MappingError(f"model_type: expected {model_type!r}, got {hf['model_type']!r}")
    return hf


def hf_header(architectures: Mapping[str, str], name: str, model_type: str) -> dict[str, Any]:
    """The first two ``config.json`` fields: the transformers class of ``name``, the type."""
    return {"architectures": [architectures[name]], "model_type": model_type}


def check_cs(
    cs: Config,
    label: str,
    fixed: Config,
    defaults: Config,
    *,
    name: str,
    required: Sequence[str] = (),
) -> None:
    """Reject CS settings HF ``label`` cannot express, naming the field: muP (``hf/mup.py``;
    the export folds it first where it can), a ``required`` field missing, then a field of
    ``fixed`` whose value (or default) is not the one HF can express (the family cites Model
    Zoo's rules). ``name``: the model name (which muP fields it has)."""
    mup.refuse(cs, name)
    require(cs, required, label)
    for key, value in fixed.items():
        got = get(cs, key, defaults)
        if got != value:
            raise MappingError(f"{key}: HF {label} needs {value!r}, got {got!r}")


def require(cs: Config, keys: Sequence[str], label: str) -> None:
    """Fields a CS config must give (no default on either side)."""
    for key in keys:
        if key not in cs:
            raise MappingError(f"{key}: a CS {label} config must give it")
