"""A root edit reads the source's outline and checks its output by what it changed (issue 33):
no dataset opened, no chunk index walked, no tree re-read, and still every output that is not
the source's root edited as planned is refused, and every dataset that points outside the file.

The hostile files here are written by ``save`` at release 2.5, with torch tensors (whose
datasets an outline read need not open), and then one tensor's dataset replaced through h5py
(the library's own writer, not ours) by one that refers to a "secret" file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numpy as np
import pytest
import xxhash
from conftest import one_line_error, run_cli
from test_hostile_references import point_outside
from test_rootedit import _source

from ckpt_migrate import cli
from ckpt_migrate.cli.commands import verify
from ckpt_migrate.engine import rootedit, rootverify
from ckpt_migrate.engine import upgrade as engine
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.format import read as reader
from ckpt_migrate.format.h5 import attrtable, preflight, sniff, storagescan
from ckpt_migrate.format.h5.io import object_addresses, open_read, root_addresses
from ckpt_migrate.format.h5.root import superblock_offset
from ckpt_migrate.format.h5.rootdigest import RootDigest, pair_hash
from ckpt_migrate.format.tree import DictNode

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]
HOSTILE = {
    "external-absolute": "stores its data in an external file",
    "external-relative": "stores its data in an external file",
    "virtual": "is a virtual dataset over other files",
    "filter": "uses HDF5 filter 307",
}


@pytest.fixture
def full_walks(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every full preflight walk (every dataset opened in a child) the command makes."""
    walks: list[Path] = []
    real = reader.preflight

    def counted(path: Path, **kw: Any):
        if kw.get("scope", "full") == "full":
            walks.append(path)
        return real(path, **kw)

    monkeypatch.setattr(reader, "preflight", counted)
    return walks


def _hostile(tmp_path: Path, kind: str) -> Path:
    import ckpt_migrate as cm

    src = tmp_path / "in" / "checkpoint_1.mdl"
    src.parent.mkdir(parents=True)
    state = {"model": {"w": torch.arange(16, dtype=torch.uint8), "v": torch.ones(3)}, "step": 3}
    cm.save(state, src, "2.5")
    point_outside(src, kind, tmp_path)
    return src


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_root_edit_refuses_a_dataset_that_points_outside(tmp_path, kind, dry_run):
    src = _hostile(tmp_path, kind)
    out = tmp_path / "out"
    out.mkdir()
    args = ["upgrade", src, "--to", "2.10", "--output-dir", out]
    proc = run_cli(*args, *(["--dry-run"] if dry_run else []))
    one_line_error(proc, 2, "model.w", HOSTILE[kind], "was not read")
    assert list(out.iterdir()) == []


def test_the_scan_refuses_what_the_full_walk_refuses_in_either_header_version(tmp_path):
    """Version-1 headers and filter pipelines (h5py's defaults, as the real library writes)
    and version-2 ones (``libver="latest"``), against HDF5's own reading of the same file."""
    for libver in ("earliest", "latest"):
        path = tmp_path / f"{libver}.h5"
        with h5py.File(path, "w", libver=libver) as f:
            data = np.arange(64, dtype=np.float32)
            f.create_dataset("plain", data=data)
            f.create_dataset("lz4", data=data, chunks=(16,), **hdf5plugin.LZ4())
            f.create_dataset("deflate", data=data, chunks=(16,), shuffle=True, compression=1)
            f.create_dataset("bzip2", data=data, chunks=(16,), **hdf5plugin.BZip2())
            f.create_dataset("ext", (4,), np.uint8, external=[("x.bin", 0, 4)])
        with open_read(path) as f:
            at, base = object_addresses(f), superblock_offset(f)
            filters = {
                name: [
                    f[name].id.get_create_plist().get_filter(i)[0]
                    for i in range(f[name].id.get_create_plist().get_nfilters())
                ]
                for name in at
            }
        assert filters["bzip2"] == [307] and filters["deflate"] == [2, 1]
        for name in ("plain", "lz4", "deflate"):
            assert storagescan.scan(path, {name: at[name]}, base), (libver, name)
        with pytest.raises(Exception, match="filter 307"):
            storagescan.scan(path, {"bzip2": at["bzip2"]}, base)
        with pytest.raises(Exception, match="external file"):
            storagescan.scan(path, {"ext": at["ext"]}, base)


