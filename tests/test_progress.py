"""Progress that tells the truth, seen as a log sees it (stderr not a terminal): plain lines per
phase, bytes in bytes, tensors in tensors, `file K of N` and the whole run's time left for
`upgrade-dir`; `--progress none` and `-q` print none.

The checkpoints (~40 MB) are generated at test time; the copy runs in 1 MiB blocks, each slowed
down (``CKPT_MIGRATE_TEST_WRITE_DELAY``), so that it lasts a few seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import FIXTURES, REAL, one_line_error, real_2x_files

import ckpt_migrate as cm
from ckpt_migrate.format.progress import Count

SLOW = {
    "CKPT_MIGRATE_TEST_COPY_BLOCK": str(1 << 20),
    "CKPT_MIGRATE_TEST_WRITE_DELAY": "0.05",
}
LINE = re.compile(r"^(?P<phase>[\w ]+(: \w+)?): (?P<done>[\d,.]+( \w+)?) of (?P<total>[\d,.]+ \w+)")


def make(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    state = {
        "model": {
            f"layer{i}.weight": rng.standard_normal((1024, 1024), np.float32) for i in range(10)
        },
        "global_step": seed,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    cm.save(state, path, "2.0")
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("progress")
    md = base / "md"
    make(md / "checkpoint_100.mdl", 1)
    make(md / "checkpoint_200.mdl", 2)
    yield md
    shutil.rmtree(base, ignore_errors=True)


def run(*args: str | Path, interval: str = "0") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **SLOW, "CKPT_MIGRATE_PROGRESS_INTERVAL": interval}
    return subprocess.run(
        [sys.executable, "-m", "ckpt_migrate", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def progress_lines(stderr: str) -> list[re.Match[str]]:
    return [m for line in stderr.splitlines() if (m := LINE.match(line))]


def test_upgrade_prints_plain_progress_per_phase_when_stderr_is_not_a_terminal(model_dir, tmp_path):
    src = model_dir / "checkpoint_100.mdl"
    proc = run("upgrade", src, "-o", tmp_path, "--verify", "full", interval="0")
    assert proc.returncode == 0, proc.stderr
    lines = progress_lines(proc.stderr)
    phases = [m["phase"] for m in lines]
    assert {"patch", "copy", "verify"} <= set(phases), proc.stderr
    copy = [m for m in lines if m["phase"] == "copy"]
    assert len(copy) >= 3, proc.stderr  # a copy of 2 s, a line every 0.2 s at most
    assert all(re.fullmatch(r"40\.\d MiB", m["total"]) for m in copy), proc.stderr  # bytes
    assert copy[-1]["done"] == copy[-1]["total"] and "(100%)" in copy[-1].string
    assert any(", about " in m.string and " left" in m.string for m in copy), proc.stderr
    patch = [m for m in lines if m["phase"] == "patch"]
    assert patch[-1]["done"] == "11" and patch[-1]["total"] == "11 tensors"  # 10 weights, step
    assert "written to" in proc.stdout


def test_plain_lines_come_at_most_every_interval(model_dir, tmp_path):
    src = model_dir / "checkpoint_100.mdl"
    started = time.monotonic()
    proc = run("upgrade", src, "-o", tmp_path / "a", interval="1")
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    copy = [m for m in progress_lines(proc.stderr) if m["phase"] == "copy"]
    assert 1 <= len(copy) <= seconds + 1, proc.stderr  # at most a line a second, and the end
    assert copy[-1]["done"] == copy[-1]["total"], proc.stderr
    proc = run("upgrade", src, "-o", tmp_path / "b", interval="60")
    assert proc.returncode == 0, proc.stderr
    assert progress_lines(proc.stderr) == []  # nothing lasted a minute: no line at all


@pytest.mark.parametrize("flag", [["--progress", "none"], ["-q"], ["--json"]])
def test_no_progress_when_asked(model_dir, tmp_path, flag):
    proc = run("upgrade", model_dir / "checkpoint_100.mdl", "-o", tmp_path, *flag)
    assert proc.returncode == 0, proc.stderr
    assert progress_lines(proc.stderr) == []
    if flag == ["-q"]:
        assert "  model:" not in proc.stdout and "written to" in proc.stdout


def test_unknown_progress_mode_is_one_line(model_dir, tmp_path):
    proc = run("upgrade", model_dir / "checkpoint_100.mdl", "-o", tmp_path, "--progress", "fancy")
    one_line_error(proc, 2, "--progress", "plain")


def test_upgrade_dir_says_which_file_and_the_whole_runs_time_left(model_dir, tmp_path):
    proc = run("upgrade-dir", model_dir, "-o", tmp_path / "out", interval="0.2")
    assert proc.returncode == 0, proc.stderr
    phases = [m["phase"] for m in progress_lines(proc.stderr)]
    assert "file 1 of 2: copy" in phases and "file 2 of 2: copy" in phases, proc.stderr
    overall = [m for m in progress_lines(proc.stderr) if m["phase"] == "all files"]
    assert overall[-1]["done"] == overall[-1]["total"], proc.stderr
    assert re.fullmatch(r"80\.\d MiB", overall[-1]["total"]), proc.stderr
    assert any(" left" in m.string for m in overall), proc.stderr


def test_upgrade_dir_logs_a_line_per_checkpoint_whatever_the_interval(model_dir, tmp_path):
    """In a log, each checkpoint's end is a line, "k of N" with the whole run's time left,
    even when no phase lasts long enough for a timed line (an interval of a minute)."""
    proc = run("upgrade-dir", model_dir, "-o", tmp_path / "out", interval="60")
    assert proc.returncode == 0, proc.stderr
    done = [line for line in proc.stderr.splitlines() if " done: " in line]
    assert [line.split(":")[0] for line in done] == ["checkpoint_200.mdl", "checkpoint_100.mdl"]
    first = r"checkpoint_200\.mdl: checkpoint 1 of 2 done: 40\.\d MiB of 80\.\d MiB \(50%\)"
    first += ", about .+ left"
    assert re.fullmatch(first, done[0]), done
    assert re.fullmatch(r"checkpoint_100\.mdl: checkpoint 2 of 2 done: (80\.\d MiB) of \1", done[1])
    quiet = run("upgrade-dir", model_dir, "-o", tmp_path / "q", "--progress", "none")
    assert quiet.returncode == 0 and " done: " not in quiet.stderr


def test_verify_reports_its_progress(model_dir):
    a, b = model_dir / "checkpoint_100.mdl", model_dir / "checkpoint_200.mdl"
    proc = run("verify", a, b, "--progress", "plain")
    assert proc.returncode == 4, proc.stderr  # they differ
    verify = [m for m in progress_lines(proc.stderr) if m["phase"] == "verify"]
    assert verify and verify[-1]["done"] == verify[-1]["total"] == "40.0 MiB", proc.stderr


def _many_leaves(path: Path, leaves: int) -> Path:
    """A release 2.5 checkpoint (format 0.5: each leaf's metadata a root attribute) of
    ``leaves`` small tensors, as a mixture of experts has them."""
    experts = {f"expert{i}.weight": np.full(4, i, np.float32) for i in range(leaves)}
    cm.save({"model": experts, "global_step": 1}, path, "2.5")
    return path


def test_the_reads_of_a_root_and_the_check_of_the_tensors_report_their_progress(
    tmp_path, real_layout_19
):
    """A root edit of 150k leaves read its root and checked its output's for seconds, and a
    rewrite walked the source's objects and checked its tensors for as long as it wrote them,
    with no line or bar: only the write and the copy spoke. The root's attributes are counted
    as read (1 in 1,000 said), the objects as walked, the index check's tensors as checked;
    a 1.9 file as the 1.9 library laid it out, too."""
    src = _many_leaves(tmp_path / "many.mdl", 2500)
    proc = run("upgrade", src, "-o", tmp_path / "edit", "--progress", "plain")
    assert proc.returncode == 0, proc.stderr
    assert "(root-edit," in proc.stdout
    lines = progress_lines(proc.stderr)
    for phase in ("read root", "check root"):
        said = [(m["done"], m["total"]) for m in lines if m["phase"] == phase]
        total = said[-1][1]
        assert re.fullmatch(r"2,5\d\d attributes", total), proc.stderr
        read_once = [("0", total), ("1,000", total), ("2,000", total), (total.split()[0], total)]
        assert said and said == read_once * (len(said) // 4), said  # (a root read twice, twice)
    proc = run(
        "upgrade", real_layout_19, "-o", tmp_path / "rw", "--drop-dataloader-state", "--json"
    )
    tensors = json.loads(proc.stdout)["tensors"]
    proc = run(
        "upgrade",
        real_layout_19,
        "-o",
        tmp_path / "rewrite",
        "--drop-dataloader-state",
        "--progress",
        "plain",
    )
    assert proc.returncode == 0, proc.stderr
    lines = progress_lines(proc.stderr)
    check = [m for m in lines if m["phase"] == "check"]
    assert [(m["done"], m["total"]) for m in check][-1] == (f"{tensors:,}", f"{tensors:,} tensors")
    # the walk of its objects, before any of that (the 1.9 layout: every leaf a dataset)
    read = [m for m in lines if m["phase"] == "read"]
    assert read and lines.index(read[-1]) < lines.index(check[0]), proc.stderr
    objects = read[-1]["done"]
    assert read[-1]["total"] == f"{objects} objects" and int(objects.replace(",", "")) > tensors
    walked = [int(m["done"].replace(",", "")) for m in read]
    assert walked == sorted(walked) and walked.count(walked[-1]) == 1, walked
    # the output's root read back before its tensors are checked (2 s unsaid at 12k tensors)
    root = [m for m in lines if m["phase"] == "check root"]
    assert root and lines.index(root[-1]) < lines.index(check[0]), proc.stderr
    assert root[-1]["done"] + " attributes" == root[-1]["total"], proc.stderr


def test_a_walk_said_done_is_not_counted_again():
    """The walk's children went on ticking after the read had said all its objects walked
    (the second part, the chunk indexes, runs on beside the upgrade): a 1.9 file of 12k
    tensors said "read: 15,126 of 15,126 objects (100%)", then "read: 15,120 of 15,126"."""
    from ckpt_migrate.format.h5 import walkreads
    from ckpt_migrate.format.h5.preflight import _Walk

    said: list[tuple[str, int, int]] = []
    walk = _Walk(pids=[], read_end=-1, facts=[], progress=lambda *a: said.append(a), children=1)
    walk.heard.take(walkreads.OBJECTS + b"15126" + walkreads.END + walkreads.WALKED * 1890)
    walk.report()
    walk.report(done=True)
    walk.report()  # (the second part's ticks)
    assert said == [("read", 0, 15126), ("read", 15120, 15126), ("read", 15126, 15126)]


@pytest.mark.parametrize("verb", ["inspect", "plan --to 2.4"])
def test_inspect_and_plan_report_the_read_of_a_large_root(tmp_path, verb):
    """``inspect`` and ``plan`` of 150k leaves read the root's attributes for seconds (5 s on
    the benchmarks' machine) with no option to say so. They now take ``--progress`` and
    ``-q`` as ``upgrade`` does; their report stays alone on stdout. The real 2.10 library's
    file, whose root holds 18 attributes, says its one line. (A plan of hops that edit only
    the root reads the spec alone, under a second at 150k leaves: a downgrade to 2.4 reads
    the leaves.)"""
    verb, *more = verb.split()
    src = _many_leaves(tmp_path / "many.mdl", 2500)
    proc = run(verb, src, *more, "--json", "--progress", "plain")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)  # (the report alone)
    lines = progress_lines(proc.stderr)
    said = [(m["done"], m["total"]) for m in lines if m["phase"] == "read root"]
    total = said[-1][1]
    assert re.fullmatch(r"2,5\d\d attributes", total), proc.stderr
    read_once = [("0", total), ("1,000", total), ("2,000", total), (total.split()[0], total)]
    assert said and said == read_once * (len(said) // 4), said  # (numpy leaves: read again)
    for quiet in (["--progress", "none"], ["-q"]):
        proc = run(verb, src, *more, "--json", *quiet)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    real = Path(__file__).parent.parent / "fixtures" / "real-cstorch-2.10" / "basic.mdl"
    proc = run(verb, real, *more, "--progress", "plain")
    assert proc.returncode == 0, proc.stderr
    said = "read root: 0 of 18 attributes (0%)\nread root: 18 of 18 attributes (100%)\n"
    assert proc.stderr == said if not more else said in proc.stderr  # (a rewrite's walk too)


def test_the_torch_conversions_count_bytes_as_bytes(tmp_path):
    """``to-torch`` reported the bytes it wrote as tensors ("write: 3,008 of 3,008 tensors"
    for a file of 16 tensors: the phase's unit is the rewrite's); ``from-torch`` said nothing
    however large its file. Both now say ``converting: <bytes> of <bytes>``. The real 2.10
    library's file, and the torch file written from it."""
    real = Path(__file__).parent.parent / "fixtures" / "real-cstorch-2.10" / "basic.mdl"
    state = tmp_path / "state.pt"
    proc = run("to-torch", real, state, "--progress", "plain")
    assert proc.returncode == 0, proc.stderr
    said = [(m["phase"], m["done"], m["total"]) for m in progress_lines(proc.stderr)]
    reads = {"read", "check indexes", "read root", "read links", "check overlaps"}
    phases = {phase for phase, _, _ in said}
    # (``walk root`` is told only if the parent polls while the walk's child is at the root,
    # a few ms on this file: on a loaded machine it is passed unseen)
    assert said and phases - {"walk root"} == {"lay out", "converting", "load back", *reads}, (
        proc.stderr
    )
    converted = [s for s in said if s[0] == "converting"]
    total = converted[-1][2]
    assert converted[-1][1] == total and re.fullmatch(r"[\d.]+ (B|KiB)", total), said
    # torch.save's pickle of the placeholders (10 s unsaid at 150k tensors) and torch.load's
    # read-back (21 s), a storage at a time
    import zipfile

    with zipfile.ZipFile(state) as archive:  # (a record a storage: two tied tensors share one)
        n = sum(name.rpartition("/")[0].endswith("/data") for name in archive.namelist())
    storages = f"{n} storages"
    assert said[-2:] == [("load back", "0", storages), ("load back", str(n), storages)]
    laid = [s for s in said if s[0] == "lay out"]
    assert laid == [("lay out", "0", storages), ("lay out", str(n), storages)], said
    proc = run("from-torch", state, tmp_path / "back.mdl", "--progress", "plain")
    assert proc.returncode == 0, proc.stderr
    back = [(m["phase"], m["done"], m["total"]) for m in progress_lines(proc.stderr)]
    assert back and back[-1] == ("converting", total, total), proc.stderr
    proc = run("from-torch", state, tmp_path / "quiet.mdl", "-q")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    # and ``import-hf``, as the writer counts them: Model Zoo's GPT-2 fixture exported to HF
    models = Path(__file__).parent.parent / "fixtures" / "models" / "gpt2-2.0"
    hf = tmp_path / "hf"
    proc = run("export-hf", models / "checkpoint_100.mdl", hf, "--config", models / "params.yaml")
    assert proc.returncode == 0, proc.stderr
    proc = run("import-hf", hf, tmp_path / "imported.mdl", "--progress", "plain")
    assert proc.returncode == 0, proc.stderr
    said = [(m["phase"], m["done"], m["total"]) for m in progress_lines(proc.stderr)]
    done = [s for s in said if s[0] == "import"]
    assert done and done[-1][1] == done[-1][2], proc.stderr
    from ckpt_migrate.format.read import read_checkpoint
    from ckpt_migrate.format.tree import TensorLeaf, leaf_objects

    with read_checkpoint(tmp_path / "imported.mdl") as back:  # (a line a tensor)
        tensors = {id(t) for t in leaf_objects(back.root) if isinstance(t, TensorLeaf)}
    assert len(done) == len(tensors), proc.stderr


MODELS = FIXTURES / "models"
BASIC = REAL / "basic.mdl"  # written by the real cerebras.pytorch 2.10
JSON_VERBS = {
    "upgrade": lambda out: [
        "upgrade",
        MODELS / "gpt2-1.9" / "checkpoint_100.mdl",
        "-o",
        out,
        "--drop-dataloader-state",
    ],
    "upgrade-dir": lambda out: [
        "upgrade-dir",
        MODELS / "gpt2-1.9",
        "-o",
        out,
        "--drop-dataloader-state",
    ],
    "verify": lambda out: ["verify", BASIC, BASIC],
    "check --deep": lambda out: ["check", BASIC, "--deep"],
    "inspect": lambda out: ["inspect", BASIC],
    "export-hf": lambda out: [
        "export-hf",
        MODELS / "gpt2-2.0" / "checkpoint_100.mdl",
        out / "hf",
        "--config",
        MODELS / "gpt2-2.0" / "params.yaml",
    ],
    "h5-to-tf": lambda out: ["h5-to-tf", BASIC, out / "ckpt", "--exclude", "none_val"],
}


@pytest.mark.parametrize("verb", JSON_VERBS)
def test_a_json_report_keeps_the_progress_asked_for_by_name(tmp_path, verb):
    """``--json`` turned progress off in some verbs whatever ``--progress`` said (``upgrade``,
    ``export-hf``, the TensorFlow converters, ``check --deep``), and left it on in others
    (``inspect``, ``plan``): a log taking stderr with the report got plain lines in one and
    nothing in the other. Now ``auto`` beside ``--json`` is the bar alone (none in a log), and
    ``--progress plain`` is kept; the report stays whole on stdout. Inputs: Model Zoo-shaped
    fixtures and the real 2.10 library's file."""
    if verb == "h5-to-tf" and importlib.util.find_spec("tensorflow") is None:
        pytest.skip("needs the tensorflow extra")
    for progress, out in (([], tmp_path / "a"), (["--progress", "plain"], tmp_path / "b")):
        out.mkdir()
        proc = run(*JSON_VERBS[verb](out), "--json", *progress)
        assert proc.returncode in (0, 10), proc.stderr  # (10: check, an upgrade is needed)
        if verb.startswith("upgrade"):  # one object a line
            reports = [json.loads(line) for line in proc.stdout.splitlines()]
            assert reports and all(r["status"] != "failed" for r in reports), proc.stdout
        else:
            assert json.loads(proc.stdout)
        lines = progress_lines(proc.stderr)
        assert bool(lines) == bool(progress), proc.stderr


def beside_a_terminal(args: list[Any], stdout: Path | None, **env: str) -> bytes:
    """Run the command with stderr on a pseudo-terminal and stdout to ``stdout`` (None: the
    terminal too); what the terminal was sent."""
    import pty

    main, terminal = pty.openpty()
    with open(os.dup(terminal) if stdout is None else stdout, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckpt_migrate", *map(str, args)],
            stdout=out,
            stderr=terminal,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "COLUMNS": "100", **env},
        )
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 1 << 16)
        except OSError:  # (EIO: the terminal's other end closed)
            break
        if not chunk:
            break
        shown += chunk
    os.close(main)
    assert proc.wait(timeout=120) == 0, shown
    return shown


