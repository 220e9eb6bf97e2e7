"""Write format 0.5 as ``cstorch.save`` of releases 2.5–2.10 does. FORMAT.md §4 and §4.9.

Order (§4.7): root ``__spec__``/``__version__``/``__cstorch_version__`` first, then one dataset per
stored value, then every ``<leaf>.__metadata__`` attribute and ``__SUCCESS__`` last.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

import h5py
import numpy as np

from ckpt_migrate.format import dtypes
from ckpt_migrate.format.h5 import attrs as h5attrs
from ckpt_migrate.format.h5.tensor import PlaceTensor, place_tensor
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
    tied_positions,
)
from ckpt_migrate.format.v05 import treespec as treespec_json

FORMAT_VERSION = 0.5


def _per_leaf_spec(name: str) -> list[Any]:
    return [{name: "*"}, treespec_json.single_leaf_spec(name)]


def _leaf_json_slow(name: str, md: dict[str, Any]) -> str:
    doc = {"__spec__": _per_leaf_spec(name), "__objects__": [name], f"{name}.__metadata__": md}
    return json.dumps(doc, indent=4)


# A name json writes as it is at every depth: printable ASCII but `"` and `\`.
_PLAIN_NAME = re.compile(r"[ !#-\[\]-~]*\Z")
_PLACEHOLDER = "ckptmigrate0leaf0name"
_VALUE = "ckptmigrate0leaf0value"
# (a lone number or string is written by json as by its indenting encoder)
_VALUE_FIELDS = ("scalar_value", "string_value")
_TEMPLATES: dict[str, str] = {}  # json.dumps(md) -> the document with _PLACEHOLDER as name


def _leaf_json(name: str, md: dict[str, Any], key: str | None = None) -> str:
    """The ``<name>.__metadata__`` document, as ``json.dumps(doc, indent=4)`` writes it.

    With ``indent`` json runs in pure Python (100 µs a leaf, a quarter of an upgrade's
    attribute writing); the documents of a checkpoint differ in the name and in few metadata
    dicts, so each dict's document is made once with a placeholder name (and a value leaf's
    with a placeholder value: step counts and learning rates differ). ``key``:
    ``json.dumps(md)``, if the caller has it."""
    if not _PLAIN_NAME.match(name) or _VALUE in name:
        return _leaf_json_slow(name, md)
    for field in _VALUE_FIELDS:  # a value leaf: one template per kind, the value put in
        if type(md.get(field)) in (int, float, bool, str) and md[field] != _VALUE:
            text = _leaf_json(name, {**md, field: _VALUE})
            return text.replace(f'"{_VALUE}"', json.dumps(md[field]), 1)
    key = key or json.dumps(md)
    if _PLACEHOLDER in key:
        return _leaf_json_slow(name, md)
    template = _TEMPLATES.get(key)
    if template is None:
        template = _leaf_json_slow(_PLACEHOLDER, md)
        if len(_TEMPLATES) < 4096:
            _TEMPLATES[key] = template
    return template.replace(_PLACEHOLDER, name)


def tensor_metadata(leaf: TensorLeaf) -> dict[str, Any]:
    dt = dtypes.by_name(leaf.dtype)
    if leaf.numpy:
        return {
            "is_bfloat16": leaf.dtype == "bfloat16",
            "__TYPE__": "NumpyArraySerializer",
            "__NUMPY__": True,
            "compressed": False,
        }
    md: dict[str, Any] = {
        "__TORCH__": True,
        "shapes": [list(leaf.shape)],
        "dtypes": [f"torch.{dt.name}"],
    }
    if dt.rtfx is not None:  # int8 has no RtFx code; the reader takes the dtype from "dtypes"
        md["rtfx_dtypes"] = [dt.rtfx]
    md.update({"__TYPE__": "TorchTensorSerializer", "__NUMPY__": True, "compressed": False})
    return md


# A kind of tensor's metadata dict, its JSON, and the attributes of its datasets, prepared
TensorKind = tuple[dict[str, Any], str, tuple[h5attrs.Prepared, ...]]


@functools.lru_cache(maxsize=4096)
def _tensor_kind(dtype: str, shape: tuple[int, ...], numpy: bool) -> TensorKind:
    """Once per kind of tensor (a checkpoint has few: one per shape and dtype):
    ``tensor_metadata`` (shared: read only), its JSON, and the dataset attributes cstorch
    copies from it (§4.9), prepared to be created on every dataset of that kind."""
    md = tensor_metadata(TensorLeaf(dtype, shape, None, numpy=numpy))  # type: ignore[arg-type]
    prepared = tuple(h5attrs.prepare(k, _attr_value(k, v)) for k, v in md.items())
    return md, json.dumps(md), prepared


def _attr_value(key: str, value: Any) -> Any:
    if key == "shapes":
        shape = value[0]
        return np.array([shape], dtype=np.int64) if shape else np.empty((1, 0))
    if key == "dtypes":
        return np.array(value, dtype=h5py.string_dtype())
    if key == "rtfx_dtypes":
        return np.array(value, dtype=np.int64)
    if isinstance(value, bool):
        return np.bool_(value)
    return value


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
    """``added(name)``: before each dataset is made (a tensor's, a pickled object's)."""
    h5attrs.create_text(f.id, "__spec__", treespec_json.root_spec_bytes(root))
    f.attrs["__version__"] = np.float64(FORMAT_VERSION)
    f.attrs["__cstorch_version__"] = release.cstorch_version or f"{release.name}.0"

    # Each leaf's metadata dict (a tensor kind's is shared) and its JSON where known, in
    # flatten order: its document is made as its attribute is written, at the end (the
    # documents of 188k leaves held at once were 60 MB of a rewrite's peak; keyed by name and
    # paired, 25 MB more, issue 33).
    metadata: list[dict[str, Any] | TensorKind] = []
    tied = tied_positions(root)
    first_name: dict[int, str] = {}  # (a tied leaf's first place)
    for ref in iter_leaves(root):
        leaf, name = ref.leaf, ref.name
        if id(leaf) in first_name:
            metadata.append(_linked(first_name[id(leaf)]))
            continue
        if id(leaf) in tied:
            first_name[id(leaf)] = name
        if isinstance(leaf, (TensorLeaf, OpaqueLeaf)):
            added(name)
        metadata.append(_write_value(f, name, leaf, place))
        if on_leaf is not None:
            on_leaf(name, leaf)
    del first_name

    group = f.id
    for ref, entry in zip(iter_leaves(root), metadata, strict=True):
        md, key = (entry, None) if isinstance(entry, dict) else entry[:2]
        h5attrs.create(group, f"{ref.name}.__metadata__", _leaf_json(ref.name, md, key))
    for key, text in extra_attrs.items():
        h5attrs.create(group, key, text)
    f.attrs["__SUCCESS__"] = np.bool_(True)


def _linked(first: str) -> dict[str, Any]:
    """The metadata of a later place of a leaf first written at ``first`` (§4.6)."""
    return {"key": first, "__LINKED__": True, "__TYPE__": "LinkedObject", "__NONE__": True}


def metadata_text(name: str, leaf: Leaf, first: str | None) -> str:
    """The ``<name>.__metadata__`` root attribute of a leaf that has no dataset: a later place
    of a tied leaf (``first``: the name of its first place) or a value leaf (a scalar, a
    string, None, a full tensor), as :func:`write` writes it."""
    if first is not None:
        return _leaf_json(name, _linked(first))
    if isinstance(leaf, (TensorLeaf, OpaqueLeaf)):
        raise TypeError(f"{name}: a {type(leaf).__name__} has a dataset")
    return _leaf_json(name, _value_metadata(None, name, leaf))  # type: ignore[arg-type]


def _write_value(
    f: h5py.Group, name: str, leaf: Leaf, place: PlaceTensor
) -> dict[str, Any] | TensorKind:
    """Write ``leaf``'s dataset, if it has one; its metadata dict, or a tensor's kind (its
    dict and that dict's JSON, shared by every tensor of the kind: ``_tensor_kind``)."""
    if isinstance(leaf, TensorLeaf):
        kind = _tensor_kind(leaf.dtype, leaf.shape, leaf.numpy)
        oid = place(f, name, leaf)
        for attr in kind[2]:
            h5attrs.create_prepared(oid, attr)
        return kind
    return _value_metadata(f, name, leaf)


def _value_metadata(f: h5py.Group | None, name: str, leaf: Leaf) -> dict[str, Any]:
    """The metadata dict of a leaf that is no tensor (and its dataset, for a pickled object)."""
    if isinstance(leaf, (ValueLeaf, MissingLeaf)):
        value = None if isinstance(leaf, MissingLeaf) else leaf.value
        if value is None:
            return {"__TYPE__": "NoneSerializer", "__NONE__": True}
        if isinstance(value, str):
            return {"string_value": value, "__TYPE__": "StringSerializer", "__NONE__": True}
        return {"scalar_value": value, "__TYPE__": "ScalarSerializer", "__NONE__": True}
    if isinstance(leaf, OpaqueLeaf):
        assert f is not None
        ds = f.create_dataset(name, data=h5py.Empty("f"), track_order=True)
        ds.attrs["__TYPE__"] = "ObjectSerializer"
        ds.attrs["compressed"] = np.bool_(False)
        ds.attrs["__BYTES__"] = np.frombuffer(leaf.payload, dtype="V1")
        return {"__TYPE__": "ObjectSerializer", "__BYTES__": True, "compressed": False}
    if isinstance(leaf, FullTensorLeaf):
        return {
            "shape": list(leaf.shape),
            "dtype": f"torch.{leaf.dtype}",
            "fill_value": leaf.fill_value,
            "__TYPE__": "DeferredFullTensor",
            "__NONE__": True,
        }
    raise TypeError(f"{name}: {type(leaf).__name__} cannot be written (preflight should refuse it)")
