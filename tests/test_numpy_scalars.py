"""numpy scalars as the real library stores them: pickled (all but ``np.float64``, a float).

``fixtures/real-cstorch-2.10/numpy_scalars.mdl`` was written by the real ``cstorch.save`` of
cerebras-pytorch 2.10.0 (numpy 1.25, dill 0.3.8), and its expected digest is what the real
``cstorch.load`` gave back: ``np.float32``, ``np.int64``, ``np.bool_`` ... each as itself.
"""

from __future__ import annotations

import pickle
import struct

import h5py
import numpy as np
import pytest
from conftest import REAL, run_cli
from digest import diff_digests, digest, load_expected

import ckpt_migrate as cm
from ckpt_migrate.errors import UnsupportedContentError
from ckpt_migrate.format.pickled import OpaqueObject, decode

SOURCE = REAL / "numpy_scalars.mdl"


def _state() -> dict:
    """The state the real writer saved into SOURCE."""
    return {
        "f32": np.float32(1.5),
        "f16": np.float16(-0.25),
        "f64": np.float64(2.5),
        "i64": np.int64(-(2**63)),
        "i32": np.int32(2**31 - 1),
        "u8": np.uint8(255),
        "u64": np.uint64(2**64 - 1),
        "b": np.bool_(True),
        "c64": np.complex64(1 - 2j),
        "nan32": np.float32("nan"),
        "s": np.str_("hi"),
        "loss_scale": {"scale": np.float32(32768.0), "growth_tracker": np.int64(3)},
        "in_list": [np.int64(7), np.float32(0.1), 3],
        "arr0d": np.array(3.0, dtype=np.float32),
    }


@pytest.mark.parametrize("mode", ["opaque", "data"])
def test_the_real_writers_numpy_scalars_load_as_themselves(mode):
    """They were ``OpaqueObject``s by default, and ``objects_mode="data"`` refused their two
    globals: a loss scale of ``np.float32(32768.0)`` came back as 112 pickled bytes."""
    expected = load_expected("numpy_scalars")
    got = digest(cm.load(SOURCE, objects_mode=mode))
    assert got == expected, "\n".join(diff_digests(expected, got))


def test_save_pickles_numpy_scalars_byte_for_byte_as_the_real_writer(tmp_path):
    """``save`` stored them as 0-d arrays (read back as arrays, by us and by the real loader),
    and under numpy 2 a pickle would name ``numpy._core``, which the real library's numpy 1.25
    cannot import: the bytes are numpy 1.x's, whatever numpy runs here."""
    out = tmp_path / "ours.mdl"
    cm.save(_state(), out)
    with h5py.File(SOURCE) as real, h5py.File(out) as ours:
        pickled = [k for k in real if real[k].attrs.get("__TYPE__") == "ObjectSerializer"]
        assert len(pickled) == 13, pickled
        for key in pickled:
            assert ours[key].attrs["__BYTES__"].tobytes() == real[key].attrs["__BYTES__"].tobytes()
        assert ours["arr0d"].shape == () and "s" not in ours  # a str: in the metadata
    expected = load_expected("numpy_scalars")
    assert digest(cm.load(out)) == expected


def test_inspect_shows_a_numpy_scalars_value(tmp_path):
    proc = run_cli("inspect", SOURCE, "--all")
    assert proc.returncode == 0, proc.stderr
    assert "'loss_scale'" in proc.stdout
    assert "np.float32(32768.0) (a pickled numpy scalar)" in proc.stdout


def _scalar_pickle(spec: bytes, state: bytes, raw: bytes, module: bytes) -> bytes:
    """A numpy scalar's pickle (protocol 2 opcodes) with each part replaceable."""
    return b"".join(
        (
            b"\x80\x02c" + module + b"\nscalar\ncnumpy\ndtype\n",
            b"X" + struct.pack("<I", len(spec)) + spec + b"\x89\x88\x87R",
            state + b"b",
            b"C" + bytes([len(raw)]) + raw + b"\x86R.",
        )
    )


PLAIN_STATE = b"(K\x03X\x01\x00\x00\x00<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00t"
FIELDS_STATE = (
    b"(K\x03X\x01\x00\x00\x00|N(X\x01\x00\x00\x00at}NJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00t"
)


def test_the_hand_made_pickles_below_are_numpy_scalars():
    payload = _scalar_pickle(b"f4", PLAIN_STATE, b"\x00\x00\xc0?", b"numpy.core.multiarray")
    assert pickle.loads(payload) == np.float32(1.5)
    assert decode(payload, "opaque") == np.float32(1.5)


@pytest.mark.parametrize(
    ("spec", "state", "raw", "module"),
    [
        (b"O8", PLAIN_STATE, b"\x00" * 8, b"numpy.core.multiarray"),  # an object pointer
        (b"V8", FIELDS_STATE, b"\x00" * 8, b"numpy.core.multiarray"),  # fields from the state
        (b"f4", FIELDS_STATE, b"\x00" * 4, b"numpy.core.multiarray"),
        (b"f4", PLAIN_STATE, b"\x00" * 3, b"numpy.core.multiarray"),  # too few bytes
        (b"M8[s]", PLAIN_STATE, b"\x00" * 8, b"numpy.core.multiarray"),
        (b"f4", PLAIN_STATE, b"\x00" * 4, b"os"),  # another module's "scalar"
    ],
    ids=["object", "fields", "fields-state", "short", "datetime", "other-module"],
)
def test_a_pickle_that_is_not_a_plain_numpy_scalar_stays_opaque(spec, state, raw, module):
    """Only a plain number type is built, from exactly its bytes: an object dtype would read
    a pointer out of the file, and a dtype's state can give it fields."""
    payload = _scalar_pickle(spec, state, raw, module)
    for mode in ("opaque", "data"):
        assert decode(payload, mode) == OpaqueObject(payload), mode


def test_a_numpy_dtype_outside_a_scalar_stays_opaque_and_scalars_in_containers_decode():
    """The stand-in for ``numpy.dtype`` is never handed out: a pickled dtype stays opaque."""
    for obj in (np.dtype("f4"), {"a": (np.float32(2), np.dtype("i8"))}):
        payload = pickle.dumps(obj, protocol=4)
        assert decode(payload, "data") == OpaqueObject(payload)
    payload = pickle.dumps([np.float32(1), {"x": np.int8(3)}], protocol=4)
    assert decode(payload, "data") == [np.float32(1), {"x": np.int8(3)}]


@pytest.mark.parametrize("release", ["1.7", "1.9", "2.0", "2.4"])
def test_save_to_a_release_before_2_5_stores_a_numpy_scalar_as_those_writers_did(tmp_path, release):
    """1.7-2.4 stored a numpy scalar as a 0-d array (``NumpyArrayH5Type``, FORMAT.md §3.3), and
    formats 0.1/0.2 hold no pickle at all: pickling it for every release refused 1.7 and 1.8
    ("a pickled object, which format 0.1 cannot hold") and wrote a dill pickle 2.4 never did."""
    out = tmp_path / "old.mdl"
    cm.save({"scale": np.float32(1.5), "steps": [np.int64(3)]}, out, release)
    with h5py.File(out) as f:
        assert f["scale"].shape == () and f["scale"][()] == np.float32(1.5)
        assert f["scale"].dtype == np.float32 and f["steps.0"].dtype == np.int64
    with pytest.raises(
        UnsupportedContentError, match=r"a numpy complex64 scalar, which format 0\.4"
    ):
        cm.save({"z": np.complex64(1j)}, tmp_path / "z.mdl", "2.4")
