"""LLaMA-like families: rotary, RMS-normed, gated-FFN decoders with HF's
``model.layers.N.self_attn.{q,k,v,o}_proj`` / ``mlp.{gate,up,down}_proj`` layout, CS key layout
:data:`~ckpt_migrate.catalogue.layouts.DECODER` (Mixtral adds the MoE keys, Gemma 2 the
post-norms).

Model Zoo, tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``:
``llama.py``, ``mistral.py``, ``mixtral.py``, ``gemma2.py``. Mistral, Mixtral and Gemma 2 have
only ``HF_CS2x`` converters: Model Zoo converts them from 2.1 (2.3) on, with no model key
renames at any hop.
"""

from __future__ import annotations

from ckpt_migrate.catalogue import gemma2_config, llama_config
from ckpt_migrate.catalogue.config import Op
from ckpt_migrate.catalogue.layouts import DECODER, MOE_KEYS, POST_NORM_KEYS
from ckpt_migrate.catalogue.mup import DECODER_MUP
from ckpt_migrate.catalogue.record import Drop, Hf, Name, NormFlag, Record, Signature, Tensors

# The rotary buffers older transformers saved (llama.py lines 337-341; CS computes its own).
_ROTARY_BUFFER = Drop(r".*\.rotary_emb\.inv_freq", "a rotary buffer Hugging Face regenerates")

# LLaMA's tensors (llama.py lines 38-459), served with Mistral's and Ministral's.
_LLAMA_TENSORS = Tensors("llama_like.LLAMA", "llama_like.decoder")

LLAMA = Record(
    "llama",
    DECODER,
    names=(
        Name("llama", "llama", 25, since="1.9"),
        Name("llama-headless", "llama", 26, since="2.1", headless=True),
        Name("llamaV2", "llama", 42, alias_of="llama"),
        Name("llamaV2-headless", "llama", 43, alias_of="llama-headless", headless=True),
        Name("code-llama", "llama", 44, alias_of="llama"),
        Name("code-llama-headless", "llama", 45, alias_of="llama-headless", headless=True),
        Name("wizardlm", "llama", 52, alias_of="llama"),
        Name("wizardlm-headless", "llama", 53, alias_of="llama-headless", headless=True),
    ),
    more_names=(("llama2", "llama"),),
    registry="llama",
    signature=Signature(
        ("decoder",),
        {
            "absolute_positions": False,
            "alibi": False,
            "embedding_norm": False,
            "gated_ffn": True,
            "second_norm": True,
            "norm_bias": False,
            "attention_bias": False,
            "ffn_bias": False,
            "head_bias": False,
            "moe": False,
            "post_norms": False,
        },
    ),
    norm_flag=NormFlag("use_rms_norm", "rmsnorm", "layernorm"),
    hf=Hf(
        "llama",
        ("llama",),
        {"llama": "LlamaForCausalLM", "llama-headless": "LlamaModel"},
        mup=DECODER_MUP,  # llama.py lines 1022, 1142: supports_mup_conversion
        hf_dropped=(_ROTARY_BUFFER,),
        config=llama_config.LLAMA_CONFIG,
        tensors=_LLAMA_TENSORS,
    ),
)

MISTRAL = Record(
    "mistral",
    DECODER,
    names=(
        Name("mistral", "mistral", 29, since="2.1"),
        Name("mistral-headless", "mistral", 30, since="2.1", headless=True),
    ),
    same_keys_as="llama",
    # Model Zoo 2.1-2.3: of the configs without a name, only Mistral's set a sliding window
    # (models/nlp/mistral/configs/params_mistral_7B.yaml; LLaMA's have none before 2.4).
    config_markers=frozenset({"attention_sliding_window_length"}),
    hf=Hf(
        "llama",
        ("mistral",),
        {"mistral": "MistralForCausalLM", "mistral-headless": "MistralModel"},
        mup=DECODER_MUP,  # mistral.py lines 30-92: LLaMA's converters
        hf_dropped=(_ROTARY_BUFFER,),
        config=llama_config.MISTRAL_CONFIG,
        tensors=_LLAMA_TENSORS,
    ),
)

