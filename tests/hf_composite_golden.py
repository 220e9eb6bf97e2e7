"""Golden facts of the composite families (DPO, Dragon+, LLaVA, MM-Simple LLaVA) and of the
parts' own rules (``hf/parts.py``: ``bert-model``, ``clip-vision``, ``llava-projector``,
``mmsimple-projector``), which the per-family goldens (``hf_config_golden``, ``hf_golden``) do
not reach: a rewrite of either is proven bit-identical.

A case is one call: ``target`` ``part`` (a part's rules, by its name in ``hf/parts.py``) or
``composite`` (the registry's ``compose`` rules, by the Model Zoo name), ``kind`` ``config``
(``config_to_hf`` / ``config_to_cs``; facts as ``hf_config_golden.facts``) or ``plan``
(``plan_to_hf`` / ``plan_to_cs``; facts as ``hf_golden.facts``), the direction, the config and
(plans) the source shapes.

The cases are the calls the HF tests make in process, DPO's from its policies' own golden cases
(:func:`dpo_cases`: its tests run the command line), each config answer fed back the other way
(the round trip), each plan with one source tensor left out (a projector's, where it has one),
and for the parts' config rules the variants :data:`VARIANTS` derives from the recorded configs
(each branch of the hand-written rules: a pooler or none, a selected layer before or after the
embeddings, the refusals). Record from the code whose behaviour is the reference::

    HF_COMPOSITE_GOLDEN_RECORD=$PWD/tests/data/hf_composite_golden.json.gz PYTHONPATH=tests \\
        .venv/bin/python -m pytest -q -p hf_composite_golden tests/test_hf_multi_dir.py \\
        tests/test_hf_more_families.py tests/test_modelzoo_parity_hf.py

``tests/test_hf_composite_golden.py`` replays every case through the current rules.
"""

from __future__ import annotations

import atexit
import gzip
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import hf_config_golden
import hf_golden

from ckpt_migrate import catalogue
from ckpt_migrate.hf import families, parts

DATA = Path(__file__).resolve().parent / "data" / "hf_composite_golden.json.gz"
ATTRS = {
    ("config", "to_hf"): "config_to_hf",
    ("config", "to_cs"): "config_to_cs",
    ("plan", "to_hf"): "plan_to_hf",
    ("plan", "to_cs"): "plan_to_cs",
}


def rules(case: Mapping[str, Any]) -> Any:
    """The rules a case calls: a part's (``hf/parts.py``) or the composites' registry entry."""
    return parts.RULES[case["name"]] if case["target"] == "part" else families.compose


def facts(case: Mapping[str, Any], of: Any | None = None) -> list[Any] | str:
    """The facts of ``case`` through ``of`` (default: the current rules)."""
    of = rules(case) if of is None else of
    if case["kind"] == "config":
        return hf_config_golden.facts(of, case)
    fn = getattr(of, ATTRS["plan", case["direction"]])
    return hf_golden.facts(getattr(fn, "__wrapped__", fn), case)


def load() -> list[dict[str, Any]]:
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        return json.load(f)


def key(case: Mapping[str, Any]) -> str:
    fields = ("target", "kind", "name", "direction", "config", "shapes")
    return json.dumps([case.get(f) for f in fields], sort_keys=True)


# ---- variants of the parts' config rules (each branch of hf/parts.py) ----------------------


def _set(path: str, value: Any) -> Callable[[dict], dict]:
    """A variant with ``value`` at the dotted ``path`` (``None``-valued ``value`` is kept as
    null; ``...`` removes the field)."""

    def variant(config: dict) -> dict:
        out = json.loads(json.dumps(config))
        *head, last = path.split(".")
        where: Any = out
        for step in head:
            where = where[int(step)] if isinstance(where, list) else where.setdefault(step, {})
        if value is ...:
            where.pop(last, None)
        else:
            where[last] = value
        return out

    return variant


