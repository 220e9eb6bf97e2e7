"""The root's links in one pass over the file's bytes (``linktable``, issue 33), checked
against HDF5's own iteration on the files the real libraries wrote (old-style groups: a
symbol table), on every group layout HDF5 writes (symbol table of one node and of a B-tree
of several levels, compact and dense link messages), and on roots it must not answer for
(a soft or external link, a damaged or looping structure): None there, never a guess."""

from __future__ import annotations

import lzma
import os
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import one_line_error, run_cli

import ckpt_migrate as cm
from ckpt_migrate.engine import copypatch
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.errors import UnsafeContentError
from ckpt_migrate.format.h5 import linktable
from ckpt_migrate.format.h5.io import root_addresses
from ckpt_migrate.format.h5.root import root_header
from ckpt_migrate.format.read import read_checkpoint

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL = sorted((FIXTURES / "real-cstorch-2.10").glob("*.mdl"))
REAL_XZ = sorted((FIXTURES / "real-cstorch-2.6-2.9").glob("*.mdl.xz"))


def _by_hdf5(path: Path) -> dict[str, int]:
    with h5py.File(path, "r") as f:
        return root_addresses(f)[1]


def _links(path: Path) -> dict[str, int] | None:
    with h5py.File(path, "r") as f:
        return linktable.of_root(f, path)


def _group(path: Path, count: int, **kw) -> Path:
    with h5py.File(path, "w", **kw) as f:
        for i in range(count):
            f.create_dataset(f"layer.{i}.weight", data=[i])
    return path


@pytest.mark.parametrize("src", REAL + REAL_XZ, ids=lambda p: p.name)
def test_the_real_librarys_roots_read_as_hdf5_reads_them(src, tmp_path):
    path = src
    if src.suffix == ".xz":
        path = tmp_path / src.name[:-3]
        path.write_bytes(lzma.decompress(src.read_bytes()))
    assert _links(path) == _by_hdf5(path)


@pytest.mark.parametrize(
    ("count", "kw"),
    [
        (3, {}),  # a symbol table of one node
        (2000, {}),  # a B-tree of several levels
        (3, {"libver": "latest"}),  # compact link messages in the header
        (2000, {"libver": "latest"}),  # dense: a fractal heap and its name index
        (200, {"track_order": True}),  # dense, with creation order
    ],
    ids=["stab-small", "stab-btree", "compact", "dense", "dense-ordered"],
)
def test_every_group_layout_reads_as_hdf5_reads_it(tmp_path, count, kw):
    path = _group(tmp_path / "g.h5", count, **kw)
    found = _links(path)
    assert found is not None and len(found) == count
    assert found == _by_hdf5(path)


def _add_link(path: Path, kind: str, target: str) -> None:
    """A soft link ``alias`` to ``target``, or an external link ``away`` to another file."""
    with h5py.File(path, "a") as f:
        if kind == "soft":
            f["alias"] = h5py.SoftLink(target)
        else:
            f["away"] = h5py.ExternalLink("/etc/passwd", "/x")


def _root_messages(data: bytes, address: int, base: int = 0) -> list[tuple[int, int, int]]:
    """(where in ``data``, type, size) of each message of the version-1 header at ``address``
    (relative to the superblock's ``base``), continuation blocks followed."""
    start = base + address
    chunks, found = [(start + 16, struct.unpack_from("<I", data, start + 8)[0])], []
    while chunks:
        at, n = chunks.pop()
        end = at + n
        while at + 8 <= end:
            kind, size = struct.unpack_from("<HH", data, at)
            if kind == 0x10:
                more, length = struct.unpack_from("<QQ", data, at + 8)
                chunks.append((base + more, length))
            found.append((at, kind, size))
            at += 8 + size
    return found


