"""``save``/``load``/``to_torch``/``from_torch`` round trips: what goes in comes back, with ties
only where one tensor object was under two names."""

from __future__ import annotations

import io
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from conftest import (
    FIXTURES,
    REAL,
    one_line_error,
    real_2x_files,
    run_capped,
    run_cli,
    written_to_after,
)
from real_cstorch import cstorch_python

import ckpt_migrate
from ckpt_migrate.cli import commands
from ckpt_migrate.errors import UnsupportedContentError
from ckpt_migrate.format.compare import signature
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import FullTensorLeaf, TensorLeaf, ValueLeaf, iter_leaves

EXAMPLE = FIXTURES / "format-test" / "checkpoint_100.mdl"


def tied_names(path: Path) -> set[str]:
    """The names whose leaf is the same stored object as an earlier name's."""
    with read_checkpoint(path) as ckpt:
        return {s[1] for s in _walk(signature(ckpt.root)) if s[0] == "tied"}


def _walk(sig):
    if isinstance(sig, tuple) and sig and sig[0] == "tied":
        yield sig
    elif isinstance(sig, (tuple, list)):
        for item in sig:
            yield from _walk(item)


def test_save_round_trip_of_the_example_has_no_difference(tmp_path):
    """Equal ints (global_step 10 and last_epoch 10; milestone 1 and param index 1) stay
    separate values; the one tie of the example (lm_head ↔ word embeddings) stays a tie, and a
    constant tensor stays a constant."""
    out = tmp_path / "out.mdl"
    ckpt_migrate.save(ckpt_migrate.load(EXAMPLE), out, release="2.0")
    got = commands.verify(EXAMPLE, out)
    assert got["identical"] and got["differences"] == [], got["differences"]
    assert tied_names(out) == tied_names(EXAMPLE)


def test_equal_python_ints_are_never_tied_but_one_tensor_is(tmp_path):
    t = torch.arange(3.0)
    step = 1000  # beyond CPython's small-int cache: still one object under both names
    state = {"a": step, "b": step, "s": "x", "r": "x", "w": t, "tied": t, "n": None, "m": None}
    out = tmp_path / "s.mdl"
    ckpt_migrate.save(state, out)
    with read_checkpoint(out) as ckpt:
        leaves = {r.name: r.leaf for r in iter_leaves(ckpt.root)}
    assert leaves["a"] is not leaves["b"] and leaves["s"] is not leaves["r"]
    assert leaves["w"] is leaves["tied"]
    back = ckpt_migrate.load(out)
    assert back["a"] == back["b"] == 1000 and back["w"] is back["tied"]
    arr = np.ones(2, dtype=np.float32)
    ckpt_migrate.save({"x": arr, "y": arr, "z": np.ones(2, dtype=np.float32)}, tmp_path / "n.mdl")
    with read_checkpoint(tmp_path / "n.mdl") as ckpt:
        leaves = {r.name: r.leaf for r in iter_leaves(ckpt.root)}
    assert leaves["x"] is leaves["y"] and leaves["z"] is not leaves["x"]


def test_a_bytes_leaf_comes_back_as_bytes(tmp_path):
    out = tmp_path / "b.mdl"
    ckpt_migrate.save({"blob": b"\x00\xffraw", "empty": b"", "n": 1}, out)
    back = ckpt_migrate.load(out)
    assert type(back["blob"]) is bytes and back["blob"] == b"\x00\xffraw"
    assert type(back["empty"]) is bytes and back["empty"] == b""
    again = tmp_path / "again.mdl"
    ckpt_migrate.save(back, again)
    assert commands.verify(out, again)["identical"]


def test_a_constant_tensor_changed_in_place_is_saved_with_its_new_values(tmp_path):
    state = ckpt_migrate.load(EXAMPLE)
    zeros = state["misc"]["zeros"]
    zeros.add_(2.5)
    out = tmp_path / "changed.mdl"
    ckpt_migrate.save(state, out, release="2.0")
    with read_checkpoint(out) as ckpt:
        leaf = next(r.leaf for r in iter_leaves(ckpt.root) if r.name == "misc.zeros")
        assert isinstance(leaf, TensorLeaf) and not isinstance(leaf, FullTensorLeaf)
    assert torch.equal(ckpt_migrate.load(out)["misc"]["zeros"], torch.full((2, 3), 2.5))


