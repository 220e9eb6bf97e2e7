"""GPT-2 key layout and config rules, shared by the GPT-2 family (``gpt2.py``) and the families
built on it (``starcoder.py``, ``santacoder.py``, ``btlm.py``, ``jais.py``). Not a family: no
``NAMES``.

Model Zoo (tag Release_2.10.0): the tensor rules of ``Converter_GPT2Model_HF_CS17``
(gpt2_hf_cs.py lines 230-402), which the StarCoder, SantaCoder, BTLM and JAIS converters inherit,
and the config rules of ``ConfigConverter_GPT2Model_HF_CS17`` and ``_CS20`` (gpt2_hf_cs.py lines
477-656 and 916-925).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ckpt_migrate.hf.mapping import MappingError, Out, Shape, rename, transpose

# ---- config rules -----------------------------------------------------------------------------

# (HF key, CS key) of the rules that only rename (gpt2_hf_cs.py lines 486-573).
GPT2_RENAMES: tuple[tuple[str, str], ...] = (
    ("vocab_size", "vocab_size"),
    ("embd_pdrop", "embedding_dropout_rate"),
    ("tie_word_embeddings", "share_embedding_weights"),
    ("n_embd", "hidden_size"),
    ("n_head", "num_heads"),
    ("n_layer", "num_hidden_layers"),
    ("n_positions", "max_position_embeddings"),
    ("n_inner", "filter_size"),
    ("activation_function", "nonlinearity"),
    ("attn_pdrop", "attention_dropout_rate"),
    ("resid_pdrop", "dropout_rate"),
    ("rotary_dim", "rotary_dim"),
    ("layer_norm_epsilon", "layer_norm_epsilon"),
    ("initializer_range", "initializer_range"),
)
# CS fields accepted with one value only (assert_factory_fn, lines 487-585 and 920-923).
GPT2_CS_FIXED: dict[str, Any] = {
    "norm_type": "layernorm",
    "position_embedding_type": "learned",
    "use_position_embedding": True,
    "embedding_layer_norm": False,
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True,
    "use_bias_in_output": False,
    "fixed_sparse_attention": None,
    "norm_first": True,
    "use_ff_layer1_dropout": False,
}


def with_defaults(config: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Model Zoo's ``pre_convert_defaults``: a key the config lacks takes the default."""
    return {**defaults, **config}


def expect(config: Mapping[str, Any], key: str, allowed: Sequence[Any], side: str) -> None:
    """Model Zoo's ``assert_factory_fn`` (base_converter.py lines 1603-1640)."""
    if key in config and config[key] not in allowed:
        raise MappingError(f"{side} {key}={config[key]!r} is not supported (only {allowed})")


def gpt2_config_to_cs(
    hf_config: Mapping[str, Any], renames: Sequence[tuple[str, str]], model_types: Sequence[str]
) -> dict[str, Any]:
    """GPT-2 rules HF -> CS: ``tie_word_embeddings`` defaults to true (lines 596-600),
    ``n_inner: null`` becomes ``4 * n_embd`` (lines 648-650), ``scale_attn_weights`` gives
    ``attention_type`` (lines 618-623); ``reorder_and_upcast_attn`` and (unless renamed)
    ``scale_attn_by_inverse_layer_idx`` must be false (lines 586-593)."""
    hf = with_defaults(hf_config, {"tie_word_embeddings": True})
    expect(hf, "model_type", model_types, "HF")
    expect(hf, "reorder_and_upcast_attn", (False,), "HF")
    if "scale_attn_by_inverse_layer_idx" not in dict(renames):
        expect(hf, "scale_attn_by_inverse_layer_idx", (False,), "HF")
    if hf.get("n_inner") is None:
        hf["n_inner"] = 4 * hf["n_embd"]
    cs = {c: hf[h] for h, c in renames if h in hf}
    if "scale_attn_weights" in hf:
        cs["attention_type"] = "scaled_dot_product" if hf["scale_attn_weights"] else "dot_product"
    return {**cs, "use_bias_in_output": False}


