"""StarCoder and its fine-tunes (OctoCoder, WizardCoder, SQLCoder): HF ``GPTBigCodeForCausalLM``
(``-headless``: ``GPTBigCodeModel``) <-> CS ``GPT2LMHeadModel`` configured as StarCoder.

Model Zoo: starcoder.py (tag Release_2.10.0; registry.py lines 300-331 alias the fine-tunes to
it). GPTBigCode uses ``nn.Linear`` (no Conv1D transposes), learned positions and multi-query
attention; ``c_attn`` packs ``[q (hidden), k (head_dim), v (head_dim)]``.

The second half of this module holds the GPT-2 key-layout helpers that ``santacoder.py``,
``btlm.py`` and ``jais.py`` share (Model Zoo's ``Converter_GPT2Model_HF_CS17`` rules, gpt2_hf_cs.py
lines 230-402, which all four converters inherit).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ckpt_migrate.hf.mapping import MappingError, Out, Shape, rename, sections, transpose

NAMES: tuple[str, ...] = (
    "starcoder",
    "starcoder-headless",
    "octocoder",
    "octocoder-headless",
    "wizardcoder",
    "wizardcoder-headless",
    "sqlcoder",
    "sqlcoder-headless",
)
HF_MODEL_TYPES: tuple[str, ...] = ("gpt_bigcode",)

# (HF key, CS key) of the config rules that only rename (starcoder.py lines 407-519).
_RENAMES: tuple[tuple[str, str], ...] = (
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
    ("attention_softmax_in_fp32", "attention_softmax_fp32"),
)
# CS fields the rules accept only with one value (assert_factory_fn, lines 398-519).
_CS_FIXED: dict[str, Any] = {
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
    "scale_qk_dot_by_layer_idx": False,
}
# pre_convert_defaults / post_convert_defaults, starcoder.py lines 522-584.
_HF_PRE = {
    "tie_word_embeddings": True,
    "multi_query": True,
    "attn_pdrop": 0.0,
    "scale_attn_weights": True,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "n_inner": 24576,
    "n_embd": 6144,
    "n_head": 48,
    "n_layer": 40,
    "vocab_size": 49152,
    "n_positions": 8192,
}
_HF_POST = {
    "model_type": "gpt_bigcode",
    "validate_runner_input": True,
    "use_cache": True,
    "transformers_version": "4.28.1",
    "summary_use_proj": True,
    "summary_type": "cls_index",
    "inference_runner": 0,
    "eos_token_id": 0,
    "bos_token_id": 0,
    "max_sequence_length": None,
    "max_batch_size": None,
}
_CS_PRE = {
    "share_embedding_weights": True,
    "attention_dropout_rate": 0.0,
    "attention_module": "multiquery_attention",
    "attention_type": "scaled_dot_product",
    "scale_qk_dot_by_layer_idx": False,
    "dropout_rate": 0.0,
    "embedding_dropout_rate": 0.0,
    "filter_size": 24576,
    "hidden_size": 6144,
    "max_position_embeddings": 8192,
    "num_heads": 48,
    "num_hidden_layers": 40,
    "vocab_size": 49152,
}
_CS_POST = {
    "position_embedding_type": "learned",
    "use_projection_bias_in_attention": True,
    "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True,
    "nonlinearity": "gelu",
    "use_bias_in_output": False,
    "loss_scaling": "num_tokens",
}


def config_to_cs(hf_config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: starcoder.py lines 394-645 (``ConfigConverter_StarcoderModel_HF_CS20``, which
    the CS21 class keeps, lines 665-689). ``n_inner: null`` becomes ``4 * n_embd`` (lines
    637-639); ``scale_attn_weights`` and ``multi_query`` give ``attention_type``,
    ``attention_module`` and ``extra_attention_params`` (lines 595-608). HF keys no rule names
    are dropped, as ``drop_unmatched_keys`` does."""
    check_name(name, NAMES)
    hf = with_defaults(hf_config, _HF_PRE)
    expect(hf, "model_type", ("gpt_bigcode",), "HF")
    if hf.get("n_inner") is None:
        hf["n_inner"] = 4 * hf["n_embd"]
    cs = {c: hf[h] for h, c in _RENAMES if h in hf}
    cs["attention_type"] = "scaled_dot_product" if hf["scale_attn_weights"] else "dot_product"
    cs["attention_module"] = "multiquery_attention" if hf["multi_query"] else "aiayn_attention"
    if hf["multi_query"]:
        cs["extra_attention_params"] = {"num_kv_groups": 1}
    return {**cs, **{k: v for k, v in _CS_POST.items() if k not in cs}}