# (part name, direction) -> variants of each recorded config of that call
VARIANTS: dict[tuple[str, str], tuple[Callable[[dict], dict], ...]] = {
    ("bert-model", "to_hf"): (
        _set("add_pooling_layer", True),
        _set("add_pooling_layer", False),
        _set("add_pooling_layer", ...),
    ),
    ("bert-model", "to_cs"): (
        _set("projection_dim", 0),
        _set("projection_dim", 7),
        _set("projection_dim", ...),
        _set("hidden_size", ...),
    ),
    ("clip-vision", "to_cs"): (
        lambda c: {"vision_config": c, "model_type": "clip"},
        _set("architectures", ["CLIPModel"]),
    ),
    ("llava-projector", "to_hf"): (
        _set("image_feature_select_layer_idx", 3),
        _set("image_feature_select_layer_idx", ...),
        _set("image_feature_select_mode", "cls_patch"),
        _set("freeze", ["^image_model", "^text_model"]),
        _set("freeze", ...),
        _set("projector.image_model.name", "Other"),
        _set("projector.image_model.layers_activation", ["relu", None]),
        _set("image_model.hidden_size", ...),
        _set("projector", ...),
    ),
    ("llava-projector", "to_cs"): (
        _set("mm_vision_select_layer", 4),
        _set("mm_vision_select_layer", 0),
        _set("mm_vision_select_layer", ...),
        _set("mm_projector_type", "mlp3x_gelu"),
        _set("mm_projector_type", "linear"),
        _set("mm_projector_type", ...),
        _set("mm_use_im_start_end", True),
        _set("mm_use_im_patch_token", True),
        _set("tune_mm_mlp_adapter", True),
        _set("mm_vision_select_feature", "cls_patch"),
        _set("mm_hidden_size", ...),
    ),
    ("mmsimple-projector", "to_hf"): (
        _set("image_model_list.image_models.0.image_encoder.image_layer_idx", 5),
        _set("image_model_list.image_models.0.image_encoder.image_layer_idx", ...),
        _set("image_model_list.image_feature_select_mode", ...),
        _set("freeze", ...),
        _set("image_model_list.global_image_projection.name", "Other"),
        _set("image_model_list", ...),
    ),
    ("mmsimple-projector", "to_cs"): (
        _set("mm_vision_select_layer", 4),
        _set("mm_vision_select_layer", 0),
        _set("mm_projector_type", "mlp1x_gelu"),
        _set("tune_mm_mlp_adapter", True),
        _set("mm_hidden_size", ...),
    ),
}


def dpo_cases(per_name: int = 2) -> list[dict[str, Any]]:
    """DPO's composite cases, which the HF tests make through the command line only: the
    policies' own golden cases (``hf_golden``, ``hf_config_golden``; the first ``per_name`` of
    each policy family, kind and direction) as DPO's, the CS side under the policy's prefix and
    its copies, the policy named by ``model_name``."""
    part = catalogue.by_family("dpo").hf.parts[0]
    out: list[dict[str, Any]] = []
    taken: dict[tuple[str, str, str], int] = {}
    for kind, cases in (("plan", hf_golden.load()), ("config", hf_config_golden.load())):
        for case in cases:
            at = (kind, case["name"], case["direction"])
            if case["name"] not in part.names or taken.get(at, 0) >= per_name:
                continue
            taken[at] = taken.get(at, 0) + 1
            config = dict(case["config"])
            new = {"target": "composite", "kind": kind, "name": "dpo"}
            new["direction"] = case["direction"]
            if case["direction"] == "to_hf":
                new["config"] = {**config, part.name_field: case["name"]}
            else:
                new["config"] = config
            if kind == "plan":
                shapes = case["shapes"]
                if case["direction"] == "to_hf":
                    shapes = {
                        p + k: v for p in (part.cs_prefix, *part.copies) for k, v in shapes.items()
                    }
                new["shapes"] = shapes
            out.append(new)
    first = out[0]  # the policy left unnamed, or named but not one DPO holds
    unnamed = {k: v for k, v in first["config"].items() if k != part.name_field}
    out += [{**first, "config": unnamed}, {**first, "config": {**unnamed, part.name_field: "t5"}}]
    for side in ("to_hf", "to_cs"):
        out += [{**first, "direction": side, "config": {"model_type": "t5"}}]
        out += [{**first, "direction": side, "config": {"hidden_size": 8}}]
    return out


