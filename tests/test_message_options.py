"""Every option a message suggests exists, with that spelling, on each command that can say it.

The messages are the string literals (docstrings and comments left out) of the modules a
command runs; each ``--option`` in them must be an option of that command (its click options,
or the script's argparse options). A message that is only said under an option the command
lacks, or that names the commands taking the option, is listed in ``NOT_SAID`` with the reason.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
from pathlib import Path

import pytest
import typer
from conftest import ROOT

from ckpt_migrate.cli.main import click_command

OPTION = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
GLOBAL = {"--help", "--debug", "--version"}

READ = ["ckpt_migrate/format/**/*.py", "ckpt_migrate/atomic.py"]
STEPS = [
    "ckpt_migrate/engine/*.py",
    "ckpt_migrate/hops/*.py",
    "migrations/*.py",
    "ckpt_migrate/models/*.py",
    "ckpt_migrate/config/*.py",
]
COMMANDS_PY = "ckpt_migrate/cli/commands.py"
UPGRADES_PY = "ckpt_migrate/cli/upgrades.py"
SHARED = [f"{COMMANDS_PY}::{f}" for f in ("step_inputs", "check_verify", "load_config")]

# command -> the modules (or "module::function") whose messages it can show
SOURCES = {
    "upgrade": [*READ, *STEPS, f"{UPGRADES_PY}::upgrade", *SHARED],
    "upgrade-dir": [
        *READ,
        *STEPS,
        "ckpt_migrate/model_dir/upgrade_dir.py",
        f"{UPGRADES_PY}::upgrade_dir",
        *SHARED,
    ],
    "plan": [
        *READ,
        "ckpt_migrate/engine/plan.py",
        "ckpt_migrate/models/detect.py",
        "ckpt_migrate/models/names.py",
        f"{COMMANDS_PY}::plan",
    ],
    "check": [*READ, "ckpt_migrate/engine/plan.py"],
    "inspect": READ,
    "verify": READ,
    "history": ["ckpt_migrate/hops/graph.py"],
    "to-torch": [*READ, "ckpt_migrate/torch/api.py::to_torch", "ckpt_migrate/torch/api.py::load"],
    "from-torch": [
        *READ,
        *(f"ckpt_migrate/torch/api.py::{f}" for f in ["from_torch", "from_python", "_leaf_of"]),
    ],
    "tf-to-h5": [*READ, "ckpt_migrate/tf/to_h5.py", "ckpt_migrate/tf/stage.py"],
    "h5-to-tf": [*READ, "ckpt_migrate/tf/from_h5.py", "ckpt_migrate/tf/saver.py"],
    # export-hf runs the hops in memory with the dataloader state and orphan sparsity masks
    # dropped (an HF model has neither) and every leaf allowed to be missing until the model's
    # own are read; the config steps only give it the model section (their report is not shown)
    "export-hf": [
        *READ,
        "ckpt_migrate/engine/plan.py",
        "ckpt_migrate/engine/upgrade.py::apply_hops",
        "ckpt_migrate/hops/graph.py",
        "ckpt_migrate/hops/trainer_metadata.py",
        "ckpt_migrate/models/*.py",
        "migrations/v01_1_7_to_1_8.py::keep_unprefixed_model_keys",
        *(f"migrations/v03_1_9_to_2_0.py::{f}" for f in ["fix_spec", "recompute_last_epoch"]),
        "migrations/v04_2_0_to_2_1.py",
        "migrations/v0[6-9]_*.py",
        "migrations/v1[0-9]_*.py",
        "ckpt_migrate/config/upgrade.py::upgrade_config_text",
        "ckpt_migrate/config/yaml_edit.py",
        *(
            f"ckpt_migrate/hf/{m}.py"
            for m in ["export", "safetensors_io", "rules", "arrays", "outdir", "table", "heads"]
        ),
        *(f"ckpt_migrate/hf/{m}.py" for m in ["ops", "experts"]),
        *(
            f"ckpt_migrate/hf/{m}.py"
            for m in ["families", "served", "compose", "parts", "encoders", "fused"]
        ),
        "ckpt_migrate/hf/layouts/*.py",
    ],
    "import-hf": [
        *READ,
        "ckpt_migrate/config/upgrade.py::upgrade_config_text",
        *(
            f"ckpt_migrate/hf/{m}.py"
            for m in ["import_", "safetensors_io", "rules", "arrays", "table", "heads"]
        ),
        *(f"ckpt_migrate/hf/{m}.py" for m in ["ops", "experts"]),
        *(
            f"ckpt_migrate/hf/{m}.py"
            for m in ["families", "served", "compose", "parts", "encoders", "fused"]
        ),
        "ckpt_migrate/hf/layouts/*.py",
        "ckpt_migrate/torch/hf_bin.py",
        "ckpt_migrate/jsonfile.py",
    ],
}

# (option, module) -> why a command without the option never shows it as a suggestion
NOT_SAID = {
    ("--drop-unmatched-keys", "ckpt_migrate/models/steps.py"): (
        "said only when convert_checkpoint.py's --drop-unmatched-keys was given"
    ),
    ("--from", "ckpt_migrate/format/read.py"): "said only when --from was given",
    ("--from", "ckpt_migrate/format/releases.py"): (
        "the hint names the commands that take it: 'with --from R (upgrade, plan, check)'"
    ),
    ("--allow-missing", "ckpt_migrate/format/write.py"): (
        "missing leaves come only from a checkpoint read; from-torch and tf-to-h5 never have "
        "them, and every command that reads one takes --allow-missing"
    ),
    ("--num-csx", "ckpt_migrate/config/upgrade.py"): "said only when --num-csx was given",
    ("--force", "ckpt_migrate/atomic.py"): (
        "check_output: said only when --force was given (upgrade, its output or --manifest); "
        "upgrade-dir never replaces an output"
    ),
    ("--config", "ckpt_migrate/format/h5/io.py"): (
        "the hint of a YAML file given as a checkpoint says where it goes: 'a command that "
        "converts its config takes it as --config FILE' (upgrade, upgrade-dir, export-hf and "
        "the scripts; it named ckpt-migrate's upgrade, which the scripts do not have)"
    ),
    ("--manifest", "ckpt_migrate/engine/manifest.py"): (
        "said only when --manifest was given (upgrade); upgrade-dir writes no manifest"
    ),
}


def _files(pattern: str) -> list[tuple[Path, str | None]]:
    path, _, function = pattern.partition("::")
    return [(p, function or None) for p in sorted(ROOT.glob(path))]


def _docstrings(tree: ast.AST) -> set[int]:
    """Docstrings, and the spellings an ``InputSpec`` declares (``aliases=``): no messages."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
        if isinstance(node, ast.keyword) and node.arg == "aliases":
            ids.update(id(n) for n in ast.walk(node.value) if isinstance(n, ast.Constant))
    return ids


