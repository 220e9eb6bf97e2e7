"""The space an upgrade reserves is what it writes: never less than the output, at most 1.2
times it plus 1 MiB, so that a job that fits is never refused for space (issue #31: a 24.6 MB
1.9 file of 2,562 leaves reserved 67.6 MB for a 28.6 MB output).

The sweep crosses leaf counts (10 to 1,000 here; 10,000 and 30,000 in
``benchmarks/bench_space.py``), tiny and realistic tensors (the rewrite and the copy-patch
strategies, and the root edit of 2.5 -> 2.10), short and long names, both target formats
(0.4 and 0.5) and downgrades, on files written as the real writers lay them out (LZ4,
auto-chunked), and on files the real library and the model fixtures hold.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, MODELS, REAL, one_line_error, real_2x_files, run_cli

import ckpt_migrate as cm
from ckpt_migrate.engine.plan import make_plan
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.errors import CkptError
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import iter_leaves

LONG = "transformer_decoder.layers.{}.self_attn.proj_q_dense_layer.weight"


def training_state(leaves: int, shape: tuple[int, ...], long: bool) -> dict:
    """Weights with Adam moments and their parameter groups: ``leaves`` leaves, about."""
    rng = np.random.default_rng(leaves)
    k = max(1, leaves // 3)
    name = LONG.format if long else "l.{}.w".format
    weights = {name(i): rng.standard_normal(shape, np.float32) for i in range(k)}
    moments = {
        i: {m: rng.standard_normal(shape, np.float32) for m in ("exp_avg", "exp_avg_sq")}
        for i in range(k)
    }
    groups = [{"lr": 0.1, "params": list(range(k))}]
    return {
        "model": weights,
        "optimizer": {"state": moments, "param_groups": groups},
        "global_step": 10,
    }


def estimate_and_size(src: Path, target: str, out: Path) -> tuple[int, int, str]:
    with read_checkpoint(src, defer_chunks=True) as ckpt:
        estimate = make_plan(ckpt, target, output_dir=out.parent).output_bytes
    res = upgrade(
        src, UpgradeOptions(target=target, output=out, inputs={"drop_dataloader_state": True})
    )
    if res.status != "upgraded":
        raise CkptError(src, str(res.error))
    return estimate, out.stat().st_size, res.strategy or ""


def assert_within(estimate: int, size: int, what: str) -> None:
    assert size <= estimate <= 1.2 * size + (1 << 20), (
        f"{what}: reserved {estimate:,} for {size:,} bytes ({estimate / size:.2f}x)"
    )


TINY, REALISTIC = (4,), (64, 64)


@pytest.mark.parametrize(
    ("leaves", "shape", "long"),
    [
        (10, TINY, False),
        (10, REALISTIC, True),
        (300, TINY, False),
        (300, REALISTIC, False),
        (300, REALISTIC, True),
        (1000, TINY, True),  # metadata is the whole output: the estimate's hardest case
    ],
)
def test_the_reservation_bounds_the_output(tmp_path, leaves, shape, long):
    state = training_state(leaves, shape, long)
    seen = set()
    hops = (("1.9", ("2.0", "2.10")), ("2.4", ("2.10", "2.0")), ("2.5", ("2.10",)))
    for release, targets in hops:
        src = tmp_path / f"src-{release}.mdl"
        cm.save(state, src, release)
        for target in targets:
            estimate, size, strategy = estimate_and_size(src, target, tmp_path / f"{target}.mdl")
            assert_within(estimate, size, f"{release} -> {target}, {leaves} leaves, {strategy}")
            seen.add(strategy)
            (tmp_path / f"{target}.mdl").unlink()
    assert seen == {"rewrite" if shape == TINY else "copy-patch", "root-edit"}  # 2.5 -> 2.10


def test_files_we_did_not_write(tmp_path):
    """The real library's 2.10 files (downgraded to 2.0; uint16-64 tensors to 2.3) and the
    model fixtures (1.9 and 2.0 to 2.10), whose names and layouts are theirs."""
    real = sorted((FIXTURES / "real-cstorch-2.10").glob("*.mdl"))
    sources = [(p, "2.3" if p.stem == "dtypes" else "2.0") for p in real]
    sources += [(p, "2.10") for p in sorted(MODELS.glob("*/checkpoint_100.mdl"))]
    refused = set()
    for i, (path, target) in enumerate(sources):
        src = tmp_path / f"{i}.mdl"
        shutil.copyfile(path, src)
        try:
            estimate, size, _ = estimate_and_size(src, target, tmp_path / f"{i}.out.mdl")
        except CkptError:  # refused before anything is reserved
            refused.add(path.stem)
            continue
        assert_within(estimate, size, f"{path.relative_to(FIXTURES)} -> {target}")
    # leaf names the old format cannot hold, and keys the real writer itself let collide
    assert refused == {"key_collision", "key_collision_int_str", "scalars_misc"}


def test_a_job_that_fits_is_not_refused_for_space(small_disk, tmp_path):
    """A metadata-heavy 1.9 file on a disk with room for its output but not for the old
    estimate (the source plus 16 KiB a leaf): upgraded, not refused."""
    made = tmp_path / "checkpoint_10.mdl"
    cm.save(training_state(900, TINY, True), made, "1.9")
    disk = small_disk(3 * made.stat().st_size)
    src = disk / made.name
    shutil.copyfile(made, src)
    with read_checkpoint(src) as ckpt:
        leaves = sum(1 for _ in iter_leaves(ckpt.root))
    free = shutil.disk_usage(disk).free
    assert src.stat().st_size + (16 << 10) * leaves > free  # what was reserved before
    proc = run_cli(
        "upgrade",
        src,
        "--output-dir",
        disk / "out",
        "--drop-dataloader-state",
        "--progress",
        "none",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (disk / "out" / src.name).stat().st_size <= free


@pytest.mark.parametrize(
    ("leaves", "shape", "long", "release"),
    [
        (30, TINY, False, "2.10"),
        (300, TINY, True, "1.9"),
        (30, REALISTIC, True, "2.10"),
        (90, REALISTIC, False, "2.0"),
    ],
)
def test_a_new_checkpoint_reserves_what_it_writes(
    leaves, shape, long, release, tmp_path, monkeypatch
):
    """``save`` (and ``from-torch``, ``import-hf``, ``tf-to-h5``, which write through it)
    allocates the file's room before HDF5 writes a byte, as the upgrade does: never less than
    the file, at most 1.2 times it plus 1 MiB. No reservation outlives the file: an upgrade's
    rewrite of the release 2.0 fixture (107 KB) kept 229 KB allocated."""
    from ckpt_migrate.format import write as writer

    bounds = []
    real = writer.new_checkpoint_bound
    monkeypatch.setattr(
        writer, "new_checkpoint_bound", lambda *a: bounds.append(real(*a)) or bounds[-1]
    )
    out = tmp_path / "made.mdl"
    cm.save(training_state(leaves, shape, long), out, release)
    assert_within(bounds[0], out.stat().st_size, f"{leaves} leaves of {shape}, {release}")
    assert out.stat().st_blocks * 512 < out.stat().st_size + (16 << 10)
    proc = run_cli(
        "upgrade",
        FIXTURES / "release-2.0.mdl",
        "-o",
        tmp_path / "rw",
        "--drop-dataloader-state",
        "-q",
    )
    assert proc.returncode == 0 and "(rewrite" in proc.stdout, proc.stdout + proc.stderr
    rewritten = (tmp_path / "rw" / "release-2.0.mdl").stat()
    assert rewritten.st_blocks * 512 < rewritten.st_size + (16 << 10)


def test_the_real_librarys_states_saved_again_reserve_what_they_write(tmp_path, monkeypatch):
    """The states the real cerebras.pytorch 2.6–2.10 saved (GPT-2, a Trainer's, every dtype,
    dataloaders, ties, nested containers, empty ones), loaded and saved again: the room
    taken is never less than the file, at most 1.2 times it plus 1 MiB, and none of it is
    kept past the file's end."""
    from ckpt_migrate.format import write as writer

    bounds = []
    real = writer.new_checkpoint_bound
    monkeypatch.setattr(
        writer, "new_checkpoint_bound", lambda *a: bounds.append(real(*a)) or bounds[-1]
    )
    written = [p for p in sorted(REAL.glob("*.mdl")) if "collision" not in p.name]
    written += real_2x_files(tmp_path)
    for n, source in enumerate(written):
        out = tmp_path / f"again{n}.mdl"
        cm.save(cm.load(source, objects_mode="data"), out)
        assert_within(bounds[-1], out.stat().st_size, source.name)
        assert out.stat().st_blocks * 512 < out.stat().st_size + (16 << 10), source.name
    assert len(bounds) == len(written) >= 11