def test_the_bar_is_drawn_on_the_terminals_stderr_not_in_the_report(tmp_path):
    """The bar (stderr on a terminal) was drawn by rich's own console, which is stdout's: with
    the report sent to a file or a pipe (``inspect --json x > r.json``, ``| jq``) no bar was
    shown at all and a blank line began the report. Here stderr is a pseudo-terminal and
    stdout a file, the input the real 2.10 library's file."""
    report, tied = tmp_path / "r.json", REAL / "tied.mdl"
    shown = beside_a_terminal(["verify", tied, tied, "--json"], report)
    assert report.read_bytes().startswith(b"{")
    assert json.loads(report.read_text())["differences"] == []
    assert b"\x1b[?25l" in shown and b"verify" in shown  # (the bar: cursor hidden, a phase)


def test_a_terminal_that_cannot_redraw_a_line_gets_plain_lines(tmp_path):
    """On a ``TERM=dumb`` terminal (Emacs' shell, some IDE consoles) rich draws no bar, and
    ``auto`` chose the bar there: a long run showed nothing until its end."""
    report, tied = tmp_path / "r.txt", REAL / "tied.mdl"
    env = {"TERM": "dumb", "CKPT_MIGRATE_PROGRESS_INTERVAL": "0"}
    shown = beside_a_terminal(["verify", tied, tied], report, **env).decode()
    assert progress_lines(shown.replace("\r\n", "\n")), shown
    assert "\x1b[" not in shown and "identical" in report.read_text()


