"""Low-level attribute reads and writes give what h5py's AttributeManager gives."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from ckpt_migrate.format.h5 import attrs as h5attrs
from ckpt_migrate.format.h5 import capi

VALUES = {
    "text": "TorchTensorH5Type",
    "unicode": "schrittweite \u00fc \u2192 \U0001f600",
    "empty": "",
    "fixed_bytes": np.bytes_(b"fixed"),
    "flag": np.bool_(True),
    "number": np.float64(0.5),
    "strings": np.array(["torch.float32", "torch.bfloat16"], dtype=h5py.string_dtype()),
    "ints": np.array([[2, 3]], dtype=np.int64),
}


@pytest.fixture
def h5(tmp_path):
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("d", data=np.zeros(3))
        for name, value in VALUES.items():
            f.attrs[name] = value
            h5attrs.create(ds.id, name, value)
    with h5py.File(path, "r") as f:
        yield f


@pytest.mark.parametrize("name", sorted(VALUES))
def test_get_text_reads_what_h5py_reads(h5, name):
    for obj in (h5, h5["d"]):
        got, want = h5attrs.get_text(obj, name), obj.attrs[name]
        assert type(got) is type(want)
        np.testing.assert_array_equal(got, want)


def test_get_text_missing_gives_the_default(h5):
    assert h5attrs.get_text(h5, "absent") is None
    assert h5attrs.get_text(h5["d"], "absent", False) is False


def test_create_types_like_h5py(h5):
    for name in VALUES:
        ours, theirs = h5["d"].attrs.get_id(name), h5.attrs.get_id(name)
        assert ours.get_type() == theirs.get_type(), name
        assert ours.shape == theirs.shape, name


def _write_all(path, values):
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("d", data=np.zeros(3))
        for name, value in values.items():
            if isinstance(value, str):
                h5attrs.create(ds.id, name, value)
                h5attrs.create(f.id, name, value)
            else:
                h5attrs.create_prepared(ds.id, h5attrs.prepare(name, value))
    return path.read_bytes()


OF_05 = {  # the seven attributes of a format 0.5 tensor (v05.write), and a 0-d tensor's shapes
    "__TORCH__": np.bool_(True),
    "shapes": np.array([[2, 3]], dtype=np.int64),
    "dtypes": np.array(["torch.float32"], dtype=h5py.string_dtype()),
    "rtfx_dtypes": np.array([11], dtype=np.int64),
    "__TYPE__": "TorchTensorSerializer",
    "__NUMPY__": np.bool_(True),
    "compressed": np.bool_(False),
    "empty_shape": np.empty((1, 0)),
    "leaf.__metadata__": '{\n    "__spec__": "\u00fc \U0001f600"\n}',
}


def test_hdf5_calls_write_the_bytes_h5py_writes(tmp_path, monkeypatch):
    """The attributes created through HDF5's calls (``capi``) leave the file byte for byte as
    h5py's calls do, and the fast path is taken for every one of them."""
    assert capi.available()
    for name, value in OF_05.items():
        if not isinstance(value, str):
            assert h5attrs.prepare(name, value).direct, name
    direct = _write_all(tmp_path / "direct.h5", OF_05)
    monkeypatch.setattr(capi, "_CALLS", None)
    assert not h5attrs.prepare("shapes", OF_05["shapes"]).direct
    assert _write_all(tmp_path / "h5py.h5", OF_05) == direct


def test_values_hdf5_would_cut_short_go_through_h5py(tmp_path):
    """A NUL (HDF5 would end the string there) or text UTF-8 cannot encode is h5py's to write:
    the same value, or the same error, as before."""
    odd = np.array(["a\0b"], dtype=h5py.string_dtype())
    assert not h5attrs.prepare("nul", odd).direct
    assert capi.text("a\0b", h5attrs.hdf5_type(odd.dtype)) is None
    with h5py.File(tmp_path / "a.h5", "w") as f, pytest.raises(UnicodeEncodeError):
        h5attrs.create(f.id, "bad", "\udcff")


def test_an_attribute_hdf5_refuses_is_named_by_h5py(tmp_path):
    """A call HDF5 refuses (here: the name exists) raises what h5py raises, nothing half made."""
    with h5py.File(tmp_path / "a.h5", "w") as f:
        h5attrs.create(f.id, "x", "one")
        with pytest.raises(OSError, match="already exists"):
            h5attrs.create(f.id, "x", "two")
        p = h5attrs.prepare("y", np.array([1], dtype=np.int64))
        h5attrs.create_prepared(f.id, p)
        with pytest.raises(OSError, match="already exists"):
            h5attrs.create_prepared(f.id, p)
        assert f.attrs["x"] == "one" and list(f.attrs) == ["x", "y"]
