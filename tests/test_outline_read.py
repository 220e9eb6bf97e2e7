"""The outline read (issue 33): ``inspect``, ``plan`` and a dry run of a root-only chain read a
format 0.5 checkpoint's root and links, ``check`` its release attributes, and none of them
opens a dataset. Checked: the same answers as the full read on the real library's files and
this tool's; no dataset opened (counted, and shown on a file whose dataset headers HDF5
cannot read: the commands that answer from the outline answer, those that read the datasets
still refuse it); the preflight child tries exactly what the outline reads."""

from __future__ import annotations

import json
import marshal
import os
import re
from pathlib import Path

import h5py
import pytest
from conftest import REAL, one_line_error, run_cli
from test_attrtable import _unpacked

from ckpt_migrate.cli import commands
from ckpt_migrate.engine import plan as planner
from ckpt_migrate.errors import CkptError, CorruptCheckpointError
from ckpt_migrate.format import read as reader
from ckpt_migrate.format.h5 import linktable, preflight
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import iter_leaves
from ckpt_migrate.format.write import write_checkpoint

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL_DIR = FIXTURES / "real-cstorch-2.10"
REAL_XZ = sorted((FIXTURES / "real-cstorch-2.6-2.9").glob("*.mdl.xz"))
READS_IN_FULL = {"scalars_misc.mdl", "numpy_scalars.mdl"}  # a leaf whose dataset must be opened


