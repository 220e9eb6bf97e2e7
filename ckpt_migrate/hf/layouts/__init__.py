"""The tensor tables of the Hugging Face layouts and the contexts that read a config for them
(one module per CS layout group): declarations the interpreter of ``hf/table.py`` runs either
way. A catalogue record names its table and context ``<module>.<name>`` (``Hf.tensors``)."""

from __future__ import annotations

from typing import Any

from ckpt_migrate.hf.layouts import bert_like, gpt2_like, gptj_like, llama_like, t5, vit

_MODULES = {
    m.__name__.rsplit(".", 1)[-1]: m for m in (bert_like, gpt2_like, gptj_like, llama_like, t5, vit)
}


def declared(dotted: str) -> Any:
    """The table or context a record names ``<module>.<name>``."""
    module, _, name = dotted.partition(".")
    return getattr(_MODULES[module], name)
