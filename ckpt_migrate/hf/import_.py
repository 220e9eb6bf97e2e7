"""Import a Hugging Face directory (``config.json`` + safetensors or ``pytorch_model*.bin``) as a
Cerebras checkpoint of a chosen release (2.0 ... 2.10), and optionally its ``params.yaml``.

The family's plan names, for each CS tensor, the HF tensors it is built from; the checkpoint tree
holds *lazy* leaves that build their tensor when the format writer asks for it, so one tensor
(and its inputs) is in memory at a time. The checkpoint is written beside its target, checked
and renamed into place by the format writer (``format.write.write_checkpoint``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_migrate import catalogue, jsonfile
from ckpt_migrate.atomic import (
    atomic_output,
    check_parent,
    check_writable,
    output_exists,
    path_exists,
    refuse_object_address,
    same_file,
)
from ckpt_migrate.config import yaml_edit
from ckpt_migrate.config.upgrade import upgrade_config_text
from ckpt_migrate.errors import CkptIOError, CorruptCheckpointError, UsageError
from ckpt_migrate.format import releases
from ckpt_migrate.format.h5.identity import watch
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.tree import DataSource, DictNode, TensorLeaf
from ckpt_migrate.format.write import write_checkpoint
from ckpt_migrate.hf import config_table, directories, families, unconverted
from ckpt_migrate.hf import safetensors_io as st
from ckpt_migrate.hf.arrays import LastRead, cast, check_dtype, out_dtype, shapes_of
from ckpt_migrate.hf.mapping import (
    MappingError,
    Out,
    build_one,
    identity,
    missing_inputs,
    unused_inputs,
)
from ckpt_migrate.hf.rules import (
    canonical_name,
    check_layer_counts,
    family_for,
    mapping_failed,
    plain,
    refuse_unused,
)
from ckpt_migrate.migrations import v04_2_0_to_2_1 as v04
from ckpt_migrate.models.keys import rename_for
from ckpt_migrate.models.names import resolve_name
from ckpt_migrate.torch.hf_bin import read_bin_directory

OLDEST = "2.0"  # the oldest release whose model key spelling this import writes


@dataclass
class ImportResult:
    source: Path
    output: Path
    model: str
    release: str
    config_out: Path | None = None
    tensors: int = 0
    bytes: int = 0
    dropped: dict[str, str] = field(default_factory=dict)  # HF tensor -> why not imported
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return plain(self)


def check_release(release: str) -> releases.Release:
    """``release``, if a conversion from Hugging Face can write it (``OLDEST`` on)."""
    rel = releases.get(release)
    if rel.version < releases.get(OLDEST).version:
        raise UsageError(
            None,
            f"a conversion from Hugging Face writes releases {OLDEST} and newer, not {rel.name}",
            f"choose release {OLDEST} or a later one",
        )
    return rel


def import_hf(
    hf_dir: str | Path,
    output: str | Path,
    *,
    release: str = releases.LATEST.name,
    model: str | None = None,
    config_out: str | Path | None = None,
    dtype: str | None = None,
    force: bool = False,
    drop_unmatched_keys: bool = False,
    progress: Progress | None = None,
    config: str | Path | None = None,
) -> ImportResult:
    """Write the CS checkpoint ``output`` (release ``release``) of the HF model in ``hf_dir``.

    ``model``: a Model Zoo model name (default: from ``config.json``'s ``architectures`` or
    ``model_type``). ``config_out``: also write the run's ``params.yaml`` for that release.
    ``dtype``: cast floating tensors. ``drop_unmatched_keys``: leave out HF tensors the
    family's rules do not convert instead of refusing. ``config``: the model's
    ``config.json`` when it is not the directory's own."""
    start = time.monotonic()
    src, out = Path(hf_dir), Path(output)
    if not path_exists(src) or not src.is_dir():
        refuse_object_address(src)
        raise UsageError(src, "is not a directory", "pass a Hugging Face model directory")
    check_dtype(dtype)
    rel = check_release(release)
    # the model directory itself as its config: its own (Model Zoo's multi-directory
    # converters take it so, base_converter.py converter_note)
    given = None if config is None or same_file(Path(config), src) else Path(config)
    _check_free(out, force, src, given)
    if config_out is not None:
        _check_free(Path(config_out), force, src, given)
        if same_file(Path(config_out), out):
            raise UsageError(config_out, "is the checkpoint's output too", "name another file")
    name = canonical_name(model) if model else _split_model(src)
    dirs = directories.of(family_for(name), name) if name else directories.ONE
    if given is not None and dirs != directories.ONE:
        raise UsageError(
            given,
            f"{name} is read from the config.json of each of its sub-directories "
            f"({', '.join(dirs)}), not from one given config",
            f"give the model directory {src} as its config, or none",
        )
    unchanged = watch(*_tensor_files(src, dirs))  # (called before publishing)
    hf_config, stored = directories.read(
        src, dirs, lambda d: read_config(d, given if d == src else None), _tensors
    )
    name = name or canonical_name(_model_from_config(src, hf_config))
    module = family_for(name)
    shapes = {n: t.entry.shape if isinstance(t, st.Stored) else t.shape for n, t in stored.items()}
    dtypes = {n: t.entry.dtype if isinstance(t, st.Stored) else t.dtype for n, t in stored.items()}
    check_layer_counts(src, hf_config, len(shapes))
    try:
        cs_model = module.config_to_cs(hf_config, name)
        plan = module.plan_to_cs(shapes, hf_config, name)
        missing = missing_inputs(plan, shapes)
        if missing:
            raise MappingError(f"HF tensors the {name} rules need are missing: {missing[:3]}")
        dropped = unconverted.hf_dropped(shapes, hf_config, name)
        unused = [n for n in unused_inputs(plan, shapes) if n not in dropped]
        out_shapes = shapes_of(plan, shapes)
        kinds = {o.name: out_dtype(o.inputs, dtypes, "float32") for o in plan}
    except MappingError as exc:
        exc.args = (f"{exc}{'' if model else _class_note(hf_config, module, name)}",)
        raise mapping_failed(src, exc) from None
    refuse_unused(src, unused, name, drop_unmatched_keys)
    dropped.update({n: "not converted (--drop-unmatched-keys)" for n in unused})
    result = ImportResult(src, out, name, rel.name, dropped=dropped)
    result.warnings += [f"{n} left out: {why}" for n, why in dropped.items()]
    if dirs == directories.ONE:
        result.warnings += _config_left_out(hf_config, name) + _approximated(hf_config, name)
    family = resolve_name(name)[0]
    model_node = _model_tree(plan, stored, out_shapes, kinds, dtype, rel, family)
    # The tree holds what its tensors are built from; the tables by name go before the write,
    # whose read-back builds a tree of its own (at 150k tensors, tens of MB: issue 33).
    del stored, shapes, dtypes, plan, out_shapes, kinds
    try:
        model = DictNode([("model", model_node)])
        written = write_checkpoint(
            model, out, rel, replace=force, like=src, unchanged=unchanged,
            progress=progress, phase="import",
        )  # fmt: skip
    except MappingError as exc:
        raise mapping_failed(src, exc) from None
    result.bytes, result.tensors = written.tensor_bytes, written.tensors
    if config_out is not None:
        result.config_out = write_config(cs_model, name, rel.name, Path(config_out), force)
    result.seconds = round(time.monotonic() - start, 3)
    return result


