"""Low-level attribute reads and writes give what h5py's AttributeManager gives."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from ckpt_migrate.format.h5 import attrs as h5attrs

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