def gpt2_config_to_hf(
    cs_model: Mapping[str, Any], renames: Sequence[tuple[str, str]], fixed: Mapping[str, Any]
) -> dict[str, Any]:
    """GPT-2 rules CS -> HF: fixed-value fields asserted, the dropout rates default to
    ``dropout_rate`` (lines 651-655), ``attention_type`` gives ``scale_attn_weights`` (lines
    624-638)."""
    cs = with_defaults(cs_model, {"share_embedding_weights": True})
    for key, value in fixed.items():
        expect(cs, key, (value,), "CS")
    for key in ("embedding_dropout_rate", "attention_dropout_rate"):
        if key not in cs and "dropout_rate" in cs:
            cs[key] = cs["dropout_rate"]
    hf = {h: cs[c] for h, c in renames if c in cs}
    if "attention_type" in cs:
        if cs["attention_type"] not in ("scaled_dot_product", "dot_product"):
            raise MappingError(f"attention_type={cs['attention_type']!r} is not supported")
        hf["scale_attn_weights"] = cs["attention_type"] == "scaled_dot_product"
    return hf


# ---- tensor names -----------------------------------------------------------------------------

Pair = tuple[str, str, bool]  # (HF name, CS name, Conv1D: transposed)
# HF attention buffers the GPT-2 rules drop (gpt2_hf_cs.py lines 304-309, exists="left").
HF_ATTN_BUFFERS = re.compile(r"(?:transformer\.)?h\.\d+\.attn\.(?:masked_bias|bias)")
# (HF module, CS module) of a GPT-2 block after its norms: ``c_proj`` -> ``proj_output_dense_layer``
# (gpt2_hf_cs.py line 52), ``mlp.c_fc``/``c_proj`` -> ``ffn.ffn.0``/``1`` (lines 277-294).
GPT2_BLOCK: tuple[tuple[str, str], ...] = (
    ("attn.c_proj", "self_attn.proj_output_dense_layer"),
    ("mlp.c_fc", "ffn.ffn.0.linear_layer"),
    ("mlp.c_proj", "ffn.ffn.1.linear_layer"),
)


def check_name(name: str, names: Sequence[str]) -> bool:
    """Whether ``name`` (one of ``names``) is the headless model; MappingError if unknown."""
    if name not in names:
        raise MappingError(f"model name {name!r} is not one of {', '.join(names)}")
    return name.endswith("-headless")


def hf_prefix(headless: bool) -> str:
    """The ``*Model`` (headless) HF classes have no ``transformer.`` prefix (Model Zoo's
    ``*Model_HF_CS21`` vs ``*ForCausalLM``/``*LMHeadModel`` converters)."""
    return "" if headless else "transformer."


def hf_layer(p: str, i: int) -> str:
    return f"{p}h.{i}."


def cs_layer(i: int) -> str:
    return f"transformer_decoder.layers.{i}."


def cs_attn(i: int, letters: str, suffix: str) -> list[str]:
    """The CS ``proj_{x}_dense_layer.{suffix}`` of layer ``i`` for each ``x`` in ``letters``
    (the split of a fused attention, gpt2_hf_cs.py lines 113-151)."""
    return [f"{cs_layer(i)}self_attn.proj_{x}_dense_layer.{suffix}" for x in letters]


def both(hf: str, cs: str, conv1d: bool) -> list[Pair]:
    """Weight and bias of one layer."""
    return [(f"{hf}.{s}", f"{cs}.{s}", conv1d) for s in ("weight", "bias")]


def embedding_pairs(p: str, learned: bool) -> list[Pair]:
    """``wte`` -> ``embedding_layer.word_embeddings`` (gpt2_hf_cs.py lines 234-240); ``wpe`` ->
    ``embedding_layer.position_embeddings.embed`` in the 2.1 spelling (starcoder.py lines
    696-707) when positions are learned."""
    pairs = [(f"{p}wte.weight", "embedding_layer.word_embeddings.weight", False)]
    if learned:
        pairs.append((f"{p}wpe.weight", "embedding_layer.position_embeddings.embed.weight", False))
    return pairs


