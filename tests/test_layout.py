"""The house rules (README "Development"), checked from the code's own imports.

* Rooms import only the rooms below them (``RANKS``); no import cycle between modules.
* A project module is never imported inside a function: such an import hides a real edge. Only
  the package faces (``ckpt_migrate/__init__.py``, ``ckpt_migrate/cli/__init__.py``) import
  lazily, so that ``import ckpt_migrate`` and the TensorFlow scripts stay cheap.
* Only ``torch/`` imports torch, only ``tf/`` TensorFlow, only ``cli/`` typer and rich.
* No module of ``ckpt_migrate/``, ``migrations/`` or ``scripts/`` is over 500 lines.
* A model family's name is written only in ``ckpt_migrate/catalogue/``: every other room reads
  the family from its record.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ckpt_migrate"
MAX_LINES = 500

# A room may import the rooms of a lower rank (and modules of its own room).
RANKS: dict[str, int] = {
    "_version": 0,
    "errors": 0,
    "atomic": 1,
    "interrupt": 0,
    "sidenames": 0,
    "heap": 1,
    "jsonfile": 1,
    "format": 2,
    "catalogue": 3,
    "hops": 3,
    "models": 4,
    "config": 5,
    "migrations": 6,
    "engine": 7,
    "torch": 8,
    "tf": 9,
    "hf": 9,
    "model_dir": 10,
    "remote": 11,
    "cli": 12,
    "__main__": 13,
    "__init__": 13,  # the package face
}
FACES = {"ckpt_migrate", "ckpt_migrate.cli"}  # may import lazily
THIRD_PARTY_HOME = {
    "torch": "torch",
    "tensorflow": "tf",
    "typer": "cli",
    "rich": "cli",
    "boto3": "remote",
    "botocore": "remote",
    "dask": "remote",
    "distributed": "remote",
}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported project module, dotted
    line: int
    local: bool  # inside a function


def _module_name(path: Path) -> str:
    if path.is_relative_to(ROOT / "migrations"):
        rel = ("ckpt_migrate", "migrations", *path.relative_to(ROOT / "migrations").parts)
    elif path.is_relative_to(PACKAGE):
        rel = ("ckpt_migrate", *path.relative_to(PACKAGE).parts)
    else:
        rel = ("scripts", *path.relative_to(ROOT / "scripts").parts)
    name = ".".join(rel)[: -len(".py")]
    return name.removesuffix(".__init__")


def _sources() -> dict[str, Path]:
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "migrations").glob("*.py")]
    files += (ROOT / "scripts").glob("*.py")
    return {_module_name(p): p for p in files}


MODULES = _sources()


def _resolve(module: str, node: ast.ImportFrom) -> list[str]:
    """The project modules an import names (``from pkg import mod`` names the module)."""
    if node.level:
        is_pkg = MODULES[module].name == "__init__.py"
        parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    else:
        base = node.module or ""
    if not base.startswith("ckpt_migrate"):
        return []
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.append(sub if sub in MODULES else base)
    return out


def _imports(module: str) -> tuple[list[Edge], list[tuple[str, int]]]:
    """(project edges, third-party top-level names with their line) of one module."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    local_nodes = {
        id(n)
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        for n in ast.walk(f)
    }
    edges, others = [], []
    for node in ast.walk(tree):
        local = id(node) in local_nodes
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("ckpt_migrate"):
                    edges.append(Edge(module, alias.name, node.lineno, local))
                else:
                    others.append((alias.name.split(".")[0], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            targets = _resolve(module, node)
            if targets:
                edges += [Edge(module, t, node.lineno, local) for t in targets]
            elif not node.level and node.module:
                others.append((node.module.split(".")[0], node.lineno))
    return edges, others


EDGES = {m: _imports(m)[0] for m in MODULES}


def _room(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "scripts":
        return "scripts"
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def _where(edge: Edge) -> str:
    return f"{MODULES[edge.source].relative_to(ROOT)}:{edge.line} imports {edge.target}"


def test_rooms_import_only_rooms_below_them():
    wrong = []
    for edges in EDGES.values():
        for e in edges:
            src, dst = _room(e.source), _room(e.target)
            if src in ("scripts", dst):
                continue
            if RANKS[dst] >= RANKS[src]:
                wrong.append(f"{_where(e)} ({src} may not import {dst})")
    assert not wrong, "\n".join(wrong)


def test_no_project_import_inside_a_function():
    hidden = [
        _where(e) for edges in EDGES.values() for e in edges if e.local and e.source not in FACES
    ]
    assert not hidden, "\n".join(hidden)


def test_no_import_cycle_between_modules():
    graph = {m: sorted({e.target for e in edges} - {m}) for m, edges in EDGES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[str] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, path)
        path.pop()
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module, [])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("package, room", sorted(THIRD_PARTY_HOME.items()))
def test_heavy_and_cli_packages_stay_in_their_room(package, room):
    outside = []
    for module in MODULES:
        if _room(module) in (room, "scripts"):
            continue
        for name, line in _imports(module)[1]:
            if name == package:
                outside.append(f"{MODULES[module].relative_to(ROOT)}:{line}")
    assert not outside, f"{package} imported outside {room}/: " + ", ".join(outside)


def test_modules_are_small():
    big = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in MODULES.values()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]
    assert not big, "\n".join(big)


def test_every_room_is_packaged():
    """pyproject.toml lists every package of the tree, and no other."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    on_disk = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert listed == on_disk


# The family names issue #32 lists (the grep of its "Done when"), as string literals.
FAMILY_LITERAL = re.compile(r'(?<!\w)"(llama|mistral|bert|roberta|t5|gptj|falcon|bloom)"(?!\w)')


def test_family_names_are_written_only_in_the_catalogue():
    """``grep -rlwE '"(llama|mistral|bert|roberta|t5|gptj|falcon|bloom)"' ckpt_migrate
    migrations`` lists only the catalogue's files."""
    outside = [
        str(path.relative_to(ROOT))
        for module, path in MODULES.items()
        if _room(module) not in ("catalogue", "scripts")
        and FAMILY_LITERAL.search(path.read_text(encoding="utf-8"))
    ]
    assert not outside, "family names outside ckpt_migrate/catalogue/: " + ", ".join(outside)