def test_a_header_the_scan_does_not_know_falls_back_to_the_full_walk(tmp_path, full_walks):
    """A committed (shared) datatype: the scan cannot tell, the full walk decides (and here
    accepts); a clean file needs no full walk at all."""
    src = _source(tmp_path / "clean.mdl", experts=3)
    result = upgrade(src, UpgradeOptions(target="2.10", output_dir=tmp_path / "a"))
    assert result.status == "upgraded" and result.strategy == rootedit.STRATEGY, result.error
    assert full_walks == []

    with h5py.File(src, "r+") as f:
        name = "model.experts.0.w1.weight"
        data, attrs = f[name][()], dict(f[name].attrs)
        del f[name]
        f["shared_type"] = np.dtype("<f4")
        f.create_dataset(name, data=data, dtype=f["shared_type"])
        for key, value in attrs.items():
            f[name].attrs[key] = value
        del f["shared_type"]  # the type stays committed, shared by the dataset's header
    with open_read(src) as f:
        assert not storagescan.scan(src, object_addresses(f), superblock_offset(f))
    result = upgrade(src, UpgradeOptions(target="2.10", output_dir=tmp_path / "b"))
    assert result.status == "upgraded", result.error
    assert full_walks == [src]


def _corrupting(monkeypatch: pytest.MonkeyPatch, also) -> None:
    """``edit_root`` that, once the edit is made, changes the output further by ``also``."""
    real = rootedit.edit_root

    def edit(path: Path, edit: rootedit.Edit) -> None:
        real(path, edit)
        with h5py.File(path, "r+", locking=False) as f:
            also(f)

    monkeypatch.setattr(rootedit, "edit_root", edit)


@pytest.mark.parametrize(
    "change",
    [
        "an attribute the edit did not set",
        "a dataset moved",
        "a text attribute added",
        "a number attribute added",
        "an attribute removed",
    ],
)
def test_a_root_edit_that_changed_more_than_planned_is_refused(tmp_path, monkeypatch, change):
    src = _source(tmp_path / "src.mdl", experts=3)
    key = "model.experts.1.w1.weight"

    def also(f: h5py.File) -> None:
        if change == "an attribute the edit did not set":
            text = json.loads(f.attrs["note.__metadata__"])
            text["note.__metadata__"]["string_value"] = "another run"
            f.attrs["note.__metadata__"] = json.dumps(text)
        elif change == "a dataset moved":  # (made first: HDF5 cannot reuse the old place)
            f.create_dataset("moved", data=f[key][()])
            f["moved"].attrs.update(dict(f[key].attrs))
            del f[key]
            f.move("moved", key)
        elif change == "a text attribute added":
            f.attrs["extra"] = "x"
        elif change == "a number attribute added":
            f.attrs["extra"] = 1
        else:
            del f.attrs["nothing.__metadata__"]

    _corrupting(monkeypatch, also)
    result = upgrade(src, UpgradeOptions(target="2.10", output_dir=tmp_path / "out"))
    assert result.status == "failed" and result.exit_code != 0, change
    # A removed attribute leaves a hole in the root's heap, which the one-pass reader does
    # not read: the tree's re-read refuses it instead.
    words = "has no" if change == "an attribute removed" else "differ from the source"
    assert words in (result.error or ""), result.error
    assert not (tmp_path / "out" / src.name).exists()


def test_the_output_is_checked_by_its_edit_not_by_reading_its_tree(tmp_path, monkeypatch):
    """The tree's re-read (``verify_index``) runs only where the root cannot be read in one
    pass; then it runs, and the output is still checked."""
    src = _source(tmp_path / "src.mdl", experts=3)
    calls: list[str] = []
    real = engine.verify_index
    monkeypatch.setattr(
        engine, "verify_index", lambda *a, **k: calls.append("tree") or real(*a, **k)
    )
    _upgrade_ok(src, tmp_path / "a")
    assert calls == []
    monkeypatch.setattr(rootverify.attrtable, "root_texts", lambda *a, **k: None)
    _upgrade_ok(src, tmp_path / "b")
    assert calls == ["tree"]