def layer_norm_pairs(h: str, c: str) -> list[Pair]:
    """``ln_1`` -> ``norm1``, ``ln_2`` -> ``norm3`` (gpt2_hf_cs.py lines 259-276)."""
    return both(f"{h}ln_1", f"{c}norm1", False) + both(f"{h}ln_2", f"{c}norm3", False)


def final_norm_pairs(p: str) -> list[Pair]:
    """``ln_f`` -> ``transformer_decoder.norm`` (gpt2_hf_cs.py lines 295-301)."""
    return both(f"{p}ln_f", "transformer_decoder.norm", False)


def decoder_pairs(
    p: str,
    layers: int,
    modules: Sequence[tuple[str, str]],
    conv1d: bool,
    learned: bool = True,
    extra: Sequence[Pair] = (),
) -> list[Pair]:
    """Every tensor that is only renamed (``conv1d``: weights transposed, GPT-2's
    ``transpose_key_if_2D``): the embeddings, the final norm, ``extra``, then per layer the two
    norms and the (HF, CS) ``modules`` in their order."""
    pairs = embedding_pairs(p, learned) + final_norm_pairs(p) + list(extra)
    for i in range(layers):
        h, c = hf_layer(p, i), cs_layer(i)
        pairs += layer_norm_pairs(h, c)
        for hf_module, cs_module in modules:
            pairs += both(f"{h}{hf_module}", f"{c}{cs_module}", conv1d)
    return pairs


def pairs_to_cs(pairs: Sequence[Pair]) -> list[Out]:
    return [transpose(h, c) if t else rename(h, c) for h, c, t in pairs]


def pairs_to_hf(pairs: Sequence[Pair]) -> list[Out]:
    """The inverse renames, but for ``wte``, which :func:`lm_head_to_hf` writes (ties)."""
    skip = "embedding_layer.word_embeddings.weight"
    return [transpose(c, h) if t else rename(c, h) for h, c, t in pairs if c != skip]


# ---- fused Conv1D attention -------------------------------------------------------------------


