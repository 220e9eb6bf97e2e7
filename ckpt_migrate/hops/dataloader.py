"""The 1.9 dataloader side files, and the 2.0 ``dataloader`` state built from them.

MODELZOO_HISTORY.md §2: 1.9 kept ``data_iter_checkpoint_state_file_global`` (first line: the data
step) and one ``data_iter_state_file_worker_<id>_step_<step>.txt`` per worker and step (first line:
samples that worker streamed). 2.0 keeps ``checkpoint["dataloader"]``: map-style
``{samples_streamed, seed}``, iterable-style ``{all_worker_states: [{samples_streamed,
shard_index}, ...]}`` sorted by shard. Where the old converter was silent (a zero when files
were missing, a crash on ``notes.txt``, no cross-checks) this module refuses with a reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_migrate.errors import CkptIOError, CorruptCheckpointError, UsageError
from ckpt_migrate.format.tree import DictNode, SeqNode, ValueLeaf, int_value
from ckpt_migrate.hops.hop import StepContext

# Releases that wrote no side files: the release notes date deterministic dataloader
# checkpointing to 1.8.0 (MODELZOO_HISTORY.md §2.1 and its release-notes table).
RELEASES_WITHOUT_SIDE_FILES = ("1.7",)

GLOBAL_FILE = "data_iter_checkpoint_state_file_global"
WORKER_FILE = re.compile(r"^data_iter_state_file_worker_(\d+)_step_(\d+)\.txt$")


@dataclass
class SideFiles:
    directory: Path
    data_step: int
    samples: dict[int, int]  # worker id -> samples streamed at the data step
    ignored: list[str] = field(default_factory=list)  # names that are not side files
    other_steps: int = 0  # worker files of earlier checkpoints (they accumulate)
    steps: set[int] = field(default_factory=set)  # every step some worker file is for

    @property
    def total(self) -> int:
        return sum(self.samples.values())


def _first_int(path: Path) -> int:
    """The step or sample count on the file's first line: a count, 0 to 2**63 - 1 (the
    int64 the 2.0 state keeps it in; a negative one was written as it was)."""
    try:
        with path.open(encoding="utf-8") as fh:
            value = int(fh.readline(64).strip())  # (the file may be anything: one line read)
        if not 0 <= value < 1 << 63:
            raise ValueError(value)
        return value
    except (UnicodeDecodeError, ValueError):
        raise CorruptCheckpointError(
            path,
            "first line is not a count (an integer, 0 or more)",
            "is this a 1.9 dataloader state file?",
        ) from None
    except OSError as exc:  # (not what it holds: that it cannot be read, e.g. its permissions)
        raise CkptIOError.reading(path, exc) from None


def _listed(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:8])) + (f" and {len(ids) - 8:,} more" if len(ids) > 8 else "")


def read_side_files(directory: str | Path, at_step: int | None = None) -> SideFiles:
    """The side files of the global file's data step, or of ``at_step``: worker files pile up
    one set per checkpoint, so an older checkpoint's step has its own (``upgrade-dir``)."""
    d = Path(directory)
    if not d.is_dir():
        raise UsageError(d, "is not a directory", "pass the 1.9 save_iter_state_path directory")
    global_file = d / GLOBAL_FILE
    if not global_file.is_file():
        raise UsageError(d, f"has no {GLOBAL_FILE}", "pass the 1.9 save_iter_state_path directory")
    data_step = _first_int(global_file) if at_step is None else at_step
    steps: set[int] = set()
    found: dict[int, list[str]] = {}
    ignored: list[str] = []
    other = 0
    for entry in sorted(d.iterdir()):
        if entry.name == GLOBAL_FILE:
            continue
        m = WORKER_FILE.match(entry.name)
        if m is None or not entry.is_file():
            ignored.append(entry.name)
            continue
        steps.add(int(m.group(2)))
        if int(m.group(2)) != data_step:
            other += 1
            continue
        found.setdefault(int(m.group(1)), []).append(entry.name)
    if not found:
        raise UsageError(
            d,
            f"no worker file for data step {data_step} "
            f"(data_iter_state_file_worker_<id>_step_{data_step}.txt)",
            "the files of that step were pruned or the directory is wrong",
        )
    dupes = {wid: names for wid, names in found.items() if len(names) > 1}
    if dupes:
        wid, names = sorted(dupes.items())[0]
        raise UsageError(
            d,
            f"worker {wid} has {len(names)} files for step {data_step}: " + ", ".join(names),
            "remove the stray copies",
        )
    gaps = max(found) + 1 - len(found)
    if gaps:
        # (the first eight gaps lie below len(found) + 8; a stray file's id may be 10**10)
        first = [w for w in range(min(max(found), len(found) + 8)) if w not in found][:8]
        more = f" and {gaps - len(first):,} more" if gaps > len(first) else ""
        raise UsageError(
            d,
            f"no file for worker(s) {', '.join(map(str, first))}{more} at step {data_step} "
            f"(found workers {_listed(sorted(found))})",
            "every worker 0..N-1 must have exactly one file",
        )
    samples = {wid: _first_int(d / names[0]) for wid, names in found.items()}
    return SideFiles(d, data_step, samples, ignored, other, steps)


