"""Model Zoo 2.10's Hugging Face converter names (tag Release_2.10.0,
``src/cerebras/modelzoo/tools/checkpoint_converters/registry.py`` lines 173-333): the keys of
``converters`` whose list holds an ``*_HF_*`` converter, 38 of its 39 keys
(``bert-summarization`` has CS <-> CS converters only). The aliases after line 335 share a
key's converters and are not counted.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_modelzoo_names import MODELZOO_2_10

# the converters' keys come first in that listing, the aliases after ``t5``
CONVERTER_KEYS = MODELZOO_2_10[: MODELZOO_2_10.index("t5") + 1]
HF_NAMES = tuple(n for n in CONVERTER_KEYS if n != "bert-summarization")

REGISTRY = "src/cerebras/modelzoo/tools/checkpoint_converters/registry.py"


def registry_hf_names(text: str) -> tuple[str, ...]:
    """The ``converters`` keys of ``registry.py``'s text whose list names an HF converter."""
    body = text[text.index("converters: Dict") : text.index("# Add some model aliases")]
    entries = re.findall(r'^    "([^"]+)": \[(.*?)\]', body, flags=re.M | re.S)
    return tuple(name for name, listed in entries if "_HF_" in listed)


def registry_text(checkout: Path) -> str:
    return (checkout / REGISTRY).read_text(encoding="utf-8")