SAVE_TO = """
import gc, sys
import numpy as np
import ckpt_migrate as cm
from ckpt_migrate.errors import CkptIOError
data = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)  # 2 MiB
try:
    cm.save({"model": {"w": data}}, sys.argv[1], "2.10")
except CkptIOError as exc:
    print(exc)
gc.collect()
print("collected")
"""


def test_a_new_checkpoint_on_a_full_disk_is_an_error_and_nothing_more(small_disk, tmp_path):
    """``save`` to a disk without room for the file: HDF5 met the full disk part way through
    the tensors, the close failed too, and the identifiers of the half-closed file crashed
    the process at the next collection (exit -11); ``from-torch`` there ended with exit 139
    after its error line. Now the room is taken first: one error, nothing left on the disk,
    its space free."""
    disk = small_disk(1 << 20)
    free = shutil.disk_usage(disk).free
    proc = subprocess.run(
        [sys.executable, "-c", SAVE_TO, str(disk / "n.mdl")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"{disk / 'n.mdl'}: no space left on the device; free disk space and retry",
        "collected",
    ]
    assert proc.stderr == ""
    assert list(disk.iterdir()) == [] and shutil.disk_usage(disk).free == free
    torch = pytest.importorskip("torch")
    torch.save({"model": {"w": torch.randn(512, 1024)}}, tmp_path / "big.pt")
    proc = run_cli("from-torch", tmp_path / "big.pt", disk / "f.mdl")
    one_line_error(proc, 5, "no space left on the device")
    assert list(disk.iterdir()) == []


def test_to_torch_on_a_full_disk_is_an_error_and_nothing_more(small_disk):
    """``to-torch`` onto a disk without room: torch's zip writer raised "[enforce fail at
    inline_container.cc:672] . unexpected pos 4160 vs 4052", an internal error (exit 1). Now
    the disk's state names it: exit 5, no space left, nothing left there. The real 2.10
    library's file, and a name too long for the filesystem (an internal error as well)."""
    disk = small_disk(64 << 10)
    with contextlib.suppress(OSError), open(disk / "filler", "wb") as filler:
        filler.write(bytes(64 << 10))  # (as much as fits)
    proc = run_cli("to-torch", REAL / "basic.mdl", disk / "x.pt")
    one_line_error(proc, 5, "x.pt", "no space left on the device")
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]
    proc = run_cli("to-torch", REAL / "basic.mdl", disk / ("a" * 253 + ".pt"))
    one_line_error(proc, 5, "File name too long", "choose a shorter name")


