"""Every Hugging Face tensor plan the HF tests make, replayed: the outputs in plan order, their
inputs, ties, shapes and bytes (or the refusal) equal the golden facts recorded from the
hand-written rules (``tests/hf_golden.py`` says how they were recorded)."""

from __future__ import annotations

from collections import Counter

import hf_golden
import pytest

from ckpt_migrate.hf import families
from ckpt_migrate.hf.families import compose

CASES = hf_golden.load()


def test_every_family_and_direction_has_cases() -> None:
    covered = Counter((c["name"], c["direction"]) for c in CASES)
    modules = {families.by_name()[name].__name__ for name, _ in covered}
    assert {m.__name__ for m in families.modules()} <= modules | {
        m.__name__ for m in families.modules() if not m.NAMES or m is compose
    }  # a composite's cases are its parts' (recorded under their own names)
    assert len(covered) >= 2 * len(modules)


@pytest.mark.parametrize(
    "case",
    CASES,
    ids=[f"{c['name']}-{c['direction']}-{i}" for i, c in enumerate(CASES)],
)
def test_plan_is_bit_identical(case) -> None:
    module = families.by_name()[case["name"]]
    plan_fn = getattr(module, hf_golden.DIRECTIONS[case["direction"]])
    assert hf_golden.facts(plan_fn, case) == case["facts"]
