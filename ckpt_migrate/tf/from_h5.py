"""Cerebras H5 checkpoint → TensorFlow saver checkpoint(s) (``h5-to-tensorflow``); see ``tf_saver``.

Every leaf becomes a variable named by its leaf name. Variables are written with ``SaveV2`` in
shards of at most ``max_shard_bytes`` (a larger variable is split along its first axis into
slices, which TF readers reassemble), then merged by ``MergeV2Checkpoints`` into one checkpoint
with several ``.data-*`` files. Everything is written in a temporary directory beside the target,
verified, and moved into place data files first, ``.index`` last.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pickle
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_migrate.atomic import fsync_dir, fsync_path, publish, temp_name
from ckpt_migrate.errors import (
    CkptError,
    CkptIOError,
    CorruptCheckpointError,
    KeyCollisionError,
    UnsupportedContentError,
    UsageError,
    VerificationError,
)
from ckpt_migrate.format import dtypes
from ckpt_migrate.format.pickled import decode_data_pickle
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
    Progress,
    compile_patterns,
    import_tensorflow,
    op_message,
    open_reader,
    parse_size,
    storage_hash,
)


@dataclass(eq=False)
class _Variable:
    """One TF variable to write: where its data comes from and how big it is."""

    name: str
    dtype: str  # our dtype name, or "string"
    shape: tuple[int, ...]
    nbytes: int
    fetch: Callable[[slice | None], Any]  # rows (or everything) as numpy storage / bytes


@dataclass
class SaverOutput:
    prefix: str
    variables: int
    tensor_bytes: int
    data_files: int
    sliced: list[str] = field(default_factory=list)  # variables split over several data files
    notes: list[str] = field(default_factory=list)  # e.g. a variable that exceeds the shard size
    selector: str = ""  # the --shard-by entry that picked its variables ("" for all / the rest)


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
    tf = import_tensorflow()
    src = Path(h5_path)
    with read_checkpoint(src) as ckpt:
        report = H5ToTfReport(src, [])
        variables = _h5_variables(ckpt, excludes, report)
        if not variables:
            raise UsageError(src, "no variables to write (all excluded?)")
        groups = _group(variables, shard_by)
        base = Path(saver_path)
        if base.is_dir():
            base = base / src.stem
        if not base.parent.is_dir():
            raise UsageError(base, "its directory does not exist", "create it first")
        targets = [
            (str(base) if label is None else f"{base}-{label}", sel, vs)
            for label, sel, vs in groups
        ]
        for prefix, _, _ in targets:
            _refuse_existing(prefix)
        staged: list[_Staged] = []
        try:
            for prefix, sel, vs in targets:
                staged.append(_stage(tf, prefix, sel, vs, limit, verify, progress))
            _publish_all(staged)
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
        report.state_file = _write_state_file(prefix)
        if report.state_file is None:
            report.notes.append(
                f"{prefix.parent / 'checkpoint'} exists and was left unchanged: "
                f"tf.train.latest_checkpoint may name another checkpoint than {prefix.name}"
            )
    return report


def _h5_variables(ckpt: Any, excludes: list[re.Pattern[str]], report: H5ToTfReport) -> list:
    seen: dict[int, str] = {}
    out: list[_Variable] = []
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


def _variable(name: str, leaf: Leaf, problems: list[str]) -> _Variable | None:
    if isinstance(leaf, TensorLeaf):
        size = int(np.prod(leaf.shape, dtype=np.int64))
        storage = dtypes.by_name(leaf.dtype).storage
        return _Variable(
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

        return _Variable(name, leaf.dtype, leaf.shape, size * storage.itemsize, full)
    if isinstance(leaf, OpaqueLeaf):
        try:
            value = decode_data_pickle(leaf.payload)
        except pickle.UnpicklingError:
            value = None
        if isinstance(value, (bytes, str)):
            data = value.encode("utf-8") if isinstance(value, str) else value
            return _Variable(name, "string", (), len(data), lambda rows, d=data: d)
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
            return _Variable(name, "string", (), len(data), lambda rows, d=data: d)
        else:
            what = "None" if v is None else f"int {v} beyond 64 bits"
            problems.append(f"{name} ({what})")
            return None
        dtype = "bool" if array.dtype == np.bool_ else array.dtype.name
        return _Variable(name, dtype, (), array.nbytes, lambda rows, a=array: a)
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
                block = ds[()] if rows is None else ds[rows]
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


def _group(variables: list[_Variable], shard_by: Sequence[str]) -> list:
    """[(label or None, selector, variables)]: one group unless ``shard_by`` is given."""
    if not shard_by:
        return [(None, "", variables)]
    regexes = [s for s in shard_by if s.startswith("re:")]
    if regexes and len(shard_by) > 1:
        raise UsageError(None, "--shard-by takes name prefixes, or one re:REGEX, not both")
    groups: dict[str, list[_Variable]] = {}
    rest: list[_Variable] = []
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
    out: list[tuple[str | None, str, list[_Variable]]] = []
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


def _refuse_existing(prefix: str) -> None:
    p = Path(prefix)
    existing = [x for x in (Path(prefix + ".index"),) if x.exists()]
    existing += sorted(p.parent.glob(glob_escape(p.name) + ".data-*-of-*"))
    if existing:
        raise UsageError(
            existing[0], "already exists; refusing to overwrite it", "choose another saver path"
        )


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


@dataclass
class _Staged:
    tmpdir: Path
    tmp_prefix: Path
    output: SaverOutput


# TF reassembles slices only of these dtypes ("Dtype half not supported" for the others, TF 2.21).
_SLICEABLE = {"bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}


def _pieces(v: _Variable, limit: int) -> list[slice | None]:
    """Row ranges of at most ``limit`` bytes (None: the whole variable in one piece)."""
    if v.nbytes <= limit or not v.shape or v.dtype not in _SLICEABLE or v.shape[0] <= 1:
        return [None]
    row = v.nbytes // v.shape[0]
    if row == 0:
        return [None]
    step = max(1, limit // row)
    return [slice(s, min(s + step, v.shape[0])) for s in range(0, v.shape[0], step)]


def _rows_bytes(v: _Variable, rows: slice | None) -> int:
    return v.nbytes if rows is None else (v.nbytes // v.shape[0]) * (rows.stop - rows.start)


def _slice_spec(v: _Variable, rows: slice | None) -> str:
    if rows is None:
        return ""
    dims = " ".join(str(d) for d in v.shape)
    rest = ":-" * (len(v.shape) - 1)
    return f"{dims} {rows.start},{rows.stop - rows.start}{rest}"


def _to_tf(tf: Any, v: _Variable, block: Any) -> Any:
    """A TF tensor of ``block``, sharing its memory (DLPack) rather than copying it."""
    if v.dtype == "string":
        return tf.constant(block, dtype=tf.string)
    t = None
    if block.ndim and block.size and block.flags.c_contiguous and block.flags.writeable:
        with contextlib.suppress(BufferError, TypeError, ValueError):
            t = tf.experimental.dlpack.from_dlpack(block.__dlpack__())
    if t is None:
        t = tf.constant(block)
    if v.dtype == "bfloat16":
        return tf.bitcast(t, tf.bfloat16)  # the int16 bit patterns, unchanged (no copy)
    return t


def _stage(
    tf: Any,
    prefix: str,
    selector: str,
    variables: list[_Variable],
    limit: int,
    verify: str,
    progress: Progress | None,
) -> _Staged:
    """Write one saver checkpoint into a temporary directory beside ``prefix`` and verify it."""
    final = Path(prefix)
    tmpdir = temp_name(final)
    tmpdir.mkdir()
    tmp_prefix = tmpdir / final.name
    out = SaverOutput(prefix, len(variables), 0, 0, selector=selector)
    try:
        hashes: dict[str, Any] = {}
        pieces: dict[str, list[slice | None]] = {}
        batch: list[tuple[_Variable, slice | None]] = []
        batch_bytes = 0
        parts: list[str] = []
        total = sum(v.nbytes for v in variables)
        done = 0

        def flush() -> None:
            nonlocal batch, batch_bytes, done
            part = str(tmpdir / f"part-{len(parts):05d}")
            names, specs, tensors = [], [], []
            for v, rows in batch:
                block = v.fetch(rows)
                if verify == "full":
                    h = hashes.setdefault(v.name, hashlib.sha256())
                    if v.dtype == "string":
                        h.update(block)
                    else:
                        storage_hash(block, h)
                names.append(v.name)
                specs.append(_slice_spec(v, rows))
                tensors.append(_to_tf(tf, v, block))
                del block
            try:
                tf.raw_ops.SaveV2(
                    prefix=part, tensor_names=names, shape_and_slices=specs, tensors=tensors
                )
            except tf.errors.OpError as exc:
                raise _write_error(prefix, exc) from None
            del tensors
            parts.append(part)
            done += batch_bytes
            if progress is not None:
                progress(f"writing {final.name}", done, total)
            batch, batch_bytes = [], 0

        for v in variables:
            pieces[v.name] = _pieces(v, limit)
            if len(pieces[v.name]) > 1:
                out.sliced.append(v.name)
            biggest = pieces[v.name][0]
            if (v.nbytes if biggest is None else _rows_bytes(v, biggest)) > limit:
                why = (
                    f"TensorFlow cannot reassemble {v.dtype} slices"
                    if v.dtype not in _SLICEABLE and v.shape and v.shape[0] > 1
                    else "it cannot be split finer"
                )
                out.notes.append(
                    f"{v.name} ({v.dtype}{list(v.shape)}) is written in pieces larger than the "
                    f"shard size ({why}): memory peaks at about {_rows_bytes(v, biggest):,} bytes"
                )
            for rows in pieces[v.name]:
                size = _rows_bytes(v, rows)
                if batch and batch_bytes + size > limit:
                    flush()
                batch.append((v, rows))
                batch_bytes += size
        if batch:
            flush()
        try:
            tf.raw_ops.MergeV2Checkpoints(
                checkpoint_prefixes=parts,
                destination_prefix=str(tmp_prefix),
                delete_old_dirs=False,
            )
        except tf.errors.OpError as exc:
            raise _write_error(prefix, exc) from None
        out.tensor_bytes = total
        out.data_files = len(parts)
        _verify_saver(
            tf, prefix, tmp_prefix, variables, pieces, hashes if verify == "full" else None
        )
        for p in tmpdir.iterdir():
            fsync_path(p)
        return _Staged(tmpdir, tmp_prefix, out)
    except BaseException:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise


def _write_error(prefix: str, exc: Exception) -> CkptError:
    text = op_message(exc)
    if "No space" in text or "ENOSPC" in text:
        return CkptIOError(prefix, "no space left on the device", "free disk space and retry")
    return CkptIOError(prefix, f"writing the TensorFlow checkpoint failed ({text})")


def _verify_saver(
    tf: Any,
    prefix: str,
    tmp_prefix: Path,
    variables: list[_Variable],
    pieces: dict[str, list[slice | None]],
    hashes: dict[str, Any] | None,
) -> None:
    """Re-read the written checkpoint: the same names, dtypes and shapes (and bytes if hashed)."""
    reader = open_reader(tf, str(tmp_prefix))
    shapes = reader.get_variable_to_shape_map()
    types = reader.get_variable_to_dtype_map()
    want = {v.name: v for v in variables}
    if set(shapes) != set(want):
        missing = sorted(set(want) - set(shapes))[:3]
        extra = sorted(set(shapes) - set(want))[:3]
        raise VerificationError(
            prefix, f"the written checkpoint has other names (missing {missing}, extra {extra})"
        )
    for name, v in want.items():
        if types[name].name != v.dtype or tuple(shapes[name]) != v.shape:
            raise VerificationError(
                prefix,
                f"{name!r} was written as {types[name].name}{list(shapes[name])}, "
                f"expected {v.dtype}{list(v.shape)}",
            )
        if hashes is None:
            continue
        h = hashlib.sha256()
        for rows in pieces[name]:
            if rows is None:
                value = reader.get_tensor(name)
            else:
                (t,) = tf.raw_ops.RestoreV2(
                    prefix=str(tmp_prefix),
                    tensor_names=[name],
                    shape_and_slices=[_slice_spec(v, rows)],
                    dtypes=[types[name]],
                )
                value = t.numpy()
            if v.dtype == "string":
                h.update(value)
            else:
                value = np.asarray(value)
                storage_hash(value.view(np.int16) if v.dtype == "bfloat16" else value, h)
            del value
        if h.hexdigest() != hashes[name].hexdigest():
            raise VerificationError(prefix, f"{name!r} differs from the H5 tensor after writing")


def _publish_all(staged: list[_Staged]) -> None:
    """Move every checkpoint into place: all data files first, each ``.index`` last (a reader
    finds a checkpoint by its index, so no half-moved checkpoint ever looks complete)."""
    linked: list[Path] = []
    try:
        for s in staged:
            for p in sorted(s.tmpdir.glob(s.tmp_prefix.name + ".data-*")):
                final = Path(s.output.prefix + p.name[len(s.tmp_prefix.name) :])
                publish(p, final)
                linked.append(final)
        for s in staged:
            index = Path(str(s.tmp_prefix) + ".index")
            final = Path(s.output.prefix + ".index")
            publish(index, final)
            linked.append(final)
    except BaseException:
        for p in reversed(linked):  # ours: created by this run a moment ago
            with contextlib.suppress(OSError):
                p.unlink()
        raise
    for d in {Path(s.output.prefix).parent for s in staged}:
        fsync_dir(d)


def _write_state_file(prefix: Path) -> str | None:
    """A ``checkpoint`` state file naming ``prefix``, so ``tf.train.latest_checkpoint(dir)`` and
    ``tf.train.CheckpointManager`` find it; only where the directory has none (never replaced)."""
    state = prefix.parent / "checkpoint"
    if state.exists():
        return None
    quoted = json.dumps(prefix.name)  # text-proto string escapes agree for printable text
    tmp = temp_name(state)
    try:
        tmp.write_text(
            f"model_checkpoint_path: {quoted}\nall_model_checkpoint_paths: {quoted}\n",
            encoding="utf-8",
        )
        fsync_path(tmp)
        publish(tmp, state)
    except (OSError, CkptError):
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return str(state)


def _provenance_step(ckpt: Any) -> int | None:
    for record in reversed(ckpt.provenance):
        if isinstance(record, dict) and isinstance(record.get("global_step"), int):
            return record["global_step"]
    return None


def _h5_step(variables: list[_Variable]) -> int | None:
    by_name = {v.name: v for v in variables}
    for name in STEP_VARIABLES:
        v = by_name.get(name)
        if v is not None and v.shape == () and v.dtype.startswith(("int", "u")):
            return int(np.asarray(v.fetch(None)))
    return None
