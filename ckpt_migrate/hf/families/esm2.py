"""ESM-2: Cerebras ``Esm2PretrainModel`` (a ``BertPretrainModel`` with a pre-LN encoder, a final
encoder norm and no NSP head) <-> Hugging Face ``EsmForMaskedLM``.

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:
``esm2.py`` (encoder ``Converter_Esm2Model_WithoutOptionalModel_HF_CS21`` lines 39-250, head
``Converter_Esm2PretrainModel_WithoutOptionalModel_HF_CS21`` lines 253-348, config
``ConfigConverter_Esm2_HF_CS21`` lines 358-604), built on the BERT rules of ``bert.py`` it
inherits (``Converter_BertModel_CS16_CS17`` lines 78-243, the 2.1 ``position_embeddings.embed``
rename lines 1238-1254, ``ConfigConverter_Bert_HF_CS17`` / ``_CS21`` lines 807-955 and
1223-1228). ``registry.py`` line 232 names the model ``esm-2``.

Data changes: with rotary positions the query and key rows are permuted per head (CS
interleaves the rotary pairs, HF keeps them as two halves; esm2.py lines 127-215, the same
permutation as LLaMA's, :func:`~ckpt_migrate.hf.ops.interleave_rotary`). Everything else is a
rename. The tensor table is ``hf/layouts/bert_like.py``'s ``ESM2``.

HF tensors with no CS counterpart: the contact-prediction head (``esm.contact_head.regression``,
dropped by Model Zoo too, esm2.py lines 316-320; an export leaves it out and transformers
initialises it anew) and the rotary ``inv_freq`` buffer (esm2.py lines 81-88), which
transformers recomputes from the config. ``save_pretrained`` of transformers 5 writes the
encoder layer norms as ``LayerNorm.gamma`` / ``.beta`` and the buffer under the literal name
``esm.encoder.layer.*.attention.self.rotary_embeddings.inv_freq`` (the reverse of its ESM load
renames); an import reads both spellings (as Model Zoo's ``Converter_BertLayerNorm_HF_CS``,
bert.py lines 39-67), an export writes the state-dict names (``.weight`` / ``.bias``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue.bert_config import ESM2_CS_DEFAULTS, ESM2_HF_DEFAULTS
from ckpt_migrate.hf import config_table
from ckpt_migrate.hf.encoders import (
    check_name,
    layers_of,
    with_defaults,
)
from ckpt_migrate.hf.layouts import bert_like
from ckpt_migrate.hf.mapping import Shape
from ckpt_migrate.hf.ops import Ctx
from ckpt_migrate.hf.table import TO_HF, plans
from ckpt_migrate.hf.unconverted import cs_dropped as cs_dropped
from ckpt_migrate.hf.unconverted import cs_ties as cs_ties
from ckpt_migrate.hf.unconverted import hf_dropped as hf_dropped

NAMES: tuple[str, ...] = catalogue.hf_names(__name__)
HF_MODEL_TYPES: tuple[str, ...] = catalogue.hf_model_types(__name__)


CS_DEFAULTS, HF_DEFAULTS = ESM2_CS_DEFAULTS, ESM2_HF_DEFAULTS  # what the context reads
config_to_hf, config_to_cs = config_table.to_hf, config_table.to_cs


# ----------------------------------------------------------------------------- tensors

TABLE = bert_like.ESM2


def context(
    direction: str, shapes: Mapping[str, Shape], config: Mapping[str, Any], name: str
) -> Ctx:
    """Model Zoo: Converter_Esm2PretrainModel_HF_CS21 either way: the layers, rotary positions
    (query and key rows permuted per head) or learned ones, the embedding norm
    (``embedding_layer_norm``/``emb_layer_norm_before``), the word embeddings tied to the MLM
    decoder (``share_embedding_weights``/``tie_word_embeddings``)."""
    check_name(name, NAMES)
    to_hf = direction == TO_HF
    cfg = with_defaults(config, CS_DEFAULTS if to_hf else HF_DEFAULTS)
    layers = layers_of(cfg, "num_hidden_layers", 12)
    rotary = cfg["position_embedding_type"] == "rotary"
    heads = int(cfg["num_heads" if to_hf else "num_attention_heads"]) if rotary else 0
    norm = bool(cfg["embedding_layer_norm" if to_hf else "emb_layer_norm_before"])
    tied = cfg["share_embedding_weights" if to_hf else "tie_word_embeddings"]
    flags = {f for f, on in (("rotary", rotary), ("norm", norm), ("tied", tied)) if on}
    dims = {"heads": heads, "side": "CS" if to_hf else "HF"}
    return Ctx(shapes, layers, "esm.", frozenset(flags), dims, cs_prefix="bert_encoder.")


plan_to_hf, plan_to_cs = plans(TABLE, context)
