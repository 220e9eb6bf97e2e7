"""Independent implementation of the "cstorch-digest-v1" canonical state-dict digest.

The spec lives in ``fixtures/real-cstorch-2.10/README.md``. Every node is a JSON object:

- tensor: ``{"kind": "tensor", "dtype": "float32", "shape": [4, 4], "sha256": HEX}``, the hash
  over the raw little-endian row-major bytes (bf16 as its 16-bit pattern, bool one byte per
  element, empty tensor as no bytes). A tensor that is the same object (``is``) as one met
  earlier in depth-first order also carries ``"tied_to": "<dotted path of the first>"``.
- numpy array: the same with ``"kind": "ndarray"`` (never tied).
- dict: ``{"kind": "dict", "type": "dict" | "OrderedDict", "items": [[KEY_TYPE, KEY, NODE]...]}``
  in insertion order, KEY_TYPE ``"str"`` or ``"int"`` (any other key type raises ``TypeError``).
- list / tuple: ``{"kind": "list" | "tuple", "items": [NODE, ...]}``;
  set: ``{"kind": "set", "type": "set" | "frozenset", "items": [...]}`` sorted by canonical JSON.
- scalar leaves: ``{"kind": "leaf", "type": "int" | "bool" | "str" | "NoneType", "value": V}``;
  float: ``"value": repr(x)``; bytes: ``"value": x.hex()``.
- numpy scalar: ``{"kind": "leaf", "type": "numpy.float32", "hex": x.tobytes().hex()}`` (its
  dtype's name and little-endian bytes: numpy 2 renamed ``bool_`` and changed every repr).
- anything else: ``{"kind": "leaf", "type": "module.qualname", "repr": repr(x)}``.

Dotted paths (for ``tied_to``) join the keys from the root with ``"."``: dict keys as
``str(key)``, list/tuple/set members as their position, e.g. ``"model.embed.weight"`` or
``"copies.0"``.

This module depends only on the standard library, numpy and (lazily) torch, so it can be
imported by path from any interpreter that has those, including the real-cstorch venv.
Torch is never imported here unless torch is already loaded (an object can only be a
``torch.Tensor`` if torch has been imported), so numpy-only state dicts work without torch.
"""

from __future__ import annotations

import collections
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

FORMAT = "cstorch-digest-v1"

FIXTURES_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "real-cstorch-2.10"

# Exact-type scalar leaves that carry their value as-is.
_PLAIN_LEAVES = (type(None), bool, int, str)


def _is_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    if torch is None:  # no torch loaded -> nothing can be a torch.Tensor
        return False
    return isinstance(obj, torch.Tensor)


def _is_ndarray(obj: Any) -> bool:
    np = sys.modules.get("numpy")
    if np is None:  # no numpy loaded -> nothing can be an ndarray
        return False
    return isinstance(obj, np.ndarray)


def _is_numpy_scalar(obj: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.generic)