MIXTRAL = Record(
    "mixtral",
    DECODER,
    names=(
        Name("mixtral", "mixtral", 31, since="2.3"),
        Name("mixtral-headless", "mixtral", 32, since="2.3", headless=True),
    ),
    registry="mixtral",
    extra_keys=MOE_KEYS,
    signature=Signature(
        ("decoder", "moe"),
        {
            "absolute_positions": False,
            "alibi": False,
            "second_norm": True,
            "norm_bias": False,
            "attention_bias": False,
            "head_bias": False,
        },
    ),
    hf=Hf(
        "mixtral",
        ("mixtral",),
        {"mixtral": "MixtralForCausalLM", "mixtral-headless": "MixtralModel"},
        hf_dropped=(_ROTARY_BUFFER,),
        config=llama_config.MIXTRAL_CONFIG,
        # the experts fused across experts (mixtral.py lines 172-300)
        tensors=Tensors("llama_like.MIXTRAL", "llama_like.decoder", {"experts": True}),
    ),
)

GEMMA2 = Record(
    "gemma2",
    DECODER,
    names=(Name("gemma2", "gemma2", 17, since="2.3"),),
    registry="gemma2",
    extra_keys=POST_NORM_KEYS,
    signature=Signature(
        ("decoder", "post_norms"),
        {
            "absolute_positions": False,
            "alibi": False,
            "gated_ffn": True,
            "second_norm": True,
            "norm_bias": False,
            "attention_bias": False,
            "head_bias": False,
        },
    ),
    hf=Hf(
        "gemma2",
        ("gemma2",),
        {"gemma2": "Gemma2ForCausalLM"},
        # Gemma's sqrt(hidden) embedding scale and query_pre_attn_scalar (gemma2.py lines
        # 755-765), not muP; Model Zoo's gemma2.py has no muP conversion
        mup_native=("embeddings_scale", "attention_logits_alpha"),
        by_architecture=True,
        hf_dropped=(Drop(r".*inv_freq", "a rotary buffer Hugging Face regenerates"),),
        # (gemma2.py lines 674-688: any GELU is CS geglu, whose GELU is the exact one)
        approximates=(
            (
                "hidden_activation",
                "gelu",
                "CS geglu computes the exact GELU (as Model Zoo converts it), so the CS "
                "model's outputs differ slightly",
            ),
        ),
        config=gemma2_config.GEMMA2_CONFIG,
        config_label="Gemma 2",  # another name's config is refused
        # attention biases and the norms' offset (gemma2.py lines 56-190)
        tensors=Tensors(
            "llama_like.GEMMA2",
            "llama_like.decoder",
            {"family": "Gemma 2", "bias": True},
        ),
    ),
)

# Ministral (HF ``MinistralForCausalLM``, transformers' ``models/ministral``): Mistral's config
# (``MinistralConfig`` subclasses ``MistralConfig``) and Mistral's decoder layer without the
# projection biases Qwen2's has, plus ``layer_types``; its config needs ``head_dim`` given. Not
# a Model Zoo name: a CS checkpoint of it is a Mistral one (``steps_of``), converted by the LLaMA
# rules.
MINISTRAL = Record(
    "ministral",
    DECODER,
    names=(
        Name("ministral", "mistral", None),
        Name("ministral-headless", "mistral", None, headless=True),
    ),
    steps_of="mistral",
    hf=Hf(
        "llama",
        ("ministral",),
        {"ministral": "MinistralForCausalLM", "ministral-headless": "MinistralModel"},
        mup=DECODER_MUP,
        hf_dropped=(_ROTARY_BUFFER,),
        config=llama_config.llama_config(
            "ministral",
            10000.0,
            (*llama_config.SLIDING_WINDOW, Op("uniform layer types"), Op("head dim")),
        ),
        tensors=_LLAMA_TENSORS,
    ),
)
