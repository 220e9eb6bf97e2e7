"""Cerebras H5 checkpoint → TensorFlow saver checkpoint(s) (``h5-to-tensorflow``); see ``tf.saver``.

Every leaf becomes a variable named by its leaf name. Variables are written with ``SaveV2`` in
shards of at most ``max_shard_bytes`` (a larger variable is split along its first axis into
slices, which TF readers reassemble), then merged by ``MergeV2Checkpoints`` into one checkpoint
with several ``.data-*`` files. Everything is written in a temporary directory beside the target,
verified, and moved into place data files first, ``.index`` last.
"""

from __future__ import annotations

import pickle
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_migrate.atomic import check_parent
from ckpt_migrate.errors import (
    CorruptCheckpointError,
    KeyCollisionError,
    UnsupportedContentError,
    UsageError,
)
from ckpt_migrate.format import dtypes
from ckpt_migrate.format.h5.identity import watch
from ckpt_migrate.format.h5.io import read_slab
from ckpt_migrate.format.pickled import decode_data_pickle
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import (
    ExternalLeaf,
    FullTensorLeaf,
    H5Data,
    Leaf,
    MissingLeaf,
    OpaqueLeaf,
    TensorLeaf,
    ValueLeaf,
    iter_leaves,
)
from ckpt_migrate.tf.saver import (
    DEFAULT_MAX_SHARD_BYTES,
    STEP_VARIABLES,
    compile_patterns,
    import_tensorflow,
    parse_size,
    require_tensorflow,
)
from ckpt_migrate.tf.stage import (
    SaverOutput,
    Staged,
    Variable,
    publish_all,
    refuse_existing,
    stage,
    write_state_file,
)


@dataclass
class H5ToTfReport:
    source: Path
    outputs: list[SaverOutput]
    excluded: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    global_step: int | None = None
    state_file: str | None = None  # the 'checkpoint' file written beside a single output
    verified: str = "structure"


def h5_to_tf(
    h5_path: str | Path,
    saver_path: str | Path,
    *,
    shard_by: Sequence[str] = (),
    max_shard_bytes: int | str = DEFAULT_MAX_SHARD_BYTES,
    exclude: Sequence[str] = (),
    verify: str = "structure",
    progress: Progress | None = None,
) -> H5ToTfReport:
    """Write the H5 checkpoint ``h5_path`` as TF saver checkpoint(s) at prefix ``saver_path``.

    Each leaf becomes a variable named by its leaf name. ``shard_by``: name prefixes, or one
    ``re:REGEX`` (variables grouped by the match, or its first group), each group written as its
    own checkpoint ``<saver_path>-<label>`` (unmatched ones in ``<saver_path>-rest``).
    ``max_shard_bytes`` bounds each ``SaveV2`` call, so peak memory stays about that size.
    ``saver_path`` may be an existing directory: the prefix is then ``<dir>/<h5 file stem>``.
    """
    if verify not in ("structure", "full"):
        raise UsageError(None, f"--verify must be structure or full, not {verify!r}")
    limit = parse_size(max_shard_bytes)
    excludes = compile_patterns(exclude, "--exclude")
    require_tensorflow()
    src = Path(h5_path)
    with read_checkpoint(src, progress=progress) as ckpt:
        if progress is not None:
            ckpt.ready_to_read()
        unchanged = watch(src)  # (called before publishing: the tensors are read as staged)
        report = H5ToTfReport(src, [])
        variables = _h5_variables(ckpt, excludes, report)
        if not variables:
            raise UsageError(src, "no variables to write (all excluded?)")
        groups = _group(variables, shard_by)
        base = Path(saver_path)
        if base.is_dir():
            base = base / src.stem
        check_parent(base)
        targets = [
            (str(base) if label is None else f"{base}-{label}", sel, vs)
            for label, sel, vs in groups
        ]
        for prefix, _, _ in targets:
            refuse_existing(prefix)
        tf = import_tensorflow()
        staged: list[Staged] = []
        try:
            for prefix, sel, vs in targets:
                staged.append(stage(tf, prefix, sel, vs, limit, verify, progress))
            unchanged()
            publish_all(staged)
        finally:
            for s in staged:
                shutil.rmtree(s.tmpdir, ignore_errors=True)
        report.outputs = [s.output for s in staged]
        report.verified = verify
        step = _provenance_step(ckpt)
        if step is None:
            step = _h5_step(variables)
        report.global_step = step
    if len(staged) == 1:
        prefix = Path(staged[0].output.prefix)
        report.state_file = write_state_file(prefix)
        if report.state_file is None:
            report.notes.append(
                f"{prefix.parent / 'checkpoint'} exists and was left unchanged: "
                f"tf.train.latest_checkpoint may name another checkpoint than {prefix.name}"
            )
    return report