def _same_values(a, b) -> None:
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same_values(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same_values(x, y)
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        bits = [t.reshape(-1).contiguous().view(torch.uint8) for t in (a, b)]  # NaNs too
        assert torch.equal(*bits)
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert type(a) is type(b) and a == b, (a, b)


def test_to_torch_loads_weights_only_and_round_trips_through_from_torch(tmp_path):
    plain = tmp_path / "plain.pt"
    ckpt_migrate.to_torch(EXAMPLE, plain)
    got = torch.load(plain, weights_only=True)
    array = got["misc"]["array"]  # a numpy array in the checkpoint: a tensor here
    assert isinstance(array, torch.Tensor) and array.dtype == torch.int32
    assert array.tolist() == [[0, 1], [2, 3]]
    assert got["model"]["lm_head.weight"] is got["model"]["embedding_layer.word_embeddings.weight"]
    assert got["global_step"] == 10 and type(got["global_step"]) is int
    back = tmp_path / "back.mdl"
    ckpt_migrate.from_torch(plain, back)
    _same_values(got, ckpt_migrate.load(back))
    with read_checkpoint(back) as ckpt:
        leaves = {r.name: r.leaf for r in iter_leaves(ckpt.root)}
    assert isinstance(leaves["global_step"], ValueLeaf)
    assert leaves["global_step"] is not leaves["lr_scheduler.last_epoch"]


@pytest.mark.parametrize("release", ["1.9", "2.0", "2.10"])
def test_to_torch_of_every_format_loads_weights_only(tmp_path, release):
    plain = tmp_path / "plain.pt"
    ckpt_migrate.to_torch(FIXTURES / f"release-{release}.mdl", plain, allow_missing=True)
    state = torch.load(plain, weights_only=True)
    assert isinstance(state, dict) and state


def test_one_opaque_object_under_two_names_stays_one(tmp_path):
    import pickle

    from ckpt_migrate.format.pickled import OpaqueObject

    obj = OpaqueObject(pickle.dumps({"k": 1}, protocol=4), "pickle")
    first = tmp_path / "o.mdl"
    ckpt_migrate.save({"a": obj, "b": obj, "c": OpaqueObject(obj.payload, "pickle")}, first)
    back = ckpt_migrate.load(first)
    assert back["a"] is back["b"] and back["c"] is not back["a"]
    again = tmp_path / "again.mdl"
    ckpt_migrate.save(back, again)
    assert commands.verify(first, again)["identical"]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "not a torch.save file (the file is empty)"),  # an internal IndexError before
        # "(Unsupported operand 149); only plain tensors, containers and scalars are accepted":
        # a plain list, refused for its pickle's protocol
        (pickle.dumps([1, 2, 3], protocol=4), "FRAME opcode (149)"),
        # "(101)", a KeyError's key
        (b"hello world\n", "(neither torch's zip format nor a pickle of protocol 2 or later)"),
        # "([enforce fail at inline_container.cc:180] )"
        ("zip", "(a zip archive, but not torch's: file in archive is not in a subdirectory: "),
        ("protocol 4", "save it again with torch.save's default pickle_protocol (2)"),
        ("protocol 1", "(neither torch's zip format nor a pickle of protocol 2 or later)"),
    ],
    ids=["empty", "pickle-protocol-4", "text", "zip", "torch-protocol-4", "torch-protocol-1"],
)
def test_from_torch_refuses_in_one_line_without_torchs_advice(tmp_path, data, words):
    """torch's refusal opens with advice to load with ``weights_only=False`` (an option this
    tool never offers), and its protocol warning went to stderr."""
    src = tmp_path / "state.pt"
    if data == "zip":
        with zipfile.ZipFile(src, "w") as z:
            z.writestr("notes.txt", "not torch's")
    elif isinstance(data, str):  # written by torch.save, with the pickle protocol named
        legacy = data == "protocol 1"  # (torch's zip format needs protocol 2 or later)
        protocol = int(data.split()[1])
        torch.save(
            {"w": torch.ones(2)},
            src,
            pickle_protocol=protocol,
            _use_new_zipfile_serialization=not legacy,
        )
    else:
        src.write_bytes(data)
    proc = run_cli("from-torch", src, tmp_path / "out.mdl")
    one_line_error(proc, 2, "state.pt", words)
    assert "weights_only=False" not in proc.stderr and "UserWarning" not in proc.stderr
    assert not (tmp_path / "out.mdl").exists()


