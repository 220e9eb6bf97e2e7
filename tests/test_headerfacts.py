"""A legacy file's outline (issue 33): ``inspect`` and ``plan`` describe a release 1.9-2.4
checkpoint's datasets from their object headers' bytes (``h5.headerfacts``), no dataset opened
and no full walk forked. Checked on files this tool did not write (the fixtures' legacy files,
a 1.9 file laid out as the 1.9 library wrote it: LZ4 auto-chunked, bf16 stored as int16):
the facts are the full walk's, byte for byte; ``inspect`` and ``plan`` answer as the full
read; what the scan does not answer (a group, external storage, a string dataset, the flags
of formats 0.1/0.2) is read in full, and refused as before where it was refused."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import FIXTURES

from ckpt_migrate.cli import commands
from ckpt_migrate.errors import CkptError
from ckpt_migrate.format import read as reader
from ckpt_migrate.format.h5 import headerfacts, headerscan, linktable, preflight
from ckpt_migrate.format.h5.facts import ADDRESS, ATTRS
from ckpt_migrate.format.h5.root import root_header
from ckpt_migrate.format.read import read_checkpoint

LEGACY = sorted(
    p
    for p in FIXTURES.rglob("*.mdl")
    if "real-cstorch" not in str(p) and p.name != "release-2.10.mdl"
)
FLAGGED = {"release-1.7.mdl", "release-1.8.mdl"}  # formats 0.1/0.2: untagged, read in full


def _ids(p: Path) -> str:
    return str(p.relative_to(FIXTURES))


def _scanned(path: Path) -> headerscan.Found | None:
    with h5py.File(path, "r") as f:
        at = root_header(f)
        links = linktable.of_root(f, path)
    assert at is not None and links is not None
    return headerscan.scan(path, links, at[1])


def _as_walk_said(path: Path) -> None:
    """The scan's facts and stored bytes are the full preflight walk's (JSON text, so that a
    NaN equals a NaN); the scan names every link, a tie's second name too."""
    walk = preflight.preflight(path)
    found = _scanned(path)
    assert walk is not None and found is not None
    facts, stored = found
    assert stored == walk.stored
    for name, fact in walk.datasets.items():
        assert json.dumps(facts[name], sort_keys=True) == json.dumps(fact, sort_keys=True), name
    addresses = {fact[ADDRESS] for fact in walk.datasets.values()}
    assert {fact[ADDRESS] for fact in facts.values()} == addresses


@pytest.mark.parametrize("path", LEGACY, ids=_ids)
def test_header_facts_are_the_walks(path):
    _as_walk_said(path)


def test_a_file_laid_out_as_the_19_library_wrote_it(real_layout_19):
    _as_walk_said(real_layout_19)
    with read_checkpoint(real_layout_19, outline=True, legacy_outline=True) as ckpt:
        assert ckpt.outline and ckpt.data_bytes is not None
        dtypes = {leaf.dtype for leaf in _tensors(ckpt.root)}
        assert "bfloat16" in dtypes  # (int16 with ``is_bfloat16``, from the attribute)


def _tensors(root):
    from ckpt_migrate.format.tree import TensorLeaf, iter_leaves

    return [ref.leaf for ref in iter_leaves(root) if isinstance(ref.leaf, TensorLeaf)]


def _in_full(monkeypatch: pytest.MonkeyPatch, call, *args, **kwargs):
    with monkeypatch.context() as m:
        m.setattr(reader, "read_outline", lambda p, *a: None)
        return call(*args, **kwargs)


@pytest.mark.parametrize("path", LEGACY, ids=_ids)
def test_inspect_and_plan_answer_as_the_full_read(path, monkeypatch):
    assert commands.inspect(path) == _in_full(monkeypatch, commands.inspect, path)
    outlined = commands.plan(path, "2.10")
    full = _in_full(monkeypatch, commands.plan, path, "2.10")
    for plan in (outlined, full):
        plan.pop("free_available")  # (other writers on the disk)
    assert outlined == full
    with read_checkpoint(path, outline=True, legacy_outline=True) as ckpt:
        assert ckpt.outline == (path.name not in FLAGGED)
    with read_checkpoint(path, outline=True) as ckpt:  # (the upgrade's: 0.5 files only)
        assert not ckpt.outline


