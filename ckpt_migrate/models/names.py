"""The one table of model names: every name ``--model``, ``convert_checkpoint.py`` and a config's
own model name may use, with the family whose steps apply and Model Zoo's registry name.

Families (the key layouts ckpt-migrate has steps for): GPT-2/3, GPT-J, GPT-NeoX, CodeGen, LLaMA,
BLOOM, Falcon, BERT and T5 (MODELZOO_HISTORY.md §3.5). Registry names: Cerebras/modelzoo
``src/cerebras/modelzoo/registry/registry.yaml``, written as ``trainer.init.model.name`` from
2.4 on; GPT-NeoX configs run as ``gptj`` in Model Zoo's own trainer-layout configs
(``models/nlp/gptj/configs/params_gpt_neox_*.yaml``). No registry entry exists for CodeGen,
BERT QA, UL2 or Flan-UL2 (None).
"""

from __future__ import annotations

from ckpt_migrate.errors import UsageError

FAMILIES: tuple[str, ...] = (
    "gpt2",
    "gptj",
    "gpt-neox",
    "codegen",
    "llama",
    "bloom",
    "falcon",
    "bert",
    "t5",
)
# Decoder LMs: one GPT2LMHeadModel key layout, configured per family.
GPT_STYLE: tuple[str, ...] = ("gpt2", "gptj", "gpt-neox", "codegen", "llama", "bloom", "falcon")

# name (lower case) -> (family, registry name or None)
MODEL_NAMES: dict[str, tuple[str, str | None]] = {
    "gpt2": ("gpt2", "gpt2"),
    "gpt3": ("gpt2", "gpt3"),
    "gptj": ("gptj", "gptj"),
    "gpt-neox": ("gpt-neox", "gptj"),
    "codegen": ("codegen", None),
    "llama": ("llama", "llama"),
    "llamav2": ("llama", "llama"),
    "llama2": ("llama", "llama"),
    "code-llama": ("llama", "llama"),
    "wizardlm": ("llama", "llama"),
    "bloom": ("bloom", "bloom"),
    "falcon": ("falcon", "falcon"),
    "bert": ("bert", "bert"),
    "bert-sequence-classifier": ("bert", "bert/classifier"),
    "bert/classifier": ("bert", "bert/classifier"),
    "bert-token-classifier": ("bert", "bert/token_classifier"),
    "bert/token_classifier": ("bert", "bert/token_classifier"),
    "bert-summarization": ("bert", "bert/extractive_summarization"),
    "bert/extractive_summarization": ("bert", "bert/extractive_summarization"),
    "bert-qa": ("bert", None),
    "bert-q&a": ("bert", None),
    "t5": ("t5", "t5"),
    "transformer": ("t5", "transformer"),
    "ul2": ("t5", None),
    "flan-ul2": ("t5", None),
}
# Families whose Model Zoo name follows from the family alone (no variants to tell apart).
NAME_FROM_FAMILY: dict[str, str] = {
    "gpt2": "gpt2",
    "gptj": "gptj",
    "gpt-neox": "gptj",
    "llama": "llama",
    "bloom": "bloom",
    "falcon": "falcon",
}
ALIASES: dict[str, str] = {n: fam for n, (fam, _) in MODEL_NAMES.items() if n not in FAMILIES}


def known_names() -> str:
    return ", ".join(MODEL_NAMES)


def resolve_name(name: str) -> tuple[str, str | None]:
    """``(family, registry name)`` for a model name (case-insensitive); a clear error for an
    unknown one."""
    key = name.strip().lower()
    if key in MODEL_NAMES:
        return MODEL_NAMES[key]
    raise UsageError(None, f"unknown model {name!r}", f"known models: {known_names()}")


def canonical_family(name: str) -> tuple[str, str | None]:
    """``(family, variant)``: the variant is the name as given (lower case) when it is not the
    family's own name, else None."""
    family, _ = resolve_name(name)
    key = name.strip().lower()
    return family, None if key == family else key


def config_group(family: str) -> str:
    """GPT-J, NeoX and CodeGen configs share their keys (one model class in Model Zoo)."""
    return "gptj" if family in ("gptj", "gpt-neox", "codegen") else family
