"""The safetensors writer's header and its read-back check (``hf.safetensors_io``).

The header is written entry by entry and the check compares it as bytes (issue 33: a parsed or
a built dictionary of 150k entries took 200 MB): the text must stay what ``json.dumps`` of the
header as one object gives, which the real ``safetensors`` reads.
"""

from __future__ import annotations

import dataclasses
import json
import struct

import numpy as np
import pytest

from ckpt_migrate.errors import VerificationError
from ckpt_migrate.hf import safetensors_io as st

safetensors = pytest.importorskip("safetensors")

NAMES = ["a.b", 'q"uote', "\u00fcn\u00ef\u2603", "back\\slash", "tab\t", "", "x" * 300]


def _as_one_object(entries: list[st.Entry], metadata: dict[str, str]) -> bytes:
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for e in entries:
        end = offset + e.nbytes
        header[e.name] = {"dtype": st.ST_DTYPES[e.dtype], "shape": list(e.shape),
                          "data_offsets": [offset, end]}  # fmt: skip
        offset = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(len(text) + 8) % st.DATA_ALIGNMENT)
    return struct.pack("<Q", len(text)) + text


@pytest.mark.parametrize("metadata", [{}, {"format": "pt"}, {"format": "pt", "\u00fc": '"x'}])
def test_the_header_is_json_dumps_of_one_object(metadata):
    rng = np.random.default_rng(0)
    dtypes = sorted(st.ST_DTYPES)
    entries = [
        st.Entry(name, dtypes[rng.integers(len(dtypes))], tuple(rng.integers(0, 6, i % 4)))
        for i, name in enumerate(NAMES)
    ]
    entries = [st.Entry(e.name, e.dtype, tuple(int(d) for d in e.shape)) for e in entries]
    assert b"".join(st.header_parts(entries, metadata)) == _as_one_object(entries, metadata)
    assert b"".join(st.header_parts([], metadata)) == _as_one_object([], metadata)


def test_a_name_planned_twice_is_refused(tmp_path):
    """Also when the two land in different shards (each header alone would be valid)."""
    a = np.zeros(4, np.float32)
    twice = [st.Entry("w", "float32", (4,)), st.Entry("v", "float32", (4,))]
    twice.append(st.Entry("w", "float32", (4,)))
    with pytest.raises(VerificationError, match="planned twice"):
        st.write_stream(tmp_path, twice, ((e.name, a) for e in twice), 16)
    reserved = [st.Entry("__metadata__", "float32", (4,))]
    with pytest.raises(VerificationError, match="planned twice"):
        st.write_stream(tmp_path, reserved, iter([("__metadata__", a)]), 16)
    assert list(tmp_path.iterdir()) == []  # refused before any file is written


def _written(tmp_path):
    arrays = {name or "empty": np.arange(6, dtype=np.float32).reshape(2, 3) + i
              for i, name in enumerate(NAMES)}  # fmt: skip
    entries = [st.Entry(n, "float32", a.shape) for n, a in arrays.items()]
    written = st.write_stream(tmp_path, entries, iter(arrays.items()), 10**9)
    return entries, written, arrays


def test_the_written_file_is_what_safetensors_reads_and_passes_the_check(tmp_path):
    _, written, arrays = _written(tmp_path)
    st.verify(tmp_path, written)
    with safetensors.safe_open(str(tmp_path / st.SINGLE), framework="numpy") as f:
        assert list(f.keys()) == sorted(arrays)  # (safe_open lists them sorted)
        for name, array in arrays.items():
            np.testing.assert_array_equal(f.get_tensor(name), array)


def test_a_changed_header_or_tensor_byte_fails_the_check(tmp_path):
    _, written, _ = _written(tmp_path)
    path = tmp_path / st.SINGLE
    good = path.read_bytes()
    at = good.index(b'"shape":[2,3]') + len('"shape":[')
    path.write_bytes(good[:at] + b"3,2" + good[at + 3 :])  # still a valid safetensors file
    with pytest.raises(VerificationError, match="header differs"):
        st.verify(tmp_path, written)
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(VerificationError, match=f"{'x' * 300}: the bytes read back differ"):
        st.verify(tmp_path, written)
    path.write_bytes(good[:100])
    with pytest.raises(VerificationError, match="header differs"):
        st.verify(tmp_path, written)