def suggested(path: Path, function: str | None = None) -> set[str]:
    """The ``--options`` in the string literals of ``path`` (of one function, if given)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if function is not None:
        tree = next(
            n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function
        )
    skip = _docstrings(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found.update(f"--{m}" for m in OPTION.findall(node.value))
    return found


def click_options(name: str) -> set[str]:
    """The options ``name`` takes as ``ckpt-migrate`` runs it (the hops' inputs included)."""
    command = click_command().commands[name]
    params = command.get_params(typer.Context(command))
    return {o for p in params for o in getattr(p, "opts", [])} | GLOBAL


@pytest.mark.parametrize("command", sorted(SOURCES))
def test_every_option_a_message_suggests_exists_on_the_command(command):
    have = click_options(command)
    lacking = []
    for pattern in SOURCES[command]:
        for path, function in _files(pattern):
            rel = str(path.relative_to(ROOT))
            for option in suggested(path, function) - have:
                if (option, rel) not in NOT_SAID:
                    lacking.append(f"{rel}{'::' + function if function else ''}: {option}")
    assert not lacking, f"ckpt-migrate {command} lacks options its messages suggest: {lacking}"


def test_the_not_said_list_is_current():
    """Each exception still names an option that module suggests (no stale entries)."""
    for option, rel in NOT_SAID:
        assert option in suggested(ROOT / rel), (option, rel)
    for pattern in {p for sources in SOURCES.values() for p in sources}:
        assert _files(pattern), f"{pattern} names no file"


def test_the_upgrade_dir_options_the_brief_names_exist():
    have = click_options("upgrade-dir")
    for option in (
        "--data-iter-dir",
        "--dataloader-type",
        "--shuffle-seed",
        "--allow-step-mismatch",
        "--drop-dataloader-state",
        "--config",
        "--model",
    ):
        assert option in have


# --------------------------------------------------------------------------- the scripts

# The reader, the engine and the 1.x → 2.0 steps the scripts run, whose messages they show.
SCRIPT_SOURCES = [
    *READ,
    "ckpt_migrate/engine/upgrade.py",
    "ckpt_migrate/engine/copypatch.py",
    "migrations/v01_1_7_to_1_8.py",
    "migrations/v02_1_8_to_1_9.py",
    "migrations/v03_1_9_to_2_0.py",
    "ckpt_migrate/hops/dataloader.py",
    "ckpt_migrate/models/steps.py",
    "ckpt_migrate/models/detect.py",
]
SCRIPT_NOT_SAID = {
    "--num-csx": "a config step: these scripts upgrade no config (convert's is upgraded "
    "separately, after the checkpoint)",
    "--drop-unmatched-keys": "said only when convert's --drop-unmatched-keys was given",
    "--from": "said only when --from was given, or with the commands that take it "
    "(releases.FROM_HINT)",
    "--copy-method": "said only when --copy-method clone was given",
    "--force": "said only when --force was given",
    "--inplace": "said only for an output in an --output-dir: a script names its output file "
    "(engine.upgrade._target)",
    "--output-dir": "said only for an output in an --output-dir, as --inplace",
}
# data_iter_state_conversion.py requires the side files: nothing is ever dropped
REQUIRED_SIDE_FILES = {"data_iter_state_conversion": {"--drop-dataloader-state"}}


def _parser(script: str, verb: str | None = None) -> argparse.ArgumentParser:
    spec = importlib.util.spec_from_file_location(script, ROOT / "scripts" / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parser = module.create_arg_parser()
    if verb is not None:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[verb]
    return parser


@pytest.mark.parametrize(
    ("script", "verb"),
    [
        ("fix_checkpoint_spec", None),
        ("data_iter_state_conversion", None),
        ("convert_checkpoint", "convert"),
    ],
)
def test_every_option_the_2_0_steps_suggest_exists_on_the_scripts(script, verb):
    have = {s for a in _parser(script, verb)._actions for s in a.option_strings}
    wanted = set().union(*(suggested(p) for pat in SCRIPT_SOURCES for p, _ in _files(pat)))
    lacking = sorted(wanted - have - set(SCRIPT_NOT_SAID) - REQUIRED_SIDE_FILES.get(script, set()))
    assert not lacking, f"{script} lacks options the 2.0 steps' messages suggest: {lacking}"
