"""``__metadata__``: an upgrade stamps the release it reaches, as Model Zoo's converters do.

The 2.3+ Trainer (``strict_version``, default true) rejects a checkpoint whose
``__metadata__[-1]["version"]`` has another major.minor than the installed release
(MODELZOO_HISTORY.md §4.1), so an upgraded Trainer checkpoint must end with an entry for its new
release. One entry per upgrade, copied from the last one (``ckpt_migrate/ckpt_metadata.py``).
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest
from packaging.version import Version

import ckpt_migrate as cm
from ckpt_migrate.cli.main import main as cli_main
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.format import releases
from ckpt_migrate.format.compare import signature
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import (
    DictNode,
    MemoryData,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
    first_positions,
    get_path,
    iter_leaves,
)
from ckpt_migrate.hops import graph
from ckpt_migrate.hops.hop import StepContext
from ckpt_migrate.hops.trainer_metadata import metadata_version, record_release_in_metadata
from ckpt_migrate.torch import api

STEP = record_release_in_metadata.__doc__.strip().splitlines()[0]


def params(hidden: int) -> dict:
    return {
        "trainer": {
            "init": {
                "model": {"name": "gpt2", "hidden_size": hidden, "dropout": 0.125},
                "optimizer": {"AdamW": {"lr": 1.5e-4}},
            },
            "fit": {"ckpt_path": None, "val_steps": [10, 20]},
        }
    }


def trainer_state(*, metadata: bool = True) -> dict:
    """A 2.3-style Trainer checkpoint: a converter entry (2.2.0) then the Trainer's (2.3.0)."""
    state = {
        "model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)},
        "optimizer": {"state": {0: {"step": np.zeros((), np.float32)}}, "param_groups": []},
        "global_step": 40,
    }
    if metadata:
        state["__metadata__"] = [
            {"version": "2.2.0", "model_name": "", "params": params(32)},
            {"version": "2.3.0", "model_name": "gpt2", "params": params(64)},
        ]
    return state


def ties(root) -> set[tuple[str, str]]:
    """(tied position, the position it is tied to) for every tie in the tree."""
    firsts = first_positions(root)
    return {
        (ref.name, firsts[id(ref.leaf)].name)
        for ref in iter_leaves(root)
        if firsts[id(ref.leaf)].path != ref.path
    }


def upgraded(tmp_path: Path, state: dict, source: str, target: str):
    """``state`` saved at ``source`` (its last ``__metadata__`` entry saying so, as the Trainer
    of that release writes it) and upgraded to ``target``."""
    if state.get("__metadata__"):
        *kept, last = state["__metadata__"]
        last = type(last)(last)  # (an OrderedDict stays one)
        last["version"] = f"{source}.0"
        state = {**state, "__metadata__": [*kept, last]}
    src = tmp_path / "checkpoint_40.mdl"
    api.save(state, src, source)
    out = tmp_path / "out"
    out.mkdir()
    res = upgrade(src, UpgradeOptions(target=target, output_dir=out))
    assert res.status == "upgraded", res.error
    return src, out / src.name, res


def strict_version_accepts(meta: list, installed: str) -> bool:
    """What ``Checkpoint.check_compatibility`` decides (MODELZOO_HISTORY.md §4.1)."""
    version = Version(meta[-1]["version"])
    return version.local is not None or version.release[:2] == Version(installed).release[:2]


# --------------------------------------------------------------------------- through the engine


@pytest.mark.parametrize(
    ("source", "target"),
    [("2.3", "2.10"), ("2.3", "2.4"), ("2.1", "2.2"), ("2.4", "2.5"), ("2.9", "2.10")],
)
def test_upgrade_appends_one_entry_for_the_target(tmp_path, source, target):
    src, dst, res = upgraded(tmp_path, trainer_state(), source, target)
    before, after = cm.load(src)["__metadata__"], cm.load(dst)["__metadata__"]
    assert after[:-1] == before  # earlier entries unchanged
    assert len(after) == len(before) + 1  # one entry per upgrade, however many hops
    last = after[-1]
    assert list(last) == ["version", "model_name", "params"]
    assert last["version"] == f"{target}.0"
    assert last["model_name"] == "gpt2"
    assert last["params"] == before[-1]["params"]
    assert strict_version_accepts(after, f"{target}.0")
    assert not strict_version_accepts(before, f"{target}.0")
    lines = [c for c in res.changes if "__metadata__" in c]
    assert len(lines) == 1
    assert lines[0].startswith(f"[{source}→{target}] __metadata__.2: added")
    assert f"'{target}.0'" in lines[0] and "unconverted" in lines[0]
    assert not any("__metadata__" in w for w in res.warnings)