@pytest.mark.parametrize("name", ["basic.mdl", "gpt2-2.6.0.mdl", "userblock"])
def test_from_torch_given_an_h5_checkpoint_says_so(tmp_path, name):
    """It said "not loadable with weights_only=True (Unsupported operand 72)", as if the file
    were a torch file holding something unsupported. The real library's files, and one whose
    superblock lies past a 512-byte user block."""
    if name == "userblock":
        src = tmp_path / "ub.mdl"
        with h5py.File(src, "w", userblock_size=512) as f:
            f["w"] = np.arange(3.0)
    else:
        src = next(p for p in [*REAL.glob("*.mdl"), *real_2x_files(tmp_path)] if p.name == name)
    proc = run_cli("from-torch", src, tmp_path / "out.mdl")
    one_line_error(proc, 2, "is an HDF5 file (a Cerebras H5 checkpoint?), not a torch.save file")
    assert not (tmp_path / "out.mdl").exists()


def test_an_output_named_by_a_dangling_link_is_refused_before_any_work(tmp_path):
    """``exists()`` is false for a dangling link: the conversion ran, and publishing failed at
    the end with no fix given."""
    out = tmp_path / "out.pt"
    out.symlink_to(tmp_path / "nowhere")
    proc = run_cli("to-torch", FIXTURES / "release-2.10.mdl", out)
    one_line_error(proc, 2, "already exists; refusing to overwrite it; choose another output")
    assert out.is_symlink() and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize(
    ("tensor", "words"),
    [
        (torch.zeros(2, dtype=torch.complex64), "tensor dtype torch.complex64 cannot be stored"),
        (torch.zeros(2, dtype=torch.float8_e4m3fn), "tensor dtype torch.float8_e4m3fn cannot"),
        (torch.zeros(2, 2).to_sparse(), "tensor layout torch.sparse_coo cannot be stored"),
    ],
    ids=["complex64", "float8", "sparse"],
)
def test_a_tensor_a_checkpoint_cannot_hold_is_named_with_its_file(tmp_path, tensor, words):
    """``from-torch`` of a file torch wrote with a complex, float8 or sparse tensor said
    ``error: tensor dtype torch.complex64 cannot be stored in a checkpoint``: neither the file
    nor the tensor. ``save`` named neither either."""
    src = tmp_path / "state.pt"
    torch.save({"model": {"w": torch.ones(2), "odd": tensor}}, src)
    proc = run_cli("from-torch", src, tmp_path / "out.mdl")
    one_line_error(proc, 2, f"{src}: model.odd: {words}")
    assert not (tmp_path / "out.mdl").exists()
    with pytest.raises(UnsupportedContentError, match=f"^model.odd: {words}"):
        ckpt_migrate.save({"model": {"odd": tensor}}, tmp_path / "saved.mdl")


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_a_nested_tensor_is_refused_in_one_line_without_torchs_warning(tmp_path):
    """A nested tensor (``torch.load(weights_only=True)`` takes one) reports the strided
    layout, so it passed the sparse check and ended in torch's "NestedTensorImpl doesn't
    support sizes" as an "internal error" (exit 1), after torch's prototype warning."""
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    src = tmp_path / "state.pt"
    torch.save({"model": {"w": torch.ones(2), "n": nested}}, src)
    proc = run_cli("from-torch", src, tmp_path / "out.mdl")
    one_line_error(proc, 2, f"{src}: model.n: a nested tensor cannot be stored", "unbind")
    assert "Warning" not in proc.stderr and not (tmp_path / "out.mdl").exists()
    with pytest.raises(UnsupportedContentError, match=r"^model\.n: a nested tensor"):
        ckpt_migrate.save({"model": {"n": nested}}, tmp_path / "saved.mdl")