def config_to_hf(cs_model: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Model Zoo: starcoder.py lines 394-645, CS -> HF: the fixed-value fields are asserted,
    ``attention_type`` gives ``scale_attn_weights`` and ``attention_module`` ``multi_query``
    (lines 609-627). muP configs are refused (Model Zoo would first convert them to sP, mup.py;
    not implemented), as are KV groups other than 1 (GPTBigCode has MQA or MHA only)."""
    headless = check_name(name, NAMES)
    cs = with_defaults(cs_model, _CS_PRE)
    for key, value in _CS_FIXED.items():
        if key in cs:
            expect(cs, key, (value,), "CS")
    reject_mup(cs)
    if cs["attention_type"] not in ("scaled_dot_product", "dot_product"):
        raise MappingError(f"attention_type={cs['attention_type']!r} is not supported")
    multi_query = cs["attention_module"] == "multiquery_attention"
    groups = (cs.get("extra_attention_params") or {}).get("num_kv_groups", 1)
    if multi_query and groups != 1:
        raise MappingError(f"extra_attention_params.num_kv_groups={groups} is not supported")
    hf = {h: cs[c] for h, c in _RENAMES if c in cs}
    hf["scale_attn_weights"] = cs["attention_type"] == "scaled_dot_product"
    hf["multi_query"] = multi_query
    arch = "GPTBigCodeModel" if headless else "GPTBigCodeForCausalLM"
    return {**hf, "architectures": [arch], **{k: v for k, v in _HF_POST.items() if k not in hf}}


def _shape(hf_config: Mapping[str, Any]) -> tuple[int, int, int, int, bool]:
    cfg = with_defaults(hf_config, _HF_PRE)
    embed, heads = cfg["n_embd"], cfg["n_head"]
    return cfg["n_layer"], embed, heads, embed // heads, bool(cfg["multi_query"])


def _pairs(p: str, layers: int) -> list[Pair]:
    """Every tensor that is only renamed: ``Linear`` both sides, so no transposes (Model Zoo:
    starcoder.py lines 278-279 ``ffn_converter`` is ``replaceKey``, lines 43-48 ``c_proj``)."""
    pairs = embedding_pairs(p, learned=True) + final_norm_pairs(p)
    for i in range(layers):
        h, c = hf_layer(p, i), cs_layer(i)
        pairs += layer_norm_pairs(h, c)
        pairs += both(f"{h}attn.c_proj", f"{c}self_attn.proj_output_dense_layer", False)
        pairs += both(f"{h}mlp.c_fc", f"{c}ffn.ffn.0.linear_layer", False)
        pairs += both(f"{h}mlp.c_proj", f"{c}ffn.ffn.1.linear_layer", False)
    return pairs


def _qkv(c: str, suffix: str) -> list[str]:
    return [f"{c}self_attn.proj_{x}_dense_layer.{suffix}" for x in "qkv"]


def plan_to_cs(hf: Mapping[str, Shape], hf_config: Mapping[str, Any], name: str) -> list[Out]:
    """CS tensors from GPTBigCode. ``c_attn`` splits as starcoder.py lines 98-168 do: MQA rows
    ``[:hidden]``, then two ``head_dim`` halves; MHA rows interleaved per head
    ``[q_h, k_h, v_h]`` (the index lists of lines 143-164). ``ln_f.*`` is written besides
    ``transformer_decoder.norm.*``, as Model Zoo does (:func:`final_norm_copies`); the head as
    :func:`lm_head_to_cs`."""
    headless = check_name(name, NAMES)
    p = hf_prefix(headless)
    layers, embed, heads, d_head, mq = _shape(hf_config)
    plan = pairs_to_cs(_pairs(p, layers))
    for i in range(layers):
        for suffix in ("weight", "bias"):
            src = f"{hf_layer(p, i)}attn.c_attn.{suffix}"
            q, k, v = _qkv(cs_layer(i), suffix)
            rows = embed + 2 * d_head if mq else 3 * embed
            if src in hf and hf[src][0] != rows:
                raise MappingError(f"{src}: {hf[src]} does not pack Q, K and V ({rows} rows)")
            if mq:
                bounds = (0, embed, embed + d_head, embed + 2 * d_head)
                pieces = zip((q, k, v), bounds, bounds[1:])
                plan += [sections(src, dst, a, b) for dst, a, b in pieces]
            else:
                plan += [_unpack_mha(src, dst, j, heads) for j, dst in enumerate((q, k, v))]
    plan += final_norm_copies(p) + lm_head_to_cs(hf, p, tied(hf_config), headless)
    return checked(plan, hf, HF_ATTN_BUFFERS)


def plan_to_hf(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> list[Out]:
    """GPTBigCode tensors from CS: Q, K and V concatenated (MQA) or interleaved per head (MHA),
    starcoder.py lines 170-235; the head as gpt2_hf_cs.py lines 354-365 (see
    :func:`lm_head_to_hf`); ``ln_f.*`` and a tied ``lm_head`` are ties (:func:`cs_ties`)."""
    headless = check_name(name, NAMES)
    p = hf_prefix(headless)
    hf_config = config_to_hf(cs_model, name)
    layers, _, heads, _, mq = _shape(hf_config)
    plan = pairs_to_hf(_pairs(p, layers))
    for i in range(layers):
        for suffix in ("weight", "bias"):
            dst = f"{hf_layer(p, i)}attn.c_attn.{suffix}"
            qkv = _qkv(cs_layer(i), suffix)
            plan.append(concat_rows(qkv, dst) if mq else _pack_mha(qkv, dst, heads))
    plan += lm_head_to_hf(cs, p, tied_cs(cs_model), headless)
    return checked(plan, cs, head_dropped(headless), cs_tie_map(cs, tied_cs(cs_model)))


def cs_ties(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """The pipeline hook: CS copies it checks equal to the tensor the plan reads
    (:func:`cs_tie_map`)."""
    check_name(name, NAMES)
    return cs_tie_map(cs, tied_cs(cs_model))


def cs_dropped(cs: Mapping[str, Shape], cs_model: Mapping[str, Any], name: str) -> dict[str, str]:
    """The pipeline hook: an untied headless ``lm_head`` (:func:`head_dropped_map`)."""
    return head_dropped_map(cs, tied_cs(cs_model), check_name(name, NAMES))


def _unpack_mha(src: str, dst: str, index: int, heads: int) -> Out:
    def build(x: np.ndarray) -> np.ndarray:
        per_head = x.reshape(heads, 3, x.shape[0] // (3 * heads), *x.shape[1:])
        return np.ascontiguousarray(per_head[:, index].reshape(x.shape[0] // 3, *x.shape[1:]))

    return Out(dst, (src,), build, infer=lambda s: (s[0] // 3, *s[1:]), note="MHA unpacked")


def _pack_mha(srcs: Sequence[str], dst: str, heads: int) -> Out:
    def build(*xs: np.ndarray) -> np.ndarray:
        rest = xs[0].shape[1:]
        per_head = [x.reshape(heads, x.shape[0] // heads, *rest) for x in xs]
        return np.stack(per_head, axis=1).reshape(3 * xs[0].shape[0], *rest)

    return Out(dst, tuple(srcs), build, infer=lambda s, *_: (3 * s[0], *s[1:]), note="MHA packed")


# ---- GPT-2 key layout, shared by santacoder.py, btlm.py and jais.py -------------------------

Pair = tuple[str, str, bool]  # (HF name, CS name, Conv1D: transposed)
# HF attention buffers the GPT-2 rules drop (gpt2_hf_cs.py lines 304-309, exists="left").
HF_ATTN_BUFFERS = re.compile(r"(?:transformer\.)?h\.\d+\.attn\.(?:masked_bias|bias)")
MUP_FIELDS = ("output_logits_scale", "scale_qk_dot_by_d", "output_logits_alpha")


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


def pairs_to_cs(pairs: Sequence[Pair]) -> list[Out]:
    return [transpose(h, c) if t else rename(h, c) for h, c, t in pairs]


def pairs_to_hf(pairs: Sequence[Pair]) -> list[Out]:
    """The inverse renames, but for ``wte``, which :func:`lm_head_to_hf` writes (ties)."""
    skip = "embedding_layer.word_embeddings.weight"
    return [transpose(c, h) if t else rename(c, h) for h, c, t in pairs if c != skip]


def concat_rows(srcs: Sequence[str], dst: str) -> Out:
    """Pieces stacked along dim 0 (a ``Linear`` ``[out, in]`` weight or a bias)."""

    def infer(*shapes: Shape) -> Shape:
        return (sum(s[0] for s in shapes), *shapes[0][1:])

    return Out(dst, tuple(srcs), lambda *xs: np.concatenate(xs, axis=0), infer=infer, note="fused")


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


def tied(hf_config: Mapping[str, Any]) -> bool:
    return bool(hf_config.get("tie_word_embeddings", True))


def tied_cs(cs_model: Mapping[str, Any]) -> bool:
    return bool(cs_model.get("share_embedding_weights", True))


def lm_head_to_cs(hf: Mapping[str, Shape], p: str, is_tied: bool, headless: bool) -> list[Out]:
    """CS ``lm_head.weight``, always written (the CS ``GPT2LMHeadModel`` has one). From HF
    ``lm_head.weight`` when the file has it (rule ``lm_head`` ``replaceKey``, gpt2_hf_cs.py
    lines 1085-1088, starcoder.py lines 755-758, santacoder.py lines 503-506, btlm_hf_cs.py
    lines 433-436, jais_hf_cs.py lines 436-439); else, tied, a copy of ``wte`` (gpt2_hf_cs.py
    lines 777-781 and 386-387); else, headless and untied, initialised N(0, 0.02) as lines
    388-390 do (seeded: reproducible).

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
        return np.random.default_rng(0).normal(0.0, 0.02, w.shape).astype(w.dtype)

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


def cs_tie_map(cs: Mapping[str, Shape], is_tied: bool) -> dict[str, str]:
    """CS tensors that are copies of one the plan reads (no HF tensor of their own): ``ln_f.*``
    of ``transformer_decoder.norm.*`` (:func:`final_norm_copies`; Model Zoo drops them on the
    way to HF, rule ``ln_f`` ``exists="right"``, gpt2_hf_cs.py line 303), and a tied
    ``lm_head.weight`` of the embedding. Only those the file has: a Trainer-saved checkpoint
    (and ours) holds both, Model Zoo's 2.1+ converted one no tied head."""
    ties = {f"ln_f.{s}": f"transformer_decoder.norm.{s}" for s in ("weight", "bias")}
    emb = "embedding_layer.word_embeddings.weight"
    if is_tied and emb in cs:
        ties["lm_head.weight"] = emb
    return {k: v for k, v in ties.items() if k in cs and v in cs}


def head_dropped_map(cs: Mapping[str, Shape], is_tied: bool, headless: bool) -> dict[str, str]:
    """The ``cs_dropped`` hook: exporting a headless model drops an untied CS ``lm_head``
    (Model Zoo's ``*Model_HF_CS21`` converter note; a tied one is a tie, checked)."""
    if not headless or "lm_head.weight" in cs_tie_map(cs, is_tied):
        return {}
    why = "the headless HF model has no lm_head (Model Zoo drops it)"
    return {k: why for k in ("lm_head.weight",) if k in cs}


def head_dropped(headless: bool) -> re.Pattern[str] | None:
    """Exporting a headless model drops CS ``lm_head`` (Model Zoo's ``*Model_HF_CS21`` note)."""
    return re.compile(r"lm_head\.weight") if headless else None


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


def with_defaults(config: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Model Zoo's ``pre_convert_defaults``: a key the config lacks takes the default."""
    return {**defaults, **config}


def expect(config: Mapping[str, Any], key: str, allowed: Sequence[Any], side: str) -> None:
    """Model Zoo's ``assert_factory_fn`` (base_converter.py lines 1603-1640)."""
    if key in config and config[key] not in allowed:
        raise MappingError(f"{side} {key}={config[key]!r} is not supported (only {allowed})")


def reject_mup(cs_model: Mapping[str, Any]) -> None:
    """muP CS configs (mup.py lines 861-884): Model Zoo converts them to sP before export to
    models whose HF class has no muP; that is not implemented here."""
    found = [k for k, v in cs_model.items() if k.startswith("mup_base_") and v is not None]
    found += [k for k in MUP_FIELDS if cs_model.get(k)]
    if cs_model.get("embeddings_scale") not in (None, 1, 1.0):
        found.append("embeddings_scale")
    if found:
        raise MappingError(f"muP config field {found[0]} is not supported for this model")
