"""Values a weights-only ``torch.load`` of torch 2.4 refuses, though the torch this tool runs
reads them.

Every cerebras-pytorch release from 2.6 to 2.10 pins torch 2.4.0, so that is the torch a
``to-torch`` file is most likely loaded with next to a Cerebras run. Its weights-only unpickler
(``torch/_weights_only_unpickler.py``, ``_get_allowed_globals``) allows no ``builtins.set``,
``frozenset``, ``complex`` or ``bytearray``, no ``_codecs.encode`` (how pickle protocol 2, which
``torch.save`` uses, writes ``bytes``) and no ``torch.uint16``/``uint32``/``uint64``; each was
checked by loading such a file with torch 2.4.0. Newer torch allows them all.
"""

from __future__ import annotations

from typing import Any

_KINDS = {
    set: "a set",
    frozenset: "a frozenset",
    complex: "a complex number",
    bytes: "bytes",
    bytearray: "a bytearray",
}
_DTYPES = ("torch.uint16", "torch.uint32", "torch.uint64")


def refused_by_torch_2_4(tree: Any) -> dict[str, str]:
    """What in ``tree`` (plain containers and tensors) torch 2.4 refuses to load: each kind,
    with the path of the first value of that kind."""
    found: dict[str, str] = {}
    stack: list[tuple[Any, str]] = [(tree, "")]
    while stack:
        obj, where = stack.pop()
        kind = _KINDS.get(type(obj))
        if kind is None and str(getattr(obj, "dtype", "")) in _DTYPES and hasattr(obj, "shape"):
            kind = f"{str(obj.dtype).removeprefix('torch.')} tensors"
        if kind is not None:
            found.setdefault(kind, where or "(the root)")
        if isinstance(obj, dict):
            items = [(v, f"{where}.{k}" if where else str(k)) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            items = [(v, f"{where}.{i}" if where else str(i)) for i, v in enumerate(obj)]
        else:
            continue
        stack.extend(reversed(items))
    return found


def note(found: dict[str, str]) -> str | None:
    """One line on what ``refused_by_torch_2_4`` found, and the way to load it; None if nothing."""
    if not found:
        return None
    kinds = ", ".join(f"{kind} at {where!r}" for kind, where in found.items())
    return (
        f"holds {kinds}, which torch.load(weights_only=True) of torch 2.4 (the torch "
        "cerebras-pytorch 2.6-2.10 pins) refuses: load it with a newer torch, or with "
        "weights_only=False where you trust the file"
    )