def _h5_variables(ckpt: Any, excludes: list[re.Pattern[str]], report: H5ToTfReport) -> list:
    seen: dict[int, str] = {}
    out: list[Variable] = []
    problems: list[str] = []
    for ref in iter_leaves(ckpt.root):
        name, leaf = ref.name, ref.leaf
        if any(rx.search(name) for rx in excludes):
            report.excluded.append(name)
            continue
        if id(leaf) in seen:
            report.notes.append(f"{name} is tied to {seen[id(leaf)]}: written as a copy")
        else:
            seen[id(leaf)] = name
        if not name:
            problems.append("<root> (a TF variable needs a name)")
            continue
        var = _variable(name, leaf, problems)
        if var is not None:
            out.append(var)
    if problems:
        raise UnsupportedContentError(
            ckpt.path,
            f"{len(problems)} leaf/leaves cannot be TensorFlow variables: "
            + ", ".join(problems[:5])
            + (" ..." if len(problems) > 5 else ""),
            "leave them out with --exclude REGEX",
        )
    names = [v.name for v in out]
    if len(set(names)) != len(names):  # leaf names are unique in a readable checkpoint
        raise KeyCollisionError(ckpt.path, "two leaves have the same name")
    return out


def _variable(name: str, leaf: Leaf, problems: list[str]) -> Variable | None:
    if isinstance(leaf, TensorLeaf):
        size = int(np.prod(leaf.shape, dtype=np.int64))
        storage = dtypes.by_name(leaf.dtype).storage
        return Variable(
            name, leaf.dtype, leaf.shape, size * storage.itemsize, _leaf_fetch(leaf, storage)
        )
    if isinstance(leaf, FullTensorLeaf):
        fill = 0 if leaf.fill_value is None else leaf.fill_value
        storage = dtypes.by_name(leaf.dtype).storage
        size = int(np.prod(leaf.shape, dtype=np.int64))

        def full(rows: slice | None, leaf: FullTensorLeaf = leaf) -> np.ndarray:
            shape = leaf.shape if rows is None else (rows.stop - rows.start, *leaf.shape[1:])
            if leaf.dtype == "bfloat16":
                import ml_dtypes  # installed with TensorFlow

                return np.full(shape, fill, dtype=ml_dtypes.bfloat16).view(np.int16)
            return np.full(shape, fill, dtype=storage)

        return Variable(name, leaf.dtype, leaf.shape, size * storage.itemsize, full)
    if isinstance(leaf, OpaqueLeaf):
        try:
            value = decode_data_pickle(leaf.payload)
        except pickle.UnpicklingError:
            value = None
        if isinstance(value, (bytes, str)):
            data = value.encode("utf-8") if isinstance(value, str) else value
            return Variable(name, "string", (), len(data), lambda rows, d=data: d)
        problems.append(f"{name} (a pickled object)")
        return None
    if isinstance(leaf, ValueLeaf):
        v = leaf.value
        if isinstance(v, bool):
            array = np.array(v, dtype=np.bool_)
        elif isinstance(v, int) and -(2**63) <= v < 2**63:
            array = np.array(v, dtype=np.int64)
        elif isinstance(v, float):
            array = np.array(v, dtype=np.float64)
        elif isinstance(v, str):
            data = v.encode("utf-8")
            return Variable(name, "string", (), len(data), lambda rows, d=data: d)
        else:
            what = "None" if v is None else f"int {v} beyond 64 bits"
            problems.append(f"{name} ({what})")
            return None
        dtype = "bool" if array.dtype == np.bool_ else array.dtype.name
        return Variable(name, dtype, (), array.nbytes, lambda rows, a=array: a)
    if isinstance(leaf, MissingLeaf):
        problems.append(f"{name} (no data in the file)")
    elif isinstance(leaf, ExternalLeaf):
        problems.append(f"{name} (a {leaf.kind} referring to data outside the file)")
    else:
        problems.append(f"{name} ({type(leaf).__name__})")
    return None