def test_the_header_is_checked_in_slabs(tmp_path, monkeypatch):
    """The header is hashed as it is read, a slab at a time (at 112k tensors it is tens of MB):
    slabs of 7 bytes pass the file as written and refuse one with a header byte changed, or
    cut inside its header."""
    _, written, _ = _written(tmp_path)
    monkeypatch.setattr(st, "SLAB_BYTES", 7)
    st.verify(tmp_path, written)
    path = tmp_path / st.SINGLE
    good = path.read_bytes()
    at = good.index(b'"dtype"')
    for bad in (good[:at] + b"'" + good[at + 1 :], good[: at + 3]):
        path.write_bytes(bad)
        with pytest.raises(VerificationError, match="header differs"):
            st.verify(tmp_path, written)


class _NoOffsetKeys:
    """``safe_open`` as safetensors before 0.5 had it: ``keys`` (sorted), no ``offset_keys``."""

    def __init__(self, *args, **kwargs):
        self._f = safetensors.safe_open(*args, **kwargs)

    def __enter__(self):
        self._f.__enter__()
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def keys(self):
        return self._f.keys()

    def get_slice(self, name):
        return self._f.get_slice(name)


@pytest.mark.parametrize("reader", ["offset_keys", "keys"])
def test_the_listing_is_checked_against_the_plan(tmp_path, monkeypatch, reader):
    """A file whose header is the one written, checked with the record of another plan
    (``Written.listings``): ``safe_open``'s listing, hashed tensor by tensor, refuses one
    tensor more or less than planned, another name, another shape and, in data order, a
    tensor listed where another was planned; the listing as a set, where the reader gives
    no order."""
    if reader == "keys":
        from types import SimpleNamespace

        monkeypatch.setattr(st, "require", lambda *a: SimpleNamespace(safe_open=_NoOffsetKeys))
    entries, written, _ = _written(tmp_path)
    st.verify(tmp_path, written)

    def checked_as(plan):
        other = tmp_path / f"other{len(list(tmp_path.iterdir()))}"
        other.mkdir()
        arrays = ((e.name, np.zeros(e.shape, e.dtype)) for e in plan)
        theirs = st.write_stream(other, plan, arrays, 10**9)
        st.verify(tmp_path, dataclasses.replace(written, listings=theirs.listings))

    extra = st.Entry("\uffffplanned", "float32", (2, 3))
    n = len(entries)
    with pytest.raises(VerificationError, match=f"lists {n} tensors, {n + 1} were planned"):
        checked_as([*entries, extra])
    with pytest.raises(VerificationError, match=f"lists {n} tensors, {n - 1} were planned"):
        checked_as(entries[:-1])
    first = "lists .* as tensor 1, not as planned" if reader == "offset_keys" else "other than"
    with pytest.raises(VerificationError, match=first):
        checked_as([st.Entry(entries[0].name, "float32", (3, 2)), *entries[1:]])
    with pytest.raises(VerificationError, match=first):
        checked_as([st.Entry(entries[0].name, "int32", (2, 3)), *entries[1:]])
    with pytest.raises(VerificationError, match=r"not as planned|other than"):
        checked_as([*entries[:-1], extra])
    swapped = [entries[1], entries[0], *entries[2:]]
    if reader == "offset_keys":
        with pytest.raises(VerificationError, match="as tensor 1, not as planned"):
            checked_as(swapped)
    else:
        checked_as(swapped)  # (a set: the order is the header's, checked by its hash)