@pytest.mark.parametrize("src", REAL_XZ[:1], ids=lambda p: p.name)
def test_a_link_message_shorter_than_its_fields_is_not_answered(src, tmp_path):
    """A hostile root (the real 2.6 library's, whose header has no checksum): one of its
    attribute messages made a link message of no bytes, the rest a NIL message. HDF5 reads
    the old-style group by its symbol table and never looks at it; this reader read the link's
    version past its end (IndexError: ``inspect`` and ``plan`` ended in an internal error).
    It now leaves the root to HDF5, and the commands refuse the file as HDF5 reads it: the
    message was ``__spec__``'s."""
    path = tmp_path / "hostile.mdl"
    path.write_bytes(lzma.decompress(src.read_bytes()))
    with h5py.File(path, "r") as f:
        address, base = root_header(f)
    assert base == 0
    data = bytearray(path.read_bytes())
    at, _, size = next(m for m in _root_messages(data, address) if m[1] == 0x0C)
    data[at : at + 8 + size] = (
        struct.pack("<HHB3x", 0x06, 0, 0) + struct.pack("<HHB3x", 0, size - 8, 0) + bytes(size - 8)
    )
    path.write_bytes(bytes(data))
    assert linktable.links(path, address) is None
    for args in (["inspect", path], ["plan", path, "--to", "2.10"]):  # (the message was __spec__)
        one_line_error(run_cli(*args), 2, "hostile.mdl", "without a readable __spec__")


@pytest.mark.parametrize("kind", ["soft", "external"])
def test_a_link_that_is_not_hard_is_not_answered(tmp_path, kind):
    for kw in ({}, {"libver": "latest"}):
        path = _group(tmp_path / "g.h5", 40, **kw)
        _add_link(path, kind, "/layer.0.weight")
        assert _links(path) is None


def _root_tree(path: Path) -> int:
    """The address of the root's group B-tree (a file h5py wrote by its defaults)."""
    with h5py.File(path, "r") as f:
        address, base = root_header(f)
    data = path.read_bytes()
    at = next(at for at, kind, _ in _root_messages(data, address, base) if kind == 0x11)
    return base + struct.unpack_from("<Q", data, at + 8)[0]


def test_a_looping_or_damaged_b_tree_gives_up(tmp_path):
    path = _group(tmp_path / "g.h5", 2000)
    tree = _root_tree(path)
    data = bytearray(path.read_bytes())
    assert data[tree : tree + 4] == b"TREE" and data[tree + 5] >= 1  # an internal node
    looped = bytearray(data)
    looped[tree + 32 : tree + 40] = struct.pack("<Q", tree)  # its first child: itself
    (tmp_path / "loop.h5").write_bytes(bytes(looped))
    assert linktable.links(tmp_path / "loop.h5", tree) is None
    outside = bytearray(data)
    outside[tree + 32 : tree + 40] = struct.pack("<Q", len(data) * 4)
    (tmp_path / "out.h5").write_bytes(bytes(outside))
    assert linktable.links(tmp_path / "out.h5", tree) is None
    gone = bytearray(data)
    gone[tree : tree + 4] = b"XXXX"
    (tmp_path / "gone.h5").write_bytes(bytes(gone))
    assert linktable.links(tmp_path / "gone.h5", tree) is None


@pytest.mark.parametrize("kind", ["soft", "external"])
def test_the_outline_read_gives_way_to_the_full_read_for_a_link_not_hard(tmp_path, kind):
    """The real library's file with a link added to its root: the outline does not answer,
    and the full read refuses the external link (and reads past the dangling soft one) as it
    always did, naming it."""
    path = tmp_path / "basic.mdl"
    path.write_bytes((FIXTURES / "real-cstorch-2.10" / "basic.mdl").read_bytes())
    _add_link(path, kind, "/nowhere")
    assert _links(path) is None
    if kind == "external":
        with pytest.raises(UnsafeContentError, match="'/away' is an external link"):
            read_checkpoint(path, outline=True)
    else:
        with read_checkpoint(path, outline=True) as ckpt:
            assert not ckpt.outline  # read in full


def _hinted(path: Path, monkeypatch, root: int | None = None) -> list[int]:
    """The offsets ``linktable.prefetch_root`` asks the kernel to read ahead in ``path``
    (``prefetch`` of the group at ``root``: a damaged file HDF5 is not to open here)."""
    asked: list[int] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_WILLNEED and length == 4096
        asked.append(offset)
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", record)
    if root is not None:
        linktable.prefetch(path, root)
    else:
        with h5py.File(path, "r") as f:
            linktable.prefetch_root(f, path)
    monkeypatch.setattr(os, "posix_fadvise", real)
    return asked


def _symbol_nodes(path: Path) -> list[int]:
    """Where the file's symbol table nodes lie, found by their signature (a file whose only
    group is its root: all of them are the root's)."""
    data = path.read_bytes()
    found, at = [], data.find(b"SNOD\x01")
    while at >= 0:
        found.append(at)
        at = data.find(b"SNOD\x01", at + 1)
    return found


