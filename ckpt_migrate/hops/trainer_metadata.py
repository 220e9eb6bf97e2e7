"""The checkpoint's own ``__metadata__`` list: stamp the release an upgrade reaches.

Model Zoo Trainer checkpoints (2.1+) hold a top-level ``__metadata__`` list of
``{version, model_name, params}`` dicts (``callbacks/metadata.py`` ``ModelZooParamsMetadata``
writes ``version = cstorch.__version__``). Two readers use only its last entry: ``cs-auto``
takes the source format from ``__metadata__[-1]["version"]``, and the 2.3+ Trainer's
``Checkpoint.check_compatibility`` (``strict_version``, default true) rejects a checkpoint whose
last entry's major.minor differs from the installed ``cerebras.pytorch``. Model Zoo's CS→CS
converters therefore append ``{version: "<X.Y>.0", model_name: "", params: <converted config>}``
(``update_ckpt_metadata`` in ``BaseCheckpointConverter_CS_CS.pre_checkpoint_convert``).
Source: MODELZOO_HISTORY.md §3.2 (``cs-auto``), §3.8, §3.9 row 2, §4.1 (``strict_version``),
§4.3 (``__metadata__`` row); FORMAT.md §2 (the key, not the 0.5 ``<leaf>.__metadata__``).

One entry per upgrade, not one per hop. A Model Zoo converter run appends one entry, for that
run's target, even when one converter class spans several releases (``cs-2.2`` →
``cs-2.3`` … ``cs-2.9``, MODELZOO_HISTORY.md §3.4); the intermediate releases of a multi-hop
upgrade never exist as files, and both readers look only at ``[-1]``. So the first hop of an
upgrade appends the entry and every later hop re-stamps that same entry with its own target:
a 2.3 → 2.10 upgrade adds exactly one entry, ``"2.10.0"``, whichever hops it crossed. The string
is what the converters write, ``"<X.Y>.0"`` (two-digit minors kept: ``"2.10.0"``); it has no
local segment, so ``strict_version`` does check it.

``params`` are the previous entry's, copied (new nodes and a new leaf at every position: the
copy ties to nothing, not even within itself) but not converted: nothing here upgrades the
config stored in the checkpoint, and the report says so. ``upgrade --config`` upgrades a
``params.yaml`` file after the checkpoint, from the release the checkpoint turned out to be,
so its result is not available to the hops. The Trainer keeps the list as
``trainer.metadata`` and checks only ``version`` (§4.3). ``model_name`` is kept (the Trainer's
name; Model Zoo's converters write ``""``).

Files without ``__metadata__`` (everything before 2.1, files not written by the Trainer) are
left alone, silently: nothing checks their version. ``scripts/convert_checkpoint.py`` does what
Model Zoo's converter does instead (``converter_entry``): its entry holds the converted config,
in a list it starts where there is none.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckpt_migrate.format.trainer_release import KEY
from ckpt_migrate.format.tree import (
    DictNode,
    Leaf,
    MemoryData,
    NamedTupleNode,
    Node,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
    is_leaf,
)
from ckpt_migrate.hops.hop import StepContext, root_level

_STATE = "_ckpt_metadata"  # ctx.inputs key: what this upgrade already did to the list
# ctx.inputs key, set by ``scripts/convert_checkpoint.py`` alone: the converted config (plain
# YAML data), for the entry Model Zoo's converter appends (``converter_entry``)
CONVERTED_CONFIG = "converted_config"


@dataclass
class _Recorded:
    """The entry this upgrade appended, and where its report line is."""

    entry: DictNode | None
    change: int  # index into ctx.changes (-1: nothing reported)
    first_source: str
    previous: int  # position of the entry the params came from


def metadata_version(release: str) -> str:
    """The ``version`` string Model Zoo's converters write for a release: ``"2.10"`` →
    ``"2.10.0"``."""
    return f"{release}.0"


@root_level
def record_release_in_metadata(ctx: StepContext) -> None:
    """Stamp the target release into ``__metadata__`` (files without one are left alone).

    2.1+ Trainer checkpoints keep a ``__metadata__`` list whose last entry's ``version`` the
    2.3+ Trainer checks against the installed release (``strict_version``, on by default) and
    ``cs-auto`` reads; Model Zoo's CS→CS converters append ``{version: "<X.Y>.0", model_name,
    params}`` (``update_ckpt_metadata``). Here the first hop appends one entry copied from the
    last one and later hops re-stamp it, so an upgrade adds exactly one entry, for its final
    release. ``params`` are carried over unconverted (reported). Source: MODELZOO_HISTORY.md
    §3.8, §3.9 row 2, §4.1, §4.3; ``ckpt_migrate/ckpt_metadata.py`` explains the choice.
    """
    root = ctx.root
    hop = ctx.hop
    converted = ctx.inputs.get(CONVERTED_CONFIG)
    if converted is not None and hop is not None and isinstance(root, DictNode):
        converter_entry(ctx, root, converted)
        return
    meta = root.get(KEY) if isinstance(root, DictNode) else None
    if hop is None or meta is None:
        return
    version = metadata_version(hop.target)
    state = ctx.inputs.get(_STATE)
    if isinstance(state, _Recorded):
        if state.entry is None:
            return  # already warned about this list
        if isinstance(meta, SeqNode) and meta.items and meta.items[-1] is state.entry:
            state.entry.set("version", ValueLeaf(version))
            ctx.changes[state.change] = _report(state, hop.target, version)
            return
    entries = meta.items if isinstance(meta, SeqNode) and meta.kind == "list" else None
    if not entries or not all(isinstance(e, DictNode) for e in entries):
        why = "is empty" if entries == [] else "is not a list of dicts"
        ctx.warn(
            f"{KEY} {why}: left as it is; a Trainer with strict_version may reject this "
            "checkpoint (set strict_version: false for it)"
        )
        ctx.inputs[_STATE] = _Recorded(None, -1, hop.source, -1)
        return
    previous = entries[-1]
    assert isinstance(previous, DictNode)
    entry = _new_entry(previous, version)
    entries.append(entry)
    state = _Recorded(entry, len(ctx.changes), hop.source, len(entries) - 2)
    ctx.changes.append(_report(state, hop.target, version))
    ctx.inputs[_STATE] = state


def converter_entry(ctx: StepContext, root: DictNode, config: Any) -> None:
    """What Model Zoo's CS → CS converter writes (``scripts/convert_checkpoint.py``): one entry
    ``{version: "<X.Y>.0", model_name: "", params: <the converted config>}`` appended for the
    target, to a ``__metadata__`` list it starts where the file has none.

    ``update_ckpt_metadata`` (tag Release_2.10.0, ``tools/checkpoint_converters/
    base_converter.py`` lines 2502-2518, called for every CS → CS conversion, either way, at
    line 748) appends that entry to ``input_checkpoint.get("__metadata__", [])``, so a 2.0
    file converted to cs-2.1 leaves with a list, and Model Zoo's ``cs-auto`` (which requires
    one, ``tools/convert_checkpoint.py`` lines 286-301) takes the next conversion from it. The
    upgrade verbs keep their own rule (``record_release_in_metadata``). One entry a run:
    later hops re-stamp it.
    """
    assert ctx.hop is not None
    version = ValueLeaf(metadata_version(ctx.hop.target))
    state = ctx.inputs.get(_STATE)
    meta = root.get(KEY)
    if isinstance(state, _Recorded) and state.entry is not None:
        state.entry.set("version", version)
        ctx.changes[state.change] = _converter_report(state, ctx.hop.target)
        return
    if not (isinstance(meta, SeqNode) and meta.kind == "list"):
        if meta is not None:
            ctx.warn(f"{KEY} is not a list: replaced by one, as Model Zoo's converter fails on it")
        meta = SeqNode("list", [])
        root.set(KEY, meta)
    entry = DictNode(
        [("version", version), ("model_name", ValueLeaf("")), ("params", _tree(config))]
    )
    meta.items.append(entry)
    state = _Recorded(entry, len(ctx.changes), ctx.hop.source, len(meta.items) - 2)
    ctx.changes.append(_converter_report(state, ctx.hop.target))
    ctx.inputs[_STATE] = state


def _converter_report(state: _Recorded, target: str) -> str:
    assert state.entry is not None
    version = state.entry.get("version")
    assert isinstance(version, ValueLeaf)
    return (
        f"[{state.first_source}→{target}] {KEY}.{state.previous + 1}: added "
        f"{{version: {version.value!r}, model_name: ''}} with the converted config as params, "
        "as Model Zoo's converter does (its cs-auto reads it)"
    )


def _tree(data: Any) -> Node:
    """Plain YAML data (dicts with str or int keys, lists, scalars) as a tree."""
    if isinstance(data, dict):
        return DictNode([(k if type(k) is int else str(k), _tree(v)) for k, v in data.items()])
    if isinstance(data, list):
        return SeqNode("list", [_tree(v) for v in data])
    if data is None or isinstance(data, (bool, int, float, str)):
        return ValueLeaf(data)
    return ValueLeaf(str(data))  # (a date or timestamp YAML typed)


def _report(state: _Recorded, target: str, version: str) -> str:
    assert state.entry is not None
    name = state.entry.get("model_name")
    shown = repr(name.value) if isinstance(name, ValueLeaf) else "(not a string)"
    params = (
        f"params copied unconverted from {KEY}.{state.previous} (a record of the run's config; "
        "the version check reads only version)"
        if state.entry.get("params") is not None
        else f"no params in {KEY}.{state.previous} to carry over"
    )
    return (
        f"[{state.first_source}→{target}] {KEY}.{state.previous + 1}: added "
        f"{{version: {version!r}, model_name: {shown}}} for the {target} Trainer's "
        f"strict_version check; {params}"
    )


def _new_entry(previous: DictNode, version: str) -> DictNode:
    """``previous`` copied (new nodes and leaves) with ``version`` set; ``model_name`` kept,
    ``""`` (what Model Zoo writes) when the previous entry has none."""
    stamp = ValueLeaf(version)
    items = [(k, stamp if k == "version" else _copy(v)) for k, v in previous.items]
    entry = DictNode(items, previous.ordered, previous.origin)
    if previous.get("version") is None:
        entry.items.insert(0, ("version", stamp))
    if previous.get("model_name") is None:
        at = next(i for i, (k, _) in enumerate(entry.items) if k == "version")
        entry.items.insert(at + 1, ("model_name", ValueLeaf("")))
    return entry


def _copy(node: Node) -> Node:
    """A deep copy with a new leaf object at every position, so it creates no tie.

    A tie inside a config is an accident of Python sharing equal strings and small ints (one
    object under two names), not a shared tensor; the copy does not repeat it.
    """
    if isinstance(node, DictNode):
        return DictNode([(k, _copy(v)) for k, v in node.items], node.ordered, node.origin)
    if isinstance(node, SeqNode):
        return SeqNode(node.kind, [_copy(v) for v in node.items])
    if isinstance(node, NamedTupleNode):
        return NamedTupleNode(node.name, node.fields, [_copy(v) for v in node.items])
    assert is_leaf(node)
    return _copy_leaf(node)  # type: ignore[arg-type]


def _copy_leaf(leaf: Leaf) -> Leaf:
    if isinstance(leaf, TensorLeaf):
        # A config holds no tensors in practice; a stray one is small and copied by value, so
        # the writer never sees two leaves naming one stored dataset.
        array = np.array(leaf.data.read(), copy=True)
        return TensorLeaf(leaf.dtype, leaf.shape, MemoryData(array), leaf.numpy)
    return dataclasses.replace(leaf)