def test_no_dataset_is_opened_and_no_full_walk_is_forked(real_layout_19, monkeypatch):
    """Through HDF5 the parent opens no object and reads only the root attributes the
    outline child tried (its ``__spec__`` too, for a legacy root); the child runs the outline
    walk, not the full one."""
    from ckpt_migrate.format.h5 import preflight_outline

    opened: list[bytes] = []
    attributes: list[str] = []
    walked: list[str] = []
    real_open, real_attr, real_walk = h5py.h5o.open, h5py.h5a.open, preflight._walk

    def open_spy(loc, name, *args, **kwargs):
        if name not in (b"/", b"."):
            opened.append(name)
        return real_open(loc, name, *args, **kwargs)

    def attr_spy(*args, **kwargs):
        name = kwargs.get("name", args[1] if len(args) > 1 else None)
        if name is not None:
            attributes.append(name.decode() if isinstance(name, bytes) else name)
        return real_attr(*args, **kwargs)

    def walk_spy(*args, **kwargs):
        walked.append("full")
        return real_walk(*args, **kwargs)

    monkeypatch.setattr(h5py.h5o, "open", open_spy)
    monkeypatch.setattr(h5py.h5a, "open", attr_spy)
    monkeypatch.setattr(preflight, "_walk", walk_spy)
    assert commands.inspect(real_layout_19)["leaf_count"] > 0
    assert commands.plan(real_layout_19, "2.10")["datasets_changed"] is True
    assert opened == [] and walked == []
    assert attributes and set(attributes) <= {*preflight_outline.OUTLINE_NAMES, "__spec__"}


def test_a_tensor_read_after_the_outline_waits_for_the_full_walk(real_layout_19, monkeypatch):
    scopes: list[str] = []
    real = reader.preflight

    def spy(path, *args, scope="full", **kwargs):
        scopes.append(scope)
        return real(path, *args, scope=scope, **kwargs)

    monkeypatch.setattr(reader, "preflight", spy)
    with read_checkpoint(real_layout_19, outline=True, legacy_outline=True) as ckpt:
        leaf = _tensors(ckpt.root)[0]
        assert scopes == ["outline"]
        assert leaf.data.read() is not None
    assert scopes == ["outline", "full"]


def test_the_parallel_scan_is_the_sequential_one(real_layout_19, monkeypatch):
    """Every time: the child's part is collected once it has ended by itself (it was once
    killed as it ended, and the scan then did not answer)."""
    monkeypatch.setattr(headerscan, "WORKERS", 1)
    alone = _scanned(real_layout_19)
    assert alone is not None
    monkeypatch.setattr(headerscan, "WORKERS", 2)
    monkeypatch.setattr(headerscan, "PARALLEL", 1)
    for _ in range(20):
        shared = _scanned(real_layout_19)
        assert shared is not None
        assert json.dumps(shared, sort_keys=True) == json.dumps(alone, sort_keys=True)


def test_the_scan_beside_the_spec_answers_as_the_full_read(real_layout_19, monkeypatch):
    """The outline read's scan runs in a second process while the spec is decoded, its facts
    collected at the reader's first look-up."""
    monkeypatch.setattr(headerscan, "WORKERS", 2)
    monkeypatch.setattr(headerscan, "PARALLEL", 1)
    begun: list[headerscan.Scan] = []
    forked: list[bool] = []
    real = headerscan.Scan

    def spy(*args, **kwargs):
        begun.append(real(*args, **kwargs))
        forked.append(begun[-1].pid is not None)
        return begun[-1]

    monkeypatch.setattr(headerscan, "Scan", spy)
    outlined = commands.inspect(real_layout_19)
    assert forked == [True] and begun[0].pid is None  # (collected, its child waited for)
    assert outlined == _in_full(monkeypatch, commands.inspect, real_layout_19)


def test_a_scan_given_up_on_leaves_no_child(real_layout_19, monkeypatch):
    """A spec that cannot be read ends the outline read before the facts are looked up: the
    scan's child is ended and waited for, and the full read names the problem."""
    monkeypatch.setattr(headerscan, "WORKERS", 2)
    monkeypatch.setattr(headerscan, "PARALLEL", 1)
    begun: list[headerscan.Scan] = []
    real = headerscan.Scan

    def spy(*args, **kwargs):
        begun.append(real(*args, **kwargs))
        return begun[-1]

    def broken(*args, **kwargs):
        raise CkptError(real_layout_19, "a spec that cannot be read")

    monkeypatch.setattr(headerscan, "Scan", spy)
    from ckpt_migrate.format.legacy import read as legacy

    monkeypatch.setattr(legacy, "decode_spec_info", broken)
    with pytest.raises(CkptError, match="cannot be read"):
        commands.inspect(real_layout_19)
    assert begun and all(scan.pid is None for scan in begun)


def test_a_scan_without_a_second_process_reads_them_all(real_layout_19, monkeypatch):
    """When no process can be forked, the scan reads every header in this one."""
    monkeypatch.setattr(headerscan, "WORKERS", 2)
    monkeypatch.setattr(headerscan, "PARALLEL", 1)
    alone = _scanned(real_layout_19)

    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    assert json.dumps(_scanned(real_layout_19), sort_keys=True) == json.dumps(alone, sort_keys=True)


