"""The format core on real files: digests of real-library files, round trips, errors."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import FIXTURES, REAL, one_line_error, real_2x_files, run_cli
from digest import digest, load_expected

import ckpt_migrate as cm
from ckpt_migrate.errors import (
    CorruptCheckpointError,
    KeyCollisionError,
    MissingLeavesError,
    NewerThanToolError,
    NotACheckpointError,
    UnsupportedContentError,
)
from ckpt_migrate.format import compare as verify
from ckpt_migrate.format import releases
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import (
    DictNode,
    MemoryData,
    NamedTupleNode,
    OpaqueLeaf,
    TensorLeaf,
    ValueLeaf,
    iter_leaves,
    name_collisions,
)
from ckpt_migrate.format.v05.treespec import as_tuples
from ckpt_migrate.format.write import write_checkpoint


def describe(root, *, missing_as_none=False, numpy_as_tensor=False, namedtuple_as_tuple=False):
    """Everything about a tree, tensor bytes included, as the written format can hold it."""
    if missing_as_none:
        root = verify.missing_as_none(root)
    if namedtuple_as_tuple:
        root = as_tuples(root)
    return verify.signature(root, numpy_as_tensor=numpy_as_tensor, hash_tensors=True)


REAL_CASES = sorted(p.stem for p in REAL.glob("*.mdl") if "collision" not in p.stem)
RELEASE_FIXTURES = sorted(FIXTURES.glob("release-*.mdl"))
ALL_FIXTURES = [REAL / f"{c}.mdl" for c in REAL_CASES] + RELEASE_FIXTURES


@pytest.mark.parametrize("case", REAL_CASES)
def test_real_library_files_give_their_expected_digest(case):
    state = cm.load(REAL / f"{case}.mdl", objects_mode="data")
    assert digest(state) == load_expected(case)


@pytest.mark.parametrize("case", ["key_collision", "key_collision_int_str"])
def test_colliding_keys_are_refused_not_misread(case):
    with pytest.raises(KeyCollisionError, match=r"collide|shared by several keys"):
        read_checkpoint(REAL / f"{case}.mdl")


def test_every_release_has_a_fixture():
    names = {p.stem.removeprefix("release-") for p in RELEASE_FIXTURES}
    assert names == {"1.7", "1.8", "1.9", "2.0", "2.3", "2.10"}


@pytest.mark.parametrize("path", RELEASE_FIXTURES, ids=lambda p: p.stem)
def test_release_detected_from_file(path):
    with read_checkpoint(path) as ckpt:
        assert ckpt.release is not None
        assert ckpt.release.name == path.stem.removeprefix("release-")
        assert releases.format_matches(ckpt.format, ckpt.release.format)


@pytest.mark.filterwarnings("ignore:.*written as")
@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: p.stem)
@pytest.mark.parametrize("target", ["2.0", "2.3", "2.10"])
def test_round_trip_through_writers_keeps_the_tree(path, target, tmp_path):
    rel = releases.get(target)
    with read_checkpoint(path) as ckpt:
        src = ckpt.root
        out = tmp_path / "out.mdl"
        if rel.legacy and any(r.name == "" for r in iter_leaves(src)):
            with pytest.raises(UnsupportedContentError, match="empty leaf name"):
                write_checkpoint(src, out, target, allow_missing=True)
            assert list(tmp_path.iterdir()) == []
            return
        if target == "2.0" and path.stem == "dtypes":  # (uint16-64: tests/test_downgrade.py)
            with pytest.raises(UnsupportedContentError, match="torch does not have"):
                write_checkpoint(src, out, target, allow_missing=True)
            assert list(tmp_path.iterdir()) == []
            return
        write_checkpoint(src, out, target, allow_missing=True)
        legacy_numpy = ckpt.format <= 0.3
        opts = dict(
            missing_as_none=not rel.legacy,
            namedtuple_as_tuple=not rel.legacy,
            numpy_as_tensor=legacy_numpy,
        )
        with read_checkpoint(out) as back:
            assert describe(back.root, **opts) == describe(src, **opts)
            assert back.release is rel


def test_round_trip_is_exact_for_bf16_nan_payloads_and_non_finite(tmp_path):
    with read_checkpoint(FIXTURES / "release-2.0.mdl") as ckpt:
        bias = next(r.leaf for r in iter_leaves(ckpt.root) if r.name == "model.fc.bias")
        bits = bias.data.read().view("<u2").tolist()
        assert bits == [0x3FC0, 0xC000, 0x7FC1]
        values = {r.name: r.leaf for r in iter_leaves(ckpt.root)}
        assert str(values["misc.neg_zero"].value) == "-0.0"
        assert values["misc.inf"].value == float("-inf")
        assert values["misc.nan"].value != values["misc.nan"].value


def test_missing_leaves_are_marked_listed_and_refused_by_load(tmp_path):
    path = FIXTURES / "release-1.9.mdl"
    with read_checkpoint(path) as ckpt:
        assert ckpt.missing == ["model.lm_head.weight"]
        assert ckpt.unreferenced == ["__model.x.arg_0"]
    with pytest.raises(MissingLeavesError, match=r"model\.lm_head\.weight"):
        cm.load(path)
    state = cm.load(path, allow_missing=True)
    assert state["model"]["lm_head.weight"] is None
    with pytest.raises(MissingLeavesError, match="lm_head"), read_checkpoint(path) as ckpt:
        write_checkpoint(ckpt.root, tmp_path / "x.mdl", "2.10")
    assert list(tmp_path.iterdir()) == []


def test_missing_leaves_read_as_none_and_a_tree_without_them_is_itself():
    """``missing_as_none`` (what format 0.5 writes): the tree itself where nothing is missing
    (the written file's check copies no containers), a copy with None where something is."""
    from ckpt_migrate.format.tree import MissingLeaf, ValueLeaf

    with read_checkpoint(REAL / "tied.mdl") as ckpt:
        assert verify.missing_as_none(ckpt.root) is ckpt.root
    with read_checkpoint(FIXTURES / "release-1.9.mdl") as ckpt:
        mapped = verify.missing_as_none(ckpt.root)
        before = {r.name: r.leaf for r in iter_leaves(ckpt.root)}
        after = {r.name: r.leaf for r in iter_leaves(mapped)}
    assert mapped is not ckpt.root and before.keys() == after.keys()
    assert isinstance(before["model.lm_head.weight"], MissingLeaf)
    assert isinstance(after["model.lm_head.weight"], ValueLeaf)
    assert after["model.lm_head.weight"].value is None
    assert all(after[n] is leaf for n, leaf in before.items() if n != "model.lm_head.weight")


def test_ties_are_one_leaf_object():
    with read_checkpoint(REAL / "tied.mdl") as ckpt:
        by_name = {r.name: r.leaf for r in iter_leaves(ckpt.root)}
        assert by_name["model.embed.weight"] is by_name["model.lm_head.weight"]
        assert by_name["copies.0"] is by_name["model.embed.weight"]
        assert by_name["not_tied"] is not by_name["model.embed.weight"]
    with read_checkpoint(FIXTURES / "release-2.0.mdl") as ckpt:  # hard links in 0.4
        by_name = {r.name: r.leaf for r in iter_leaves(ckpt.root)}
        assert (
            by_name["model.lm_head.weight"]
            is by_name["model.embedding_layer.word_embeddings.weight"]
        )


def test_load_reads_no_tensor_data_until_used(monkeypatch):
    from ckpt_migrate.format.h5 import io as h5io

    reads: list[str] = []
    real = h5io.H5Handle.read_dataset
    monkeypatch.setattr(
        h5io.H5Handle, "read_dataset", lambda self, n: reads.append(n) or real(self, n)
    )
    state = cm.load(REAL / "basic.mdl")
    assert reads == []
    assert float(state["model"]["w"].sum()) == pytest.approx(float(state["model"]["w"].sum()))
    assert reads == ["model.w"]


def test_save_load_python_state_keeps_ties_bf16_and_int_keys(tmp_path):
    import torch

    w = torch.randn(3, 4)
    sd = {
        "model": {
            "w": w,
            "w_alias": w,
            "b": torch.tensor([1.5, float("nan")], dtype=torch.bfloat16),
        },
        "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"params": [0]}]},
        "x": float("-inf"),
        "big": 2**80,
        "z": -0.0,
    }
    for release in ("2.0", "2.10"):
        out = tmp_path / f"{release}.mdl"
        cm.save(sd, out, release)
        back = cm.load(out)
        assert back["model"]["w"] is back["model"]["w_alias"]
        assert torch.equal(back["model"]["w"], w)
        assert (
            back["model"]["b"].view(torch.int16).tolist()
            == sd["model"]["b"].view(torch.int16).tolist()
        )
        assert list(back["optimizer"]["state"]) == [0]
        assert back["big"] == 2**80 and str(back["z"]) == "-0.0"


def test_to_torch_and_back_keeps_ties_and_bits(tmp_path):
    import torch

    pt = tmp_path / "plain.pt"
    cm.to_torch(REAL / "tied.mdl", pt)
    plain = torch.load(pt, weights_only=True)
    assert plain["model"]["embed.weight"] is plain["model"]["lm_head.weight"]
    assert plain["copies"][1] is plain["model"]["x"]
    back = tmp_path / "back.mdl"
    cm.from_torch(pt, back)
    assert digest(cm.load(back)) == load_expected("tied")
    d2 = tmp_path / "dtypes.pt"
    cm.to_torch(REAL / "dtypes.mdl", d2)
    cm.from_torch(d2, tmp_path / "dtypes.mdl")
    assert digest(cm.load(tmp_path / "dtypes.mdl")) == load_expected("dtypes")


def test_save_refuses_colliding_keys_before_writing(tmp_path):
    out = tmp_path / "c.mdl"
    with pytest.raises(KeyCollisionError, match=r"'a\.b'"):
        cm.save({"a.b": 1, "a": {"b": 2}}, out)
    with pytest.raises(KeyCollisionError, match=r"'m\.1'"):
        cm.save({"m": {1: "one", "1": "string one"}}, out)
    assert list(tmp_path.iterdir()) == []


def test_save_refuses_unknown_objects_and_existing_files(tmp_path):
    with pytest.raises(UnsupportedContentError, match="pickle_objects"):
        cm.save({"x": object()}, tmp_path / "a.mdl")
    cm.save({"x": 1}, tmp_path / "b.mdl")
    with pytest.raises(Exception, match="already exists"):
        cm.save({"x": 2}, tmp_path / "b.mdl")
    assert cm.load(tmp_path / "b.mdl") == {"x": 1}


def test_failed_write_leaves_nothing_behind(tmp_path):
    class Boom(MemoryData):
        def read(self):
            raise OSError(28, "No space left on device")

    tree = DictNode([("a", TensorLeaf("float32", (2,), Boom(np.zeros(2, "<f4"))))])
    with pytest.raises(Exception, match="no space left"):
        write_checkpoint(tree, tmp_path / "x.mdl")
    assert list(tmp_path.iterdir()) == []


def test_opaque_objects_stay_opaque_and_are_carried_over(tmp_path):
    payload = b"\x80\x04\x95\x08\x00\x00\x00\x00\x00\x00\x00]\x94(K\x01K\x02e."
    tree = DictNode([("obj", OpaqueLeaf(payload))])
    for release in ("2.0", "2.10"):
        out = tmp_path / f"{release}.mdl"
        write_checkpoint(tree, out, release)
        with read_checkpoint(out) as ckpt:
            (ref,) = list(iter_leaves(ckpt.root))
            assert isinstance(ref.leaf, OpaqueLeaf) and ref.leaf.payload == payload
        assert repr(cm.load(out)["obj"]).startswith("OpaqueObject(")
        assert cm.load(out, objects_mode="data")["obj"] == [1, 2]


def test_namedtuples_survive_legacy_and_become_tuples_in_05(tmp_path):
    tree = DictNode([("nt", NamedTupleNode("Pair", ("a", "b"), [ValueLeaf(1), ValueLeaf(2)]))])
    write_checkpoint(tree, tmp_path / "l.mdl", "2.0")
    loaded = cm.load(tmp_path / "l.mdl")["nt"]
    assert type(loaded).__name__ == "Pair" and loaded.a == 1 and loaded.b == 2
    with pytest.warns(UserWarning, match="namedtuples written as tuples"):
        write_checkpoint(tree, tmp_path / "n.mdl", "2.10")
    assert cm.load(tmp_path / "n.mdl")["nt"] == (1, 2)


# --------------------------------------------------------------------------- bad input


def _h5(path: Path, **attrs) -> Path:
    with h5py.File(path, "w") as f:
        for k, v in attrs.items():
            f.attrs[k] = v
        f["data"] = np.arange(3)
    return path


def test_a_truncated_file_says_so_in_plain_words_with_a_fix(tmp_path):
    """HDF5's "truncated file: eof = …, sblock->base_addr = …" was the problem, without a fix."""
    data = (FIXTURES / "release-2.3.mdl").read_bytes()
    truncated = tmp_path / "checkpoint_400.mdl"
    truncated.write_bytes(data[:30000])
    with pytest.raises(CorruptCheckpointError) as info:
        read_checkpoint(truncated)
    line = str(info.value)
    assert line.startswith(f"{truncated}: is truncated"), line
    assert "30,000" in line and "eof" not in line and "sblock" not in line, line
    assert info.value.fix is not None and "another copy" in info.value.fix


def test_not_hdf5_truncated_and_foreign_hdf5_are_one_line_errors(tmp_path):
    text = tmp_path / "notes.mdl"
    text.write_text("hello")
    with pytest.raises(NotACheckpointError, match="not an HDF5 file"):
        read_checkpoint(text)
    truncated = tmp_path / "trunc.mdl"
    data = (REAL / "basic.mdl").read_bytes()
    truncated.write_bytes(data[: len(data) // 3])
    with pytest.raises((CorruptCheckpointError, NotACheckpointError)) as info:
        read_checkpoint(truncated)
    assert "\n" not in str(info.value) and str(truncated) in str(info.value)
    foreign = _h5(tmp_path / "foreign.h5")
    with pytest.raises(CorruptCheckpointError, match="not a Cerebras checkpoint"):
        read_checkpoint(foreign)
    with pytest.raises(NotACheckpointError, match="no such file"):
        read_checkpoint(tmp_path / "absent.mdl")


def test_newer_format_is_refused(tmp_path):
    path = tmp_path / "new.mdl"
    shutil.copy(REAL / "basic.mdl", path)
    with h5py.File(path, "a") as f:
        f.attrs["__version__"] = 0.6
    with pytest.raises(NewerThanToolError, match="newer than this tool"):
        read_checkpoint(path)


@pytest.mark.parametrize("version", [0.5000557899475098, 1e300, 0.55])
def test_a_damaged_format_number_is_not_called_newer(tmp_path, version):
    """Formats are tenths; a flipped bit in __version__ is damage (exit 2), not a future format."""
    path = tmp_path / "flipped.mdl"
    shutil.copy(REAL / "basic.mdl", path)
    with h5py.File(path, "a") as f:
        f.attrs["__version__"] = version
    with pytest.raises(CorruptCheckpointError, match="unknown checkpoint format version"):
        read_checkpoint(path)


@pytest.mark.parametrize(
    ("fixture", "release"), [("release-2.0.mdl", "2.0"), ("release-2.3.mdl", "2.3")]
)
def test_a_format_number_stored_as_float32_is_that_format(tmp_path, fixture, release):
    """A script that wrote ``__version__`` as ``np.float32(0.4)`` (h5py keeps the numpy type:
    0.4000000059604645 on reading) wrote format 0.4, not an unknown one; it is read and upgraded."""
    path = tmp_path / fixture
    shutil.copy(FIXTURES / fixture, path)
    with h5py.File(path, "a") as f:
        f.attrs["__version__"] = np.float32(0.4)
    with read_checkpoint(path) as ckpt:
        assert ckpt.release.name == release and ckpt.format == 0.4


def test_root_attributes_stored_as_one_element_arrays_are_read(tmp_path):
    """A script that copied the root attributes as ``np.array([value])`` (h5py keeps the shape):
    ``__version__`` is read as the one number it holds, as the string attributes already were,
    not refused as "unreadable"."""
    path = tmp_path / "release-2.3.mdl"
    shutil.copy(FIXTURES / "release-2.3.mdl", path)
    with h5py.File(path, "a") as f:
        for name, value in list(f.attrs.items()):
            f.attrs[name] = np.array([value], dtype=f.attrs.get_id(name).dtype)
        assert f.attrs["__version__"].shape == (1,)
    with read_checkpoint(path) as ckpt, read_checkpoint(FIXTURES / "release-2.3.mdl") as want:
        assert ckpt.release.name == "2.3"
        assert [r.name for r in iter_leaves(ckpt.root)] == [r.name for r in iter_leaves(want.root)]


def test_a_bfloat16_flag_stored_as_a_one_element_array_keeps_the_tensor_bfloat16(tmp_path):
    """``is_bfloat16 = np.array([True])`` (a script's copy of a 2.0 file): the walk's facts left
    the non-scalar flag out, so the tensor was read, and upgraded, as its int16 bit patterns.
    It is bfloat16, as the dataset's own attribute (read by h5py) says."""
    path = tmp_path / "bf16.mdl"
    cm.save({"model": {"w": np.arange(3, dtype=np.int16)}}, path, "2.0")
    with h5py.File(path, "r+") as f:
        f["model.w"].attrs["is_bfloat16"] = np.array([True])
    with read_checkpoint(path) as ckpt:
        assert [(r.name, r.leaf.dtype) for r in iter_leaves(ckpt.root)] == [("model.w", "bfloat16")]
    proc = run_cli("inspect", path, "--all")  # (its header scan, too)
    assert "'w': ndarray bfloat16[3]" in proc.stdout, proc.stdout + proc.stderr


def test_partial_05_file_is_refused(tmp_path):
    path = tmp_path / "partial.mdl"
    shutil.copy(REAL / "basic.mdl", path)
    with h5py.File(path, "a") as f:
        del f.attrs["__SUCCESS__"]
    with pytest.raises(CorruptCheckpointError, match="partially written"):
        read_checkpoint(path)


def test_malicious_legacy_spec_is_refused_and_nothing_runs(tmp_path):
    sentinel = tmp_path / "pwned"
    payload = (
        b"\x80\x04cposix\nsystem\n"
        + b"X"
        + len(f"touch {sentinel}").to_bytes(4, "little")
        + f"touch {sentinel}".encode()
        + b"\x85R."
    )
    path = _h5(tmp_path / "evil.mdl", __spec__=payload.hex(), __version__=0.4)
    from ckpt_migrate.errors import UnsafeContentError

    with pytest.raises(UnsafeContentError, match="system"):
        read_checkpoint(path)
    assert not sentinel.exists()


def test_release_table_orders_versions_with_packaging():
    names = [r.name for r in releases.RELEASES]
    assert names[0] == "1.7" and names[-1] == "2.10"
    assert releases.get("2.10").version > releases.get("2.9").version
    assert releases.get("cs-2.1").format == 0.4 and releases.get("2.5").format == 0.5
    assert releases.get("latest") is releases.LATEST
    assert [r.format for r in releases.RELEASES[:4]] == [0.1, 0.2, 0.3, 0.4]


def test_fixtures_are_what_make_fixtures_writes(tmp_path):
    scripts = str(FIXTURES.parent / "scripts")
    sys.path.insert(0, scripts)
    try:
        import make_fixtures
    finally:  # (not ``pop(0)``: make_fixtures puts the project's root before it)
        sys.path.remove(scripts)
    for release in make_fixtures.FIXTURE_RELEASES:
        fresh = make_fixtures.write_fixture(release, tmp_path)
        with read_checkpoint(fresh) as a, read_checkpoint(FIXTURES / fresh.name) as b:
            assert describe(a.root) == describe(b.root), release
            assert a.unreferenced == b.unreferenced
    fresh = make_fixtures.write_format_test(tmp_path)
    with read_checkpoint(fresh) as a, read_checkpoint(FIXTURES / "format-test" / fresh.name) as b:
        assert describe(a.root) == describe(b.root)
    (tmp_path / "models").symlink_to(FIXTURES / "models")
    sides = make_fixtures.write_side_files(tmp_path)
    example = make_fixtures.write_example(tmp_path)
    for made, kept in ((sides, FIXTURES / sides.name), (example, FIXTURES / "example")):
        files = sorted(p.relative_to(made) for p in made.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(kept) for p in kept.rglob("*") if p.is_file())
        assert all((made / f).read_bytes() == (kept / f).read_bytes() for f in files), made


def test_inspect_json_lists_missing_and_dtypes():
    from ckpt_migrate.cli import commands

    data = commands.inspect(FIXTURES / "release-1.9.mdl")
    assert data["release"] == "1.9" and data["format"] == 0.3
    assert data["missing"] == ["model.lm_head.weight"]
    assert data["bytes_by_dtype"]["bfloat16"]["tensors"] == 2
    assert any("MISSING" in line for line in data["outline"])
    json.dumps(data)


def _real_05_files(tmp_path):
    """The format 0.5 files the real library wrote: 2.10's shipped cases and the 2.6 GPT-2
    and 2.9 Trainer checkpoints (decompressed into ``tmp_path``)."""
    return [REAL / f"{c}.mdl" for c in REAL_CASES] + real_2x_files(tmp_path)


def test_the_real_librarys_specs_are_built_letting_go_of_their_json(tmp_path):
    """``decode`` then ``build`` of every ``__spec__`` the real library wrote gives what
    ``parse_named`` gives, and empties the decoded document."""
    from ckpt_migrate.format.v05 import treespec

    for path in _real_05_files(tmp_path):
        with h5py.File(path, "r", locking=False) as f:
            inner = json.loads(f.attrs["__spec__"])[1]
        decoded = treespec.decode(inner)
        built, shared = treespec.build(decoded)
        assert decoded == [], path.name
        again, again_shared = treespec.parse_named(inner)
        assert verify.signature(built) == verify.signature(again), path.name
        assert shared == again_shared == bool(name_collisions(built)), path.name


def test_a_treespec_is_built_letting_go_of_its_json():
    """``treespec.build`` empties the decoded JSON as it builds (a 150k-leaf spec's JSON and
    its tree were whole at once), and builds what ``parse`` of the same text builds."""
    from ckpt_migrate.format.tree import SeqNode
    from ckpt_migrate.format.v05 import treespec

    leaf = ValueLeaf(1)
    root = DictNode(
        [
            ("model", DictNode([("w", leaf), ("b", leaf)], ordered=True)),
            ("lists", SeqNode("list", [leaf, SeqNode("tuple", [leaf, DictNode([("x", leaf)])])])),
            ("empty", DictNode([])),
        ]
    )
    text = treespec.dumps(root)
    decoded = treespec.decode(text)
    nodes, stack = [], [decoded[1]]
    while stack:  # every JSON node with children, before the build
        node = stack.pop()
        if node.kind is not None:
            nodes.append(node)
            stack.extend(node.kids)
    built, shared = treespec.build(decoded)
    assert decoded == [] and len(nodes) == 6
    assert all(kid is None for node in nodes for kid in node.kids)
    assert all(node.context is None for node in nodes if node.kind.endswith(("dict", "Dict")))
    again, again_shared = treespec.parse_named(text)
    assert verify.signature(built) == verify.signature(again)
    assert shared is again_shared is False


def test_a_treespec_says_two_leaves_share_a_name_exactly_when_they_do():
    """``build`` keeps only the names below a dict with a dotted key or two keys that read
    alike (8 MiB of a 150k-tensor read's peak, issue 33); on 400 random trees of such keys,
    plain ones, ints and lists, it says two leaves share a name exactly when
    ``name_collisions`` finds one."""
    import random

    from ckpt_migrate.format.tree import SeqNode
    from ckpt_migrate.format.v05 import treespec

    rng = random.Random(33)
    pool: list[str | int] = ["a", "b", "a.b", "b.a", "", "a.", ".b", "1", 1, 0, "0", "c"]

    def tree(depth: int):
        if depth > 3 or rng.random() < 0.3:
            return ValueLeaf(1)
        if rng.random() < 0.25:
            return SeqNode("list", [tree(depth + 1) for _ in range(rng.randint(0, 3))])
        keys = list(dict.fromkeys(rng.sample(pool, rng.randint(0, 4))))
        return DictNode([(k, tree(depth + 1)) for k in keys])

    found = set()
    for _ in range(400):
        root = tree(0)
        _, shared = treespec.parse_named(treespec.dumps(root))
        assert shared == bool(name_collisions(root)), treespec.dumps(root)
        found.add(shared)
    assert found == {True, False}


@pytest.mark.parametrize(
    "text", ["[1]", "[1, 2, 3]", "{}", "7", '{"1": 1, "2": 2}', '[2, {"type": null}]']
)
def test_a_treespec_that_is_no_protocol_node_pair_is_refused(text):
    from ckpt_migrate.errors import CkptError
    from ckpt_migrate.format.v05 import treespec

    with pytest.raises(CkptError, match="treespec"):
        treespec.parse(text, "f.mdl")


def test_the_engines_read_back_of_a_05_file_visits_no_link(tmp_path, monkeypatch):
    """The engine's read-back of its own output (``tensors_proven``) compares the tree alone,
    so the datasets no leaf names are not looked for: a visit of every link read each
    object's header (63 MB, 3 s at 150k leaves). A full read still names a stray dataset.
    On this tool's 2.10 fixture and on every format 0.5 file the real library wrote."""
    from ckpt_migrate.format.v05 import read as read_v05

    def visited(*_args, **_kwargs):
        raise AssertionError("the read-back visited the links")

    (tmp_path / "real").mkdir()
    sources = [FIXTURES / "release-2.10.mdl", *_real_05_files(tmp_path / "real")]
    for i, source in enumerate(sources):
        path = tmp_path / f"{i}-{source.name}"
        shutil.copyfile(source, path)
        with h5py.File(path, "r+", locking=False) as f:
            f.create_dataset("stray", data=np.arange(3))
        with read_checkpoint(path) as full:
            assert full.unreferenced == ["stray"], source.name
            want = verify.signature(full.root)
        with monkeypatch.context() as m:
            m.setattr(read_v05, "datasets_not_in", visited)
            with read_checkpoint(path, isolate=False, tensors_proven=True) as back:
                assert back.unreferenced == [], source.name
                assert verify.signature(back.root) == want, source.name


def test_dicts_of_one_context_decode_it_once_and_each_is_checked():
    """The optimizer's 37k state dicts share one context text: decoded once (its keys the
    same objects in each dict), and a dict of that text with another count of children is
    refused as before."""
    from ckpt_migrate.format.v05 import treespec

    states = [DictNode([("step", ValueLeaf(i)), ("exp_avg", ValueLeaf(i))]) for i in range(5)]
    text = treespec.dumps(DictNode([(str(i), s) for i, s in enumerate(states)]))
    calls: list[str] = []
    real_loads = treespec.json.loads

    def loads(s: str, *args, **kwargs):
        calls.append(s)
        return real_loads(s, *args, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(treespec.json, "loads", loads)
        built, shared = treespec.build(treespec.decode(text))
    assert calls.count('["step", "exp_avg"]') == 1
    assert verify.signature(built) == verify.signature(treespec.parse_named(text)[0])
    assert not shared and len(list(iter_leaves(built))) == 10
    assert len({id(node.items[0][0]) for _, node in built.items}) == 1  # (one key object)
    doc = json.loads(text)
    doc[1]["children_spec"][-1]["children_spec"].pop()  # (the last state: one child, two keys)
    bad = json.dumps(doc)
    with pytest.raises(CorruptCheckpointError, match="context does not match children"):
        treespec.build(treespec.decode(bad))


def test_a_treespecs_keys_are_one_object_each_and_not_the_interpreters():
    """A key met in many dicts is one object (150k leaves' keys were 15 MB as a string each),
    kept by the parse alone, not by the interpreter's table of interned strings: that table
    only grows, and 112k keys left 3.75 MB in it for the rest of an export (issue 33)."""
    from ckpt_migrate.format.v05 import treespec

    key = "".join(["zq.unique", ".key.9431"])
    root = DictNode([(str(i), DictNode([(key, ValueLeaf(i))])) for i in range(3)])
    built, _ = treespec.parse_named(treespec.dumps(root))
    assert len({id(node.items[0][0]) for _, node in built.items}) == 1
    probe = "".join(["zq.unique.key", ".9431"])
    assert sys.intern(probe) is probe


@pytest.mark.parametrize("release", ["2.10", "2.0", "1.9"])
def test_big_endian_integers_keep_their_values(tmp_path, release):
    """A big-endian integer array (``np.dtype(">i4")``, as data read from a big-endian file or
    network buffer is) was stored by viewing its bytes as little-endian: ``[1, 2, 3]`` came
    back as ``[16777216, 33554432, 50331648]``. Floats were converted and kept their values."""
    state = {
        "ints": np.array([1, 2, 3], dtype=">i4"),
        "short": np.array([1, -2], dtype=">i2"),
        # (a 1.x reader makes every array a tensor, and 1.x's torch has no uint64: refused)
        "scalar": np.array(7, dtype=">i8" if release == "1.9" else ">u8"),
        "floats": np.array([1.5, -2.0], dtype=">f8"),
    }
    path = tmp_path / "big_endian.mdl"
    cm.save(state, path, release)
    back = cm.load(path)
    for name, array in state.items():
        assert np.asarray(back[name]).tolist() == array.tolist(), name


def test_a_big_endian_dataset_of_another_writer_is_upgraded_with_its_values(tmp_path):
    """A 2.0 file whose integer array a writer stored big-endian (HDF5 keeps the byte order
    a dataset is written in): the upgrade's rewrite reads it as such and writes the values."""
    src = tmp_path / "src.mdl"
    shutil.copyfile(FIXTURES / "release-2.0.mdl", src)
    with h5py.File(src, "r+") as f:
        attrs = dict(f["misc.array"].attrs)
        expected = f["misc.array"][()].tolist()
        del f["misc.array"]
        f.create_dataset("misc.array", data=np.array(expected, dtype=">i4"))
        f["misc.array"].attrs.update(attrs)
    from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade

    result = upgrade(src, UpgradeOptions(target="2.10", output_dir=tmp_path / "out"))
    assert result.status == "upgraded", result.error
    assert np.asarray(cm.load(tmp_path / "out" / "src.mdl")["misc"]["array"]).tolist() == expected


def test_a_complex_numpy_array_of_the_real_writer_is_refused_as_such_not_as_damage(tmp_path):
    """The real 2.10 writer stores a numpy complex array as h5py does, an HDF5 compound of ``r``
    and ``i``, and its loader reads it back. ckpt-migrate reads no compound type and said "the
    file is damaged or was not written by a checkpoint writer": a valid file called damaged,
    also by ``check --deep``. Now every command says what the dataset holds and the way out."""
    src = REAL / "refused" / "complex_array.mdl"
    expected = json.loads((REAL / "refused" / "complex_array.expected.json").read_text())
    assert expected["root"]["items"][1][2]["dtype"] == "complex128"  # what the real loader gave
    for verb in (["inspect"], ["check", "--deep"], ["upgrade", "--to", "2.0", "-o", tmp_path]):
        proc = run_cli(*verb, src)
        one_line_error(proc, 2, "'/spectrum' holds a complex numpy array", ".real and .imag")
        assert "damaged" not in proc.stderr, proc.stderr
    with pytest.raises(UnsupportedContentError, match="complex numpy array"):
        cm.load(src)


def test_a_structured_numpy_array_of_the_real_writer_is_refused_as_such_not_as_damage(tmp_path):
    """The real 2.10 writer stores a numpy structured array as h5py does, an HDF5 compound of
    its fields, and its loader reads it back (fixtures/real-cstorch-2.10/refused). Every
    command says what the dataset holds, naming the fields, and the way out."""
    src = REAL / "refused" / "structured_array.mdl"
    expected = json.loads((REAL / "refused" / "structured_array.expected.json").read_text())
    assert expected["root"]["items"][1][2]["dtype"] == "void96"  # what the real loader gave
    for verb in (["inspect"], ["check", "--deep"], ["upgrade", "--to", "2.4", "-o", tmp_path]):
        proc = run_cli(*verb, src)
        one_line_error(proc, 2, "'/table' holds a numpy structured array (fields 'x', 'n';")
        assert "damaged" not in proc.stderr and "field as an array of its own" in proc.stderr
    with pytest.raises(UnsupportedContentError, match="structured array"):
        cm.load(src)


@pytest.mark.parametrize(
    ("name", "key"), [("none_key", "None"), ("bool_key", "True"), ("float_key", "1.5")]
)
def test_dict_keys_the_real_writer_keeps_but_this_tool_does_not_are_refused_with_the_way_out(
    tmp_path, name, key
):
    """The real 2.10 writer saves a dict with a ``None``, ``bool`` or ``float`` key and its
    loader gives it back (fixtures/real-cstorch-2.10/refused): refused naming the dict, the
    key and what to do (the message had no way out)."""
    src = REAL / "refused" / f"{name}.mdl"
    for verb in (["inspect"], ["check", "--deep"], ["upgrade", "--to", "2.4", "-o", tmp_path]):
        proc = run_cli(*verb, src)
        one_line_error(proc, 2, f"the dict at 'd' has a key {key} of type", "re-save")
    with pytest.raises(UnsupportedContentError, match="key"):
        cm.load(src)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("bytes_array", ("array 'v' is a numpy array of fixed-length bytes (|S3)", "a list")),
        ("longdouble_array", ("'/v' holds a numpy long double array", "save it as float64")),
    ],
)
def test_other_numpy_arrays_the_real_writer_stores_are_refused_as_what_they_are(
    tmp_path, name, words
):
    """Fixed-length bytes and ``np.longdouble`` arrays: the real 2.10 writer stores them and
    its loader reads them back (``dtype`` in the real digest); ckpt-migrate refuses them
    naming what they are (a long double was "damaged") and the way out."""
    if name == "longdouble_array" and np.dtype(np.longdouble).itemsize <= 8:
        pytest.skip("this machine's numpy has no long double wider than float64")
    src = REAL / "refused" / f"{name}.mdl"
    expected = json.loads((REAL / "refused" / f"{name}.expected.json").read_text())
    assert expected["root"]["items"][1][2]["dtype"] in ("bytes24", "float128")
    for verb in (["inspect"], ["check", "--deep"], ["upgrade", "--to", "2.4", "-o", tmp_path]):
        proc = run_cli(*verb, src)
        one_line_error(proc, 2, *words)
        assert "damaged" not in proc.stderr, proc.stderr
    with pytest.raises(UnsupportedContentError):
        cm.load(src)
