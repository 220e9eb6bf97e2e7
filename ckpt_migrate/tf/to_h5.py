"""TensorFlow saver checkpoint → Cerebras H5 checkpoint (``tensorflow-to-h5``); see ``tf_saver``.

The state dict is flat, ``{tf_variable_name: value}``, written one variable at a time: each is
read from the TF checkpoint only when the writer places it, and dropped right after.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ckpt_migrate.atomic import atomic_output
from ckpt_migrate.errors import (
    CorruptCheckpointError,
    KeyCollisionError,
    UnsupportedContentError,
    UsageError,
    VerificationError,
)
from ckpt_migrate.format import provenance, releases
from ckpt_migrate.format.compare import check_written, tensor_sha256
from ckpt_migrate.format.h5 import root as h5root
from ckpt_migrate.format.h5.identity import watch
from ckpt_migrate.format.h5.tensor import place_tensor
from ckpt_migrate.format.h5.writing import writing
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.releases import Release
from ckpt_migrate.format.tree import (
    DataSource,
    DictNode,
    Leaf,
    MemoryData,
    OpaqueLeaf,
    TensorLeaf,
    iter_leaves,
)
from ckpt_migrate.format.write import prepare, root_attributes, write_tree, written_bound
from ckpt_migrate.tf.saver import (
    STEP_VARIABLES,
    TENSOR_DTYPES,
    compile_patterns,
    import_tensorflow,
    op_message,
    open_reader,
    require_tensorflow,
    resolve_saver_path,
    saver_files,
    storage_hash,
)


@dataclass(eq=False)
class TFVariableData(DataSource):
    """One variable of a TF checkpoint, read (whole) only when the writer asks for it."""

    reader: Any
    prefix: str
    name: str
    bfloat16: bool

    def read(self) -> np.ndarray:
        array = np.asarray(self.value())
        return array.view(np.int16) if self.bfloat16 else array

    def value(self) -> Any:
        """What TF's reader gives: an array, or ``bytes`` for a string scalar (which
        ``np.asarray`` would cut at its trailing NULs)."""
        try:
            return self.reader.get_tensor(self.name)
        except Exception as exc:  # tf.errors.OpError, or ValueError for a dtype TF cannot read
            if isinstance(exc, MemoryError):
                raise
            raise CorruptCheckpointError(
                self.prefix,
                f"cannot read variable {self.name!r} ({op_message(exc)})",
                "the checkpoint's .data files may be missing or damaged",
            ) from None

    def describe(self) -> str:
        return f"{self.prefix}:{self.name}"


@dataclass
class TfToH5Report:
    path: Path
    release: Release
    sources: list[str]
    variables: int = 0
    tensor_bytes: int = 0
    global_step: int | None = None
    global_step_variable: str | None = None
    excluded: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verified: str = "structure"


def tf_to_h5(
    saver_paths: str | Path | Sequence[str | Path],
    h5_path: str | Path,
    *,
    release: str | None = "auto",
    exclude: Sequence[str] = (),
    verify: str = "structure",
    progress: Progress | None = None,
) -> TfToH5Report:
    """Convert one TF checkpoint (or several, merged) to an H5 checkpoint at ``h5_path``.

    ``release``: the release whose format to write; ``"auto"`` (default) writes the newest unless
    two names cannot both be 0.5 datasets (TF1 slots: ``w`` and ``w/Adam``), then 2.4 (format 0.4,
    which quotes names), and says so in the report. ``exclude``: regular expressions
    (``re.search``) of variables to leave out. ``verify="full"`` re-reads the written file and
    compares every tensor's sha256 with the source's.
    """
    if verify not in ("structure", "full"):
        raise UsageError(None, f"--verify must be structure or full, not {verify!r}")
    paths = [saver_paths] if isinstance(saver_paths, (str, Path)) else list(saver_paths)
    if not paths:
        raise UsageError(None, "no TensorFlow checkpoint given")
    target = Path(h5_path)
    if target.exists():
        raise UsageError(
            target, "already exists; refusing to overwrite it", "choose another output"
        )
    excludes = compile_patterns(exclude, "--exclude")
    require_tensorflow()
    prefixes = [resolve_saver_path(p) for p in paths]
    unchanged = watch(*(f for p in prefixes for f in saver_files(p)))  # (before publishing)
    tf = import_tensorflow()

    items: dict[str, Leaf] = {}
    origin: dict[str, str] = {}
    report = TfToH5Report(target, releases.LATEST, prefixes)
    problems: list[str] = []
    for prefix in prefixes:
        reader = open_reader(tf, prefix)
        shapes = reader.get_variable_to_shape_map()
        types = reader.get_variable_to_dtype_map()
        for name in sorted(shapes):
            if any(rx.search(name) for rx in excludes):
                report.excluded.append(name)
                continue
            if name in origin:
                raise UsageError(
                    prefix,
                    f"variable {name!r} is also in {origin[name]}",
                    "convert the checkpoints separately, or leave one copy out with --exclude",
                )
            origin[name] = prefix
            leaf = _tf_leaf(reader, prefix, name, types[name], tuple(shapes[name]), problems)
            if leaf is not None:
                items[name] = leaf
    if problems:
        raise UnsupportedContentError(
            prefixes[0] if len(prefixes) == 1 else None,
            f"{len(problems)} variable(s) cannot be stored in a Cerebras checkpoint: "
            + ", ".join(problems[:5])
            + (" ..." if len(problems) > 5 else ""),
            "leave them out with --exclude REGEX",
        )
    if not items:
        raise UsageError(prefixes[0], "no variables to convert (all excluded?)")

    root = DictNode(sorted(items.items()))  # as TF orders its index, whatever the sources
    source = prefixes[0] if len(prefixes) == 1 else target
    rel, note = _choose_release(root, release, target, source)
    if note:
        report.notes.append(note)
    report.release = rel
    step_name, step = _global_step(items)
    report.global_step, report.global_step_variable = step, step_name
    record = provenance.record(
        ", ".join(Path(p).name for p in prefixes),
        conversion="tensorflow-to-h5",
        source_format="tensorflow-saver",
        target_release=rel.name,
        variables=len(items),
        global_step=step,
        global_step_variable=step_name,
    )
    report.variables = len(items)
    report.tensor_bytes = sum(x.nbytes for x in items.values() if isinstance(x, TensorLeaf))
    extra = {provenance.PROVENANCE_ATTR: json.dumps([record])}
    _write_h5(root, target, rel, extra, verify, progress, unchanged)
    report.verified = verify
    return report


def _tf_leaf(
    reader: Any, prefix: str, name: str, tf_dtype: Any, shape: tuple[int, ...], problems: list[str]
) -> Leaf | None:
    dtype = tf_dtype.name
    if dtype in TENSOR_DTYPES:
        data = TFVariableData(reader, prefix, name, dtype == "bfloat16")
        return TensorLeaf(dtype, shape, data)
    if dtype == "string" and shape == ():
        value = TFVariableData(reader, prefix, name, False).value()
        value = value.item() if isinstance(value, np.ndarray) else value
        if isinstance(value, bytes):
            return OpaqueLeaf(pickle.dumps(value, protocol=4), "pickle")
    what = f"string{list(shape)}" if dtype == "string" else dtype
    problems.append(f"{name} ({what})")
    return None


def _choose_release(
    root: DictNode, release: str | None, target: Path, source: str | Path
) -> tuple[Release, str]:
    """The release to write ``root`` as, and a note when auto did not pick the newest; what no
    format can hold is said of ``source``, the checkpoint read."""
    if release not in (None, "auto"):
        rel = releases.get(release)
        try:
            prepare(root, rel, path=target)
        except (KeyCollisionError, UnsupportedContentError) as exc:
            if rel.legacy:  # (the writer's fix would rename a key: a variable is left out)
                raise type(exc)(
                    source,
                    exc.problem,
                    "leave the variable out with --exclude REGEX, or write a newer --release",
                ) from None
            raise UnsupportedContentError(
                target,
                f"{exc.problem}: format {rel.format} names datasets by the variable name, so a "
                "name cannot also be the '/'-prefix of another (TF1 optimizer slots: w, w/Adam)",
                "write --release 2.4 (format 0.4 quotes names) or --release auto",
            ) from None
        return rel, ""
    try:
        prepare(root, releases.LATEST, path=target)
        return releases.LATEST, ""
    except (KeyCollisionError, UnsupportedContentError) as exc:
        newest = exc
    rel = releases.get("2.4")
    try:
        prepare(root, rel, path=target)
    except (KeyCollisionError, UnsupportedContentError) as exc:
        raise type(exc)(
            source,
            f"format {releases.LATEST.format} cannot hold the variables ({newest.problem}), "
            f"nor can format {rel.format} ({exc.problem})",
            "leave the variable out with --exclude REGEX",
        ) from None
    return rel, (
        f"written as release {rel.name} (format {rel.format}), not {releases.LATEST.name}: "
        f"{newest.problem} (format 0.5 names datasets by the variable name; 0.4 quotes names)"
    )


def _global_step(items: dict[str, Leaf]) -> tuple[str | None, int | None]:
    for name in STEP_VARIABLES:
        leaf = items.get(name)
        if (
            isinstance(leaf, TensorLeaf)
            and leaf.shape == ()
            and leaf.dtype.startswith(("int", "u"))
        ):
            return name, int(leaf.data.read())
    return None, None


def _write_h5(
    root: DictNode,
    target: Path,
    rel: Release,
    extra_attrs: dict[str, str],
    verify: str,
    progress: Progress | None,
    unchanged: Callable[[], None],
) -> None:
    """``writer.write_checkpoint`` with a tensor placer that reads each variable once (and hashes
    it for ``verify="full"``) and reports progress; ``unchanged``: the sources' watch."""
    to_write, _ = prepare(root, rel, path=target)
    total = sum(x.nbytes for _, x in root.items if isinstance(x, TensorLeaf))
    done = 0
    hashes: dict[str, str] = {}

    def place(f: h5py.Group, name: str, leaf: TensorLeaf) -> h5py.h5d.DatasetID:
        nonlocal done
        array = leaf.data.read()
        if verify == "full":
            h = hashlib.sha256()
            storage_hash(array, h)
            hashes[name] = h.hexdigest()
        ds = place_tensor(f, name, TensorLeaf(leaf.dtype, leaf.shape, MemoryData(array)))
        del array
        done += leaf.nbytes
        if progress is not None:
            progress("converting", done, total)
        return ds

    with atomic_output(target) as tmp:
        attributes = root_attributes(to_write, rel, extra_attrs)
        made = h5root.create_file(tmp, exclusive=False, attributes=attributes)
        with writing(tmp, made, reserve=written_bound(to_write, rel)) as f:
            write_tree(f, to_write, rel, extra_attrs, None, place)
        check_written(tmp, to_write, rel)
        if verify == "full":
            with read_checkpoint(tmp) as back:
                for ref in iter_leaves(back.root):
                    if isinstance(ref.leaf, TensorLeaf) and tensor_sha256(ref.leaf) != hashes.get(
                        ref.name
                    ):
                        raise VerificationError(
                            target,
                            f"tensor {ref.name!r} differs from the TF variable after writing",
                        )
        unchanged()
