"""Model families: their names and aliases, their key vocabulary, and detection from key names.

Names follow the Model Zoo converter registry (MODELZOO_HISTORY.md §3.5: ``gpt2``, ``gptj``,
``gpt-neox``, ``codegen``, ``llama`` (+ ``llamaV2``, ``code-llama``, ``wizardlm``), ``bloom``,
``falcon``, ``bert`` (+ its fine-tuning variants), ``t5`` (+ ``transformer``, ``ul2``,
``flan-ul2``)). The key names are the Cerebras ones used since 1.7, from the HF↔CS converters
(§3.5 "CS naming used since 1.7 for decoder LMs" and the 1.6→1.7 BERT and T5 tables;
``f1fd1e0:src/cerebras/modelzoo/tools/checkpoint_converters/{gpt2_hf_cs,gptj_hf_cs,llama,
bloom_hf_cs,bert,t5}.py``): every decoder LM is a ``GPT2LMHeadModel`` configured per family, so
the families differ only in which optional keys exist (biases, a gated FFN, a second norm,
learned positions, ALiBi slopes, an embedding norm).

Detection reads key names only, never tensor data. Each family has a signature: which of those
features its keys show. The confidence is the share of the signature that matches, divided
among families that match equally well (GPT-J and CodeGen keys are identical: their key steps
are too). Below :data:`MIN_CONFIDENCE` the model is "unknown": it still gets every step that is
not model-specific, and the model-specific ones say they were skipped.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.models.keys import KeyPattern, matches_any, model_keys, split_prefix
from ckpt_migrate.models.names import FAMILIES, canonical_family

MIN_CONFIDENCE = 0.5


# --------------------------------------------------------------------------- key vocabulary

_NORM = catalogue.layouts.NORM
VOCABULARY: dict[str, tuple[KeyPattern, ...]] = {
    r.name: tuple(KeyPattern(p) for p in (*r.layout.keys, *r.extra_keys))
    for r in catalogue.families()
    if r.layout is not None
}


def unknown_keys(keys: Iterable[str], family: str) -> list[str]:
    """Keys the family's vocabulary does not know (a 2.2+ sparsity ``<w>_mask`` is known when
    ``<w>`` is). A family without a key table (``KEYLESS``) knows every key."""
    vocabulary = VOCABULARY.get(family)
    if vocabulary is None:
        return []
    out = []
    for key in keys:
        probe = key[: -len("_mask")] if key.endswith("_mask") else key
        if matches_any(probe, vocabulary) is None:
            out.append(key)
    return out


# --------------------------------------------------------------------------- detection


@dataclass(frozen=True)
class Feature:
    what: str  # for the evidence: what the keys show
    patterns: tuple[str, ...]

    def first_key(self, keys: list[str], lines: str | None = None) -> str | None:
        """The first of ``keys`` (without or with the ``model.`` prefix) a pattern matches.
        ``lines``: the keys without that prefix, one per line (``key_lines``): then one
        regular expression scans them all (150k keys: ms, where a match per key took s)."""
        if lines is not None:
            if all(word is not None and word not in lines for word in _literals(self.patterns)):
                return None  # (a key no pattern's literal text is in: no expression run)
            found = _one_regex(self.patterns).search(lines)
            return None if found is None else keys[lines.count("\n", 0, found.start())]
        compiled = [KeyPattern(p) for p in self.patterns]
        return next((k for k in keys if matches_any(k, compiled) is not None), None)


def key_lines(keys: list[str]) -> str | None:
    """``keys`` without their ``model.`` prefix, one per line, for ``Feature.first_key``;
    None when a key holds a line break."""
    lines = "\n".join(split_prefix(k)[1] for k in keys)
    return None if lines.count("\n") != len(keys) - 1 else lines


@functools.cache
def _literals(patterns: tuple[str, ...]) -> tuple[str | None, ...]:
    """Each pattern's longest run of literal segments (no ``{..}``, ``#``, ``*``, ``**``),
    which every key it matches holds; None for a pattern with none. Looked for before the
    expression, which took 4-5 ms a feature over 37k keys that none of them match."""
    out: list[str | None] = []
    for pattern in patterns:
        runs, run = [], []
        for segment in pattern.split("."):
            if "{" in segment or segment in ("#", "*", "**"):
                runs.append(".".join(run))
                run = []
            else:
                run.append(segment)
        runs.append(".".join(run))
        longest = max(runs, key=len)
        out.append(longest or None)
    return tuple(out)


@functools.cache
def _one_regex(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """One expression for a key matching any of ``patterns``, anchored to whole lines."""
    return re.compile("|".join(f"^{KeyPattern(p).expression}$" for p in patterns), re.MULTILINE)


FEATURES: dict[str, Feature] = {
    "decoder": Feature("decoder layers", ("transformer_decoder.layers.#.**",)),
    "absolute_positions": Feature(
        "absolute position embeddings",
        ("embedding_layer.position_embeddings", "embedding_layer.position_embeddings.**"),
    ),
    "alibi": Feature(
        "ALiBi slopes",
        ("relative_pe_helper.slopes", "embedding_layer.position_embed_helper.slopes"),
    ),
    "embedding_norm": Feature("an embedding layer norm", (f"embedding_ln_f.{_NORM}",)),
    "gated_ffn": Feature(
        "a gated FFN (SwiGLU)", ("transformer_decoder.layers.#.ffn.ffn.#.linear_layer_for_glu.**",)
    ),
    "second_norm": Feature(
        "a second norm per layer (sequential attention/FFN)",
        (f"transformer_decoder.layers.#.norm3.{_NORM}",),
    ),
    "norm_bias": Feature("layer-norm biases", ("transformer_decoder.layers.#.norm1.bias",)),
    "attention_bias": Feature(
        "attention projection biases", ("transformer_decoder.layers.#.self_attn.*.bias",)
    ),
    "ffn_bias": Feature(
        "FFN biases", ("transformer_decoder.layers.#.ffn.ffn.#.linear_layer.bias",)
    ),
    "head_bias": Feature("an LM-head bias", ("lm_head.bias",)),
    "bert_encoder": Feature(
        "a BERT encoder",
        ("{bert_encoder,bert}.embedding_layer.**", "{bert_encoder,bert}.transformer_encoder.**"),
    ),
    "bert_segments": Feature(
        "segment embeddings and an embedding norm",
        (
            "{bert_encoder,bert}.embedding_layer.segment_embeddings.weight",
            f"{{bert_encoder,bert}}.embed_ln_f.{_NORM}",
        ),
    ),
    "bert_heads": Feature(
        "BERT pre-training heads or pooler",
        ("bert_mlm_head.**", "bert_cls_head.**", "{bert_encoder,bert}.pooler.**"),
    ),
    "encoder_decoder_embeddings": Feature(
        "encoder and decoder embeddings", ("{encoder,decoder}_embeddings.**",)
    ),
    "encoder_layers": Feature("encoder layers", ("encoder.layers.#.**",)),
    "cross_attention": Feature("decoder cross-attention", ("decoder.layers.#.multihead_attn.**",)),
    "moe": Feature("mixture-of-experts FFNs", catalogue.layouts.MOE_KEYS),
    "post_norms": Feature("post-attention/FFN norms", catalogue.layouts.POST_NORM_KEYS),
}

# Each family's signature: feature -> whether its keys show it. Anchors (first) must be present.
SIGNATURES: dict[str, tuple[tuple[str, ...], dict[str, bool]]] = {
    r.name: (r.signature.anchors, r.signature.expected)
    for r in catalogue.families()
    if r.signature is not None
}
# Families with one signature: their keys are the same (CodeGen is GPT-J's model).
SAME_KEYS = {
    a: b for a in SIGNATURES for b in SIGNATURES if a != b and SIGNATURES[a] == SIGNATURES[b]
}


@dataclass
class FamilyGuess:
    """What the keys say: the family (None when unknown), how sure, and which keys decided."""

    family: str | None
    confidence: float
    evidence: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "confidence": self.confidence, "evidence": self.evidence}


def detect_family(keys: Iterable[str]) -> FamilyGuess:
    """Guess the model family from state-dict key names (with or without the ``model.`` prefix).

    See the module docstring for the scoring. Evidence names the keys that decided, and what
    told the winner apart from the runner-up.
    """
    keys = [k for k in keys if isinstance(k, str)]
    if not keys:
        return FamilyGuess(None, 0.0, ["no model keys"])
    original: dict[str, str] = {}
    for key in keys:
        original.setdefault(split_prefix(key)[1], key)
    bare = list(original)
    lines = key_lines(bare)
    found = {name: original.get(f.first_key(bare, lines) or "") for name, f in FEATURES.items()}
    scores: dict[str, float] = {}
    for family in (f for f in FAMILIES if f in SIGNATURES):
        anchors, expected = SIGNATURES[family]
        if not all(found[a] for a in anchors):
            continue
        hits = sum((found[f] is not None) == want for f, want in expected.items())
        scores[family] = (hits + len(anchors)) / (len(expected) + len(anchors))
    if not scores:
        return FamilyGuess(
            None,
            0.0,
            [
                "no family's anchor keys found (transformer_decoder.layers.N…, "
                "bert_encoder.…/bert.…, encoder_embeddings.…/decoder_embeddings.…)"
            ],
        )
    ranked = sorted(scores, key=lambda f: (-scores[f], FAMILIES.index(f)))
    best = ranked[0]
    tied = [f for f in ranked if scores[f] == scores[best]]
    confidence = round(scores[best] / len(tied), 2)
    evidence = _evidence(best, ranked, found)
    if len(tied) > 1:
        same = all(SAME_KEYS.get(best) == f for f in tied[1:])
        note = " (same key layout: the key steps are identical)" if same else ""
        evidence.append(f"matches {', '.join(tied[1:])} equally well{note}")
    if scores[best] < 1:
        misses = [
            FEATURES[f].what
            for f, want in SIGNATURES[best][1].items()
            if (found[f] is None) == want
        ]
        evidence.append(f"unlike {best}: {'; '.join(misses)}")
    if confidence < MIN_CONFIDENCE:
        evidence.insert(0, f"closest: {best} ({confidence:.2f})")
        return FamilyGuess(None, confidence, evidence)
    return FamilyGuess(best, confidence, evidence)


def _evidence(best: str, ranked: list[str], found: dict[str, str | None]) -> list[str]:
    anchors, expected = SIGNATURES[best]
    runner = next((f for f in ranked[1:] if SIGNATURES[f] != SIGNATURES[best]), None)
    decisive = [
        f
        for f, want in expected.items()
        if runner is not None and SIGNATURES[runner][1].get(f, want) != want
    ]
    lines = [f"{FEATURES[a].what}: {found[a]}" for a in anchors]
    for f in decisive or list(expected)[:2]:
        want = expected[f]
        if (found[f] is not None) != want:
            continue
        if want:
            lines.append(f"{FEATURES[f].what}: {found[f]}")
        else:
            lines.append(f"no {FEATURES[f].what} (no key like {FEATURES[f].patterns[0]})")
    if runner is not None and decisive:
        told = ", ".join(FEATURES[f].what for f in decisive)
        lines.append(f"told apart from {runner} by: {told}")
    return lines


# --------------------------------------------------------------------------- the choice


@dataclass
class FamilyChoice:
    """The family an upgrade uses: from ``--model`` or detected; and the detector's guess."""

    family: str | None
    variant: str | None
    source: str  # "--model" | "detected" | "unknown"
    guess: FamilyGuess

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "variant": self.variant,
            "source": self.source,
            "detected": self.guess.to_json(),
            "summary": self.describe(),
        }

    def warnings(self) -> list[str]:
        """A ``--model`` that the keys clearly contradict."""
        g = self.guess
        if (
            self.source == "--model"
            and g.family is not None
            and g.family != self.family
            and SAME_KEYS.get(g.family) != self.family
            and g.confidence >= 0.8
        ):
            return [
                f"--model {self.variant or self.family} given, but the keys look like "
                f"{g.family} (confidence {g.confidence:.2f}: {'; '.join(g.evidence[:2])}); "
                f"the {self.family} key steps are applied as asked"
            ]
        return []

    def describe(self) -> str:
        g = self.guess
        why = "; ".join(g.evidence[:4])
        if self.source == "--model":
            name = self.family + (f" ({self.variant})" if self.variant else "")
            seen = f"detected {g.family} ({g.confidence:.2f})" if g.family else "not detected"
            return f"{name} (from --model; the keys: {seen})"
        if self.family is None:
            return f"unknown (confidence {g.confidence:.2f}: {why})"
        return f"{self.family} (detected, confidence {g.confidence:.2f}: {why})"


def choose_family(root: Any, requested: str | None = None) -> FamilyChoice:
    """The family for ``root``'s model: ``requested`` (a name or alias) wins over detection."""
    guess = detect_family(model_keys(root))
    if requested:
        family, variant = canonical_family(requested)
        return FamilyChoice(family, variant, "--model", guess)
    if guess.family is None:
        return FamilyChoice(None, None, "unknown", guess)
    return FamilyChoice(guess.family, None, "detected", guess)


def family_of(inputs: Mapping[str, Any]) -> FamilyChoice | None:
    """The choice the engine put in a step's inputs (None outside an upgrade)."""
    choice = inputs.get("model_family")
    return choice if isinstance(choice, FamilyChoice) else None
