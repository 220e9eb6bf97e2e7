"""The migration graph: the shipped hop modules, their declarations, refusal of broken graphs."""

from __future__ import annotations

import importlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

from ckpt_migrate.errors import UsageError
from ckpt_migrate.format import releases
from ckpt_migrate.format.tree import (
    DictNode,
    MemoryData,
    NamedTupleNode,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
    iter_leaves,
    structure_equal,
)
from ckpt_migrate.format.v05.treespec import dumps
from ckpt_migrate.hops import graph
from ckpt_migrate.hops.graph import GraphError
from ckpt_migrate.hops.hop import Hop, StepContext

ROOT = Path(__file__).resolve().parent.parent
NAMES = [r.name for r in releases.RELEASES]
PAIRS = list(itertools.pairwise(NAMES))


def module_name(index: int, source: str, target: str) -> str:
    """``v03_1_9_to_2_0``: sorts in release order and says the hop."""
    return f"v{index:02d}_{source.replace('.', '_')}_to_{target.replace('.', '_')}"


def chain() -> dict[str, tuple[str, str]]:
    return {module_name(i, s, t): (s, t) for i, (s, t) in enumerate(PAIRS, 1)}


# --------------------------------------------------------------------------- the shipped graph


def test_load_gives_thirteen_hops_in_release_order():
    g = graph.load()
    assert len(g.hops) == 13
    assert [(h.source, h.target) for h in g.hops] == PAIRS
    assert g.hops[0].source == "1.7"
    assert g.newest == "2.10" == releases.LATEST.name
    assert [h.module for h in g.hops] == [f"ckpt_migrate.migrations.{m}" for m in chain()]


def test_discover_and_validate_agree_with_load():
    assert graph.validate(graph.discover()).hops == graph.load().hops


def test_path_covers_every_hop():
    g = graph.load()
    hops = g.path(releases.get("1.7"), releases.get("2.10"))
    assert [(h.source, h.target) for h in hops] == PAIRS


def test_path_to_same_release_is_empty():
    assert graph.load().path(releases.get("2.0"), releases.get("2.0")) == []


def test_path_middle_section():
    hops = graph.load().path(releases.get("2.0"), releases.get("2.5"))
    assert [h.target for h in hops] == ["2.1", "2.2", "2.3", "2.4", "2.5"]


def test_path_goes_down_by_backward_hops_and_refuses_below_2_0():
    hops = graph.load().path(releases.get("2.3"), releases.get("2.1"))
    assert [(h.source, h.target) for h in hops] == [("2.3", "2.2"), ("2.2", "2.1")]
    assert all(h.is_downgrade for h in hops)
    with pytest.raises(UsageError) as info:
        graph.load().path(releases.get("2.3"), releases.get("1.8"))
    message = str(info.value)
    assert "cannot downgrade from 2.3 to 1.8: 2.0 → 1.9 is not offered" in message
    assert "release 2.0 or a later one" in message
    assert "\n" not in message


@pytest.mark.parametrize("hop", graph.load().hops, ids=lambda h: h.module.rsplit(".", 1)[1])
def test_hop_module_is_documented(hop: Hop):
    module = importlib.import_module(hop.module)
    assert module.__doc__ and module.__doc__.strip()
    assert hop.summary.startswith(f"{hop.source} → {hop.target}: ")
    assert len(hop.summary) > len(f"{hop.source} → {hop.target}: ") + 10
    assert "Sources:" in module.__doc__
    assert "handled elsewhere" in module.__doc__
    assert isinstance(module.OPERATIONS, tuple)
    assert isinstance(module.CHANGES, tuple)
    assert isinstance(module.INPUTS, tuple)
    for op in hop.operations:
        assert callable(op)
        doc = (op.__doc__ or "").strip()
        assert doc, f"{hop.module}.{op.__name__} has no docstring"
        assert len(doc.splitlines()) > 2, f"{op.__name__}: say which release changed what"
        assert "Source" in doc


