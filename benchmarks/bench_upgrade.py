#!/usr/bin/env python
"""Benchmark ``ckpt-migrate upgrade`` against ``cp`` and against a naive hop-by-hop chain.

Generates a synthetic GPT-style release-1.9 checkpoint (format 0.3) of a chosen size, streaming
(one tensor in memory at a time), then times in one run, interleaved, each ``--repeat`` times
(in a new order each round, a seeded shuffle, with the commands that fill the page cache last:
here every run right after ``--verify full`` was 1-2 s slower cold, whichever command it was):

* ``cp SRC DST`` and ``cp SRC DST && sync DST`` (the upgrade fsyncs its output, ``cp`` does not);
* ``ckpt-migrate upgrade SRC --output-dir D`` to the newest release (default ``--verify index``)
  and with ``--verify full``;
* a naive chain: one whole-file load and rewrite per hop (1.9 → 2.0 → … → 2.10), as users
  upgrade today with one tool run per hop, the whole state dict in memory.

Every command runs in its own process; its peak RSS is its ``ru_maxrss``, taken under GNU
``/usr/bin/time`` (see ``run_measured``). Before each timed run, earlier outputs are removed and
everything is synced, then the page cache is put in a defined state: ``cold`` (the source's
pages evicted) or ``warm`` (the source read into the cache). The fixed start-up cost
(``ckpt-migrate --help`` and an upgrade of a tiny fixture) is measured separately. See
benchmarks/README.md.

    python benchmarks/bench_upgrade.py --size 3GB --repeat 3
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import datetime as dt
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "release-2.0.mdl"
CLI = Path(sys.executable).with_name("ckpt-migrate")
TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None  # GNU time
MAX_TENSOR_BYTES = 256 << 20
SOURCE_RELEASE = "1.9"
# The synthetic 1.9 checkpoint has no dataloader side files: say so, or the upgrade refuses.
DROP = ("--drop-dataloader-state",)
VOCAB, MAX_POSITIONS = 50257, 2048
# As installed: Python caches the bytecode of what a command imports. A sandbox that sets
# PYTHONDONTWRITEBYTECODE would have every measured command compile it all again (0.35 s of each
# command here, more than `check` itself at 12k tensors); `warm_bytecode` caches it first.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
_IMPORTED = ("ckpt_migrate", "migrations", "numpy", "h5py", "hdf5plugin", "typer", "click", "rich")

# --------------------------------------------------------------------------- sizes

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
    "TIB": 1 << 40,
}


def parse_size(text: str) -> int:
    """``"3GB"`` -> 3_000_000_000 (decimal units; ``GiB`` etc. are binary)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?(?:i?[bB])?)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 100MB, 3GB, 6GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    raise AssertionError


# --------------------------------------------------------------------------- the checkpoint


