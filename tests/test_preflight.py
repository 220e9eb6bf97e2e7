"""The preflight walk (``format/h5/preflight.py``): its findings, its two parts, its early start,
and what the readers take from it instead of opening datasets again."""

from __future__ import annotations

import json
import lzma
import marshal
import os
import random
import string
from pathlib import Path
from urllib.parse import quote

import h5py
import numpy as np
import pytest
from conftest import FIXTURES, REAL, sha256_file, walk_corpus
from test_upgrade import fixture

import ckpt_migrate as cm
from ckpt_migrate import cli
from ckpt_migrate.errors import CorruptCheckpointError
from ckpt_migrate.format.compare import signature
from ckpt_migrate.format.h5 import boundary, children, io, preflight, walkreads
from ckpt_migrate.format.h5.facts import ADDRESS, ATTRS, DTYPE, SHAPE, Facts, FromFiles
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import TensorLeaf, iter_leaves
from ckpt_migrate.format.v05.write import _leaf_json, _leaf_json_slow


def _lz4_checkpoint(path: Path, release: str = "2.0") -> Path:
    rng = np.random.default_rng(1)
    weights = {f"w{i}": rng.random((64, 64), dtype=np.float32) for i in range(6)}
    cm.save({"model": weights, "step": 3}, path, release)
    return path


def _stored_by_hdf5(path: Path, *, chunked_as_declared: bool = False) -> int:
    """What HDF5 says the datasets store, each object once; ``chunked_as_declared``: a
    chunked dataset counted by the bytes its shape and type declare."""
    objects: list[h5py.Dataset] = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda _n, o: objects.append(o) if isinstance(o, h5py.Dataset) else None)
        return sum(
            int(np.prod(ds.shape)) * ds.dtype.itemsize
            if chunked_as_declared and ds.chunks is not None
            else ds.id.get_storage_size()
            for ds in objects
        )


@pytest.mark.parametrize("release", ["1.9", "2.0", "2.10"])
def test_findings_give_each_dataset_and_the_bytes_hdf5_says_are_stored(tmp_path, release):
    src = fixture(release, tmp_path)
    found = preflight.preflight(src)
    assert found is not None and found.rest is None
    assert found.stored == _stored_by_hdf5(src)  # each object once: a tie is one dataset
    with h5py.File(src, "r") as f:
        for name in found.datasets:
            ds = f[name]
            facts = Facts(found.datasets).dataset(name)
            if facts is None:  # a dataset of strings or bytes: left to the reader
                assert ds.dtype.kind not in "biuf"
                continue
            assert (facts.dtype, facts.shape) == (ds.dtype, ds.shape)
            assert facts.address == h5py.h5o.get_info(ds.id).addr
            for key, value in facts.attrs.items():
                assert np.asarray(ds.attrs[key]).tolist() == value, (name, key)


def test_a_deferred_walk_returns_before_the_chunk_indexes_and_finishes_with_the_same_total(
    tmp_path,
):
    src = _lz4_checkpoint(tmp_path / "c.mdl")
    whole = preflight.preflight(src)
    first = preflight.preflight(src, defer=True)
    assert whole is not None and first is not None and first.rest is not None
    assert first.datasets == whole.datasets
    # until the chunk indexes are walked, chunked datasets count by their declared bytes
    assert first.stored == _stored_by_hdf5(src, chunked_as_declared=True) != whole.stored
    assert first.rest.finish(src) == whole.stored == _stored_by_hdf5(src)


def _point_a_chunk_past_the_end(src: Path) -> None:
    """Make the last chunk of ``model.w1`` lie past the end of the file (its address in a
    version-1 B-tree node, which has no checksum)."""
    with h5py.File(src) as f:
        chunks: list = []
        f["model.w1"].id.chunk_iter(chunks.append)
    data = bytearray(src.read_bytes())
    at = data.index(chunks[-1].byte_offset.to_bytes(8, "little"))
    data[at : at + 8] = (len(data) + 4096).to_bytes(8, "little")
    src.write_bytes(bytes(data))