def test_a_scan_that_does_not_answer_is_collected_once():
    """Every look-up of a scan that did not answer is ``OutlineTooShort``; it is not run
    again (a second run would scan every header in this process)."""
    from ckpt_migrate.format.h5.facts import OutlineTooShort

    class Unanswered:
        runs = 0

        def result(self):
            self.runs += 1
            return None

    begun = Unanswered()
    later = headerscan.Later(begun)  # type: ignore[arg-type]
    for _ in range(3):
        with pytest.raises(OutlineTooShort):
            later.get("x")
    assert begun.runs == 1


def _with(tmp_path: Path, name: str, make) -> Path:
    """The 2.0 fixture with one more root member, made by ``make(f)``."""
    path = tmp_path / f"{name}.mdl"
    shutil.copy(FIXTURES / "release-2.0.mdl", path)
    with h5py.File(path, "r+") as f:
        make(f)
    return path


STRANGERS = {
    "group": lambda f: f.create_group("stray"),
    "string": lambda f: f.create_dataset("stray", data=np.array(b"text", dtype="S4")),
    "compound": lambda f: f.create_dataset("stray", data=np.zeros(2, "i4,f4")),
}


@pytest.mark.parametrize("kind", sorted(STRANGERS))
def test_what_the_scan_does_not_answer_is_read_in_full(kind, tmp_path, monkeypatch):
    path = _with(tmp_path, kind, STRANGERS[kind])
    assert _scanned(path) is None
    try:
        full = _in_full(monkeypatch, commands.inspect, path)
    except CkptError as exc:
        with pytest.raises(type(exc)):
            commands.inspect(path)
        return
    assert commands.inspect(path) == full


def test_external_storage_is_refused_as_before(tmp_path, monkeypatch):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(bytes(64))
    path = _with(
        tmp_path,
        "external",
        lambda f: f.create_dataset("stray", shape=(16,), dtype="f4", external=[(outside, 0, 64)]),
    )
    assert _scanned(path) is None
    with pytest.raises(CkptError, match="external") as full:
        _in_full(monkeypatch, commands.inspect, path)
    with pytest.raises(type(full.value), match="external"):
        commands.inspect(path)


