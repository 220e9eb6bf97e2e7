"""`CheckpointManager` on real files: cadence, names, autoload, retention, subsets, loading, resume.

The resume tests run the README's `train_tiny.py` in real processes and SIGKILL them, once at a
training step and once in the middle of a save (its temporary file written, not yet published).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import pytest
import torch
from conftest import FIXTURES, ROOT, sha256_file
from digest import digest
from real_cstorch import real_digest, requires_real_cstorch

import ckpt_migrate as cm
from ckpt_migrate import CheckpointManager
from ckpt_migrate.errors import StateMismatchError, StateSelectionError
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.model_dir.manager import RUN_ATTR, read_run_record

STAMPED = re.compile(r"checkpoint_(\d+)_(\d{8}_\d{6})\.mdl")


def tiny_state(seed: int = 0, step: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(3, 2, generator=gen), "b": torch.randn(2, generator=gen)},
        "optimizer": {"state": {0: {"m": torch.randn(3, 2, generator=gen)}}, "lr": 0.1},
        "step": step,
        "__metadata__": [{"version": "test"}],
    }


def names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


def state_step(path: Path) -> int:
    return cm.load(path)["step"]


# --------------------------------------------------------------------------- cadence and names


def test_should_save_follows_the_cadence_from_step_zero():
    mgr = CheckpointManager("unused", steps=5)
    assert [s for s in range(0, 18) if mgr.should_save(s)] == [5, 10, 15]
    assert mgr.should_save(17, final=True) and not mgr.should_save(16)
    for steps in (None, 0):  # no cadence: no checkpoints at all, as in the Trainer
        off = CheckpointManager("unused", steps=steps)
        assert not any(off.should_save(s) for s in range(20)) and not off.should_save(9, final=True)
    for bad in (-1, 2.5, True, "5"):
        with pytest.raises(ValueError, match="steps"):
            CheckpointManager("unused", steps=bad)
    with pytest.raises(ValueError, match="step"):
        mgr.should_save(-1)
    with pytest.raises(ValueError, match="keep_last_n"):
        CheckpointManager("unused", keep_last_n=0)
    with pytest.raises(ValueError, match="run_id"):
        CheckpointManager("unused", run_id="../x")


@pytest.mark.parametrize(
    "pattern", ["checkpoint.mdl", "{step}_{step}.mdl", "{name}_{step}", "x/{step}.mdl", "{step:x}"]
)
def test_a_bad_name_pattern_is_refused(pattern):
    with pytest.raises(ValueError, match=r"pattern|step"):
        CheckpointManager("unused", name=pattern)


def test_save_writes_the_pattern_name_atomically_with_a_run_record(tmp_path):
    mgr = CheckpointManager(tmp_path / "md", name="run-{step:06d}.h5", run_id="exp1")
    path = mgr.save(tiny_state(step=7), 7)
    assert path == tmp_path / "md" / "run-000007.h5"
    assert names(path.parent) == {"run-000007.h5"}  # no temporary file left
    record = read_run_record(path)
    assert record is not None
    assert {k: record[k] for k in ("run_id", "kind", "step", "save_index")} == {
        "run_id": "exp1",
        "kind": "full",
        "step": 7,
        "save_index": 1,
    }
    with read_checkpoint(path) as ckpt:
        assert ckpt.release is not None and ckpt.release.name == "2.10"
    loaded = cm.load(path)
    assert torch.equal(loaded["model"]["w"], tiny_state(step=7)["model"]["w"])
    assert mgr.latest() == path and mgr.step_of(path) == 7


def test_an_existing_name_gets_a_timestamp_and_nothing_is_overwritten(tmp_path):
    md = tmp_path / "md"
    md.mkdir()
    foreign = md / "checkpoint_5.mdl"
    shutil.copyfile(FIXTURES / "release-2.10.mdl", foreign)
    digest = sha256_file(foreign)
    mgr = CheckpointManager(md)
    saved = [mgr.save(tiny_state(step=i), 5) for i in range(3)]  # three saves in ~one second
    assert sha256_file(foreign) == digest
    stamps = []
    for path in saved:
        m = STAMPED.fullmatch(path.name)
        assert m is not None and m.group(1) == "5", path.name
        stamps.append(m.group(2))
    assert stamps == sorted(set(stamps))  # distinct, and in save order
    assert [state_step(p) for p in saved] == [0, 1, 2]  # each its own file
    assert mgr.latest() == saved[-1]  # a timestamped name is newer than the plain one


# --------------------------------------------------------------------------- latest


def test_latest_skips_temporary_partial_and_unrelated_files(tmp_path, caplog):
    md = tmp_path / "md"
    mgr = CheckpointManager(md)
    assert mgr.latest() is None and mgr.load_latest() is None  # no directory yet
    mgr.save(tiny_state(step=1), 1)
    good = mgr.save(tiny_state(step=2), 2)
    shutil.copyfile(good, md / "checkpoint_9.mdl.0123abcd.tmp")  # an unpublished write
    shutil.copyfile(good, md / "checkpoint_8.mdl.pre-2.0.bak")
    shutil.copyfile(good, md / "xcheckpoint_12.mdl")
    shutil.copyfile(good, md / "checkpoint_12.mdl.old")
    shutil.copyfile(good, md / "checkpoint_12xmdl")  # the Trainer's regex leaves '.' unescaped
    data = good.read_bytes()
    (md / "checkpoint_7.mdl").write_bytes(data[: len(data) // 2])  # truncated
    shutil.copyfile(good, md / "checkpoint_6.mdl")
    with h5py.File(md / "checkpoint_6.mdl", "r+") as f:  # killed before its success marker
        f.attrs["__SUCCESS__"] = False
    (md / "checkpoint_5.mdl").write_text("not a checkpoint")
    (md / "checkpoint_4.mdl").mkdir()
    caplog.set_level(logging.WARNING, "ckpt_migrate.model_dir.manager")
    assert mgr.latest() == good
    skipped = " ".join(r.getMessage() for r in caplog.records)
    for name in ("checkpoint_7.mdl", "checkpoint_6.mdl", "checkpoint_5.mdl"):
        assert name in skipped
    loaded = mgr.load_latest()
    assert loaded is not None and loaded.path == good and loaded.step == 2
    assert loaded.state["step"] == 2


@pytest.mark.parametrize("how", ["latest", "load_latest"])
def test_latest_lists_again_when_what_it_listed_was_pruned_meanwhile(tmp_path, monkeypatch, how):
    """A reader (an evaluation process) lists the directory while the trainer saves a newer
    checkpoint and prunes the one listed (keep_last_n=1). The reader took the directory for
    empty: ``latest()`` None and ``load_latest()`` "no checkpoint: starting fresh", and a file
    found but pruned before its load was "no such file"."""
    from ckpt_migrate.model_dir.names import NamePattern

    md = tmp_path / "md"
    trainer = CheckpointManager(md, run_id="train", keep_last_n=1)
    trainer.save(tiny_state(step=1), 1)
    listed = NamePattern.checkpoints
    saving = []

    def listing_then_a_save(self, *args, **kwargs):
        found = listed(self, *args, **kwargs)
        if not saving:  # (the trainer's own listings, while it saves, list as ever)
            saving.append(2)
            trainer.save(tiny_state(step=2), 2)
        return found

    monkeypatch.setattr(NamePattern, "checkpoints", listing_then_a_save)
    reader = CheckpointManager(md, run_id="eval")
    assert [p.name for p in md.glob("*.mdl")] == ["checkpoint_1.mdl"]
    if how == "latest":
        assert reader.latest() == md / "checkpoint_2.mdl"
    else:
        loaded = reader.load_latest()
        assert loaded is not None and loaded.step == 2 and loaded.state["step"] == 2
    assert [p.name for p in md.glob("*.mdl")] == ["checkpoint_2.mdl"]


def test_latest_finds_checkpoints_of_other_runs_and_copied_in_files(tmp_path):
    md = tmp_path / "md"
    CheckpointManager(md, run_id="old").save(tiny_state(step=10), 10)
    shutil.copyfile(FIXTURES / "release-2.0.mdl", md / "checkpoint_20.mdl")  # no run record
    mgr = CheckpointManager(md, run_id="new")
    assert mgr.latest() == md / "checkpoint_20.mdl"
    assert [p.name for p in mgr.checkpoints()] == ["checkpoint_10.mdl", "checkpoint_20.mdl"]


# --------------------------------------------------------------------------- retention


def test_keep_last_n_deletes_only_what_this_run_saved(tmp_path):
    md = tmp_path / "md"
    md.mkdir()
    shutil.copyfile(FIXTURES / "release-2.10.mdl", md / "checkpoint_0.mdl")  # an earlier run
    a = CheckpointManager(md, keep_last_n=2, run_id="a").save_states_every(1)
    b = CheckpointManager(md, keep_last_n=3, run_id="b")
    for step in range(1, 7):  # both save every step into one directory, same names
        a.save(tiny_state(step=step), step)
        b.save(tiny_state(seed=1, step=100 + step), step)
    assert [state_step(p) for p in a.owned()] == [5, 6]
    assert [state_step(p) for p in b.owned()] == [104, 105, 106]
    assert (md / "checkpoint_0.mdl").is_file()
    subsets = a.owned("subset")  # keep_last_n applies to each kind: the newest 2 subsets
    assert [read_run_record(p)["of"] for p in subsets] == [a.owned()[0].name, a.owned()[1].name]
    assert len(list(md.glob("model_checkpoint_*"))) == 2
    left = {p.name for p in md.glob("checkpoint_*")}
    assert len(left) == 1 + 2 + 3

    # A restart of run "a" goes on pruning its own files; a new run deletes nothing earlier.
    a2 = CheckpointManager(md, keep_last_n=2, run_id="a")
    a2.save(tiny_state(step=7), 7)
    assert [state_step(p) for p in a2.owned()] == [6, 7]
    assert read_run_record(a2.owned()[-1])["save_index"] == 7  # the count survives the restart
    fresh = CheckpointManager(md, keep_last_n=1)
    fresh.save(tiny_state(step=8), 8)
    assert [state_step(p) for p in a2.owned()] == [6, 7]
    assert [state_step(p) for p in b.owned()] == [104, 105, 106]
    assert (md / "checkpoint_0.mdl").is_file()


def test_keep_last_n_keeps_subset_files_in_check_too(tmp_path):
    """The README's manager (keep_last_n=5, a subset every 5th save) ends with 5 checkpoints and
    5 subset files, not one subset per 5 saves for ever; another run's subsets are kept."""
    md = tmp_path / "md"
    other = CheckpointManager(md, run_id="other").save_states_every(1)
    other.save(tiny_state(step=0), 0)
    mgr = CheckpointManager(md, keep_last_n=5, run_id="gpt-small").save_states_every(5)
    for step in range(1, 41):
        mgr.save(tiny_state(step=step), step, final=step == 40)
    assert [state_step(p) for p in mgr.owned()] == [36, 37, 38, 39, 40]
    subsets = mgr.owned("subset")
    assert [read_run_record(p)["step"] for p in subsets] == [20, 25, 30, 35, 40]
    assert other.owned("subset") == [md / "model_checkpoint_0.mdl"]
    assert len(list(md.iterdir())) == 5 + 5 + 2
    restarted = CheckpointManager(md, keep_last_n=5, run_id="gpt-small").save_states_every(5)
    restarted.save(tiny_state(step=45), 45)  # the 41st save of the run: no subset due
    restarted.save(tiny_state(step=50), 50, final=True)
    assert [read_run_record(p)["step"] for p in restarted.owned("subset")] == [25, 30, 35, 40, 50]


