"""Model Zoo 2.10's Hugging Face converter names (tag Release_2.10.0,
``src/cerebras/modelzoo/tools/checkpoint_converters/registry.py`` lines 173-333): the keys of
``converters`` whose list holds an ``*_HF_*`` converter, 38 of its 39 keys
(``bert-summarization`` has CS <-> CS converters only). The aliases after line 335 share a
key's converters and are not counted.
"""

from __future__ import annotations

import re
from pathlib import Path

HF_NAMES = (
    "bert",
    "bert-sequence-classifier",
    "bert-token-classifier",
    "bert-qa",
    "bloom",
    "bloom-headless",
    "btlm",
    "btlm-headless",
    "clip-vit",
    "codegen",
    "codegen-headless",
    "esm-2",
    "dpo",
    "dragon",
    "falcon",
    "falcon-headless",
    "gemma2",
    "gpt2",
    "gpt2-headless",
    "gptj",
    "gptj-headless",
    "gpt-neox",
    "gpt-neox-headless",
    "jais",
    "llama",
    "llama-headless",
    "llava",
    "mmsimple-llava",
    "mistral",
    "mistral-headless",
    "mixtral",
    "mixtral-headless",
    "roberta",
    "santacoder",
    "santacoder-headless",
    "starcoder",
    "starcoder-headless",
    "t5",
)

REGISTRY = "src/cerebras/modelzoo/tools/checkpoint_converters/registry.py"


def registry_hf_names(text: str) -> tuple[str, ...]:
    """The ``converters`` keys of ``registry.py``'s text whose list names an HF converter."""
    body = text[text.index("converters: Dict") : text.index("# Add some model aliases")]
    entries = re.findall(r'^    "([^"]+)": \[(.*?)\]', body, flags=re.M | re.S)
    return tuple(name for name, listed in entries if "_HF_" in listed)


def registry_text(checkout: Path) -> str:
    return (checkout / REGISTRY).read_text(encoding="utf-8")