@pytest.mark.parametrize("which", ["ours", "real 2.6 gpt2", "real 2.9 trainer"])
def test_the_spec_is_rewritten_without_the_tree_the_digest_or_the_links(
    tmp_path, monkeypatch, which
):
    """HDF5's rewrite of the spec is a root edit's peak (it loads the old text's heap
    collection whole): the tree, the source's root digest and its links are let go of before
    it, as the edit's check needs none of them (issue 33: 282 -> 206 MiB at 150k leaves);
    on our files and on the real library's."""
    src = _source_named(tmp_path, which)
    seen: dict[str, Any] = {}
    real_plan, real_edit = rootedit.plan_edit, rootedit.edit_root

    def plan(before, ckpt, root, release):
        seen["tree"], seen["handle"] = root, ckpt.handle
        return real_plan(before, ckpt, root, release)

    def edit(path: Path, planned: rootedit.Edit) -> None:
        handle = seen["handle"]
        # (no reference left but this test's own: ``seen`` and the call's argument)
        seen["held"] = (sys.getrefcount(seen["tree"]) > 2, planned.root is not None)
        seen["source"] = (handle.root_digest is not None, handle.knows_addresses)
        seen["digest"], seen["links"] = planned.source_digest, planned.source_links
        real_edit(path, planned)

    monkeypatch.setattr(rootedit, "plan_edit", plan)
    monkeypatch.setattr(rootedit, "edit_root", edit)
    _upgrade_ok(src, tmp_path / "a")
    assert seen["held"] == (False, False) and seen["source"] == (False, False)
    # (what the check compares, taken before: the pairs not edited, the links as bytes)
    assert seen["digest"] is not None and isinstance(seen["links"], bytes)


def test_a_spec_left_undecided_is_never_written(tmp_path):
    src = _source(tmp_path / "src.mdl", experts=1)
    out = tmp_path / "out.mdl"
    out.write_bytes(src.read_bytes())
    undecided = rootedit.Edit({"__spec__": rootedit._UNDECIDED}, [], DictNode([]))
    with pytest.raises(RuntimeError, match="not decided"):
        rootedit.edit_root(out, undecided)
    assert out.read_bytes() == src.read_bytes()


def _source_named(tmp_path: Path, which: str) -> Path:
    if which == "ours":
        return _source(tmp_path / "src.mdl", experts=3)
    release, kind = which.removeprefix("real ").split()
    return next(p for p in _real_26_29(tmp_path) if p.name.startswith(f"{kind}-{release}."))


@pytest.mark.parametrize("which", ["ours", "real 2.6 gpt2", "real 2.9 trainer"])
def test_an_output_root_the_check_cannot_read_is_read_back_against_the_edit_planned_again(
    tmp_path, monkeypatch, which
):
    """Where the edit's check cannot read the output's root in one pass, the tree it let go
    of is planned again from a second read of the source, and the output's tree is read back
    against it (``verify_index``); a change beyond the plan is refused that way too. On our
    files and on the real library's."""
    src = _source_named(tmp_path, which)
    _, checked_by_its_edit = _upgrade_ok(src, tmp_path / "b")
    real = attrtable.root_texts

    def source_only(f: h5py.File, path: Path, *a: Any, **k: Any):
        return real(f, path, *a, **k) if Path(path) == src else None

    monkeypatch.setattr(attrtable, "root_texts", source_only)
    trees: list[Any] = []
    real_index = engine.verify_index
    monkeypatch.setattr(
        engine, "verify_index", lambda *a, **k: trees.append(a[1]) or real_index(*a, **k)
    )
    _, out = _upgrade_ok(src, tmp_path / "a")
    assert len(trees) == 1 and trees[0] is not None
    assert verify(out, checked_by_its_edit)["identical"]
    if which != "ours":  # (the change below is to our file's own leaf)
        return

    def another_note(f: h5py.File) -> None:
        text = json.loads(f.attrs["note.__metadata__"])
        text["note.__metadata__"]["string_value"] = "another run"
        f.attrs["note.__metadata__"] = json.dumps(text)

    _corrupting(monkeypatch, another_note)
    failed = upgrade(src, UpgradeOptions(target="2.10", output_dir=tmp_path / "c"))
    assert failed.status == "failed" and "expected tree" in (failed.error or ""), failed.error
    assert not (tmp_path / "c" / src.name).exists()