# A child process that saves checkpoint_<N>.mdl with a manager and, once the save has written
# and verified its temporary file, either SIGKILLs itself (a killed save) or says so and waits
# (a live save, holding its temporary file's lock).
SAVER = """
import os, signal, sys, time

import torch

import ckpt_migrate.atomic as atomic
from ckpt_migrate import CheckpointManager

directory, step, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
publish = atomic.publish


def stopping_publish(tmp, target, **kwargs):
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    print("WRITING", tmp, flush=True)
    time.sleep(600)


atomic.publish = stopping_publish
mgr = CheckpointManager(directory, run_id="child")
mgr.save({"model": {"w": torch.ones(4, 4)}, "step": step}, step)
"""


def temporaries(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if p.name.endswith(".tmp")}


def test_a_manager_removes_its_killed_saves_temporaries_never_a_live_one(tmp_path):
    md = tmp_path / "md"
    md.mkdir()
    saver = tmp_path / "saver.py"
    saver.write_text(SAVER)
    live = subprocess.Popen(
        [sys.executable, saver, md, "4", "wait"], stdout=subprocess.PIPE, text=True
    )
    try:
        line = live.stdout.readline()  # the live save's temporary file is written and locked
        assert line.startswith("WRITING"), line
        (alive,) = temporaries(md)
        assert alive.startswith("checkpoint_4.mdl.")
        # Another process's manager starts (keeping the live file) and is killed mid-save.
        killed = subprocess.run(
            [sys.executable, saver, md, "3", "kill"], capture_output=True, text=True, timeout=120
        )
        assert killed.returncode == -9, killed.stderr
        (dead,) = temporaries(md) - {alive}
        assert dead.startswith("checkpoint_3.mdl.")
        (md / "notes.txt.0123abcd.tmp").write_text("not a checkpoint's")  # left alone
        mgr = CheckpointManager(md, run_id="child")
        assert mgr.removed_temporaries == [md / dead]
        assert temporaries(md) == {alive, "notes.txt.0123abcd.tmp"}
        assert mgr.latest() is None
    finally:
        live.kill()
        live.wait()
    assert live.returncode == -9
    assert CheckpointManager(md).removed_temporaries == [md / alive]
    assert temporaries(md) == {"notes.txt.0123abcd.tmp"}