@pytest.mark.parametrize("hop", graph.load().hops, ids=lambda h: h.module.rsplit(".", 1)[1])
def test_hop_releases_and_format(hop: Hop):
    source, target = releases.get(hop.source), releases.get(hop.target)
    assert (source.name, target.name) == (hop.source, hop.target)
    assert NAMES.index(target.name) == NAMES.index(source.name) + 1
    if releases.format_matches(source.format, target.format):
        assert hop.format is None
    else:
        assert hop.format == (source.format, target.format)
        assert hop.changes, "a format change must say what the writer changes"
    assert all(isinstance(c, str) and c.strip() for c in hop.changes)


def test_format_changes_where_the_reference_says():
    changed = {(h.source, h.target): h.format for h in graph.load().hops if h.format}
    assert changed == {
        ("1.7", "1.8"): (0.1, 0.2),
        ("1.8", "1.9"): (0.2, 0.3),
        ("1.9", "2.0"): (0.3, 0.4),
        ("2.4", "2.5"): (0.4, 0.5),
    }


def test_describe():
    hops = {(h.source, h.target): h for h in graph.load().hops}
    stamp = "Stamp the target release into ``__metadata__`` (files without one are left alone)."
    for pair in [("2.5", "2.6"), ("2.9", "2.10")]:
        assert hops[pair].describe() == [stamp]
    assert Hop("2.5", "2.6", "m", "").describe() == ["no change: only the release advances"]
    assert hops["2.1", "2.2"].describe()[0].startswith("Move sparsity masks")
    assert any("__H5_TYPE__" in line for line in hops["1.8", "1.9"].describe())
    assert any("TorchTensorH5Type" in line for line in hops["1.9", "2.0"].describe())
    assert any("__cstorch_version__" in line for line in hops["2.0", "2.1"].describe())
    lines = hops["2.4", "2.5"].describe()
    assert lines[0].startswith("Turn every namedtuple into a plain tuple")
    assert any("JSON treespec" in line for line in lines)
    assert any("LinkedObject" in line for line in lines)


def test_operations_of_each_hop():
    ops = {(h.source, h.target): [op.__name__ for op in h.operations] for h in graph.load().hops}
    stamp = "record_release_in_metadata"  # every hop that can meet a Trainer __metadata__ list
    assert ops.pop(("2.4", "2.5")) == ["namedtuples_to_tuples", stamp]
    assert ops.pop(("1.7", "1.8")) == ["keep_unprefixed_model_keys"]
    assert ops.pop(("2.0", "2.1")) == ["rename_position_embeddings", "move_position_helpers", stamp]
    assert ops.pop(("2.1", "2.2")) == ["move_sparsity_masks", stamp]
    assert ops.pop(("1.9", "2.0")) == [
        "fix_spec",
        "restore_tied_weights",
        "recompute_last_epoch",
        "convert_dataloader_state",
    ]
    assert ops.pop(("1.8", "1.9")) == []
    assert all(v == [stamp] for v in ops.values()) and len(ops) == 7


def test_dataloader_inputs_declared_on_1_9_to_2_0():
    hops = {(h.source, h.target): h for h in graph.load().hops}
    inputs = {i.name: i for i in hops["1.9", "2.0"].inputs}
    assert set(inputs) == {
        "data_iter_dir",
        "dataloader_type",
        "shuffle_seed",
        "allow_step_mismatch",
        "config",
        "drop_dataloader_state",
        "dataloader_state_deferred",
        "default_shuffle_seed",
    }
    assert not any(i.required for i in inputs.values())
    assert "data_iter_checkpoint_state_file_global" in inputs["data_iter_dir"].help
    # the scripts' own inputs and the verbs' own --config are no generated options
    options = {name for name, i in inputs.items() if i.option}
    assert options == set(inputs) - {"config", "dataloader_state_deferred", "default_shuffle_seed"}
    assert [i.name for i in hops["2.1", "2.2"].inputs] == ["drop_orphan_sparsity"]
    others = {("1.9", "2.0"), ("2.1", "2.2")}
    assert all(not h.inputs for pair, h in hops.items() if pair not in others)


# --------------------------------------------------------------------------- 2.4 → 2.5 operation


