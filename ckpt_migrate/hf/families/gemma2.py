"""Gemma 2: HF ``Gemma2ForCausalLM`` <-> CS ``GPT2LMHeadModel`` configured as Gemma 2 (sandwich
RMS norms, GeGLU, rotary, logit soft-capping, sliding window every other layer).

Model Zoo (tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``):
``gemma2.py`` (``Converter_Gemma2_WithoutOptionalModel_HF_CS23`` lines 41-215, the config rules
``ConfigConverter_Gemma2_HF_CS23`` lines 218-781, ``Converter_Gemma2ForCausalLM_HF_CS23`` lines
784-795). The attention is LLaMA's (``Converter_LlamaAttention_HF_CS``, llama.py lines 38-302:
Q and K rows interleaved for rotary, here :mod:`.llama`'s helpers). Every HF RMS norm computes
``x * (1 + w)``; Model Zoo folds the 1 into the CS weight (gemma2.py lines 163-190), so norms are
the one place a Gemma 2 tensor's data changes: ``w + 1`` on import, ``w - 1`` on export, in the
tensor's own dtype as torch computes it. A float weight whose ``w + 1`` rounds (|w| small
against 1) does not come back bit for bit; transformers initialises the norms to 0, which does.

Not mirrored: Model Zoo (and so this mapping) maps HF's default ``layer_types`` (sliding window
on layers 0, 2, ...) to ``sliding_window_every_other_decoder_layer: true``, which CS up to 2.9
and 2.10's default ``full_attention_first`` apply to layers 1, 3, ... (layers/TransformerDecoder.py
lines 166-169 at Release_2.7.1, lines 174-186 at Release_2.10.0): weights are unaffected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.config import CS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.config_llama import kv_heads_cs
from ckpt_migrate.hf.layouts import llama_like
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.ops import shift as shift
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)

# The config rules are the record's table (``catalogue/gemma2_config.py``), run by
# ``config_table`` (another name is refused); its operations are in ``hf/config_gemma2.py``.
config_to_hf, config_to_cs = config_table.serving(NAMES, "Gemma 2")


# --------------------------------------------------------------------------- tensors


TABLE = llama_like.GEMMA2


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """The heads and key/value heads (rotary rows permuted per head), attention biases, a tied
    head (``share_embedding_weights`` of the CS config the table accepted, or of the one
    :func:`config_to_cs` gives). On export a tied head is not written (nor read:
    :func:`cs_ties`), ``ln_f`` is not read (gemma2.py line 160); on import the final norm is
    written as both ``transformer_decoder.norm`` and ``ln_f`` (gemma2.py lines 185-190), and a
    tied head absent from the HF files is written from the embeddings (ours: the CS model's
    state dict has it and CS loads strictly; Model Zoo's rule, line 154, only copies an
    ``lm_head`` the files have)."""
    if direction == TO_HF:
        cfg = config_table.source(CS, config, name)
        bias = bool(cfg["use_projection_bias_in_attention"])
        kv = kv_heads_cs(cfg, "Gemma 2")
    else:
        cfg = config_to_cs(config, name)
        kv = cfg.get("extra_attention_params", {}).get("num_kv_groups", cfg["num_heads"])
        bias = cfg["use_projection_bias_in_attention"]
    flags = ({"tied"} if cfg["share_embedding_weights"] else set()) | ({"bias"} if bias else set())
    dims = {"heads": cfg["num_heads"], "kv": kv}
    return Ctx(shapes, cfg["num_hidden_layers"], "model.", frozenset(flags), dims)


plan_to_hf, plan_to_cs = plans(TABLE, context)