def test_keep_last_n_never_deletes_the_checkpoint_just_saved(tmp_path):
    md = tmp_path / "md"
    mgr = CheckpointManager(md, keep_last_n=1, run_id="r")
    mgr.save(tiny_state(step=30), 30)
    resumed = mgr.save(tiny_state(step=20), 20)  # resumed from an older step: saved last
    assert mgr.owned() == [resumed]


# --------------------------------------------------------------------------- subsets


def test_subset_files_every_k_saves_without_reading_back(tmp_path, monkeypatch):
    md = tmp_path / "md"
    mgr = CheckpointManager(md, run_id="r").save_states_every(2, states="model,step")

    def no_reading(*args, **kwargs):
        raise AssertionError("a subset must not read the checkpoint back")

    # The writer re-reads each file's structure to verify it; no tensor data is read back.
    monkeypatch.setattr("ckpt_migrate.format.h5.io.H5Handle.read_dataset", no_reading)
    monkeypatch.setattr("ckpt_migrate.torch.api.load", no_reading)
    states = {}
    for step in range(1, 6):
        states[step] = tiny_state(seed=step, step=step)
        mgr.save(states[step], step, final=step == 5)
    monkeypatch.undo()
    subsets = sorted(md.glob("model_step_*"))
    assert [p.name for p in subsets] == [
        "model_step_checkpoint_2.mdl",
        "model_step_checkpoint_4.mdl",
        "model_step_checkpoint_5.mdl",  # the final save
    ]
    for path in subsets:
        step = int(path.name.rsplit("_", 1)[1].split(".")[0])
        sub = cm.load(path)
        assert set(sub) == {"model", "step", "__metadata__"}
        for key, value in states[step]["model"].items():
            assert torch.equal(sub["model"][key], value)
        record = read_run_record(path)
        assert record["kind"] == "subset" and record["of"] == f"checkpoint_{step}.mdl"
    assert mgr.latest() == md / "checkpoint_5.mdl"