def test_no_leaf_is_shared_and_no_tie_is_created(tmp_path):
    src, dst, _ = upgraded(tmp_path, trainer_state(), "2.3", "2.10")
    with read_checkpoint(src) as a, read_checkpoint(dst) as b:
        assert ties(b.root) == ties(a.root)
        sig_a, sig_b = signature(a.root), signature(b.root)
        old, new = (get_path(b.root, ("__metadata__", i)) for i in (1, 2))
        assert isinstance(new, DictNode) and new.ordered is old.ordered is False
        assert all(isinstance(r.leaf, ValueLeaf) for r in iter_leaves(new))
        assert not {id(r.leaf) for r in iter_leaves(new)} & {
            id(r.leaf) for r in iter_leaves(b.root) if r.path[:2] != ("__metadata__", 2)
        }

        assert "tied" not in repr(signature(new))  # (the old entry's "gpt2" is one str object)
        old_py, new_py = api.to_python(old), api.to_python(new)
        assert new_py == {**old_py, "version": "2.10.0"}
        assert type(new_py) is type(old_py) is dict
    # everything else is the tree it was, the earlier entries included
    rest_a = [item for item in sig_a[2] if item[1] != "__metadata__"]
    rest_b = [item for item in sig_b[2] if item[1] != "__metadata__"]
    assert rest_a == rest_b
    meta_a = next(item for item in sig_a[2] if item[1] == "__metadata__")[2]
    meta_b = next(item for item in sig_b[2] if item[1] == "__metadata__")[2]
    assert meta_b[0] == meta_a[0] == "list" and meta_b[1][:2] == meta_a[1]


def test_two_digit_minor_versions(tmp_path):
    assert metadata_version("2.10") == "2.10.0"
    assert metadata_version("2.1") == "2.1.0"
    _, dst, _ = upgraded(tmp_path, trainer_state(), "2.9", "2.10")
    version = Version(cm.load(dst)["__metadata__"][-1]["version"])
    assert version.release == (2, 10, 0) and version.local is None


def test_a_checkpoint_without_metadata_is_left_alone(tmp_path):
    src, dst, res = upgraded(tmp_path, trainer_state(metadata=False), "2.3", "2.10")
    assert "__metadata__" not in cm.load(dst)
    assert not any("__metadata__" in line for line in res.changes + res.warnings)
    with read_checkpoint(src) as a, read_checkpoint(dst) as b:
        assert signature(a.root) == signature(b.root)


def test_an_empty_or_odd_metadata_is_kept_with_one_warning(tmp_path):
    state = trainer_state(metadata=False)
    state["__metadata__"] = []
    _, dst, res = upgraded(tmp_path, state, "2.3", "2.10")
    assert cm.load(dst)["__metadata__"] == []
    warned = [w for w in res.warnings if "__metadata__" in w]
    assert len(warned) == 1 and "strict_version" in warned[0], res.warnings
    assert not any("__metadata__" in line for line in res.changes)