def _upgrade_ok(src: Path, out: Path):
    result = upgrade(src, UpgradeOptions(target="2.10", output_dir=out))
    assert result.status == "upgraded" and result.strategy == rootedit.STRATEGY, result.error
    return result, out / src.name


def _real_26_29(tmp_path: Path) -> list[Path]:
    """The files the real 2.6.0 and 2.9.0 libraries wrote (fixtures, xz-compressed)."""
    import lzma

    found = []
    for packed in sorted((ROOT / "fixtures" / "real-cstorch-2.6-2.9").glob("*.mdl.xz")):
        path = tmp_path / packed.name.removesuffix(".xz")
        path.write_bytes(lzma.decompress(packed.read_bytes()))
        found.append(path)
    return found


def test_the_sniff_tells_format_05_roots_from_legacy_ones(tmp_path):
    """From the superblock and the root's header alone: the real 2.6-2.10 libraries' files
    (one with no leaf at all) and ours at 2.5 and 2.10 (compact and dense roots) are format
    0.5; 1.7-2.3 are not."""
    fixtures = ROOT / "fixtures"
    real = sorted((fixtures / "real-cstorch-2.10").glob("*.mdl")) + _real_26_29(tmp_path)
    ours_05 = [fixtures / "release-2.10.mdl", _source(tmp_path / "small.mdl", experts=1)]
    ours_05.append(_source(tmp_path / "dense.mdl", experts=40))
    legacy = [fixtures / f"release-{r}.mdl" for r in ("1.7", "1.8", "1.9", "2.0", "2.3")]
    assert len(real) >= 6
    assert all(sniff.looks_like_format_05(p) for p in real + ours_05)
    assert not any(sniff.looks_like_format_05(p) for p in legacy)
    junk = tmp_path / "junk.mdl"
    junk.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(200))
    assert not sniff.looks_like_format_05(junk)


def test_the_command_line_walks_early_only_a_file_whose_upgrade_reads_every_dataset(
    tmp_path, monkeypatch
):
    started: list[Path] = []
    monkeypatch.setattr(preflight, "start", started.append)
    cli.begin_reading(_source(tmp_path / "new.mdl", experts=2))
    assert started == []
    cli.begin_reading(ROOT / "fixtures" / "release-1.9.mdl")
    assert started == [ROOT / "fixtures" / "release-1.9.mdl"]


def test_the_scan_understands_every_header_the_real_libraries_wrote(tmp_path):
    """The real 2.6-2.10 libraries' files are decided by the scan (clean), not sent to the full
    walk by a header it does not know: else their root edits would lose what the scan buys."""
    real = sorted((ROOT / "fixtures" / "real-cstorch-2.10").glob("*.mdl")) + _real_26_29(tmp_path)
    for path in real:
        with open_read(path) as f:
            _, addresses = root_addresses(f)
            base = superblock_offset(f)
        assert storagescan.scan(path, addresses, base), path.name