@pytest.mark.parametrize("value", [torch.Size([2, 3]), torch.float16, torch.device("cpu")], ids=str)
def test_from_torch_names_a_fix_it_has_for_a_torch_object(tmp_path, value):
    """A ``torch.Size``, ``dtype`` or ``device`` (``torch.load(weights_only=True)`` takes
    them) was refused with "pass pickle_objects=True", a keyword of ``save`` that from-torch
    has no option for; the command now names what does the same, ``save`` keeps its own."""
    src = tmp_path / "state.pt"
    torch.save({"w": torch.ones(2), "shape": value}, src)
    proc = run_cli("from-torch", src, tmp_path / "out.mdl")
    kind = f"torch.{type(value).__qualname__}"
    line = one_line_error(proc, 2, f"{src}: shape is a {kind}", "plain data", "ckpt_migrate.save(")
    assert "pass pickle_objects" not in line and not (tmp_path / "out.mdl").exists()
    state = torch.load(src, weights_only=True)
    with pytest.raises(UnsupportedContentError, match="pass pickle_objects=True"):
        ckpt_migrate.save(state, tmp_path / "out.mdl")
    ckpt_migrate.save(state, tmp_path / "out.mdl", pickle_objects=True)
    assert ckpt_migrate.load(tmp_path / "out.mdl", objects_mode="trusted")["shape"] == value


def test_to_torch_writes_a_set_of_tensors_and_names_the_leaf_it_cannot_write(tmp_path):
    """``to-torch`` of a set of tensors (which from-torch had taken) said "a set of tensors has
    no order to write its tensors in; use a list", naming no file and no leaf: the pickler
    meets them in the set's own order, which the writer now follows. A pickled object was
    refused naming neither its leaf nor a fix."""
    ts = [torch.full((i % 3 + 1,), float(i)) for i in range(20)]
    torch.save({"s": set(ts), "l": [ts[0]]}, tmp_path / "set.pt")
    ckpt_migrate.from_torch(tmp_path / "set.pt", tmp_path / "set.mdl")
    proc = run_cli("to-torch", tmp_path / "set.mdl", tmp_path / "back.pt")
    assert proc.returncode == 0, proc.stderr
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert sorted(t.tolist() for t in back["s"]) == sorted(t.tolist() for t in ts)
    assert any(t is back["l"][0] for t in back["s"])  # (the tie kept)

    obj = tmp_path / "obj.mdl"
    state = {"w": torch.ones(1), "model": {"shape": torch.Size([2, 3])}}
    ckpt_migrate.save(state, obj, pickle_objects=True)
    proc = run_cli("to-torch", obj, tmp_path / "obj.pt")
    one_line_error(proc, 2, f"{obj}: model.shape: holds OpaqueObject(", "objects_mode='trusted'")
    assert not (tmp_path / "obj.pt").exists()


