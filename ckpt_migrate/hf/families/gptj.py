"""GPT-J: Hugging Face ``GPTJForCausalLM`` / ``GPTJModel`` <-> Cerebras GPT-J (``gptj``).

Model Zoo's reference is ``tools/checkpoint_converters/gptj_hf_cs.py`` at Release_2.10.0
(``Converter_GPTJ_Headless_HF_CS17`` lines 82-156, ``Converter_GPTJ_LMHeadModel_HF_CS17``
lines 302-317, ``ConfigConverter_GPTJModel_HF_CS17`` lines 391-621; the CS20/CS23 classes
lines 712-826 serve 2.0 to 2.9 unchanged, with ``norm_type: layernorm`` asserted). Every tensor
is a rename: HF GPT-J rotates every two channels exactly like CS rotary, so no permutation.

The final norm has two CS names, ``ln_f`` and ``transformer_decoder.norm`` (one module,
``models/nlp/gptj/gptj_model.py`` lines 535-538), both written by Model Zoo (``replace_final_norm``,
gptj_hf_cs.py lines 94-101 and 158-172); its ``lm_head`` rule (lines 305-309) renames only a head
the HF file has. ``_decoder_common`` says how both are carried each way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.gptj_config import GPTJ_CS_DEFAULTS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.families import _decoder_common as dc
from ckpt_migrate.hf.layouts.gptj_like import cs_config, decoder_context, decoder_table
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)

CS_DEFAULTS = GPTJ_CS_DEFAULTS  # what the tensor context reads the CS config over
# (HF name inside a block ``h.N.``, CS name inside ``transformer_decoder.layers.N.``).
# Model Zoo: gptj_hf_cs.py lines 39-71 (attention) and 112-148 (norm, ffn: GPT-J-style names).
LAYER_PAIRS = dc.gptj_style_layer(
    *((f"attn.{p}_proj.weight", f"self_attn.proj_{p}_dense_layer.weight") for p in "qkv"),
    ("attn.out_proj.weight", "self_attn.proj_output_dense_layer.weight"),
)
# Model Zoo: gptj_hf_cs.py lines 86-101 (embeddings, final norm).
TOP_PAIRS = dc.GPTJ_STYLE_TOP


config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs


TABLE = decoder_table(TOP_PAIRS, LAYER_PAIRS)


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: gptj_hf_cs.py lines 82-156 and 302-338, renames (of whichever copy of the
    embeddings and the final norm exists), the final norm under both names (lines 158-172);
    a headless model gets a new head (lines 212-230): the embeddings when tied, else N(0, 0.02)
    (lines 222-226), and a zero bias; a head bias CS lacks (``use_bias_in_output: false``) is
    written as the zeros HF would initialise it to."""
    cfg = cs_config(direction, config, name, config_to_cs, config_to_hf, CS_DEFAULTS)
    return decoder_context(shapes, cfg, name, "transformer.", bias=True)


plan_to_hf, plan_to_cs = plans(TABLE, context)
