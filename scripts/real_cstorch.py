#!/usr/bin/env python
"""Run the REAL ``cerebras.pytorch`` loader on checkpoint files (developer tool, not CI).

Run it with the interpreter of a separate virtualenv that has ``cerebras-pytorch==2.10.0``
(never the project's own environment)::

    V/bin/python scripts/real_cstorch.py digest FILE.mdl [FILE.mdl ...]
    V/bin/python scripts/real_cstorch.py info

``digest`` prints one JSON line per file, in argument order::

    {"file": FILE, "ok": true, "digest": {"format": "cstorch-digest-v1", "root": ...}}
    {"file": FILE, "ok": false, "stage": "load" | "digest", "error": "<Type>: <message>"}

using ``cerebras.pytorch.load(FILE)`` and the digest of ``tests/digest.py`` (imported by path,
so this script needs nothing from the project package). ``info`` prints one JSON line with
the versions of cerebras.pytorch, torch and Python. The exit status is 0 when every file
loaded and digested, 1 when some did not, 2 on a usage or import error.

``cstorch.load`` returns lazy wrappers: ``DeferredTorchTensor`` (a ``torch.Tensor`` subclass,
digested as a tensor) and, for bytes, numpy arrays and other non-tensor leaves,
``DeferredObject``/``DeferredNumpyArray`` (not subclasses of the real type). The latter are
replaced by their ``.value`` before digesting, as the reference ``*.expected.json`` do.

No environment variables or appliance are needed: ``import cerebras.pytorch`` and
``cerebras.pytorch.load`` work on a plain CPU machine. Whatever the library prints while
importing or loading goes to stderr so that stdout stays pure JSON lines.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import warnings
from pathlib import Path

HARNESS_RECURSION_LIMIT = 20_000
DIGEST_PY = Path(__file__).resolve().parent.parent / "tests" / "digest.py"


def _load_digest_module():
    spec = importlib.util.spec_from_file_location("_ckpt_migrate_test_digest", DIGEST_PY)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {DIGEST_PY}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def materialize(obj, deferred_cls: type):
    """Replace every non-tensor deferred object (``DeferredObject``/``DeferredNumpyArray``,
    which ``cstorch.load`` returns for bytes, numpy arrays and other pickled leaves) by its
    ``.value``, in place where possible. Tensors (``DeferredTensor`` subclasses of
    ``torch.Tensor``) are left alone so that tied tensors keep their identity."""
    if isinstance(obj, deferred_cls):
        return materialize(obj.value, deferred_cls)
    if isinstance(obj, dict):
        for key, value in obj.items():
            new = materialize(value, deferred_cls)
            if new is not value:
                obj[key] = new
        return obj
    if isinstance(obj, list):
        for i, value in enumerate(obj):
            new = materialize(value, deferred_cls)
            if new is not value:
                obj[i] = new
        return obj
    if isinstance(obj, (tuple, set, frozenset)):
        values = [materialize(v, deferred_cls) for v in obj]
        if all(new is old for new, old in zip(values, obj, strict=True)):
            return obj
        if hasattr(obj, "_make"):  # namedtuple
            return obj._make(values)
        return type(obj)(values)
    return obj


def _error_text(exc: BaseException) -> str:
    # One line, like the manifest's load_error entries (newlines become spaces).
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")


def _emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()


def _import_cstorch():
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import cerebras.pytorch as cstorch
    return cstorch


def _deferred_object_cls() -> type:
    from cerebras.appliance.storage.serializers import DeferredObject

    return DeferredObject


def cmd_info() -> int:
    cstorch = _import_cstorch()
    import torch

    _emit(
        {
            "cerebras_pytorch": getattr(cstorch, "__version__", None),
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "executable": sys.executable,
        }
    )
    return 0


def cmd_digest(files: list[str]) -> int:
    digest_mod = _load_digest_module()
    cstorch = _import_cstorch()
    deferred_cls = _deferred_object_cls()
    all_ok = True
    limit = sys.getrecursionlimit()
    for f in files:
        # The real loader runs at the interpreter's default recursion limit, as a user's does;
        # the harness's own walks of what it gave back (and the JSON of its digest, three levels
        # a container) may go deeper: a state nested 494 deep is read (fixtures' deep/).
        sys.setrecursionlimit(limit)
        try:
            with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loaded = cstorch.load(f)
            sys.setrecursionlimit(max(limit, HARNESS_RECURSION_LIMIT))
            state = materialize(loaded, deferred_cls)
        except Exception as exc:
            all_ok = False
            _emit({"file": f, "ok": False, "stage": "load", "error": _error_text(exc)})
            continue
        finally:
            loaded = None
        try:
            with contextlib.redirect_stdout(sys.stderr):
                d = digest_mod.digest(state)
        except Exception as exc:
            all_ok = False
            _emit({"file": f, "ok": False, "stage": "digest", "error": _error_text(exc)})
            continue
        finally:
            del state
        _emit({"file": f, "ok": True, "digest": d})
    sys.setrecursionlimit(limit)
    return 0 if all_ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_digest = sub.add_parser("digest", help="load files with cerebras.pytorch and digest them")
    p_digest.add_argument("files", nargs="+", metavar="FILE.mdl")
    sub.add_parser("info", help="print library versions as one JSON line")
    args = parser.parse_args(argv)
    try:
        if args.command == "info":
            return cmd_info()
        return cmd_digest(args.files)
    except ImportError as exc:
        print(f"real_cstorch: {_error_text(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
