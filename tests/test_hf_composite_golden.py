"""The composites' config and plans and the parts' own rules (``hf/parts.py``), replayed: each
answer equals the golden facts recorded from the hand-written part config rules
(``tests/hf_composite_golden.py`` says how they were recorded)."""

from __future__ import annotations

import hf_composite_golden
import pytest

from ckpt_migrate.hf import families, parts

CASES = hf_composite_golden.load()


def test_every_part_composite_kind_and_direction_has_cases() -> None:
    """Every part's config and plan rules and every composite's, both ways."""
    covered = {(c["target"], c["kind"], c["name"], c["direction"]) for c in CASES}
    wanted = {
        (target, kind, name, direction)
        for target, names in (("part", parts.RULES), ("composite", families.compose.NAMES))
        for name in names
        for (kind, direction) in hf_composite_golden.ATTRS
    }
    assert wanted <= covered, sorted(wanted - covered)


IDS = [f"{c['target']}-{c['kind']}-{c['name']}-{c['direction']}" for c in CASES]


@pytest.mark.parametrize(
    "case",
    CASES,
    ids=[f"{case_id}-{n}" for n, case_id in enumerate(IDS)],
)
def test_answer_is_bit_identical(case) -> None:
    assert hf_composite_golden.facts(case) == case["facts"]