def build_state(side: SideFiles, dataloader_type: str, seed: int | None) -> DictNode:
    if dataloader_type == "map":
        if seed is None:
            raise UsageError(
                None,
                "a map-style dataloader state needs the shuffle seed",
                "pass --shuffle-seed (or --config with train_input.shuffle_seed)",
            )
        return DictNode([("samples_streamed", ValueLeaf(side.total)), ("seed", ValueLeaf(seed))])
    if dataloader_type == "iterable":
        workers = [
            DictNode([("samples_streamed", ValueLeaf(n)), ("shard_index", ValueLeaf(wid))])
            for wid, n in sorted(side.samples.items())
        ]
        return DictNode([("all_worker_states", SeqNode("list", workers))])
    raise UsageError(None, f"unknown dataloader type {dataloader_type!r}", "use map or iterable")


def without_side_files(
    source_release: str | None, path: Path | None, drop: bool, deferred: str | None = None
) -> str | None:
    """An upgrade through 2.0 without side files: nothing to say for a release that wrote none
    (None); else losing the state is refused unless ``drop`` (``--drop-dataloader-state``)
    asks for it by name, or ``deferred`` names the step that converts the side files later (a
    Model Zoo script's documented workflow: ``fix_checkpoint_spec.py`` first, then
    ``data_iter_state_conversion.py``), and the change to report is returned."""
    if source_release in RELEASES_WITHOUT_SIDE_FILES:
        return None
    release = source_release or "1.x"
    if deferred and not drop:
        return (
            f"dataloader state not converted: release {release} kept it in side files; {deferred}"
        )
    if not drop:
        raise UsageError(
            path,
            f"release {release} kept the dataloader state in side files and no "
            "--data-iter-dir was given: the upgraded checkpoint would have no dataloader state, "
            "so training would restart from the first sample",
            "pass --data-iter-dir DIR --dataloader-type map|iterable, or "
            "--drop-dataloader-state to upgrade without it",
        )
    return (
        "dataloader state dropped (--drop-dataloader-state): training will restart from the "
        "first sample"
    )


