"""T5-like families: encoder-decoders, CS key layout
:data:`~ckpt_migrate.catalogue.layouts.ENCODER_DECODER`.

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/t5.py``;
``transformer``, ``ul2`` and ``flan-ul2`` are aliases of ``t5`` (registry.py lines 319-333).
"""

from __future__ import annotations

from ckpt_migrate.catalogue import t5_config
from ckpt_migrate.catalogue.layouts import ENCODER_DECODER
from ckpt_migrate.catalogue.mup import T5_MUP
from ckpt_migrate.catalogue.record import (
    Absent,
    Drop,
    Hf,
    Name,
    NormFlag,
    Record,
    Signature,
    Tensors,
)
from ckpt_migrate.catalogue.t5_config import T5_CS_DEFAULTS, T5_HF_DEFAULTS

T5 = Record(
    "t5",
    ENCODER_DECODER,
    names=(
        Name("t5", "t5", 38, since="1.7"),
        Name("ul2", None, 39, alias_of="t5"),
        Name("flan-ul2", None, 40, alias_of="t5"),
        Name("transformer", "transformer", 41, alias_of="t5"),
    ),
    signature=Signature(
        ("encoder_decoder_embeddings",),
        {"encoder_layers": True, "cross_attention": True, "decoder": False, "bert_encoder": False},
    ),
    config_markers=frozenset(
        {
            "encoder_num_hidden_layers",
            "decoder_num_hidden_layers",
            "d_kv",
            "src_vocab_size",
            "use_t5_layer_norm",
            "use_pre_encoder_decoder_layer_norm",
            "relative_attention_num_buckets",
        }
    ),
    norm_flag=NormFlag("use_t5_layer_norm", "rmsnorm", None),
    hf=Hf(
        "t5",
        ("t5",),
        {"t5": "T5ForConditionalGeneration"},
        by_architecture=True,
        mup=T5_MUP,  # t5.py lines 1433-1494: supports_mup_conversion
        # relative biases HF files repeat (t5.py lines 637-644, 1345-1381)
        hf_dropped=(
            Drop(
                r"decoder\.block\.\d+\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight"
                r"|(?:encoder|decoder)\.block\.(?!0\.)\d+\.layer\.0\.SelfAttention"
                r"\.relative_attention_bias\.weight",
                "unused repeat of the block-0 relative bias (Model Zoo drops it)",
            ),
        ),
        # Model Zoo's import drops shared.weight (t5.py line 628), the only name save_pretrained
        # gives the embeddings; with it, the tied lm_head
        cs_absent=(
            Absent(
                (
                    "encoder_embeddings.word_embeddings.weight",
                    "decoder_embeddings.word_embeddings.weight",
                ),
                ("src_vocab_size", "d_model"),
                "Model Zoo's HF → CS import drops shared.weight, t5.py line 628",
                "without its trained values (random, or tied to the lm_head)",
            ),
        ),
        config=t5_config.T5_CONFIG,
        tensors=Tensors("t5.T5", "t5.context", {"defaults": (T5_CS_DEFAULTS, T5_HF_DEFAULTS)}),
    ),
)
