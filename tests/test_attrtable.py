"""The root's string attributes in one pass (``attrtable``, issue 33), checked against h5py on
the real library's files (version-1 root headers: a look-up by name there scans every
attribute, so reading them one by one cost O(n²)), on headers with continuation blocks and
every attribute type, and on damaged headers, where it must give up (None) rather than guess."""

from __future__ import annotations

import lzma
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest

from ckpt_migrate.format.h5 import attrs as h5attrs
from ckpt_migrate.format.h5 import attrtable, capi
from ckpt_migrate.format.h5 import root as h5root
from ckpt_migrate.format.h5.lookup3 import lookup3_many
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import iter_leaves
from ckpt_migrate.format.write import write_checkpoint

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL = sorted((FIXTURES / "real-cstorch-2.10").glob("*.mdl")) + sorted(FIXTURES.glob("*.mdl"))
REAL_XZ = sorted((FIXTURES / "real-cstorch-2.6-2.9").glob("*.mdl.xz"))


def _unpacked(tmp_path: Path, p: Path) -> Path:
    if p.suffix != ".xz":
        return p
    out = tmp_path / p.name[:-3]
    out.write_bytes(lzma.decompress(p.read_bytes()))
    return out


def _by_h5py(path: Path) -> dict[str, object]:
    with h5py.File(path, "r") as f:
        return {k: h5attrs.get_text(f, k) for k in f.attrs}


def _table(path: Path) -> dict[str, str | None] | None:
    with h5py.File(path, "r") as f:
        return attrtable.root_texts(f, path)


def _agrees(path: Path) -> int:
    """Every string the table holds is h5py's; returns how many it holds."""
    table, ref = _table(path), _by_h5py(path)
    assert table is not None and table.keys() == ref.keys()
    texts = {k: v for k, v in table.items() if v is not None}
    assert texts == {k: ref[k] for k in texts}
    return len(texts)


@pytest.mark.parametrize("src", REAL + REAL_XZ, ids=lambda p: p.name)
def test_the_real_librarys_roots_read_as_h5py_reads_them(src, tmp_path):
    path = _unpacked(tmp_path, src)
    assert _agrees(path) >= 1


def test_a_long_header_with_every_kind_of_attribute(tmp_path):
    """3,000 attributes in a version-1 header (continuation blocks), strings with non-ASCII
    characters, empty and null strings, numbers, fixed-length strings, arrays of strings."""
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        for i in range(3000):
            h5attrs.create(f.id, f"leaf.{i}.__metadata__", f'{{"i": {i}, "é": "ü"}}')
        f.attrs["empty"] = ""
        f.attrs["nul"] = h5py.Empty(h5py.string_dtype())
        f.attrs["number"] = np.float64(0.5)
        f.attrs["fixed"] = np.bytes_(b"fixed")
        f.attrs["list"] = ["a", "b"]
    assert h5py.h5o.get_info(h5py.File(path).id).hdr.version == 1
    assert _agrees(path) >= 3001
    table = _table(path)
    assert table is not None
    assert table["number"] is None and table["list"] is None and table["fixed"] is None


def _ours(tmp_path: Path) -> Path:
    """The real basic checkpoint as this tool writes it: a version-2 root, dense storage."""
    with read_checkpoint(FIXTURES / "real-cstorch-2.10" / "basic.mdl") as ckpt:
        write_checkpoint(ckpt.root, tmp_path / "ours.mdl", "2.10")
    return tmp_path / "ours.mdl"


def test_this_tools_roots_read_as_h5py_reads_them(tmp_path):
    """Dense storage (the fractal heap's blocks, read in order), with creation order tracked
    and without (``h5root.tracks_order``)."""
    ours = _ours(tmp_path)
    with h5py.File(ours, "r") as f:
        assert h5py.h5o.get_info(f.id).hdr.version == 2
    assert _agrees(ours) >= 16
    wide = tmp_path / "wide.h5"
    with h5root.create_file(wide, exclusive=True, attributes=70_000) as f:
        for i in range(200):
            h5attrs.create(f.id, f"l{i}.__metadata__", "x" * (i * 7))
    assert _agrees(wide) == 200