def test_results_printed_beside_the_bar_stay_on_stdout(tmp_path):
    """With the bar on stderr, rich's redirection of stdout would have sent each checkpoint's
    line of ``upgrade-dir`` into the bar's stream (and wrapped it at the terminal's width):
    stdout is redirected only where it is a terminal too. There each line is printed whole:
    rich broke a line printed beside the bar at the terminal's width, with a newline in the
    middle of a path. Inputs: the real 2.10 library's files."""
    folder = tmp_path / "md"
    folder.mkdir()
    for name in ("basic", "tied"):
        shutil.copyfile(REAL / f"{name}.mdl", folder / f"{name}.mdl")
    results = tmp_path / "results.txt"
    shown = beside_a_terminal(["upgrade-dir", folder, "-o", tmp_path / "out"], results)
    lines = results.read_text().splitlines()
    for name in ("basic", "tied"):
        assert any(line.startswith(f"{folder / name}.mdl: ") for line in lines), lines
        assert f"{name}.mdl: ".encode() not in shown.replace(b"file ", b"")
    assert b"\x1b[?25l" in shown and lines[-1].endswith("exit 0")
    shown = beside_a_terminal(["upgrade-dir", folder, "-o", tmp_path / "again"], None)
    text = re.sub(rb"\x1b\[[0-9;?]*[a-zA-Z]", b"", shown).decode().replace("\r\n", "\n")
    shown_lines = {line.split("\r")[-1] for line in text.split("\n")}
    for line in lines[:2]:  # (each line whole, however long: rich wrapped them at 100)
        again = line.replace(str(tmp_path / "out"), str(tmp_path / "again"))
        assert len(again) > 100 and again in shown_lines, text


