"""What the GPT-J, CodeGen, GPT-NeoX, Falcon and BLOOM families share (kept out of family
discovery by the leading underscore): the (HF, CS) name pairs of their blocks, as Model Zoo's
five converters (``tools/checkpoint_converters/`` at Release_2.10.0) spell them alike; each
family module keeps its own facts and cites its converter. Their tensor table is built by
``hf/layouts/gptj_like.py``; their config tables are their records' (``catalogue/gptj_config.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ckpt_migrate.hf.mapping import MappingError

Pairs = Sequence[tuple[str, str]]  # (HF name, CS name)

EMBED = "embedding_layer.word_embeddings.weight"
HEAD = "lm_head.weight"
# HF GPT-J-style names (GPT-J, CodeGen) of the embeddings and the final norm. Model Zoo:
# gptj_hf_cs.py lines 86-101, salesforce_codegen_hf_cs.py lines 249-264.
GPTJ_STYLE_TOP: Pairs = (
    ("wte.weight", EMBED),
    ("ln_f.weight", "transformer_decoder.norm.weight"),
    ("ln_f.bias", "transformer_decoder.norm.bias"),
)


def params(modules: Pairs, kinds: Sequence[str] = ("weight", "bias")) -> list[tuple[str, str]]:
    """(HF, CS) names of each (HF, CS) module's parameters ``kinds``."""
    return [(f"{hf}.{kind}", f"{cs}.{kind}") for hf, cs in modules for kind in kinds]


def gptj_style_layer(*attention: tuple[str, str]) -> list[tuple[str, str]]:
    """(HF, CS) names inside a GPT-J-style block: the norm, the family's ``attention`` pairs,
    the MLP (Model Zoo: gptj_hf_cs.py lines 112-148, salesforce_codegen_hf_cs.py 275-303)."""
    mlp = [("mlp.fc_in", "ffn.ffn.0.linear_layer"), ("mlp.fc_out", "ffn.ffn.1.linear_layer")]
    return [*params([("ln_1", "norm1")]), *attention, *params(mlp)]


def megatron_layer(dense: str, norms: Pairs, bias: bool = True) -> list[tuple[str, str]]:
    """(HF, CS) names inside a block of GPT-NeoX, Falcon, BLOOM: the ``norms``, the attention's
    output ``dense`` and the MLP, whose biases only with ``bias``."""
    linear = [
        (dense, "self_attn.proj_output_dense_layer"),
        ("mlp.dense_h_to_4h", "ffn.ffn.0.linear_layer"),
        ("mlp.dense_4h_to_h", "ffn.ffn.1.linear_layer"),
    ]
    return params(norms) + params(linear, ("weight", "bias")[: 1 + bias])


def check_name(name: str, names: Sequence[str]) -> None:
    """Refuse a model name the family does not serve."""
    if name not in names:
        raise MappingError(f"{name}: this family serves {', '.join(names)}")