def _leaf_fetch(leaf: TensorLeaf, storage: np.dtype) -> Callable[[slice | None], np.ndarray]:
    def fetch(rows: slice | None) -> np.ndarray:
        src = leaf.data
        if isinstance(src, H5Data):
            ds = src.handle.dataset(src.name)
            try:
                block = read_slab(ds, () if rows is None else (rows,))
            except OSError as exc:
                raise CorruptCheckpointError(
                    src.handle.path, f"cannot read dataset {src.name!r} ({exc})"
                ) from None
        else:
            block = src.read() if rows is None else src.read()[rows]
        block = np.asarray(block)
        if block.dtype.byteorder == ">":
            block = block.astype(block.dtype.newbyteorder("<"))
        if block.dtype != storage and not (storage.kind == "b" and block.dtype.kind == "b"):
            if block.dtype.itemsize == storage.itemsize and block.dtype.kind in "iu":
                block = block.view(storage)
            else:
                block = block.astype(storage)
        return block

    return fetch


def _group(variables: list[Variable], shard_by: Sequence[str]) -> list:
    """[(label or None, selector, variables)]: one group unless ``shard_by`` is given."""
    if not shard_by:
        return [(None, "", variables)]
    regexes = [s for s in shard_by if s.startswith("re:")]
    if regexes and len(shard_by) > 1:
        raise UsageError(None, "--shard-by takes name prefixes, or one re:REGEX, not both")
    groups: dict[str, list[Variable]] = {}
    rest: list[Variable] = []
    if regexes:
        (rx,) = compile_patterns([regexes[0][3:]], "--shard-by")
        for v in variables:
            m = rx.search(v.name)
            if m is None:
                rest.append(v)
            else:
                key = next((g for g in m.groups() if g is not None), None) or m.group(0)
                groups.setdefault(key, []).append(v)
        if not groups:
            raise UsageError(None, f"--shard-by {regexes[0]!r} matches no variable")
    else:
        prefixes = list(dict.fromkeys(shard_by))
        for p in prefixes:
            if not p:
                raise UsageError(None, "--shard-by needs a non-empty name prefix")
            groups[p] = []
        for v in variables:
            best = max((p for p in prefixes if v.name.startswith(p)), key=len, default=None)
            (rest if best is None else groups[best]).append(v)
        empty = [p for p, vs in groups.items() if not vs]
        if empty:
            raise UsageError(
                None,
                f"--shard-by {empty[0]!r} matches no variable",
                "check the prefix (names are matched from their start, case-sensitively)",
            )
    out: list[tuple[str | None, str, list[Variable]]] = []
    used = {"rest"}
    for key, vs in groups.items():
        label = re.sub(r"[^A-Za-z0-9_.]+", "_", key).strip("_.") or "group"
        unique, n = label, 2
        while unique in used:
            unique, n = f"{label}-{n}", n + 1
        used.add(unique)
        out.append((unique, key, vs))
    if rest:
        out.append(("rest", "", rest))
    return out


def _provenance_step(ckpt: Any) -> int | None:
    for record in reversed(ckpt.provenance):
        if isinstance(record, dict) and isinstance(record.get("global_step"), int):
            return record["global_step"]
    return None


def _h5_step(variables: list[Variable]) -> int | None:
    by_name = {v.name: v for v in variables}
    for name in STEP_VARIABLES:
        v = by_name.get(name)
        if v is not None and v.shape == () and v.dtype.startswith(("int", "u")):
            return int(np.asarray(v.fetch(None)))
    return None