def _full_inspect(path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    with monkeypatch.context() as m:
        m.setattr(reader, "read_outline", lambda p, *args: None)
        return commands.inspect(path)


def _ours(tmp_path: Path, release: str) -> Path:
    """The real basic checkpoint as this tool writes it for ``release``."""
    out = tmp_path / f"ours-{release}.mdl"
    with read_checkpoint(REAL / "basic.mdl") as ckpt:
        write_checkpoint(ckpt.root, out, release)
    return out


@pytest.mark.parametrize("src", sorted(REAL.glob("*.mdl")) + REAL_XZ, ids=lambda p: p.name)
def test_inspect_answers_as_the_full_read(src, tmp_path, monkeypatch):
    path = _unpacked(tmp_path, src)
    try:
        full = _full_inspect(path, monkeypatch)
    except CkptError as exc:  # (a key collision: refused by both)
        with pytest.raises(type(exc), match="shared by several keys"):
            commands.inspect(path)
        return
    assert commands.inspect(path) == full
    with read_checkpoint(path, outline=True) as ckpt:
        assert ckpt.outline == (src.name not in READS_IN_FULL)


def test_this_tools_files_and_plans_answer_as_the_full_read(tmp_path, monkeypatch):
    src = _ours(tmp_path, "2.5")
    assert commands.inspect(src) == _full_inspect(src, monkeypatch)
    outlined, checked = commands.plan(src, "2.10"), commands.check(src, "2.10")
    full = _full_plan(src, "2.10", monkeypatch)
    outlined.pop("free_available")
    with reader.read_checkpoint(src) as ckpt:
        assert checked["release"] == ckpt.release.name
    assert outlined.pop("tensor_bytes") is None and full.pop("tensor_bytes") > 0
    assert outlined == full
    assert outlined["hops"] and not outlined["datasets_changed"]
    assert checked["hops"] == [f"{h['from']}→{h['to']}" for h in outlined["hops"]]


def _full_plan(src: Path, target: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    """``plan`` from a read of every leaf (neither the root's nor the outline's)."""
    with monkeypatch.context() as m:
        m.setattr(reader, "read_outline", lambda p, *args: None)
        m.setattr(planner, "plan_from_root", lambda *args, **kwargs: None)
        full = commands.plan(src, target)
    full.pop("free_available")  # (other writers on the disk)
    return full


# Model Zoo 2.10's own writes: its converter's 2.1 models in 0.5 files, its Trainer's file
MODELZOO_XZ = [
    *sorted((FIXTURES / "modelzoo-2.10-converted").glob("*.mdl.xz")),
    FIXTURES / "modelzoo-2.10-trainer" / "checkpoint_4.mdl.xz",
]


@pytest.mark.parametrize("target", ["2.10", "2.5", "2.1"])
@pytest.mark.parametrize(
    "src", sorted(REAL.glob("*.mdl")) + REAL_XZ + MODELZOO_XZ, ids=lambda p: p.name
)
def test_a_plan_of_root_edits_is_the_full_reads_from_the_root_and_spec(
    src, target, tmp_path, monkeypatch
):
    """The real library's files (2.6-2.10), Model Zoo 2.10's (its converter's 2.1 models in
    2.10's container, its Trainer's file) and this tool's: a plan of hops that edit only the
    root, or none, is read from the root and the spec (``plan_from_root``: no leaf's
    metadata, 1.1 of the plan's 2.2 s at 150k leaves) and says what the full read's plan
    says (the family, hops, bytes, warnings), but for the tensors' bytes it did not read;
    any other plan (a 2.1 model's, a rewrite to 2.1) is the full read's, those bytes too."""
    for path in (_unpacked(tmp_path, src), _ours(tmp_path, "2.5")):
        if path.name.startswith("key_collision"):  # refused alike, from the spec
            with pytest.raises(CkptError) as full:
                _full_plan(path, target, monkeypatch)
            with pytest.raises(CkptError) as planned:
                commands.plan(path, target)
            assert str(planned.value) == str(full.value)
            continue
        planned = commands.plan(path, target)
        planned.pop("free_available")
        full = _full_plan(path, target, monkeypatch)
        from_root = planned["current"] or not planned["datasets_changed"]
        assert full["tensor_bytes"] >= 0
        if from_root:  # (unread)
            assert planned.pop("tensor_bytes") is None
            full.pop("tensor_bytes")
        assert planned == full


def test_a_plan_of_root_edits_does_not_judge_the_leaves_the_dry_run_does(tmp_path):
    """The real 2.10 library's file of a complex numpy array, which this tool does not read:
    ``plan`` (the root and the spec) gives the hops, and the upgrade's dry run refuses it in
    one line, as the upgrade does (README, "What each command reads")."""
    src = REAL_DIR / "refused" / "complex_array.mdl"
    proc = run_cli("plan", src, "--to", "2.5", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [h["to"] for h in json.loads(proc.stdout)["hops"]][-1] == "2.5"
    dry = run_cli("upgrade", src, "--to", "2.5", "--dry-run")
    one_line_error(dry, 2, "complex numpy array", "does not read")


def test_no_dataset_is_opened(tmp_path, monkeypatch):
    """h5py opens an object by ``h5o.open``: an outline read makes no such call in this
    process (the full read opens the datasets its preflight child could not vouch for)."""
    src = _ours(tmp_path, "2.5")
    opened: list[bytes] = []
    real_open = h5py.h5o.open

    def counting(loc, name, *args, **kwargs):
        if name not in (b"/", b"."):  # (h5py's File opens its root group)
            opened.append(name)
        return real_open(loc, name, *args, **kwargs)

    monkeypatch.setattr(h5py.h5o, "open", counting)
    with read_checkpoint(src, outline=True) as ckpt:
        assert ckpt.outline and ckpt.data_bytes is None
    assert opened == []
    commands.check(src, "2.10")
    assert opened == []
    with read_checkpoint(src, isolate=False) as ckpt:  # (the count counts: without a walk
        # before it, the full read opens every tensor's dataset here)
        assert not ckpt.outline
    assert opened


def _unreadable_dataset_headers(tmp_path: Path, release: str) -> tuple[Path, str]:
    """This tool's file for ``release`` with every tensor dataset's object header overwritten
    at its start (its version or signature): HDF5 cannot open one, the root is intact."""
    path = _ours(tmp_path, release)
    with h5py.File(path, "r") as f:
        names = [n for n in f if isinstance(f[n], h5py.Dataset) and f[n].shape != ()]
        addresses = [h5py.h5o.get_info(f[n].id).addr for n in names]
    with open(path, "r+b") as fh:
        for address in addresses:
            fh.seek(address)
            fh.write(b"\xff\xff\xff\xff")
    return path, names[0]


def test_what_each_command_reads_of_a_file_whose_datasets_cannot_be_opened(tmp_path):
    """The outline answers ``inspect``, ``plan`` and ``check`` of a root-only chain (2.5 ->
    2.10), and is true of the file: its root. Every command that reads a dataset refuses it as
    before, in one line: ``check --deep``, ``verify``, ``to-torch``; the upgrade and its dry run
    too (their scan of the dataset headers cannot read them, so the full walk decides); and a
    tensor read after an outline read waits for the full walk."""
    src, name = _unreadable_dataset_headers(tmp_path, "2.5")
    inspected = run_cli("inspect", src, "--json")
    assert inspected.returncode == 0, inspected.stderr
    leaves = {e["name"]: e["value"] for e in json.loads(inspected.stdout)["leaves"]}
    assert leaves[name].startswith("tensor ")
    assert run_cli("plan", src, "--to", "2.10").returncode == 0
    assert run_cli("check", src, "--to", "2.10").returncode == 10
    one_line_error(run_cli("upgrade", src, "--to", "2.10", "--dry-run"), 2, str(src))

    one_line_error(run_cli("check", src, "--deep"), 2, str(src))
    out = tmp_path / "out"
    one_line_error(run_cli("upgrade", src, "--to", "2.10", "-o", out), 2, str(src))
    one_line_error(run_cli("verify", src, src), 2, str(src))
    one_line_error(run_cli("to-torch", src, tmp_path / "t.pt"), 2, str(src))
    with read_checkpoint(src, outline=True) as ckpt:
        assert ckpt.outline
        with pytest.raises(CorruptCheckpointError, match="damaged"):
            ckpt.handle.read_dataset(name)


def test_a_chain_that_changes_datasets_dry_runs_on_the_full_read(tmp_path):
    """2.4 -> 2.10 rewrites every dataset (format 0.4 -> 0.5): a legacy file is read in full,
    and its dry run refuses a file the real run refuses."""
    src, _ = _unreadable_dataset_headers(tmp_path, "2.4")
    one_line_error(run_cli("upgrade", src, "--to", "2.10", "--dry-run"), 2, str(src))
    one_line_error(run_cli("inspect", src), 2, str(src))


def test_the_outline_child_tries_what_the_outline_reads(tmp_path, monkeypatch):
    """A crash of HDF5 on the outline's reads ends the child, not the command: the child
    runs the outline walk (not the full one), and a child killed by a signal is named."""
    src = _ours(tmp_path, "2.10")
    walked: list[str] = []
    real_walk = preflight._walk

    def spy(*args, **kwargs):
        walked.append("full")
        return real_walk(*args, **kwargs)

    monkeypatch.setattr(preflight, "_walk", spy)
    found = preflight.preflight(src, scope="outline")
    assert found is not None and found.datasets == {} and walked == []

    from ckpt_migrate.format.h5 import preflight_outline

    def crash(*args):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)

    monkeypatch.setattr(preflight_outline, "walk", crash)
    with pytest.raises(CorruptCheckpointError, match="crashed"):
        read_checkpoint(src, outline=True)
    with pytest.raises(CorruptCheckpointError, match="crashed"):
        commands.check(src)


def test_check_still_refuses_an_unfinished_save(tmp_path):
    src = _ours(tmp_path, "2.10")
    with h5py.File(src, "r+") as f:
        del f.attrs["__SUCCESS__"]
    one_line_error(run_cli("check", src), 2, "no __SUCCESS__ marker")


@pytest.mark.parametrize("name", ["model.layers.0.w", "", "a-b_c", "é", 'q"x', "a\\b", "x y"])
def test_a_leafs_own_spec_is_the_json_cstorch_writes(name):
    """``single_leaf_spec`` puts a plain name in place: the same text as ``json.dumps``."""
    from ckpt_migrate.format.v05 import treespec

    node = {
        "type": "builtins.dict",
        "context": json.dumps([name]),
        "children_spec": [{"type": None, "context": None, "children_spec": []}],
    }
    assert treespec.single_leaf_spec(name) == json.dumps([1, node])


@pytest.mark.parametrize(
    ("release", "target"), [("2.5", "2.10"), ("2.10", "2.5"), ("2.10", "2.10")]
)
def test_a_dry_run_from_the_outline_says_what_the_full_read_says(
    tmp_path, monkeypatch, release, target
):
    """Root-only chains both ways and a file already current: the same report (changes,
    warnings, plan), the outline read standing in for the full one."""
    from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade

    src = _ours(tmp_path, release)

    def dry_run() -> dict:
        done = upgrade(src, UpgradeOptions(target=target, dry_run=True)).to_json()
        done.pop("seconds")
        if done.get("plan"):
            done["plan"].pop("free_available")  # (other writers on the disk)
        return done

    outlined = dry_run()
    with monkeypatch.context() as m:
        m.setattr(reader, "read_outline", lambda p, *args: None)
        assert dry_run() == outlined
    assert outlined["status"] == ("current" if release == target else "planned")


def test_a_small_root_with_attribute_info_but_no_heap_is_read_from_its_outline(tmp_path):
    """A version-2 root that tracks its attributes' creation order keeps them in its header
    until there are many (its attribute info message then names no fractal heap): the one-pass
    reader used to give up on it, and every small file this tool writes went to the full read."""
    import numpy as np

    from ckpt_migrate.format.tree import DictNode, MemoryData, TensorLeaf, ValueLeaf, iter_leaves

    w = TensorLeaf("float32", (4,), MemoryData(np.arange(4, dtype=np.float32)))
    src = tmp_path / "s.mdl"
    write_checkpoint(DictNode([("w", w), ("step", ValueLeaf(3))]), src, "2.5")
    with h5py.File(src, "r") as f:
        assert h5py.h5o.get_info(f.id).num_attrs < 8  # compact, in the header
    outline = reader.read_outline(src)
    assert outline is not None
    with outline, read_checkpoint(src) as full:
        assert outline.outline and not full.outline
        names = [r.name for r in iter_leaves(full.root)]
        assert names == [r.name for r in iter_leaves(outline.root)] == ["w", "step"]


def _with_attribute(tmp_path: Path, name: str, text: str) -> Path:
    """The real library's basic file with one root attribute set to ``text``."""
    path = tmp_path / "basic.mdl"
    path.write_bytes((REAL_DIR / "basic.mdl").read_bytes())
    with h5py.File(path, "a") as f:
        f.attrs[name] = text
    return path


@pytest.mark.parametrize("outline", [True, False])
def test_a_leafs_unreadable_metadata_is_named_and_a_strays_is_not_decoded(tmp_path, outline):
    """Every ``*.__metadata__`` text is parsed as the root is read, but only a leaf's is
    decoded: a leaf's broken JSON is refused, naming it; an attribute no leaf is named by is
    never judged (as when the leaves were decoded by name)."""
    path = _with_attribute(tmp_path, "model.w.__metadata__", "{not json")
    with pytest.raises(CorruptCheckpointError, match=r"'model\.w\.__metadata__' is not valid JSON"):
        read_checkpoint(path, outline=outline)
    path = _with_attribute(tmp_path, "no.such.leaf.__metadata__", "{not json")
    with read_checkpoint(path, outline=outline) as ckpt:
        assert [r.name for r in iter_leaves(ckpt.root)] == [
            r.name for r in iter_leaves(read_checkpoint(REAL_DIR / "basic.mdl").root)
        ]


def test_the_parent_reads_through_hdf5_only_what_the_outline_child_tried(tmp_path, monkeypatch):
    """An outline read's parent opens through HDF5 only the root attributes the child tried
    first (``preflight_outline.OUTLINE_NAMES``): ``__spec__`` and the leaves' texts come from
    the one-pass reader. A plan of root edits reads the release's attributes and ``__spec__``
    (``SPEC_NAMES``, which its child tried), its in-place bound from the spec's size."""
    from ckpt_migrate.format.h5 import preflight_outline

    src = _ours(tmp_path, "2.5")
    opened: list[str] = []
    real = h5py.h5a.open

    def spy(*args, **kwargs):
        name = kwargs.get("name", args[1] if len(args) > 1 else None)
        if name is not None:
            opened.append(name.decode() if isinstance(name, bytes) else name)
        return real(*args, **kwargs)

    monkeypatch.setattr(h5py.h5a, "open", spy)
    assert commands.inspect(src)["leaf_count"] > 0
    assert opened and set(opened) <= set(preflight_outline.OUTLINE_NAMES), opened
    opened.clear()  # a plan of root edits: the release's attributes and the spec
    assert commands.plan(src, "2.10", output_dir=tmp_path / "out")["datasets_changed"] is False
    versions = {n for n in opened if re.fullmatch(r"__metadata__\.\d+\.version\.__metadata__", n)}
    assert versions, opened  # (a Trainer's version leaves, which the child tries too)
    assert "__spec__" in opened and set(opened) - versions <= set(preflight_outline.SPEC_NAMES)


@pytest.mark.parametrize("src", sorted(REAL.glob("*.mdl")) + REAL_XZ, ids=lambda p: p.name)
@pytest.mark.parametrize("scope", ["outline", "storage"])
def test_the_outline_child_hands_over_the_links_this_process_would_read(src, scope, tmp_path):
    """The real library's files (and the ones this tool writes): the child's links are the
    ones ``linktable`` reads here, name for name and address for address."""
    for path in (_unpacked(tmp_path, src), _ours(tmp_path, "2.5")):
        found = preflight.preflight(path, scope=scope, defer=True)
        assert found is not None and found.rest is not None
        try:
            with h5py.File(path, "r") as f:
                assert found.rest.links(path) == linktable.of_root(f, path)
        finally:
            found.rest.cancel()


def _only_in(parent: bool, real):
    """``real``, but answering None in the parent (``parent``) or in a child (not)."""
    pid = os.getpid()
    return lambda *args: None if (os.getpid() == pid) == parent else real(*args)


@pytest.mark.parametrize(
    "real", [REAL / "tied.mdl", *REAL_XZ, None], ids=lambda p: "ours" if p is None else p.name
)
def test_an_outline_read_takes_the_links_from_its_child(real, tmp_path, monkeypatch):
    """The real library's files (a tie, the 2.6 and 2.9 trainers' files) and ours: read
    with no link read by this process, they answer as the full read does."""
    src = _ours(tmp_path, "2.10") if real is None else _unpacked(tmp_path, real)
    expected = _full_inspect(src, monkeypatch)
    monkeypatch.setattr(linktable, "of_root", _only_in(True, linktable.of_root))
    with read_checkpoint(src, outline=True) as ckpt:
        assert ckpt.outline  # (the parent read no link: the child's were taken)
        assert ckpt.handle.addresses() == _child_links(src)
    assert commands.inspect(src) == expected


def _child_links(src: Path) -> dict[str, int] | None:
    found = preflight.preflight(src, scope="outline", defer=True)
    assert found is not None and found.rest is not None
    try:
        return found.rest.links(src)
    finally:
        found.rest.cancel()


@pytest.mark.parametrize("written", [None, b"not marshal", "a string", {"x": 1}, {1: 2}])
def test_links_the_child_did_not_hand_over_are_read_here(written, tmp_path, monkeypatch):
    """No links, a file that is not ``marshal``'s, or not the links (another type, another
    count, names that are no strings): the parent reads them itself, and the read is the
    outline's as before."""
    src = _ours(tmp_path, "2.10")
    expected = _full_inspect(src, monkeypatch)
    from ckpt_migrate.format.h5 import preflight_outline

    with monkeypatch.context() as m:
        if written is None:
            m.setattr(linktable, "of_root", _only_in(False, linktable.of_root))
        else:
            raw = written if isinstance(written, bytes) else marshal.dumps(written)
            m.setattr(preflight_outline.marshal, "dumps", lambda _: raw)
        assert _child_links(src) is None
        with read_checkpoint(src, outline=True) as ckpt:
            assert ckpt.outline
        assert commands.inspect(src) == expected


def test_an_outline_that_does_not_suffice_is_let_go_of_before_the_full_read(tmp_path, monkeypatch):
    """``read_planned``: where the outline's plan is not enough (a 2.5 → 2.4 rewrite), the
    outline's tree is gone before the full read builds its own (both at once were 108 MiB of
    that rewrite's peak at 150k leaves, issue 33); the plan is the full read's."""
    import gc
    import weakref

    src = _ours(tmp_path, "2.5")
    roots: list[weakref.ref] = []
    alive_at_second: list[bool] = []
    real = planner.read_checkpoint

    def read(path, **kwargs):
        if roots:
            gc.collect()
            alive_at_second.append(any(ref() is not None for ref in roots))
        ckpt = real(path, **kwargs)
        roots.append(weakref.ref(ckpt))  # (what holds the tree; a node takes no weak ref)
        return ckpt

    def plan_of(*args, **kwargs):
        plan = make_plan(*args, **kwargs)
        roots.append(weakref.ref(plan))
        return plan

    make_plan = planner.make_plan
    monkeypatch.setattr(planner, "read_checkpoint", read)
    monkeypatch.setattr(planner, "make_plan", plan_of)
    ckpt, plan = planner.read_planned(src, "2.4", enough=lambda plan: plan.root_only)
    with ckpt:
        assert not ckpt.outline and not plan.root_only
    assert len(roots) == 4 and alive_at_second == [False]
