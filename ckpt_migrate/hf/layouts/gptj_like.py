"""The tensor tables of the GPT-J backbone: GPT-J, CodeGen and GPT-NeoX (Model Zoo, tag
Release_2.10.0: ``gptj_hf_cs.py``, ``salesforce_codegen_hf_cs.py``, ``gpt_neox_hf_cs.py``),
whose rules Model Zoo's converters spell alike: renamed (HF, CS) pairs, the family's fused
Q/K/V, the final norm under its second CS name, the head (and its bias).

The families declare their (HF, CS) name pairs (``TOP_PAIRS``, ``LAYER_PAIRS``); a table is
built from them by :func:`decoder_table`. All these CS models register their final norm under
two names, ``ln_f`` and ``transformer_decoder.norm`` (one module: ``models/nlp/gptj/
gptj_model.py`` lines 535-538, which CodeGen, GPT-NeoX and Falcon use; ``models/nlp/gpt2/
gpt2_model.py`` lines 910 and 965 for BLOOM). Model Zoo writes both on the way to CS
(``replace_final_norm``) and so does the table; on the way to HF ``ln_f.*`` is a tie of
``transformer_decoder.norm.*``, read only when it is the one present.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ckpt_migrate.hf.heads import DECODER_HEAD
from ckpt_migrate.hf.mapping import MappingError, Out, Shape, missing_inputs
from ckpt_migrate.hf.ops import RENAME_EXISTING, SECOND_NAME, Ctx, Op
from ckpt_migrate.hf.table import BOTH, TO_CS, TO_HF, Group, Row, Table, row

Pairs = Sequence[tuple[str, str]]  # (HF name, CS name)
EMBED = "embedding_layer.word_embeddings.weight"
HEAD = "lm_head.weight"
HEAD_BIAS = "lm_head.bias"
# The CS model's second name of its final norm (copy -> the name the plan reads), see above.
LN_F = {f"ln_f.{p}": f"transformer_decoder.norm.{p}" for p in ("weight", "bias")}
L = "transformer_decoder.layers.{i}."


def decoder_table(
    top: Pairs,
    layer: Sequence[tuple[str, ...]],
    block: str = "h",
    attention: Sequence[Row] = (),
    made: Sequence[Row] = (),
) -> Table:
    """The table of a GPT-J-backbone family: the ``top`` pairs under the HF prefix ``{p}``, the
    ``layer`` pairs inside each HF ``{p}{block}.N.`` and CS ``transformer_decoder.layers.N.``
    (read on export from the copy that exists; a third item is the row's ``when``), the
    ``attention`` rows (fused Q/K/V), the rows of tensors ``made`` on import, then the head
    (:data:`~ckpt_migrate.hf.heads.DECODER_HEAD`); on import the final norm's second name after
    the renames. Every input must exist (:func:`inputs_exist`); source tensors no row reads are
    left to the pipeline's unused-tensor rule."""
    hf_of = {cs: hf for hf, cs in top}
    heads = ((EMBED, HEAD, HEAD_BIAS), ("{p}" + hf_of[EMBED], HEAD, HEAD_BIAS))
    return Table(
        groups={
            "top": Group(tuple(row(cs, "{p}" + hf, RENAME_EXISTING) for hf, cs in top)),
            "layers": Group(
                tuple(
                    row(L + cs, f"{{p}}{block}.{{i}}.{hf}", RENAME_EXISTING, when=(*when, None)[0])
                    for hf, cs, *when in layer
                ),
                per_layer=True,
            ),
            "final norm's second name": Group(
                tuple(row(copy, "{p}" + hf_of[norm], SECOND_NAME) for copy, norm in LN_F.items())
            ),
            "attention": Group(tuple(attention), per_layer=True),
            "made": Group(tuple(made)),
            "head": Group((row(*heads, DECODER_HEAD),)),
        },
        order={
            TO_HF: ("top", "layers", "attention", "made", "head"),
            TO_CS: ("top", "layers", "final norm's second name", "attention", "made", "head"),
        },
        check=inputs_exist,
    )


def qkv_row(fused: str, op: Op, kinds: tuple[str, ...] = BOTH, when: str | None = None) -> Row:
    """The CS Q, K and V of each of ``kinds`` <-> the HF ``{p}``-prefixed ``fused`` (with
    ``{i}`` and ``{kind}`` fields) through ``op`` (:func:`~ckpt_migrate.hf.ops.fused_qkv`)."""
    cs = tuple(f"{L}self_attn.proj_{w}_dense_layer.{{s}}" for w in "qkv")
    return Row(cs, ("{p}" + fused.format(i="{i}", kind="{s}"),), op, kinds, when)


def inputs_exist(plan: list[Out], ctx: Ctx) -> list[Out]:
    """Every input the plan reads exists. Source tensors no rule reads are left to the
    pipeline's ``unused_inputs`` check (``hf/unconverted.py`` names the expected ones)."""
    missing = missing_inputs(plan, ctx.available)
    if missing:
        raise MappingError(f"{missing[0]}: the checkpoint lacks this tensor")
    return plan


def cs_config(
    direction: str,
    config: Mapping[str, Any],
    name: str,
    to_cs: Callable[[Mapping[str, Any], str], Mapping[str, Any]],
    to_hf: Callable[[Mapping[str, Any], str], Any],
    defaults: Mapping[str, Any],
) -> Mapping[str, Any]:
    """The CS config a :func:`decoder_context` reads: on import the one the family's
    ``to_cs`` (``config_to_cs``) gives; on export ``config`` over the family's ``defaults``,
    once its ``to_hf`` (``config_to_hf``) accepted it."""
    if direction == TO_CS:
        return to_cs(config, name)
    to_hf(config, name)
    return {**defaults, **config}


def decoder_context(
    shapes: Mapping[str, Shape],
    cs: Mapping[str, Any],
    name: str,
    prefix: str,
    *,
    bias: bool = False,
    dims: Mapping[str, Any] | None = None,
    flags: frozenset[str] = frozenset(),
) -> Ctx:
    """The context of a :func:`decoder_table`, from the CS config ``cs`` (the family's defaults
    filled in; on import the one its ``config_to_cs`` gives): the HF ``prefix`` unless the model
    is headless, the head tied (``share_embedding_weights``), a head ``bias``, the family's
    ``flags`` and ``dims``, and the copies
    read when only they exist (the final norm's ``ln_f``, a tied model's head for its
    embeddings: Model Zoo's ``pre_model_convert``)."""
    layers = cs["num_hidden_layers"]
    headless, tied = name.endswith("-headless"), bool(cs["share_embedding_weights"])
    flags = flags | ({"headless"} if headless else set())
    flags |= ({"tied"} if tied else set()) | ({"head bias"} if bias else set())
    copies = {v: k for k, v in LN_F.items()} | ({EMBED: HEAD} if tied else {})
    all_dims = {"cs": cs, "copies": copies, **(dims or {})}
    pre = "" if headless else prefix
    return Ctx(shapes, layers, pre, frozenset(flags), all_dims)