def test_every_byte_the_scan_reads_is_counted(tmp_path):
    """Headers and chunk indexes do not overlap: reading more than twice the file is not a
    file a writer made, and the scan stops there (a small file buys no minutes)."""
    path = tmp_path / "bytes"
    path.write_bytes(bytes(1 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        scan = headerfacts.HeaderReader(fd, 1 << 20, 0)
        for _ in range(3):  # (twice the file, and a mebibyte of slack)
            scan.read(0, 1 << 20)
        with pytest.raises(headerfacts.Undecided):
            scan.read(0, 1)
    finally:
        os.close(fd)


def test_equal_attribute_sets_are_shared_but_never_confused(tmp_path):
    """The scan keeps one dict for datasets whose attributes are the same; True and 1, -0.0
    and 0.0 are equal in Python and stay apart."""

    def make(f):
        for i, value in enumerate([True, 1, -0.0, 0.0, True]):
            f.create_dataset(f"stray{i}", data=np.zeros(2, "f4")).attrs["x"] = value

    facts, _ = _scanned(_with(tmp_path, "values", make))
    seen = [facts[f"stray{i}"][ATTRS]["x"] for i in range(5)]
    assert [(type(v), str(v)) for v in seen] == [
        (bool, "True"),
        (int, "1"),
        (float, "-0.0"),
        (float, "0.0"),
        (bool, "True"),
    ]
    assert facts["stray0"][ATTRS] is facts["stray4"][ATTRS]


def test_damaged_headers_are_answered_or_left_to_the_full_read(tmp_path):
    """Bytes flipped in the datasets' headers (an unchecksummed version-1 header takes any
    value): the scan answers, or answers None; it never raises."""
    src = FIXTURES / "release-2.0.mdl"
    with h5py.File(src, "r") as f:
        at = root_header(f)
        links = linktable.of_root(f, src)
    assert at is not None and links is not None
    addresses, data = sorted(set(links.values())), src.read_bytes()
    rng = random.Random(36)
    path = tmp_path / "damaged.mdl"
    answers = set()
    for _ in range(300):
        damaged = bytearray(data)
        start = rng.choice(addresses)
        for _ in range(rng.randint(1, 4)):
            damaged[min(start + rng.randrange(400), len(damaged) - 1)] = rng.randrange(256)
        path.write_bytes(damaged)
        answers.add(headerscan.scan(path, links, at[1]) is None)
    assert answers == {True, False}


def test_attributes_kept_in_order_are_read_compact_and_left_dense(tmp_path):
    """A dataset that tracks its attributes' creation order has an attribute info message:
    with its attributes in the header it is answered as the walk answers it; with them in
    dense storage (a fractal heap) it is left to the full read."""

    def compact(f):
        ds = f.create_dataset("stray", data=np.zeros(2, "f4"), track_order=True)
        ds.attrs["__H5_TYPE__"] = "TorchTensorH5Type"

    def dense(f):
        ds = f.create_dataset("stray", data=np.zeros(2, "f4"), track_order=True)
        for i in range(20):
            ds.attrs[f"a{i}"] = i

    _as_walk_said(_with(tmp_path, "compact", compact))
    assert _scanned(_with(tmp_path, "dense", dense)) is None


def _leaves_and_ties(root) -> list[tuple[str, str, str]]:
    """Each leaf's name and description (dtype and shape, or value), and the first name of
    the leaf object it is (a tie's)."""
    from ckpt_migrate.format.outline import describe_leaf
    from ckpt_migrate.format.tree import iter_leaves

    first: dict[int, str] = {}
    return [
        (ref.name, describe_leaf(ref.leaf), first.setdefault(id(ref.leaf), ref.name))
        for ref in iter_leaves(root)
    ]


def _outline_as_full(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The outline of ``path``, with a second name of a tensor's dataset and a dataset of its
    own added that the spec does not name, and the header scan shared with a second process
    (its facts handed over without their names): the same leaves, ties and unreferenced
    datasets as the full read, and the facts no leaf took are those datasets'."""
    monkeypatch.setattr(headerscan, "WORKERS", 2)
    monkeypatch.setattr(headerscan, "PARALLEL", 1)
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    with h5py.File(path, "r") as f:  # (a tie written as two names of one dataset)
        tied = bool(linktable.aliased(h5py.h5o.get_info(f[n].id).addr for n in f))
    with h5py.File(copy, "a") as f:
        tensor = next(n for n in f if f[n].ndim > 0 and f[n].dtype.kind == "f")
        f["zz_second_name"] = f[tensor]
        f["zz_own"] = np.zeros(3, np.float32)
    laters: list[headerscan.Later] = []
    real = headerscan.Later
    monkeypatch.setattr(headerscan, "Later", lambda *a: laters.append(real(*a)) or laters[-1])
    with read_checkpoint(copy, outline=True, legacy_outline=True) as outlined:
        assert outlined.outline
        assert laters and sorted(laters[0]) == outlined.unreferenced
        got = (_leaves_and_ties(outlined.root), outlined.unreferenced)
    with read_checkpoint(copy) as full:
        assert not full.outline
        assert got == (_leaves_and_ties(full.root), full.unreferenced)
    assert {"zz_second_name", "zz_own"} <= set(got[1])
    assert (len({tie for _, _, tie in got[0]}) < len(got[0])) == tied


@pytest.mark.parametrize("path", [p for p in LEGACY if p.name not in FLAGGED], ids=_ids)
def test_the_outline_ties_and_leaves_out_what_the_full_read_does(path, tmp_path, monkeypatch):
    """The outline lets go of each dataset's facts as its leaf takes them and shares a leaf
    only among the names of one dataset (``Facts.aliased``): ``_outline_as_full``."""
    _outline_as_full(path, tmp_path, monkeypatch)


def test_the_outline_of_a_file_laid_out_as_the_19_library_wrote_it_is_the_full_reads(
    real_layout_19, tmp_path, monkeypatch
):
    """The same on a file laid out as the 1.9 library wrote it (auto-chunked LZ4, bf16 stored
    as int16): ``_outline_as_full``."""
    _outline_as_full(real_layout_19, tmp_path, monkeypatch)


def test_aliased_are_the_addresses_named_more_than_once():
    assert linktable.aliased([]) == frozenset()
    assert linktable.aliased([5, 1, 9, 1, 5, 5, 7]) == {1, 5}


def test_a_child_that_hands_over_another_count_of_facts_is_not_answered(
    real_layout_19, monkeypatch
):
    """The child's facts come without names, in the order of the part dealt to it: fewer or
    more than that part is no answer (the file is then read in full), never facts put on
    the wrong names."""
    monkeypatch.setattr(headerscan, "WORKERS", 2)
    monkeypatch.setattr(headerscan, "PARALLEL", 1)
    real = headerscan.marshal.load

    def changed(handed, change):
        facts, stored = real(handed)
        return change(facts), stored

    for change in (lambda facts: facts[:-1], lambda facts: [*facts, facts[0]]):
        with monkeypatch.context() as m:
            m.setattr(headerscan.marshal, "load", lambda f, c=change: changed(f, c))
            assert _scanned(real_layout_19) is None
    assert _scanned(real_layout_19) is not None