@pytest.fixture
def root_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every file whose root attributes are read in one pass (``root_texts``)."""
    reads: list[str] = []
    real = attrtable.root_texts

    def counted(f: h5py.File, path: Path, *a: Any, **k: Any):
        reads.append(Path(path).name)
        return real(f, path, *a, **k)

    monkeypatch.setattr(attrtable, "root_texts", counted)
    return reads


def test_the_source_root_is_read_once_its_digest_taken_as_it_is_read(tmp_path, root_reads):
    """The verification compares the output with the digest the reader took of the source's
    root (``H5Handle.root_digest``), not with a second read of the source; an output changed
    beyond the plan is still refused (``test_a_root_edit_that_changed_more_than_planned``)."""
    src = _source(tmp_path / "src.mdl", experts=3)
    reads = root_reads
    reads.clear()  # (the save's own read-back of what it wrote)
    _upgrade_ok(src, tmp_path / "a")
    assert reads.count(src.name) == 1 and len(reads) == 2  # the source once, the output once


def test_a_digest_gives_back_the_pairs_not_taken_out():
    whole, rest = RootDigest(), RootDigest()
    whole.add("__spec__", "[1]")
    whole.add("w.__metadata__", '{"t": 1}', keep_pair=False)  # a tensor's: not kept
    whole.add("__SUCCESS__", None)
    rest.add("w.__metadata__", '{"t": 1}')
    taken = whole.without({"__spec__", "__SUCCESS__", "added.__metadata__"})
    assert taken is not None and (taken.digest, taken.count) == (rest.digest, rest.count)
    assert taken.other == []
    assert whole.without({"w.__metadata__"}) is None  # cannot be taken out: read both files


def test_a_pair_is_hashed_as_its_joined_bytes_however_long_its_text():
    """A long text is hashed a slice at a time (the 27 MB ``__spec__`` was copied four times
    over): the digest is still that of the pair's bytes, name, NUL, 1 and UTF-8 text (lone
    surrogates as written), given as text or as bytes; ``holds`` tells a text it was given."""
    text = "ü\udc80a\U0001f600" * 400_000  # (over a slice of 2**20 characters)
    edges = [("b", "ü" * ((1 << 20) - 1)), ("b", "ü" * (1 << 20))]  # (one call; streamed)
    pairs = [("__spec__", text), ("__spec__", text[1:]), ("n", ""), ("\udcff", "x"), *edges]
    for name, value in pairs:
        raw = value.encode("utf-8", "surrogatepass")
        pair = name.encode("utf-8", "surrogatepass") + b"\0\1" + raw
        want = xxhash.xxh3_128_intdigest(pair)
        assert pair_hash(name, value) == pair_hash(name, raw) == want
    none = b"\xed\xb3\xbf\0"  # a name alone (a value that is not text): "\udcff", NUL
    assert pair_hash("\udcff", None) == xxhash.xxh3_128_intdigest(none)
    digest = RootDigest()
    digest.add("__spec__", text)
    assert digest.holds("__spec__", text) and digest.holds(
        "__spec__", text.encode("utf-8", "surrogatepass")
    )
    assert not digest.holds("__spec__", text[1:]) and not digest.holds("other", text)


def test_the_real_librarys_files_are_checked_against_the_digest_of_their_first_read(
    tmp_path, monkeypatch, root_reads
):
    """The files the real 2.6 and 2.9 libraries wrote (version-1 roots, attributes in the
    header), upgraded to 2.10 by a root edit: the source is read once and its digest taken
    then; an output with one more root attribute than planned is refused, nothing published."""
    reads = root_reads
    (tmp_path / "in").mkdir()
    sources = _real_26_29(tmp_path / "in")
    assert sources
    for src in sources:
        reads.clear()
        _upgrade_ok(src, tmp_path / "ok" / src.stem)
        assert reads.count(src.name) == 1, (src.name, reads)
    _corrupting(monkeypatch, lambda f: f.attrs.__setitem__("extra", "x"))
    for src in sources:
        out = tmp_path / "bad" / src.stem
        result = upgrade(src, UpgradeOptions(target="2.10", output_dir=out))
        assert result.status == "failed", src.name
        assert "differ from the source" in (result.error or ""), result.error
        assert not (out / src.name).exists()


def test_the_preflight_child_scans_the_datasets_while_the_parent_reads(tmp_path, monkeypatch):
    """The storage scan runs in the outline's preflight child, on the second core, while the
    parent reads the root (150k headers: 2-3 s, issue 33): the parent scans no header itself.
    A child that dies while it scans costs the parent its own scan, not the upgrade."""
    import os
    import signal

    src = _source(tmp_path / "src.mdl", experts=3)
    log = tmp_path / "scans"
    real, parent = storagescan.scan, os.getpid()

    def logged(*a: Any, **k: Any) -> bool:
        with open(log, "a") as fh:
            fh.write("parent\n" if os.getpid() == parent else "child\n")
        return real(*a, **k)

    monkeypatch.setattr(storagescan, "scan", logged)
    _upgrade_ok(src, tmp_path / "a")
    assert log.read_text().split() == ["child"]
    (tmp_path / "in").mkdir()
    real_files = _real_26_29(tmp_path / "in")  # what the real 2.6 and 2.9 libraries wrote
    assert real_files
    for path in real_files:
        log.unlink()
        _upgrade_ok(path, tmp_path / "real" / path.stem)
        assert log.read_text().split() == ["child"], path.name

    def dies(*a: Any, **k: Any) -> bool:
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return logged(*a, **k)

    log.unlink()
    monkeypatch.setattr(storagescan, "scan", dies)
    _upgrade_ok(src, tmp_path / "b")
    assert log.read_text().split() == ["parent"]


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("ours", "__spec__"),
        ("ours", "__cstorch_version__"),
        ("trainer-2.9.0.mdl", "__spec__"),
        ("trainer-2.9.0.mdl", "__cstorch_version__"),
        ("gpt2-2.6.0.mdl", "__cstorch_version__"),  # (no Trainer metadata: its spec is kept)
    ],
)
def test_a_written_text_that_does_not_read_back_is_found(tmp_path, monkeypatch, source, name):
    """Each text the edit set is compared as the check reads it (not kept: the spec is 27 MB
    at 150k leaves): one character changed after the edit, in the spec or a short text, fails
    the upgrade and leaves no output; on a root this tool wrote and on the real 2.9 and 2.6
    libraries' (where there is Trainer metadata, it gains a 2.10 entry: the spec is written)."""
    if source == "ours":
        src = _source(tmp_path / "src.mdl", experts=3)
    else:
        src = next(p for p in _real_26_29(tmp_path) if p.name == source)
    edits: list[rootedit.Edit] = []
    real = rootedit.edit_root
    monkeypatch.setattr(rootedit, "edit_root", lambda p, e: edits.append(e) or real(p, e))
    _upgrade_ok(src, tmp_path / "clean")
    assert name in edits[-1].set  # (the text the check is to find changed is one it wrote)

    def also(f: h5py.File) -> None:
        text = f.attrs[name]
        f.attrs[name] = text[:-2] + ("x" if text[-2] != "x" else "y") + text[-1]

    _corrupting(monkeypatch, also)
    result = upgrade(src, UpgradeOptions(target="2.10", output_dir=tmp_path / "out"))
    assert result.status == "failed" and result.exit_code != 0
    assert f"root attribute {name!r} does not hold what was written" in (result.error or "")
    assert not (tmp_path / "out" / src.name).exists()


