"""One function per verb, plain arguments in, plain data out (like Alembic's ``command.py``).

``cli.main`` declares the options and prints; the scripts in ``scripts/`` call these too.
These are the read-side verbs and what the others share; the upgrade verbs' work is
``upgrades``, the conversions' ``conversions``, each loaded when one of its verbs runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import ckpt_migrate.torch as torch_api
from ckpt_migrate.cli import hop_inputs
from ckpt_migrate.config import yaml_edit
from ckpt_migrate.engine import plan as planner
from ckpt_migrate.engine.extents import METHODS, Choice
from ckpt_migrate.engine.plan import check as check_file
from ckpt_migrate.errors import UsageError
from ckpt_migrate.format import deep_check as deep
from ckpt_migrate.format import headercompare, outline, releases
from ckpt_migrate.format.compare import Comparison, compare_trees
from ckpt_migrate.format.deep_check import DeepReport
from ckpt_migrate.format.h5 import preflight
from ckpt_migrate.format.h5.identity import watch
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import tied_positions
from ckpt_migrate.hops import graph
from ckpt_migrate.models.detect import choose_family
from ckpt_migrate.models.names import resolve_name

if TYPE_CHECKING:
    from ckpt_migrate.format.progress import Progress
Verify = Literal["index", "full"]


# What ``inspect`` shows without --all: the first levels, a few entries per container.
SUMMARY_DEPTH = 3
SUMMARY_CHILDREN = 8


def inspect(
    path: str | Path,
    *,
    everything: bool = True,
    depth: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """``everything``: the whole outline; else a summary (``depth`` levels, default
    SUMMARY_DEPTH, and SUMMARY_CHILDREN entries per container unless a depth is given).

    A file is read from its root and its links (``read_outline``, issue 33), its datasets not
    opened: in format 0.5 each leaf as its metadata declares it, in a legacy format as its
    dataset's header describes it (``h5.headerfacts``); a file the outline does not answer is
    read in full."""
    if depth is not None and depth < 0:
        raise UsageError(None, f"--depth must be 0 or more, not {depth}")
    with read_checkpoint(path, outline=True, legacy_outline=True, progress=progress) as ckpt:
        ties = tied_positions(ckpt.root)
        data = outline.report(ckpt, leaves=everything, ties=ties)
        data["outline_summary"] = not everything
        if everything:
            data["outline"] = outline.outline_lines(ckpt.root, ties=ties)
        else:
            data["outline"] = outline.outline_lines(
                ckpt.root,
                max_depth=SUMMARY_DEPTH if depth is None else depth,
                max_children=SUMMARY_CHILDREN if depth is None else None,
                ties=ties,
            )
    return data


def to_torch(
    src: str | Path,
    dst: str | Path,
    *,
    allow_missing: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    notes: list[str] = []
    out = torch_api.to_torch(src, dst, allow_missing=allow_missing, progress=progress, notes=notes)
    return {"source": str(src), "output": str(out), "notes": notes}


def from_torch(
    src: str | Path,
    dst: str | Path,
    release: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    rep = torch_api.from_torch(src, dst, release, progress)
    return {
        "source": str(src),
        "output": str(rep.path),
        "release": rep.release.name,
        "format": rep.release.format,
        "tensors": rep.tensors,
        "tensor_bytes": rep.tensor_bytes,
        "notes": rep.notes,
    }


def history() -> dict[str, Any]:
    g = graph.load()
    return {
        "releases": [
            {"name": r.name, "format": r.format, "spec": r.spec_encoding, "type_tags": r.type_tags}
            for r in releases.RELEASES
        ],
        "newest": g.newest,
        "hops": [h.to_json() for h in g.hops],
    }


def plan(
    path: str | Path,
    target: str = "latest",
    source_release: str | None = None,
    output_dir: Path | None = None,
    inputs: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The hops, the family and the disk an upgrade costs: where the hops edit only a format
    0.5 file's root (or it is current), from the root and the spec (``plan_from_root``: the
    leaves' metadata unread, ``tensor_bytes`` None); else from the outline (``read_outline``,
    a legacy file's too) unless the bytes to write depend on what the datasets store and the
    outline did not measure them."""
    model = (inputs or {}).get("model")
    found = planner.plan_from_root(
        Path(path),
        target,
        release=source_release,
        output_dir=output_dir,
        inputs=inputs,
    )
    if found is not None:
        made, outline = found
        data = made.to_json()
        data["model"] = choose_family(outline.root, model).to_json()
        reading = outline.detected.reading
        data["warnings"] = [] if reading is None else [reading]
        return data
    ckpt, made = planner.read_planned(
        Path(path),
        target,
        release=source_release,
        legacy_outline=True,
        output_dir=output_dir,
        inputs=inputs,
        progress=progress,
    )
    with ckpt:
        data = made.to_json()
        data["model"] = choose_family(ckpt.root, model).to_json()
        data["warnings"] = list(ckpt.warnings)
        return data


