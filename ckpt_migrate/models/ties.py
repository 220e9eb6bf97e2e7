"""Model families: which state-dict keys are tied (one tensor under two names), from the
catalogue's layouts.

Learned from MODELZOO_HISTORY.md §1.2 and §1.5: the 2.0 ``fix_checkpoint_spec`` alias table
(GPT-style names, matched by suffix) and the 2.1+ CS18/19→CS20 converters
(``f1fd1e0:src/cerebras/modelzoo/tools/checkpoint_converters/gpt2_hf_cs.py``,
``helper.py:maybe_tie_lm_head/tie_none_weights``, ``bert.py``, ``t5.py``). Keys are matched on
whole dotted segments, never substrings: ``my_lm_head.weight`` does not match ``lm_head.weight``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_migrate import catalogue


@dataclass(frozen=True)
class TieRule:
    a: str  # key suffix, in whole segments
    b: str
    families: tuple[str, ...]
    config_flag: str | None = None  # model config key that turns the tie on (default true)

    def enabled(self, model_config: Mapping[str, Any] | None) -> bool:
        if self.config_flag is None or model_config is None:
            return True
        return bool(model_config.get(self.config_flag, True))


# Each layout's ties (catalogue.layouts), for the families of that layout: GPT-style lm_head and
# ln_f, BERT's MLM classifier, T5's encoder/decoder embeddings and lm_head.
TIE_RULES: tuple[TieRule, ...] = tuple(
    TieRule(tie.a, tie.b, catalogue.layout_families(layout), tie.config_flag)
    for layout in catalogue.LAYOUTS
    for tie in layout.ties
)


def _segments(name: str) -> list[str]:
    return name.split(".")


def partners(name: str, model_config: Mapping[str, Any] | None = None) -> list[tuple[str, TieRule]]:
    """Names that ``name`` is tied to by some enabled rule, with the rule (both directions)."""
    seg = _segments(name)
    out: list[tuple[str, TieRule]] = []
    for rule in TIE_RULES:
        if not rule.enabled(model_config):
            continue
        for mine, theirs in ((rule.a, rule.b), (rule.b, rule.a)):
            tail = _segments(mine)
            if len(seg) >= len(tail) and seg[-len(tail) :] == tail:
                prefix = seg[: len(seg) - len(tail)]
                out.append((".".join([*prefix, *_segments(theirs)]), rule))
    return out
