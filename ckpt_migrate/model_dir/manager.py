"""``CheckpointManager``: the Cerebras Trainer's checkpoint callbacks for plain PyTorch loops.

What the Model Zoo Trainer's ``Checkpoint``, ``SaveCheckpointState``, ``LoadCheckpointStates`` and
``KeepNCheckpoints`` callbacks do (MODELZOO_HISTORY.md §4), without a trainer and without their
flaws (§4.6):

* Saves are atomic and verified (the format core writes a temporary file, re-reads it, fsyncs it
  and links it into place); an existing name is never overwritten, not even by a save in the same
  second (the Trainer's save is neither atomic nor safe against that).
* The newest checkpoint is found from the file names alone (exact match of the pattern on the
  name), skipping temporary and incomplete files. There is no index file that can go stale (the
  Trainer's ``checkpoints_index.yaml`` misses checkpoints that were there before it).
* Which files a run saved is recorded *in each file*, in the root attribute
  ``__ckpt_migrate_run__`` (JSON: run id, kind, step, save index), which the real loader ignores
  like ``__ckpt_migrate__``. Retention therefore survives restarts and never touches files of
  other runs, copied-in or upgraded checkpoints (an upgrade does not carry the attribute over,
  so an upgraded file belongs to no run). It keeps the newest ``keep_last_n`` of each kind: full
  checkpoints and subset files (the Trainer's ``KeepNCheckpoints`` ignores subsets, which pile
  up).
* A save killed before it published its file leaves a temporary file; a manager removes those
  when it starts (``atomic.remove_stale_temporaries``: only files no live writer holds the lock
  of, so a save still running in another process keeps its file).
* Subset checkpoints are written from the state being saved: nothing is read back.
* Non-strict loading returns (and logs) the missing and unexpected keys instead of discarding them.

Checkpoints are written in the newest release's format unless ``release`` says otherwise.
torch is imported only when a state is saved or loaded.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ckpt_migrate.torch as torch_room
from ckpt_migrate._version import __version__
from ckpt_migrate.atomic import fsync_dir, made_directory, remove_stale_temporaries
from ckpt_migrate.errors import StateSelectionError, UsageError
from ckpt_migrate.format.tree import DictNode
from ckpt_migrate.format.write import resolve_release, write_checkpoint
from ckpt_migrate.model_dir.loading import (
    LoadedCheckpoint,
    is_meta,
    load_components,
    names,
    parse_states,
)
from ckpt_migrate.model_dir.names import DEFAULT_NAME, TEMP_SUFFIX, TIMESTAMP_FORMAT, NamePattern
from ckpt_migrate.model_dir.records import (
    RUN_ATTR,
    check_complete,
    newest_complete,
    read_run_record,
)

log = logging.getLogger(__name__)

SUBSET_NAME = "{states}_{ckpt}"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NAME_TRIES = 8  # the plain name, then timestamps one second apart
# atomic.temp_name: "<name>[.pre-R.bak].<8 hex>.tmp"
_TEMPORARY = re.compile(
    r"(?P<base>.+?)(?:\.pre-\d+\.\d+\.bak)?\.[0-9a-f]{8}" + re.escape(TEMP_SUFFIX)
)


@dataclass
class _Subset:
    k: int
    states: tuple[str, ...] | None  # None: all
    name: str


class CheckpointManager:
    """Save, find, prune and load the checkpoints of a run in ``directory``.

    ``steps``: the save cadence for ``should_save`` (None or 0: never). ``name``: the file name
    pattern, with exactly one ``{step}`` field. ``keep_last_n``: after each save, delete all but
    the newest n checkpoints this run saved, and all but the newest n subset files it saved.
    ``run_id``: names the run whose files this manager prunes; pass the same id after a restart
    to go on managing the files saved before it (the default, a fresh random id, never deletes
    files from an earlier process). ``release``: the release whose format to write (default:
    the newest). On start, temporary files of killed saves are removed (never a live writer's;
    ``removed_temporaries`` lists them).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        steps: int | None = None,
        name: str = DEFAULT_NAME,
        keep_last_n: int | None = None,
        run_id: str | None = None,
        release: str | None = None,
        pickle_objects: bool = False,
    ):
        self.directory = Path(directory)
        self.steps = _check_int("steps", steps, minimum=0)
        self.pattern = NamePattern(name)
        self.keep_last_n = _check_int("keep_last_n", keep_last_n, minimum=1)
        if run_id is None:
            run_id = uuid.uuid4().hex[:12]
        elif not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
            raise ValueError(
                f"run_id {run_id!r} must be 1-64 letters, digits, '.', '_' or '-' "
                "(starting with a letter or digit)"
            )
        self.run_id = run_id
        self.release = resolve_release(release)
        self.pickle_objects = pickle_objects
        self._subset: _Subset | None = None
        self._saves: int | None = None  # this run's save count, read from the directory once
        self._records: dict[str, tuple[tuple[int, int, int], dict[str, Any] | None]] = {}
        self.removed_temporaries = self.remove_stale_temporaries()

    def remove_stale_temporaries(self) -> list[Path]:
        """Remove the temporary files killed saves left in the directory (of names holding a
        checkpoint name: checkpoints and their subset files), never a live writer's; returns
        them. Run when the manager starts."""
        try:
            listing = os.listdir(self.directory)
        except OSError:
            return []
        bases = set()
        for entry in listing:
            m = _TEMPORARY.fullmatch(entry)
            if m is not None and self.pattern.regex.search(m.group("base")):
                bases.add(m.group("base"))
        removed = [
            p for base in sorted(bases) for p in remove_stale_temporaries(self.directory / base)
        ]
        for path in removed:
            log.info("removed %s, left by a killed save", path)
        return removed

    def __repr__(self) -> str:
        return (
            f"CheckpointManager({str(self.directory)!r}, name={self.pattern.pattern!r}, "
            f"steps={self.steps}, keep_last_n={self.keep_last_n}, run_id={self.run_id!r})"
        )

    # ----------------------------------------------------------------------- saving

    def should_save(self, step: int, *, final: bool = False) -> bool:
        """True at every multiple of ``steps`` (counted from step 0, so a resumed run saves at
        the same steps as an uninterrupted one) and, with ``final``, at the last step."""
        step = _check_step(step)
        if not self.steps:
            return False
        return final or (step > 0 and step % self.steps == 0)

    def save_states_every(
        self, k: int, states: str | Iterable[str] = ("model",), name: str = SUBSET_NAME
    ) -> CheckpointManager:
        """Every k-th save (and a save with ``final=True``) also writes a checkpoint holding
        only ``states`` (plus the ``__``-prefixed metadata keys), named from ``name`` with the
        fields ``{states}`` (the state names joined by ``_``) and ``{ckpt}`` (the full
        checkpoint's file name). It is written from the state being saved, not re-read."""
        k = _check_int("k", k, minimum=1)
        assert k is not None
        wanted = parse_states(states)
        fields = _format_fields(name)
        if sorted(fields) != ["ckpt", "states"]:
            raise ValueError(
                f"subset name {name!r} must have exactly the fields {{states}}, {{ckpt}}"
            )
        sample = name.format(states="_".join(wanted or ["all"]), ckpt=self.pattern.name(1))
        if "/" in sample or sample.startswith(".") or self.pattern.match(sample) is not None:
            raise ValueError(
                f"subset name {name!r} gives {sample!r}, which is not a plain file name distinct "
                f"from the checkpoint names {self.pattern.pattern!r}"
            )
        self._subset = _Subset(k, wanted, name)
        return self

    def save(self, state: Mapping[str, Any], step: int, *, final: bool = False) -> Path:
        """Write ``state`` (a dict of top-level states) as the checkpoint of ``step``; returns
        its path. Then writes the subset checkpoint if one is due and applies ``keep_last_n``."""
        step = _check_step(step)
        if not isinstance(state, dict):
            raise TypeError(
                f"state must be a dict of top-level states (model, optimizer, ...), "
                f"not {type(state).__name__}"
            )
        subset_states = self._subset_states(state) if self._subset is not None else None
        tree = torch_room.from_python(state, pickle_objects=self.pickle_objects)
        with made_directory(self.directory):  # (a first save that fails leaves none)
            index = self._save_count() + 1
            record = self._record_for("full", step, index)
            path = self._publish(tree, lambda ts: self.pattern.name(step, ts), record)
        self._saves = index
        log.info("saved %s", path)
        subset = None
        if self._subset is not None and (index % self._subset.k == 0 or final):
            assert subset_states is not None
            subset = self._save_subset(tree, path, subset_states, step, index)
        if self.keep_last_n is not None:
            self._prune(keep=path, keep_subset=subset)
        return path

    def _record_for(self, kind: str, step: int, index: int, **extra: Any) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "kind": kind,
            "step": step,
            "save_index": index,
            "saved_ns": time.time_ns(),
            "tool": f"ckpt-migrate {__version__}",
            **extra,
        }

    def _publish(self, tree: Any, name_for: Callable[[str | None], str], record: dict) -> Path:
        """Write ``tree`` under the first free name: the plain one, then ``_<timestamp>`` ones.

        The writer links its verified temporary file into place without clobbering, so a name
        taken meanwhile (another process, the same second) fails the write and the next
        timestamp, at least one second later, is tried: nothing is ever overwritten."""
        attrs = {RUN_ATTR: json.dumps(record)}
        stamp: str | None = None
        for attempt in range(_NAME_TRIES):
            if attempt:
                stamp = _timestamp_after(stamp)
            target = self.directory / name_for(stamp)
            if target.exists() or target.is_symlink():
                continue
            try:
                write_checkpoint(tree, target, self.release, extra_attrs=attrs)
            except UsageError:
                if not (target.exists() or target.is_symlink()):
                    raise  # not a name clash
                continue
            return target
        raise UsageError(
            self.directory / name_for(None),
            f"no free name after {_NAME_TRIES} tries (the name and timestamped ones are taken)",
            "is another process saving the same step in a loop?",
        )

    def _subset_states(self, state: dict) -> list[Any]:
        assert self._subset is not None
        if self._subset.states is None:
            return [k for k in state if not is_meta(k)]
        unknown = [s for s in self._subset.states if s not in state]
        if unknown:
            raise StateSelectionError(
                None,
                f"save_states_every: the state being saved has no {names(unknown)}; "
                f"it has: {names(state)}",
                "name states the saved dict has",
            )
        return list(self._subset.states)

    def _save_subset(self, tree: Any, full: Path, states: list[Any], step: int, index: int) -> Path:
        assert self._subset is not None
        keep = set(states)
        subset = DictNode(
            [(k, v) for k, v in tree.items if k in keep or is_meta(k)], ordered=tree.ordered
        )
        label = "_".join(str(s) for s in states) if self._subset.states is not None else "all"
        base = self._subset.name.format(states=label, ckpt=full.name)
        stem, dot, ext = base.rpartition(".") if "." in base else (base, "", "")
        record = self._record_for(
            "subset", step, index, states=[str(s) for s in states], of=full.name
        )

        def name_for(stamp: str | None) -> str:
            return base if stamp is None else f"{stem}_{stamp}{dot}{ext}"

        path = self._publish(subset, name_for, record)
        log.info("saved %s (states %s of %s)", path, label, full.name)
        return path

    # ----------------------------------------------------------------------- which files are ours

    def _record(self, path: Path) -> dict[str, Any] | None:
        """``read_run_record``, cached while the file's inode, size and mtime stay the same."""
        try:
            st = path.stat()
        except OSError:
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._records.get(path.name)
        if cached is not None and cached[0] == key:
            return cached[1]
        record = read_run_record(path)
        self._records[path.name] = (key, record)
        return record

    def _own(self, kind: str = "full") -> list[tuple[int, int, Path]]:
        """(save index, save time, path) of every file of ``kind`` ("full" or "subset") this
        run saved, oldest first."""
        mine = []
        if kind == "full":
            paths = [path for _, path in self.pattern.checkpoints(self.directory, symlinks=False)]
        else:
            paths = self._subset_candidates()
        for path in paths:
            rec = self._record(path)
            if rec is None or rec.get("run_id") != self.run_id or rec.get("kind") != kind:
                continue
            index, saved = rec.get("save_index"), rec.get("saved_ns")
            mine.append(
                (index if type(index) is int else 0, saved if type(saved) is int else 0, path)
            )
        mine.sort(key=lambda t: (t[0], t[1], t[2].name))
        return mine

    def _save_count(self) -> int:
        """Saves of this run so far; after a restart, taken from the files the run left."""
        if self._saves is None:
            own = self._own()
            self._saves = own[-1][0] if own else 0
        return self._saves

    def _subset_candidates(self) -> list[Path]:
        """Regular files that may be subset files: not checkpoint names, not temporaries."""
        try:
            entries = list(self.directory.iterdir())
        except OSError:
            return []
        return [
            p
            for p in entries
            if self.pattern.regex.search(p.name)  # a subset name holds its checkpoint's name
            and self.pattern.match(p.name) is None
            and _TEMPORARY.fullmatch(p.name) is None
            and not p.is_symlink()
            and p.is_file()
        ]

    def owned(self, kind: str = "full") -> list[Path]:
        """The files of ``kind`` ("full" checkpoints or "subset" files) this run (``run_id``)
        saved that are still there, oldest first."""
        return [path for _, _, path in self._own(kind)]

    def _prune(self, keep: Path, keep_subset: Path | None = None) -> None:
        assert self.keep_last_n is not None
        excess = []
        for kind in ("full", "subset"):
            own = self._own(kind)
            excess += own[: max(0, len(own) - self.keep_last_n)]
        for _, _, path in excess:
            if path in (keep, keep_subset):
                continue
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            self._records.pop(path.name, None)
            log.info("deleted %s (keep_last_n=%d)", path, self.keep_last_n)
        if excess:
            fsync_dir(self.directory)

    # ----------------------------------------------------------------------- finding

    def checkpoints(self) -> list[Path]:
        """Every file named by the pattern, oldest first by (step, timestamp); not checked."""
        return [path for _, path in self.pattern.checkpoints(self.directory)]

    def latest(self) -> Path | None:
        """The newest complete checkpoint: by step, then timestamp (a name without one is the
        oldest of its step), skipping temporary files, incomplete or unreadable files and
        subset files, and those removed meanwhile (``records.newest_complete``). None when
        there is none."""
        found = newest_complete(self.directory, self._newest_first, check_complete)
        return None if found is None else found[0]

    def _newest_first(self) -> Iterable[Path]:
        for _, path in reversed(self.pattern.checkpoints(self.directory)):
            record = self._record(path)
            if record is None or record.get("kind") != "subset":
                yield path

    def step_of(self, path: str | Path) -> int | None:
        """The step a checkpoint's name (or its run record) gives."""
        p = Path(path)
        m = self.pattern.match(p.name)
        if m is not None:
            return m.step
        record = self._record(p)
        step = None if record is None else record.get("step")
        return step if type(step) is int else None

    # ----------------------------------------------------------------------- loading

    def load_latest(self, **kwargs: Any) -> LoadedCheckpoint | None:
        """``load("latest", ...)``: None when the directory holds no complete checkpoint."""
        return self.load("latest", **kwargs)

    def load(
        self,
        path_or_latest: str | Path | None = "latest",
        states: str | Iterable[str] = "all",
        strict: bool = True,
        model: Any = None,
        optimizer: Any = None,
        *,
        into: Mapping[str, Any] | None = None,
        map_location: Any = None,
        allow_missing: bool = False,
        objects_mode: Any = "opaque",
    ) -> LoadedCheckpoint | None:
        """Read a checkpoint (a path, or ``"latest"``) and load it into the given objects.

        ``states``: the top-level states to read (``"all"``, a list, or a comma string); a name
        the file does not have is an error listing the ones it has. ``model`` gets
        ``state["model"]``, ``optimizer`` gets ``state["optimizer"]`` and each ``into[name]``
        gets ``state[name]`` (through ``load_state_dict``) when that state is selected.
        ``strict``: missing or unexpected keys of a module, or a component whose state the file
        lacks, are an error raised before anything is loaded. Otherwise they are logged and
        returned in the result. Tensors are lazy: data is read on first use.
        """

        def read(path: Path) -> Any:
            return torch_room.load(
                path, map_location, allow_missing=allow_missing, objects_mode=objects_mode
            )

        if path_or_latest is None or path_or_latest == "latest":
            # (each file read once: the one found is the one loaded, whatever is pruned)
            found = newest_complete(self.directory, self._newest_first, read)
            if found is None:
                log.info("no checkpoint in %s: starting fresh", self.directory)
                return None
            path, state = found
        else:
            path = Path(path_or_latest)
            if not path.is_absolute() and not path.exists() and (self.directory / path).exists():
                path = self.directory / path
            state = read(path)
        if not isinstance(state, dict):
            raise UsageError(path, f"holds a {type(state).__name__}, not a dict of states")
        wanted = parse_states(states)
        if wanted is None:
            selected, skipped = dict(state), []
        else:
            unknown = [s for s in wanted if s not in state]
            if unknown:
                raise StateSelectionError(
                    path,
                    f"has no top-level state {names(unknown)}; it has: {names(state)}",
                    "name states it has, or pass states='all'",
                )
            selected = {k: v for k, v in state.items() if k in wanted or is_meta(k)}
            skipped = [k for k in state if k not in selected]
            if skipped:
                log.info("%s: not loading state(s) %s", path, names(skipped))
        result = LoadedCheckpoint(path, self.step_of(path), selected, skipped_states=skipped)
        components = {"model": model, "optimizer": optimizer, **dict(into or {})}
        load_components(path, state, result, components, strict)
        return result


# --------------------------------------------------------------------------- small helpers


def _format_fields(text: str) -> list[str]:
    import string

    try:
        return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc}") from None


def _check_int(what: str, value: Any, *, minimum: int) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < minimum:
        raise ValueError(f"{what} must be None or an int >= {minimum}, not {value!r}")
    return value


def _check_step(step: Any) -> int:
    if type(step) is not int or step < 0:
        raise ValueError(f"step must be an int >= 0, not {step!r}")
    return step


def _timestamp_after(previous: str | None) -> str:
    """The current UTC time as ``YYYYmmdd_HHMMSS``, waiting for the next second if it would
    not be later than ``previous`` (UTC, so daylight-saving changes cannot reorder names)."""
    while True:
        now = _dt.datetime.now(_dt.timezone.utc)
        stamp = now.strftime(TIMESTAMP_FORMAT)
        if previous is None or stamp > previous:
            return stamp
        time.sleep(1.0 - now.microsecond / 1e6 + 0.001)
