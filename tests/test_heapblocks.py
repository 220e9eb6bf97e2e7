"""A root edit's check reads again only what the edit changed (issue 33): the blocks of the
root's attribute heap it rewrote (``format.h5.heapblocks``: every other block is vouched for by
its bytes and its texts' collections being the source's, and a change in either is still
found), and the root's links only where their heap is not byte for byte the source's
(``linktable.same_as``)."""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import h5py
import pytest
from test_rootedit import _logical, _patched, _source
from test_rootedit_checks import _corrupting

from ckpt_migrate.engine import rootedit
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.format.h5 import attrtable, heapblocks, linktable
from ckpt_migrate.format.h5 import root as h5root
from ckpt_migrate.format.h5.io import open_read
from ckpt_migrate.format.h5.rootdigest import RootDigest
from ckpt_migrate.format.provenance import PROVENANCE_ATTR

pytest.importorskip("torch")
KEY = "model.experts.150.w1.weight.__metadata__"  # (in a block the edit leaves)


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[heapblocks.Checked]:
    """Every ``Checked`` a root edit's check makes."""
    made: list[heapblocks.Checked] = []
    real = heapblocks.Checked.__init__

    def init(self, *a, **k):
        real(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(heapblocks.Checked, "__init__", init)
    return made


def _upgrade(src: Path, out: Path):
    return upgrade(src, UpgradeOptions(target="2.10", output_dir=out))


def _attributes(path: Path) -> int:
    with h5py.File(path, "r") as f:
        return len(f.attrs)


def test_the_blocks_the_edit_left_are_vouched_for_not_read(tmp_path, checks):
    src = _source(tmp_path / "src.mdl", experts=300)
    result = _upgrade(src, tmp_path / "out")
    assert result.status == "upgraded" and result.strategy == rootedit.STRATEGY, result.error
    (check,) = checks
    count = _attributes(tmp_path / "out" / src.name)
    # (the edit rewrote the release, the Trainer's list and the provenance record, and wrote
    # __SUCCESS__ in place: the blocks holding those are read, every other one vouched for)
    assert count * 0.5 < check.vouched < count, (check.vouched, count)
    assert check.dirty and not check.dirty & check._seen


def test_the_same_output_is_made_and_checked_without_the_blocks(tmp_path, monkeypatch, checks):
    src = _source(tmp_path / "src.mdl", experts=300)
    vouched = _upgrade(src, tmp_path / "a")
    monkeypatch.setattr(heapblocks.Checked, "known", lambda self, at, block: None)
    read = _upgrade(src, tmp_path / "b")
    assert vouched.status == read.status == "upgraded"
    a, b = (tmp_path / d / src.name for d in "ab")
    assert checks[0].vouched > 0 and checks[1].vouched == 0
    with h5py.File(a) as fa, h5py.File(b) as fb:
        # (the provenance record holds the time of each run)
        assert {k: fa.attrs[k] for k in fa.attrs if k != PROVENANCE_ATTR} == {
            k: fb.attrs[k] for k in fb.attrs if k != PROVENANCE_ATTR
        }


def _flip_a_text(path: Path, name: str, at: bytes = b"float32") -> None:
    """Change one character of the text of ``name`` where it lies, in its global heap
    collection (which has no checksum): the attribute's message, and its block, stay. The
    character changed is the first of ``at`` in the text (to ``F``)."""
    with h5py.File(path, "r", locking=False) as f:
        text = f.attrs[name].encode()
    raw = path.read_bytes()
    assert raw.count(text) == 1
    where = raw.index(text) + text.index(at)
    with open(path, "r+b") as f:
        f.seek(where)
        f.write(b"F")


def test_a_text_changed_in_its_collection_under_a_block_left_as_it_was_is_found(
    tmp_path, monkeypatch, checks
):
    src = _source(tmp_path / "src.mdl", experts=300)
    real = rootedit.edit_root

    def edit(path: Path, edit: rootedit.Edit) -> None:
        real(path, edit)
        _flip_a_text(path, KEY)

    monkeypatch.setattr(rootedit, "edit_root", edit)
    result = _upgrade(src, tmp_path / "out")
    assert result.status == "failed", result
    assert "differ from the source" in (result.error or ""), result.error
    assert not (tmp_path / "out" / src.name).exists()
    assert checks[0].vouched > 0  # (the other blocks were vouched for)


def test_an_attribute_rewritten_in_a_block_the_edit_left_is_found(tmp_path, monkeypatch):
    src = _source(tmp_path / "src.mdl", experts=300)

    def also(f: h5py.File) -> None:
        text = json.loads(f.attrs[KEY])
        text[KEY]["shape"] = [4, 3]
        f.attrs[KEY] = json.dumps(text)

    _corrupting(monkeypatch, also)
    result = _upgrade(src, tmp_path / "out")
    assert result.status == "failed" and "differ from the source" in (result.error or "")


def _recorded(path: Path) -> tuple[heapblocks.Recorded, RootDigest]:
    digest = RootDigest()
    blocks = heapblocks.Recorded(digest)
    with open_read(path) as f:
        table = attrtable.root_texts(f, path, keep=lambda n, t: digest.add(n, t), blocks=blocks)
    assert table is not None
    blocks.end()
    return blocks, digest


def test_a_block_is_vouched_for_once_and_only_with_its_own_bytes(tmp_path):
    """The same file read again with its own record: every block vouched for, the digest and
    count the full read's; a block seen a second time, or with other bytes, is read."""
    src = _source(tmp_path / "src.mdl", experts=300)
    recorded, full = _recorded(src)
    assert len(recorded.blocks) > 2
    digest = RootDigest(remember=False)
    check = heapblocks.Checked(recorded, digest, set())
    with open_read(src) as f:
        table = attrtable.root_texts(f, src, keep=lambda n, t: digest.add(n, t), blocks=check)
        assert table == {} and check.vouched == len(f.attrs) == full.count
    assert (digest.digest, digest.count, digest.other) == (full.digest, full.count, full.other)
    at = next(iter(recorded.blocks))
    assert check.known(at, b"") is None  # (seen)
    again = heapblocks.Checked(recorded, RootDigest(remember=False), set())
    assert again.known(at, b"FHDB\0 other bytes") is None and again.vouched == 0


def test_the_names_an_edit_writes_mark_their_blocks(tmp_path):
    src = _source(tmp_path / "src.mdl", experts=300)
    recorded, full = _recorded(src)
    full_count = full.count
    assert recorded.holding(set()) == set()
    (one,) = recorded.holding({KEY})
    a, b = recorded.blocks[one].names
    assert hash(KEY) & 0xFFFFFFFF in recorded.names[a:b]
    others = heapblocks.Checked(recorded, RootDigest(remember=False), {KEY})
    assert others.dirty == {one}
    reduced = recorded.without({KEY, "__SUCCESS__"})  # (its names' hashes let go of)
    assert not reduced.names and len(recorded.names) == full_count  # (the original keeps them)
    assert reduced.holding({KEY}) == {one} | recorded.holding({"__SUCCESS__"})
    assert reduced.holding({"model.experts.1.w1.weight.__metadata__"}) == set(reduced.blocks)


def test_the_output_links_are_the_sources_where_their_heap_is_its_bytes(tmp_path, monkeypatch):
    """A root past the cap of creation order (64,511 attributes, made so here from 60) keeps
    its links in a fractal heap, which the edit leaves: taken as the source's unread
    (``linktable.same_as``); a heap with one link moved is not the source's, and is read."""
    with monkeypatch.context() as m:
        m.setattr(h5root, "MAX_TRACKED_ATTRIBUTES", 60)
        m.setattr(h5root, "ORDER_HEADROOM", 0)
        src = _source(tmp_path / "src.mdl", experts=300)
    read: list[Path] = []
    real = linktable.of_root
    monkeypatch.setattr(linktable, "of_root", lambda f, p: read.append(p) or real(f, p))
    result = _upgrade(src, tmp_path / "out")
    assert result.status == "upgraded" and read == [], read
    out = tmp_path / "out" / src.name
    moved = tmp_path / "moved.mdl"
    shutil.copyfile(src, moved)
    with h5py.File(moved, "r+") as f:
        f.move("model.experts.3.w1.weight", "model.experts.3.w1.moved")
        f.move("model.experts.3.w1.moved", "model.experts.3.w1.weight")
    with h5py.File(src) as s, h5py.File(out) as o, h5py.File(moved) as m:
        assert linktable.same_as(o, out, s, src)
        assert not linktable.same_as(m, moved, s, src)
    narrow = _source(tmp_path / "narrow.mdl", experts=300)  # (a symbol table: read)
    _upgrade(narrow, tmp_path / "narrow")
    assert len(read) == 1 and read[0].parent == tmp_path / "narrow", read


def test_a_root_whose_links_are_not_in_a_heap_is_read(tmp_path):
    """The real 2.6 library's root (an old-style group: a symbol table) is never the same as
    anything: its links are read."""
    packed = Path(__file__).resolve().parents[1] / "fixtures" / "real-cstorch-2.6-2.9"
    src = tmp_path / "gpt2.mdl"
    src.write_bytes(lzma.decompress((packed / "gpt2-2.6.0.mdl.xz").read_bytes()))
    with h5py.File(src) as a, h5py.File(src) as b:
        assert not linktable.same_as(a, src, b, src)
        assert linktable.of_root(a, src)


def test_a_dataset_moved_in_a_wide_roots_output_is_found(tmp_path, monkeypatch):
    """The links' heap changed under a root edit: read, and the moved dataset refused."""
    with monkeypatch.context() as m:
        m.setattr(h5root, "MAX_TRACKED_ATTRIBUTES", 60)
        m.setattr(h5root, "ORDER_HEADROOM", 0)
        src = _source(tmp_path / "src.mdl", experts=300)
    key = "model.experts.3.w1.weight"

    def also(f: h5py.File) -> None:
        f.create_dataset("moved", data=f[key][()])
        f["moved"].attrs.update(dict(f[key].attrs))
        del f[key]
        f.move("moved", key)

    _corrupting(monkeypatch, also)
    result = _upgrade(src, tmp_path / "out")
    assert result.status == "failed" and not (tmp_path / "out" / src.name).exists()


CONVERTED = sorted(
    (Path(__file__).resolve().parents[1] / "fixtures" / "modelzoo-2.10-converted").glob("*.xz")
)


@pytest.mark.parametrize("packed", CONVERTED, ids=lambda p: p.name.split("_")[0])
def test_model_zoos_converter_outputs_go_down_by_a_checked_root_edit(
    tmp_path, monkeypatch, checks, packed
):
    """Model Zoo's HF → CS outputs (2.1, no ``__metadata__``: ``--from``), upgraded to 2.10 (a
    rewrite: a root of ours, its attributes in a heap), then taken to 2.5 by a root edit: its
    check vouches for the blocks the edit left, the output is the copy-patch's, the next
    creation number is HDF5's own, and a text changed under a block left as it was is found."""
    src = tmp_path / packed.stem
    src.write_bytes(lzma.decompress(packed.read_bytes()))
    up = upgrade(
        src, UpgradeOptions(target="2.10", output_dir=tmp_path / "up", source_release="2.1")
    )
    assert up.status == "upgraded", up.error
    mid = tmp_path / "up" / src.name
    with h5py.File(mid) as f:
        assert attrtable.next_creation_index(f, mid) == len(f.attrs)  # (none deleted)
    down = upgrade(mid, UpgradeOptions(target="2.5", output_dir=tmp_path / "down"))
    assert down.status == "upgraded" and down.strategy == rootedit.STRATEGY, down.error
    (check,) = checks
    assert 0 < check.vouched < _attributes(tmp_path / "down" / src.name)
    patched = _patched(mid, tmp_path / "patched", monkeypatch, to="2.5")
    assert _logical(tmp_path / "down" / src.name) == _logical(patched)
    with h5py.File(mid) as f:  # a leaf whose block the edit leaves (the first few are edited)
        names = [n for n in f.attrs if n.endswith(".__metadata__")]
    real = rootedit.edit_root

    def edit(path: Path, edit: rootedit.Edit) -> None:
        real(path, edit)
        _flip_a_text(path, names[len(names) // 2], b'"')

    monkeypatch.setattr(rootedit, "edit_root", edit)
    bad = upgrade(mid, UpgradeOptions(target="2.5", output_dir=tmp_path / "bad"))
    assert bad.status == "failed" and "differ from the source" in (bad.error or ""), bad.error
    assert not (tmp_path / "bad" / src.name).exists()