def _class_note(hf_config: dict[str, Any], module: Any, name: str) -> str:
    """Why a directory of a model class no rules serve (``BertForMaskedLM``,
    ``LlamaForSequenceClassification``) fails the rules its ``model_type`` chose: its class
    and the ones they convert."""
    classes = [c for c in hf_config.get("architectures") or [] if isinstance(c, str)]
    served = sorted(set(getattr(module, "ARCHITECTURES", {}).values()))
    if not classes or not served or set(classes) & set(served):
        return ""
    return (
        f" (config.json's architectures {', '.join(classes)}: the {name} rules convert "
        f"{', '.join(served)})"
    )


def _approximated(hf_config: dict[str, Any], name: str) -> list[str]:
    """A line for each ``config.json`` value the CS model only approximates (``Hf.approximates``:
    Gemma 2's tanh GELU)."""
    record = catalogue.by_name(name)
    hf = None if record is None else record.hf
    return [
        f"config.json {field}={hf_config[field]!r} imported approximately: {what}"
        for field, exact, what in (hf.approximates if hf else ())
        if field in hf_config and hf_config[field] != exact
    ]


# (the model's name and the tensors' dtype are read from these; the writer's version is no field)
_READ_ELSEWHERE = frozenset({"architectures", "dtype", "torch_dtype", "transformers_version"})