def _ndarray_le_bytes(arr: Any) -> bytes:
    """Raw little-endian row-major bytes of a numpy array."""
    import numpy as np

    if arr.dtype.hasobject:
        raise TypeError(f"cannot digest a numpy array of dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and sys.byteorder == "big"):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr.tobytes(order="C")


def _tensor_bytes(t: Any) -> bytes:
    """Raw little-endian row-major bytes of a torch tensor (bf16 as bits, bool 1 byte/elt)."""
    import torch

    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return b""
    # Reinterpret as a signed integer type of the same width: covers bf16 (16-bit pattern),
    # bool (one byte per element), fp8 and the unsigned dtypes older numpy bridges lack.
    same_width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    target = same_width.get(t.element_size())
    if target is not None and not t.is_complex() and t.dtype != target:
        t = t.view(target)
    return _ndarray_le_bytes(t.numpy())


def _tensor_dtype_name(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


class _Digester:
    def __init__(self) -> None:
        # id(tensor) -> (tensor, first dotted path, node); the tensor is kept alive so that
        # its id cannot be reused by another object during the walk.
        self._seen: dict[int, tuple[Any, str, dict]] = {}

    def node(self, obj: Any, path: tuple[str, ...]) -> dict:
        if _is_tensor(obj):
            return self._tensor(obj, path)
        if _is_ndarray(obj):
            return {
                "kind": "ndarray",
                "dtype": obj.dtype.name,
                "shape": list(obj.shape),
                "sha256": hashlib.sha256(_ndarray_le_bytes(obj)).hexdigest(),
            }
        if isinstance(obj, dict):
            items = []
            for key, value in obj.items():
                if type(key) is str:
                    key_type = "str"
                elif type(key) is int:
                    key_type = "int"
                else:
                    raise TypeError(
                        f"unsupported dict key type {type(key).__name__} for key {key!r} "
                        f"at {'.'.join(path) or '<root>'!r}"
                    )
                items.append([key_type, key, self.node(value, (*path, str(key)))])
            dict_type = "OrderedDict" if isinstance(obj, collections.OrderedDict) else "dict"
            return {"kind": "dict", "type": dict_type, "items": items}
        if isinstance(obj, (list, tuple)):
            kind = "tuple" if isinstance(obj, tuple) else "list"
            return {
                "kind": kind,
                "items": [self.node(v, (*path, str(i))) for i, v in enumerate(obj)],
            }
        if isinstance(obj, (set, frozenset)):
            nodes = [self.node(v, (*path, str(i))) for i, v in enumerate(obj)]
            nodes.sort(key=canonical_json)
            set_type = "frozenset" if isinstance(obj, frozenset) else "set"
            return {"kind": "set", "type": set_type, "items": nodes}
        if type(obj) in _PLAIN_LEAVES:
            return {"kind": "leaf", "type": type(obj).__name__, "value": obj}
        if type(obj) is float:
            return {"kind": "leaf", "type": "float", "value": repr(obj)}
        if type(obj) is bytes:
            return {"kind": "leaf", "type": "bytes", "value": obj.hex()}
        cls = type(obj)
        if _is_numpy_scalar(obj):
            raw = obj.astype(obj.dtype.newbyteorder("<")).tobytes()
            return {"kind": "leaf", "type": f"numpy.{obj.dtype.name}", "hex": raw.hex()}
        return {"kind": "leaf", "type": f"{cls.__module__}.{cls.__qualname__}", "repr": repr(obj)}

    def _tensor(self, t: Any, path: tuple[str, ...]) -> dict:
        seen = self._seen.get(id(t))
        if seen is not None and seen[0] is t:
            return {**seen[2], "shape": list(seen[2]["shape"]), "tied_to": seen[1]}
        node = {
            "kind": "tensor",
            "dtype": _tensor_dtype_name(t),
            "shape": list(t.shape),
            "sha256": hashlib.sha256(_tensor_bytes(t)).hexdigest(),
        }
        self._seen[id(t)] = (t, ".".join(path), node)
        return node


def canonical_json(node: Any) -> str:
    """The canonical JSON used to order set members."""
    return json.dumps(node, sort_keys=True)


def digest(obj: Any) -> dict:
    """The "cstorch-digest-v1" digest of a (loaded) state dict."""
    return {"format": FORMAT, "root": _Digester().node(obj, ())}


def digest_json(obj: Any) -> str:
    """The digest serialized as the ``*.expected.json`` files are: ``json.dumps(digest,
    indent=1, sort_keys=True)``, with non-ASCII text kept as-is (``ensure_ascii=False``,
    which is how the reference files were actually written). ``digest_json(x) + "\n"`` is
    byte-identical to the reference file."""
    return json.dumps(digest(obj), indent=1, sort_keys=True, ensure_ascii=False)


def load_expected(name: str, fixtures_dir: str | Path | None = None) -> dict:
    """Load ``NAME.expected.json`` (``name`` may also be a path to a .mdl or .json file)."""
    p = Path(name)
    if p.suffix in (".mdl", ".json") or p.parent != Path("."):
        stem = p.name.removesuffix(".mdl").removesuffix(".json").removesuffix(".expected")
        base = p.parent if p.parent != Path(".") else Path(fixtures_dir or FIXTURES_DIR)
    else:
        stem, base = name, Path(fixtures_dir or FIXTURES_DIR)
    with open(base / f"{stem}.expected.json", encoding="utf-8") as f:
        return json.load(f)


def diff_digests(expected: dict, actual: dict, limit: int = 20) -> list[str]:
    """Human-readable differences between two digests (or nodes), at most ``limit``.

    Each entry names the dotted path of a differing node; empty when they are equal.
    """
    out: list[str] = []

    def where(path: tuple[str, ...]) -> str:
        return ".".join(path) or "<root>"

    def walk(a: Any, b: Any, path: tuple[str, ...]) -> None:
        if len(out) >= limit or a == b:
            return
        if not (isinstance(a, dict) and isinstance(b, dict)):
            out.append(f"{where(path)}: {a!r} != {b!r}")
            return
        if "root" in a and "root" in b and not path:
            if a.get("format") != b.get("format"):
                out.append(f"<format>: {a.get('format')!r} != {b.get('format')!r}")
            walk(a["root"], b["root"], ())
            return
        scalar_keys = sorted((set(a) | set(b)) - {"items"})
        diffs = {k: (a.get(k), b.get(k)) for k in scalar_keys if a.get(k) != b.get(k)}
        if diffs:
            shown = ", ".join(f"{k}: {x!r} != {y!r}" for k, (x, y) in diffs.items())
            out.append(f"{where(path)}: {shown}")
            if "kind" in diffs:
                return
        ia, ib = a.get("items"), b.get("items")
        if ia == ib:
            return
        if ia is None or ib is None:
            out.append(f"{where(path)}: items {ia!r} != {ib!r}")
            return
        if a.get("kind") == "dict":
            keys_a = [(t, k) for t, k, _ in ia]
            keys_b = [(t, k) for t, k, _ in ib]
            if keys_a != keys_b:
                out.append(f"{where(path)}: keys {keys_a!r} != {keys_b!r}")
                return
            for (_, k, na), (_, _, nb) in zip(ia, ib, strict=True):
                walk(na, nb, (*path, str(k)))
            return
        if len(ia) != len(ib):
            out.append(f"{where(path)}: {len(ia)} items != {len(ib)} items")
        for i, (na, nb) in enumerate(zip(ia, ib, strict=False)):
            walk(na, nb, (*path, str(i)))

    walk(expected, actual, ())
    return out


def untied(node: Any) -> Any:
    """A digest without its ``tied_to`` marks: the real legacy (0.3/0.4) reader loads the two
    names of a hard-linked tie as separate objects (FORMAT.md §5.5)."""
    if isinstance(node, dict):
        return {k: untied(v) for k, v in node.items() if k != "tied_to"}
    if isinstance(node, list):
        return [untied(v) for v in node]
    return node
