"""GPT-2-like families: HF models with GPT-2's Conv1D ``transformer.h.N`` layout (``c_attn``,
``c_proj``, ``c_fc``), CS key layout :data:`~ckpt_migrate.catalogue.layouts.DECODER`.

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:
``gpt2_hf_cs.py``, ``btlm_hf_cs.py``, ``jais_hf_cs.py``, ``starcoder.py``, ``santacoder.py``;
``Converter_BTLMLMHeadModel_CS20_CS21``, ``Converter_JAISLMHeadModel_CS20_CS21`` and
``Converter_StarcoderLMHeadModel_CS20_CS21`` subclass ``Converter_GPT2LMHeadModel_CS20_CS21``.
Names, registry names and the oldest release converted: ``registry.py`` lines 173-378.
"""

from __future__ import annotations

from ckpt_migrate.catalogue import gpt2_config
from ckpt_migrate.catalogue.gpt2_config import STARCODER_HF_DEFAULTS
from ckpt_migrate.catalogue.layouts import DECODER
from ckpt_migrate.catalogue.mup import DECODER_MUP
from ckpt_migrate.catalogue.record import Drop, Hf, Name, NormFlag, Record, Signature, Tensors

GPT2 = Record(
    "gpt2",
    DECODER,
    names=(
        Name("gpt2", "gpt2", 18, since="1.8"),
        Name("gpt2-headless", "gpt2", 19, since="2.1", headless=True),
    ),
    more_names=(("gpt3", "gpt3"),),
    registry="gpt2",
    signature=Signature(
        ("decoder",),
        {
            "absolute_positions": True,
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
    norm_flag=NormFlag("use_rms_norm", "rmsnorm", "layernorm"),
    hf=Hf(
        "gpt2",
        ("gpt2",),
        {"gpt2": "GPT2LMHeadModel", "gpt2-headless": "GPT2Model"},
        by_architecture=True,
        mup=DECODER_MUP,  # gpt2_hf_cs.py lines 1053, 1119: supports_mup_conversion
        config=gpt2_config.GPT2_CONFIG,
        tensors=Tensors("gpt2_like.GPT2", "gpt2_like.gpt2", {"headless": "gpt2-headless"}),
        # the causal-mask buffers older transformers saved (gpt2_hf_cs.py line 306)
        hf_dropped=(
            Drop(
                r"(?:transformer\.)?h\.\d+\.attn\.(?:bias|masked_bias)",
                "a causal-mask buffer Hugging Face regenerates",
            ),
        ),
    ),
)

# BTLM's and JAIS's HF classes compute muP themselves (mup_width_scale, mup_output_alpha,
# mup_embeddings_scale, mup_scale_qk_dot_by_d): Model Zoo does not fold them
# (btlm_hf_cs.py / jais_hf_cs.py ``attempt_mup_to_sp`` false, lines 86, 123, 282-285).
_NATIVE_MUP = ("embeddings_scale", "scale_qk_dot_by_d", "output_logits_scale")
# BTLM's and JAIS's tensors (btlm_hf_cs.py lines 36-65, jais_hf_cs.py lines 36-65): ALiBi or
# learned positions, SwiGLU's second input; the CS optimizer's ``decoder_kernel`` is HF's
# ``mup_width_scale`` (btlm_hf_cs.py lines 252-259).
_BTLM_TENSORS = Tensors("gpt2_like.BTLM", "gpt2_like.on_layout", {"features": ("alibi", "swiglu")})
_BTLM_OPTIMIZER = (("adjust_learning_rate.decoder_kernel", "mup_width_scale", 1.0),)

BTLM = Record(
    "btlm",
    DECODER,
    names=(
        Name("btlm", "btlm", 7, since="2.0"),
        Name("btlm-headless", "btlm", 8, since="2.1", headless=True),
    ),
    hf=Hf(
        "btlm",
        ("btlm",),
        {"btlm": "BTLMLMHeadModel", "btlm-headless": "BTLMModel"},
        mup_native=_NATIVE_MUP,
        tensors=_BTLM_TENSORS,
        cs_optimizer=_BTLM_OPTIMIZER,
        config=gpt2_config.btlm_config(
            "btlm",
            # btlm_hf_cs.py lines 189-201.
            {
                "use_cache": True,
                "auto_map": {
                    "AutoConfig": "cerebras/btlm-3b-8k-base--configuration_btlm.BTLMConfig",
                    "AutoModel": "cerebras/btlm-3b-8k-base--modeling_btlm.BTLMModel",
                    "AutoModelForCausalLM": (
                        "cerebras/btlm-3b-8k-base--modeling_btlm.BTLMLMHeadModel"
                    ),
                },
            },
        ),
    ),
)

JAIS = Record(
    "jais",
    DECODER,
    names=(Name("jais", "jais", 24, since="2.0"),),
    hf=Hf(
        "jais",
        ("jais",),
        {"jais": "JAISLMHeadModel", "jais-headless": "JAISModel"},
        mup_native=_NATIVE_MUP,
        tensors=_BTLM_TENSORS,
        cs_optimizer=_BTLM_OPTIMIZER,
        config=gpt2_config.btlm_config(
            "jais",
            # jais_hf_cs.py lines 189-204.
            {
                "_name_or_path": "inceptionai/jais-30b-v3",
                "use_cache": True,
                "auto_map": {
                    "AutoConfig": "inceptionai/jais-30b-v3--configuration_jais.JAISConfig",
                    "AutoModel": "inceptionai/jais-30b-v3--modeling_jais.JAISModel",
                    "AutoModelForCausalLM": (
                        "inceptionai/jais-30b-v3--modeling_jais.JAISLMHeadModel"
                    ),
                    "AutoModelForQuestionAnswering": (
                        "inceptionai/jais-30b-v3--modeling_jais.JAISForQuestionAnswering"
                    ),
                    "AutoModelForSequenceClassification": (
                        "inceptionai/jais-30b-v3--modeling_jais.JAISForSequenceClassification"
                    ),
                    "AutoModelForTokenClassification": (
                        "inceptionai/jais-30b-v3--modeling_jais.JAISForTokenClassification"
                    ),
                },
            },
        ),
    ),
)

STARCODER = Record(
    "starcoder",
    DECODER,
    names=(
        Name("starcoder", "starcoder", 36, since="2.0"),
        Name("starcoder-headless", "starcoder", 37, since="2.1", headless=True),
        Name("octocoder", "starcoder", 46, alias_of="starcoder"),
        Name("octocoder-headless", "starcoder", 47, alias_of="starcoder-headless", headless=True),
        Name("wizardcoder", "gpt2", 48, alias_of="starcoder"),
        Name("wizardcoder-headless", "gpt2", 49, alias_of="starcoder-headless", headless=True),
        Name("sqlcoder", None, 50, alias_of="starcoder"),
        Name("sqlcoder-headless", None, 51, alias_of="starcoder-headless", headless=True),
    ),
    hf=Hf(
        "starcoder",
        ("gpt_bigcode",),
        mup=DECODER_MUP,  # starcoder.py lines 687, 795
        config=gpt2_config.STARCODER_CONFIG,
        tensors=Tensors(
            "gpt2_like.STARCODER",
            "gpt2_like.on_layout",
            {
                "features": ("learned positions", "multi-query"),
                "hf_defaults": STARCODER_HF_DEFAULTS,
            },
        ),
    ),
)

SANTACODER = Record(
    "santacoder",
    DECODER,
    names=(
        Name("santacoder", "santacoder", 34, since="2.1"),
        Name("santacoder-headless", "santacoder", 35, since="2.1", headless=True),
    ),
    # model_type "gpt2" with remote code: told apart by --model only; muP: santacoder.py
    # lines 435, 543
    hf=Hf(
        "santacoder",
        mup=DECODER_MUP,
        config=gpt2_config.SANTACODER_CONFIG,
        tensors=Tensors(
            "gpt2_like.SANTACODER",
            "gpt2_like.on_layout",
            {"features": ("learned positions", "causal mask")},
        ),
        # the causal-mask buffers Model Zoo's own export writes (santacoder.py lines 155-168)
        hf_dropped=(
            Drop(
                r"(?:transformer\.)?h\.\d+\.attn\.(?:bias|masked_bias)",
                "a causal-mask buffer Hugging Face regenerates",
            ),
        ),
    ),
)