@dataclass(frozen=True)
class GPTConfig:
    hidden: int
    layers: int
    vocab: int
    positions: int

    @classmethod
    def for_size(cls, target: int) -> GPTConfig:
        """A GPT-2-like shape whose checkpoint (weights + two Adam moments) is about ``target``.

        Transformer matrices are bf16 (2 bytes), embeddings, norms and biases fp32; each moment
        has its parameter's dtype, as ``torch.optim.Adam``'s ``zeros_like`` gives. Per layer that
        is about 12·d² parameters x 2 bytes x 3; the embeddings 3 x V·d x 4 bytes. The hidden
        size aims at ~24 layers and is capped so that no tensor exceeds 256 MiB.
        """
        vocab = VOCAB if target >= 10**9 else 8192
        per_layer = 72.0  # bytes per d² per layer
        emb = 12.0 * vocab  # bytes per d for the word embedding and its moments
        d = (-emb + (emb * emb + 4 * per_layer * 24 * target) ** 0.5) / (2 * per_layer * 24)
        cap = MAX_TENSOR_BYTES // (4 * max(vocab, MAX_POSITIONS))
        hidden = max(64, min(int(d) // 64 * 64, cap // 64 * 64))
        layers = max(1, round((target - emb * hidden) / (per_layer * hidden * hidden)))
        return cls(hidden, layers, vocab, MAX_POSITIONS)

    @classmethod
    def model_like(cls, target: int) -> GPTConfig:
        """A shape as published GPT models grow: deeper a little and wider a lot. The depth
        follows the GPT-3 paper's table of sizes (Brown et al. 2020, Table 2.1: 24 layers up to
        1.3B parameters, 32 from 2.7B to 6.7B, 40 at 13B) and the width is solved for
        ``target`` (a multiple of 128), with no cap on a tensor's size: the tensor count stays
        in the low thousands at every size, where :meth:`for_size` adds layers instead."""
        vocab = VOCAB if target >= 10**9 else 8192
        layers = 24 if target < 8 * 10**9 else 32 if target < 24 * 10**9 else 40
        per_layer = 72.0 * layers  # bytes per d² over all layers
        emb = 12.0 * vocab
        d = (-emb + (emb * emb + 4 * per_layer * target) ** 0.5) / (2 * per_layer)
        return cls(max(128, round(d / 128) * 128), layers, vocab, MAX_POSITIONS)


def _random_source() -> type:
    from ckpt_migrate.format.tree import DataSource

    @dataclass(eq=False)
    class RandomData(DataSource):
        """Random data made on ``read()``: nothing is held between reads."""

        seed: int
        shape: tuple[int, ...]
        dtype: str  # "float32" or "bfloat16" (stored as its int16 bit pattern)
        kind: str  # "weight", "bias", "norm", "exp_avg", "exp_avg_sq"

        def read(self) -> np.ndarray:
            a = np.random.default_rng(self.seed).standard_normal(self.shape, dtype=np.float32)
            if self.kind == "weight":
                a *= 0.02
            elif self.kind in ("bias", "exp_avg"):
                a *= 1e-3
            elif self.kind == "norm":
                a *= 0.01
                a += 1.0
            elif self.kind == "exp_avg_sq":
                a *= 1e-4
                np.square(a, out=a)
            if self.dtype == "float32":
                return a
            bits = a.view(np.uint32)
            np.right_shift(bits, 16, out=bits)  # bf16 by truncation: the high half of the fp32
            return bits.astype(np.uint16).view(np.int16)

        def describe(self) -> str:
            return f"random(seed={self.seed})"

    return RandomData


def gpt_tree(cfg: GPTConfig, global_step: int = 10_000) -> Any:
    """The neutral tree of a 1.9-era GPT training checkpoint with the data made lazily."""
    from ckpt_migrate.format.tree import DictNode, MemoryData, SeqNode, TensorLeaf, ValueLeaf

    random_data = _random_source()
    d, ff = cfg.hidden, 4 * cfg.hidden
    model: list[tuple[str, Any]] = []
    params: list[tuple[TensorLeaf, str]] = []  # (leaf, kind) in optimizer order

    def param(name: str, shape: tuple[int, ...], dtype: str, kind: str) -> TensorLeaf:
        leaf = TensorLeaf(dtype, shape, random_data(len(model), shape, dtype, kind))
        model.append((name, leaf))
        params.append((leaf, kind))
        return leaf

    wte = param("embedding_layer.word_embeddings.weight", (cfg.vocab, d), "float32", "weight")
    param("embedding_layer.position_embeddings.weight", (cfg.positions, d), "float32", "weight")
    for i in range(cfg.layers):
        p = f"transformer_decoder.layers.{i}"
        for proj in ("proj_q", "proj_k", "proj_v", "proj_output"):
            param(f"{p}.self_attn.{proj}_dense_layer.weight", (d, d), "bfloat16", "weight")
            param(f"{p}.self_attn.{proj}_dense_layer.bias", (d,), "float32", "bias")
        for norm in ("norm1", "norm3"):
            param(f"{p}.{norm}.weight", (d,), "float32", "norm")
            param(f"{p}.{norm}.bias", (d,), "float32", "bias")
        param(f"{p}.ffn.ffn.0.linear_layer.weight", (ff, d), "bfloat16", "weight")
        param(f"{p}.ffn.ffn.0.linear_layer.bias", (ff,), "float32", "bias")
        param(f"{p}.ffn.ffn.1.linear_layer.weight", (d, ff), "bfloat16", "weight")
        param(f"{p}.ffn.ffn.1.linear_layer.bias", (d,), "float32", "bias")
    param("transformer_decoder.norm.weight", (d,), "float32", "norm")
    param("transformer_decoder.norm.bias", (d,), "float32", "bias")
    model.append(("lm_head.weight", wte))  # tied to the word embedding: one leaf, a hard link

    seed = len(model)
    state: list[tuple[Any, Any]] = []
    for index, (leaf, _) in enumerate(params):
        moments = []
        for moment in ("exp_avg", "exp_avg_sq"):
            seed += 1
            moments.append(
                (
                    moment,
                    TensorLeaf(
                        leaf.dtype, leaf.shape, random_data(seed, leaf.shape, leaf.dtype, moment)
                    ),
                )
            )
        step = TensorLeaf("float32", (), MemoryData(np.array(global_step, dtype=np.float32)))
        state.append((index, DictNode([("step", step), *moments])))

    def group(indices: list[int], weight_decay: float) -> DictNode:
        return DictNode(
            [
                ("lr", ValueLeaf(1.2e-4)),
                ("betas", SeqNode("tuple", [ValueLeaf(0.9), ValueLeaf(0.95)])),
                ("eps", ValueLeaf(1e-8)),
                ("weight_decay", ValueLeaf(weight_decay)),
                ("amsgrad", ValueLeaf(False)),
                ("correct_bias", ValueLeaf(True)),
                ("params", SeqNode("list", [ValueLeaf(i) for i in indices])),
            ]
        )

    decay = [i for i, (_, kind) in enumerate(params) if kind == "weight"]
    no_decay = [i for i, (_, kind) in enumerate(params) if kind != "weight"]
    optimizer = DictNode(
        [
            ("state", DictNode(state)),
            ("param_groups", SeqNode("list", [group(decay, 0.1), group(no_decay, 0.0)])),
        ]
    )
    lr_scheduler = DictNode(
        [
            ("base_lrs", SeqNode("list", [ValueLeaf(1.2e-4), ValueLeaf(1.2e-4)])),
            ("last_epoch", ValueLeaf(global_step)),
            ("verbose", ValueLeaf(False)),
            ("_step_count", ValueLeaf(global_step + 1)),
            ("_get_lr_called_within_step", ValueLeaf(False)),
            ("_last_lr", SeqNode("list", [ValueLeaf(6.0e-5), ValueLeaf(6.0e-5)])),
            ("initial_learning_rate", ValueLeaf(1.2e-4)),
            ("end_learning_rate", ValueLeaf(1.2e-5)),
            ("decay_steps", ValueLeaf(100_000)),
        ]
    )
    return DictNode(
        [
            ("model", DictNode(model)),
            ("optimizer", optimizer),
            ("lr_scheduler", lr_scheduler),
            ("global_step", ValueLeaf(global_step)),
        ]
    )


def generate(path: Path, size: int, shape: str = "deep") -> dict[str, Any]:
    """The synthetic 1.9 checkpoint of about ``size`` bytes; ``shape``: ``deep`` (a width
    capped so that no tensor exceeds 256 MiB, layers added with size: :meth:`GPTConfig.for_size`)
    or ``model`` (:meth:`GPTConfig.model_like`)."""
    from ckpt_migrate.format.write import write_checkpoint

    cfg = GPTConfig.model_like(size) if shape == "model" else GPTConfig.for_size(size)
    start = time.perf_counter()
    report = write_checkpoint(gpt_tree(cfg), path, SOURCE_RELEASE)
    seconds = time.perf_counter() - start
    return {
        "config": cfg.__dict__,
        "tensors": report.tensors,
        "chunks": count_chunks(path),
        "leaves": report.leaves,
        "tensor_bytes": report.tensor_bytes,
        "file_bytes": path.stat().st_size,
        "seconds": round(seconds, 1),
    }


def count_chunks(path: Path) -> int:
    """Stored chunks over all datasets (the writers auto-chunk: many small chunks)."""
    import h5py

    total = 0

    def visit(_: str, obj: Any) -> None:
        nonlocal total
        if isinstance(obj, h5py.Dataset) and obj.chunks is not None:
            total += obj.id.get_num_chunks()

    with h5py.File(path, "r", locking=False) as f:
        f.visititems(visit)
    return total


# --------------------------------------------------------------------------- the naive chain


def naive_worker(src: Path, outdir: Path) -> None:
    """One whole-file read and rewrite per hop, deleting each intermediate file; prints JSON."""
    import gc

    import torch

    import ckpt_migrate
    from ckpt_migrate.format import releases
    from ckpt_migrate.format.read import read_checkpoint
    from ckpt_migrate.torch.lazy import materialize

    with read_checkpoint(src) as ckpt:
        first = ckpt.release
    assert first is not None
    names = [r.name for r in releases.RELEASES]
    chain = names[names.index(first.name) + 1 :]

    def plain(obj: Any, memo: dict[int, Any]) -> Any:
        if isinstance(obj, torch.Tensor):
            if id(obj) not in memo:  # a tie stays one tensor
                memo[id(obj)] = materialize(obj)
            return memo[id(obj)]
        if isinstance(obj, dict):
            return type(obj)((k, plain(v, memo)) for k, v in obj.items())
        if isinstance(obj, (list, tuple)):
            return type(obj)(plain(v, memo) for v in obj)
        return obj

    hops = []
    prev = src
    for release in chain:
        t0 = time.perf_counter()
        state = plain(ckpt_migrate.load(prev, allow_missing=True), {})
        t1 = time.perf_counter()
        nxt = outdir / f"{src.stem}.{release}{src.suffix}"
        ckpt_migrate.save(state, nxt, release)
        del state
        gc.collect()  # as if each hop were its own process: save() frees tensors only at GC
        t2 = time.perf_counter()
        if prev != src:
            prev.unlink()
        prev = nxt
        hops.append({"to": release, "load": round(t1 - t0, 2), "save": round(t2 - t1, 2)})
    print(json.dumps({"output": str(prev), "hops": hops}))


# --------------------------------------------------------------------------- where the time goes


def phases_worker(src: Path, outdir: Path, verify: str) -> None:
    """Run ``engine.upgrade`` in this process with timers around its phases; prints JSON.

    Wall-clock intervals. The copy worker (its own process) also hashes the source; ``copy:
    waiting for the data part`` is how long this process waited for it at the end.
    """
    t_import = time.perf_counter()
    import threading

    from ckpt_migrate.engine import copypatch
    from ckpt_migrate.engine import upgrade as engine
    from ckpt_migrate.engine import verify as verifying

    imported = time.perf_counter() - t_import
    times: dict[str, float] = {}
    lock = threading.Lock()

    def timed(label: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with lock:
                    times[label] = times.get(label, 0.0) + time.perf_counter() - t0

        return wrapper

    # Engine internals by name, in each engine module that calls them; names the engine does not
    # have (it changes) are skipped.
    patches = {
        "read_checkpoint": "open source (read_checkpoint)",
        "make_plan": "plan (make_plan)",
        "apply_hops": "apply hops",
        "prepare": "prepare tree",
        "_copy_bytes": "copy (total, incl. wait for the hash)",
        "file_digest": "hash of source (thread; rewrites only)",
        "data_ranges": "chunk ranges of the reused datasets (copy path)",
        "H5Handle.walked": "wait for the chunk walk's verdict",
        "SplitCopy.restrict": "copy: metadata part (this process)",
        "_patch": "HDF5 patch (total)",
        "verify_index": "verify: index checks (total)",
        "h5root.switch_root": "HDF5 patch: new root in the superblock",
        "_verify": "verify (total)",
        "check_written": "verify: re-read structure",
        "object_addresses": "verify: object addresses",
        "dataset_sha256": "verify: hash output tensors",
        "tensor_sha256": "verify: hash source tensors",
        "SplitCopy.finish": "copy: waiting for the data part (worker)",
        "fsync_path": "fsync output",
        "publish": "publish (link + dir fsync)",
    }
    done: set[tuple[int, str]] = set()  # a class two modules import is patched once
    for module in (engine, copypatch, verifying):
        for name, label in patches.items():
            owner_name, _, attr = name.rpartition(".")
            owner = getattr(module, owner_name, None) if owner_name else module
            if not callable(getattr(owner, attr, None)) or (id(owner), attr) in done:
                continue
            done.add((id(owner), attr))
            setattr(owner, attr, timed(label, getattr(owner, attr)))
    os.copy_file_range = timed("copy: copy_file_range calls", os.copy_file_range)  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    result = engine.upgrade(
        src,
        engine.UpgradeOptions(
            output_dir=outdir, verify=verify, inputs={"drop_dataloader_state": True}
        ),
    )
    total = time.perf_counter() - t0
    out = {
        "status": result.status,
        "strategy": result.strategy,
        "verified": result.verified,
        "error": result.error,
        "import_seconds": round(imported, 3),
        "upgrade_seconds": round(total, 3),
        "phases": {k: round(v, 3) for k, v in times.items()},
    }
    print(json.dumps(out))


# --------------------------------------------------------------------------- running things


@dataclass
class Measured:
    seconds: float
    maxrss_mib: float
    cpu_seconds: float
    returncode: int
    stdout: str
    stderr: str


def warm_bytecode() -> None:
    """Cache the bytecode of the packages the commands import, as ``pip install`` does (the
    README's test command installs with ``--no-compile``)."""
    import compileall
    import importlib.util

    for name in _IMPORTED:
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(folder, quiet=1, workers=0)


def run_measured(argv: list[str], workdir: Path) -> Measured:
    """Run ``argv``: wall time, peak RSS and CPU time of that process.

    The child's ``ru_maxrss`` (from ``wait4``) is only meaningful if its parent is small: Linux
    carries the pre-exec high-water mark of the forking process over into the child, so children
    of this (large) process would all report this process's RSS. Hence the command runs under
    GNU ``/usr/bin/time``, which is tiny and reports its child's ``wait4`` figures.
    """
    with (
        tempfile.TemporaryFile("w+", dir=workdir) as out,
        tempfile.TemporaryFile("w+", dir=workdir) as err,
        tempfile.NamedTemporaryFile("w+", dir=workdir) as usage_file,
    ):
        wrapped = [TIME, "-f", "%M %U %S", "-o", usage_file.name, *argv] if TIME else argv
        t0 = time.perf_counter()
        proc = subprocess.Popen(wrapped, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=ENV)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        maxrss_kib, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
        if TIME:
            usage_file.seek(0)
            fields = usage_file.read().split()
            with contextlib.suppress(ValueError, IndexError):
                maxrss_kib, cpu = int(fields[-3]), float(fields[-2]) + float(fields[-1])
        out.seek(0)
        err.seek(0)
        return Measured(seconds, maxrss_kib / 1024, cpu, proc.returncode, out.read(), err.read())


def code_fingerprint() -> str:
    """A short hash of the installed package's source: which engine a number was measured with."""
    import hashlib

    import ckpt_migrate

    h = hashlib.sha256()
    roots = [Path(ckpt_migrate.__file__).parent, REPO / "migrations"]
    for path in sorted(f for root in roots if root.is_dir() for f in root.rglob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def busy_cpu_seconds() -> float | None:
    """CPU time all processes on the machine have used since boot (``/proc/stat``)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def resident_bytes(path: Path) -> int | None:
    """How much of ``path`` is in the page cache (util-linux ``fincore``), if it can tell."""
    if shutil.which("fincore") is None:
        return None
    try:
        out = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return int(out.split()[0])
    except (subprocess.CalledProcessError, ValueError, IndexError):
        return None


def drop_caches_works() -> bool:
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("1\n")
        return True
    except OSError:
        return False


def settle(src: Path, cache: str, cold_method: str) -> int | None:
    """Flush earlier writes, then put ``src`` cold (evicted) or warm (read) in the page cache."""
    os.sync()
    time.sleep(1.0)  # let ext4's journal commit and discards of deleted files go out
    os.sync()
    if cache == "cold":
        if cold_method == "drop-caches":
            with open("/proc/sys/vm/drop_caches", "w") as fh:
                fh.write("3\n")
        else:
            fd = os.open(src, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    else:
        with open(src, "rb", buffering=0) as fh:
            buf = bytearray(16 << 20)
            while fh.readinto(buf):
                pass
    return resident_bytes(src)


def clear_dir(path: Path) -> None:
    for child in path.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()


@dataclass
class Command:
    key: str
    label: str
    argv: list[str]
    naive: bool = False
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    setup: Callable[[], None] | None = None  # run before each timed run (not timed)


def commands(src: Path, out: Path, skip_naive: bool, hops: int) -> list[Command]:
    dst = str(out / src.name)
    cli = str(CLI)
    cmds = [
        Command("cp", "cp", ["cp", str(src), dst]),
        Command(
            "cp_sync",
            "cp + sync DST (fsync)",
            ["sh", "-c", 'cp -- "$1" "$2" && sync -- "$2"', "sh", str(src), dst],
        ),
        Command(
            "ours",
            "ckpt-migrate upgrade",
            [cli, "upgrade", str(src), "--output-dir", str(out), "--json", *DROP],
        ),
        Command(
            "ours_full",
            "ckpt-migrate upgrade --verify full",
            [
                cli,
                "upgrade",
                str(src),
                "--output-dir",
                str(out),
                "--verify",
                "full",
                "--json",
                *DROP,
            ],
        ),
    ]
    inplace = out / f"inplace-{src.name}"
    try:  # --inplace on a second name of the source: the source itself is never modified
        os.link(src, inplace)
        inplace.unlink()
    except OSError:
        print(
            "  (no --inplace row: the work directory is on another filesystem than the source)",
            file=sys.stderr,
        )
    else:
        cmds.append(
            Command(
                "ours_inplace",
                "ckpt-migrate upgrade --inplace",
                [cli, "upgrade", str(inplace), "--inplace", "--json", *DROP],
                setup=lambda: os.link(src, inplace),
            )
        )
    if not skip_naive:
        me = [sys.executable, str(Path(__file__).resolve())]
        cmds.append(
            Command(
                "naive",
                f"naive chain, {hops} x (load + save)",
                [*me, "--naive-worker", str(src), str(out)],
                naive=True,
            )
        )
    return cmds


def check_output(cmd: Command, m: Measured, out: Path, latest: str) -> dict[str, Any]:
    """The run must have produced a readable checkpoint of the newest release."""
    from ckpt_migrate.format.read import read_checkpoint

    if m.returncode != 0:
        raise SystemExit(f"{cmd.label} failed (exit {m.returncode}):\n{m.stderr[-2000:]}")
    info: dict[str, Any] = {}
    if cmd.key.startswith("ours"):
        res = json.loads(m.stdout.strip().splitlines()[-1])
        if res.get("status") != "upgraded":
            raise SystemExit(f"{cmd.label}: {res}")
        info = {"strategy": res.get("strategy"), "verified": res.get("verified")}
        path = Path(res["output"])
    elif cmd.naive:
        res = json.loads(m.stdout.strip().splitlines()[-1])
        info = {"hops": res["hops"]}
        path = Path(res["output"])
    else:
        return info
    with read_checkpoint(path) as ckpt:
        got = ckpt.release.name if ckpt.release else None
    if got != latest:
        raise SystemExit(f"{cmd.label}: output is release {got}, expected {latest}")
    return info


def startup_costs(workdir: Path, repeat: int) -> dict[str, Any]:
    """Fixed costs, page cache warm: interpreter, CLI import, and a complete tiny upgrade."""
    tiny_dir, tiny_out = workdir / "tiny", workdir / "tiny-out"
    tiny_dir.mkdir()
    tiny_out.mkdir()
    tiny = tiny_dir / FIXTURE.name
    shutil.copyfile(FIXTURE, tiny)  # not the fixture itself: the upgrade flocks its source
    cmds = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "ckpt-migrate --help": [str(CLI), "--help"],
        f"ckpt-migrate upgrade {FIXTURE.name} ({human(tiny.stat().st_size)})": [
            str(CLI),
            "upgrade",
            str(tiny),
            "--output-dir",
            str(tiny_out),
            "--json",
        ],
    }
    for argv in cmds.values():  # warm-up
        run_measured(argv, workdir)
        clear_dir(tiny_out)
    results: dict[str, Any] = {}
    samples: dict[str, list[Measured]] = {k: [] for k in cmds}
    for _ in range(max(repeat, 5)):
        for key, argv in cmds.items():
            m = run_measured(argv, workdir)
            if m.returncode != 0:
                raise SystemExit(f"{key} failed:\n{m.stderr[-2000:]}")
            samples[key].append(m)
            clear_dir(tiny_out)
    for key, ms in samples.items():
        results[key] = {
            "median_s": round(statistics.median(m.seconds for m in ms), 3),
            "maxrss_mib": round(max(m.maxrss_mib for m in ms), 1),
        }
    return results


# --------------------------------------------------------------------------- reporting


def summarize(cmds: list[Command], caches: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cache in caches:
        rows: dict[str, Any] = {}
        for cmd in cmds:
            runs = cmd.runs.get(cache, [])
            if not runs:
                continue
            secs = [r["seconds"] for r in runs]
            rows[cmd.key] = {
                "label": cmd.label,
                "runs": len(runs),
                "median_s": round(statistics.median(secs), 3),
                "min_s": round(min(secs), 3),
                "max_s": round(max(secs), 3),
                "maxrss_mib": round(max(r["maxrss_mib"] for r in runs), 1),
                "cpu_s": round(statistics.median(r["cpu_seconds"] for r in runs), 2),
                "other_cpu_s": _median_or_none([r.get("other_cpu_seconds") for r in runs]),
                "seconds": [round(s, 3) for s in secs],
            }
        cp, cps = rows["cp"]["median_s"], rows["cp_sync"]["median_s"]
        for row in rows.values():
            row["x_cp"] = round(row["median_s"] / cp, 2)
            row["x_cp_sync"] = round(row["median_s"] / cps, 2)
        ours = rows["ours"]
        targets = {
            "upgrade_vs_cp": {
                "value": ours["x_cp"],
                "target": "<= 1.3",
                "met": ours["x_cp"] <= 1.3,
            },
            "upgrade_vs_cp_sync": {
                "value": ours["x_cp_sync"],
                "target": "<= 1.3",
                "met": ours["x_cp_sync"] <= 1.3,
            },
            "upgrade_peak_rss_mib": {
                "value": ours["maxrss_mib"],
                "target": "<= 256",
                "met": ours["maxrss_mib"] <= 256,
            },
        }
        if "ours_inplace" in rows:  # its backup is the original (a hard link): nothing copied
            ratio = rows["ours_inplace"]["x_cp"]
            targets["inplace_vs_cp"] = {"value": ratio, "target": "<= 1.0", "met": ratio <= 1.0}
        if "naive" in rows:
            ratio = round(rows["naive"]["median_s"] / ours["median_s"], 2)
            targets["naive_vs_upgrade"] = {"value": ratio, "target": ">= 2", "met": ratio >= 2}
        out[cache] = {"rows": rows, "targets": targets}
    return out


def _median_or_none(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return round(statistics.median(got), 2) if got else None


def print_report(report: dict[str, Any], file: Any = None) -> None:
    def print(*args: Any) -> None:
        builtins.print(*args, file=file)

    meta = report["meta"]
    src = report["source"]
    print()
    print(
        f"ckpt-migrate upgrade benchmark, {meta['date']}, {meta['cpu']} x{meta['cores']}, "
        f"{meta['ram_gib']} GiB RAM, {meta['fs']} ({meta['kernel']})"
    )
    shape = ""
    if src.get("config"):
        cfg = src["config"]
        shape = f", GPT d={cfg['hidden']} x {cfg['layers']} layers, vocab {cfg['vocab']}"
    tensors = f", {src['tensors']:,} tensors" if src.get("tensors") else ""
    if src.get("chunks"):
        tensors += f" in {src['chunks']:,} stored chunks"
    print(
        f"source: release {src.get('release', SOURCE_RELEASE)}, {human(src['file_bytes'])} "
        f"({src['file_bytes']:,} bytes){tensors}{shape}; target release {meta['target']}"
    )
    if meta["rss_method"] != "GNU time":
        print(f"note: no /usr/bin/time, peak RSS from {meta['rss_method']}")
    codes = meta["code"]
    if len(codes) > 1:
        print(f"WARNING: the package's code changed during the run ({', '.join(codes)}):")
        print("  the runs below mix engine versions; see the per-run 'code' in --json")
    else:
        print(f"package code fingerprint: {codes[0] if codes else '?'}")
    for cache, block in report["results"].items():
        how = report["cache_methods"][cache]
        print(f"\npage cache {cache}: {how}; {meta['repeat']} interleaved runs, medians")
        head = f"{'command':36} {'median s':>9} {'min-max s':>13} {'x cp':>6} {'x cp+sync':>9}"
        print(head + f" {'peak RSS MiB':>12} {'CPU s':>7} {'others CPU s':>12}")
        for row in block["rows"].values():
            spread = f"{row['min_s']:.2f}-{row['max_s']:.2f}"
            n = f" (n={row['runs']})" if row["runs"] != meta["repeat"] else ""
            print(
                f"{row['label'] + n:36} {row['median_s']:9.2f} {spread:>13} {row['x_cp']:6.2f}"
                f" {row['x_cp_sync']:9.2f} {row['maxrss_mib']:12.0f} {row['cpu_s']:7.1f}"
                f" {'?' if row['other_cpu_s'] is None else format(row['other_cpu_s'], '12.1f')}"
            )
        rows = block["rows"]
        if "naive" in rows:
            ratio = rows["naive"]["median_s"] / rows["ours"]["median_s"]
            print(f"naive chain / ckpt-migrate upgrade: {ratio:.1f}x")
        for key, t in block["targets"].items():
            verdict = "met" if t["met"] else "MISSED"
            print(f"  target {key}: {t['value']} (want {t['target']}): {verdict}")
    print("\nfixed start-up cost (page cache warm, medians):")
    for key, row in report["startup"].items():
        print(f"  {key:44} {row['median_s']:6.3f} s  peak RSS {row['maxrss_mib']:.0f} MiB")
    if report.get("phases"):
        print("\nwhere ckpt-migrate upgrade spends its time (in-process, cold, one run):")
        for verify, ph in report["phases"].items():
            print(
                f"  --verify {verify}: whole process {ph['process_seconds']:.2f} s, "
                f"upgrade() {ph['upgrade_seconds']:.2f} s, import {ph['import_seconds']:.2f} s"
            )
            for k, v in ph["phases"].items():
                print(f"    {k:42} {v:7.2f} s")


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(ram, 1)}


def filesystem(path: Path) -> str:
    best, fs = "", "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            mount = parts[1]
            if str(path).startswith(mount) and len(mount) > len(best):
                best, fs = mount, f"{parts[2]} at {mount}"
    return fs


# --------------------------------------------------------------------------- main


@contextlib.contextmanager
def work_directory(parent: str | None) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=parent))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=parse_size, default=parse_size("3GB"), help="e.g. 100MB, 3GB")
    p.add_argument("--repeat", type=int, default=3, help="runs per command (median reported)")
    p.add_argument("--naive-repeat", type=int, help="runs of the naive chain (default --repeat)")
    p.add_argument("--workdir", help="where to put the files (a fresh subdirectory, removed)")
    p.add_argument("--skip-naive", action="store_true", help="do not run the naive chain")
    p.add_argument(
        "--cache",
        choices=("cold", "warm", "both"),
        default="both",
        help="page cache state of the source before each run (default both)",
    )
    p.add_argument(
        "--cold-method",
        choices=("fadvise", "drop-caches"),
        default="fadvise",
        help="evict only the source (posix_fadvise DONTNEED, default) or drop all caches (root)",
    )
    p.add_argument("--phases", action="store_true", help="also time the engine's phases")
    p.add_argument("--source", type=Path, help="use this 1.9 checkpoint instead of generating")
    p.add_argument(
        "--json", action="store_true", help="print JSON on stdout (the table goes to stderr)"
    )
    p.add_argument("--naive-worker", nargs=2, metavar=("SRC", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--phases-worker", nargs=3, metavar=("SRC", "OUT", "V"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.naive_worker:
        naive_worker(Path(args.naive_worker[0]), Path(args.naive_worker[1]))
        return 0
    if args.phases_worker:
        src, out, verify = args.phases_worker
        phases_worker(Path(src), Path(out), verify)
        return 0
    if args.cold_method == "drop-caches" and not drop_caches_works():
        p.error("--cold-method drop-caches needs root (cannot write /proc/sys/vm/drop_caches)")
    if not CLI.exists():
        p.error(f"console script not found: {CLI} (install the package in this interpreter)")
    warm_bytecode()

    from ckpt_migrate.format import releases

    latest = releases.LATEST.name
    caches = ["cold", "warm"] if args.cache == "both" else [args.cache]
    naive_repeat = args.repeat if args.naive_repeat is None else args.naive_repeat
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else print

    with work_directory(args.workdir) as work:
        size = args.source.stat().st_size if args.source else args.size
        need = 3 * size + (1 << 30)
        free = shutil.disk_usage(work).free
        if free < need:
            raise SystemExit(f"{work}: {human(free)} free, the benchmark needs about {human(need)}")
        if args.source:
            src = args.source.resolve()
            from ckpt_migrate.format.read import read_checkpoint

            with read_checkpoint(src) as ckpt:
                source = {"file_bytes": size, "tensors": None, "config": None, "generated": False}
                source["release"] = ckpt.release.name if ckpt.release else None
        else:
            (work / "src").mkdir()
            src = work / "src" / f"gpt-{SOURCE_RELEASE}-{human(args.size).replace(' ', '')}.mdl"
            log(f"generating {src} ({human(args.size)}) ...")
            source = generate(src, args.size)
            source["generated"] = True
            source["release"] = SOURCE_RELEASE
            got = human(source["file_bytes"])
            log(f"  {got}, {source['tensors']} tensors, {source['seconds']} s")
        out = work / "out"
        out.mkdir()

        log("start-up cost ...")
        startup = startup_costs(work, args.repeat)
        names = [r.name for r in releases.RELEASES]
        hops = len(names) - 1 - names.index(source["release"] or latest)
        cmds = commands(src, out, args.skip_naive, hops)
        loads = []
        for r in range(max(args.repeat, naive_repeat if not args.skip_naive else 0)):
            for cache in caches:
                order = list(cmds)
                random.Random(r).shuffle(order)
                order.sort(key=lambda c: c.key == "ours_full" or c.naive)
                for cmd in order:
                    if r >= (naive_repeat if cmd.naive else args.repeat):
                        continue
                    clear_dir(out)
                    if cmd.setup is not None:
                        cmd.setup()
                    resident = settle(src, cache, args.cold_method)
                    loads.append(os.getloadavg()[0])
                    code = code_fingerprint()
                    busy = busy_cpu_seconds()
                    m = run_measured(cmd.argv, work)
                    after = busy_cpu_seconds()
                    # CPU that other processes took meanwhile: contention on a shared machine
                    others = None if busy is None or after is None else after - busy - m.cpu_seconds
                    info = check_output(cmd, m, out, latest)
                    run = {
                        "seconds": m.seconds,
                        "maxrss_mib": m.maxrss_mib,
                        "cpu_seconds": m.cpu_seconds,
                        "source_resident_bytes": resident,
                        "code": code,
                        "other_cpu_seconds": None if others is None else round(max(others, 0), 2),
                        **info,
                    }
                    cmd.runs.setdefault(cache, []).append(run)
                    log(
                        f"  run {r + 1} {cache:4} {cmd.label:36} {m.seconds:8.2f} s "
                        f"{m.maxrss_mib:7.0f} MiB (source resident before: "
                        f"{'?' if resident is None else human(resident)}; other processes' CPU: "
                        f"{'?' if others is None else f'{max(others, 0):.1f} s'})"
                    )
        clear_dir(out)
        phases: dict[str, Any] = {}
        if args.phases:
            me = [sys.executable, str(Path(__file__).resolve())]
            for verify in ("index", "full"):
                clear_dir(out)
                settle(src, "cold", args.cold_method)
                m = run_measured([*me, "--phases-worker", str(src), str(out), verify], work)
                if m.returncode != 0:
                    log(f"phase timing failed (--verify {verify}):\n{m.stderr[-2000:]}")
                    continue
                phases[verify] = json.loads(m.stdout.strip().splitlines()[-1])
                phases[verify]["process_seconds"] = round(m.seconds, 3)
                phases[verify]["code"] = code_fingerprint()
            clear_dir(out)

        cold_how = (
            "sync, then the source's pages evicted with posix_fadvise(POSIX_FADV_DONTNEED)"
            if args.cold_method == "fadvise"
            else "sync, then echo 3 > /proc/sys/vm/drop_caches"
        )
        report = {
            "meta": {
                "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                **machine(),
                "fs": filesystem(work),
                "kernel": platform.release(),
                "python": platform.python_version(),
                "repeat": args.repeat,
                "naive_repeat": None if args.skip_naive else naive_repeat,
                "target": latest,
                "rss_method": "GNU time" if TIME else "wait4: at least this process's own RSS",
                "loadavg_1min_before_runs": [round(x, 2) for x in loads],
                "code": sorted({r["code"] for c in cmds for runs in c.runs.values() for r in runs}),
            },
            "source": source,
            "cache_methods": {
                "cold": cold_how,
                "warm": "sync, then the whole source read into the page cache",
            },
            "results": summarize(cmds, caches),
            "startup": startup,
            "phases": phases,
        }
    print_report(report, sys.stderr if args.json else sys.stdout)  # with --json: on stderr
    if args.json:
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