def _config_left_out(hf_config: dict[str, Any], name: str) -> list[str]:
    """One line naming the ``config.json`` fields a CS model config has no place for (the token
    ids, ``use_cache``, a field of someone's): left out of the import, which said nothing of
    them, and an export gives transformers' defaults back."""
    try:
        unread = config_table.unread(hf_config, name)
    except MappingError:  # (a name whose rules read no table: DPO's, its policy's rules do)
        return []
    left = [k for k in unread if k not in _READ_ELSEWHERE]
    if not left:
        return []
    shown = ", ".join(f"{k}={json.dumps(hf_config[k], default=str)[:40]}" for k in left)
    return [f"config.json fields a CS model config has no place for, left out: {shown}"]


def _check_free(target: Path, force: bool, src: Path, given: Path | None) -> None:
    """``target`` may be written: new, or replaced with ``force`` where it is no input (a file
    of the model directory ``src``, or the ``given`` config)."""
    if output_exists(target):
        if not force:
            raise UsageError(target, "already exists; refusing to overwrite it", "pass --force")
        if target.resolve().is_relative_to(src.resolve()):
            why = f"lies in {src}, which this import reads; --force replaces nothing there"
        elif given is not None and same_file(target, given):
            why = "is the config this import reads; --force replaces no input"
        else:
            check_writable(target.parent)
            return
        raise UsageError(target, why, "write the output elsewhere")
    check_parent(target)
    check_writable(target.parent)  # (a --config-out too: else refused after the checkpoint)


MAX_CONFIG_BYTES = 16 << 20


