"""muP, declared once per CS layout: which model config fields are muP's, the values at which
they change nothing (the model then computes its standard-parametrisation function), and which
CS tensors each muP multiplier folds into. ``hf/mup.py`` runs the fold (muP -> sP) on export
for the records whose ``Hf.mup`` is a declaration with multipliers; any other muP config is
refused naming the field (a record without ``Hf.mup`` is checked against its layout's fields).

Sources, Model Zoo tag Release_2.10.0, ``src/cerebras/modelzoo/``:

- the fold Model Zoo's HF export runs: ``tools/checkpoint_converters/mup.py`` lines 457-583
  (``Converter_sP_muP_post_CS23``: k projection, lm_head, word/position embeddings or the
  embedding norm), 328-455 (the 2.2 spelling ``output_logits_scale``), 861-884 (``_is_mup``);
- the decoder forward the fold must reproduce: ``models/nlp/gpt2/gpt2_model.py`` lines 750-790
  (``output_logits_scale`` from ``mup_base_hidden_size``, ``output_logits_alpha``,
  ``scale_output_logits_by_d``), 1085-1093 (the embedding output, after the embedding norm,
  times ``embeddings_scale``), 1186-1193 (the logits, bias included, times
  ``output_logits_scale``); ``layers/AttentionLayer.py`` lines 354-361 (k times ``d**-0.5`` when
  ``scale_qk_dot_by_d``) and 646 (the QK logits times ``attention_logits_alpha``);
  ``models/nlp/gpt2/model.py`` lines 161-171 (``scale_qk_dot_by_d`` unset: on for a muP model);
  ``models/nlp/gptj/gptj_model.py`` line 235 (GPT-J's default: off) and 440-462;
- the fields each model takes: ``gpt2_model.py`` lines 319-362 and 423, ``bert_model.py`` lines
  226-255, ``t5_model.py`` lines 205-257.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class MupField:
    """A model config field of muP and the values at which it is neutral."""

    name: str
    neutral: tuple[Any, ...]


@dataclass(frozen=True)
class Multiplier:
    """A scalar the muP forward applies, and the CS tensors (full-match regexes on the bare CS
    name) it folds into: multiplying them by it gives the same function without it."""

    name: str
    tensors: tuple[str, ...]


@dataclass(frozen=True)
class Mup:
    """The muP of a CS layout: its fields, and its multipliers when the export folds them
    (``()``: it cannot, a muP config is refused naming the field)."""

    layout: str
    fields: tuple[MupField, ...]
    multipliers: tuple[Multiplier, ...] = ()
    qk_by_d_unset: bool | None = None  # scale_qk_dot_by_d absent: None = on exactly under muP
    formulas: str = "decoder"  # whose forward: "decoder" (GPT-2, BERT) or "encoder-decoder" (T5)
    # the CS model rescales a tied head's input by d_model**-0.5 only without an output
    # multiplier, HF whenever tied (T5): under muP the export unties the head
    head_rescaled_when_tied: bool = False

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.fields)


_ONE = (None, 1, 1.0)

DECODER_MUP = Mup(
    "decoder",
    fields=(
        MupField("mup_base_hidden_size", (None,)),
        MupField("mup_base_filter_size", (None,)),  # initialisation and learning rates only
        MupField("embeddings_scale", _ONE),
        MupField("scale_qk_dot_by_d", (None, False)),
        MupField("attention_logits_alpha", _ONE),
        MupField("output_logits_alpha", _ONE),
        MupField("scale_output_logits_by_d", (None, True, False)),  # acts through the base only
        MupField("output_logits_scale", _ONE),  # 2.2's spelling of the logits' multiplier
    ),
    multipliers=(
        Multiplier(
            "embeddings",
            (
                r"embedding_layer\.word_embeddings\.weight",
                r"embedding_layer\.position_embeddings(?:\.embed)?\.weight",
            ),
        ),
        # with an embedding norm, the scale follows the norm (gpt2_model.py lines 1088-1092)
        Multiplier("embedding_norm", (r"embedding_ln_f\.(?:weight|bias)",)),
        Multiplier("attention_logits", (r".+\.self_attn\.proj_k_dense_layer\.(?:weight|bias)",)),
        Multiplier("output_logits", (r"lm_head\.(?:weight|bias)",)),
    ),
)

# GPT-J's CS model (GPT-J, and GPT-NeoX's converter target) leaves scale_qk_dot_by_d off unset.
GPTJ_MUP = replace(DECODER_MUP, qk_by_d_unset=False)

# BERT (``models/nlp/bert/bert_model.py`` lines 226-255, 340-372, 600-612;
# ``bert_pretrain_models.py`` lines 117-128, 255-273): the summed word, position and segment
# embeddings times ``embeddings_scale`` *before* the embedding norm, so the scale folds into the
# three tables; the MLM and NSP logits (biases included) times the output multiplier. Model Zoo's
# mup.py rules ``mlm_head.weight`` / ``cls_head.weight`` (lines 476-483) match none of BERT's CS
# names (``bert_mlm_head.classifier...``), so its export leaves both heads unscaled.
_BERT = r"(?:bert_encoder|bert)\.embedding_layer\."
BERT_MUP = Mup(
    "bert-encoder",
    fields=(
        MupField("mup_base_hidden_size", (None,)),
        MupField("mup_base_filter_size", (None,)),
        MupField("embeddings_scale", _ONE),
        MupField("attention_logits_alpha", _ONE),
        MupField("scale_qk_dot_by_d", (None, False)),
        MupField("output_logits_alpha", _ONE),
        MupField("scale_output_logits_by_d", (None, True, False)),
    ),
    multipliers=(
        Multiplier(
            "embeddings",
            (
                _BERT + r"(?:word|segment)_embeddings\.weight",
                _BERT + r"position_embeddings(?:\.embed)?\.weight",
            ),
        ),
        Multiplier("attention_logits", (r".+\.self_attn\.proj_k_dense_layer\.(?:weight|bias)",)),
        Multiplier(
            "output_logits",
            (r"bert_(?:mlm|cls)_head\.classifier\.ffn\.0\.linear_layer\.(?:weight|bias)",),
        ),
    ),
)

# T5 (``models/nlp/t5/t5_model.py`` lines 514-600, 696-716, 830-845, 1038-1058; ``model.py``
# lines 111-135; ``layers/AttentionLayer.py`` lines 520-560 and 903): the shared embeddings times
# ``embeddings_alpha`` (and ``d_model**0.5`` under muP); q, k, v times ``(d_model /
# mup_base_d_model)**-0.5`` and the attention output times its inverse unless ``mup_base_d_kv``;
# q over ``sqrt(d_kv)`` (scaled dot product under muP), k too with ``scale_*_qk_dot_by_d``; the
# logits times the encoder's or decoder's ``attention_logits_alpha`` before the relative position
# bias is added (line 443); the LM logits times ``output_logits_alpha / width`` (square root of
# the width without ``scale_output_logits_by_d``, T5's default).
_T5_ATTN = r"(?:encoder|decoder)\.layers\.\d+\.(?:self_attn|multihead_attn)\.proj_"
_T5_K = r"\.proj_k_dense_layer\.(?:weight|bias)"
T5_MUP = Mup(
    "encoder-decoder",
    fields=(
        MupField("mup_base_d_model", (None,)),
        MupField("mup_base_d_ff", (None,)),
        MupField("mup_base_d_kv", (None,)),
        MupField("embeddings_alpha", _ONE),
        MupField("encoder_attention_logits_alpha", _ONE),
        MupField("decoder_attention_logits_alpha", _ONE),
        MupField("scale_encoder_qk_dot_by_d", (None, False)),
        MupField("scale_decoder_qk_dot_by_d", (None, False)),
        MupField("output_logits_alpha", _ONE),
        MupField("scale_output_logits_by_d", (None, True, False)),
    ),
    multipliers=(
        Multiplier("embeddings", (r"(?:encoder|decoder)_embeddings\.word_embeddings\.weight",)),
        Multiplier("q", (_T5_ATTN + r"q_dense_layer\.(?:weight|bias)",)),
        Multiplier("encoder_k", (r"encoder\.layers\.\d+\.self_attn" + _T5_K,)),
        Multiplier("decoder_k", (r"decoder\.layers\.\d+\.(?:self_attn|multihead_attn)" + _T5_K,)),
        Multiplier("v", (_T5_ATTN + r"v_dense_layer\.(?:weight|bias)",)),
        Multiplier("attention_output", (_T5_ATTN + r"output_dense_layer\.(?:weight|bias)",)),
        Multiplier("output_logits", (r"lm_head\.(?:weight|bias)",)),
    ),
    formulas="encoder-decoder",
    head_rescaled_when_tied=True,
)

# What a record without its own ``Hf.mup`` is checked against: its layout's fields, no fold.
BY_LAYOUT = {m.layout: replace(m, multipliers=()) for m in (DECODER_MUP, BERT_MUP, T5_MUP)}
