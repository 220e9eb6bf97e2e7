"""The model catalogue (issue #32): one record per family, and every name resolves to one."""

from __future__ import annotations

from collections import Counter

import pytest

from ckpt_migrate import catalogue
from ckpt_migrate.hf import families
from ckpt_migrate.hf.import_ import _model_from_config
from ckpt_migrate.models.names import MODEL_NAMES, MODELZOO_NAMES, resolve_name


def _records_spelling(name: str) -> list[str]:
    key = name.lower()
    return [
        r.name
        for r in catalogue.RECORDS
        if key in {n.name.lower() for n in r.names} | {m.lower() for m, _ in r.more_names}
    ]


@pytest.mark.parametrize("name", [m.name for m in MODELZOO_NAMES] + list(MODEL_NAMES))
def test_every_model_zoo_name_resolves_to_exactly_one_record(name):
    owners = _records_spelling(name)
    assert len(owners) == 1, f"{name}: {owners}"
    record = catalogue.by_name(name)
    assert record is not None and record.name == owners[0]
    assert resolve_name(name)[0] == record.family


def test_every_registry_name_resolves_to_one_record_that_carries_it():
    """A registry name (``trainer.init.model.name``) that is also a model name resolves to one
    record, and that record writes that registry name for one of its names."""
    registries = {n.registry for r in catalogue.RECORDS for n in r.names if n.registry}
    registries |= {reg for r in catalogue.RECORDS for _, reg in r.more_names if reg}
    resolved = {reg: catalogue.by_name(reg) for reg in registries}
    for reg, record in resolved.items():
        if record is None:
            continue
        carried = {n.registry for n in record.names} | {g for _, g in record.more_names}
        assert reg in carried, f"{reg} resolves to {record.name}, which never writes it"
    # CLIP-ViT's registry name is not one of its model names (as before the catalogue).
    assert {reg for reg, r in resolved.items() if r is None} == {"vision_transformer"}


def test_model_zoo_positions_are_its_54_names_in_order():
    positions = [n.position for n, _ in catalogue.modelzoo_names()]
    assert positions == list(range(54))
    assert not [
        n for n, c in Counter(n.name for n, _ in catalogue.modelzoo_names()).items() if c > 1
    ]


def test_config_markers_are_disjoint():
    """A config key marks one family only, so the order markers are tried in cannot matter."""
    seen: dict[str, str] = {}
    for record in catalogue.RECORDS:
        for key in record.config_markers:
            assert key not in seen, f"{key}: {seen[key]} and {record.name}"
            seen[key] = record.name


def test_every_hf_side_names_an_existing_rules_module_serving_its_names():
    served = families.by_name()
    for record in catalogue.RECORDS:
        if record.hf is None:
            continue
        for n in record.names:
            if n.hf:
                assert served[n.name].__name__.endswith(f".{record.hf.module}")
        for model_type in record.hf.model_types:
            assert families.by_model_type()[model_type].__name__.endswith(record.hf.module)


def test_same_keys_and_steps_name_existing_families():
    names = {r.name for r in catalogue.RECORDS}
    for record in catalogue.RECORDS:
        assert record.same_keys_as in names | {None}
        assert record.steps_of in names | {None}


def test_import_names_the_model_of_the_model_type_not_of_the_rules_module(tmp_path):
    """One rules module serves several model types (LLaMA's: llama, mistral): a config.json
    without a known architecture names the first model of its own type's record."""
    assert _model_from_config(tmp_path, {"model_type": "mistral"}) == "mistral"
    assert _model_from_config(tmp_path, {"model_type": "llama"}) == "llama"
    assert catalogue.hf_name({"architectures": ["GPT2Model"]}) == "gpt2-headless"
