"""The root attributes a root edit writes (``rootedit``), in this process or in one of their own.

HDF5 rewrites a variable-length text in place by loading the old text's global heap collection
to free it: it reads the collection (the text's size) and makes a copy of it half as large again
(``H5HG__cache_heap_deserialize``), then builds the new one. For the 27 MB ``__spec__`` of a
150k-tensor checkpoint that was 90 MB for a moment, on top of the tree and the tables the
upgrading process holds (202 MiB): the root edit's peak, 294 MiB (issue 33). Texts of
``APART`` bytes or more are therefore written by a process of their own, which holds nothing
else (h5py and the texts: 37 MiB before HDF5's work), and is handed them through a pipe:

    python -m ckpt_migrate.engine.rootattrs
    stdin:  one line {"path": ..., "removed": [names], "set": [[name, size], ...]},
            then each text's bytes
    stdout: {"ok": true} or {"errno": N or null, "message": ...}

It costs that process's start (0.1 s: h5py and numpy imported), a tenth of a second against
the 6 s a root edit of that size takes. Both ways leave the same bytes (``tests/test_rootedit``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import h5py
import numpy as np
from h5py import h5a, h5s, h5t

from ckpt_migrate.atomic import as_os_error
from ckpt_migrate.format.h5 import attrs as h5attrs
from ckpt_migrate.format.h5 import capi

SUCCESS = "__SUCCESS__"
# The texts' size from which they are written apart: HDF5's transient is about three times the
# old text's size, so from here it outweighs the other process's 0.1 s (a spec of about 45k
# leaves; the 12k sweep's is 2 MB).
APART = 8 << 20


def write(path: Path, removed: list[str], texts: dict[str, bytes]) -> None:
    """Remove the attributes ``removed`` from the root of ``path`` and set the texts ``texts``
    (name -> UTF-8 bytes), in a process of their own where they are large (``APART``)."""
    if sum(len(raw) for raw in texts.values()) >= APART:
        write_apart(path, removed, texts)
    else:
        write_here(path, removed, texts)


def write_here(path: Path, removed: list[str], texts: dict[str, bytes]) -> None:
    """``write`` in this process. ``__SUCCESS__`` is written last, as the real writer does
    (FORMAT.md §4.7): in place where the source has it (it must, to be read), so that no
    attribute is deleted but those the edit removes (a deleted attribute stays in a dense
    root's heap, which the one-pass reader of ``rootverify`` cannot tell from a live one)."""
    with h5py.File(path, "r+", locking=False) as f:
        oid = f.id
        for name in removed:
            h5a.delete(oid, name.encode())
        for name, raw in texts.items():
            _put_text(oid, name, raw)
        success = np.bool_(True)
        if h5a.exists(oid, SUCCESS.encode()):
            attr = h5a.open(oid, SUCCESS.encode())
            if attr.get_space().get_simple_extent_type() == h5s.SCALAR:
                attr.write(np.asarray(success, dtype=attr.dtype))
                return
            del attr
            h5a.delete(oid, SUCCESS.encode())
        h5attrs.create(oid, SUCCESS, success)


def _put_text(oid: h5py.h5o.ObjectID, name: str, raw: bytes) -> None:
    """Set the string attribute ``name`` to the UTF-8 text ``raw``: a variable-length string
    is rewritten in place (it keeps its place in the creation order), anything else replaced.
    HDF5 is handed ``raw`` itself (``capi``): through h5py, a copy of it (27 MB for the spec
    at 150k leaves) was made first."""
    key = name.encode()
    if h5a.exists(oid, key):
        attr = h5a.open(oid, key)
        tid = attr.get_type()
        is_text = tid.get_class() == h5t.STRING and tid.is_variable_str()
        if is_text and attr.get_space().get_simple_extent_type() == h5s.SCALAR:
            if not capi.write(attr, capi.text(raw, tid)):
                attr.write(h5attrs.as_array(raw.decode("utf-8")), mtype=h5attrs.text_memtype())
            return
        del attr
        h5a.delete(oid, key)
    h5attrs.create(oid, name, raw.decode("utf-8"))


def utf8(text: str) -> bytes:
    """As h5py stores a ``str`` (strictly: it refuses a lone surrogate, which JSON escapes)."""
    return text.encode("utf-8")


def write_apart(path: Path, removed: list[str], texts: dict[str, bytes]) -> None:
    """``write`` by a process of its own. Its failure is raised here as it would have been
    raised by ``write_here``: an ``OSError`` with its errno (a full disk), HDF5's
    ``RuntimeError`` with its message; a process that stops without saying why, an
    ``OSError`` with its last line."""
    head = {"path": str(path), "removed": removed, "set": [[n, len(r)] for n, r in texts.items()]}
    proc = subprocess.Popen(
        _command(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_environment(),
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(head).encode() + b"\n")
        for raw in texts.values():
            proc.stdin.write(raw)  # (the bytes themselves: no joined copy of 27 MB)
    except BrokenPipeError:
        pass  # it has gone: what it said is read below
    out, err = proc.communicate()
    answer = _answer(out)
    if proc.returncode == 0 and answer.get("ok"):
        return
    if "message" in answer:
        errno = answer.get("errno")
        raise OSError(errno, answer["message"], str(path)) if errno else OSError(answer["message"])
    if "error" in answer:  # HDF5's own failure, as its RuntimeError would have been here
        raise RuntimeError(answer["error"])
    lines = err.decode("utf-8", "replace").strip().splitlines()
    why = lines[-1] if lines else f"exit status {proc.returncode}"
    raise OSError(f"the root attributes' writer stopped: {why}")  # (the caller names the file)


def _command() -> list[str]:
    return [sys.executable, "-m", __name__]


def _environment() -> dict[str, str]:
    """This process's environment, with this package found first (as it was found here)."""
    env = dict(os.environ)
    home = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (home, env.get("PYTHONPATH")) if p)
    return env


def _answer(out: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(out.decode("utf-8").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    return answer if isinstance(answer, dict) else {}


def _read(stream: IO[bytes], size: int) -> bytes:
    raw = stream.read(size)
    if len(raw) != size:
        raise EOFError(f"{size} bytes of text announced, {len(raw)} sent")
    return raw


def main() -> int:
    """The process of ``write_apart``. An interrupt is for its parent, which waits for this
    edit (a second or so) as it would for its own call into HDF5."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin = sys.stdin.buffer
    head = json.loads(stdin.readline())
    texts = {name: _read(stdin, size) for name, size in head["set"]}
    try:
        write_here(Path(head["path"]), head["removed"], texts)
    except (OSError, RuntimeError) as exc:
        failed = as_os_error(exc)  # (a full disk met while HDF5 flushes is a RuntimeError)
        if failed is None:
            print(json.dumps({"error": str(exc)}))
        else:
            print(json.dumps({"errno": failed.errno, "message": failed.strerror or str(failed)}))
        return 1
    print(json.dumps({"ok": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