def _tensor() -> TensorLeaf:
    import numpy as np

    return TensorLeaf("float32", (2,), MemoryData(np.zeros(2, np.float32)))


def _run_2_4_to_2_5(root):
    hop = next(h for h in graph.load().hops if (h.source, h.target) == ("2.4", "2.5"))
    ctx = StepContext(root, hop=hop)
    for op in hop.operations:
        op(ctx)
    return ctx


def test_namedtuples_become_tuples_and_ties_stay():
    w = _tensor()
    shared = NamedTupleNode("Pair", ("x", "y"), [ValueLeaf(1), w])
    root = DictNode(
        [
            ("model", DictNode([("w", w)])),
            (
                "opt",
                NamedTupleNode(
                    "State", ("a", "b"), [w, NamedTupleNode("Inner", ("z",), [ValueLeaf("s")])]
                ),
            ),
            ("lst", SeqNode("list", [shared, shared])),
        ],
        ordered=True,
    )
    before = [(ref.name, ref.leaf) for ref in iter_leaves(root)]
    ctx = _run_2_4_to_2_5(root)
    out = ctx.root
    assert isinstance(out, DictNode) and out.ordered
    opt = out.get("opt")
    assert isinstance(opt, SeqNode) and opt.kind == "tuple"
    assert isinstance(opt.items[1], SeqNode) and opt.items[1].kind == "tuple"
    lst = out.get("lst")
    assert isinstance(lst, SeqNode) and lst.kind == "list"
    assert lst.items[0] is lst.items[1]  # one shared container stays one
    assert isinstance(lst.items[0], SeqNode) and lst.items[0].kind == "tuple"
    # same names, same leaf objects: ties (w at four places) stay ties
    after = [(ref.name, ref.leaf) for ref in iter_leaves(out)]
    assert [n for n, _ in after] == [n for n, _ in before]
    assert all(a is b for (_, a), (_, b) in zip(after, before))
    assert out.get("model").get("w") is opt.items[0] is lst.items[0].items[1]
    assert ctx.changes == [
        "[2.4→2.5] opt.1: namedtuple Inner(z) written as a tuple",
        "[2.4→2.5] opt: namedtuple State(a, b) written as a tuple",
        "[2.4→2.5] lst.0: namedtuple Pair(x, y) written as a tuple",
    ]
    assert ctx.warnings == []
    dumps(out)  # format 0.5 can now encode it


def test_namedtuple_at_root():
    ctx = _run_2_4_to_2_5(NamedTupleNode("Root", ("a",), [ValueLeaf(None)]))
    assert isinstance(ctx.root, SeqNode) and ctx.root.kind == "tuple"
    assert ctx.changes == ["[2.4→2.5] <root>: namedtuple Root(a) written as a tuple"]


def test_tree_without_namedtuples_is_untouched():
    root = DictNode([("a", SeqNode("tuple", [_tensor(), ValueLeaf(1.5)])), ("b", DictNode())])
    snapshot = DictNode(list(root.items))
    ctx = _run_2_4_to_2_5(root)
    assert ctx.root is root
    assert structure_equal(ctx.root, snapshot)
    assert ctx.changes == []


# --------------------------------------------------------------------------- broken graphs


@pytest.fixture
def make_package(tmp_path):
    """Writes a throw-away hop package under tmp_path and returns its (unique) name."""
    created: list[str] = []
    sys.path.insert(0, str(tmp_path))

    def make(modules: dict[str, tuple[str, str] | None]) -> str:
        name = f"ckpt_graph_test_{uuid.uuid4().hex[:10]}"
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text('"""Test hops."""\n')
        for mod, pair in modules.items():
            if pair is None:
                text = '"""No declaration."""\n'
            else:
                s, t = pair
                text = f'"""{s} → {t}: test hop."""\n\nSOURCE = "{s}"\nTARGET = "{t}"\n'
            (pkg / f"{mod}.py").write_text(text, encoding="utf-8")
        created.append(name)
        importlib.invalidate_caches()
        return name

    yield make
    sys.path.remove(str(tmp_path))
    for name in created:
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]


