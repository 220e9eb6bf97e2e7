"""Write the legacy formats: 0.4 as releases 2.0–2.4 wrote it, and 0.1–0.3 (1.7–1.9) for fixtures.

FORMAT.md §3. Root attributes ``__spec__`` (hex of a dill-style TreeSpec pickle) and
``__version__`` come first; then one root dataset per leaf, named ``quote(name, safe='')``.
0.3/0.4 tag datasets with ``__H5_TYPE__``; 0.1/0.2 use the flag attributes of §3.4. A tie is a hard
link to the first dataset, as ``fix_checkpoint_spec`` and ``H5Saver.create_links`` made them.
"""

from __future__ import annotations

import binascii
import functools
import pickle
from collections.abc import Callable

import h5py
import numpy as np

from ckpt_migrate.errors import UnsupportedContentError
from ckpt_migrate.format import dtypes
from ckpt_migrate.format.h5 import attrs as h5attrs
from ckpt_migrate.format.h5.tensor import PlaceTensor, place_tensor
from ckpt_migrate.format.legacy.names import stored_name
from ckpt_migrate.format.legacy.spec_encode import encode_spec
from ckpt_migrate.format.releases import Release
from ckpt_migrate.format.tree import (
    FullTensorLeaf,
    Leaf,
    MissingLeaf,
    Node,
    OpaqueLeaf,
    TensorLeaf,
    ValueLeaf,
    iter_leaves,
    plain_dicts,
    tied_positions,
)

_INT64 = (-(2**63), 2**63 - 1)


def write(
    f: h5py.Group,
    root: Node,
    release: Release,
    extra_attrs: dict[str, str],
    on_leaf: Callable[[str, Leaf], None] | None = None,
    place: PlaceTensor = place_tensor,
    *,
    added: Callable[[str], None],
) -> None:
    """``added(name)``: before each link (a dataset, or a tie's second link) is made."""
    fmt = release.format
    # 2.0+ cannot unpickle the 1.x TensorScalarDict class: only 1.7/1.8 files may name it.
    spec = encode_spec(root if fmt < 0.3 else plain_dicts(root), release.spec_torch)
    h5attrs.create_text(f.id, "__spec__", binascii.hexlify(spec))  # (HDF5 is handed the bytes)
    del spec
    if release.name != "1.7":  # 1.7 files may lack __version__; absent means 0.1 (§1.3)
        f.attrs["__version__"] = np.float64(fmt)
    if release.cstorch_version:
        f.attrs["__cstorch_version__"] = release.cstorch_version
    for key, text in extra_attrs.items():
        f.attrs[key] = text

    # The first place of each tied leaf (every leaf's was 20 MB at 150k tensors, issue 33)
    tied = tied_positions(root)
    first: dict[int, str] = {}
    for ref in iter_leaves(root):
        stored = stored_name(ref.name)
        if not isinstance(ref.leaf, MissingLeaf):
            added(stored)
        if id(ref.leaf) in first:
            f[stored] = f[first[id(ref.leaf)]]  # hard link: no data copied
            continue
        if _write_leaf(f, stored, ref.name, ref.leaf, fmt, place) and id(ref.leaf) in tied:
            first[id(ref.leaf)] = stored
        if on_leaf is not None:
            on_leaf(ref.name, ref.leaf)


def _tag(ds: h5py.Dataset, tag: str, fmt: float) -> None:
    if fmt >= 0.3:
        h5attrs.create(ds.id, "__H5_TYPE__", tag)


@functools.cache
def _tensor_attrs(tag: str | None, bf16: bool) -> tuple[h5attrs.Prepared, ...]:
    """A tensor dataset's attributes (its tag, from format 0.3, and ``is_bfloat16``), prepared
    once for every dataset: through ``h5py.AttributeManager`` the two cost about 0.2 ms a
    tensor, as much as placing its data (issue 33); the file is the same."""
    tagged = () if tag is None else (h5attrs.prepare("__H5_TYPE__", tag),)
    return (*tagged, h5attrs.prepare("is_bfloat16", np.bool_(bf16)))


def _empty(f: h5py.Group, stored: str) -> h5py.Dataset:
    return f.create_dataset(stored, data=h5py.Empty("f"))


def _write_leaf(
    f: h5py.Group, stored: str, name: str, leaf: Leaf, fmt: float, place: PlaceTensor
) -> bool:
    """Write one leaf; False for a missing leaf (the spec names it, the file has no data)."""
    if isinstance(leaf, TensorLeaf):
        oid = place(f, stored, leaf)
        if fmt < 0.3:
            tag = None
        elif leaf.numpy:
            tag = "NumpyArrayH5Type"
        else:
            tag = "TorchTensorH5Type" if fmt >= 0.4 else "NumpyArrayH5Type"
        for attr in _tensor_attrs(tag, leaf.dtype == "bfloat16"):
            h5attrs.create_prepared(oid, attr)
        return True
    if isinstance(leaf, ValueLeaf):
        value = leaf.value
        if value is None:
            ds = _empty(f, stored)
            _tag(ds, "NoneH5Type", fmt)
            if fmt < 0.3:
                ds.attrs["is_none"] = np.bool_(True)
        elif isinstance(value, str):
            ds = _empty(f, stored)
            _tag(ds, "StringH5Type", fmt)
            ds.attrs["string_value" if fmt >= 0.3 else "string_val"] = value
            if fmt < 0.3:
                ds.attrs["is_string"] = np.bool_(True)
        elif (
            isinstance(value, int)
            and not isinstance(value, bool)
            and not (_INT64[0] <= value <= _INT64[1])
        ):
            if fmt < 0.3:
                raise UnsupportedContentError(
                    None, f"{name}: int {value} does not fit int64, which format {fmt} needs"
                )
            ds = _empty(f, stored)
            _tag(ds, "ObjectH5Type", fmt)
            ds.attrs["object_value"] = pickle.dumps(value, protocol=4).hex()
        else:
            ds = f.create_dataset(stored, data=np.array(value))
            _tag(ds, "ScalarH5Type", fmt)
            if fmt < 0.3:
                ds.attrs["is_scalar"] = np.bool_(True)
        return True
    if isinstance(leaf, OpaqueLeaf):
        ds = _empty(f, stored)
        _tag(ds, "ObjectH5Type", fmt)
        ds.attrs["object_value"] = leaf.payload.hex()
        return True
    if isinstance(leaf, FullTensorLeaf):
        storage = dtypes.by_name(leaf.dtype).storage
        ds = f.create_dataset(stored, data=h5py.Empty(storage))
        _tag(ds, "DeferredFullTensor", fmt)
        if fmt < 0.3:
            ds.attrs["is_constructible"] = np.bool_(True)
        ds.attrs["shape"] = np.array(leaf.shape, dtype=np.int64)
        # None means "uninitialised": any value is valid, and legacy files need a number.
        ds.attrs["fill_value"] = 0 if leaf.fill_value is None else leaf.fill_value
        ds.attrs["is_bfloat16"] = np.bool_(leaf.dtype == "bfloat16")
        return True
    return False  # MissingLeaf: preflight allowed it; legacy files simply lack the dataset