def check(path: str | Path, target: str = "latest", source_release: str | None = None) -> dict:
    return check_file(path, target, source_release)


def deep_check(path: str | Path, progress: Progress | None = None) -> DeepReport:
    """``check --deep``: every tensor decoded; the report names each damaged one."""
    return deep.deep_check(path, progress)


def check_copy_method(method: str) -> Choice:
    if method not in METHODS:
        raise UsageError(None, f"--copy-method must be auto, clone or copy, not {method!r}")
    return method  # type: ignore[return-value]


def check_verify(verify: str) -> Verify:
    if verify not in ("index", "full"):
        raise UsageError(None, f"--verify must be index or full, not {verify!r}")
    return verify  # type: ignore[return-value]


def verify(
    a: str | Path, b: str | Path, *, allclose: bool = False, progress: Progress | None = None
) -> dict[str, Any]:
    found = None if allclose else headercompare.compare(Path(a), Path(b), progress)
    if found is None:
        found = _verify_walked(Path(a), Path(b), allclose, progress)
    return {
        "left": str(a),
        "right": str(b),
        "tensors_compared": found.tensors,
        "tensors_equal_as_stored": found.stored,  # (neither decoded: ``compare_trees``)
        "identical": not found.differences,
        "differences": [{"name": d.name, "what": d.what} for d in found.differences],
    }


def _verify_walked(a: Path, b: Path, allclose: bool, progress: Progress | None) -> Comparison:
    """``verify`` through HDF5, every dataset of both files tried by the preflight walk first:
    where the headers do not answer (``headercompare``), and with ``--allclose``."""
    # (each tree is read while the preflight walks its chunk indexes; a tensor read waits).
    # The second file's walk begins first: its children, forked once the first tree was
    # built, held it too (311 MiB at 150k tensors, the peak of the command, issue 33). The
    # first file's map of overlapping data is made before the second tree is read, not beside
    # it (290 -> 284 MiB).
    begun = preflight.start(b)
    try:
        with read_checkpoint(a, defer_chunks=True, progress=progress) as left:
            left.ready_to_read()
            with read_checkpoint(b, defer_chunks=True, progress=progress) as right:
                right.ready_to_read()  # (its walk's end and map said, not waited on)
                # (each file as it was once opened: a verdict on a file written meanwhile is
                # on neither version)
                unchanged = watch(a, b, voids="the comparison does not hold")
                found = compare_trees(left.root, right.root, allclose=allclose, progress=progress)
                unchanged()
    finally:
        preflight.cancel_started(begun)  # (the first file refused: the second's walk ends)
    return found


def step_inputs(
    given: dict[str, Any] | None = None, *, config: Path | None = None, model: str | None = None
) -> dict[str, Any]:
    """The extra inputs hops may use, as the engine takes them (only those given): the hops'
    own options (``given``, checked by ``hop_inputs.to_inputs``), the run's config and the
    model family."""
    inputs = hop_inputs.to_inputs(given or {})
    if model is not None:
        resolve_name(model)  # an unknown name fails here, before any file is read
        inputs["model"] = model
    if config is not None:
        inputs["config"] = load_config(config)
    return inputs


def load_config(path: Path) -> dict[str, Any]:
    """A run's params.yaml as plain data, for the hops' inputs."""
    data, _ = yaml_edit.load(yaml_edit.read_config(path), path)
    return yaml_edit.plain(data)