@pytest.mark.parametrize("where", ["output-dir", "inplace"])
def test_a_manifest_that_cannot_be_written_publishes_no_output(small_disk, tmp_path, where):
    """``--manifest`` on a full disk: the output was published (``--inplace``: the original
    replaced and its backup made), then the manifest's write failed and the run said only
    "error: … no space left" (exit 5), ``--json`` "failed" beside an ``output``; a rerun met
    "already exists". The manifest is now written before the output is published and moved
    into place after it: nothing is published, the source is as it was."""
    disk = small_disk(64 << 10)
    with contextlib.suppress(OSError), open(disk / "filler", "wb") as filler:
        filler.write(bytes(64 << 10))
    src = tmp_path / "src" / "basic.mdl"
    src.parent.mkdir()
    shutil.copyfile(REAL / "basic.mdl", src)
    before = src.read_bytes()
    dest = ["--inplace"] if where == "inplace" else ["-o", tmp_path / "out"]
    proc = run_cli("upgrade", src, *dest, "--to", "2.0", "--manifest", disk / "m.json")
    one_line_error(proc, 5, "m.json", "no space left on the device", skip_warnings=True)
    assert sorted(p.name for p in src.parent.iterdir()) == ["basic.mdl"]
    assert src.read_bytes() == before and not (tmp_path / "out").exists()
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]
