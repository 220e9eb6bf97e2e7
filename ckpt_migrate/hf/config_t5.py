"""The named operations of T5's config table (``catalogue/t5_config.py``), each a pair as in
``config_ops.py``: (exporting, importing). Model Zoo (tag Release_2.10.0,
``src/cerebras/modelzoo/tools/checkpoint_converters/t5.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_migrate.hf.config_ops import Fn, State
from ckpt_migrate.hf.mapping import MappingError

# Gated activations (t5.py lines 966-993); the others keep their name.
_GATED_TO_CS = {"gated-silu": "swiglu", "gated-relu": "reglu", "gated-gelu": "geglu"}
_GATED_TO_HF = {cs: hf for hf, cs in _GATED_TO_CS.items()}
_PLAIN = ("relu", "gelu")


def nonlinearity_to_hf(cs: Mapping[str, Any]) -> str:
    """``encoder_nonlinearity`` -> ``feed_forward_proj``; the decoder's must be the same
    (t5.py lines 966-1008)."""
    act = cs.get("encoder_nonlinearity", "relu")
    dec = cs.get("decoder_nonlinearity")
    if dec is not None and dec != act:
        raise MappingError(f"decoder_nonlinearity={dec!r}: HF T5 uses encoder_nonlinearity={act!r}")
    if act in _GATED_TO_HF:
        return _GATED_TO_HF[act]
    if act in _PLAIN:
        return act
    raise MappingError(f"encoder_nonlinearity={act!r}: no HF T5 feed_forward_proj for it")


def nonlinearity_to_cs(hf: Mapping[str, Any]) -> str:
    proj = hf["feed_forward_proj"]
    if proj in _GATED_TO_CS:
        return _GATED_TO_CS[proj]
    if proj in _PLAIN:
        return proj
    raise MappingError(f"feed_forward_proj={proj!r}: CS T5 supports relu, gelu and gated variants")


def hf_scales_tied(hf: Mapping[str, Any]) -> bool:
    """Whether the HF model shares the lm_head with the embeddings (and so rescales by
    ``d_model**-0.5``). transformers 5 keeps that in ``scale_decoder_outputs`` and always writes
    ``tie_word_embeddings: true``; older releases use ``tie_word_embeddings`` (Model Zoo reads
    that one, t5.py lines 850-857)."""
    if "scale_decoder_outputs" in hf:
        return bool(hf["scale_decoder_outputs"])
    return bool(hf.get("tie_word_embeddings", True))


def hf_head_shared(hf: Mapping[str, Any]) -> bool:
    """Whether the HF lm_head is the embedding tensor itself (``tie_word_embeddings``). Before
    transformers 5 that also meant the rescaling; from 5 on it may be shared unscaled
    (``scale_decoder_outputs: false``), which CS holds as an untied lm_head equal to the
    embeddings. An untied lm_head that is rescaled CS cannot hold."""
    shared = bool(hf.get("tie_word_embeddings", True))
    if not shared and hf_scales_tied(hf):
        raise MappingError(
            "scale_decoder_outputs: true with tie_word_embeddings: false: CS T5 rescales the "
            "decoder output only for an lm_head shared with the embeddings"
        )
    return shared


def _one_vocabulary(s: State) -> None:
    """HF T5 has one vocabulary and one dropout rate (ours: CS may give two)."""
    cs = s.src
    tgt = cs.get("tgt_vocab_size")
    if tgt is not None and tgt != cs.get("src_vocab_size", tgt):
        raise MappingError(f"tgt_vocab_size={tgt}: HF T5 has one vocabulary (src_vocab_size)")
    relu_dropout = cs.get("relu_dropout_rate")
    if relu_dropout is not None and relu_dropout != cs.get("dropout_rate", relu_dropout):
        raise MappingError(f"relu_dropout_rate={relu_dropout}: HF T5 uses dropout_rate for it")


def _activation_to_hf(s: State) -> None:
    s.out["feed_forward_proj"] = nonlinearity_to_hf(s.src)


def _activation_to_cs(s: State) -> None:
    s.out["encoder_nonlinearity"] = s.out["decoder_nonlinearity"] = nonlinearity_to_cs(s.src)


def _tie_to_hf(s: State) -> None:
    """Model Zoo's ``tie_word_embeddings`` and transformers 5's ``scale_decoder_outputs``."""
    s.out["tie_word_embeddings"] = s.out["scale_decoder_outputs"] = s.src["share_embedding_weights"]


def _tie_to_cs(s: State) -> None:
    s.out["share_embedding_weights"] = hf_scales_tied(s.src)


OPS: dict[str, tuple[Fn, Fn]] = {
    "one vocabulary, one dropout": (_one_vocabulary, None),
    "t5 activation": (_activation_to_hf, _activation_to_cs),
    "t5 tie": (_tie_to_hf, _tie_to_cs),
}
