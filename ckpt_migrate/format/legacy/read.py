"""Read formats 0.1–0.4 (releases 1.7–2.4) into the neutral tree. FORMAT.md §3 and §5.3.

The structure comes from the hex ``__spec__`` pickle, decoded by ``spec_decode`` on the
restricted unpickler of ``spec_unpickler`` (never by pickle/dill). Each leaf is a root dataset named
``urllib.parse.quote(leaf_name, safe='')``; 0.3/0.4 tag it with ``__H5_TYPE__``, 0.1/0.2 with flags.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ckpt_migrate.errors import CorruptCheckpointError, UnsupportedContentError
from ckpt_migrate.format import dtypes
from ckpt_migrate.format.h5 import attrs as h5attrs
from ckpt_migrate.format.h5 import attrtable
from ckpt_migrate.format.h5.facts import DatasetFacts, Facts, OutlineTooShort
from ckpt_migrate.format.h5.io import (
    H5Handle,
    attr_bool,
    attr_python,
    attr_text,
    open_dataset,
    read_slab,
)
from ckpt_migrate.format.h5.unnamed import datasets_not_in
from ckpt_migrate.format.legacy.early_spec import EarlySpec, only_spec, spec_pickle
from ckpt_migrate.format.legacy.names import stored_name
from ckpt_migrate.format.legacy.spec_decode import decode_spec_info
from ckpt_migrate.format.pickled import scalar_payload
from ckpt_migrate.format.tree import (
    ExternalLeaf,
    FullTensorLeaf,
    H5Data,
    Leaf,
    MissingLeaf,
    Node,
    OpaqueLeaf,
    TensorLeaf,
    ValueLeaf,
    fill_missing,
)

# Tags whose data lives outside this file or needs the Cerebras runtime (FORMAT.md §3.3).
_EXTERNAL_TAGS = {
    "DeferredGraphTensor",
    "DeferredFileTensor",
    "DeferredH5Tensor",
    "ApplianceInfoH5Type",
    "StoredTensorH5Type",
    "StoredApplianceTensorH5Type",
}


def read(
    f: h5py.File,
    handle: H5Handle,
    fmt: float,
    facts: Facts | None = None,
    early: EarlySpec | None = None,
) -> tuple[Node, list[str], list[str], bool]:
    """Return (tree, datasets not named by the spec, warnings, spec had TensorScalarDict).
    ``facts``: what the preflight walk learnt of the datasets (a tensor is then built without
    opening its dataset again); with ``facts.links`` (an outline read: the facts read from the
    datasets' headers, ``h5.headerfacts``) no dataset may be opened, and a leaf its facts do
    not describe is ``OutlineTooShort``. ``early``: the spec, perhaps decoded already."""
    facts = facts or Facts()
    path = handle.path
    if "__spec__" not in f.attrs:
        raise CorruptCheckpointError(
            path,
            "HDF5 file without a __spec__ attribute: not a Cerebras checkpoint",
            "is this a different kind of HDF5 file?",
        )
    info = None if early is None else early.take(f)
    if info is None:
        info = decode_spec_info(_spec_bytes(f, handle), path=path, progress=handle.progress)

    # Every open h5py.Dataset costs memory HDF5 does not give back, so each dataset is opened
    # while its leaf is decoded and closed right after.
    used: set[str] = set()  # (not in a legacy outline: there the facts not taken are the rest)
    missing: list[str] = []  # (the datasets of leaves the file has no data for)
    shared: dict[int, Leaf] = {}  # hard links to one HDF5 object (by address) become one leaf
    aliased = facts.aliased
    alike = facts.alike or (lambda name, leaf: leaf)

    def once(address: int, name: str, make: Callable[[], Leaf]) -> Leaf:
        """The one leaf of the object at ``address``, made at its first place; ``alike`` hears
        of every place, in flatten order, and of the leaf before the places share it."""
        if address in shared:
            alike(name, shared[address])
            return shared[address]
        leaf = shared[address] = alike(name, make())
        return leaf

    def decode(name: str) -> Leaf:
        stored = stored_name(name)
        known = facts.take(stored)
        leaf = None if known is None else _from_facts(known, stored, handle, fmt)
        if leaf is not None:
            assert known is not None
            if not facts.described:
                used.add(stored)
            if aliased is not None and known.address not in aliased:
                return alike(name, leaf)
            return once(known.address, name, lambda: leaf)
        if facts.links is not None:
            if stored not in facts.links:
                missing.append(stored)
                return alike(name, MissingLeaf(name))
            raise OutlineTooShort(f"dataset {stored!r}")
        ds = open_dataset(f, stored)
        if ds is None:
            missing.append(stored)
            return alike(name, MissingLeaf(name))
        used.add(stored)
        ident = h5py.h5o.get_info(ds.id).addr
        return once(ident, name, lambda: _decode_dataset(ds, stored, handle, fmt, name))

    # (each placeholder replaced where it stands: a mapped copy's names, paths and memo of
    # every leaf were the peak of a legacy read-back at 150k leaves, issue 33)
    root = fill_missing(info.root, decode)
    if facts.described:  # (``headerscan`` gave every link's facts; each leaf took its own)
        unreferenced = sorted(facts.datasets)
    elif facts.links is not None:  # (every link is a dataset's: ``headerfacts`` answers no other)
        unreferenced = sorted(name for name in facts.links if name not in used)
    else:
        unreferenced = datasets_not_in(f, used, recursive=False)
    if missing and unreferenced:
        _refuse_renamed(path, missing, unreferenced)
    return root, unreferenced, [], info.had_tensor_scalar_dict


def _refuse_renamed(path: str | Path, missing: list[str], unreferenced: list[str]) -> None:
    """A crashed save leaves leaves with no data (the spec is written first), never datasets
    the spec does not name. A leaf with no data whose name is such a dataset's with a byte or
    two changed is a damaged spec (the spec's hex has no checksum): read as missing, the
    leaves would be dropped (``--allow-missing``) while their data sits in the file."""
    by_length: dict[int, list[str]] = {}
    for name in unreferenced:
        by_length.setdefault(len(name), []).append(name)
    for name in missing[:64]:  # (bounded: a healthy file has no such pair to look for)
        other = next((o for o in by_length.get(len(name), [])[:4096] if _near(name, o)), None)
        if other is not None:
            raise CorruptCheckpointError(
                path,
                f"the spec names {name!r}, which has no data, and the file holds {other!r}, "
                "which no leaf names: the spec is damaged",
                "use another copy",
            )


def _spec_bytes(f: h5py.File, handle: H5Handle) -> bytes:
    """The pickle of the root's hex ``__spec__``, its text let go before the tree is built
    (at 150k tensors a 1.9 spec is 18 MB of hex, held twice by ``strip``). Read from the file
    by ``attrtable`` where it can be: through h5py, HDF5's metadata cache kept the heap
    collection it was read from for the rest of the read, 60 MiB at 150k tensors (issue 33)."""
    table = attrtable.root_texts(f, handle.path, keep=only_spec)
    text = None if table is None else table.get("__spec__")
    if not isinstance(text, str):
        text = attr_text(f.attrs["__spec__"])
    return spec_pickle(text, handle.path)


def _decode_dataset(ds: h5py.Dataset, stored: str, handle: H5Handle, fmt: float, name: str) -> Leaf:
    tag = h5attrs.get_text(ds, "__H5_TYPE__")
    if tag is not None:
        return _decode_tagged(ds, stored, handle, fmt, name, attr_text(tag))
    if fmt >= 0.3 - 1e-9:
        # 0.3 and 0.4 tag every dataset (FORMAT.md §3.3): without it, a tag whose name was
        # damaged in an unchecksummed v1 header would read a scalar as a 0-d tensor
        raise CorruptCheckpointError(
            handle.path,
            f"{name!r} has no __H5_TYPE__, which format {fmt} writes on every dataset: damaged",
        )
    return _decode_flagged(ds, stored, handle, name)


def _from_facts(known: DatasetFacts, stored: str, handle: H5Handle, fmt: float) -> Leaf | None:
    """The leaf ``_decode_tagged`` makes of a tagged tensor, scalar, string, None or pickled
    object dataset, from the walk's facts; None for anything else (the dataset is then opened
    and decoded as ever)."""
    tag = known.attrs.get("__H5_TYPE__")
    if tag == "ScalarH5Type":
        return None if known.value is None else ValueLeaf(known.value[0])  # as _scalar
    if tag == "StringH5Type":
        text = known.attrs.get("string_value")
        return ValueLeaf(text) if isinstance(text, str) else None
    if tag == "NoneH5Type":
        return ValueLeaf(None)
    if tag == "ObjectH5Type":
        text = known.attrs.get("object_value")
        return _object(text) if isinstance(text, str) else None
    if tag == "DeferredFullTensor":
        shape, fill = known.attrs.get("shape"), known.attrs.get("fill_value")
        bf16 = _facts_bf16(known.attrs)
        if not isinstance(shape, list) or type(fill) not in (int, float, bool) or bf16 is None:
            return None
        try:
            return _full_leaf(known.dtype, bf16, shape, fill)
        except (TypeError, ValueError):
            return None  # the reader names it
    if tag not in ("TorchTensorH5Type", "NumpyArrayH5Type") or known.shape is None:
        return None
    bf16 = _facts_bf16(known.attrs)
    if bf16 is None:
        return None
    try:
        dt = dtypes.from_storage(known.dtype, bf16)
    except ValueError:
        return None  # the reader names it
    numpy = tag == "NumpyArrayH5Type" and fmt > 0.3 + 1e-9  # as _decode_tagged
    return TensorLeaf(dt.name, known.shape, H5Data(handle, stored), numpy=numpy)


def _facts_bf16(attrs: dict[str, Any]) -> bool | None:
    """A tensor's ``is_bfloat16`` as the walk read it; None where it is not a bool or its name
    is damaged (the dataset is then decoded through h5py, which names what is wrong)."""
    bf16 = attrs.get("is_bfloat16", False)
    return bf16 if isinstance(bf16, bool) and _bf16_damaged(attrs) is None else None


def _tensor(ds: h5py.Dataset, stored: str, handle: H5Handle, name: str, numpy: bool) -> TensorLeaf:
    if ds.shape is None:
        raise CorruptCheckpointError(handle.path, f"tensor {name!r} has no data (empty dataset)")
    _refuse_bf16_damaged(ds.attrs, handle, name)
    bf16 = attr_bool(h5attrs.get_value(ds, "is_bfloat16", False))
    try:
        dt = dtypes.from_storage(ds.dtype, bf16)
    except ValueError as exc:
        raise UnsupportedContentError(handle.path, f"tensor {name!r}: {exc}") from None
    return TensorLeaf(dt.name, tuple(ds.shape), H5Data(handle, stored), numpy=numpy)


def _scalar(ds: h5py.Dataset, handle: H5Handle, name: str) -> ValueLeaf:
    value = np.asarray(read_slab(ds, ()))
    if value.size != 1:
        raise CorruptCheckpointError(handle.path, f"scalar {name!r} holds {value.size} values")
    item = value.reshape(()).item()
    if isinstance(item, bytes):
        item = item.decode("utf-8")
    return ValueLeaf(item)


def _decode_tagged(
    ds: h5py.Dataset, stored: str, handle: H5Handle, fmt: float, name: str, tag: str
) -> Leaf:
    attrs = ds.attrs
    if tag == "TorchTensorH5Type" or (tag == "NumpyArrayH5Type" and fmt <= 0.3 + 1e-9):
        # 0.3 tagged torch tensors as numpy arrays; the 2.10 reader takes them as tensors (§1.4).
        return _tensor(ds, stored, handle, name, numpy=False)
    if tag == "NumpyArrayH5Type":
        return _tensor(ds, stored, handle, name, numpy=True)
    if tag == "ScalarH5Type":
        return _scalar(ds, handle, name)
    if tag == "StringH5Type":
        return ValueLeaf(attr_text(attrs["string_value"]))
    if tag == "NoneH5Type":
        return ValueLeaf(None)
    if tag == "ObjectH5Type":
        leaf = _object(attr_text(attrs["object_value"])) if "object_value" in attrs else None
        if leaf is None:
            raise CorruptCheckpointError(handle.path, f"object {name!r} has no hex payload")
        return leaf
    if tag in ("DeferredFullTensor", "FullTensorH5Type"):
        return _full(ds, handle, name)
    if tag == "DeferredH5Tensor" and attr_bool(attrs.get("link_to_self", False)):
        target = attr_text(attrs["key"])
        f = ds.file
        if target not in f or not isinstance(f[target], h5py.Dataset):
            raise CorruptCheckpointError(
                handle.path, f"{name!r} links to missing dataset {target!r}"
            )
        return _tensor(f[target], target, handle, name, numpy=False)
    if tag in _EXTERNAL_TAGS:
        return ExternalLeaf(tag, {k: attr_python(v) for k, v in attrs.items()})
    raise UnsupportedContentError(
        handle.path,
        f"dataset {stored!r} has unknown type tag {tag!r}",
        "is it from a newer release?",
    )


def _object(text: str) -> ValueLeaf | OpaqueLeaf | None:
    """A pickled object's leaf from its hex text: a plain scalar decoded, anything else kept
    as opaque bytes (never unpickled); None for text that is not hex."""
    try:
        payload = bytes.fromhex(text)
    except ValueError:
        return None
    is_scalar, value = scalar_payload(payload)
    return ValueLeaf(value) if is_scalar else OpaqueLeaf(payload, "dill")


def _full(ds: h5py.Dataset, handle: H5Handle, name: str) -> FullTensorLeaf:
    attrs = ds.attrs
    _refuse_bf16_damaged(attrs, handle, name)
    try:
        shape, fill = attrs["shape"], attrs["fill_value"]
    except KeyError:
        raise CorruptCheckpointError(
            handle.path, f"full tensor {name!r} lacks shape/fill_value"
        ) from None
    return _full_leaf(ds.dtype, attrs.get("is_bfloat16", False), shape, fill)


def _full_leaf(stored: np.dtype, bf16: Any, shape: Any, fill: Any) -> FullTensorLeaf:
    """A full tensor of ``shape`` (any array of its sizes) filled with ``fill``, stored as
    ``stored`` (bf16: int16 with ``is_bfloat16``)."""
    dims = tuple(int(d) for d in np.asarray(shape).reshape(-1))
    fill = np.asarray(fill).reshape(()).item()
    dt = dtypes.from_storage(stored, attr_bool(bf16))
    if dt.name == "bool":
        fill = bool(fill)
    elif dt.name.startswith(("int", "uint")):
        fill = int(fill)
    return FullTensorLeaf(dt.name, dims, fill)


# The flags the 0.1/0.2 writers set on an untagged dataset, and the other attributes they give
# it (FORMAT.md §3.4). Their v1 object headers carry no checksum: a damaged byte in a flag's
# name (``is_scnlar``, ``Us_scalar``) would silently turn a scalar into a 0-d tensor, so any
# other ``is_…`` attribute, and any name of 7 or more bytes one or two bytes from one of these,
# is damage. At every format, ``is_bfloat16`` damaged would read a bfloat16 tensor as int16.
FLAGS = ("is_constructible", "is_none", "is_string", "is_scalar", "is_bfloat16")
NAMES = (*FLAGS, "string_val", "filepath", "shape", "fill_value", "dtype")


_NEAR = 7  # names this long or longer: a short one has too many legitimate neighbours


def _near(attr: str, known: str) -> bool:
    """``attr`` is ``known`` with one or two of its bytes changed."""
    return (
        len(attr) == len(known) >= _NEAR
        and attr != known
        and sum(a != b for a, b in zip(attr, known)) <= 2
    )


def _damaged_name(attr: str) -> bool:
    """Whether ``attr`` is damage: not one of ``NAMES``, and an ``is_…`` flag or one of them
    with one or two bytes changed."""
    return attr not in NAMES and (
        attr.startswith("is_") or any(_near(attr, known) for known in NAMES)
    )


def _refuse_bf16_damaged(attrs: Collection[str], handle: H5Handle, name: str) -> None:
    damaged = _bf16_damaged(attrs)
    if damaged is not None:
        raise CorruptCheckpointError(
            handle.path, f"{name!r} carries an attribute no release writes ({damaged!r}): damaged"
        )


def _bf16_damaged(attrs: Collection[str]) -> str | None:
    """An attribute of a tensor that is ``is_bfloat16`` damaged (a bfloat16 tensor would read
    as the int16 it is stored as); the names are listed only where the flag is absent."""
    if "is_bfloat16" in attrs:
        return None
    return next((a for a in attrs if _near(a, "is_bfloat16")), None)


def _decode_flagged(ds: h5py.Dataset, stored: str, handle: H5Handle, name: str) -> Leaf:
    """Untagged 0.1/0.2 datasets, in the order ``_load_tensor_from_checkpoint`` checks (§3.4)."""
    attrs = ds.attrs
    strange = [k for k in attrs if _damaged_name(k)]
    if strange:
        raise CorruptCheckpointError(
            handle.path,
            f"{name!r} carries an attribute no release writes ({strange[0]!r}): damaged",
        )
    if "filepath" in attrs:
        return ExternalLeaf("DeferredFileTensor", {k: attr_python(v) for k, v in attrs.items()})
    if attr_bool(attrs.get("is_constructible", False)):
        return _full(ds, handle, name)
    if attr_bool(attrs.get("is_none", False)):
        return ValueLeaf(None)
    if attr_bool(attrs.get("is_string", False)):
        return ValueLeaf(attr_text(attrs["string_val"]))
    if attr_bool(attrs.get("is_scalar", False)):
        return _scalar(ds, handle, name)
    return _tensor(ds, stored, handle, name, numpy=False)