def test_a_dense_root_with_a_hole_is_left_to_h5py(tmp_path):
    """An attribute deleted from dense storage leaves a hole in the heap, where reading block
    by block would go wrong: the names differ from HDF5's, so h5py reads them."""
    ours = _ours(tmp_path)
    with h5py.File(ours, "r+") as f:
        f.attrs["note"] = "n" * 100
        f.attrs["more"] = "m" * 100
    with h5py.File(ours, "r+") as f:
        del f.attrs["note"]
    assert _table(ours) is None
    with read_checkpoint(ours) as ckpt:  # and the reader reads it by name
        assert sum(1 for _ in iter_leaves(ckpt.root)) == 14


def test_the_reader_asks_hdf5_for_no_leaf_metadata_of_a_real_file(tmp_path, monkeypatch):
    """The real library's gpt2 file: 242 leaves' ``__metadata__`` attributes, none looked up
    by name (each such look-up scans the whole list), and the same tree as read by name."""
    path = _unpacked(tmp_path, FIXTURES / "real-cstorch-2.6-2.9" / "gpt2-2.6.0.mdl.xz")

    def outline(ckpt) -> list[tuple[str, str]]:
        return [(r.name, repr(getattr(r.leaf, "shape", r.leaf))) for r in iter_leaves(ckpt.root)]

    with monkeypatch.context() as m:
        m.setattr(attrtable, "root_texts", lambda f, path, **kw: None)
        with read_checkpoint(path) as ckpt:
            by_name = outline(ckpt)
    calls = []
    real = h5attrs.get_text
    monkeypatch.setattr(h5attrs, "get_text", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    with read_checkpoint(path) as ckpt:
        assert outline(ckpt) == by_name and len(by_name) == 242
    assert [c for c in calls if c.endswith(".__metadata__")] == []


def _header_address(path: Path) -> int:
    with h5py.File(path, "r") as f:
        return h5py.h5o.get_info(f.id).addr


def _damaged(tmp_path: Path, how: str) -> Path:
    """The real basic file with one structure of its root broken."""
    src = FIXTURES / "real-cstorch-2.10" / "basic.mdl"
    data = bytearray(src.read_bytes())
    at = _header_address(src)
    if how == "header version":
        data[at] = 7
    elif how == "truncated":
        data = data[: at + 40]
    elif how == "heap signature":
        data = bytearray(bytes(data).replace(b"GCOL", b"XXXX"))
    elif how == "heap object past its collection":
        gcol = data.find(b"GCOL")
        while gcol >= 0:
            struct.pack_into("<Q", data, gcol + 16 + 8, 1 << 40)
            gcol = data.find(b"GCOL", gcol + 1)
    elif how == "continuation loop":
        size = struct.unpack_from("<I", data, at + 8)[0]
        body = bytearray(struct.pack("<HHB3x", 0x10, 16, 0) + struct.pack("<QQ", at + 16, size))
        data[at + 16 : at + 16 + len(body)] = body  # the first message: go back to the start
    elif how == "continuation past the end":
        body = struct.pack("<HHB3x", 0x10, 16, 0) + struct.pack("<QQ", at + 64, 1 << 40)
        data[at + 16 : at + 16 + len(body)] = body
    out = tmp_path / "damaged.mdl"
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize(
    "how",
    [
        "header version",
        "truncated",
        "heap signature",
        "heap object past its collection",
        "continuation loop",
        "continuation past the end",
    ],
)
def test_a_damaged_root_is_left_to_h5py(tmp_path, how):
    path = _damaged(tmp_path, how)
    address = _header_address(FIXTURES / "real-cstorch-2.10" / "basic.mdl")
    assert attrtable.read_texts(path, address) is None


@pytest.mark.parametrize("by", ["hdf5", "numpy"])
def test_many_checksums_at_once_are_the_one_buffer_ones(by, monkeypatch):
    """``lookup3_many`` (HDF5's function one by one, or numpy side by side where the library
    does not export it) against ``h5root.lookup3_python`` at lengths around the 12-byte rounds,
    batched and not, and on the reference value of lookup3.c's driver."""
    if by == "numpy":
        monkeypatch.setattr(capi, "_LOOKUP3", None)
    else:
        assert capi.lookup3(b"") is not None
    rng = np.random.default_rng(3)
    buffers = [rng.bytes(n) for n in (0, 1, 11, 12, 13, 24, 25, 1024, 4096) for _ in range(10)]
    assert lookup3_many(buffers) == [h5root.lookup3_python(b) for b in buffers]
    assert lookup3_many([b"Four score and seven years ago"] * 9) == [0x17770551] * 9


def test_a_collection_made_for_one_large_text_is_not_kept(tmp_path, monkeypatch):
    """HDF5 makes a collection to fit a text larger than its usual ones (the spec: 27 MB at
    150k leaves): the reader reads it for that text and does not keep it through the pass,
    while the small collections the other texts share are kept; every text reads as h5py's."""
    path = tmp_path / "large.h5"
    with h5py.File(path, "w") as f:
        f.attrs["__spec__"] = "ü" * (1 << 20)
        for i in range(300):
            f.attrs[f"l{i}.__metadata__"] = f"text {i}"
    seen: list[attrtable.HeapFile] = []
    real = attrtable.HeapFile.heap_text

    def heap_text(self: attrtable.HeapFile, *args: int) -> str | None:
        seen.append(self)
        return real(self, *args)

    monkeypatch.setattr(attrtable.HeapFile, "heap_text", heap_text)
    assert _agrees(path) == 301
    kept = seen[-1].heaps.values()
    assert kept and all(len(data) <= attrtable.HEAP_KEPT_BYTES for data, _ in kept)


def _hdf5_last_number(f: h5py.File) -> int:
    root = h5py.h5g.open(f.id, b"/")
    last = h5py.h5a.get_info(
        root, index=0, index_type=h5py.h5.INDEX_CRT_ORDER, order=h5py.h5.ITER_DEC
    )
    return last.corder


@pytest.mark.parametrize("count", [5, 40])  # (compact, and dense: a fractal heap)
def test_the_next_creation_number_is_read_from_the_roots_attribute_info(tmp_path, count):
    """One past HDF5's last number, and after the last attribute is deleted still the number
    HDF5 gives the next one (HDF5's last number then goes back: a root edit's room for new
    attributes counted from it was too large); a root that does not track the order: None."""
    from ckpt_migrate.engine import rootedit

    path = tmp_path / "order.h5"
    with h5py.File(path, "w", libver="latest", track_order=True) as f:
        for i in range(count):
            f.attrs[f"a{i}"] = str(i)
    with h5py.File(path) as f:
        assert attrtable.next_creation_index(f, path) == _hdf5_last_number(f) + 1 == count
    with h5py.File(path, "r+") as f:
        del f.attrs[f"a{count - 1}"]
        f.attrs["b"] = "new"  # (numbered ``count``)
        del f.attrs["b"]
    with h5py.File(path) as f:
        assert attrtable.next_creation_index(f, path) == count + 1
        assert _hdf5_last_number(f) == count - 2
        cap = h5root.MAX_TRACKED_ATTRIBUTES
        try:
            h5root.MAX_TRACKED_ATTRIBUTES = count + 4
            assert rootedit._order_room(f, path, 3) and not rootedit._order_room(f, path, 4)
            # where this reader cannot tell: HDF5's last number, which leaves room for 5
            assert attrtable.next_creation_index(f, tmp_path / "missing.h5") is None
            assert rootedit._order_room(f, tmp_path / "missing.h5", 5)
        finally:
            h5root.MAX_TRACKED_ATTRIBUTES = cap
    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f.attrs["a"] = "x"
    with h5py.File(plain) as f:
        assert attrtable.next_creation_index(f, plain) is None
