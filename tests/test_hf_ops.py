"""The operations of the HF tensor tables know their inverse: exporting then importing through
one operation gives back every CS tensor bit for bit; and the interpreter orders a group's
outputs by the axes the table names (``tests/test_hf_golden.py`` holds every family's plans)."""

from __future__ import annotations

import numpy as np
import pytest

from ckpt_migrate.hf import families
from ckpt_migrate.hf.experts import EXPERTS
from ckpt_migrate.hf.families import compose
from ckpt_migrate.hf.mapping import MappingError, run
from ckpt_migrate.hf.ops import (
    CONV1D,
    FUSED_CONV1D,
    FUSED_ROWS,
    NORM_OFFSET,
    PER_HEAD,
    RENAME,
    Ctx,
    Op,
    rotary,
)
from ckpt_migrate.hf.table import TO_CS, TO_HF, Group, Row, Table, pair
from ckpt_migrate.hf.table import plan as table_plan

RNG = np.random.default_rng(7)
QKV = ("q", "k", "v")


def _round_trip(op: Op, cs: dict[str, np.ndarray], hf_names: tuple[str, ...], dims=None) -> None:
    ctx = Ctx({n: x.shape for n, x in cs.items()}, dims=dims or {})
    hf = dict(run(op.forward(tuple(cs), hf_names, ctx), cs.__getitem__))
    assert set(hf) == set(hf_names)
    back_ctx = Ctx({n: x.shape for n, x in hf.items()}, dims=dims or {})
    back = dict(run(op.inverse().forward(hf_names, tuple(cs), back_ctx), hf.__getitem__))
    assert back.keys() == cs.keys()
    for name, x in cs.items():
        assert back[name].dtype == x.dtype and np.array_equal(back[name], x), name


def _normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op", [RENAME, CONV1D])
def test_one_to_one_operations_invert(op: Op) -> None:
    _round_trip(op, {"w": _normal(6, 4)}, ("hf.w",))
    _round_trip(op, {"b": _normal(6)}, ("hf.b",))


def test_fused_conv1d_inverts() -> None:
    _round_trip(FUSED_CONV1D, {x: _normal(4, 4) for x in QKV}, ("c_attn",))
    _round_trip(FUSED_CONV1D, {x: _normal(4) for x in QKV}, ("c_attn.bias",))


def test_fused_rows_inverts_at_the_declared_rows() -> None:
    """StarCoder's multi-query ``c_attn``: Q of the hidden size, K and V of one head."""
    cs = {"q": _normal(8, 8), "k": _normal(2, 8), "v": _normal(2, 8)}
    _round_trip(FUSED_ROWS, cs, ("c_attn",), {"rows": (0, 8, 10, 12)})


def test_per_head_fusion_inverts() -> None:
    _round_trip(PER_HEAD, {x: _normal(8, 8) for x in QKV}, ("c_attn",), {"heads": 4})


def test_rotary_permutation_inverts_and_permutes() -> None:
    x = np.arange(16, dtype=np.float32).reshape(8, 2)
    _round_trip(rotary("heads"), {"q": x}, ("hf.q",), {"heads": 2})
    ctx = Ctx({"q": x.shape}, dims={"heads": 2})
    hf = dict(run(rotary("heads").forward(("q",), ("hf.q",), ctx), {"q": x}.__getitem__))
    assert not np.array_equal(hf["hf.q"], x)


def test_gemma_norm_offset_inverts_on_exact_values() -> None:
    _round_trip(NORM_OFFSET, {"n": np.array([0.5, -1.25, 3.0], np.float32)}, ("hf.n",))


def test_expert_stacking_inverts() -> None:
    """Mixtral: the fused CS experts, exported per expert and stacked back on import."""
    stem = "transformer_decoder.layers.0."
    cs = {stem + "ffn.gate.weight": _normal(3, 4)}
    for j, kind in ((0, "linear_layer_for_glu"), (0, "linear_layer"), (1, "linear_layer")):
        cs[f"{stem}ffn.experts.fused_ffns.{j}.{kind}.expert_weights"] = _normal(5, 3, 4)
    ctx = Ctx({n: x.shape for n, x in cs.items()}, dims={"experts": 3, "inter": 5})
    hf = dict(run(EXPERTS.forward((stem,), ("model.layers.0.",), ctx), cs.__getitem__))
    assert len(hf) == 1 + 3 * 3
    back_ctx = Ctx({n: x.shape for n, x in hf.items()}, dims={"experts": 3, "inter": 5})
    back = dict(run(EXPERTS.backward(("model.layers.0.",), (stem,), back_ctx), hf.__getitem__))
    assert back.keys() == cs.keys()
    assert all(np.array_equal(back[n], x) for n, x in cs.items())


def test_a_group_orders_its_outputs_per_direction() -> None:
    """One table, two orders: export layer by layer, suffix before row; import piece first."""
    rows = (
        pair("l.{i}.a", "h.{i}.a"),
        Row(("l.{i}.q.{s}", "l.{i}.k.{s}"), ("h.{i}.qk.{s}",), FUSED_CONV1D, ("weight", "bias")),
    )
    order = {TO_HF: ("layer", "suffix", "row"), TO_CS: ("layer", "piece", "row", "suffix")}
    table = Table(
        {"layers": Group(rows, per_layer=True, order=order)},
        {TO_HF: ("layers",)} | {TO_CS: ("layers",)},
    )
    to_hf = [o.name for o in table.plan(TO_HF, Ctx({}, layers=1))]
    assert to_hf == ["h.0.a.weight", "h.0.qk.weight", "h.0.a.bias", "h.0.qk.bias"]
    to_cs = [o.name for o in table.plan(TO_CS, Ctx({}, layers=1))]
    cs_names = ["a.weight", "a.bias", "q.weight", "q.bias", "k.weight", "k.bias"]
    assert to_cs == [f"l.0.{n}" for n in cs_names]


def test_every_family_plans_through_its_table() -> None:
    """One mechanism: every HF rules module declares a ``TABLE`` and its ``plan_to_hf`` and
    ``plan_to_cs`` are the interpreter's (no hand-written plan beside a table)."""
    for module in families.modules():
        if module is compose:  # a composite: its parts' own tables under their prefixes
            continue
        assert hasattr(module, "TABLE"), module.__name__
        for plan in (module.plan_to_hf, module.plan_to_cs):
            assert getattr(plan, "func", None) is table_plan, (module.__name__, plan)


@pytest.mark.parametrize("direction", [TO_HF, TO_CS])
def test_a_name_the_rules_do_not_serve_is_refused_by_the_interpreter(direction) -> None:
    """One check, the interpreter's, for every rules and both ways (before, each layout group's
    context had its own, some one way only, GPT-J's and BLOOM's none)."""
    for module in families.modules():
        if module is compose:
            continue
        plan = getattr(module, f"plan_{direction}")
        with pytest.raises(MappingError, match=r"model name 'no-such-model' is not one of "):
            plan({}, {}, "no-such-model")
