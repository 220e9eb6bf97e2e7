"""GPT-J-like families: rotary decoders whose HF layout fuses or packs attention per layer
(GPT-J's separate ``q_proj``/``k_proj``/``v_proj`` with a parallel FFN, CodeGen's ``mp_num``
packed ``qkv_proj``, the Megatron-style per-head ``query_key_value`` of GPT-NeoX, Falcon and
BLOOM), CS key layout :data:`~ckpt_migrate.catalogue.layouts.DECODER`.

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:
``gptj_hf_cs.py``, ``salesforce_codegen_hf_cs.py``, ``gpt_neox_hf_cs.py``, ``falcon.py``,
``bloom_hf_cs.py``. GPT-J, NeoX and CodeGen configs share their keys (one model class in Model
Zoo; NeoX configs run as ``gptj``, ``models/nlp/gptj/configs/params_gpt_neox_*.yaml``), and
CodeGen is GPT-J's CS model (``registry.py`` line 344, ``"codegen": "gptj"``).
"""

from __future__ import annotations

from ckpt_migrate.catalogue import gptj_config
from ckpt_migrate.catalogue.gptj_config import (
    BLOOM_CS_DEFAULTS,
    FALCON_CS_DEFAULTS,
    GPTJ_CS_DEFAULTS,
)
from ckpt_migrate.catalogue.layouts import DECODER
from ckpt_migrate.catalogue.mup import DECODER_MUP, GPTJ_MUP
from ckpt_migrate.catalogue.record import Drop, Hf, Name, NormFlag, Record, Signature, Tensors

_BIASLESS = NormFlag("use_biasless_norm", "biasless-layernorm", None)
_ALIBI_SLOPES = Drop(
    r"embedding_layer\.position_embed_helper\.slopes|relative_pe_helper\.slopes",
    "ALiBi slopes, which HF computes itself",
)
_BUFFER = "a buffer Hugging Face regenerates"
# The GPT-J backbone's one context (``hf/layouts/gptj_like.py``), over GPT-J's CS defaults;
# GPT-J and CodeGen write the head's bias (gptj_hf_cs.py lines 305-309,
# salesforce_codegen_hf_cs.py lines 466-470).
_DECODER = "gptj_like.decoder"
_WITH_HEAD_BIAS = {"defaults": GPTJ_CS_DEFAULTS, "bias": True}

