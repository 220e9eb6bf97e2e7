"""The command line as a user meets it: real processes, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import FIXTURES, REAL, one_line_error, run_capped, run_cli, written_to_after

import ckpt_migrate as cm
from ckpt_migrate.format.read import read_checkpoint


def test_help_does_not_import_torch():
    code = (
        "import sys; from ckpt_migrate.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip().endswith("NO-TORCH"), out.stdout + out.stderr
    assert "inspect" in out.stdout and "from-torch" in out.stdout


def test_inspect_does_not_import_torch():
    code = (
        "import sys; from ckpt_migrate.cli.main import main\n"
        f"main(['inspect', {str(REAL / 'basic.mdl')!r}, '--json'])\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip().endswith("NO-TORCH"), out.stderr


# The engines of the verbs that write (``cli.upgrades``, ``cli.conversions``): 35 ms of the
# 160 ms of a ``check`` when every verb's work was one module.
UPGRADE_ENGINES = ("ckpt_migrate.engine.upgrade", "ckpt_migrate.config.upgrade")
OTHER_ENGINES = ("ckpt_migrate.model_dir.upgrade_dir", "ckpt_migrate.remote.dirs")
CONVERSION_ENGINES = ("ckpt_migrate.hf.export", "ckpt_migrate.hf.import_", "ckpt_migrate.tf.to_h5")


def _loaded_by(argv: list[str], modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` the command line ``argv`` loads, in a fresh interpreter."""
    code = (
        "import json, sys; from ckpt_migrate import cli\n"
        f"sys.argv = ['ckpt-migrate', *{argv!r}]\n"
        "try:\n    cli.run()\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps([m for m in {modules!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [
        ["check", str(REAL / "basic.mdl")],
        ["inspect", str(FIXTURES / "release-1.9.mdl"), "--json"],
        ["plan", str(FIXTURES / "release-1.9.mdl"), "--to", "2.10"],
        ["verify", str(REAL / "basic.mdl"), str(REAL / "basic.mdl")],
    ],
)
def test_the_read_side_verbs_load_no_engine_that_writes(argv):
    assert _loaded_by(argv, UPGRADE_ENGINES + OTHER_ENGINES + CONVERSION_ENGINES) == []


def test_upgrade_loads_its_engine_and_no_conversion(tmp_path):
    argv = ["upgrade", str(FIXTURES / "release-1.9.mdl"), "-o", str(tmp_path)]
    loaded = _loaded_by([*argv, "--drop-dataloader-state"], UPGRADE_ENGINES + CONVERSION_ENGINES)
    assert loaded == list(UPGRADE_ENGINES)
    assert (tmp_path / "release-1.9.mdl").is_file()