def test_a_legacy_spec_decoded_says_so(tmp_path):
    """A 1.9 dry run decodes the spec (a pickle) after the walk: seconds at 150k tensors
    (about 6 s on the benchmarks' machine) in which nothing was said. The decode now reports
    the bytes it has read, ending at its total; a spec of a few records says nothing."""
    src = tmp_path / "many.mdl"
    experts = {f"expert{i}.weight": np.full(2, i, np.float32) for i in range(6000)}
    cm.save({"model": experts, "global_step": 1}, src, "1.9")
    proc = run(
        "upgrade", src, "--to", "2.10", "-n", "--drop-dataloader-state", "--progress", "plain"
    )
    assert proc.returncode == 0, proc.stderr
    said = [m for m in progress_lines(proc.stderr) if m["phase"] == "decode spec"]
    assert len(said) >= 2 and said[-1]["done"] == said[-1]["total"], proc.stderr
    assert "(100%)" in said[-1].string, proc.stderr
    proc = run(
        "upgrade",
        FIXTURES / "release-1.9.mdl",
        "--to",
        "2.10",
        "-n",
        "--drop-dataloader-state",
        "--progress",
        "plain",
    )
    assert proc.returncode == 0 and "decode spec" not in proc.stderr, proc.stderr


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def plain(monkeypatch, capsys):
    """A ``PlainProgress`` of a line a second on a clock the test moves; its lines."""
    from ckpt_migrate.cli import console

    clock = Clock()
    monkeypatch.setattr(console.time, "monotonic", clock)
    shown = console.PlainProgress(1.0)

    def at(t: float, phase: str, done: int, total: int) -> str:
        clock.now = 1000.0 + t
        shown(phase, done, total)
        return capsys.readouterr().err.strip()

    return at