def test_from_torch_reads_torchs_format_before_1_6(tmp_path):
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "step": 7}
    torch.save(state, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    proc = run_cli("from-torch", tmp_path / "old.pt", tmp_path / "out.mdl")
    assert proc.returncode == 0, proc.stderr
    back = ckpt_migrate.load(tmp_path / "out.mdl")
    assert torch.equal(back["w"], state["w"]) and back["step"] == 7


def test_a_file_that_cannot_be_torchs_is_refused_before_torch_is_imported(tmp_path):
    """An empty file, a named pipe, an HDF5 checkpoint, a text file: refused by their first
    bytes, each in the words torch's failure gave, without the 2.5 s of importing torch."""
    fifo = tmp_path / "pipe.pt"
    os.mkfifo(fifo)
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "notes.pt").write_text("not a checkpoint\n")
    shutil.copyfile(EXAMPLE, tmp_path / "h5.pt")
    code = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from ckpt_migrate.torch import weights_load
        for name in sys.argv[1:]:
            try:
                weights_load.load(Path(name))
            except weights_load.Unreadable as exc:
                print(Path(name).name, exc, sep=": ")
        print("torch" in sys.modules)
        """
    )
    names = ["pipe.pt", "empty.pt", "notes.pt", "h5.pt"]
    proc = subprocess.run(
        [sys.executable, "-c", code, *(str(tmp_path / n) for n in names)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    neither = "neither torch's zip format nor a pickle of protocol 2 or later"
    assert proc.stdout.splitlines() == [
        "pipe.pt: not a regular file",
        "empty.pt: the file is empty",
        f"notes.pt: {neither}",
        f"h5.pt: {neither}",
        "False",
    ], proc.stderr
    proc, _ = run_capped("from-torch", tmp_path / "h5.pt", tmp_path / "out.mdl", seconds=60)
    one_line_error(proc, 2, "h5.pt", "is an HDF5 file")


def test_from_torch_refuses_a_named_pipe_not_waits_on_it(tmp_path):
    fifo = tmp_path / "state.pt"
    os.mkfifo(fifo)
    proc, _ = run_capped("from-torch", fifo, tmp_path / "out.mdl", seconds=60)
    one_line_error(proc, 2, "state.pt", "not a regular file")


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_lazy_load_reads_the_file_it_opened_once_its_name_is_gone(tmp_path, how):
    """``load`` reads tensors on first use. Their stored bytes were checked through the file's
    name: once a manager pruned the file, a tensor was "cannot read dataset ... (No such file or
    directory); the file may be damaged", and once another file was renamed over it (an upgrade
    in place), its bytes were checked instead of those HDF5 decodes. The real libraries' files,
    each replaced by another of them."""
    from digest import digest

    files = [p for p in sorted(REAL.glob("*.mdl")) if "collision" not in p.name]
    files += real_2x_files(tmp_path)
    for n, real in enumerate(files):
        path = tmp_path / f"checkpoint_{n}.mdl"
        shutil.copyfile(real, path)
        expected = digest(ckpt_migrate.load(path))
        state = ckpt_migrate.load(path)  # (lazy: nothing of the tensors read yet)
        if how == "removed":
            path.unlink()
        else:
            other = tmp_path / "other.mdl"
            shutil.copyfile(files[(n + 1) % len(files)], other)
            os.replace(other, path)
        assert digest(state) == expected, real.name


def test_a_loaded_checkpoint_lets_go_of_its_file_once_dropped(tmp_path):
    """Once the state ``load`` returned is dropped (its tensors read through ops), no file is
    left open, without waiting for the garbage collector: reference cycles kept the tensors,
    and their file, alive (``__torch_dispatch__``'s recursive closures held every tensor an op
    was given; torch's first import held the frames of ``load``, tree and all). h5py with
    HDF5 2.0 refuses to open such a file again with its default locking. In a fresh process
    with the collector off, on the real 2.6-2.10 libraries' files."""
    files = [p for p in sorted(REAL.glob("*.mdl")) if "collision" not in p.name]
    files += real_2x_files(tmp_path)
    script = textwrap.dedent(
        """
        import gc, sys
        gc.disable()
        import h5py, torch
        import ckpt_migrate

        def tensors(obj):
            if isinstance(obj, dict):
                obj = list(obj.values())
            if isinstance(obj, (list, tuple)):
                for v in obj:
                    yield from tensors(v)
            elif isinstance(obj, torch.Tensor):
                yield obj

        for path in sys.argv[1:]:
            state, t = ckpt_migrate.load(path, allow_missing=True), None
            for t in tensors(state):
                (t.float() + 1).sum()
            del state, t
            still = h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE)
            print(path, still)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, files)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert [line.rsplit(" ", 1)[1] for line in proc.stdout.splitlines()] == ["0"] * len(files)


def test_a_source_written_to_while_it_is_converted_publishes_nothing(tmp_path, monkeypatch):
    """``to-torch`` and ``from-torch`` (torch maps its zip format) read the tensors as they
    write them: a job writing over the source meanwhile gave an output of parts of two
    versions. The real 2.10 library's file, and the torch file written from it, each written
    to (its modification time moved) before the output is published."""
    from ckpt_migrate import torch as torch_room
    from ckpt_migrate.errors import VerificationError
    from ckpt_migrate.format import write
    from ckpt_migrate.torch import api

    src, state = tmp_path / "basic.mdl", tmp_path / "state.pt"
    shutil.copyfile(REAL / "basic.mdl", src)
    api.to_torch(src, state)
    for owner, name, source, convert in (
        (torch_room, "save_streaming", src, lambda: api.to_torch(src, tmp_path / "out.pt")),
        (write, "check_written", state, lambda: api.from_torch(state, tmp_path / "out.mdl")),
    ):
        with monkeypatch.context() as patched:
            written_to_after(patched, owner, name, source)
            with pytest.raises(VerificationError, match="was written to while it was read"):
                convert()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["basic.mdl", "state.pt"]


def test_a_file_object_is_refused_in_words(tmp_path):
    """``torch.save`` and ``torch.load`` take a file object; ours read a checkpoint by its name
    (the preflight reads it from other processes) and write beside its name. A file object
    ended in pathlib's "expected str, bytes or os.PathLike object, not BytesIO" from deep
    inside; it is now refused by name, with what to pass. A path given as bytes works."""
    real = REAL / "basic.mdl"  # written by the real cerebras.pytorch 2.10
    with open(real, "rb") as fh, pytest.raises(TypeError, match=r"not a BufferedReader; .*f\.name"):
        ckpt_migrate.load(fh)
    with pytest.raises(TypeError, match=r"ckpt_migrate\.save takes the checkpoint file's path"):
        ckpt_migrate.save({"w": np.ones(3)}, io.BytesIO())
    from digest import digest

    assert digest(ckpt_migrate.load(os.fsencode(real))) == digest(ckpt_migrate.load(real))
    ckpt_migrate.save({"w": np.ones(3)}, os.fsencode(tmp_path / "b.mdl"))
    assert np.array_equal(ckpt_migrate.load(tmp_path / "b.mdl")["w"], np.ones(3))


def test_a_name_longer_than_an_attribute_may_be_is_refused_in_words(tmp_path):
    """Format 0.5 names a root attribute by each leaf; a key past 65,521 bytes (UTF-8) ended
    in h5py's "KeyError: Unable to delete attribute (bad version number for datatype
    message)" from deep inside the writer. It is refused by name and size before writing,
    from ``save`` and from an upgrade of an older file that holds it (release 2.0 writes it)."""

    ckpt_migrate.save({"k" * 65_521: np.ones(2)}, tmp_path / "fits.mdl")  # (the longest)
    for key in ("k" * 65_522, "é" * 32_761):
        with pytest.raises(UnsupportedContentError, match=r"65,521 bytes"):
            ckpt_migrate.save({key: np.ones(2)}, tmp_path / "long.mdl")
        assert not (tmp_path / "long.mdl").exists()
    ckpt_migrate.save({"m": {"k" * 70_000: np.ones(2)}}, tmp_path / "old.mdl", "2.0")
    proc = run_cli("upgrade", tmp_path / "old.mdl", "-o", tmp_path / "out")
    one_line_error(proc, 2, "is 70,002 bytes long", "write release 2.4 or older")


@pytest.mark.parametrize(
    "map_location",
    [
        {"cuda:0": "cpu"},
        {"cpu": "meta"},
        lambda storage, location: storage,
        lambda storage, location: None,
        lambda storage, location: storage.cpu(),
        "meta",
        torch.device("cpu"),
    ],
    ids=["dict-other", "dict-cpu", "function", "function-none", "function-cpu", "str", "dev"],
)
def test_load_takes_map_location_as_torch_load_does(tmp_path, map_location):
    """``map_location`` as a dict or a function (``lambda storage, loc: storage``, a common
    idiom) ended in torch's own four-line ``TypeError`` of ``Tensor.to``. Each form now does
    what ``torch.load`` does with the same file's tensors (all stored on the CPU), and a tie
    stays one tensor."""
    weight = torch.arange(6.0).reshape(2, 3)
    state = {"w": weight, "tied": weight, "b": torch.ones(2, dtype=torch.bfloat16)}
    ours, theirs = tmp_path / "w.mdl", tmp_path / "w.pt"
    ckpt_migrate.save(state, ours)
    torch.save(state, theirs)
    expected = torch.load(theirs, map_location=map_location, weights_only=True)
    got = ckpt_migrate.load(ours, map_location=map_location)
    for name in state:
        assert got[name].device == expected[name].device, name
        assert got[name].dtype == expected[name].dtype and got[name].shape == expected[name].shape
        if expected[name].device.type == "cpu":
            assert torch.equal(got[name], expected[name]), name
    assert got["w"] is got["tied"]


def test_what_save_cannot_write_is_said_of_the_value_not_of_a_key_or_a_temporary(tmp_path):
    """Each was refused in words about something else: a bare tensor ("leaf name '' …; rename
    the key", there being no key; at 2.4 "write release 2.5 or newer", which refused it too,
    and ``from-torch`` named its output, not the file it read), a state nested deeper than
    the readers take ("… deep.mdl.<hex>.tmp: … the file is damaged", a file the save itself
    had just written), a state that holds itself (``RecursionError``), and a string with a NUL
    at 2.4 or older (h5py's bare ``ValueError``, no key named)."""
    from ckpt_migrate.errors import UnsupportedContentError

    out = tmp_path / "x.mdl"
    for release in ("2.10", "2.4"):
        with pytest.raises(UnsupportedContentError, match="one bare value; save a dict"):
            ckpt_migrate.save(torch.arange(3), out, release)
    torch.save(torch.arange(3), tmp_path / "bare.pt")
    proc = run_cli("from-torch", tmp_path / "bare.pt", out)
    one_line_error(proc, 2, "bare.pt: holds one bare Tensor", "save a dict")
    deep: Any = 1
    for _ in range(494):
        deep = [deep]
    with pytest.raises(UnsupportedContentError, match=r"nested more than 494 deep at d\.0\.0"):
        ckpt_migrate.save({"d": deep}, out)
    ckpt_migrate.save({"d": deep[0]}, out)  # (493 lists: what the readers take)
    assert ckpt_migrate.load(out)["d"] == deep[0]
    itself: list = []
    itself.append(itself)
    with pytest.raises(UnsupportedContentError, match="nested more than 494 deep"):
        ckpt_migrate.save({"loop": itself}, tmp_path / "loop.mdl")
    with pytest.raises(UnsupportedContentError, match=r"'run\.note' is a string with a NUL"):
        ckpt_migrate.save({"run": {"note": "a\x00b"}}, tmp_path / "nul.mdl", "2.4")
    ckpt_migrate.save({"run": {"note": "a\x00b"}}, tmp_path / "nul.mdl", "2.5")
    assert ckpt_migrate.load(tmp_path / "nul.mdl")["run"]["note"] == "a\x00b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare.pt", "nul.mdl", "x.mdl"]


@pytest.mark.parametrize(
    ("key", "release", "words"),
    [
        ("\x00", None, "holds a NUL character"),
        ("a\x00b", None, "holds a NUL character"),
        ("\udcff", None, "holds a lone surrogate"),
        ("\udcff", "2.4", "holds a lone surrogate"),
        (".", "2.4", "'.' cannot be a dataset name in format 0.4"),
    ],
    ids=["nul", "inner-nul", "surrogate", "surrogate-2.4", "dot-2.4"],
)
def test_a_key_hdf5_cannot_name_is_refused_in_one_line(tmp_path, key, release, words):
    """Each ended in "internal error" (exit 1): h5py's "name parameter cannot be an empty
    string" for a NUL (one inside a key cut the name short, unsaid), a ``UnicodeEncodeError``
    for a lone surrogate (pickle carries one), "name already exists" for '.' at 2.4, whose
    quoting keeps it. A NUL is held at 2.4, quoted."""
    src = tmp_path / "state.pt"
    torch.save({"w": torch.ones(1), key: torch.ones(1)}, src)
    out = tmp_path / "out.mdl"
    proc = run_cli("from-torch", src, out, *(["--release", release] if release else []))
    one_line_error(proc, 2, "out.mdl: leaf name", words, "rename the key")
    with pytest.raises(UnsupportedContentError, match=words):
        ckpt_migrate.save({key: torch.ones(1)}, out, release)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]
    if "\x00" in key:
        ckpt_migrate.save({key: torch.ones(1)}, out, "2.4")
        assert list(ckpt_migrate.load(out)) == [key]