@pytest.mark.parametrize(
    "src",
    [*REAL[:2], REAL_XZ[0], FIXTURES / "release-1.9.mdl", None],
    ids=lambda p: "h5py-2000-links" if p is None else p.name,
)
def test_prefetch_hints_exactly_the_roots_symbol_table_nodes(src, tmp_path, monkeypatch):
    """Issue 33: a cold 1.9 root's 1,620 nodes were read one by one by each preflight child's
    walk of its links. The real library's roots, a legacy one and a B-tree of several levels:
    every node of the root's symbol table is hinted, once, and nothing else."""
    if src is None:
        path = _group(tmp_path / "g.h5", 2000)
    elif src.suffix == ".xz":
        path = tmp_path / src.name[:-3]
        path.write_bytes(lzma.decompress(src.read_bytes()))
    else:
        path = src
    with h5py.File(path, "r") as f:
        assert all(isinstance(f[k], h5py.Dataset) for k in f)  # the root is the only group
    nodes = _symbol_nodes(path)
    assert nodes and sorted(_hinted(path, monkeypatch)) == nodes
    if src is None:
        assert len(nodes) > 100  # (hundreds of nodes, under a B-tree of several levels)


@pytest.mark.parametrize("kw", [{"libver": "latest"}, {"track_order": True}])
def test_prefetch_leaves_a_new_style_root_alone(tmp_path, monkeypatch, kw):
    """A new-style root keeps its links as messages (2,000 of them: in a fractal heap, with
    and without their creation order): no symbol table node to hint."""
    assert _hinted(_group(tmp_path / "new.h5", 2000, **kw), monkeypatch) == []


def test_prefetch_leaves_a_looping_or_damaged_b_tree_alone(tmp_path, monkeypatch):
    """A loop, no node where one is named, a symbol table node named twice (each node is
    hinted once, so that a small file cannot name more of them than it could hold)."""
    path = _group(tmp_path / "g.h5", 2000)
    with h5py.File(path, "r") as f:
        root = root_header(f)[0]
    assert len(_hinted(path, monkeypatch, root)) > 100
    tree = _root_tree(path)
    data = path.read_bytes()
    leaf = tree  # the B-tree's first node of level 0, whose children are symbol table nodes
    while data[leaf + 5] > 0:
        leaf = struct.unpack_from("<Q", data, leaf + 32)[0]
    twice = data[leaf + 32 : leaf + 40]  # its first child named again as its second
    for at, damage in [(tree + 32, struct.pack("<Q", tree)), (tree, b"XXXX"), (leaf + 48, twice)]:
        bad = bytearray(data)
        bad[at : at + len(damage)] = damage
        (tmp_path / "bad.h5").write_bytes(bytes(bad))
        assert _hinted(tmp_path / "bad.h5", monkeypatch, root) == []


@pytest.mark.parametrize("layout", ["ours", "the 1.9 library's"])
def test_the_edit_of_a_copy_hints_the_old_roots_nodes_in_the_copy(
    tmp_path, monkeypatch, layout, real_layout_19
):
    """Issue 33: the edit of a clone (or copy) links each dataset by its name in the old root,
    whose symbol table nodes are cold in the new file (its own pages, not the source's): they
    are hinted in the temporary, as the preflight child hints them in the source. Our 1.9
    writer's file, and one laid out as the 1.9 library wrote it (auto-chunked LZ4, bf16 stored
    as int16, small datasets packed between the chunks)."""
    src = tmp_path / "c.mdl"
    if layout == "ours":
        weights = {f"w{i}": np.full((256, 256), i, dtype=np.float32) for i in range(40)}
        cm.save({"model": weights, "step": 3}, src, "1.9")
    else:
        src.write_bytes(real_layout_19.read_bytes())
    with h5py.File(src, "r") as f:
        want = root_header(f)
    asked: list[tuple[Path, int, int]] = []
    real = linktable.prefetch
    monkeypatch.setattr(
        copypatch.linktable, "prefetch", lambda p, *at: asked.append((p, *at)) or real(p, *at)
    )
    opts = UpgradeOptions(output_dir=tmp_path / "out", inputs={"drop_dataloader_state": True})
    res = upgrade(src, opts)
    assert (res.status, res.strategy) == ("upgraded", "copy-patch"), res.error
    ((path, *at),) = asked
    assert path.parent == tmp_path / "out" and path.name != src.name and tuple(at) == want
