"""Export a Cerebras checkpoint of any release (1.7 ... 2.10) to a Hugging Face directory.

The checkpoint is read lazily and brought to the newest release *in memory* (``apply_hops``:
no file is written), its ``model`` state is mapped by the family's plan, and the HF tensors are
streamed into safetensors shards one at a time, so peak memory stays near the largest tensor
(two for a fused output: its inputs and the result). The directory is written beside its
target, every file read back and checked, fsynced, then renamed into place.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ckpt_migrate import catalogue
from ckpt_migrate.atomic import refuse_object_address
from ckpt_migrate.config import yaml_edit
from ckpt_migrate.config.context import ConfigContext
from ckpt_migrate.config.upgrade import config_release, upgrade_config_text
from ckpt_migrate.engine.plan import make_plan
from ckpt_migrate.engine.upgrade import UpgradeOptions, apply_hops
from ckpt_migrate.errors import MissingLeavesError, UnsupportedContentError, UsageError, require
from ckpt_migrate.format import provenance, releases
from ckpt_migrate.format.h5.identity import watch
from ckpt_migrate.format.h5.io import check_file
from ckpt_migrate.format.progress import Progress
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import DictNode, H5Data, MissingLeaf, TensorLeaf, iter_leaves
from ckpt_migrate.hf import absent, directories, families, mup, unconverted
from ckpt_migrate.hf import safetensors_io as st
from ckpt_migrate.hf.arrays import LastRead, cast, check_dtype, out_dtype, shapes_of
from ckpt_migrate.hf.mapping import MappingError, build_one, missing_inputs, unused_inputs
from ckpt_migrate.hf.outdir import atomic_dir, check_output_dir
from ckpt_migrate.hf.rules import (
    canonical_name,
    check_layer_counts,
    family_for,
    mapping_failed,
    plain,
    refuse_unused,
    strip_model_prefix,
)
from ckpt_migrate.hops import graph
from ckpt_migrate.models.detect import choose_family
from ckpt_migrate.models.names import resolve_name


@dataclass
class ExportResult:
    source: Path
    output: Path
    model: str
    from_release: str
    files: list[str] = field(default_factory=list)
    tensors: int = 0
    bytes: int = 0
    shards: int = 0
    dropped: dict[str, str] = field(default_factory=dict)  # CS tensor -> why not exported
    missing: dict[str, str] = field(default_factory=dict)  # CS tensor absent -> what stands in
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return plain(self)


def export(
    checkpoint: str | Path,
    output_dir: str | Path,
    *,
    model: str | None = None,
    config: str | Path | None = None,
    shard_size: int | str = st.DEFAULT_SHARD_SIZE,
    dtype: str | None = None,
    force: bool = False,
    drop_unmatched_keys: bool = False,
    allow_missing_tensors: bool = False,
    source_release: str | None = None,
    inputs: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> ExportResult:
    """Write the HF directory ``output_dir`` (``config.json`` + safetensors) of ``checkpoint``.

    ``model``: a Model Zoo model name (default: detected from the keys). ``config``: the run's
    ``params.yaml`` (needed for ``config.json``). ``dtype``: cast floating tensors (float32,
    float16, bfloat16). ``drop_unmatched_keys``: leave out CS model tensors the family's rules
    do not convert instead of refusing. ``allow_missing_tensors``: export a file that lacks
    tensors Model Zoo's own import leaves out even where the HF model is then not usable
    (``hf/absent.py``). ``inputs``: extra hop inputs (the dataloader state is dropped: an HF
    model has none)."""
    start = time.monotonic()
    src, out = Path(checkpoint), Path(output_dir)
    refuse_object_address(src)  # (before the config it would ask for)
    check_file(src)  # (a model directory: named before the config is asked for)
    check_dtype(dtype)
    max_shard = st.parse_size(shard_size)
    check_output_dir(out, force)
    if config is None:
        beside = src.parent / "params.yaml"  # (where Model Zoo's runs keep it)
        shown = beside if beside.is_file() else "params.yaml"
        raise UsageError(src, "config.json needs the run's model config", f"pass --config {shown}")
    config_text = yaml_edit.read_config(Path(config))
    _loaded_first(config_text, Path(config))
    # (the hops and the mapping's plan are made while the preflight walks the chunk indexes;
    # the first tensor read waits for its verdict)
    with read_checkpoint(src, release=source_release, defer_chunks=True, progress=progress) as ckpt:
        unchanged = watch(src)  # (called before publishing)
        plan_ = make_plan(ckpt, releases.LATEST.name)
        opts = UpgradeOptions(
            target=releases.LATEST.name,
            allow_missing=True,
            # an HF model has no dataloader or optimizer state to keep
            inputs={
                "drop_dataloader_state": True,
                "drop_orphan_sparsity": True,
                **(inputs or {}),
            },
        )
        family = choose_family(ckpt.root, model)
        ctx = apply_hops(ckpt, plan_, opts, family)
        name = canonical_name(model or _detected_name(family, src, config_text, Path(config)))
        module = family_for(name)
        leaves = [_model_leaves(ctx.root, src)]
        earlier = provenance.sources(ckpt.provenance) or ()
        config_from, why = config_release(
            config_text, plan_.source_release.name, earlier, family=name, source=Path(config)
        )
        cs_model = model_config(config_text, Path(config), config_from, name)
        result = ExportResult(src, out, name, plan_.source_release.name)
        result.warnings += ckpt.warnings + ctx.warnings + [f"{config}: {why}"] * bool(why)
        # Only the model's tensors go on: the trees are let go of before the mapping's plan
        # is made and the shards written (their containers and every other leaf, issue 33)
        ckpt.root = ctx.root = DictNode([])
        del ctx
        ckpt.ready_to_read()  # (at the first tensor read, beside the plan: 25 MiB more at 150k)
        _export(
            module,
            name,
            leaves.pop(),  # handed over: this frame must not hold them while the files are checked
            cs_model,
            out,
            max_shard,
            dtype,
            force,
            drop_unmatched_keys,
            result,
            progress,
            allow_missing=allow_missing_tensors,
            unchanged=unchanged,
        )
    result.seconds = round(time.monotonic() - start, 3)
    return result


def _loaded_first(config_text: str, config: Path) -> None:
    """The code the export runs, loaded before the source is read: the hops, every family's
    rules, the YAML reader and ``safetensors`` (for the read-back). Loaded amid a 150k-tensor
    tree, their objects stayed in the tree's memory once it was let go of, and Python could
    not give it back (issue 33). So a malformed config, or a missing ``hf`` extra, is refused
    before the source is opened."""
    graph.load()
    families.modules()
    yaml_edit.load(config_text, config)
    require("safetensors", "hf")


# Cerebras checkpoints of these models have the same keys while their Hugging Face layouts
# differ (Model Zoo: gptj_hf_cs.py / salesforce_codegen_hf_cs.py, gpt_neox_hf_cs.py / falcon.py,
# llama.py / mistral.py, bert.py / roberta.py), so the keys alone cannot choose the mapping.
_SAME_KEYS = tuple((r.same_keys_as, r.name) for r in catalogue.RECORDS if r.same_keys_as)


def _detected_name(family: Any, src: Path, config_text: str, config: Path) -> str:
    """The model the config names (its registry name, where that is one family's and the keys
    fit that family's CS layout: StarCoder's keys are GPT-2's, ESM-2's are BERT's), else the
    one the keys tell; never a guess between two Hugging Face layouts."""
    named = _config_model_name(config_text, config)
    by_name = [
        r
        for r in catalogue.RECORDS
        if r.hf is not None and any(n.registry == named and not n.alias_of for n in r.names)
    ]
    if named is not None and len(by_name) == 1:
        layouts = {r.name: r.layout for r in catalogue.RECORDS}
        if family.family is None or by_name[0].layout in (None, layouts.get(family.family)):
            return by_name[0].name
    if family.family is None:
        raise UsageError(
            src, f"cannot tell the model from its keys ({family.describe()})", "pass --model"
        )
    group = next((g for g in _SAME_KEYS if family.family in g), None)
    if group is None:
        return family.family
    fitting = [n for n in group if named is not None and resolve_name(n)[1] == named]
    if len(fitting) == 1:
        return fitting[0]
    raise UsageError(
        src,
        f"the keys are those of {group[0]} and of {group[1]}, whose Hugging Face layouts differ",
        f"pass --model {group[0]} or --model {group[1]}",
    )


def _config_model_name(text: str, path: Path) -> str | None:
    """The registry name a 2.4+ config gives its model (``trainer.init.model.name``)."""
    data, _ = yaml_edit.load(text, path)
    names = {str(m["name"]) for _, m in ConfigContext(data).model_sections() if "name" in m}
    return names.pop() if len(names) == 1 else None


def _model_leaves(root: Any, src: Path) -> dict[str, TensorLeaf]:
    """The ``model`` state's tensors by bare CS name (no ``model.`` prefix)."""
    model = root.get("model") if hasattr(root, "get") else None
    if model is None:
        raise UnsupportedContentError(src, "has no model state")
    refs = {r.name: r.leaf for r in iter_leaves(model)}
    out = {}
    for bare, stored in strip_model_prefix(list(refs)).items():
        leaf = refs[stored]
        if isinstance(leaf, MissingLeaf):
            raise MissingLeavesError(src, f"model tensor {stored} has no data")
        if isinstance(leaf, TensorLeaf):
            out[bare] = leaf
    return out


def model_config(text: str, path: Path, from_release: str, name: str) -> dict[str, Any]:
    """The ``model:`` section of the config brought to the newest release (either layout)."""
    upgraded = upgrade_config_text(
        text, from_release, releases.LATEST.name, family=name, source=path
    )
    data, _ = yaml_edit.load(upgraded.text, path)
    sections = ConfigContext(data).model_sections()
    if len(sections) != 1:
        raise UsageError(
            path,
            f"has {len(sections)} model sections (a mapping under model:), not one",
            "pass the params.yaml of the run that wrote the checkpoint",
        )
    return dict(yaml_edit.plain(sections[0][1]))


def _export(
    module, name, leaves, cs_model, out, max_shard, dtype, force, drop, result, progress,
    *, allow_missing: bool = False, unchanged: Callable[[], None] = lambda: None,
):  # fmt: skip
    src = result.source
    try:
        stand = absent.stand_ins(leaves, cs_model, name)
        # muP -> sP next: the family maps a standard-parametrisation model (hf/mup.py)
        cs_model, leaves = mup.to_sp(cs_model, {**leaves, **stand.leaves}, name)
    except MappingError as exc:
        raise mapping_failed(src, exc) from None
    shapes = {n: tuple(leaf.shape) for n, leaf in leaves.items()}
    dtypes = {n: leaf.dtype for n, leaf in leaves.items()}
    check_layer_counts(src, cs_model, len(shapes))
    try:
        hf_config = module.config_to_hf(cs_model, name)
        dirs = directories.of(module, name)
        plan = directories.grouped(module.plan_to_hf(shapes, cs_model, name), dirs)
        plan, result.missing = absent.apply(plan, stand, src, allow_missing)
        missing = missing_inputs(plan, shapes)
        if missing:
            raise MappingError(f"model tensors the {name} rules need are missing: {missing[:3]}")
        ties = unconverted.cs_ties(shapes, cs_model, name)
        ties = {c: o for c, o in ties.items() if c not in stand.names}
        dropped = unconverted.cs_dropped(shapes, cs_model, name)
        skip = {*ties, *dropped, *stand.names}
        unused = [n for n in unused_inputs(plan, shapes) if n not in skip]
        refuse_unused(src, unused, name, drop, "model tensor")
        dropped.update({n: "not converted (--drop-unmatched-keys)" for n in unused})
        out_shapes = shapes_of(plan, shapes)
        entries = [st.Entry(o.name, _stored(o, dtypes, dtype), out_shapes[o.name]) for o in plan]
    except MappingError as exc:
        raise mapping_failed(src, exc) from None
    result.dropped = dropped
    result.warnings += [f"{n} left out: {why}" for n, why in dropped.items()]
    tied = {n: leaves[n] for pair in ties.items() for n in pair}
    digests: dict[str, str] = {}
    # (the writer takes ``entries``: the generator reads its own list of them)
    built = _built(plan, entries[:], leaves, dtypes, ties, digests, src, progress)
    # the generator alone holds the plan and the sources now, and lets go of them once the
    # last tensor is written, before the files are read back (issue 33)
    del plan, leaves, dtypes, shapes, out_shapes, stand
    with atomic_dir(out, force=force, like=src) as tmp:
        written = directories.write(
            tmp, dirs, hf_config, entries, built, max_shard, _main_dtype,
            lambda: _check_ties(src, ties, tied, digests),
        )  # fmt: skip
        unchanged()  # (the source read whole: no part of the output from another version)
    result.files = sorted(written.files)
    result.tensors, result.bytes = written.tensors, written.total_size
    result.shards = sum(f.endswith(".safetensors") for f in written.files)


_FLOATS = ("float32", "float16", "bfloat16")


def _stored(o: Any, dtypes: dict[str, str], dtype: str | None) -> str:
    """The dtype output ``o`` is written in: its inputs', a float one cast to ``dtype``."""
    kind = out_dtype(o.inputs, dtypes, o.dtype or "float32")
    return (dtype or kind) if kind in _FLOATS else kind


def _built(
    plan: list[Any],
    entries: list[st.Entry],
    leaves: dict[str, TensorLeaf],
    dtypes: dict[str, str],
    ties: dict[str, str],
    digests: dict[str, str],
    src: Path,
    progress: Progress | None,
) -> Iterator[tuple[str, np.ndarray]]:
    """The HF tensors in the plan's order, one at a time; an original of a tie is hashed as it
    is read, for ``_check_ties``."""
    tie_sources = {v for k, v in ties.items() if leaves[k] is not leaves[v]}

    def read_leaf(n: str) -> np.ndarray:
        array = leaves[n].data.read()
        if n in tie_sources:
            digests[n] = _digest(array)
        return array

    read = LastRead(read_leaf)
    done, total = 0, sum(e.nbytes for e in entries)
    for i, (o, e) in enumerate(zip(plan, entries), 1):
        try:
            array = cast(
                build_one(o, read), out_dtype(o.inputs, dtypes, o.dtype or "float32"), e.dtype
            )
        except MappingError as exc:
            raise mapping_failed(src, exc) from None
        if i == len(plan):
            _let_go_of_sources(leaves)
        yield o.name, array
        del array  # before the next output is built
        done += e.nbytes
        if progress is not None:
            progress("export", done, total)


def _let_go_of_sources(leaves: dict[str, TensorLeaf]) -> None:
    """Every tensor read: the source's file is closed while the shards are read back (its
    HDF5 caches were 25 MiB of a 112k-tensor export's peak, issue 33); a tie's check opens
    it again."""
    for handle in {x.data.handle for x in leaves.values() if isinstance(x.data, H5Data)}:
        handle.let_go()


def _digest(array: np.ndarray) -> str:
    return xxhash.xxh3_128_hexdigest(
        memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    )


def _check_ties(
    src: Path, ties: dict[str, str], leaves: dict[str, TensorLeaf], digests: dict[str, str]
) -> None:
    """A CS tensor the family says is a copy of another must be one (one tensor read at a
    time: the source's hash was taken while it was converted)."""
    for copy, original in ties.items():
        a, b = leaves[copy], leaves[original]
        if a is b:
            continue
        same = (a.dtype, a.shape) == (b.dtype, b.shape)
        if same:
            expected = digests.get(original) or _digest(b.data.read())
            same = _digest(a.data.read()) == expected
        if not same:
            raise UnsupportedContentError(
                src,
                f"model tensor {copy} differs from {original}, which the config says it is "
                "tied to (share_embedding_weights)",
                "set share_embedding_weights: false in the config if they are separate",
            )


def _main_dtype(entries: list[st.Entry]) -> str:
    sizes: dict[str, int] = {}
    for e in entries:
        sizes[e.dtype] = sizes.get(e.dtype, 0) + e.nbytes
    return max(sizes, key=lambda d: sizes[d]) if sizes else "float32"