def test_data_past_the_end_is_named_when_the_deferred_walk_is_awaited(tmp_path):
    src = _lz4_checkpoint(tmp_path / "c.mdl")
    _point_a_chunk_past_the_end(src)
    with pytest.raises(CorruptCheckpointError, match="lies past the end of the file"):
        read_checkpoint(src)  # the whole walk first: refused at once
    ckpt = read_checkpoint(src, defer_chunks=True)  # the structure is read...
    try:
        assert "model" in dict(ckpt.root.items)
        with pytest.raises(CorruptCheckpointError, match=r"model\.w1.*lies past the end"):
            ckpt.handle.walked()  # ...and the verdict comes before anything is published
        ckpt.handle.walked()  # (given once)
    finally:
        ckpt.close()
    ckpt = read_checkpoint(src, defer_chunks=True)
    leaf = dict(dict(ckpt.root.items)["model"].items)["w0"]
    with pytest.raises(CorruptCheckpointError, match="lies past the end"):
        leaf.data.read()  # a read of data waits for the verdict too
    ckpt.close()


def test_a_deferred_walk_nobody_awaits_is_stopped_with_its_checkpoint(tmp_path):
    src = _lz4_checkpoint(tmp_path / "c.mdl")
    ckpt = read_checkpoint(src, defer_chunks=True)
    rest = ckpt.handle.pending.rest
    pids = list(rest._walk.pids)
    ckpt.close()
    assert rest._walk is None and ckpt.handle.pending is None
    for pid in pids:  # killed and reaped: no zombie left
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, 0)


def test_the_readers_build_tensors_and_numbers_from_the_facts_without_opening_a_dataset(
    tmp_path, monkeypatch
):
    for release in ("1.9", "2.10"):
        src = fixture(release, tmp_path)
        with read_checkpoint(src) as ckpt:
            want = signature(ckpt.root)
        opened: list[str] = []
        real = io.open_dataset

        def counting(group, name, real=real, opened=opened):
            opened.append(name)
            return real(group, name)

        for module in ("ckpt_migrate.format.legacy.read", "ckpt_migrate.format.v05.read"):
            monkeypatch.setattr(f"{module}.open_dataset", counting)
        with read_checkpoint(src) as ckpt:
            assert signature(ckpt.root) == want
            tensors = {r.name for r in iter_leaves(ckpt.root) if isinstance(r.leaf, TensorLeaf)}
        # no tensor whose dataset the walk described is opened, nor a number it read (strings
        # and the second name of a tie are: the walk describes each object once)
        found = preflight.preflight(src)
        assert found is not None
        described = {n for n in found.datasets if Facts(found.datasets).dataset(n)}
        stored = {quote(n, safe="") for n in tensors} | tensors
        assert tensors and not set(opened) & described & stored, (release, opened)
        valued = {n for n in described if Facts(found.datasets).dataset(n).value is not None}
        assert not set(opened) & valued, (release, opened)
        assert ("global_step" in valued) == (release == "1.9")  # (2.10's are attributes)
        # and facts that do not look right are not used: the reader opens the dataset
        monkeypatch.setattr(Facts, "dataset", lambda self, name: None)
        with read_checkpoint(src) as ckpt:
            assert signature(ckpt.root) == want
        monkeypatch.undo()


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "x",
        (1, "<f4", [2], []),  # attrs not a dict
        (1, "|O", [2], {}),  # strings: the reader's to decode
        (1, "no-such-dtype", [2], {}),
        ("one", "<f4", [2], {}),
        (1, "<f4", ["2x"], {}),
        ("<f4", [2], {}),
        (1, "<f4", [2], {}, [3], "more"),
        {"u": 1, "d": "<f4", "s": [2], "a": {}},  # (not a tuple)
    ],
)
def test_facts_that_do_not_look_right_are_not_used(raw):
    assert Facts({"x": raw}).dataset("x") is None


@pytest.mark.parametrize(
    ("dtype", "shape", "v"),
    [
        ("<i8", [], [1.5]),  # not the dataset's kind
        ("<f4", [], [1]),
        ("|b1", [], [1]),
        ("<i8", [], [True]),
        ("<i8", [1], [3]),  # not of shape ()
        ("<i8", [], [3, 4]),
        ("<i8", [], 3),
    ],
)
def test_a_value_that_does_not_look_right_is_not_used(dtype, shape, v):
    known = Facts({"x": (1, dtype, shape, {}, v)}).dataset("x")
    assert known is not None and known.value is None