def test_upgrade_starts_lean(tmp_path):
    """What the command start costs on every upgrade (benchmarks/README.md, issue #21): no
    torch, no pydantic (typer 0.29 brought it and a validator per option), and numpy's BLAS
    asked for one thread (it starts a spinning one per core otherwise)."""
    src = FIXTURES / "release-1.9.mdl"
    code = (
        "import json, os, sys; from ckpt_migrate import cli\n"
        f"sys.argv = ['ckpt-migrate', 'upgrade', {str(src)!r}, '-o', {str(tmp_path)!r}, "
        "'--drop-dataloader-state', '--json']\n"
        "try:\n    cli.run()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "loaded = [m for m in ('torch', 'pydantic') if m in sys.modules]\n"
        "print(json.dumps([code, loaded, os.environ.get('OPENBLAS_NUM_THREADS')]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [0, [], "1"], out.stdout + out.stderr
    assert (tmp_path / src.name).is_file()


def test_inspect_text_and_json():
    proc = run_cli("inspect", str(FIXTURES / "release-1.9.mdl"))
    assert proc.returncode == 0, proc.stderr
    assert "release 1.9" in proc.stdout and "format 0.3" in proc.stdout
    assert "MISSING" in proc.stdout and "model.lm_head.weight" in proc.stdout
    assert "__model.x.arg_0" in proc.stdout
    data = json.loads(run_cli("inspect", str(REAL / "tied.mdl"), "--json").stdout)
    assert data["release"] == "2.10" and data["leaf_count"] == 7
    tied = {e["name"]: e.get("tied_to") for e in data["leaves"]}
    assert tied["model.lm_head.weight"] == "model.embed.weight"
    assert data["bytes_by_dtype"]["float32"] == {"tensors": 3, "bytes": 4 * (24 + 3 + 24)}


@pytest.mark.parametrize(
    ("content", "code", "word"),
    [
        (b"not a checkpoint", 2, "not an HDF5 file"),
        (b"", 2, "empty file"),
    ],
)
def test_bad_files_give_one_line_errors(tmp_path, content, code, word):
    p = tmp_path / "bad.mdl"
    p.write_bytes(content)
    one_line_error(run_cli("inspect", str(p)), code, str(p), word)


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("params.yaml", "a command that converts its config takes it as --config FILE"),
        ("data_iter_checkpoint_state_file_global", "name a checkpoint file (.mdl)"),
        ("model.pt", "torch.save files: use from-torch"),
        ("model-legacy.pt", "torch.save files: use from-torch"),
        ("pytorch_model.bin", "a Hugging Face weights file: `ckpt-migrate import-hf`"),
        ("model.safetensors", "a safetensors file: `ckpt-migrate import-hf` takes its Hugging"),
        ("weights.bin", "a safetensors file: `ckpt-migrate import-hf`"),  # (by its bytes)
    ],
)
def test_a_file_that_is_not_hdf5_gets_the_fix_its_kind_needs(tmp_path, name, fix):
    """Every such file was told "torch.save files: use from-torch": the shipped example's
    params.yaml and its 1.9 dataloader side file too; a Hugging Face file, as written by
    torch and by the safetensors library, names ``import-hf``."""
    if name.endswith((".pt", "model.bin")):
        import torch

        src = tmp_path / name
        torch.save({"w": torch.ones(2)}, src, _use_new_zipfile_serialization="legacy" not in name)
    elif name.endswith(("safetensors", "weights.bin")):
        import numpy as np
        from safetensors.numpy import save_file

        src = tmp_path / name
        save_file({"w": np.ones(2, np.float32)}, str(src))
    else:
        src = next((FIXTURES / "example").rglob(name))
    for command in ("inspect", "upgrade"):
        proc = run_cli(command, src, *(["-o", tmp_path / "out"] if command == "upgrade" else []))
        one_line_error(proc, 2, str(src), "not an HDF5 file", fix)


def test_truncated_and_missing_files(tmp_path):
    p = tmp_path / "trunc.mdl"
    data = (REAL / "basic.mdl").read_bytes()
    p.write_bytes(data[:4096])
    proc = run_cli("inspect", str(p))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    one_line_error(run_cli("inspect", str(tmp_path / "nope.mdl")), 2, "no such file")


def test_malicious_spec_exits_nonzero_and_runs_nothing(tmp_path):
    import h5py

    sentinel = tmp_path / "pwned"
    cmd = f"touch {sentinel}".encode()
    payload = b"\x80\x02cos\nsystem\nq\x00X" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R."
    p = tmp_path / "evil.mdl"
    with h5py.File(p, "w") as f:
        f.attrs["__spec__"] = payload.hex()
        f.attrs["__version__"] = 0.3
    one_line_error(run_cli("inspect", str(p)), 2, "os.system")
    assert not sentinel.exists()


@pytest.mark.parametrize("where", ["before the verb", "after the verb"])
def test_debug_shows_traceback_and_keeps_the_exit_code(tmp_path, where):
    p = tmp_path / "bad.mdl"
    p.write_bytes(b"x")
    args = ["--debug", "inspect", p] if where == "before the verb" else ["inspect", p, "--debug"]
    proc = run_cli(*args)
    assert proc.returncode == 2 and "Traceback" in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")