GPTJ = Record(
    "gptj",
    DECODER,
    names=(
        Name("gptj", "gptj", 20, since="1.8"),
        Name("gptj-headless", "gptj", 21, since="2.0", headless=True),
    ),
    registry="gptj",
    config_group="gptj",
    signature=Signature(
        ("decoder",),
        {
            "absolute_positions": False,
            "alibi": False,
            "embedding_norm": False,
            "gated_ffn": False,
            "second_norm": False,
            "norm_bias": True,
            "attention_bias": False,
            "ffn_bias": True,
            "head_bias": True,
        },
    ),
    config_markers=frozenset({"use_biasless_norm"}),
    norm_flag=_BIASLESS,
    hf=Hf(
        "gptj",
        ("gptj",),
        {"gptj": "GPTJForCausalLM", "gptj-headless": "GPTJModel"},
        mup=GPTJ_MUP,  # gptj_hf_cs.py lines 761-811: supports_mup_conversion
        by_architecture=True,
        # buffers older transformers saved, which Model Zoo skips (gptj_hf_cs.py lines 151-155)
        hf_dropped=(Drop(r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)", _BUFFER),),
        config=gptj_config.GPTJ_CONFIG,
        tensors=Tensors("gptj_like.GPTJ", _DECODER, _WITH_HEAD_BIAS),
    ),
)

GPT_NEOX = Record(
    "gpt-neox",
    DECODER,
    names=(
        # its own registry entry (registry.yaml of 2.4 and 2.10: GPTNeoXModel, name
        # "gpt-neox"; converter registry.py lines 338-355 map the headless name to it)
        Name("gpt-neox", "gpt-neox", 22, since="1.8"),
        Name("gpt-neox-headless", "gpt-neox", 23, since="2.1", headless=True),
    ),
    registry="gpt-neox",
    config_group="gptj",
    signature=Signature(
        ("decoder",),
        {
            "absolute_positions": False,
            "alibi": False,
            "embedding_norm": False,
            "gated_ffn": False,
            "second_norm": True,
            "norm_bias": True,
            "attention_bias": True,
            "ffn_bias": True,
            "head_bias": False,
        },
    ),
    norm_flag=_BIASLESS,
    hf=Hf(
        "gpt_neox",
        ("gpt_neox",),
        {"gpt-neox": "GPTNeoXForCausalLM", "gpt-neox-headless": "GPTNeoXModel"},
        by_architecture=True,
        # buffers Model Zoo skips (gpt_neox_hf_cs.py lines 410-418)
        hf_dropped=(
            Drop(
                r"(gpt_neox\.)?layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)",
                _BUFFER,
            ),
        ),
        config=gptj_config.GPT_NEOX_CONFIG,
        # the fused Q/K/V's heads and rotary rows (gpt_neox_hf_cs.py lines 79-216); the untied
        # head's name in HF files (lines 568-574)
        tensors=Tensors(
            "gptj_like.GPT_NEOX",
            _DECODER,
            {
                "defaults": GPTJ_CS_DEFAULTS,
                "prefix": "gpt_neox.",
                "dims": {"heads": "num_heads", "rotary_dim": "rotary_dim"},
                "legacy_head": "embed_out.weight",
            },
        ),
    ),
)

CODEGEN = Record(
    "codegen",
    DECODER,
    names=(
        Name("codegen", "gptj", 10, since="1.8"),
        Name("codegen-headless", "gptj", 11, since="2.0", headless=True),
    ),
    config_group="gptj",
    signature=GPTJ.signature,  # GPT-J's CS model: the same keys
    norm_flag=_BIASLESS,
    same_keys_as="gptj",
    hf=Hf(
        "codegen",
        ("codegen",),
        {"codegen": "CodeGenForCausalLM", "codegen-headless": "CodeGenModel"},
        by_architecture=True,
        # buffers Model Zoo skips (salesforce_codegen_hf_cs.py lines 306-317)
        hf_dropped=(
            Drop(r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias|causal_mask)", _BUFFER),
        ),
        config=gptj_config.CODEGEN_CONFIG,
        tensors=Tensors("gptj_like.CODEGEN", _DECODER, _WITH_HEAD_BIAS),
    ),
)

BLOOM = Record(
    "bloom",
    DECODER,
    names=(
        Name("bloom", "bloom", 5, since="1.9"),
        Name("bloom-headless", "bloom", 6, since="2.1", headless=True),
    ),
    registry="bloom",
    signature=Signature(
        ("decoder",),
        {
            "absolute_positions": False,
            "alibi": True,
            "embedding_norm": True,
            "gated_ffn": False,
            "second_norm": True,
            "norm_bias": True,
            "attention_bias": True,
            "ffn_bias": True,
            "head_bias": False,
        },
    ),
    norm_flag=NormFlag("use_rms_norm", "rmsnorm", "layernorm"),
    hf=Hf(
        "bloom",
        ("bloom",),
        {"bloom": "BloomForCausalLM", "bloom-headless": "BloomModel"},
        by_architecture=True,
        mup=DECODER_MUP,  # bloom_hf_cs.py lines 966, 1054: supports_mup_conversion
        # ALiBi slopes, which HF computes (bloom_hf_cs.py lines 970-982; the second name is
        # the 2.0 spelling)
        cs_dropped=(_ALIBI_SLOPES,),
        config=gptj_config.BLOOM_CONFIG,
        tensors=Tensors(
            "gptj_like.BLOOM",
            _DECODER,
            {"defaults": BLOOM_CS_DEFAULTS, "dims": {"heads": "num_heads"}},  # lines 95-168
        ),
    ),
)

FALCON = Record(
    "falcon",
    DECODER,
    names=(
        Name("falcon", "falcon", 15, since="2.0"),
        Name("falcon-headless", "falcon", 16, since="2.1", headless=True),
    ),
    registry="falcon",
    signature=Signature(
        ("decoder",),
        {
            "absolute_positions": False,
            "alibi": False,
            "embedding_norm": False,
            "gated_ffn": False,
            "norm_bias": True,
            "attention_bias": False,
            "ffn_bias": False,
            "head_bias": False,
        },
    ),
    same_keys_as="gpt-neox",
    hf=Hf(
        "falcon",
        ("falcon",),
        {"falcon": "FalconForCausalLM", "falcon-headless": "FalconModel"},
        by_architecture=True,
        # ALiBi slopes, which HF computes (falcon_180b.py lines 42-47 and 719-723)
        cs_dropped=(_ALIBI_SLOPES,),
        config=gptj_config.FALCON_CONFIG,
        # the grouped fused Q/K/V (falcon_40b.py lines 35-301), norms and biases
        # (falcon_180b.py lines 36-131)
        tensors=Tensors(
            "gptj_like.FALCON",
            _DECODER,
            {"defaults": FALCON_CS_DEFAULTS, "features": ("grouped attention",)},
        ),
    ),
)