def test_a_scalar_from_the_facts_equals_what_the_reader_reads(tmp_path):
    values = {"i": np.int64(-(2**62)), "u": np.uint64(2**64 - 1), "b": np.bool_(True)}
    values |= {"f": np.float32(0.1), "h": np.float16(-0.0), "n": np.float64("nan")}
    with h5py.File(tmp_path / "s.h5", "w") as f:
        for name, value in values.items():
            f.create_dataset(name, data=value)
        f.create_dataset("inf", data=np.float64("-inf"))
    found = preflight.preflight(tmp_path / "s.h5")
    assert found is not None
    with h5py.File(tmp_path / "s.h5", "r") as f:
        for name in [*values, "inf"]:
            want = np.asarray(f[name][()]).reshape(()).item()  # as legacy.read._scalar
            got = Facts(found.datasets).dataset(name).value[0]
            assert type(got) is type(want) and repr(got) == repr(want), name


def test_upgrade_begins_the_walk_of_its_one_checkpoint_before_typer_loads(tmp_path):
    src = _lz4_checkpoint(tmp_path / "c.mdl")
    other = _lz4_checkpoint(tmp_path / "d.mdl")
    config = tmp_path / "params.yaml"
    config.write_text("model: {}\n")
    try:
        cli._begin_upgrade_reading(["upgrade", str(src), "--output-dir", str(tmp_path)])
        assert len(preflight._early) == 1
        assert preflight.preflight(src) == preflight.preflight(src)  # collected, then anew
        assert not preflight._early
        for args in (
            ["upgrade", str(src), str(other)],  # several: typer's to sort out
            ["inspect", str(src)],
            ["upgrade", str(config)],  # not HDF5
        ):
            cli._begin_upgrade_reading(args)
            assert not preflight._early, args
        cli._begin_upgrade_reading(["upgrade", str(src)])
        src.write_bytes(src.read_bytes())  # changed since: walked anew, the early walk dropped
        assert preflight.preflight(src) is not None
    finally:
        preflight._cancel_early()


