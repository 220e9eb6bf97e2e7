"""State dicts nested as deep as the real cerebras.pytorch 2.10 writes and reads them back.

``fixtures/real-cstorch-2.10/deep/`` (its README): ``deep_330`` is the deepest state the real
``cstorch.save`` writes at Python's default recursion limit, ``deep_494`` the deepest its
``cstorch.load`` reads back (written under a raised limit), ``deep_495`` one level more, which
the real writer saves and its loader refuses. ckpt-migrate reads, upgrades, downgrades and
verifies the first two exactly, and refuses the third in one line as unsupported, not damaged
(``format.budgets``). With ``CKPT_MIGRATE_CSTORCH_PYTHON`` the real loader also reads every
file ckpt-migrate writes from them.
"""

from __future__ import annotations

import json
import lzma
import subprocess
import warnings
from pathlib import Path

import digest as digest_module
import pytest
import torch
from conftest import REAL, one_line_error, run_capped, run_cli
from digest import diff_digests, digest, untied
from real_cstorch import cstorch_python, requires_real_cstorch

import ckpt_migrate as cm
from ckpt_migrate.errors import UnsupportedContentError
from ckpt_migrate.format import budgets

DEEP = REAL / "deep"
CASES = ("deep_330", "deep_494")


def _unpack(name: str, where: Path) -> Path:
    dst = where / name
    if not dst.exists():
        dst.write_bytes(lzma.decompress((DEEP / f"{name}.xz").read_bytes()))
    return dst


def _expected(case: str) -> dict:
    # (nested some 1,500 JSON levels: decoded within the limit ``budgets`` sets)
    assert budgets.MAX_DEPTH == 494
    return json.loads(lzma.decompress((DEEP / f"{case}.expected.json.xz").read_bytes()))


def _ours(path: Path) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return digest(cm.load(path, objects_mode="data"))


def _depth(node: dict) -> int:
    """Containers above the deepest leaf of a digest."""
    if node["kind"] == "dict":
        return 1 + max(_depth(item[2]) for item in node["items"])
    if node["kind"] in ("list", "tuple"):
        return 1 + max(_depth(item) for item in node["items"])
    return 0


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("deep")
    return {case: _unpack(f"{case}.mdl", where) for case in (*CASES, "deep_495")}


@pytest.mark.parametrize("case", CASES)
def test_reads_the_real_libraries_deepest_files_exactly(case, files):
    expected = _expected(case)
    assert _depth(expected["root"]) == int(case.removeprefix("deep_"))
    ours = _ours(files[case])
    assert ours == expected, "\n".join(diff_digests(expected, ours))


@pytest.mark.parametrize("case", CASES)
def test_every_command_reads_and_writes_them(case, files, tmp_path):
    """inspect, check, upgrade down to a format 0.4 release and back (verified in full),
    verify and to-torch: none meets a RecursionError, and every output holds the same state."""
    src, expected = files[case], _expected(case)
    for args in (
        ["inspect", src, "--json", "--all"],
        ["check", src, "--deep"],
        ["upgrade", src, "--to", "2.4", "-o", tmp_path / "down"],
        ["upgrade", tmp_path / "down" / src.name, "-o", tmp_path / "up", "--verify", "full"],
        ["verify", src, tmp_path / "up" / src.name],
        ["to-torch", src, tmp_path / "w.pt"],
    ):
        done = run_cli(*args, "-q")
        assert done.returncode == 0, f"{args[0]}: {done.stderr}"
    assert untied(_ours(tmp_path / "down" / src.name)) == untied(expected)
    assert _ours(tmp_path / "up" / src.name) == expected
    assert digest(torch.load(tmp_path / "w.pt")) == expected
    state = cm.load(src, objects_mode="data")
    cm.save(state, tmp_path / "saved.mdl")
    assert _ours(tmp_path / "saved.mdl") == expected


COMMANDS = {
    "inspect": lambda src, out: ["inspect", src],
    "check --deep": lambda src, out: ["check", src, "--deep"],
    "upgrade": lambda src, out: ["upgrade", src, "--to", "2.4", "--output-dir", out],
    "verify": lambda src, out: ["verify", src, src],
    "to-torch": lambda src, out: ["to-torch", src, out / "w.pt"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_one_level_past_the_real_loader_is_refused_as_unsupported(command, files, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc, _ = run_capped(*COMMANDS[command](files["deep_495"], out), seconds=30)
    line = one_line_error(proc, 2, "deep_495.mdl", "nested more than 494 containers deep")
    assert "reads back" in line and "re-save the state" in line and "damaged" not in line
    assert list(out.iterdir()) == []


def test_the_python_api_refuses_it_the_same_way(files):
    with pytest.raises(UnsupportedContentError, match="nested more than 494 containers deep"):
        cm.load(files["deep_495"])


# The real loader's own limit counts the frames below it: from a script's top level it reads 494
# containers, from inside the harness's functions (``real_digest``) a few fewer. So each file
# is loaded here at a script's top level, as the fixtures were (their README).
TOP_LEVEL_LOAD = """
import contextlib, importlib.util, json, sys, warnings
warnings.simplefilter("ignore")
with contextlib.redirect_stdout(sys.stderr):
    import cerebras.pytorch as cstorch
spec = importlib.util.spec_from_file_location("digest", sys.argv[1])
digest = importlib.util.module_from_spec(spec)
spec.loader.exec_module(digest)
found = {}
for f in sys.argv[2:]:
    try:
        state = cstorch.load(f)
    except Exception as exc:
        found[f] = type(exc).__name__
        continue
    sys.setrecursionlimit(20000)  # (the digest's walk, not the loader's)
    found[f] = digest.digest(state)
    sys.setrecursionlimit(1000)
sys.setrecursionlimit(20000)
print(json.dumps(found))
"""


@requires_real_cstorch()
def test_real_loader_reads_them_and_what_we_write_from_them(files, tmp_path):
    written = {}
    for case in CASES:
        src = files[case]
        for release in ("2.4", "2.10"):
            out = tmp_path / f"{case}-{release}"
            done = run_cli("upgrade", src, "--to", release, "-o", out, "-q", "--force")
            assert done.returncode == 0, done.stderr
            written[out / src.name] = case
        cm.save(cm.load(src, objects_mode="data"), tmp_path / f"{case}-saved.mdl")
        written[tmp_path / f"{case}-saved.mdl"] = case
    paths = [*(files[c] for c in CASES), files["deep_495"], *written]
    done = subprocess.run(
        [cstorch_python(), "-c", TOP_LEVEL_LOAD, Path(digest_module.__file__), *paths],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    results = json.loads(done.stdout)
    for case in CASES:
        assert results[str(files[case])] == _expected(case), case
    assert results[str(files["deep_495"])] == "RecursionError"
    for path, case in written.items():
        result = results[str(path)]
        assert isinstance(result, dict), f"{path}: {result}"
        assert untied(result) == untied(_expected(case)), path