def test_data_assignment_on_a_loaded_tensor_is_saved_or_refused(tmp_path):
    """``x.data = new`` on a tensor ``load`` returned (of a file the real 2.10 library wrote)
    changed the wrapper's shape but not its data: reads then failed ("the file may have
    changed") and ``save`` wrote the file's old values, without a word."""
    state = ckpt_migrate.load(REAL / "basic.mdl")
    w, b = state["model"]["w"], state["model"]["b"]
    new = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    w.data = new
    assert torch.equal(w, new) and torch.equal(w * 1, new)
    new.add_(1)  # shares its memory, as a plain tensor's .data does
    assert torch.equal(w, torch.arange(1, 17, dtype=torch.float32).reshape(4, 4))
    with pytest.raises(RuntimeError, match="put the new tensor in its place"):
        b.data = torch.zeros(5, dtype=torch.bfloat16)  # (grown: the wrapper would lie)
    with pytest.raises(RuntimeError, match="shape or dtype"):
        b.data = torch.zeros(4)  # float32, not bfloat16
    assert b.shape == (4,) and b.dtype == torch.bfloat16
    out = tmp_path / "out.mdl"
    ckpt_migrate.save(state, out)
    back = ckpt_migrate.load(out)
    assert torch.equal(back["model"]["w"], w)
    assert torch.equal(back["model"]["b"], ckpt_migrate.load(REAL / "basic.mdl")["model"]["b"])


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("scalars_misc", ["bytes at 'bytes'", "a set at 'set'"]),
        ("dtypes", ["uint16 tensors at 'uint16'", "uint64 tensors at 'uint64'"]),
        ("numpy_scalars", ["a complex number at 'c64'"]),
        ("basic", []),
        ("nested", []),
    ],
)
def test_to_torch_says_what_torch_2_4_cannot_load_weights_only(tmp_path, case, said):
    """``to-torch`` promises a file ``torch.load(weights_only=True)`` reads, and checks it with
    the torch it runs; torch 2.4, which every cerebras-pytorch from 2.6 to 2.10 pins, refuses
    the sets, bytes and uint16-64 tensors the real 2.10 writer's files hold, and nothing said
    so. A note now names each kind and where; with ``CKPT_MIGRATE_CSTORCH_PYTHON`` set,
    torch 2.4 itself confirms the note is given exactly when it refuses the file."""
    out = tmp_path / f"{case}.pt"
    proc = run_cli("to-torch", REAL / f"{case}.mdl", out)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note:")]
    assert all(s in notes[0] for s in said) if said else notes == [], notes
    python = cstorch_python()
    if python is None:
        return
    load = f"import torch; torch.load({str(out)!r}, weights_only=True)"
    refused = subprocess.run([python, "-c", load], capture_output=True, text=True).returncode
    assert bool(refused) == bool(said), (case, notes)
