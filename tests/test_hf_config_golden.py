"""Every Hugging Face config conversion the HF tests make (and its round trip), replayed: the
``config.json`` or CS ``model:`` section written, or the refusal, equals the golden facts
recorded from the hand-written config rules (``tests/hf_config_golden.py`` says how)."""

from __future__ import annotations

from collections import Counter

import hf_config_golden
import pytest

from ckpt_migrate.catalogue.config import Op
from ckpt_migrate.hf import config_table, families
from ckpt_migrate.hf.families import compose

CASES = hf_config_golden.load()


def test_every_rules_module_and_direction_has_cases() -> None:
    """Every rules module serving a name, both ways (a name added later, such as a family by
    one catalogue record, is held by its own round-trip test; a composite's cases are its
    parts', recorded under their own names)."""
    by_name = families.by_name()
    covered = Counter((by_name[c["name"]].__name__, c["direction"]) for c in CASES)
    modules = {m.__name__ for m in families.modules() if m.NAMES and m is not compose}
    assert {(m, d) for m in modules for d in hf_config_golden.DIRECTIONS} <= set(covered)


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c['name']}-{c['direction']}-{i}" for i, c in enumerate(CASES)]
)
def test_config_is_bit_identical(case) -> None:
    module = families.by_name()[case["name"]]
    assert hf_config_golden.facts(module, case) == case["facts"]


def test_every_table_step_is_known_and_every_operation_used() -> None:
    """A table (a record's or a part's) names only operations the interpreter has, and every
    operation is some table's (no dead operation)."""
    used = {
        step.name
        for table in config_table.tables().values()
        for step in table
        if isinstance(step, Op)
    }
    assert used <= set(config_table.OPS)
    assert set(config_table.OPS) <= used
    assert all(pair != (None, None) for pair in config_table.OPS.values())