def convert_dataloader_state(ctx: StepContext) -> None:
    """Build the 2.0 ``dataloader`` state from the 1.8/1.9 side files.

    1.8 and 1.9 kept dataloader progress in ``data_iter_checkpoint_state_file_global`` and
    ``data_iter_state_file_worker_<id>_step_<step>.txt``; 2.0 reads ``checkpoint["dataloader"]``.
    Only exact file names count, every worker 0..N-1 needs one file, the data step must equal
    ``global_step`` (unless ``--allow-step-mismatch``; an older checkpoint takes the worker files
    of its own step when they are there), and a map-style seed is never guessed. Without side
    files the state would be lost (training restarts from the first sample), so that is refused
    unless ``--drop-dataloader-state`` says so; a 1.7 file had no side files (the release notes
    date them to 1.8.0) and has nothing to lose.
    Source: ``c1ef453:modelzoo/compat/data_iter_state_conversion.py``, MODELZOO_HISTORY.md §2,
    §2.1 and the release-notes table (1.8.0: deterministic dataloader checkpointing).
    """
    directory = ctx.inputs.get("data_iter_dir")
    if not isinstance(ctx.root, DictNode):
        return
    if directory is None:
        if ctx.root.get("dataloader") is not None:
            return
        dropped = without_side_files(
            ctx.inputs.get("source_release"),
            ctx.source_path,
            bool(ctx.inputs.get("drop_dataloader_state")),
            ctx.inputs.get("dataloader_state_deferred"),
        )
        if dropped:
            ctx.changed(dropped)
        return
    kind = ctx.inputs.get("dataloader_type")
    if kind not in ("map", "iterable"):
        raise UsageError(None, "--data-iter-dir needs --dataloader-type map or iterable")
    if ctx.root.get("dataloader") is not None:
        raise UsageError(
            ctx.source_path,
            "already has a dataloader state; it needs no side files",
            "use it as it is (ckpt-migrate upgrade: without --data-iter-dir)",
        )
    side = read_side_files(directory)
    for name in side.ignored:
        ctx.warn(f"{side.directory}/{name}: not a dataloader side file; ignored")
    step = int_value(ctx.root.get("global_step"))
    if step is not None and step != side.data_step and step in side.steps:
        side = read_side_files(directory, at_step=step)  # an older checkpoint's own files
    if step is not None and step != side.data_step:
        message = f"dataloader files are for step {side.data_step}, the checkpoint is at {step}"
        if not ctx.inputs.get("allow_step_mismatch"):  # (named: one of a run's checkpoints)
            raise UsageError(
                ctx.source_path,
                f"the dataloader side files in {side.directory} are for step {side.data_step}, "
                f"the checkpoint is at {step} and none there are of its step",
                f"add the worker files of step {step} there, or pass --allow-step-mismatch to "
                f"attach step {side.data_step}'s state (in upgrade-dir: to every checkpoint "
                "without files of its own step)",
            )
        ctx.warn(message)
    seed = _seed(ctx) if kind == "map" else None
    if seed is None and kind == "map" and ctx.inputs.get("default_shuffle_seed") is not None:
        seed = int(ctx.inputs["default_shuffle_seed"])
        ctx.warn(
            f"map-style seed {seed} assumed (the documented default; neither a seed nor a "
            "config with train_input.shuffle_seed was given): a shuffled run with another seed "
            "is refused by 2.0 at load, so pass the run's seed if it had one"
        )
    ctx.root.set("dataloader", build_state(side, kind, seed))
    ctx.changed(
        f"dataloader: {kind}-style state from {len(side.samples)} worker file(s) of step "
        f"{side.data_step}, {side.total} samples streamed"
        + (f", seed {seed}" if seed is not None else "")
    )


def _config_seed(value: Any) -> int:
    """The config's ``train_input.shuffle_seed`` as the integer Model Zoo seeds its sampler with
    (``2.0`` is 2); a string, a list, ``true`` or ``1.5`` is refused, never truncated."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise UsageError(
        None,
        f"--config: train_input.shuffle_seed is {value!r}, not an integer",
        "fix the config, or pass --shuffle-seed",
    )


def _seed(ctx: StepContext) -> int | None:
    if ctx.inputs.get("shuffle_seed") is not None:
        return int(ctx.inputs["shuffle_seed"])
    config = ctx.inputs.get("config")
    train = config.get("train_input") if isinstance(config, dict) else None
    if isinstance(train, dict):
        if train.get("shuffle_seed") is not None:
            return _config_seed(train["shuffle_seed"])
        if not train.get("shuffle", True):
            return 0  # the seed is not checked when shuffling is off
    return None