def test_a_wait_before_a_phase_moves_is_not_its_pace(plain):
    """``verify``'s first tensor waits for both files' walks (20 s at 150k tensors): the time
    left was that wait times the whole, "about 361 h left"."""
    assert plain(0, "verify", 0, 1000) == ""
    assert plain(20, "verify", 1, 1000) == "verify: 1 B of 1,000 B (0%)"  # (under 1%: no guess)
    assert plain(22, "verify", 101, 1000) == "verify: 101 B of 1,000 B (10%), about 18 s left"


def test_a_phase_that_begins_again_starts_its_clock_again(plain):
    """The second file's ``read`` of ``verify``: its time left was at the rate since the first
    file's began ("about 56 min 56 s left" at 3% of 150k objects)."""
    assert plain(0, "read", 0, 100) == ""
    assert plain(2, "read", 50, 100) == "read: 50 of 100 objects (50%)"
    assert plain(10, "read", 100, 100) == "read: 100 of 100 objects (100%)"
    assert plain(90, "read", 0, 100) == ""
    assert plain(91, "read", 10, 100) == "read: 10 of 100 objects (10%)"
    assert plain(93, "read", 30, 100) == "read: 30 of 100 objects (30%), about 7 s left"


def test_verify_says_each_step_of_both_reads(tmp_path):
    """``verify`` of 150k tensors spent about 50 of its 250 s unsaid, 24 s at once: the walk
    of each file's root (its attributes and links) before its objects, each file's links
    read for the datasets no leaf names, the wait for the chunk indexes' walk and the map of
    overlapping data. Each step now says itself, and ends at 100%; the real 2.6 library's
    file against its upgrade. (Compared from the headers, ``headercompare``: both roots read,
    the first file's datasets' headers and its map of overlapping data, the comparison, then
    the wait for each file's walk, which ran beside it; through HDF5, each file's walk and
    read in turn: ``test_verify_through_hdf5_says_each_step_of_both_reads``.)"""
    (src,) = [p for p in real_2x_files(tmp_path) if p.name.startswith("gpt2-2.6.0")]
    assert run("upgrade", src, "-o", tmp_path / "out", "-q").returncode == 0
    proc = run("verify", src, tmp_path / "out" / src.name, "--progress", "plain")
    assert proc.returncode == 0, proc.stderr
    lines = progress_lines(proc.stderr)
    runs: list[list[re.Match[str]]] = []
    for m in lines:
        if not runs or runs[-1][0]["phase"] != m["phase"]:
            runs.append([])
        runs[-1].append(m)
    order = [r[0]["phase"] for r in runs]
    walked = ["walk root", "read", "check indexes"]
    assert order == ["read root", "read headers", "check overlaps", "verify", *walked, *walked], (
        order
    )
    for r in runs:
        assert r[0]["done"].split()[0] == "0" and r[-1].string.endswith("(100%)"), r[-1].string