def _refused(package: str) -> str:
    with pytest.raises(GraphError) as info:
        graph.validate(graph.discover(package))
    assert info.value.exit_code == 1
    return str(info.value)


def test_valid_package_passes(make_package):
    name = make_package(chain())
    g = graph.validate(graph.discover(name))
    assert [h.module for h in g.hops] == [f"{name}.{m}" for m in chain()]
    assert g.newest == "2.10"


def test_duplicate_step_refused(make_package):
    name = make_package({**chain(), "v99_another_2_0_to_2_1": ("2.0", "2.1")})
    message = _refused(name)
    assert "duplicate step 2.0→2.1" in message
    assert f"{name}.v04_2_0_to_2_1" in message
    assert f"{name}.v99_another_2_0_to_2_1" in message


def test_cycle_refused(make_package):
    name = make_package({**chain(), "v99_back_2_1_to_2_0": ("2.1", "2.0")})
    message = _refused(name)
    assert f"{name}.v99_back_2_1_to_2_0 goes backwards (2.1→2.0)" in message
    assert "cycle through 2.0 → 2.1 → 2.0" in message


def test_gap_refused(make_package):
    modules = chain()
    del modules["v05_2_1_to_2_2"]
    message = _refused(make_package(modules))
    assert "gap: no step 2.1→2.2" in message
    assert "expected one newest release, found ['2.1', '2.10']" in message


def test_skipping_step_refused_and_named(make_package):
    modules = chain()
    del modules["v05_2_1_to_2_2"], modules["v06_2_2_to_2_3"]
    name = make_package({**modules, "v05_2_1_to_2_3": ("2.1", "2.3")})
    message = _refused(name)
    assert "gap: no step 2.1→2.2 (see " in message and f"{name}.v05_2_1_to_2_3" in message
    assert "gap: no step 2.2→2.3" in message


def test_two_newest_releases_refused(make_package):
    name = make_package({**chain(), "v14_2_9_to_2_11": ("2.9", "2.11")})
    message = _refused(name)
    assert f"{name}.v14_2_9_to_2_11 names unknown release '2.11'" in message
    assert f"release 2.9 has several next steps: {name}.v13_2_9_to_2_10, {name}.v14" in message
    assert "expected one newest release, found ['2.10', '2.11']" in message


def test_module_without_declaration_refused(make_package):
    name = make_package({**chain(), "v00_notes": None})
    with pytest.raises(GraphError, match=rf"{name}\.v00_notes lacks SOURCE/TARGET"):
        graph.discover(name)


def test_helper_modules_are_skipped(make_package):
    name = make_package({**chain(), "_helpers": None})
    assert len(graph.validate(graph.discover(name)).hops) == 13


KNOWN = releases.RELEASES[:4]  # 1.7, 1.8, 1.9, 2.0


def _hop(module: str, source: str, target: str) -> Hop:
    return Hop(source, target, module, f"{source} → {target}: test")


def _refused_hops(*hops: Hop) -> str:
    with pytest.raises(GraphError) as info:
        graph.validate(hops, KNOWN)
    return str(info.value)


def test_hops_valid():
    g = graph.validate(
        [_hop("c", "1.9", "2.0"), _hop("a", "1.7", "1.8"), _hop("b", "1.8", "1.9")], KNOWN
    )
    assert [h.module for h in g.hops] == ["a", "b", "c"]
    assert g.newest == "2.0"


def test_hops_duplicate():
    message = _refused_hops(
        _hop("a", "1.7", "1.8"),
        _hop("b", "1.8", "1.9"),
        _hop("c", "1.9", "2.0"),
        _hop("d", "1.9", "2.0"),
    )
    assert "duplicate step 1.9→2.0 in c, d" in message


def test_hops_cycle():
    message = _refused_hops(
        _hop("a", "1.7", "1.8"),
        _hop("b", "1.8", "1.9"),
        _hop("c", "1.9", "2.0"),
        _hop("back", "1.9", "1.8"),
    )
    assert "back goes backwards (1.9→1.8)" in message
    assert "cycle through 1.8 → 1.9 → 1.8" in message
    assert "release 1.9 has several next steps: c, back" in message


