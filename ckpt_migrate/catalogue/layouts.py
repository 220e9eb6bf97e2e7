"""The CS key layouts families share, with their ties.

The key names are the Cerebras ones used since 1.7, from the HF↔CS converters
(MODELZOO_HISTORY.md §3.5 "CS naming used since 1.7 for decoder LMs" and the 1.6→1.7 BERT and
T5 tables; ``f1fd1e0:src/cerebras/modelzoo/tools/checkpoint_converters/{gpt2_hf_cs,gptj_hf_cs,
llama,bloom_hf_cs,bert,t5}.py``): every decoder LM is a ``GPT2LMHeadModel`` configured per
family, so the decoder families differ only in which optional keys exist (biases, a gated FFN, a
second norm, learned positions, ALiBi slopes, an embedding norm).

Ties from MODELZOO_HISTORY.md §1.2 and §1.5: the 2.0 ``fix_checkpoint_spec`` alias table and
the 2.1+ CS18/19→CS20 converters (``helper.py:maybe_tie_lm_head/tie_none_weights``). A tie is
(copy, original): where a file holds one tensor under several names, the conversions read the
first present of the originals-first order (``hf/unconverted.py``).
"""

from __future__ import annotations

from ckpt_migrate.catalogue.record import Layout, Tie

NORM = "{weight,bias}"

DECODER = Layout(
    "decoder",
    keys=(
        "embedding_layer.word_embeddings.weight",
        "embedding_layer.position_embeddings",
        "embedding_layer.position_embeddings.{weight,fpe}",
        "embedding_layer.position_embeddings.embed.weight",
        "embedding_layer.position_embed_helper.**",
        "relative_pe_helper.**",
        f"embedding_ln_f.{NORM}",
        f"transformer_decoder.layers.#.self_attn.proj_{{q,k,v,output}}_dense_layer.{NORM}",
        f"transformer_decoder.layers.#.norm{{1,2,3}}.{NORM}",
        f"transformer_decoder.layers.#.ffn.ffn.#.linear_layer{{,_for_glu}}.{NORM}",
        f"transformer_decoder.norm.{NORM}",
        f"ln_f.{NORM}",
        f"lm_head.{NORM}",
    ),
    # lm_head shares the word embeddings when share_embedding_weights (default true); 1.7 GPT-2
    # kept ln_f and transformer_decoder.norm.
    ties=(
        Tie("ln_f.weight", "transformer_decoder.norm.weight"),
        Tie("ln_f.bias", "transformer_decoder.norm.bias"),
        Tie("lm_head.weight", "embedding_layer.word_embeddings.weight", "share_embedding_weights"),
    ),
)

BERT_ENCODER = Layout(
    "bert-encoder",
    keys=(
        "{bert_encoder,bert}.embedding_layer.{word_embeddings,segment_embeddings}.weight",
        "{bert_encoder,bert}.embedding_layer.position_embeddings",
        "{bert_encoder,bert}.embedding_layer.position_embeddings.{weight,fpe}",
        "{bert_encoder,bert}.embedding_layer.position_embeddings.embed.weight",
        f"{{bert_encoder,bert}}.embed_ln_f.{NORM}",
        "{bert_encoder,bert}.transformer_encoder.layers.#.self_attn."
        f"proj_{{q,k,v,output}}_dense_layer.{NORM}",
        f"{{bert_encoder,bert}}.transformer_encoder.layers.#.norm{{1,2}}.{NORM}",
        f"{{bert_encoder,bert}}.transformer_encoder.layers.#.ffn.ffn.#.linear_layer.{NORM}",
        f"{{bert_encoder,bert}}.pooler.pooler.ffn.#.linear_layer.{NORM}",
        f"bert_mlm_head.mlm_transform.ffn.ffn.#.linear_layer.{NORM}",
        f"bert_mlm_head.mlm_transform.ln.{NORM}",
        f"bert_mlm_head.classifier.ffn.#.linear_layer.{NORM}",
        f"bert_cls_head.classifier.ffn.#.linear_layer.{NORM}",
    ),
    # The MLM classifier shares the word embeddings (and so in the fine-tuning variants).
    ties=(
        Tie(
            "bert_mlm_head.classifier.ffn.0.linear_layer.weight",
            "bert_encoder.embedding_layer.word_embeddings.weight",
            "share_embedding_weights",
        ),
    ),
)

ENCODER_DECODER = Layout(
    "encoder-decoder",
    keys=(
        "{encoder,decoder}_embeddings.word_embeddings.weight",
        "{encoder,decoder}_embeddings.position_embeddings",
        "{encoder,decoder}_embeddings.position_embeddings.{weight,fpe}",
        "{encoder,decoder}_embeddings.position_embeddings.embed.weight",
        f"{{encoder,decoder}}_embeddings.position_embed_helper.relative_attention_bias.{NORM}",
        f"relative_position_{{encoder,decoder}}.relative_attention_bias.{NORM}",
        "{encoder,decoder}.layers.#.{self_attn,multihead_attn}."
        f"proj_{{q,k,v,output}}_dense_layer.{NORM}",
        f"{{encoder,decoder}}.layers.#.norm{{1,2,3}}.{NORM}",
        f"{{encoder,decoder}}.layers.#.ffn.ffn.#.linear_layer{{,_for_glu}}.{NORM}",
        f"{{encoder,decoder}}.norm.{NORM}",
        f"lm_head.{NORM}",
    ),
    # Encoder and decoder embeddings, and lm_head with the decoder's.
    ties=(
        Tie(
            "decoder_embeddings.word_embeddings.weight",
            "encoder_embeddings.word_embeddings.weight",
            "share_encoder_decoder_embedding",
        ),
        Tie(
            "lm_head.weight",
            "decoder_embeddings.word_embeddings.weight",
            "share_embedding_weights",
        ),
    ),
)

LAYOUTS = (DECODER, BERT_ENCODER, ENCODER_DECODER)

# Mixtral's mixture-of-experts FFN and Gemma 2's post-norms (Release_2.10.0
# src/cerebras/modelzoo/tools/checkpoint_converters/mixtral.py lines 96-166: ``ffn.gate``,
# ``ffn.experts.experts.<i>.ffn.<j>.linear_layer[_for_glu]``; the fused layout the converter
# writes, ``ffn.experts.fused_ffns.<j>.linear_layer[_for_glu].expert_weights``; 2.10's default
# ("experimental") ``ffn.experts.experts.<i>.<j>.linear_layer[_for_glu]``; gemma2.py:
# ``norm1_post``, ``norm3_post``).
MOE_KEYS = (
    f"transformer_decoder.layers.#.ffn.gate.{NORM}",
    f"transformer_decoder.layers.#.ffn.experts.experts.#.ffn.#.linear_layer{{,_for_glu}}.{NORM}",
    "transformer_decoder.layers.#.ffn.experts.fused_ffns.#.linear_layer{,_for_glu}.expert_weights",
    f"transformer_decoder.layers.#.ffn.experts.experts.#.#.linear_layer{{,_for_glu}}.{NORM}",
)
POST_NORM_KEYS = (f"transformer_decoder.layers.#.norm{{1,3}}_post.{NORM}",)
