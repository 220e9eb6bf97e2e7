"""Golden facts of the Hugging Face tensor plans, so a rewrite of the rules is proven
bit-identical.

A *case* is one call of a family's tensor rules as the HF tests make it: the Model Zoo name, the
direction (``to_hf``: CS -> HF export, ``to_cs``: HF -> CS import), the source tensors' shapes
and the config. Its *facts* are what the pipeline writes from the plan: every output in plan
order (safetensors shards and the CS tree are written in that order) with the inputs it reads,
whether it is an input renamed (the import stores such outputs of one input once: a tie), its
shape and the xxh3 of its bytes built from seeded inputs; or the MappingError's message. The
writers, the config rules and everything else the files hold are outside the rules rewritten.

Record (from the code whose behaviour is the reference)::

    HF_GOLDEN_RECORD=$PWD/tests/data/hf_golden.json.gz PYTHONPATH=tests \\
        .venv/bin/python -m pytest -q -p hf_golden tests/test_modelzoo_parity_hf.py \\
        $(ls tests/test_hf_*.py | grep -v golden)

Each case is recorded with variants (the head tie flipped, no ``lm_head`` in the source).
``tests/test_hf_golden.py`` replays every case through the current rules.
"""

from __future__ import annotations

import atexit
import gzip
import json
import os
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ckpt_migrate.hf import families
from ckpt_migrate.hf.mapping import identity, run

DATA = Path(__file__).resolve().parent / "data" / "hf_golden.json.gz"
MAX_ELEMENTS = 4_000_000  # a case over this (a hostile test's declared shape) is not recorded
DIRECTIONS = {"to_hf": "plan_to_hf", "to_cs": "plan_to_cs"}


def seeded(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The input tensor ``name``: float32 normals seeded by its name (repeatable)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return rng.standard_normal(shape).astype(np.float32)


def _digest(x: np.ndarray) -> str:
    data = np.ascontiguousarray(x)
    head = f"{data.dtype.str}{data.shape}".encode()
    return xxhash.xxh3_128_hexdigest(head + memoryview(data.reshape(-1).view(np.uint8)).tobytes())


def facts(plan_fn: Callable[..., Any], case: Mapping[str, Any]) -> list[Any] | str:
    """The plan's outputs as ``[name, inputs, renamed, shape, digest]``, or the error."""
    shapes = {k: tuple(v) for k, v in case["shapes"].items()}
    try:
        plan = plan_fn(shapes, case["config"], case["name"])
        outs = dict(run(plan, lambda n: seeded(n, shapes[n])))
    except Exception as exc:  # the refusal is a fact too (a variant may hit a bare KeyError)
        return f"{type(exc).__name__}: {exc}"
    return [
        [
            o.name,
            list(o.inputs),
            o.build is identity,
            list(outs[o.name].shape),
            _digest(outs[o.name]),
        ]
        for o in plan
    ]


def case_key(case: Mapping[str, Any]) -> str:
    return json.dumps(
        [case["name"], case["direction"], case["shapes"], case["config"]], sort_keys=True
    )


def load() -> list[dict[str, Any]]:
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        return json.load(f)


# ---- the recording plugin (``-p hf_golden``) ---------------------------------------------

_recorded: dict[str, dict[str, Any]] = {}


def _wrap(module: Any, direction: str) -> None:
    attr = DIRECTIONS[direction]
    original = getattr(module, attr, None)
    if original is None or getattr(original, "_golden", False):
        return

    def recording(shapes, config, name, *more):
        case = None if more else _case(name, direction, shapes, config)
        if case is not None:
            _recorded.setdefault(case_key(case), case)
        return original(shapes, config, name, *more)

    recording._golden = True  # type: ignore[attr-defined]
    recording.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(module, attr, recording)


def _case(name: str, direction: str, shapes: Mapping, config: Mapping) -> dict[str, Any] | None:
    if sum(int(np.prod(s)) for s in shapes.values()) > MAX_ELEMENTS:
        return None
    try:
        case = {
            "name": name,
            "direction": direction,
            "shapes": {k: [int(d) for d in v] for k, v in sorted(shapes.items())},
            "config": json.loads(json.dumps(dict(config))),
        }
    except (TypeError, ValueError):
        return None
    return case


_TIE = {"to_hf": "share_embedding_weights", "to_cs": "tie_word_embeddings"}


def _variants(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The case with the head tie flipped, and without ``lm_head.weight`` in the source (the
    HF tests' models are mostly tied: the head rules' other branches get cases too)."""
    key = _TIE[case["direction"]]
    flipped = {**case, "config": {**case["config"], key: not case["config"].get(key, True)}}
    out = [flipped]
    for c in (case, flipped):
        if "lm_head.weight" in c["shapes"]:
            shapes = {k: v for k, v in c["shapes"].items() if k != "lm_head.weight"}
            out.append({**c, "shapes": shapes})
    return out


def _save() -> None:
    by_name = families.by_name()
    for case in list(_recorded.values()):
        for variant in _variants(case):
            _recorded.setdefault(case_key(variant), variant)
    # (a test of the unknown-name refusal calls the rules with a name no family has)
    cases = sorted((c for c in _recorded.values() if c["name"] in by_name), key=case_key)
    for case in cases:
        plan_fn = getattr(by_name[case["name"]], DIRECTIONS[case["direction"]])
        case["facts"] = facts(getattr(plan_fn, "__wrapped__", plan_fn), case)
    with gzip.open(os.environ["HF_GOLDEN_RECORD"], "wt", encoding="utf-8") as f:
        json.dump(cases, f, sort_keys=True, separators=(",", ":"))


def pytest_configure(config: Any) -> None:
    target = os.environ.get("HF_GOLDEN_RECORD")
    if not target:
        return
    for module in families.modules():
        for direction in DIRECTIONS:
            _wrap(module, direction)
    atexit.register(_save)