def test_what_a_write_keeps_for_its_check_is_a_few_objects_a_file(tmp_path):
    """The check's record of a write (``Written``) holds nothing per tensor: each file's
    tensor hashes are one bytearray, in the order written, and its tensor count (a dict of
    112k names for the index and one of 112k hashes were 13 MiB of a 112k-tensor export's
    read-back peak, issue 33); shards and their index come out as before, and pass."""
    arrays = {f"h.{i}.w": np.full((4, 8), i, np.float32) for i in range(40)}
    entries = [st.Entry(n, "float32", a.shape) for n, a in arrays.items()]
    written = st.write_stream(tmp_path, entries, iter(arrays.items()), 10 * 4 * 8 * 4)
    st.verify(tmp_path, written)
    shards = [f for f in written.files if f.endswith(".safetensors")]
    assert len(shards) == 4 and written.tensors == 40
    for value in vars(written).values():
        assert not isinstance(value, dict) or len(value) <= len(shards), value
    assert [len(h) for h in written.hashes.values()] == [16 * 10] * 4
    assert [len(h) for h in written.listings.values()] == [8 * 10] * 4
    assert [list(s) for s in written.sizes.values()] == [[4 * 8 * 4] * 10] * 4
    index = json.loads((tmp_path / st.INDEX).read_text())["weight_map"]
    assert index == {f"h.{i}.w": shards[i // 10] for i in range(40)}


def test_outputs_of_one_shape_share_one_shape_tuple():
    """``shapes_of``: one tuple for every output of a shape (a tuple each for 112k outputs,
    held until the export is read back, was 5.5 MB, issue 33), of Python ints."""
    from types import SimpleNamespace

    from ckpt_migrate.hf.arrays import shapes_of

    plan = [
        SimpleNamespace(name=f"o{i}", out_shape=lambda s, i=i: np.array(s[f"i{i % 3}"]))
        for i in range(30)
    ]
    shapes = {"i0": (768, 2304), "i1": (768,), "i2": (768, 2304)}
    out = shapes_of(plan, shapes)
    assert [out[f"o{i}"] for i in range(30)] == [shapes[f"i{i % 3}"] for i in range(30)]
    assert len({id(s) for s in out.values()}) == 2
    assert all(type(d) is int for s in out.values() for d in s)


def test_the_plan_s_entries_are_let_go_of_before_the_files_are_read_back(tmp_path, monkeypatch):
    """``directories.write`` takes the plan's entries and lets go of them once the tensors
    are written: the read-back checks the files by the write's record (``Written``), and no
    entry lives while ``safe_open`` parses the header (150k tensors: 36 MiB, issue 33). A
    name that is not ASCII is checked as written."""
    import gc

    from ckpt_migrate.hf import directories

    arrays = {f"h.{i}.w": np.full((2, 3), i, np.float32) for i in range(19)}
    arrays["h.\u00e9\u4e2d.w"] = np.ones((2, 3), np.float32)
    entries = [st.Entry(n, "float32", a.shape) for n, a in arrays.items()]
    alive = []
    real_verify = st.verify

    def verify(directory, written):
        gc.collect()
        alive.append(sum(isinstance(o, st.Entry) for o in gc.get_objects()))
        return real_verify(directory, written)

    monkeypatch.setattr(st, "verify", verify)
    written = directories.write(
        tmp_path, directories.ONE, {}, entries, iter(arrays.items()), 10**9,
        lambda es: "float32", lambda: None,
    )  # fmt: skip
    assert alive == [0] and entries == []
    assert written.tensors == 20 and written.files == [st.SINGLE, "config.json"]
    with safetensors.safe_open(str(tmp_path / st.SINGLE), framework="numpy") as f:
        assert sorted(f.keys()) == sorted(arrays)


def test_a_name_safetensors_cannot_hold_is_refused_before_writing(tmp_path, monkeypatch):
    """A name with a lone surrogate (a checkpoint key JSON can carry) is refused in one line
    before any byte is written; a header the real library cannot read back, were one written,
    is a verification error naming the file, not the library's own exception."""
    arrays = {"a": np.ones((2, 3), np.float32), "b.\ud800": np.zeros((2, 3), np.float32)}
    entries = [st.Entry(n, "float32", a.shape) for n, a in arrays.items()]
    with pytest.raises(VerificationError, match="not UTF-8 text"):
        st.write_stream(tmp_path, entries, iter(arrays.items()), 10**9)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(st, "_check_names", lambda entries: None)
    written = st.write_stream(tmp_path, entries, iter(arrays.items()), 10**9)
    with pytest.raises(VerificationError, match=r"model\.safetensors.*cannot read it back"):
        st.verify(tmp_path, written)


def test_garbage_is_collected_before_safe_open_parses_the_header(tmp_path, monkeypatch):
    """What the write left in reference cycles (and Python's free lists) is collected before
    ``safe_open`` parses the header: at 150k tensors the read-back then began at 104 MiB, not
    133, and the export's peak fell under 256 MiB (issue 33)."""
    import gc
    import weakref

    class Cycle:
        pass

    _, written, _ = _written(tmp_path)
    garbage = Cycle()
    garbage.me = garbage
    dead = weakref.ref(garbage)
    del garbage
    seen = []
    real_open = safetensors.safe_open

    def safe_open(*args, **kwargs):
        seen.append(dead() is None)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", safe_open)
    was_enabled = gc.isenabled()
    gc.disable()  # (only the read-back may collect it)
    try:
        st.verify(tmp_path, written)
    finally:
        if was_enabled:
            gc.enable()
    assert seen == [True]
