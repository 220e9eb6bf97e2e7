"""The TensorFlow side shared by ``tf_to_h5`` and ``h5_to_tf``: finding and opening saver
checkpoints, importing TensorFlow lazily, sizes and hashes. The design of both conversions:

A TensorFlow checkpoint (``<prefix>.index`` + ``<prefix>.data-NNNNN-of-MMMMM``, written by
``tf.train.Saver``, ``tf.train.Checkpoint`` or Keras) becomes an H5 checkpoint whose state dict is
flat: ``{tf_variable_name: value}``, one entry per saved name, the name kept verbatim (``/`` and
all). The reverse writes every leaf of an H5 checkpoint under its leaf name, so TF → H5 → TF gives
back the same names, dtypes and bytes.

Values: tensors keep their dtype (bfloat16 as its 16-bit pattern, never through float32). A
string scalar (``_CHECKPOINTABLE_OBJECT_GRAPH``, the object graph ``tf.train.Checkpoint`` needs to
restore) is stored as a ``bytes`` object, which cstorch reads back as ``bytes``. Anything else
(complex, quantized, variant, string arrays) is refused before a byte is written, naming the
variables; ``exclude`` leaves them out deliberately.

Global step: every variable is kept, so the step is too (TF1 ``global_step``, a
``tf.train.Checkpoint``'s ``step``/``save_counter``, the optimizer's iteration count). The one
found (see ``STEP_VARIABLES``) is also recorded in the H5 file's provenance attribute and reported.

Memory: TF → H5 reads and writes one variable at a time (peak ≈ the largest variable). H5 → TF
writes ``SaveV2`` shards of at most ``max_shard_bytes`` each, slicing a larger variable along its
first axis, and merges them into one checkpoint with ``MergeV2Checkpoints`` (several
``.data-*`` files, one ``.index``): peak ≈ one shard, whatever the file size.

TensorFlow is imported only inside the conversion functions (``import ckpt_migrate`` and the
CLI's ``--help`` never load it); without it they raise a one-line error that says how to install
it.
"""

from __future__ import annotations

import codecs
import glob
import importlib.util
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ckpt_migrate import heap
from ckpt_migrate.errors import CkptError, CkptIOError, NotACheckpointError, UsageError

INSTALL_HINT = "pip install 'ckpt-migrate[tensorflow]'"
DEFAULT_MAX_SHARD_BYTES = 1 << 30
# The variable that holds the training step, first match wins (all are kept as variables anyway).
STEP_VARIABLES = (
    "global_step",  # tf.compat.v1 / Estimator
    "global_step/.ATTRIBUTES/VARIABLE_VALUE",  # tf.train.Checkpoint(global_step=...)
    "step/.ATTRIBUTES/VARIABLE_VALUE",  # tf.train.Checkpoint(step=...), the TF2 guide's idiom
    "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE",  # Keras 2 optimizers
    "optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE",
    "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE",  # Keras 3 optimizers
    "save_counter/.ATTRIBUTES/VARIABLE_VALUE",  # tf.train.Checkpoint: number of saves
)
TENSOR_DTYPES = {
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
}
_DATA_FILE = re.compile(r"\.data-\d{5}-of-\d{5}$")
_TABLE_MAGIC = bytes.fromhex("57fb808b247547db")  # LevelDB/TF table footer, little-endian


class TensorFlowMissingError(CkptError):
    """The command needs TensorFlow, which is not installed."""


def _missing(detail: str = "") -> TensorFlowMissingError:
    return TensorFlowMissingError(
        None,
        f"TensorFlow checkpoints need TensorFlow, which is not installed{detail}",
        f"install it with: {INSTALL_HINT}",
    )


def require_tensorflow() -> None:
    """The one-line error of ``import_tensorflow`` when TensorFlow is absent, without importing it.

    Importing TensorFlow costs 3–5 s: a conversion asks this first, checks its inputs, and imports
    TensorFlow only once there is work for it, so a mistyped path is refused at once.
    """
    try:
        found = importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise _missing()


def import_tensorflow() -> Any:
    """``tensorflow``, or a one-line error saying how to install it."""
    try:
        import tensorflow as tf
    except ImportError as exc:
        name = getattr(exc, "name", None)
        detail = "" if name == "tensorflow" else f" ({str(exc).splitlines()[0][:160]})"
        raise _missing(detail) from None
    return tf


def setup_cli_process() -> None:
    """For the command line only (the Python API leaves the caller's process alone).

    Keeps TensorFlow's start-up chatter off stderr, so errors stay one line. And fixes glibc's
    mmap threshold: by default it rises after each large free (up to 32 MiB), after which
    tensor-sized blocks come from the heap, whose holes are not given back, and peak RSS creeps
    above what is live (measured: +80 MiB on a 300 MB conversion). With a fixed threshold every
    block of 1 MiB or more is its own mapping, returned to the system when freed (``heap``).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # oneDNN prints an INFO line at import whatever the log level; it only changes math kernels,
    # which a conversion does not run.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    heap.fix_mmap_threshold(1 << 20)


def parse_size(text: str | int) -> int:
    """Bytes in ``"4096"``, ``"256MB"``/``"256M"`` (powers of 1000) or ``"1GiB"`` (of 1024)."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i?)b?)?\s*", text, re.IGNORECASE)
        if m is None:
            raise UsageError(
                None, f"--max-shard-size {text!r} is not a size", "write e.g. 256MB, 1GiB or 4096"
            )
        power = "kmgt".index(m.group(2).lower()) + 1 if m.group(2) else 0
        value = int(float(m.group(1)) * (1024 if m.group(3) else 1000) ** power)
    if value < 1:
        raise UsageError(None, f"--max-shard-size must be at least 1 byte, not {text!r}")
    return value