def test_a_subset_file_is_never_taken_as_the_latest(tmp_path):
    md = tmp_path / "md"
    mgr = CheckpointManager(md, name="{step}.mdl").save_states_every(1, name="{ckpt}-{states}")
    mgr.save(tiny_state(step=1), 1)
    assert names(md) == {"1.mdl", "1.mdl-model"}
    assert mgr.latest() == md / "1.mdl"


def test_subset_options_are_checked(tmp_path):
    mgr = CheckpointManager(tmp_path / "md")
    with pytest.raises(ValueError, match="fields"):
        mgr.save_states_every(2, name="{states}.mdl")
    with pytest.raises(ValueError, match="distinct"):
        CheckpointManager("x", name="{step}.mdl").save_states_every(1, "1", "{states}{ckpt}")
    with pytest.raises(ValueError, match="k"):
        mgr.save_states_every(0)
    mgr.save_states_every(1, states=("model", "dataloader"))
    with pytest.raises(StateSelectionError, match=r"dataloader.*it has: model, optimizer"):
        mgr.save(tiny_state(), 1)
    assert not (tmp_path / "md").exists() or names(tmp_path / "md") == set()  # nothing written


# --------------------------------------------------------------------------- loading


class Net(torch.nn.Module):
    def __init__(self, hidden: int = 4, renamed: bool = False):
        super().__init__()
        self.fc = torch.nn.Linear(3, hidden)
        if renamed:
            self.head = torch.nn.Linear(hidden, 1)
        else:
            self.out = torch.nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.head if hasattr(self, "head") else self.out)(self.fc(x).tanh())