def test_the_plan_lists_the_step_on_every_hop_from_2_0(tmp_path, capsys):
    src = tmp_path / "a.mdl"
    api.save(trainer_state(), src, "2.3")
    assert cli_main(["plan", str(src), "--to", "2.10", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [h["to"] for h in plan["hops"]] == ["2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10"]
    assert all(STEP in h["changes"] for h in plan["hops"])
    assert STEP.startswith("Stamp the target release into ``__metadata__``")
    assert "files without one are left alone" in STEP
    hops = graph.load().hops
    with_step = [(h.source, h.target) for h in hops if STEP in h.describe()]
    since_2_0 = [
        (h.source, h.target)
        for h in hops
        if releases.get(h.source).version >= releases.get("2.0").version
    ]
    assert with_step == since_2_0 and with_step[0] == ("2.0", "2.1")


# --------------------------------------------------------------------------- the step itself


def _tensor(values) -> TensorLeaf:
    array = np.asarray(values, np.float32)
    return TensorLeaf("float32", array.shape, MemoryData(array))


def _run(root, source: str, target: str) -> StepContext:
    hops = graph.load().path(*(releases.get(r) for r in (source, target)))
    ctx = StepContext(root)
    for hop in hops:
        ctx.hop = hop
        for op in hop.operations:
            if op is record_release_in_metadata:
                op(ctx)
    return ctx


def test_copy_is_deep_keeps_kinds_and_ties_nothing():
    shared = ValueLeaf("shared")
    tensor = _tensor([1.0, 2.0])
    params_node = DictNode(
        [("a", shared), ("b", SeqNode("list", [shared, tensor])), ("c", ValueLeaf(None))],
        ordered=True,
    )
    entry = DictNode(
        [
            ("version", ValueLeaf("2.3.0")),
            ("model_name", ValueLeaf("llama")),
            ("params", params_node),
        ],
        ordered=True,
    )
    root = DictNode(
        [("model", DictNode([("w", tensor)])), ("__metadata__", SeqNode("list", [entry]))]
    )
    ctx = _run(root, "2.3", "2.10")
    meta = root.get("__metadata__")
    assert isinstance(meta, SeqNode) and len(meta.items) == 2 and meta.items[0] is entry
    new = meta.items[1]
    assert isinstance(new, DictNode) and new.ordered
    assert new.get("version").value == "2.10.0"
    assert new.get("model_name").value == "llama"
    old_ids = {id(r.leaf) for r in iter_leaves(entry)} | {id(tensor)}
    assert not old_ids & {id(r.leaf) for r in iter_leaves(new)}
    copied = new.get("params")
    assert copied.ordered and copied.get("a") is not copied.get("b").items[0]  # not even inside
    copy_tensor = copied.get("b").items[1]
    assert copy_tensor is not tensor and np.array_equal(copy_tensor.data.read(), [1.0, 2.0])
    assert ties(params_node) == {("b.0", "a")} and ties(copied) == set()
    sig_old, sig_new = signature(params_node), signature(copied)
    assert sig_new[2][0] == sig_old[2][0] and sig_new[2][2] == sig_old[2][2]
    assert sig_new[2][1][2][1] == [
        ("value", ("str", "shared")),
        ("tensor", "float32", (2,), False, None),
    ]
    assert len(ctx.changes) == 1 and ctx.changes[0].startswith("[2.3→2.10] __metadata__.1")
    assert not ctx.warnings


def test_an_entry_without_model_name_gets_the_converters_empty_one():
    entry = DictNode([("version", ValueLeaf("2.1.0")), ("params", DictNode([]))])
    root = DictNode([("__metadata__", SeqNode("list", [entry]))])
    _run(root, "2.1", "2.3")
    new = root.get("__metadata__").items[-1]
    assert [k for k, _ in new.items] == ["version", "model_name", "params"]
    assert (new.get("version").value, new.get("model_name").value) == ("2.3.0", "")


@pytest.mark.parametrize("meta", [SeqNode("list", [ValueLeaf("2.3.0")]), ValueLeaf("2.3.0")])
def test_metadata_that_is_not_a_list_of_dicts_is_kept(meta):
    root = DictNode([("__metadata__", meta)])
    ctx = _run(root, "2.3", "2.10")
    assert root.get("__metadata__") is meta
    assert len(ctx.warnings) == 1 and "not a list of dicts" in ctx.warnings[0]
    assert not ctx.changes


def test_ordered_state_from_python_keeps_its_dict_kind(tmp_path):
    state = trainer_state()
    state["__metadata__"][-1] = collections.OrderedDict(state["__metadata__"][-1])
    _, dst, _ = upgraded(tmp_path, state, "2.3", "2.5")
    last = cm.load(dst)["__metadata__"][-1]
    assert type(last) is collections.OrderedDict and last["version"] == "2.5.0"


# --------------------------------------------------------------------------- the real library


def test_the_real_library_loads_the_upgraded_checkpoint(tmp_path):
    from digest import digest
    from real_cstorch import real_cstorch_info, real_digest_one, requires_real_cstorch

    mark = requires_real_cstorch()
    if mark.args[0]:
        pytest.skip(mark.kwargs["reason"])
    _, dst, _ = upgraded(tmp_path, trainer_state(), "2.3", "2.10")
    result = real_digest_one(dst)
    assert result["ok"], result.get("error")
    assert result["digest"] == digest(cm.load(dst))
    installed = real_cstorch_info()["cerebras_pytorch"]
    assert strict_version_accepts(cm.load(dst)["__metadata__"], installed)