def test_verify_through_hdf5_says_each_step_of_both_reads(tmp_path):
    """A pair the headers do not vouch for (a tensor stored with other bytes in the second
    file) is compared through HDF5 once both walks have ended: the comparison's bar waits
    while each walk says its steps, then goes on to its end."""
    (src,) = [p for p in real_2x_files(tmp_path) if p.name.startswith("gpt2-2.6.0")]
    assert run("upgrade", src, "-o", tmp_path / "out", "-q").returncode == 0
    out = tmp_path / "out" / src.name
    with h5py.File(out, "r+") as f:  # (one tensor's value changed: other stored bytes)
        name = next(n for n in f if isinstance(f[n], h5py.Dataset) and f[n].ndim == 2)
        f[name][0, 0] = f[name][0, 0] + 1
    proc = run("verify", src, out, "--progress", "plain")
    assert proc.returncode == 4, proc.stderr
    runs: list[list[re.Match[str]]] = []
    for m in progress_lines(proc.stderr):
        if not runs or runs[-1][0]["phase"] != m["phase"]:
            runs.append([])
        runs[-1].append(m)
    walked = ["walk root", "read", "check indexes"]
    order = [r[0]["phase"] for r in runs]
    assert order == [
        "read root",
        "read headers",
        "check overlaps",
        "verify",
        *walked,
        *walked,
        "verify",
    ], order
    for r in runs[:-1]:
        assert r[0]["done"].split()[0] == "0", r[0].string
    for r in runs:
        assert r[-1].string.endswith("(100%)") or r is runs[3], r[-1].string


