"""The command in a new process per call, without importing it again for each one.

A ``python -m ckpt_migrate`` spends about 0.4 s of CPU starting Python and importing typer,
rich, numpy and h5py before it reads its first argument, and the suite runs the command and
the scripts about two thousand times. This module keeps one server process per test worker
that has imported what the command imports when it starts, and forks it once per call: each
child is a new process with its own pid, argv, working directory, standard streams and exit
status, which runs the command as ``python -m`` (or ``python SCRIPT``) would from there on,
exits through the interpreter's own shutdown, and is waited for by the server. Once a child
has imported torch (``from-torch``, ``to-torch``, ``import-hf`` of a ``.bin``: 2.5 s of CPU
each here), the server imports it too, and the children after start with it, as they start
with h5py; no command behaves differently for it (the tests that torch is not imported start
Python themselves).

A server serves only calls made in the environment it started in (but for the name of the
test pytest keeps there, which the child is given): a variable read when a module is imported
(``HDF5_PLUGIN_PATH``, ``CKPT_MIGRATE_STALL_SECONDS``) must be the call's. A call made in
another environment starts a new server in it. The tests of imports, signals or memory start
Python themselves, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

_PER_TEST = "PYTEST_CURRENT_TEST"  # set by pytest for each test, read by no import
_LOCK = threading.Lock()
_server: tuple[subprocess.Popen, socket.socket, dict[str, str]] | None = None


def run(
    argv: list[str], *, script: Path | None, cwd: Path | None, stdin_devnull: bool
) -> subprocess.CompletedProcess | None:
    """``python -m ckpt_migrate ARGV`` (or ``python SCRIPT ARGV``) in a child of the server;
    None when ``CKPT_MIGRATE_TEST_NO_FORK`` asks for Python started afresh."""
    env = dict(os.environ)
    if env.get("CKPT_MIGRATE_TEST_NO_FORK"):
        return None
    with _LOCK, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        conn = _connection(env)
        stdin = os.open(os.devnull, os.O_RDONLY) if stdin_devnull else 0
        try:
            request = {
                "argv": argv,
                "script": str(script) if script else None,
                "cwd": str(Path(cwd or os.getcwd()).resolve()),
                "env": env,
            }
            payload = json.dumps(request).encode()
            fds = [stdin, out.fileno(), err.fileno()]
            socket.send_fds(conn, [b"%d\n" % len(payload)], fds)
            conn.sendall(payload)
        finally:
            if stdin_devnull:
                os.close(stdin)
        status = _read_line(conn)
        out.seek(0)
        err.seek(0)
        head = [str(script)] if script else ["-m", "ckpt_migrate"]
        return subprocess.CompletedProcess(
            [sys.executable, *head, *argv],
            os.waitstatus_to_exitcode(int(status)),
            out.read().decode(),
            err.read().decode(),
        )


def _connection(env: dict[str, str]) -> socket.socket:
    """The socket of a server started in ``env`` (but for the test's name)."""
    global _server
    own = {k: v for k, v in env.items() if k != _PER_TEST}
    if _server is not None and (_server[0].poll() is not None or _server[2] != own):
        _server[1].close()  # (the server exits when it reads the end)
        _server[0].wait()
        _server = None
    if _server is None:
        ours, theirs = socket.socketpair()
        proc = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        _server = (proc, ours, own)
    return _server[1]


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        data += _recv(conn)
    return data


def _recv(conn: socket.socket) -> bytes:
    chunk = conn.recv(65536)
    if not chunk:
        raise RuntimeError("the other end of the forking command server is gone")
    return chunk


def _serve(conn: socket.socket) -> dict:
    """Answer requests until the test worker goes; returns only in a forked child, with its
    request and its standard streams in place."""
    while True:
        data, fds, _, _ = socket.recv_fds(conn, 64, 3)
        if not data:
            sys.exit(0)
        while b"\n" not in data:
            data += _recv(conn)
        head, _, message = data.partition(b"\n")
        while len(message) < int(head):
            message += _recv(conn)
        said, told = os.pipe()  # (the child says there whether it imported torch)
        pid = os.fork()
        if pid == 0:
            conn.close()
            os.close(said)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            atexit.register(_tell_torch, told)
            return json.loads(message)
        os.close(told)
        for fd in fds:
            os.close(fd)
        _, status = os.waitpid(pid, 0)
        conn.sendall(f"{status}\n".encode())
        os.set_blocking(said, False)  # (written before the child's exit, if at all; a
        # process the child forked would keep the pipe open)
        with contextlib.suppress(BlockingIOError):
            if os.read(said, 16) == b"torch" and "torch" not in sys.modules:
                import torch  # noqa: F401
        os.close(said)


def _tell_torch(fd: int) -> None:
    """(at a child's exit)"""
    with contextlib.suppress(OSError):
        os.write(fd, b"torch" if "torch" in sys.modules else b"")


def _main() -> None:
    import ckpt_migrate.cli  # what ``python -m ckpt_migrate`` imports before it runs
    import ckpt_migrate.cli.script_options  # noqa: F401  (and what the scripts import)

    request = _serve(socket.socket(fileno=int(sys.argv[1])))
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if request["script"]:
        sys.argv = [request["script"], *request["argv"]]
        sys.path[0] = str(Path(request["script"]).parent)
        runpy.run_path(request["script"], run_name="__main__")
    else:
        sys.argv = ["-m", *request["argv"]]  # run_module puts the module's path first
        sys.path[0] = request["cwd"]
        runpy.run_module("ckpt_migrate", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as ``python -m`` has it, not this file's folder
    _main()
