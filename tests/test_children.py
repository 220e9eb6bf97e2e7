"""A Ctrl-C at the moment a worker is forked (``format.h5.children``): CI once saw one arrive in
a preflight child while ``os.fork`` ran the interpreter's after-fork hooks there, printed as
"Exception ignored in: ... Traceback" beside the command's ``interrupted``. Each case runs in
a fresh interpreter whose fork hooks send the SIGINT at that very moment."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import FIXTURES

REPO = Path(__file__).resolve().parents[1]
LEGACY = FIXTURES / "release-1.9.mdl"


# A process started in the background by a shell without job control inherits SIGINT ignored,
# and Python then leaves it so: each case takes it as a terminal's Ctrl-C would reach it.
_CTRL_C = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    # (OpenBLAS runs one thread, as the command line does: ``another-thread`` adds its own)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", _CTRL_C + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env=env,
    )


def test_a_child_takes_a_ctrl_c_from_its_fork_inside_its_own_try():
    done = _run(
        """
        import os, signal, time
        from ckpt_migrate.format.h5 import children
        os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGINT))
        pid = children.fork()
        if pid == 0:
            code = 0
            try:
                children.release()
                time.sleep(5)
            except KeyboardInterrupt:
                code = 7
            finally:
                os._exit(code)
        children.release()
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        """
    )
    assert (done.stdout, done.stderr) == ("7\n", "")


def test_the_preflight_children_end_quietly_on_a_ctrl_c_at_their_fork():
    """Both children stop at once, exit 1 and print nothing; the walk then has no verdict
    (None: the parent's own checks are to read the file)."""
    done = _run(
        f"""
        import os, signal
        from pathlib import Path
        from ckpt_migrate.format.h5 import preflight
        os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGINT))
        print(preflight.preflight(Path({str(LEGACY)!r})))
        """
    )
    assert (done.stdout, done.stderr) == ("None\n", "")


@pytest.mark.parametrize("threads", [0, 1], ids=["one-thread", "another-thread"])
def test_a_ctrl_c_at_the_fork_reaches_the_parent_with_no_child_left(threads):
    """With another thread alive, the kernel hands it the SIGINT the forking thread blocks,
    and Python runs the handler in the main thread all the same (CI: OpenBLAS's threads)."""
    done = _run(
        f"""
        import os, signal, threading, time
        from pathlib import Path
        from ckpt_migrate.format.h5 import preflight
        for _ in range({threads}):
            threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        # (a moment for another thread to take the signal, which the main thread then handles)
        os.register_at_fork(before=lambda: os.kill(os.getpid(), signal.SIGINT) or time.sleep(0.05))
        try:
            preflight.preflight(Path({str(LEGACY)!r}))
        except KeyboardInterrupt:
            try:
                os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                print("interrupted, no child left")
        """
    )
    assert (done.stdout, done.stderr) == ("interrupted, no child left\n", "")
