"""The one table of model names: every name ``--model``, ``convert_checkpoint.py`` and a config's
own model name may use, with the family whose steps apply and Model Zoo's registry name.

Model Zoo 2.10 knows 54 converter model names: the keys of ``converters`` plus the aliases added
below it (tag Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/
registry.py``, lines 173-333). :data:`MODELZOO_NAMES` lists them all, spelled as there.

Families are key layouts (MODELZOO_HISTORY.md §3.5): the decoder LMs are all one
``GPT2LMHeadModel`` configured per family, so their CS↔CS key renames are the GPT-2 ones
(``Converter_BTLMLMHeadModel_CS20_CS21``, ``Converter_JAISLMHeadModel_CS20_CS21`` and
``Converter_StarcoderLMHeadModel_CS20_CS21`` subclass ``Converter_GPT2LMHeadModel_CS20_CS21``:
Release_2.10.0 ``btlm_hf_cs.py``, ``jais_hf_cs.py``, ``starcoder.py``); RoBERTa converts with
``Converter_Bert_CS20_CS21`` (registry.py lines 294-297). Models Model Zoo only converts from 2.1 or
later (Mistral, Mixtral, Gemma 2, SantaCoder: only ``HF_CS2x`` converters, so only the
fallback converters for later hops, ``convert_checkpoint.py`` ``get_model_converter``) have no
model key renames at any hop. The rest (``KEYLESS``: CLIP-ViT, DPO, Dragon, ESM-2, LLaVA,
MM-Simple-LLaVA) are not decoder or encoder LMs of the tabulated layouts: every hop applies
only its model-independent steps, as Model Zoo's fallback converters do, and their keys are not
checked against a key table.

``-headless`` names are the same models without ``lm_head`` (Model Zoo's ``*Model_HF_CS*``
converters, registry.py); they share the family's steps.

Registry names: ``src/cerebras/modelzoo/registry/registry.yaml`` and ``_model_aliases``
(Release_2.10.0 registry.py lines 338-378), written as ``trainer.init.model.name`` from 2.4 on.
GPT-NeoX configs run as ``gptj`` in Model Zoo's own trainer-layout configs
(``models/nlp/gptj/configs/params_gpt_neox_*.yaml``). ``None`` where Model Zoo has none (BERT
QA, UL2, Flan-UL2, Dragon and SQLCoder have no registry entry or alias).
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_migrate.errors import UsageError


@dataclass(frozen=True)
class ModelName:
    """One Model Zoo converter model name."""

    name: str  # as Model Zoo 2.10's converter registry spells it
    family: str  # the key/config family whose steps apply
    registry: str | None  # Model Zoo registry name (trainer.init.model.name), None: none
    headless: bool = False  # the model without lm_head

    @property
    def modelzoo_from(self) -> str:
        """The oldest release Model Zoo 2.10 converts this model's checkpoints from (1.7 for
        names it has since 1.6): the oldest ``cs-X.Y`` among the ``formats()`` of the name's
        converters, below which it offers no fallback either (``convert_checkpoint.py``
        ``_get_oldest_converter_version`` and ``get_model_converter``). This tool converts
        from every release; older files of these models do not exist."""
        return MODELZOO_FROM[_ALIAS_OF.get(self.name, self.name)]


# Decoder LMs: one GPT2LMHeadModel key layout, configured per family.
GPT_STYLE: tuple[str, ...] = (
    "gpt2",
    "gptj",
    "gpt-neox",
    "codegen",
    "llama",
    "bloom",
    "falcon",
    "btlm",
    "jais",
    "starcoder",
    "santacoder",
    "mistral",
    "mixtral",
    "gemma2",
)
# Families without a key table: only the model-independent steps apply.
KEYLESS: tuple[str, ...] = ("clip-vit", "dpo", "dragon", "esm-2", "llava", "mmsimple-llava")
FAMILIES: tuple[str, ...] = (*GPT_STYLE, "bert", "t5", *KEYLESS)


def _with_headless(name: str, family: str, registry: str | None) -> tuple[ModelName, ...]:
    return (
        ModelName(name, family, registry),
        ModelName(f"{name}-headless", family, registry, True),
    )


MODELZOO_NAMES: tuple[ModelName, ...] = (
    ModelName("bert", "bert", "bert"),
    ModelName("bert-sequence-classifier", "bert", "bert/classifier"),
    ModelName("bert-token-classifier", "bert", "bert/token_classifier"),
    ModelName("bert-summarization", "bert", "bert/extractive_summarization"),
    ModelName("bert-qa", "bert", None),
    *_with_headless("bloom", "bloom", "bloom"),
    *_with_headless("btlm", "btlm", "btlm"),
    ModelName("clip-vit", "clip-vit", "vision_transformer"),
    *_with_headless("codegen", "codegen", "gptj"),
    ModelName("esm-2", "esm-2", "esm2"),
    ModelName("dpo", "dpo", "dpo"),
    ModelName("dragon", "dragon", None),
    *_with_headless("falcon", "falcon", "falcon"),
    ModelName("gemma2", "gemma2", "gemma2"),
    *_with_headless("gpt2", "gpt2", "gpt2"),
    *_with_headless("gptj", "gptj", "gptj"),
    *_with_headless("gpt-neox", "gpt-neox", "gptj"),
    ModelName("jais", "jais", "jais"),
    *_with_headless("llama", "llama", "llama"),
    ModelName("llava", "llava", "llava"),
    ModelName("mmsimple-llava", "mmsimple-llava", "multimodal_simple"),
    *_with_headless("mistral", "mistral", "mistral"),
    *_with_headless("mixtral", "mixtral", "mixtral"),
    ModelName("roberta", "bert", "bert"),
    *_with_headless("santacoder", "santacoder", "santacoder"),
    *_with_headless("starcoder", "starcoder", "starcoder"),
    ModelName("t5", "t5", "t5"),
    ModelName("ul2", "t5", None),
    ModelName("flan-ul2", "t5", None),
    ModelName("transformer", "t5", "transformer"),
    *_with_headless("llamaV2", "llama", "llama"),
    *_with_headless("code-llama", "llama", "llama"),
    *_with_headless("octocoder", "starcoder", "starcoder"),
    *_with_headless("wizardcoder", "starcoder", "gpt2"),
    *_with_headless("sqlcoder", "starcoder", None),
    *_with_headless("wizardlm", "llama", "llama"),
)

# The oldest release each Model Zoo 2.10 converter list converts from (see
# ModelName.modelzoo_from), per registry key; aliases share their target's list.
MODELZOO_FROM: dict[str, str] = {
    "bert": "1.7",
    "bert-sequence-classifier": "1.7",
    "bert-token-classifier": "1.7",
    "bert-summarization": "1.7",
    "bert-qa": "1.7",
    "bloom": "1.9",
    "bloom-headless": "2.1",
    "btlm": "2.0",
    "btlm-headless": "2.1",
    "clip-vit": "2.1",
    "codegen": "1.8",
    "codegen-headless": "2.0",
    "esm-2": "2.1",
    "dpo": "2.1",
    "dragon": "2.3",
    "falcon": "2.0",
    "falcon-headless": "2.1",
    "gemma2": "2.3",
    "gpt2": "1.8",
    "gpt2-headless": "2.1",
    "gptj": "1.8",
    "gptj-headless": "2.0",
    "gpt-neox": "1.8",
    "gpt-neox-headless": "2.1",
    "jais": "2.0",
    "llama": "1.9",
    "llama-headless": "2.1",
    "llava": "2.2",
    "mmsimple-llava": "2.3",
    "mistral": "2.1",
    "mistral-headless": "2.1",
    "mixtral": "2.3",
    "mixtral-headless": "2.3",
    "roberta": "2.0",
    "santacoder": "2.1",
    "santacoder-headless": "2.1",
    "starcoder": "2.0",
    "starcoder-headless": "2.1",
    "t5": "1.7",
}
_ALIAS_OF: dict[str, str] = {
    "ul2": "t5",
    "flan-ul2": "t5",
    "transformer": "t5",
    **{a: "llama" for a in ("llamaV2", "code-llama", "wizardlm")},
    **{a: "starcoder" for a in ("octocoder", "wizardcoder", "sqlcoder")},
    **{f"{a}-headless": "llama-headless" for a in ("llamaV2", "code-llama", "wizardlm")},
    **{f"{a}-headless": "starcoder-headless" for a in ("octocoder", "wizardcoder", "sqlcoder")},
}

# Further names this tool accepts: registry spellings and common aliases.
_MORE_NAMES: dict[str, tuple[str, str | None]] = {
    "gpt3": ("gpt2", "gpt3"),
    "llama2": ("llama", "llama"),
    "bert/classifier": ("bert", "bert/classifier"),
    "bert/token_classifier": ("bert", "bert/token_classifier"),
    "bert/extractive_summarization": ("bert", "bert/extractive_summarization"),
    "bert-q&a": ("bert", None),
    "esm2": ("esm-2", "esm2"),
    "multimodal_simple": ("mmsimple-llava", "multimodal_simple"),
}

# name (lower case) -> (family, registry name or None)
MODEL_NAMES: dict[str, tuple[str, str | None]] = {
    **{m.name.lower(): (m.family, m.registry) for m in MODELZOO_NAMES},
    **_MORE_NAMES,
}
# Families whose Model Zoo name follows from the family alone (no variants to tell apart).
NAME_FROM_FAMILY: dict[str, str] = {
    "gpt2": "gpt2",
    "gptj": "gptj",
    "gpt-neox": "gptj",
    "llama": "llama",
    "bloom": "bloom",
    "falcon": "falcon",
    "mixtral": "mixtral",
    "gemma2": "gemma2",
}
ALIASES: dict[str, str] = {n: fam for n, (fam, _) in MODEL_NAMES.items() if n not in FAMILIES}


def known_names() -> str:
    return ", ".join(m.name for m in MODELZOO_NAMES) + ", " + ", ".join(_MORE_NAMES)


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