@pytest.mark.parametrize(
    ("text", "raw", "same"),
    [
        ("plain", b"plain", True),
        ("ünïcödé" * 3, ("ünïcödé" * 3).encode(), True),
        ("a\udcffb", b"a\xffb", True),  # an undecodable byte, as the reader escapes it
        ("", b"", True),
        ("abc", b"abd", False),
        ("abc", b"abcd", False),
        ("abcd", b"abc", False),
        ("ü", b"u", False),
    ],
)
def test_a_text_is_compared_with_its_bytes_a_slice_at_a_time(text, raw, same):
    assert rootverify._encodes_as(text, raw, step=2) is same


@pytest.mark.parametrize("target", ["2.0", "2.4"])
def test_a_rewrite_lets_go_of_the_source_roots_digest_before_it_writes(
    tmp_path, monkeypatch, target
):
    """The source root's digest is a root edit's: a chain that rewrites the file (here the
    real 2.10 library's ``tied.mdl`` brought down) lets go of it before writing and reading
    its output back (issue 33: 2.5 -> 2.4 at 150k leaves, 285 -> 268 MiB)."""
    import shutil

    from conftest import REAL

    src = tmp_path / "tied.mdl"
    shutil.copyfile(REAL / "tied.mdl", src)
    seen: dict[str, Any] = {}
    real_read, real_write = engine.read_planned, engine.write

    def read_planned(*args, **kwargs):
        ckpt, plan = real_read(*args, **kwargs)
        seen["taken"] = ckpt.handle.root_digest is not None
        return ckpt, plan

    def write(ckpt, *args, **kwargs):
        seen["held"] = ckpt.handle.root_digest is not None
        return real_write(ckpt, *args, **kwargs)

    monkeypatch.setattr(engine, "read_planned", read_planned)
    monkeypatch.setattr(engine, "write", write)
    result = upgrade(src, UpgradeOptions(target=target, output_dir=tmp_path / "out"))
    assert result.error is None and result.strategy != rootedit.STRATEGY
    assert seen == {"taken": True, "held": False}