def test_help_reads_as_written():
    """-h works; flags show no value type; the extra a verb needs is named, not eaten as
    markup."""
    short, long = run_cli("-h"), run_cli("--help")
    assert short.returncode == 0 and short.stdout == long.stdout
    assert "ckpt-migrate[tensorflow] extra" in long.stdout and "(needs )" not in long.stdout
    upgrade = run_cli("upgrade", "-h").stdout
    dry_run = next(line for line in upgrade.splitlines() if "--dry-run" in line)
    assert "<bool>" not in dry_run and "Preview" in dry_run
    for args in (["-h"], ["upgrade", "-h"]):
        assert "<bool>" not in run_cli(*args).stdout
    assert "<str>" in next(line for line in upgrade.splitlines() if "--to " in line)


def test_to_torch_from_torch_commands(tmp_path):
    pt, back = tmp_path / "x.pt", tmp_path / "x.mdl"
    assert run_cli("to-torch", str(REAL / "basic.mdl"), str(pt)).returncode == 0
    proc = run_cli("from-torch", str(pt), str(back), "--release", "2.0", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["format"] == 0.4
    again = run_cli("from-torch", str(pt), str(back))
    one_line_error(again, 2, "already exists")


def test_usage_error_exit_code():
    assert run_cli("inspect").returncode == 2
    assert run_cli("from-torch", "a", "b", "--release", "9.9").returncode == 2


def test_upgrade_of_a_missing_file_is_bad_input(tmp_path):
    proc = run_cli("upgrade", str(tmp_path / "nope.mdl"), "--output-dir", str(tmp_path))
    one_line_error(proc, 2, "no such file")


def test_a_command_line_problem_is_said_once_not_once_per_file(tmp_path):
    """``upgrade a.mdl b.mdl`` without a destination: the command line is wrong, not each file,
    so one line (it was printed once per path)."""
    src = FIXTURES / "release-2.0.mdl"
    proc = run_cli("upgrade", src, src)
    one_line_error(proc, 2, "say where the upgraded file goes; pass --output-dir DIR or --inplace")
    proc = run_cli("upgrade", src, src, "--inplace", "--output-dir", tmp_path)
    one_line_error(proc, 2, "--inplace and --output-dir exclude each other")


def test_names_from_files_never_reach_the_terminal_raw(tmp_path):
    """A file or key name with terminal escapes is shown escaped, in results and in errors."""
    evil = tmp_path / "\x1b]0;pwned\x07\x1b[2Jckpt.mdl"
    proc = run_cli("inspect", evil)
    line = one_line_error(proc, 2, "no such file")
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
    assert "\\x1b]0;pwned\\x07" in line
    src = tmp_path / "keys.mdl"
    cm.save({"model": {"\x1b[31mred": np.zeros(2, np.float32)}}, src, "2.0")
    with h5py.File(src, "r+") as f:  # a leaf the spec names but the file lacks
        for name in [k for k in f if k.startswith("model.")]:
            del f[name]
    proc = run_cli("inspect", src)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\\x1b[31mred" in proc.stdout


def test_a_newline_in_a_name_never_makes_two_lines(tmp_path):
    """A file named ``ck\nnl.mdl`` in a model directory: its line of ``upgrade-dir`` (and of
    ``upgrade``, and its row of the summary) was two lines, the second starting ``nl.mdl:``,
    which a log reader (or a name crafted to look like another result) took for a record of
    its own. Newlines in names are escaped as the other control characters are; ``--json``
    stays JSON. Release 2.0 files as the fixtures hold them."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(FIXTURES / "release-2.0.mdl", run / "ck\nnl.mdl")
    shutil.copyfile(FIXTURES / "release-2.0.mdl", run / "checkpoint_2.mdl")
    proc = run_cli("upgrade-dir", run, "-o", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert not any(line.startswith("nl.mdl") for line in lines), proc.stdout
    assert any("ck\\x0anl.mdl: 2.0 → 2.10 written to" in line for line in lines), proc.stdout
    proc = run_cli("upgrade", run / "ck\nnl.mdl", "-o", tmp_path / "one", "-q")
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 1, proc.stdout
    proc = run_cli("upgrade", run / "ck\nnl.mdl", "-o", tmp_path / "two", "-q", "--json")
    assert json.loads(proc.stdout)["source"] == str(run / "ck\nnl.mdl")


# --------------------------------------------------------------------------- a newcomer's view


def test_inspect_summarises_and_never_wraps_when_piped():
    example = FIXTURES / "format-test" / "checkpoint_100.mdl"
    proc = run_cli("inspect", example)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) <= 60, proc.stdout
    assert "… 6 more" in proc.stdout and "--all shows every leaf" in proc.stdout
    tie = "'lm_head.weight': tensor float32[6, 4]  (tied to model.embedding_layer.word_embeddings"
    assert any(tie in line for line in lines), proc.stdout  # one line, though over 80 columns
    full = run_cli("inspect", example, "--all").stdout
    assert "… " not in full and "'bytes_u8': tensor uint8[6]" in full
    assert len(full.splitlines()) > len(lines)
    top = run_cli("inspect", example, "--depth", "1").stdout
    assert "  'model': OrderedDict (14)" in top and "'fc.weight'" not in top
    assert json.loads(run_cli("inspect", example, "--json").stdout)["outline_summary"] is False


def test_inspect_all_shows_every_leaf_past_ten_thousand(tmp_path):
    """``--all`` ("the whole tree outline, every leaf") stopped after its 10,000th line with
    nothing said: of a 150k-tensor checkpoint it showed the first 4% (and in ``--json``'s
    ``outline`` too)."""
    path = tmp_path / "many.mdl"
    cm.save({"m": {str(i): i for i in range(10_050)}, "last": np.zeros(2, np.float32)}, path)
    text = run_cli("inspect", path, "--all").stdout.splitlines()
    assert text[-2:] == ["    '10049': 10049", "  'last': ndarray float32[2]"]
    assert sum(line.startswith("    '") for line in text) == 10_050
    outline = json.loads(run_cli("inspect", path, "--all", "--json").stdout)["outline"]
    assert len(outline) == 10_053 and outline[-1] == "  'last': ndarray float32[2]"


def test_names_are_shown_as_they_are_not_as_markup_or_emoji_codes(tmp_path):
    """rich took a name for its markup and emoji codes: ``run[best]/a:smile:.mdl`` was shown
    as ``run/a😄.mdl`` by ``inspect``, a key ``':smile:'`` as ``'😄'``, and ``upgrade-dir``'s
    summary listed ``[bold]x:smile:.mdl`` as a bold ``x😄.mdl``."""
    folder = tmp_path / "run[best]"
    folder.mkdir()
    real = folder / "[bold]x:smile:.mdl"
    shutil.copyfile(REAL / "basic.mdl", real)
    keys = folder / "keys.mdl"
    cm.save({":smile:": 1, "[red]w[/red]": np.zeros(2, np.float32)}, keys)
    shown = run_cli("inspect", real, "--progress", "bar").stdout
    assert shown.splitlines()[0] == str(real)
    listed = run_cli("inspect", keys, "--all").stdout
    assert "  ':smile:': 1" in listed and "  '[red]w[/red]': ndarray float32[2]" in listed
    summary = run_cli("upgrade-dir", folder, "-o", tmp_path / "out").stdout
    assert "│ [bold]x:smile:.mdl │" in summary and "😄" not in summary + shown + listed


def test_shell_completion_is_offered_and_completes_verbs_and_options():
    assert "--install-completion" in run_cli("--help").stdout
    env = {**os.environ, "_CKPT_MIGRATE_COMPLETE": "complete_bash", "COMP_CWORD": "2"}
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from ckpt_migrate.cli import entry; sys.exit(entry())"],
        env={**env, "COMP_WORDS": "ckpt-migrate upgrade --dr"},
        capture_output=True,
        text=True,
    )
    assert "--dry-run" in proc.stdout.split(), proc.stdout + proc.stderr


def test_json_is_written_as_it_is_encoded_and_reads_as_before(capsys, monkeypatch):
    """``emit_json`` writes the indented JSON a piece at a time (never the whole text, nor
    ``json.dumps``' million pieces, at 150k tensors), with the same text, unprintables shown
    as escapes, across pieces' edges, ending in one newline."""
    from ckpt_migrate.cli import console, render

    data = {
        "leaves": [{"name": f"w{i}\x07", "value": "tensor float32[4, 2]"} for i in range(3000)],
        "path": "/x/\udcff.mdl",
        "n": 1.5,
    }
    writes: list[int] = []
    real = console.sys.stdout.write
    monkeypatch.setattr(console.sys.stdout, "write", lambda t: writes.append(len(t)) or real(t))
    render.emit_json(data)
    out = capsys.readouterr().out
    assert out == console.safe_lines(json.dumps(data, indent=2, default=str)) + "\n"
    assert json.loads(out) == data  # (ASCII text: the escapes are JSON's own)
    assert len(writes) > 3 and max(writes) < 2 * (1 << 16)


@pytest.mark.parametrize(
    "verb",
    [
        ["inspect"],
        ["plan"],
        ["check"],
        ["upgrade", "--output-dir", "{tmp}"],
        ["upgrade", "--inplace"],
        ["to-torch", "{tmp}/out.pt"],
        ["export-hf", "{tmp}/hf", "--config", str(FIXTURES / "models/gpt2-2.0/params.yaml")],
    ],
)
def test_a_named_pipe_is_refused_not_waited_on(tmp_path, verb):
    """``mkfifo checkpoint_7.mdl``: every reader but ``upgrade-dir`` (which leaves what is not a
    regular file alone) opened it and waited for a writer, or for the preflight's 10 s
    watchdog."""
    fifo = tmp_path / "checkpoint_7.mdl"
    os.mkfifo(fifo)
    args = [a.replace("{tmp}", str(tmp_path)) for a in verb]
    proc, _ = run_capped(args[0], fifo, *args[1:], seconds=60)
    one_line_error(proc, 2, "checkpoint_7.mdl", "not a regular file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_7.mdl"]


@pytest.mark.parametrize("verb", [["upgrade", "--output-dir", "{tmp}/out"], ["inspect"]])
def test_a_directory_is_refused_with_the_verb_that_takes_one(tmp_path, verb):
    model_dir = tmp_path / "model_dir"
    model_dir.mkdir()
    shutil.copyfile(FIXTURES / "release-2.3.mdl", model_dir / "checkpoint_1.mdl")
    args = [a.replace("{tmp}", str(tmp_path)) for a in verb]
    proc = run_cli(args[0], model_dir, *args[1:])
    one_line_error(proc, 2, "model_dir: is a directory", "ckpt-migrate upgrade-dir")
    assert not (tmp_path / "out").exists()


READS, WRITES = "this command reads local files", "this command writes local files"


@pytest.mark.parametrize(
    ("args", "address", "words"),
    [
        (("inspect", "s3://bkt/run/ckpt.mdl"), "s3://bkt/run/ckpt.mdl", READS),
        (("plan", "s3://bkt/ckpt.mdl"), "s3://bkt/ckpt.mdl", READS),
        (("check", "s3://bkt/ckpt.mdl"), "s3://bkt/ckpt.mdl", READS),
        (("verify", REAL / "basic.mdl", "s3://bkt/ckpt.mdl"), "s3://bkt/ckpt.mdl", READS),
        (("to-torch", "s3://bkt/ckpt.mdl", "x.pt"), "s3://bkt/ckpt.mdl", READS),
        (("from-torch", "s3://bkt/x.pt", "x.mdl"), "s3://bkt/x.pt", READS),
        (("import-hf", "s3://bkt/hf", "x.mdl"), "s3://bkt/hf", READS),
        (("export-hf", "s3://bkt/ckpt.mdl", "hf"), "s3://bkt/ckpt.mdl", READS),  # (no --config)
        (("to-torch", REAL / "basic.mdl", "s3://bkt/x.pt"), "s3://bkt/x.pt", WRITES),
        (
            ("export-hf", REAL / "basic.mdl", "s3://bkt/hf", "--model", "gpt2"),
            "s3://bkt/hf",
            WRITES,
        ),
        (("from-torch", "TORCH", "s3://bkt/x.mdl"), "s3://bkt/x.mdl", WRITES),
    ],
)
def test_an_object_address_given_to_a_local_command_is_said_so(tmp_path, args, address, words):
    """``inspect s3://bkt/ckpt.mdl`` said "s3:/bkt/ckpt.mdl: no such file; check the path", and
    ``to-torch ckpt.mdl s3://bkt/x.pt`` "its directory does not exist; create it first"."""
    if "TORCH" in args:
        import torch

        torch.save({"w": torch.zeros(2)}, tmp_path / "x.pt")
        args = tuple(tmp_path / "x.pt" if a == "TORCH" else a for a in args)
    before = sorted(tmp_path.iterdir())
    proc = run_cli(*args, cwd=tmp_path)
    line = one_line_error(proc, 2, f"{address}: is an object-store address; {words}")
    assert "upgrade and upgrade-dir" in line
    assert sorted(tmp_path.iterdir()) == before  # no s3: directory made here


def test_the_converters_take_to_as_upgrade_does(tmp_path):
    """``upgrade --to 2.6`` names the release to write; ``from-torch`` and ``import-hf`` knew
    only ``--release``, and click offered "--json" for a ``--to``. Both names work now. The
    real 2.10 library's file, and the Model Zoo GPT-2 fixture exported to Hugging Face."""
    real = REAL / "basic.mdl"
    state = tmp_path / "state.pt"
    assert run_cli("to-torch", real, state).returncode == 0
    models = FIXTURES / "models" / "gpt2-2.0"
    hf = tmp_path / "hf"
    export = ("export-hf", models / "checkpoint_100.mdl", hf, "--config", models / "params.yaml")
    assert run_cli(*export).returncode == 0
    for name in ("--to", "--release"):
        for verb, src, release in (("from-torch", state, "2.6"), ("import-hf", hf, "2.3")):
            out = tmp_path / f"{verb}{name}.mdl"
            proc = run_cli(verb, src, out, name, release, "--json")
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout)["release"] == release
            with read_checkpoint(out) as ckpt:
                assert ckpt.release.name == release


@pytest.mark.parametrize(
    "args",
    [
        ("inspect", REAL / "basic.mdl", "--json"),
        ("inspect", REAL / "basic.mdl", "--all"),  # (rich's table)
        ("history",),
        ("plan", FIXTURES / "release-1.9.mdl"),
    ],
    ids=lambda args: args[0] + ("-" + args[-1].lstrip("-") if len(args) > 2 else ""),
)
def test_a_report_the_disk_cannot_take_is_an_io_error(args):
    """``inspect --json > report.json`` on a full disk (``/dev/full`` here) was "internal
    error: OSError: [Errno 28] No space left on device; rerun with --debug", exit 1. It is
    the I/O error it is, exit 5. A reader that goes away (``| head -1``) still ends the
    command quietly, as click does. The real 2.10 library's file; the 1.7-era fixture."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    command = [sys.executable, "-m", "ckpt_migrate", *map(str, args)]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True)
    one_line_error(proc, 5, "cannot write to standard output (No space left on device)")


def test_a_reader_gone_still_ends_the_command_quietly(tmp_path):
    """``inspect --all | head -1`` of an outline larger than a pipe holds: the write that
    finds the reader gone is not taken for a full disk (``console._Report``). Its exit code is
    141, as a shell gives ``cat`` there; it was click's 1, the code of an internal error."""
    experts = {f"expert{i}.weight": np.full(2, i, np.float32) for i in range(3000)}
    cm.save({"model": experts}, tmp_path / "many.mdl", "2.5")
    command = [sys.executable, "-m", "ckpt_migrate", "inspect", str(tmp_path / "many.mdl")]
    reader = subprocess.Popen(
        [*command, "--all"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert reader.stdout is not None and reader.stderr is not None
    assert reader.stdout.readline().strip() == str(tmp_path / "many.mdl")
    reader.stdout.close()  # (as ``head -1`` does, the rest unread)
    assert reader.wait(timeout=60) == 141
    assert reader.stderr.read() == ""


def test_a_file_written_to_while_it_is_verified_voids_the_verdict(tmp_path, monkeypatch):
    """``verify`` compares the two files tensor by tensor, ``check --deep`` decodes each: a
    file written to meanwhile gave a verdict ("identical", a difference, intact) on neither of
    its versions. The real 2.10 library's file and a copy of it, the copy written to."""
    from ckpt_migrate.cli import commands
    from ckpt_migrate.errors import VerificationError
    from ckpt_migrate.format import headercompare

    copy = tmp_path / "copy.mdl"
    shutil.copyfile(REAL / "basic.mdl", copy)
    assert commands.verify(REAL / "basic.mdl", copy)["identical"]
    # (compared from the headers, then through HDF5 where the headers do not answer)
    written_to_after(monkeypatch, headercompare, "compare_trees", copy)
    with pytest.raises(VerificationError, match="written to while it was read; the comparison"):
        commands.verify(REAL / "basic.mdl", copy)
    shutil.copyfile(REAL / "basic.mdl", copy)
    monkeypatch.setattr(headercompare, "compare", lambda *a, **k: None)
    written_to_after(monkeypatch, commands, "compare_trees", copy)
    with pytest.raises(VerificationError, match="written to while it was read; the comparison"):
        commands.verify(REAL / "basic.mdl", copy)
    # and ``check --deep``, whose verdict is every tensor's
    from ckpt_migrate.format import deep_check

    written_to_after(monkeypatch, deep_check, "check_tensors", copy)
    with pytest.raises(VerificationError, match="written to while it was read; the check"):
        commands.deep_check(copy)


def test_the_worst_of_several_checks_is_an_errors_before_an_upgrade_needed():
    from ckpt_migrate.cli.checks import worst

    assert worst([0, 10, 2, 0]) == 2 and worst([10, 3]) == 3 and worst([5, 2, 10]) == 5
    assert worst([0, 10, 0]) == 10 and worst([0, 0]) == 0 and worst([]) == 0


def test_a_run_of_alike_changes_is_one_line_and_json_lists_each(tmp_path):
    """A 1.9 SequentialLR of 300 stages printed 300 ``last_epoch`` lines (3,000 stages, 200 KB);
    a run of lines alike but for their numbers is now its first two and a count."""
    stages = 300
    sched = {
        "_schedulers": [
            {"base_lrs": [1e-3], "last_epoch": 50, "_step_count": 51} for _ in range(stages)
        ],
        "_milestones": [5 * (i + 1) for i in range(stages - 1)],
        "last_epoch": 50,
    }
    src = tmp_path / "s.mdl"
    cm.save({"model": {"w": np.ones(2, np.float32)}, "lr_scheduler": sched, "global_step": 100},
            src, release="1.9")  # fmt: skip
    drop = "--drop-dataloader-state"
    proc = run_cli("upgrade", src, "--to", "2.0", "--output-dir", tmp_path / "o", drop)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "last_epoch" in line]
    assert lines[1:] == [
        "  [1.9→2.0] lr_scheduler._schedulers.0.last_epoch: 50 → 100",
        "  [1.9→2.0] lr_scheduler._schedulers.1.last_epoch: 50 → 95",
    ]
    proc_json = run_cli(
        "upgrade", src, "--to", "2.0", "--output-dir", tmp_path / "j", drop, "--json"
    )
    changed = sum("_schedulers." in c for c in json.loads(proc_json.stdout)["changes"])
    assert changed == stages - 1  # (stage 10's last_epoch is 50 already)
    assert f"  [1.9→2.0] … and {changed - 2} more like these (--json lists each)" in proc.stdout
    script = subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "scripts" / "fix_checkpoint_spec.py"),
         str(src), "--fixed_checkpoint_path", str(tmp_path / "f.mdl"), "--drop_dataloader_state"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert script.returncode == 0, script.stderr
    assert f"… and {changed - 2} more like these\n" in script.stdout  # (no --json to name)
