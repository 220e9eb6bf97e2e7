"""Every console script: ``ckpt-migrate``, ``tensorflow-to-h5``, ``h5-to-tensorflow``.

A lazy face: ``entry`` (which ``run``, the ``ckpt-migrate`` entry point, calls) loads ``main``
(the typer app; ``cli.tf`` does not load typer), the verbs' work and everything it imports
when a command runs, not for ``--help`` (``commands``: the read-side verbs; ``upgrades``: the
upgrade verbs; ``conversions``: Hugging Face and TensorFlow), and ``hop_inputs`` (the hops'
declared inputs, loaded when a verb that runs hops parses its options); ``begin_reading``
starts a checkpoint's metadata walk before those imports.
"""

from __future__ import annotations

import gc
import importlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ckpt_migrate import heap


def entry(argv: list[str] | None = None) -> int:
    """The ``ckpt-migrate`` command (its verbs: ``cli.main``). Not named ``main``: the import of
    that submodule would take the name over in this package.

    A Ctrl-C while it starts (the imports, the walk begun early) ends as it does later: one
    ``interrupted`` line and 130, even where it reached us as another error (``_interrupted``)."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.default_int_handler:
        signal.signal(signal.SIGINT, _pressed_while_starting)
    try:
        try:
            _begin_upgrade_reading(sys.argv[1:] if argv is None else argv)
            app = importlib.import_module(f"{__name__}.main")
        finally:  # the command's own handler takes over (``console.run_guarded``)
            if signal.getsignal(signal.SIGINT) is _pressed_while_starting:
                signal.signal(signal.SIGINT, previous)
        return app.main(argv)
    except (KeyboardInterrupt, Exception) as exc:
        if not (_PRESSED or _interrupted(exc)):
            raise
        print("interrupted", file=sys.stderr, flush=True)
        exec("None")  # see console.forget_unhandled_interrupt: exit 130, not by SIGINT
        return 130
    finally:  # the outcome is printed: a Ctrl-C while the interpreter exits changes nothing
        signal.signal(signal.SIGINT, signal.SIG_IGN)


# Not ``interrupt.Interrupt``: nothing of the package is imported before this handler is in
# place, and a press noted here ends the run before anything is published.
_PRESSED: list[bool] = []


def _pressed_while_starting(signum: int, frame: Any) -> None:
    """SIGINT before the command runs: noted, since a library that catches the
    KeyboardInterrupt may turn it into an error of its own (numpy's import does: an ImportError
    that no longer names it)."""
    _PRESSED.append(True)
    raise KeyboardInterrupt


def _interrupted(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a Ctrl-C or an error it caused: Python 3.11 wraps a KeyboardInterrupt
    raised while a class is created (``__set_name__``, as ``platform`` does during numpy's
    import) in a RuntimeError."""
    seen = 0
    while exc is not None and seen < 100:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def run() -> None:
    """The console script and ``python -m ckpt_migrate``: ``entry`` for a short-lived process.

    Its heap is one checkpoint's tree, built once and kept: the collector looks for cycles
    among young objects every 100,000 allocations instead of 700 (300 collections, 0.07 s of
    a 12 GB upgrade), and the exit skips the interpreter's last collection of a heap nothing
    will use again (``gc.freeze``: 0.06 s). A cycle that outlives the young collections thus
    waits for the exit: nothing the command drops may hold itself (a nested walk that calls
    itself does, see ``tree.map_leaves``). numpy's OpenBLAS, loaded later, is asked for one
    thread unless the user says otherwise: it starts one per core that spins waiting for work
    (0.1 s of CPU a command, which the preflight children need); the tool multiplies no
    matrices. glibc keeps its mapping threshold at 128 KiB (``heap``): a 150k-tensor
    ``inspect`` of a format 0.5 file peaked at 275 MiB with glibc's rising threshold, 232 with
    it fixed."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    gc.set_threshold(100_000, 50, 100)
    heap.fix_mmap_threshold(128 << 10)
    code = entry()
    gc.freeze()
    sys.exit(code)


def begin_reading(path: Path) -> None:
    """Start the preflight walk of a local checkpoint file (``format.h5.preflight.start``) so
    that it runs while ``commands`` and its imports load; the read collects it. Not for a file
    whose root looks like format 0.5 (``h5.sniff``), whose upgrade may read its outline only."""
    try:
        is_file = path.is_file()
    except OSError:  # (a directory on the way this user may not enter): the reader says so
        return
    if is_file:
        from ckpt_migrate.format.h5 import preflight, sniff

        if not sniff.looks_like_format_05(path):
            preflight.start(path)


def _begin_upgrade_reading(args: list[str]) -> None:
    """For ``upgrade`` of one file, its walk starts before typer loads (a tenth of a second
    sooner): an argument that is no option and names an existing HDF5 file is taken for it.
    A guess that is wrong (a rare option value) costs a walk nobody collects; the command line
    is parsed by typer as ever. A dry run, and the upgrade of a format 0.5 file, may read the
    outline only (``engine.plan.read_planned``): no walk is begun for them (``h5.sniff``)."""
    if len(args) < 2 or args[0] != "upgrade" or "--dry-run" in args or "-n" in args:
        return
    files = [Path(a) for a in args[1:] if not a.startswith("-") and os.path.isfile(a)]
    if len(files) == 1:
        begin_reading(files[0])


def __getattr__(name: str) -> Any:
    if name in ("commands", "upgrades", "conversions", "hop_inputs"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