def compile_patterns(patterns: Iterable[str], option: str) -> list[re.Pattern[str]]:
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except re.error as exc:
            raise UsageError(
                None, f"{option} {p!r} is not a valid regular expression ({exc})"
            ) from None
    return out


def storage_hash(block: np.ndarray, h: Any) -> None:
    """Feed a block's raw little-endian bytes (bool as 0/1 bytes) to hash ``h``."""
    if block.size == 0:
        return
    block = np.ascontiguousarray(block)
    if block.dtype.byteorder == ">":
        block = block.astype(block.dtype.newbyteorder("<"))
    if block.dtype.kind == "b":
        block = block.view(np.uint8)
    h.update(memoryview(block).cast("B"))


def saver_files(prefix: str) -> list[Path]:
    """The files of the checkpoint ``prefix`` names: its ``.index`` and ``.data-*`` files, or
    the prefix itself (a V1 checkpoint of one file)."""
    base = Path(prefix)
    mine = re.compile(re.escape(base.name) + r"\.(index|data-\d{5}-of-\d{5})")
    found = sorted(base.parent.glob(glob.escape(base.name) + ".*"))
    return [p for p in found if mine.fullmatch(p.name)] or [base]


def resolve_saver_path(path: str | Path) -> str:
    """The checkpoint prefix ``path`` names: a prefix, its ``.index``/``.data-*`` file, or a
    directory with a ``checkpoint`` state file (as ``tf.train.latest_checkpoint`` reads it)."""
    p = Path(path)
    if p.is_dir():
        return _prefix_in_dir(p)
    text = str(p)
    text = text.removesuffix(".index") if text.endswith(".index") else _DATA_FILE.sub("", text)
    index = Path(text + ".index")
    if index.is_file():
        _check_index(index)
        return text
    if p.is_file():
        try:
            hdf5 = h5py.is_hdf5(str(p))
        except OSError as exc:  # (h5py's error names no file: not console's to recognise)
            raise CkptIOError.reading(p, exc) from None
        if hdf5:
            raise NotACheckpointError(
                p,
                "is an HDF5 file, not a TensorFlow checkpoint",
                "to convert an H5 checkpoint to TensorFlow use h5-to-tensorflow",
            )
        return text  # perhaps a V1 (single file) checkpoint: TensorFlow decides
    raise NotACheckpointError(
        p,
        f"no TensorFlow checkpoint here (no {index.name}, and not a directory with a "
        "'checkpoint' file)",
        "give the checkpoint prefix, e.g. model.ckpt-100 for model.ckpt-100.index",
    )


def _prefix_in_dir(d: Path) -> str:
    state = d / "checkpoint"
    if state.is_file():
        text = state.read_bytes()  # (a text proto: C escapes of the name's bytes, or raw UTF-8)
        m = re.search(rb'^model_checkpoint_path:\s*"((?:[^"\\]|\\.)*)"', text, re.M)
        if m is None:
            raise NotACheckpointError(state, "has no model_checkpoint_path entry")
        name = os.fsdecode(codecs.escape_decode(m.group(1))[0])
        prefix = Path(name) if Path(name).is_absolute() else d / name
        if not Path(str(prefix) + ".index").is_file():
            raise NotACheckpointError(
                state,
                f"names {name!r}, but {prefix}.index does not exist",
                "give the checkpoint prefix instead of the directory",
            )
        return str(prefix)
    indexes = sorted(d.glob("*.index"))
    if len(indexes) == 1:
        return str(indexes[0])[: -len(".index")]
    found = f" but {len(indexes)} checkpoints" if indexes else " and no checkpoint"
    raise NotACheckpointError(
        d,
        f"directory without a 'checkpoint' state file{found}",
        "give the checkpoint prefix, e.g. " + (str(indexes[0])[:-6] if indexes else "dir/ckpt-1"),
    )


def _check_index(index: Path) -> None:
    """A TF ``.index`` file is a table ending in a fixed magic number: refuse others early."""
    try:
        size = index.stat().st_size
        with open(index, "rb") as fh:
            if size >= 48:
                fh.seek(size - 8)
            tail = fh.read(8)
    except OSError as exc:
        raise NotACheckpointError(index, f"cannot read it ({exc.strerror or exc})") from None
    if size < 48 or tail != _TABLE_MAGIC:
        raise NotACheckpointError(
            index,
            "not a TensorFlow checkpoint index (no table magic number)",
            "is this file truncated or something else?",
        )


def open_reader(tf: Any, prefix: str) -> Any:
    try:
        return tf.train.load_checkpoint(prefix)
    except tf.errors.OpError as exc:
        raise NotACheckpointError(
            prefix, f"not a readable TensorFlow checkpoint ({op_message(exc)})"
        ) from None


def op_message(exc: Exception) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return " ".join(str(text).split())[:200]
