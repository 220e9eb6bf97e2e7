"""T5 (and the models Model Zoo converts with the T5 rules: ``transformer``, ``ul2``,
``flan-ul2``): Cerebras ``T5ForConditionalGeneration`` <-> Hugging Face
``T5ForConditionalGeneration``.

Model Zoo, tag Release_2.10.0: ``src/cerebras/modelzoo/tools/checkpoint_converters/t5.py``
(layer rules ``Converter_T5_CS16_CS17`` lines 40-380, HF specifics ``Converter_T5_HF_CS17``
lines 612-697, tying ``Converter_T5_CS18_CS20`` lines 1064-1178, the 2.1 relative-bias rename
``Converter_T5_CS20_CS21`` lines 1248-1302 and ``Converter_T5_WithoutOptionalModel_HF_CS21``
lines 1341-1408, config rules ``ConfigConverter_T5_HF_CS17`` / ``_CS18`` / ``_CS20`` lines
813-1057 and 1223-1235). ``registry.py`` lines 307-321 map ``ul2``, ``flan-ul2`` and
``transformer`` to the T5 converters.

Every tensor is renamed; Model Zoo changes no data. In particular the tied lm_head is not
rescaled: both CS (``models/nlp/t5/t5_model.py`` lines 1038-1041) and HF multiply the decoder
output by ``d_model**-0.5`` when the embeddings are shared, and neither does when not.

``transformer`` converts only when its config is T5's (relative positions, RMSNorm, no biases):
Model Zoo asserts that (lines 879-920, 1226-1235) and HF T5 has no sinusoidal or learned
absolute positions; other configs are refused naming the field.

muP: Model Zoo's ``*_HF_CS23`` converters (lines 1433-1494, ``mup.py`` lines 149-191 and
586-700) rescale a muP T5 to standard parametrisation on export; so does ``export-hf`` before
these rules run (``hf/mup.py``), so a muP config reaching them is refused naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.t5_config import T5_CS_DEFAULTS, T5_HF_DEFAULTS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.config_t5 import hf_scales_tied, nonlinearity_to_hf
from ckpt_migrate.hf.encoders import (
    check_name,
    layers_of,
    with_defaults,
)
from ckpt_migrate.hf.layouts import t5 as t5_layout
from ckpt_migrate.hf.mapping import MappingError, Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)

CS_DEFAULTS, HF_DEFAULTS = T5_CS_DEFAULTS, T5_HF_DEFAULTS  # what the context reads
config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs


# ----------------------------------------------------------------------------- tensors

TABLE = t5_layout.T5


def _refuse_positions(cs: Mapping[str, Shape]) -> None:
    """Learned or sinusoidal absolute positions (the ``transformer`` model) have no HF T5 home
    (t5.py lines 707-728)."""
    for name in cs:
        if re.fullmatch(r"(?:encoder|decoder)_embeddings\.position_embeddings\..*", name):
            raise MappingError(f"{name}: position_embedding_type absolute has no HF T5 equivalent")


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: Converter_T5_HF_CS21 (t5.py lines 1341-1408, 1485-1489) either way: the
    encoder and decoder layer counts, gated feed-forward layers, the lm_head shared with the
    embeddings (``share_embedding_weights``; on import :func:`hf_scales_tied`)."""
    check_name(name, NAMES)
    if direction == TO_HF:
        _refuse_positions(shapes)
        cfg = with_defaults(config, CS_DEFAULTS)
        keys = ("encoder_num_hidden_layers", "decoder_num_hidden_layers")
    else:
        cfg = with_defaults(config, HF_DEFAULTS)
        keys = ("num_layers", "num_decoder_layers")
    enc = layers_of(cfg, keys[0], 6)
    dec = enc if cfg.get(keys[1]) is None else layers_of(cfg, keys[1], enc)
    if direction == TO_HF:
        gated = nonlinearity_to_hf(cfg).startswith("gated-")
        tied = cfg["share_embedding_weights"]
    else:
        gated, tied = str(cfg["feed_forward_proj"]).startswith("gated-"), hf_scales_tied(cfg)
    flags = {f for f, on in (("gated", gated), ("tied", tied)) if on}
    dims = {"encoder": enc, "decoder": dec, "side": "CS" if direction == TO_HF else "HF"}
    return Ctx(shapes, 0, "", frozenset(flags), dims)


plan_to_hf, plan_to_cs = plans(TABLE, context)