# ---- the recording plugin (``-p hf_composite_golden``) -------------------------------------

_recorded: dict[str, dict[str, Any]] = {}


def _add(case: dict[str, Any]) -> None:
    try:
        case = json.loads(json.dumps(case))
    except (TypeError, ValueError):
        return
    if case["kind"] == "plan" and case["shapes"] is None:
        return
    _recorded.setdefault(key(case), case)


def _recording(target: str, kind: str, direction: str, original: Callable) -> Callable:
    def recording(*args: Any) -> Any:
        shapes, (config, name) = (args[0], args[1:3]) if kind == "plan" else (None, args[:2])
        case = {"target": target, "kind": kind, "name": name, "direction": direction}
        case |= {"config": dict(config)}
        if shapes is not None:
            plan_case = hf_golden._case(name, direction, shapes, config)
            case["shapes"] = None if plan_case is None else plan_case["shapes"]
        _add(case)
        return original(*args)

    recording.__wrapped__ = original  # type: ignore[attr-defined]
    return recording


def _unwrap(fn: Callable) -> Callable:
    return getattr(fn, "__wrapped__", fn)


def _save() -> None:
    parts.RULES.update({n: _ORIGINAL[n] for n in parts.RULES})
    composite = families.compose
    for attr in ATTRS.values():
        setattr(composite, attr, _unwrap(getattr(composite, attr)))
    for case in [c for c in _recorded.values() if c["target"] == "part" and c["kind"] == "config"]:
        for variant in VARIANTS.get((case["name"], case["direction"]), ()):
            _add({**case, "config": variant(case["config"])})
    for case in dpo_cases():
        _add(case)
    for case in [c for c in _recorded.values() if c["kind"] == "plan"]:  # a tensor missing
        shapes = dict(case["shapes"])
        shapes.pop(max(shapes, key=lambda n: ("projector" in n, n)), None)
        _add({**case, "shapes": shapes})
    for case in [c for c in _recorded.values() if c["kind"] == "config"]:  # the round trips
        out = hf_config_golden.answer(rules(case), case)
        if isinstance(out, dict):
            _add({**case, "direction": hf_config_golden.BACK[case["direction"]], "config": out})
    # as the file gives them back (its keys sorted: a refusal may show a section's order)
    cases = [json.loads(json.dumps(c, sort_keys=True)) for c in sorted(_recorded.values(), key=key)]
    for case in cases:
        case["facts"] = facts(case)
    with gzip.open(os.environ["HF_COMPOSITE_GOLDEN_RECORD"], "wt", encoding="utf-8") as f:
        json.dump(cases, f, sort_keys=True, separators=(",", ":"))


_ORIGINAL: dict[str, parts.PartRules] = {}


def pytest_configure(config: Any) -> None:
    if not os.environ.get("HF_COMPOSITE_GOLDEN_RECORD"):
        return
    for name, part in list(parts.RULES.items()):
        _ORIGINAL[name] = part
        wrapped = {
            attr: _recording("part", kind, direction, getattr(part, attr))
            for (kind, direction), attr in ATTRS.items()
        }
        parts.RULES[name] = replace(part, **wrapped)
    composite = families.compose
    for (kind, direction), attr in ATTRS.items():
        setattr(composite, attr, _recording("composite", kind, direction, getattr(composite, attr)))
    atexit.register(_save)