def saved_net(tmp_path: Path) -> tuple[CheckpointManager, Net, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    net(torch.randn(2, 3)).sum().backward()
    opt.step()
    mgr = CheckpointManager(tmp_path / "md")
    mgr.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": 3}, 3)
    return mgr, net, opt


def test_selective_loading_of_top_level_states(tmp_path):
    mgr, net, opt = saved_net(tmp_path)
    fresh = Net()
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.01)
    loaded = mgr.load("latest", states=["model"], model=fresh, optimizer=fresh_opt)
    assert set(loaded.state) == {"model"} and loaded.skipped_states == ["optimizer", "step"]
    assert torch.equal(fresh.fc.weight, net.fc.weight)
    assert fresh_opt.state_dict()["state"] == {}  # opted out: left as it was

    both = mgr.load(mgr.latest(), states="model, optimizer", model=Net(), optimizer=fresh_opt)
    assert set(both.state) == {"model", "optimizer"}
    restored = fresh_opt.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(restored, opt.state_dict()["state"][0]["exp_avg"])

    with pytest.raises(KeyError) as info:  # a StateSelectionError, as the Trainer's KeyError
        mgr.load("checkpoint_3.mdl", states=["model", "dataloader"], model=Net())
    assert isinstance(info.value, StateSelectionError)
    assert "dataloader" in str(info.value) and "it has: model, optimizer, step" in str(info.value)


def test_strict_loading_refuses_key_mismatches_before_changing_anything(tmp_path):
    mgr, _, _ = saved_net(tmp_path)
    other = Net(renamed=True)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(RuntimeError) as info:
        mgr.load_latest(model=other)
    err = info.value
    assert isinstance(err, StateMismatchError)
    assert "2 missing key(s) (head.weight, head.bias)" in str(err)
    assert "2 unexpected key(s) (out.weight, out.bias)" in str(err)
    assert err.missing_keys == {"model": ["head.weight", "head.bias"]}
    for k, v in other.state_dict().items():
        assert torch.equal(v, before[k])


def test_non_strict_loading_returns_and_logs_the_key_report(tmp_path, caplog):
    mgr, net, _ = saved_net(tmp_path)
    other = Net(renamed=True)
    scaler = torch.nn.Linear(1, 1)  # anything with load_state_dict
    caplog.set_level(logging.WARNING, "ckpt_migrate.model_dir.manager")
    loaded = mgr.load_latest(strict=False, model=other, into={"grad_scaler": scaler})
    assert loaded is not None and not loaded.complete
    assert loaded.missing_keys == {"model": ["head.weight", "head.bias"]}
    assert loaded.unexpected_keys == {"model": ["out.weight", "out.bias"]}
    assert loaded.missing_states == ["grad_scaler"]
    assert torch.equal(other.fc.weight, net.fc.weight)  # what matches is loaded
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "head.weight" in logged and "out.bias" in logged and "grad_scaler" in logged

    with pytest.raises(StateMismatchError, match="grad_scaler"):
        mgr.load_latest(model=Net(), into={"grad_scaler": scaler})


def test_a_shape_mismatch_is_an_error_even_when_not_strict(tmp_path):
    mgr, _, _ = saved_net(tmp_path)
    with pytest.raises(StateMismatchError, match=r"fc.weight \(4, 3\) in the file, \(5, 3\)"):
        mgr.load_latest(strict=False, model=Net(hidden=5))


