"""Writing TensorFlow saver checkpoints: each ``SaveV2`` call bounded in bytes (larger variables
sliced along their first axis), written in a temporary directory beside the target, verified,
and moved into place data files first, ``.index`` last (``tf.from_h5`` decides what to write).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_migrate.atomic import fsync_dir, fsync_path, publish, temp_name
from ckpt_migrate.errors import CkptError, CkptIOError, UsageError, VerificationError
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.interrupt import Interrupt
from ckpt_migrate.tf.saver import op_message, open_reader, storage_hash


@dataclass(eq=False)
class Variable:
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


def refuse_existing(prefix: str) -> None:
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
class Staged:
    tmpdir: Path
    tmp_prefix: Path
    output: SaverOutput


# TF reassembles slices only of these dtypes ("Dtype half not supported" for the others, TF 2.21).
_SLICEABLE = {"bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}


def _pieces(v: Variable, limit: int) -> list[slice | None]:
    """Row ranges of at most ``limit`` bytes (None: the whole variable in one piece)."""
    if v.nbytes <= limit or not v.shape or v.dtype not in _SLICEABLE or v.shape[0] <= 1:
        return [None]
    row = v.nbytes // v.shape[0]
    if row == 0:
        return [None]
    step = max(1, limit // row)
    return [slice(s, min(s + step, v.shape[0])) for s in range(0, v.shape[0], step)]


def _rows_bytes(v: Variable, rows: slice | None) -> int:
    return v.nbytes if rows is None else (v.nbytes // v.shape[0]) * (rows.stop - rows.start)


def _slice_spec(v: Variable, rows: slice | None) -> str:
    if rows is None:
        return ""
    dims = " ".join(str(d) for d in v.shape)
    rest = ":-" * (len(v.shape) - 1)
    return f"{dims} {rows.start},{rows.stop - rows.start}{rest}"


def _to_tf(tf: Any, v: Variable, block: Any) -> Any:
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


def stage(
    tf: Any,
    prefix: str,
    selector: str,
    variables: list[Variable],
    limit: int,
    verify: str,
    progress: Progress | None,
) -> Staged:
    """Write one saver checkpoint into a temporary directory beside ``prefix`` and verify it."""
    final = Path(prefix)
    tmpdir = temp_name(final)
    tmpdir.mkdir()
    tmp_prefix = tmpdir / final.name
    out = SaverOutput(prefix, len(variables), 0, 0, selector=selector)
    try:
        hashes: dict[str, Any] = {}
        pieces: dict[str, list[slice | None]] = {}
        batch: list[tuple[Variable, slice | None]] = []
        batch_bytes = 0
        parts: list[str] = []
        total = sum(v.nbytes for v in variables)
        done = 0

        def flush() -> None:
            nonlocal batch, batch_bytes, done
            part = str(tmpdir / f"part-{len(parts):05d}")
            names, specs, tensors = [], [], []
            fetched = done
            for v, rows in batch:
                block = v.fetch(rows)
                if progress is not None:  # (a batch of 12k small tensors took 16 s to read)
                    fetched += _rows_bytes(v, rows)
                    progress(f"writing {final.name}", min(fetched, max(total - 1, 0)), total)
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
            tf,
            prefix,
            tmp_prefix,
            variables,
            pieces,
            hashes if verify == "full" else None,
            None if progress is None else functools.partial(progress, f"checking {final.name}"),
        )
        for p in tmpdir.iterdir():
            fsync_path(p)
        return Staged(tmpdir, tmp_prefix, out)
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
    variables: list[Variable],
    pieces: dict[str, list[slice | None]],
    hashes: dict[str, Any] | None,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Re-read the written checkpoint: the same names, dtypes and shapes (and bytes if hashed);
    ``progress`` hears of the bytes of the variables checked."""
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
    total, done = sum(v.nbytes for v in variables), 0
    for name, v in want.items():
        if progress is not None:
            progress(done, total)
            done += v.nbytes
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
    if progress is not None:
        progress(total, total)


def publish_all(staged: list[Staged]) -> None:
    """Move every checkpoint into place: all data files first, each ``.index`` last (a reader
    finds a checkpoint by its index, so no half-moved checkpoint ever looks complete). A
    Ctrl-C before the last move removes the moved files; during it, it is raised after."""
    linked: list[Path] = []
    with Interrupt.hold():
        try:
            for s in staged:
                for p in sorted(s.tmpdir.glob(s.tmp_prefix.name + ".data-*")):
                    final = Path(s.output.prefix + p.name[len(s.tmp_prefix.name) :])
                    publish(p, final, note=False)
                    linked.append(final)
            for s in staged:
                index = Path(str(s.tmp_prefix) + ".index")
                final = Path(s.output.prefix + ".index")
                publish(index, final, note=False)
                linked.append(final)
        except BaseException:
            for p in reversed(linked):  # ours: created by this run a moment ago
                with contextlib.suppress(OSError):
                    p.unlink()
            raise
        for s in staged:
            Interrupt.note_published(s.output.prefix)
    for d in {Path(s.output.prefix).parent for s in staged}:
        fsync_dir(d)


def write_state_file(prefix: Path) -> str | None:
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
        publish(tmp, state, note=False)  # (a guide to the checkpoints, counted already)
    except (OSError, CkptError):
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return str(state)
