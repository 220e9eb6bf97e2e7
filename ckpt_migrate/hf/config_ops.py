"""The named operations of the Hugging Face config tables that the GPT-2-like families use
(``catalogue/gpt2_config.py``), and the :class:`State` every operation reads and writes: each
operation is a pair, what it does exporting (reading the CS ``model:`` section) and importing
(reading ``config.json``); ``None``: nothing that way. Model Zoo's converter each one reproduces
is cited on it (tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.hf import mup
from ckpt_migrate.hf.mapping import MappingError

Fn = Callable[..., None] | None


@dataclass
class State:
    """One run: the side read (``CS`` exporting, ``HF`` importing), the source, the output."""

    side: str
    src: dict[str, Any]
    out: dict[str, Any]
    name: str
    record: catalogue.Record | None  # None: a part's table (catalogue/parts_config.py)


def _refuse_mup(s: State, as_name: str | None = None) -> None:
    """muP the export did not fold is refused, naming the field (``hf/mup.py``): the muP of
    the name, or of ``as_name``."""
    mup.refuse(s.src, as_name or s.name)


def _architecture(
    s: State, model_type: bool = False, classes: tuple[str, str] | None = None
) -> None:
    """``architectures``: the HF class of the name (headless or not: the record's, or of
    ``classes``, (LM head class, headless class)), and with ``model_type`` the record's first
    model type."""
    record, hf = s.record, s.record.hf
    assert hf is not None
    headless = next(n.headless for n in record.names if n.name == s.name)
    if classes is None:  # a name's own class first (BERT's fine-tuning models)
        key = f"{record.name}-headless" if headless else record.name
        s.out["architectures"] = [hf.architectures.get(s.name) or hf.architectures[key]]
    else:
        s.out["architectures"] = [classes[headless]]
    if model_type:
        s.out["model_type"] = hf.model_types[0]


def _dropouts(s: State) -> None:
    """gpt2_hf_cs.py lines 651-655: the embedding and attention dropouts default to
    ``dropout_rate``."""
    for key in ("embedding_dropout_rate", "attention_dropout_rate"):
        if key not in s.src and "dropout_rate" in s.src:
            s.src[key] = s.src["dropout_rate"]


def _n_inner(s: State) -> None:
    """gpt2_hf_cs.py lines 648-650: ``n_inner: null`` is ``4 * n_embd``."""
    if s.src.get("n_inner") is None:
        s.src["n_inner"] = 4 * s.src["n_embd"]


_ATTENTION = ("scaled_dot_product", "dot_product")


def _attention_to_hf(s: State, message: str, always: bool = False) -> None:
    """gpt2_hf_cs.py lines 624-638: ``attention_type`` gives ``scale_attn_weights``; ``always``:
    an absent one is scaled."""
    if not always and "attention_type" not in s.src:
        return
    kind = s.src.get("attention_type", _ATTENTION[0])
    if kind not in _ATTENTION:
        raise MappingError(message.format(got=kind))
    s.out["scale_attn_weights"] = kind == _ATTENTION[0]


def _attention_to_cs(s: State, message: str, always: bool = False) -> None:
    """gpt2_hf_cs.py lines 618-623: ``scale_attn_weights`` gives ``attention_type``."""
    if always or "scale_attn_weights" in s.src:
        s.out["attention_type"] = _ATTENTION[0 if s.src.get("scale_attn_weights", True) else 1]


def _multi_query_to_hf(s: State) -> None:
    """starcoder.py lines 609-627: ``attention_module`` gives ``multi_query``; GPTBigCode has
    one key/value head or one per head."""
    multi_query = s.src["attention_module"] == "multiquery_attention"
    groups = (s.src.get("extra_attention_params") or {}).get("num_kv_groups", 1)
    if multi_query and groups != 1:
        raise MappingError(f"extra_attention_params.num_kv_groups={groups} is not supported")
    s.out["multi_query"] = multi_query


def _multi_query_to_cs(s: State) -> None:
    """starcoder.py lines 595-608."""
    multi_query = s.src["multi_query"]
    s.out["attention_module"] = "multiquery_attention" if multi_query else "aiayn_attention"
    if multi_query:
        s.out["extra_attention_params"] = {"num_kv_groups": 1}


def _positions(s: State, allowed: tuple[str, ...]) -> None:
    """The position embeddings the HF class implements (btlm_hf_cs.py lines 150-160)."""
    kind = s.src.get("position_embedding_type", "learned")
    if kind not in allowed:
        raise MappingError(f"position_embedding_type={kind!r} is not supported (only {allowed})")


def swiglu(activation: str) -> bool:
    """Whether ``activation`` is SwiGLU; btlm_hf_cs.py: a GLU other than SwiGLU has no HF
    BTLM/JAIS equivalent."""
    if activation.endswith("glu") and activation != "swiglu":
        raise MappingError(f"nonlinearity={activation!r} is not supported (HF has swiglu only)")
    return activation == "swiglu"


def _swiglu(s: State) -> None:
    swiglu(s.src.get("nonlinearity", "gelu"))


def _alibi_to_hf(s: State) -> None:
    """btlm_hf_cs.py lines 299-351: ``pos_scaling_factor`` 1.0 is no ``alibi_scaling``."""
    factor = s.src["pos_scaling_factor"]
    s.out["alibi_scaling"] = None if factor == 1.0 else {"type": "linear", "factor": factor}


def _alibi_to_cs(s: State) -> None:
    """btlm_hf_cs.py lines 299-351: a fixed linear factor only."""
    scaling = s.src["alibi_scaling"]
    if scaling is not None and scaling.get("train_seq_len") is not None:
        raise MappingError("alibi_scaling.train_seq_len (dynamic linear scaling) is not supported")
    s.out["pos_scaling_factor"] = 1.0 if scaling is None else scaling["factor"]


def _mup_output_to_hf(s: State) -> None:
    """btlm_hf_cs.py lines 263-280: ``output_logits_scale / decoder_kernel`` is
    ``mup_output_alpha``, ``decoder_kernel`` ``mup_width_scale``."""
    if "output_logits_scale" in s.src:
        s.out["mup_output_alpha"] = s.src["output_logits_scale"] / s.src["decoder_kernel"]
        s.out["mup_width_scale"] = s.src["decoder_kernel"]


def _mup_output_to_cs(s: State) -> None:
    """btlm_hf_cs.py lines 203-283: ``output_logits_scale = mup_output_alpha *
    mup_width_scale``."""
    if "mup_output_alpha" in s.src:
        s.out["output_logits_scale"] = s.src["mup_output_alpha"] * s.src["mup_width_scale"]


def _one_class(s: State) -> None:
    """A ``config.json`` naming another class than the name's (CLIP-ViT: Model Zoo's converter
    is ``CLIPVisionModelWithProjection``'s, registry.py line 223, whose ``visual_projection``
    is the CS classifier)."""
    hf = s.record.hf
    assert hf is not None
    wanted = hf.architectures[s.name]
    for cls in s.src.get("architectures") or [wanted]:
        if cls != wanted:
            raise MappingError(
                f"architectures={cls!r}: Model Zoo's {s.name} converter is {wanted}'s "
                "(registry.py line 223), whose visual_projection is the CS classifier"
            )


def _square_to_hf(s: State, pairs: tuple[tuple[str, str], ...]) -> None:
    """vit.py lines 576-589: a CS ``[s, s]`` is HF ``s``; a non-square one is refused."""
    for h, c in pairs:
        if c in s.src:
            width, height = s.src[c]
            if width != height:
                raise MappingError(f"{c}={s.src[c]!r}: HF CLIP needs a square {h}")
            s.out[h] = width


def _square_to_cs(s: State, pairs: tuple[tuple[str, str], ...]) -> None:
    s.out.update({c: [s.src[h], s.src[h]] for h, c in pairs})


def _activation_to_hf(s: State, spellings: dict[str, str]) -> None:
    """``nonlinearity`` <-> ``hidden_act`` where the spellings differ (``spellings``: HF ->
    CS; vit.py lines 591-623)."""
    if "nonlinearity" in s.src:
        to_hf = {cs: hf for hf, cs in spellings.items()}
        s.out["hidden_act"] = to_hf.get(s.src["nonlinearity"], s.src["nonlinearity"])


def _activation_to_cs(s: State, spellings: dict[str, str]) -> None:
    s.out["nonlinearity"] = spellings.get(s.src["hidden_act"], s.src["hidden_act"])


OPS: dict[str, tuple[Fn, Fn]] = {
    "refuse mup": (_refuse_mup, None),
    "architecture": (_architecture, None),
    "dropouts": (_dropouts, None),
    "n_inner": (None, _n_inner),
    "attention type": (_attention_to_hf, _attention_to_cs),
    "multi query": (_multi_query_to_hf, _multi_query_to_cs),
    "positions": (_positions, _positions),
    "swiglu": (_swiglu, None),
    "alibi scaling": (_alibi_to_hf, _alibi_to_cs),
    "mup output": (_mup_output_to_hf, _mup_output_to_cs),
    "one class": (None, _one_class),
    "square": (_square_to_hf, _square_to_cs),
    "activation": (_activation_to_hf, _activation_to_cs),
}