def test_hops_gap():
    message = _refused_hops(_hop("a", "1.7", "1.8"), _hop("c", "1.9", "2.0"))
    assert "gap: no step 1.8→1.9" in message


def test_hops_two_newest():
    message = _refused_hops(
        _hop("a", "1.7", "1.8"), _hop("b", "1.8", "1.9"), _hop("b2", "1.8", "2.0")
    )
    assert "release 1.8 has several next steps: b, b2" in message
    assert "expected one newest release, found ['1.9', '2.0']" in message
    assert "gap: no step 1.9→2.0 (see b, b2)" in message


def test_hops_unknown_release():
    message = _refused_hops(
        _hop("a", "1.7", "1.8"),
        _hop("b", "1.8", "1.9"),
        _hop("c", "1.9", "2.0"),
        _hop("x", "2.0", "9.9"),
    )
    assert "x names unknown release '9.9'" in message


# --------------------------------------------------------------------------- packaging


def test_built_wheel_contains_every_hop_module(tmp_path):
    """The hop modules ship in the wheel (package-dir mapping), not only in the editable install."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    if (ROOT / "README.md").exists():
        shutil.copy(ROOT / "README.md", src)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "ckpt_migrate", src / "ckpt_migrate", ignore=ignore)
    shutil.copytree(ROOT / "migrations", src / "migrations", ignore=ignore)
    dist = tmp_path / "dist"
    cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check"]
    proc = subprocess.run(
        [*cmd, "--outdir", str(dist), str(src)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = dist.glob("*.whl")

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(tmp_path / "unpacked")
    shipped = sorted(
        n.rsplit("/", 1)[1][:-3]
        for n in names
        if n.startswith("ckpt_migrate/migrations/") and n.endswith(".py")
    )
    assert shipped == ["__init__", *chain()]

    # The unpacked wheel (not the editable source tree) loads and validates the graph.
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "unpacked")}
    code = (
        "import ckpt_migrate, ckpt_migrate.hops.graph as g; "
        "print(ckpt_migrate.__file__); print(len(g.load().hops))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    where, count = proc.stdout.split()
    assert Path(where).is_relative_to(tmp_path / "unpacked")
    assert count == "13"


def test_a_hop_input_declared_once_reaches_every_command(monkeypatch, capsys, tmp_path):
    """A new input in one hop's INPUTS is an option of upgrade, upgrade-dir and plan (help and
    parsing, its value reaching the engine's inputs) and of the scripts, with its aliases."""
    import dataclasses
    import importlib.util

    from conftest import ROOT

    from ckpt_migrate.cli import hop_inputs
    from ckpt_migrate.cli.main import main
    from ckpt_migrate.hops.hop import InputSpec

    dummy = InputSpec(
        "sample_budget", "A dummy input of a test hop.", kind="int", aliases=("--sample_budget",)
    )
    real = graph.load()
    hops = [
        dataclasses.replace(h, inputs=(*h.inputs, dummy)) if h.source == "2.3" else h
        for h in real.hops
    ]
    monkeypatch.setattr(graph, "load", lambda: dataclasses.replace(real, hops=hops))
    for verb in ("upgrade", "upgrade-dir", "plan"):
        assert main([verb, "--help"]) == 0
        shown = capsys.readouterr().out
        assert "--sample-budget" in shown and "A dummy input of a test hop." in shown, verb
    assert hop_inputs.to_inputs({"sample_budget": 0}) == {"sample_budget": 0}
    src = ROOT / "fixtures" / "release-2.3.mdl"
    assert main(["plan", str(src), "--sample-budget", "5", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    [hop] = [h for h in planned["hops"] if h["from"] == "2.3"]
    assert {"name": "sample_budget", "given": True}.items() <= hop["inputs"][-1].items()
    spec = importlib.util.spec_from_file_location("fix", ROOT / "scripts/fix_checkpoint_spec.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = module.create_arg_parser().parse_args(["x.mdl", "--sample_budget", "3"])
    assert args.sample_budget == 3
