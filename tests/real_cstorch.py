"""Optional interoperability check against the REAL ``cerebras.pytorch`` (test helper).

The real library lives in its own virtualenv (``cerebras-pytorch==2.10.0`` pins torch 2.4 and
must never be installed into the project's environment). Point the environment variable
``CKPT_MIGRATE_CSTORCH_PYTHON`` at that venv's interpreter to enable the checks, e.g.::

    CKPT_MIGRATE_CSTORCH_PYTHON=/work/.venv-cstorch/bin/python pytest tests/test_real_cstorch.py

Releases 2.6.0 … 2.9.0 install with ``pip install --no-deps --target DIR cerebras-pytorch==X
cerebras-appliance==X`` next to that venv (same pins: torch 2.4.0, numpy 1.25.0, h5py 3.13.0);
``CKPT_MIGRATE_CSTORCH_2X_PATHS`` lists such directories (separated by ``os.pathsep``), each put
on that interpreter's ``PYTHONPATH`` in turn (``targets_2x``, ``real_digest(..., target=DIR)``).

Everything runs in a subprocess (``scripts/real_cstorch.py``), so this module only needs the
standard library and pytest. Typical use in a test of our writer::

    from real_cstorch import real_digest, requires_real_cstorch
    from digest import digest

    @requires_real_cstorch()
    def test_real_loader_reads_what_we_write(tmp_path):
        save(state, tmp_path / "x.mdl")
        result = real_digest([tmp_path / "x.mdl"])[tmp_path / "x.mdl"]
        assert result["ok"], result["error"]
        assert result["digest"] == digest(state)
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

ENV_VAR = "CKPT_MIGRATE_CSTORCH_PYTHON"
ENV_VAR_2X = "CKPT_MIGRATE_CSTORCH_2X_PATHS"
REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "real_cstorch.py"
DEFAULT_TIMEOUT_S = 900.0


class RealCstorchError(RuntimeError):
    """The harness itself failed (as opposed to the real loader rejecting a file)."""


def cstorch_python() -> str | None:
    """The interpreter named by ``CKPT_MIGRATE_CSTORCH_PYTHON``, or None when unset/empty."""
    value = os.environ.get(ENV_VAR, "").strip()
    return value or None


def _subprocess_env(target: str | None = None) -> dict[str, str]:
    # The real library's venv must not see our environment's import paths.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.setdefault("PYTHONIOENCODING", "utf-8")
    if target is not None:
        env["PYTHONPATH"] = target
    return env


def _run(args: list[str], timeout: float, target: str | None = None) -> subprocess.CompletedProcess:
    python = cstorch_python()
    if python is None:
        raise RealCstorchError(f"{ENV_VAR} is not set")
    return subprocess.run(
        [python, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=_subprocess_env(target),
        timeout=timeout,
        check=False,
    )


@functools.cache
def _info_or_reason() -> tuple[dict | None, str | None]:
    python = cstorch_python()
    if python is None:
        return None, (
            f"real cerebras.pytorch check disabled: set {ENV_VAR} to the python of a venv "
            "with cerebras-pytorch==2.10.0 installed"
        )
    if not Path(python).exists():
        return None, f"{ENV_VAR}={python!r} does not exist"
    try:
        proc = _run(["info"], timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{ENV_VAR}={python!r} cannot run: {type(exc).__name__}: {exc}"
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return None, f"{ENV_VAR}={python!r} cannot import cerebras.pytorch: {tail}"
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1]), None
    except (IndexError, json.JSONDecodeError):
        return None, f"{ENV_VAR}={python!r}: unexpected output {proc.stdout!r}"


def unavailable_reason() -> str | None:
    """Why the real library cannot be used (None when it can). Cached per session."""
    return _info_or_reason()[1]


def real_cstorch_info() -> dict:
    """``{"cerebras_pytorch": ..., "torch": ..., "python": ..., "executable": ...}``."""
    info, reason = _info_or_reason()
    if info is None:
        raise RealCstorchError(reason)
    return info


def requires_real_cstorch() -> pytest.MarkDecorator:
    """A ``skipif`` marker: skip unless ``CKPT_MIGRATE_CSTORCH_PYTHON`` has cerebras.pytorch.

    Use as ``pytestmark = requires_real_cstorch()`` or ``@requires_real_cstorch()``.
    """
    reason = unavailable_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def targets_2x() -> list[str]:
    """The directories named by ``CKPT_MIGRATE_CSTORCH_2X_PATHS`` (empty when unset)."""
    value = os.environ.get(ENV_VAR_2X, "")
    return [p for p in value.split(os.pathsep) if p.strip()]


@functools.cache
def target_version(target: str) -> str:
    """``cerebras.pytorch.__version__`` with ``target`` on the path, e.g. ``"2.7.1"``."""
    proc = _run(["info"], timeout=300, target=target)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RealCstorchError(f"{ENV_VAR_2X} entry {target!r}: cannot import: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["cerebras_pytorch"]


def requires_targets_2x() -> pytest.MarkDecorator:
    """A ``skipif`` marker: skip unless the real library and ``CKPT_MIGRATE_CSTORCH_2X_PATHS``
    are both given."""
    reason = unavailable_reason() or (None if targets_2x() else f"{ENV_VAR_2X} is not set")
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def real_digest(
    paths: Iterable[str | os.PathLike],
    timeout: float = DEFAULT_TIMEOUT_S,
    target: str | None = None,
) -> dict[Any, dict]:
    """Load each file with the real ``cerebras.pytorch.load`` and digest it.

    Returns ``{path: result}`` keyed by the objects passed in, where ``result`` is
    ``{"ok": True, "digest": {...}}`` or ``{"ok": False, "stage": "load" | "digest",
    "error": "<Type>: <message>"}`` (plus ``"file"``, the absolute path used). All files go
    through one subprocess (importing the library takes a couple of seconds); ``target``: a
    directory of ``CKPT_MIGRATE_CSTORCH_2X_PATHS`` whose release loads them instead.
    Raises :class:`RealCstorchError` if the harness itself fails.
    """
    paths = list(paths)
    if not paths:
        return {}
    reason = unavailable_reason()
    if reason is not None:
        raise RealCstorchError(reason)
    abs_paths = [str(Path(p).resolve()) for p in paths]
    proc = _run(["digest", *abs_paths], timeout=timeout, target=target)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode not in (0, 1) or len(lines) != len(paths):
        raise RealCstorchError(
            f"scripts/real_cstorch.py exited {proc.returncode} with {len(lines)} result "
            f"line(s) for {len(paths)} file(s); stderr tail:\n"
            + "\n".join(proc.stderr.splitlines()[-20:])
        )
    results: dict[Any, dict] = {}
    for original, abs_path, line in zip(paths, abs_paths, lines, strict=True):
        record = json.loads(line)
        if record.get("file") != abs_path:
            raise RealCstorchError(f"result for {record.get('file')!r}, expected {abs_path!r}")
        results[original] = record
    return results


def real_digest_one(path: str | os.PathLike, timeout: float = DEFAULT_TIMEOUT_S) -> dict:
    """``real_digest([path])[path]``."""
    return real_digest([path], timeout=timeout)[path]