def read_config(src: Path, given: Path | None) -> dict[str, Any]:
    path = given or src / "config.json"
    try:
        data = jsonfile.read(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        raise UsageError(path, "no such file", "a Hugging Face model directory has one") from None
    except ValueError as exc:
        raise CorruptCheckpointError(path, f"not a config ({exc})") from None
    except OSError as exc:
        raise CkptIOError.reading(path, exc) from None
    if not isinstance(data, dict):
        raise CorruptCheckpointError(path, "is not a JSON object")
    return data


def _split_model(src: Path) -> str | None:
    """The model whose sub-directories ``src`` holds, when it has no ``config.json`` of its
    own (Model Zoo's multi-model layouts, ``hf/directories.py``); None: not such a model."""
    if not src.is_dir() or (src / "config.json").exists():
        return None
    fits = [
        name
        for name, module in families.by_name().items()
        if directories.of(module, name) != directories.ONE
        and all((src / d / "config.json").is_file() for d in directories.of(module, name))
    ]
    if len(fits) > 1:
        raise UsageError(
            src, f"its sub-directories fit {' and '.join(fits)}", f"pass --model {fits[0]}"
        )
    return fits[0] if fits else None


def _model_from_config(src: Path, cfg: dict[str, Any]) -> str:
    """The model name ``config.json`` implies: its architecture, else the first name of the
    record of its ``model_type`` (not of its rules: one set of rules serves several types)."""
    named = catalogue.hf_name(cfg)
    if named is None and cfg.get("model_type") is None:
        raise UsageError(src / "config.json", "names no model_type", "pass --model")
    if named is None:  # (--model would not help: a config of another type is refused too)
        known = sorted({t for m in catalogue.hf_modules() for t in catalogue.hf_model_types(m)})
        raise UsageError(
            src / "config.json",
            f"model_type {cfg['model_type']!r} has no Hugging Face rules here; import-hf "
            f"reads {', '.join(known)}",
            "convert it with a tool that knows that model",
        )
    return named


def _tensor_files(src: Path, dirs: tuple[str, ...]) -> list[Path]:
    """The files the import may read tensors from: each is to be the file it was when the
    checkpoint is published (``h5.identity.watch``)."""
    places = [src] if dirs == directories.ONE else [src / d for d in dirs]
    return [
        p
        for place in places
        if place.is_dir()
        for p in sorted(place.iterdir())
        if p.suffix in (".safetensors", ".bin") and p.is_file()
    ]


def _tensors(src: Path) -> dict[str, Any]:
    if (src / st.INDEX).exists() or (src / st.SINGLE).exists():
        return dict(st.read_directory(src))
    found = read_bin_directory(src)
    if not found:
        raise UsageError(
            src, "has no model.safetensors(.index.json) or pytorch_model.bin(.index.json)"
        )
    return dict(found)


@dataclass(eq=False, slots=True)
class Built(DataSource):
    """A CS tensor built from HF tensors when the writer reads it, which it does once: the
    rule it is built by and the reader of its inputs are then let go (kept until the checkpoint
    was read back, at 150k tensors they and the safetensors entries they reach were about 130
    MB, issue 33)."""

    out: Out | None
    stored: Callable[[str], np.ndarray] | None  # an HF tensor by name (one LastRead for all)
    src_dtype: str
    dtype: str
    name: str = ""

    def read(self) -> np.ndarray:
        out, stored = self.out, self.stored
        if out is None or stored is None:
            raise RuntimeError(f"{self.name}: built once, and already written")
        array = cast(build_one(out, stored), self.src_dtype, self.dtype)
        self.name, self.out, self.stored = out.name, None, None
        return array

    def describe(self) -> str:
        if self.out is None:
            return f"{self.name}, built and written"
        return f"{self.out.name} from {', '.join(self.out.inputs) or 'nothing'}"


def _model_tree(plan, stored, shapes, kinds, dtype, rel, family) -> DictNode:
    """The ``model`` state: one lazy leaf per output; outputs that are the same input renamed
    share one leaf (a tie, as a tied model's state dict has it)."""
    node = DictNode()
    read = LastRead(lambda name: stored[name].read())
    same: dict[tuple[str, ...], TensorLeaf] = {}
    for o in plan:
        kind = kinds[o.name]
        target = (dtype or kind) if kind in ("float32", "float16", "bfloat16") else kind
        key = o.inputs if o.build is identity and o.inputs else None
        leaf = same.get(key) if key else None
        if leaf is None:
            data = Built(o, read, kind, target)
            leaf = TensorLeaf(target, shapes[o.name], data)
            if key:
                same[key] = leaf
        node.items.append((_spelling(o.name, rel, family), leaf))
    return node


# 2.0 spells the 2.1 position-embedding renames the other way (the hop's own tables, inverted)
_BEFORE_2_1 = tuple(
    rule.inverse() for rule in (*v04.POSITION_EMBEDDING_RENAMES, *v04.POSITION_HELPER_RENAMES)
)


def _spelling(name: str, rel: releases.Release, family: str) -> str:
    """A 2.1+ model key as ``rel`` spells it: before 2.1 the position embeddings and helpers
    had their 2.0 names (the 2.0 -> 2.1 hop's ``KeyRename`` tables, undone)."""
    if rel.version >= releases.get("2.1").version:
        return name
    found = rename_for(name, [r for r in _BEFORE_2_1 if family in r.families])
    return found[0] if found else name


def write_config(cs_model: dict[str, Any], name: str, release: str, path: Path, force: bool):
    """A 2.0-layout ``params.yaml`` holding the model section, upgraded to ``release`` by the
    config hops (2.3+ get the trainer layout, 2.4+ the model name)."""
    data = yaml_edit.new_map([("model", yaml_edit.new_map(list(cs_model.items())))])
    text = yaml_edit.dump(data, yaml_edit.guess_style(""))
    text = upgrade_config_text(text, OLDEST, release, family=name).text
    with atomic_output(path, replace=force) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path