def test_the_manager_does_not_import_torch_to_find_checkpoints(tmp_path):
    code = textwrap.dedent(
        f"""
        import sys
        import ckpt_migrate
        mgr = ckpt_migrate.CheckpointManager({str(FIXTURES / "format-test")!r})
        print(mgr.latest().name, mgr.should_save(5))
        print("TORCH" if "torch" in sys.modules else "NO-TORCH")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split() == ["checkpoint_100.mdl", "False", "NO-TORCH"], out.stderr


def test_an_upgraded_checkpoint_belongs_to_no_run(tmp_path):
    """The engine does not carry the run record over, so retention never deletes upgrades."""
    md = tmp_path / "md"
    mgr = CheckpointManager(md, release="2.0", run_id="r", keep_last_n=1)
    src = mgr.save(tiny_state(step=1), 1)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_migrate", "upgrade", str(src), "--output-dir", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    with h5py.File(out / src.name, "r") as f:
        assert RUN_ATTR not in f.attrs


@requires_real_cstorch()
@pytest.mark.parametrize("release", ["2.0", "2.10"])
def test_the_real_library_loads_what_the_manager_saves(tmp_path, release):
    """The run record is one more root attribute, which the real loader ignores."""
    state = {k: v for k, v in tiny_state(step=4).items() if k != "__metadata__"}
    mgr = CheckpointManager(tmp_path / "md", release=release).save_states_every(1)
    full = mgr.save(state, 4)
    subset = tmp_path / "md" / f"model_{full.name}"
    got = real_digest([full, subset])
    assert got[full]["ok"], got[full]
    assert got[full]["digest"] == digest(state)
    assert got[subset]["ok"], got[subset]
    assert got[subset]["digest"] == digest({"model": state["model"]})


# --------------------------------------------------------------------------- the README example


def readme_script(tmp_path: Path) -> Path:
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"```python\n(# train_tiny\.py.+?)\n```", readme, flags=re.S)
    assert m is not None, "the README lost its train_tiny.py example"
    path = tmp_path / "train_tiny.py"
    path.write_text(m.group(1) + "\n")
    return path


# Runs the README script and SIGKILLs the process itself at a chosen point: before the
# optimizer step of step N, or when the save of checkpoint_N.mdl has written and verified its
# temporary file but not yet published it.
KILLER = """
import os, runpy, signal, sys

import torch

import ckpt_migrate.atomic as atomic

where, n = os.environ["KILL_AT"].split(":")
n = int(n)
if where == "step":
    calls = [0]
    step = torch.optim.SGD.step

    def killing_step(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return step(self, *args, **kwargs)

    torch.optim.SGD.step = killing_step
else:
    publish = atomic.publish

    def killing_publish(tmp, target, **kwargs):
        if target.name == f"checkpoint_{n}.mdl":
            os.kill(os.getpid(), signal.SIGKILL)
        return publish(tmp, target, **kwargs)

    atomic.publish = killing_publish
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_tiny(args: list, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def losses(stdout: str) -> dict[int, str]:
    return {int(s): loss for s, loss in re.findall(r"^step (\d+) loss (\S+)$", stdout, re.M)}


@pytest.fixture(scope="module")
def straight_losses(tmp_path_factory) -> dict[int, str]:
    """The README script's 20 steps run straight through, never killed: the loss of each step
    (the same for every kill below, so run once for the module)."""
    tmp = tmp_path_factory.mktemp("straight")
    straight = run_tiny([readme_script(tmp), tmp / "straight", 20])
    assert straight.returncode == 0, straight.stderr
    expected = losses(straight.stdout)
    assert sorted(expected) == list(range(1, 21))
    return expected


@pytest.mark.parametrize(
    ("kill_at", "resumed_from"),
    [("step:13", 10), ("publish:15", 10)],
    ids=["killed-at-a-training-step", "killed-in-the-middle-of-a-save"],
)
def test_readme_example_resumes_with_the_identical_next_loss(
    tmp_path, straight_losses, kill_at, resumed_from
):
    script = readme_script(tmp_path)
    killer = tmp_path / "killer.py"
    killer.write_text(KILLER)
    expected = straight_losses

    md = tmp_path / "killed"
    first = run_tiny([killer, script, md, 20], {"KILL_AT": kill_at})
    assert first.returncode == -9, first.stderr
    got = losses(first.stdout)
    assert got and max(got) < 20
    if kill_at.startswith("publish"):
        assert any(p.name.startswith("checkpoint_15.mdl.") for p in md.iterdir())  # unpublished

    resumed = run_tiny([script, md, 20])
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {md / f'checkpoint_{resumed_from}.mdl'} at step {resumed_from}" in (
        resumed.stdout
    )
    again = losses(resumed.stdout)
    assert sorted(again) == list(range(resumed_from + 1, 21))
    assert again[resumed_from + 1] == expected[resumed_from + 1]  # the identical next loss
    assert again == {s: expected[s] for s in again}
    # keep_last_n=2 of run "tiny" went on across the restart, for subsets too; the resumed
    # manager removed the temporary file of the killed save.
    assert sorted(p.name for p in md.glob("checkpoint_*.mdl")) == [
        "checkpoint_15.mdl",
        "checkpoint_20.mdl",
    ]
    assert sorted(p.name for p in md.glob("model_checkpoint_*.mdl")) == [
        "model_checkpoint_10.mdl",  # the 2nd and 4th saves (steps 10, 20) wrote subsets
        "model_checkpoint_20.mdl",
    ]
    assert not any(p.name.endswith(".tmp") for p in md.iterdir())
    assert json.loads(json.dumps(read_run_record(md / "checkpoint_20.mdl")))["run_id"] == "tiny"
    assert (md / "model_checkpoint_20.mdl").is_file()
