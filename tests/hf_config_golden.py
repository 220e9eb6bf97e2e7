"""Golden facts of the Hugging Face config rules, so a rewrite of them is proven bit-identical.

A *case* is one call of a family's config rules: the Model Zoo name, the direction (``to_hf``:
the CS ``model:`` section -> ``config.json``; ``to_cs``: ``config.json`` -> the CS section) and
the config given. Its *facts* are what the pipeline writes from the answer: ``config.json``
(written with sorted keys: the HF answer's key order is not a fact) or the CS section (written
to ``params.yaml`` in the answer's order: its ``[key, value]`` pairs in order), each value with
its JSON type (``1`` and ``1.0`` differ); or the refusal's message.

The cases are the calls the HF tests make, the configs of the tensor plans' golden cases
(``hf_golden``), and each answer fed back the other way (the round trip)::

    HF_CONFIG_GOLDEN_RECORD=$PWD/tests/data/hf_config_golden.json.gz PYTHONPATH=tests \\
        .venv/bin/python -m pytest -q -p hf_config_golden tests/test_modelzoo_parity_hf.py \\
        $(ls tests/test_hf_*.py | grep -v golden)

``tests/test_hf_config_golden.py`` replays every case through the current rules.
"""

from __future__ import annotations

import atexit
import gzip
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hf_golden

from ckpt_migrate.hf import families

DATA = Path(__file__).resolve().parent / "data" / "hf_config_golden.json.gz"
DIRECTIONS = {"to_hf": "config_to_hf", "to_cs": "config_to_cs"}
BACK = {"to_hf": "to_cs", "to_cs": "to_hf"}


def answer(module: Any, case: Mapping[str, Any]) -> dict[str, Any] | str:
    """The rules' answer to ``case`` as a dict, or the refusal as ``Type: message``."""
    fn = getattr(module, DIRECTIONS[case["direction"]])
    try:
        return fn(json.loads(json.dumps(case["config"])), case["name"])
    except Exception as exc:  # the refusal is a fact too
        return f"{type(exc).__name__}: {exc}"


def facts(module: Any, case: Mapping[str, Any]) -> list[Any] | str:
    """The answer as the pipeline writes it (see the module docstring)."""
    out = answer(module, case)
    if isinstance(out, str):
        return out
    pairs = sorted(out.items()) if case["direction"] == "to_hf" else list(out.items())
    return json.loads(json.dumps([[k, v, type(v).__name__] for k, v in pairs]))


def load() -> list[dict[str, Any]]:
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        return json.load(f)


def _key(case: Mapping[str, Any]) -> str:
    return json.dumps([case["name"], case["direction"], case["config"]], sort_keys=True)


# ---- the recording plugin (``-p hf_config_golden``) ---------------------------------------

_recorded: dict[str, dict[str, Any]] = {}


def _add(name: str, direction: str, config: Mapping[str, Any]) -> None:
    try:
        case = {"name": name, "direction": direction, "config": json.loads(json.dumps(config))}
    except (TypeError, ValueError):
        return
    _recorded.setdefault(_key(case), case)


def _wrap(module: Any, direction: str) -> None:
    attr = DIRECTIONS[direction]
    original = getattr(module, attr)
    if getattr(original, "_golden", False):
        return

    def recording(config, name, *more):
        _add(name, direction, dict(config))
        return original(config, name, *more)

    recording._golden = True  # type: ignore[attr-defined]
    recording.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(module, attr, recording)


def _save() -> None:
    for module in families.modules():  # record the original rules' answers
        for attr in DIRECTIONS.values():
            fn = getattr(module, attr)
            setattr(module, attr, getattr(fn, "__wrapped__", fn))
    for case in hf_golden.load():  # the tensor cases' configs
        _add(case["name"], case["direction"], case["config"])
    by_name = families.by_name()
    for key in [k for k, c in _recorded.items() if c["name"] not in by_name]:
        del _recorded[key]  # a test's call with a name no rules serve
    for case in list(_recorded.values()):  # the round trips
        out = answer(by_name[case["name"]], case)
        if isinstance(out, dict):
            _add(case["name"], BACK[case["direction"]], out)
    cases = sorted(_recorded.values(), key=_key)
    for case in cases:
        case["facts"] = facts(by_name[case["name"]], case)
    with gzip.open(os.environ["HF_CONFIG_GOLDEN_RECORD"], "wt", encoding="utf-8") as f:
        json.dump(cases, f, sort_keys=True, separators=(",", ":"))


def pytest_configure(config: Any) -> None:
    if not os.environ.get("HF_CONFIG_GOLDEN_RECORD"):
        return
    for module in families.modules():
        for direction in DIRECTIONS:
            _wrap(module, direction)
    atexit.register(_save)
