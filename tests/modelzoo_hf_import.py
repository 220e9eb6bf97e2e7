"""The CS model state Model Zoo 2.10's own HF → CS import writes from a ``save_pretrained``
directory, for BERT pre-training and T5: its key rules transcribed as regex renames, applied to
the HF tensors. Independent of ckpt-migrate's rules (tests compare the two where they agree).

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:

* BERT (``Converter_BertPretrainModel_HF_CS21``): encoder rules ``bert.py`` lines 82-242, the
  2.1 ``position_embeddings.embed`` rename lines 1241-1254, heads lines 549-599. The MLM bias is
  dropped: ``cls.predictions.bias`` is matched with ``exists="left"`` (line 589) and
  ``cls.predictions.decoder.{weight,bias}``, the names the CS head is written from (lines
  569-588), are ties ``save_pretrained`` leaves out.
* T5 (``Converter_T5_HF_CS21``): block rules ``t5.py`` lines 73-370, the HF specifics lines
  612-644 (``shared.weight`` dropped, ``exists="left"``, line 628; ``embed_tokens`` read, which
  ``save_pretrained`` leaves out as ties of ``shared``), the 2.1 relative-bias rename lines
  1275-1298.
"""

from __future__ import annotations

import re

import numpy as np

DROPPED = object()

_BERT_LAYER = {
    "attention.self.query": "self_attn.proj_q_dense_layer",
    "attention.self.key": "self_attn.proj_k_dense_layer",
    "attention.self.value": "self_attn.proj_v_dense_layer",
    "attention.output.dense": "self_attn.proj_output_dense_layer",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ffn.ffn.0.linear_layer",
    "output.dense": "ffn.ffn.1.linear_layer",
    "output.LayerNorm": "norm2",
}
BERT_RULES: list[tuple[str, object]] = [
    (
        r"bert\.embeddings\.word_embeddings\.weight",
        "bert_encoder.embedding_layer.word_embeddings.weight",
    ),
    (
        r"bert\.embeddings\.position_embeddings\.weight",
        "bert_encoder.embedding_layer.position_embeddings.embed.weight",
    ),
    (
        r"bert\.embeddings\.token_type_embeddings\.weight",
        "bert_encoder.embedding_layer.segment_embeddings.weight",
    ),
    (r"bert\.embeddings\.LayerNorm\.(weight|bias)", r"bert_encoder.embed_ln_f.\1"),
    *(
        (
            rf"bert\.encoder\.layer\.(\d+)\.{re.escape(hf)}\.(weight|bias)",
            rf"bert_encoder.transformer_encoder.layers.\1.{cs}.\2",
        )
        for hf, cs in _BERT_LAYER.items()
    ),
    (r"bert\.pooler\.dense\.(weight|bias)", r"bert_encoder.pooler.pooler.ffn.0.linear_layer.\1"),
    (
        r"cls\.predictions\.transform\.dense\.(weight|bias)",
        r"bert_mlm_head.mlm_transform.ffn.ffn.0.linear_layer.\1",
    ),
    (
        r"cls\.predictions\.transform\.LayerNorm\.(weight|bias)",
        r"bert_mlm_head.mlm_transform.ln.\1",
    ),
    (
        r"cls\.predictions\.decoder\.(weight|bias)",
        r"bert_mlm_head.classifier.ffn.0.linear_layer.\1",
    ),
    (r"cls\.predictions\.bias", DROPPED),  # line 589
    (
        r"cls\.seq_relationship\.(weight|bias)",
        r"bert_cls_head.classifier.ffn.0.linear_layer.\1",
    ),
]

_T5_ATTN = {"q": "proj_q_dense_layer", "k": "proj_k_dense_layer", "v": "proj_v_dense_layer"}
_T5_ATTN["o"] = "proj_output_dense_layer"
T5_RULES: list[tuple[str, object]] = [
    (r"shared\.weight", DROPPED),  # line 628
    (r"(encoder|decoder)\.embed_tokens\.weight", r"\1_embeddings.word_embeddings.weight"),
    (
        r"(encoder|decoder)\.block\.0\.layer\.0\.SelfAttention\.relative_attention_bias\.weight",
        r"\1_embeddings.position_embed_helper.relative_attention_bias.weight",
    ),
    *(
        (
            rf"(encoder|decoder)\.block\.(\d+)\.layer\.0\.SelfAttention\.{hf}\.weight",
            rf"\1.layers.\2.self_attn.{cs}.weight",
        )
        for hf, cs in _T5_ATTN.items()
    ),
    *(
        (
            rf"decoder\.block\.(\d+)\.layer\.1\.EncDecAttention\.{hf}\.weight",
            rf"decoder.layers.\1.multihead_attn.{cs}.weight",
        )
        for hf, cs in _T5_ATTN.items()
    ),
    *(
        (
            rf"(encoder|decoder)\.block\.(\d+)\.layer\.{i}\.layer_norm\.weight",
            rf"\1.layers.\2.norm{i + 1}.weight",
        )
        for i in range(3)
    ),
    (
        r"(encoder|decoder)\.block\.(\d+)\.layer\.[12]\.DenseReluDense\.wi\.weight",
        r"\1.layers.\2.ffn.ffn.0.linear_layer.weight",
    ),
    (
        r"(encoder|decoder)\.block\.(\d+)\.layer\.[12]\.DenseReluDense\.wo\.weight",
        r"\1.layers.\2.ffn.ffn.1.linear_layer.weight",
    ),
    (r"(encoder|decoder)\.final_layer_norm\.weight", r"\1.norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),
]


def modelzoo_cs(
    hf: dict[str, np.ndarray], rules: list[tuple[str, object]]
) -> dict[str, np.ndarray]:
    """The CS model state Model Zoo writes from these HF tensors (an unmatched key is an error,
    as in Model Zoo without ``--drop-unmatched-keys``)."""
    out: dict[str, np.ndarray] = {}
    for name, value in hf.items():
        for pattern, target in rules:
            if re.fullmatch(pattern, name):
                if target is not DROPPED:
                    out[re.sub(pattern, str(target), name)] = value
                break
        else:
            raise KeyError(f"Model Zoo has no rule for {name}")
    return out