def test_a_root_stage_that_passed_between_two_looks_is_still_told_ended():
    """The CI machine's walk said its root's count and its objects' before the parent first
    looked: the root's stage was never told, and ``verify`` skipped "walk root". It is told
    ended (0 then its total) before the objects' stage."""
    from ckpt_migrate.format.h5 import walkreads as w

    heard, told = w.Heard(), []
    heard.take(w.ROOT + b"3000" + w.END + w.ROOTED * 3 + w.OBJECTS + b"40" + w.END + w.WALKED)
    heard.tell(lambda phase, done, total: told.append((phase, done, total)), 1)
    assert told == [
        ("walk root", 0, 3000),
        ("walk root", 3000, 3000),
        ("read", 0, 40),
        ("read", 8, 40),
    ]


def test_items_counted_at_once_are_told_as_one_by_one_would_be():
    """``Count.add`` (a root's attributes vouched for a block at a time, ``heapblocks``)."""
    told: list[tuple[int, int]] = []
    count = Count(lambda phase, done, total: told.append((done, total)), "check root", 25, 10)
    count.add(3)
    count()
    count.add(17)  # 4 -> 21: past 10 and 20 at once
    count.add(0)
    count.add(4)
    count.end()
    assert told == [(0, 25), (10, 25), (20, 25), (25, 25)]