def conv1d_split(src: str, dst: str, index: int, pieces: int) -> Out:
    """Piece ``index`` of a fused Conv1D ``[in, pieces * out]`` as a Linear ``[out, in]``
    (``torch.chunk(transpose(w), pieces)``, gpt2_hf_cs.py lines 122-149); a bias is chunked."""

    def build(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.split(x.T if x.ndim == 2 else x, pieces, axis=0)[index])

    def infer(s: Shape) -> Shape:
        return (s[1] // pieces, s[0]) if len(s) == 2 else (s[0] // pieces,)

    return Out(dst, (src,), build, infer=infer, note=f"Conv1D piece {index + 1} of {pieces}")


def conv1d_join(srcs: Sequence[str], dst: str) -> Out:
    """Linear pieces concatenated then transposed to Conv1D (gpt2_hf_cs.py lines 175-188)."""

    def build(*xs: np.ndarray) -> np.ndarray:
        joined = np.concatenate(xs, axis=0)
        return np.ascontiguousarray(joined.T) if joined.ndim == 2 else joined

    def infer(*shapes: Shape) -> Shape:
        rows = sum(s[0] for s in shapes)
        return (shapes[0][1], rows) if len(shapes[0]) == 2 else (rows,)

    return Out(dst, tuple(srcs), build, infer=infer, note="fused to Conv1D")


def split_attn(p: str, i: int, module: str, letters: str) -> list[Out]:
    """Layer ``i``'s fused Conv1D ``attn.{module}`` (weight, then bias) as the CS
    ``proj_{x}_dense_layer`` of each ``x`` in ``letters``."""
    plan = []
    for suffix in ("weight", "bias"):
        src = f"{hf_layer(p, i)}attn.{module}.{suffix}"
        dsts = cs_attn(i, letters, suffix)
        plan += [conv1d_split(src, dst, j, len(letters)) for j, dst in enumerate(dsts)]
    return plan


def join_attn(p: str, i: int, module: str, letters: str) -> list[Out]:
    """The inverse of :func:`split_attn`."""
    return [
        conv1d_join(cs_attn(i, letters, s), f"{hf_layer(p, i)}attn.{module}.{s}")
        for s in ("weight", "bias")
    ]


# ---- final norm, lm_head, checks --------------------------------------------------------------


def normal_head(shape: Shape, dtype: Any) -> np.ndarray:
    """A new ``lm_head``: Model Zoo initialises the missing head of an untied headless model
    with ``normal(0, 0.02)`` (``post_model_convert``, gpt2_hf_cs.py lines 376-394); seeded
    here, so repeatable."""
    return np.random.default_rng(0).normal(0.0, 0.02, shape).astype(dtype)


def lm_head_to_cs(hf: Mapping[str, Shape], p: str, is_tied: bool, headless: bool) -> list[Out]:
    """CS ``lm_head.weight``, always written (the CS ``GPT2LMHeadModel`` has one). From HF
    ``lm_head.weight`` when the file has it (rule ``lm_head`` ``replaceKey``, gpt2_hf_cs.py
    lines 1085-1088, starcoder.py lines 755-758, santacoder.py lines 503-506, btlm_hf_cs.py
    lines 433-436, jais_hf_cs.py lines 436-439); else, tied, a copy of ``wte`` (gpt2_hf_cs.py
    lines 777-781 and 386-387); else, headless and untied, initialised N(0, 0.02) as lines
    388-390 do (:func:`normal_head`).

    Different from Model Zoo on purpose: its 2.1+ LM-head converters (``*_HF_CS21``) leave a
    tied head that ``save_pretrained`` left out out of the CS file (only its 1.8-2.0 converter
    adds it back, gpt2_hf_cs.py lines 768-790), and Model Zoo's own ``GPT2LMHeadModel`` then
    refuses that file: ``load_state_dict`` (strict, trainer/callbacks/model.py lines 85-99)
    reports ``Missing key(s) in state_dict: "lm_head.weight"``."""
    wte = f"{p}wte.weight"
    if not headless and "lm_head.weight" in hf:
        return [rename("lm_head.weight", "lm_head.weight")]
    if is_tied:
        return [Out("lm_head.weight", (wte,), np.copy, infer=lambda s: s, note="tied to wte")]
    if not headless:
        raise MappingError("lm_head.weight: missing and tie_word_embeddings is false")

    def init(w: np.ndarray) -> np.ndarray:
        return normal_head(w.shape, w.dtype)

    return [Out("lm_head.weight", (wte,), init, infer=lambda s: s, note="new head, N(0, 0.02)")]


def final_norm_copies(p: str) -> list[Out]:
    """CS ``ln_f.*``: the final norm's second name in the CS model (``GPT2LMHeadModel`` registers
    one module as ``ln_f`` and ``transformer_decoder.norm``, models/nlp/gpt2/gpt2_model.py
    lines 911 and 962-972). Model Zoo writes both (``replace_final_norm``, gpt2_hf_cs.py lines
    323-337, in the ``Converter_GPT2Model_HF_CS17`` rules every converter here inherits:
    starcoder.py line 274, santacoder.py line 207, btlm_hf_cs.py lines 36-38, jais_hf_cs.py
    lines 36-38). The same input renamed: the import writes one tensor under both names."""
    return [rename(f"{p}ln_f.{s}", f"ln_f.{s}") for s in ("weight", "bias")]


def lm_head_to_hf(cs: Mapping[str, Shape], p: str, is_tied: bool, headless: bool) -> list[Out]:
    """HF ``wte`` and ``lm_head``. Untied: both renamed (headless: the head is dropped, Model
    Zoo's converter note). Tied: ``lm_head`` is not written (``save_pretrained`` leaves tied
    weights out); ``wte`` is the CS embedding, or ``lm_head`` when the file has only that
    (gpt2_hf_cs.py lines 354-365). A CS ``lm_head`` next to the embedding is a tie
    (:func:`cs_tie_map`): the pipeline checks it equals the embedding. Model Zoo's 2.1+
    converted files have no ``lm_head`` when tied (see :func:`lm_head_to_cs`): read too."""
    emb, head, wte = "embedding_layer.word_embeddings.weight", "lm_head.weight", f"{p}wte.weight"
    if not is_tied:
        return [rename(emb, wte)] + ([] if headless else [rename(head, "lm_head.weight")])
    return [rename(emb if emb in cs or head not in cs else head, wte)]


def _tied(hf_config: Mapping[str, Any]) -> bool:
    return bool(hf_config.get("tie_word_embeddings", True))


def _tied_cs(cs_model: Mapping[str, Any]) -> bool:
    return bool(cs_model.get("share_embedding_weights", True))


def cs_tie_map(cs: Mapping[str, Shape], cs_model: Mapping[str, Any]) -> dict[str, str]:
    """CS tensors that are copies of one the plan reads (no HF tensor of their own): ``ln_f.*``
    of ``transformer_decoder.norm.*`` (:func:`final_norm_copies`; Model Zoo drops them on the
    way to HF, rule ``ln_f`` ``exists="right"``, gpt2_hf_cs.py line 303), and a tied
    ``lm_head.weight`` of the embedding. Only those the file has: a Trainer-saved checkpoint
    (and ours) holds both, Model Zoo's 2.1+ converted one no tied head."""
    ties = {f"ln_f.{s}": f"transformer_decoder.norm.{s}" for s in ("weight", "bias")}
    emb = "embedding_layer.word_embeddings.weight"
    if _tied_cs(cs_model) and emb in cs:
        ties["lm_head.weight"] = emb
    return {k: v for k, v in ties.items() if k in cs and v in cs}


def checked(
    plan: list[Out],
    available: Mapping[str, Shape],
    dropped: re.Pattern[str] | None,
    ties: Mapping[str, str] | None = None,
) -> list[Out]:
    """The plan, or MappingError naming the inputs it lacks or the source tensors no rule
    converts (those ``dropped`` matches are left out on purpose, ``ties`` are copies the
    pipeline checks)."""
    missing = sorted({i for out in plan for i in out.inputs} - set(available))
    if missing:
        raise MappingError(f"missing tensors: {', '.join(missing)}")
    used = {i for out in plan for i in out.inputs} | set(ties or {})
    unknown = [n for n in available if n not in used and not (dropped and dropped.fullmatch(n))]
    if unknown:
        raise MappingError(f"no rule converts: {', '.join(sorted(unknown))}")
    return plan


def finish_to_cs(
    plan: list[Out], hf: Mapping[str, Shape], hf_config: Mapping[str, Any], headless: bool
) -> list[Out]:
    """``plan`` with CS ``ln_f.*`` besides ``transformer_decoder.norm.*``, as Model Zoo writes
    them (:func:`final_norm_copies`), and the head (:func:`lm_head_to_cs`), checked: the HF
    ``attn.bias``/``attn.masked_bias`` buffers are dropped (gpt2_hf_cs.py lines 304-309)."""
    p = hf_prefix(headless)
    plan = plan + final_norm_copies(p) + lm_head_to_cs(hf, p, _tied(hf_config), headless)
    return checked(plan, hf, HF_ATTN_BUFFERS)


def finish_to_hf(
    plan: list[Out], cs: Mapping[str, Shape], cs_model: Mapping[str, Any], headless: bool
) -> list[Out]:
    """``plan`` with ``wte`` and the head (:func:`lm_head_to_hf`), checked: ``ln_f.*`` and a
    tied ``lm_head`` are ties (:func:`cs_tie_map`); exporting a headless model drops CS
    ``lm_head`` (Model Zoo's ``*Model_HF_CS21`` note)."""
    plan = plan + lm_head_to_hf(cs, hf_prefix(headless), _tied_cs(cs_model), headless)
    dropped = re.compile(r"lm_head\.weight") if headless else None
    return checked(plan, cs, dropped, cs_tie_map(cs, cs_model))