def test_the_leaf_documents_from_templates_are_json_dumps_indent_4():
    rng = random.Random(1)
    alphabet = string.printable + 'é"\\\x01ü→'
    mds = [
        {"__TORCH__": True, "shapes": [[3, 4]], "dtypes": ["torch.float32"], "rtfx_dtypes": [11]},
        {"string_value": 'a"b ckptmigrate0leaf0name', "__TYPE__": "StringSerializer"},
        {"scalar_value": 1.5, "__TYPE__": "ScalarSerializer", "__NONE__": True},
        {"scalar_value": -3, "__TYPE__": "ScalarSerializer", "__NONE__": True},
        {"scalar_value": float("nan"), "__TYPE__": "ScalarSerializer", "__NONE__": True},
        {"scalar_value": 1e-300, "__TYPE__": "ScalarSerializer", "__NONE__": True},
        {"scalar_value": True, "__TYPE__": "ScalarSerializer", "__NONE__": True},
        {"scalar_value": [1, {"a": 2.5}], "__TYPE__": "ScalarSerializer", "__NONE__": True},
        {"string_value": "ckptmigrate0leaf0value", "__TYPE__": "StringSerializer"},
        {"string_value": 'x"\\ü\n→', "__TYPE__": "StringSerializer", "__NONE__": True},
        {"key": "x", "__LINKED__": True, "__TYPE__": "LinkedObject"},
    ]
    for _ in range(3000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        if rng.random() < 0.01:
            name = "ckptmigrate0leaf0value"
        md = rng.choice(mds)
        assert _leaf_json(name, md) == _leaf_json_slow(name, md), (name, md)
        assert json.loads(_leaf_json(name, md))["__objects__"] == [name]


def test_boundary_refuses_data_past_the_end_when_it_walks_the_chunks(tmp_path):
    """The parent's own check names what the children met (``check_self_contained``)."""
    src = _lz4_checkpoint(tmp_path / "c.mdl")
    with h5py.File(src, "r") as f:
        assert boundary.check_self_contained(f, src) == _stored_by_hdf5(src)
    _point_a_chunk_past_the_end(src)
    digest = sha256_file(src)
    with h5py.File(src, "r") as f, pytest.raises(CorruptCheckpointError) as caught:
        boundary.check_self_contained(f, src)
    assert "'/model.w1' has stored data that lies past the end of the file" in str(caught.value)
    assert caught.value.fix == "the file is truncated or damaged"
    assert sha256_file(src) == digest


def test_a_chunk_index_is_measured_in_flat_memory(tmp_path):
    """The walk sums a chunk index as it goes: a file declaring many chunks cannot make it
    hold one Python object per chunk."""
    import tracemalloc

    path = tmp_path / "many.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=np.arange(50_000, dtype=np.int8), chunks=(1,))
    with h5py.File(path, "r") as f:
        ds = f["d"].id
        tracemalloc.start()
        stored, end = boundary.dataset_storage(ds)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert stored == 50_000 and 0 < end <= path.stat().st_size
    assert peak < 1 << 20, peak  # a list of 50,000 chunk records would take several MiB


def _odd_float32() -> h5py.h5t.TypeID:
    """A 4-byte float whose exponent bias is 126: the class and size of the standard float32,
    not its layout (``boundary.type_problem`` refuses it)."""
    tid = h5py.h5t.IEEE_F32LE.copy()
    tid.set_ebias(126)
    return tid


def test_the_facts_of_a_type_are_hdf5s_and_kept_apart_by_its_encoding():
    """``walkreads.type_facts`` remembers a type by its encoding: every answer is what HDF5
    says of the type itself, the first time and after, and a type with the class and size of a
    standard one but another layout is refused even once the standard one is known."""
    from ckpt_migrate.format.h5.walkreads import numpy_type, type_facts

    types = [h5py.h5t.py_create(np.dtype(o + c)) for o in "<>" for c in ("f2", "f4", "i8", "u1")]
    types += [
        h5py.h5t.py_create(np.dtype(bool)),
        h5py.h5t.py_create(h5py.string_dtype()),
        h5py.h5t.py_create(np.dtype("S7")),
        h5py.h5t.py_create(np.dtype("V5")),
        h5py.h5t.py_create(np.dtype([("a", "<f4"), ("b", "<i2")])),
        _odd_float32(),
    ]
    for _ in range(2):  # the first answer, then the remembered one
        for tid in types:
            kind = tid.get_class()
            allowed = kind in boundary.ALLOWED_TYPE_CLASSES
            number = allowed and kind in (h5py.h5t.INTEGER, h5py.h5t.FLOAT, h5py.h5t.ENUM)
            facts = type_facts(tid)
            assert facts.allowed == allowed
            assert facts.vlen_str == (kind == h5py.h5t.STRING and tid.is_variable_str())
            assert facts.number == (numpy_type(tid) if number else None)
            assert facts.size == tid.get_size()
            assert facts.refused == (boundary.type_problem(tid, Path("x"), "") is not None)
    assert type_facts(types[2]).refused is False  # float32, known
    assert type_facts(_odd_float32()).refused is True


def test_the_walk_asks_about_each_type_once(tmp_path, monkeypatch):
    """A checkpoint has a handful of types for thousands of datasets: the walk judges each
    type once (``boundary.type_problem``: ``H5Tequal`` against the standard number types) and
    finds the same facts as before."""
    src = _lz4_checkpoint(tmp_path / "c.mdl", "1.9")
    expected = preflight.preflight(src)
    walkreads._TYPE_FACTS.clear()
    asked: list[int] = []
    judge = walkreads.type_problem
    monkeypatch.setattr(walkreads, "type_problem", lambda *a: asked.append(1) or judge(*a))
    monkeypatch.setattr(preflight, "WORKERS", 1)
    r, w = os.pipe()
    facts, extents, links = (children.anonymous_file() for _ in range(3))
    try:
        preflight._walk(src, w, 0, 1, facts, extents, links)
        os.close(w)
        said = b""
        while chunk := os.read(r, 65536):
            said += chunk
        os.lseek(facts, 0, os.SEEK_SET)
        found = marshal.loads(os.read(facts, 1 << 24))
    finally:
        os.close(r)
        for fd in (facts, extents, links):
            os.close(fd)
    with h5py.File(src, "r") as f:  # the types of every dataset and attribute, the root's too
        objects = [f]
        f.visititems(lambda _n, o: objects.append(o))
        kinds = {o.id.get_type().encode() for o in objects if isinstance(o, h5py.Dataset)}
        kinds.update(o.attrs.get_id(a).get_type().encode() for o in objects for a in o.attrs)
    assert 0 < len(asked) <= len(kinds) < len(found)
    assert expected is not None and found == expected.datasets
    # "N<objects>", "M<stored>,<declared>", "=<rest>", between ticks ("." and "+")
    words = said.replace(b".", b"").replace(b"+", b"").split(b";")
    first, rest = (next(w for w in words if w[:1] == kind) for kind in (b"M", b"="))
    assert int(first[1:].split(b",")[0]) + int(rest[1:]) == expected.stored


def test_the_facts_handed_over_share_what_datasets_share_and_are_read_once(tmp_path, monkeypatch):
    """A checkpoint's thousands of tensors have a few dtypes, shapes and tags: the walk hands
    each over once (``marshal`` keeps an object shared; as JSON, every dataset's own copies
    were 925 bytes a dataset at 188k), and the facts equal the datasets' own. A deferred walk's
    facts are read once, after its first part: finishing the rest does not read them again."""
    src = tmp_path / "many.mdl"
    weights = {f"w{i}": np.full((4, 2), i, np.float32) for i in range(300)}
    cm.save({"model": weights, "step": 3}, src, "2.0")
    found = preflight.preflight(src)
    assert found is not None
    facts = [fact for name, fact in found.datasets.items() if name.startswith("model")]
    assert len(facts) == 300
    assert len({id(fact[ATTRS]) for fact in facts}) <= preflight.WORKERS  # (one per child)
    assert len({id(fact[SHAPE]) for fact in facts}) <= preflight.WORKERS
    with h5py.File(src, "r") as f:
        for name, fact in found.datasets.items():
            ds = f[name]
            assert fact[ADDRESS] == h5py.h5o.get_info(ds.id).addr
            assert (fact[DTYPE], fact[SHAPE]) == (ds.dtype.str, list(ds.shape))
            assert fact[ATTRS] == {
                k: ds.attrs[k].item() if hasattr(ds.attrs[k], "item") else ds.attrs[k]
                for k in ds.attrs
            }
    loads: list[int] = []
    real = preflight._Walk.facts_found
    monkeypatch.setattr(preflight._Walk, "facts_found", lambda w: loads.append(1) or real(w))
    deferred = preflight.preflight(src, defer=True)
    assert deferred is not None and deferred.rest is not None
    assert deferred.rest.finish(src) == found.stored
    assert len(loads) == 1 and deferred.datasets == found.datasets


def _real_files(tmp_path: Path) -> list[Path]:
    """The real 2.10 library's files, the real 2.6 and 2.9 releases' (decompressed), and the
    legacy layouts' fixtures (tagged datasets, whose attributes the facts carry)."""
    found = sorted(REAL.glob("*.mdl")) + [FIXTURES / f"release-{r}.mdl" for r in ("1.9", "2.0")]
    for packed in sorted((FIXTURES / "real-cstorch-2.6-2.9").glob("*.mdl.xz")):
        path = tmp_path / packed.name.removesuffix(".xz")
        path.write_bytes(lzma.decompress(packed.read_bytes()))
        found.append(path)
    return found


def test_the_facts_of_the_real_libraries_files_are_their_datasets_own(tmp_path):
    """On every file the real 2.6, 2.9 and 2.10 libraries wrote, and the legacy layouts: each
    dataset's facts, handed over shared, are its own address, dtype and shape, and each scalar
    attribute the walk keeps is the dataset's own value; equal attribute sets are one object
    within a child."""
    files = _real_files(tmp_path)
    assert len(files) > 10
    kept = 0
    for path in files:
        found = preflight.preflight(path)
        assert found is not None, path
        with h5py.File(path, "r") as f:
            for name, fact in found.datasets.items():
                ds = f[name]
                assert fact[ADDRESS] == h5py.h5o.get_info(ds.id).addr, (path, name)
                shape = None if ds.shape is None else list(ds.shape)  # (an empty dataspace)
                assert (fact[DTYPE], fact[SHAPE]) == (ds.dtype.str, shape), (path, name)
                kept += len(fact[ATTRS])
                for key, value in fact[ATTRS].items():
                    own = ds.attrs[key]
                    assert value == np.asarray(own).tolist(), (path, key)
        kinds = {repr(sorted(fact[ATTRS].items())) for fact in found.datasets.values()}
        objects = {id(fact[ATTRS]) for fact in found.datasets.values()}
        assert len(objects) <= preflight.WORKERS * len(kinds), path
    assert kept > 0  # (the legacy tags among them)


@pytest.mark.parametrize("layout", ["ours", "the 1.9 library's"])
def test_a_legacy_reader_decodes_its_spec_before_it_reads_the_facts(
    layout, tmp_path, monkeypatch, real_layout_19
):
    """The datasets' facts are read from the children's files at the first look-up
    (``facts.Deferred``): a legacy reader decodes its spec first and holds the facts only once
    the pickle's records are let go (both at once were the 1.9 → 2.10 rewrite's peak at 150k
    tensors, issue 33). The files' descriptors are closed once read, or with the findings.
    Our 1.9 fixture, and a file laid out as the 1.9 library wrote it (auto-chunked LZ4, bf16
    stored as int16)."""
    import gc

    from ckpt_migrate.format.legacy import read as legacy_read

    src = fixture("1.9", tmp_path) if layout == "ours" else real_layout_19
    with read_checkpoint(src) as ckpt:
        want = signature(ckpt.root)
    events: list[str] = []
    decode = legacy_read.decode_spec_info
    monkeypatch.setattr(
        legacy_read, "decode_spec_info", lambda *a, **k: events.append("spec") or decode(*a, **k)
    )
    collected = FromFiles.collected
    monkeypatch.setattr(FromFiles, "collected", lambda w: events.append("facts") or collected(w))
    for defer in (False, True):
        events.clear()
        with read_checkpoint(src, defer_chunks=defer) as ckpt:
            assert signature(ckpt.root) == want
        assert events[0] == "spec" and "facts" in events, (defer, events)

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    found = preflight.preflight(src)
    assert found is not None and len(found.datasets) > 10
    assert found.links is not None and len(found.links() or {}) > 10
    assert open_fds() == before
    unread = preflight.preflight(src)
    del unread
    gc.collect()
    assert open_fds() == before


@pytest.mark.parametrize("name", ["real-cstorch-2.10/basic.mdl", "release-1.9.mdl"])
def test_the_child_tries_by_hdf5_only_the_root_texts_the_reader_reads_by_hdf5(name, monkeypatch):
    """The walk's first child reads the root's attributes through HDF5 (where damage can make
    it loop or crash), but not the texts the readers take from ``attrtable`` instead: the
    leaves' ``__metadata__`` and the ``__spec__`` (HDF5's read of a 200k-leaf spec took 220
    MiB, issue 33). A text the table could not read is tried by HDF5, as the reader reads it
    then. Files the real 2.10 library and a 1.9 writer wrote."""
    path = FIXTURES / name
    asked: list[list[bytes] | None] = []
    monkeypatch.setattr(
        walkreads, "read_attributes", lambda obj, tick, names=None: asked.append(names)
    )
    tick = os.open(os.devnull, os.O_WRONLY)
    try:
        with h5py.File(path, "r") as f:
            walkreads.read_root_attributes(f, path, tick)
            assert len(asked) == 1 and asked[0] is not None and b"__spec__" not in asked[0]
            assert b"__version__" in asked[0] or b"__cstorch_version__" in asked[0]
            assert not [n for n in asked[0] if n.endswith(b".__metadata__")]
            real = walkreads.attrtable.root_texts

            def spec_unread(f, path, tick=None, keep=None, progress=None):
                return real(
                    f,
                    path,
                    tick,
                    keep=lambda k, text: keep(k, None if k == "__spec__" else text),
                    progress=progress,
                )

            monkeypatch.setattr(walkreads.attrtable, "root_texts", spec_unread)
            walkreads.read_root_attributes(f, path, tick)
            assert b"__spec__" in asked[1]
    finally:
        os.close(tick)


def test_one_child_walks_as_two_do_in_a_caller_much_larger_than_the_file(
    tmp_path, monkeypatch, real_layout_19
):
    """Each child forked copies the caller's page tables (a read from a process holding GiBs
    of tensors paid for each): from a caller ``ONE_CHILD_RATIO`` times the file's size or
    more, one child walks it, else ``WORKERS``; both walks find the same, on the real 2.10
    and 2.6-2.9 libraries' files, Model Zoo's converter outputs, a 1.9 file laid out as its
    library wrote it, and a file of ours."""
    files = walk_corpus(tmp_path, real_layout_19)
    forked = []
    real_fork = children.fork

    def counted() -> int:
        pid = real_fork()
        if pid:
            forked.append(pid)
        return pid

    monkeypatch.setattr(children, "fork", counted)
    monkeypatch.setattr(preflight, "WORKERS", 2)
    resident = children.resident()
    assert resident > 16 << 20
    for path in files:
        size = path.stat().st_size
        found = {}
        # (ratios at which this caller is twice the file's multiple, and half of it: its
        # memory moves a little as it reads)
        for ratio, expected in ((resident // size // 2, 1), (resident // size * 2, 2)):
            monkeypatch.setattr(preflight, "ONE_CHILD_RATIO", ratio)
            forked.clear()
            walked = preflight.preflight(path)
            assert walked is not None and len(forked) == expected, path
            found[expected] = (walked.stored, dict(walked.datasets))
        assert found[1] == found[2], path
        assert found[1][1], path
