#!/usr/bin/env python
"""Write the small deterministic checkpoints in ``fixtures/``, one per release we test against.

    python scripts/make_fixtures.py [--out fixtures] [--force]

Each ``release-<R>.mdl`` holds every leaf kind that release's format can express (FORMAT.md §3,
§4): tensors of every dtype incl. bf16 with NaN payloads and -0.0, 0-d and empty tensors, a tie,
numpy arrays, Python scalars (nan, inf, -0.0, ints beyond 64 bits), strings, None, a constant
("full") tensor, a pickled object, OrderedDict/list/tuple/namedtuple/set containers, int keys,
empty containers and keys with dots, slashes and spaces. The 1.9 file also misses one name of a
tied pair and carries a dataset its spec does not name, as real 1.x files do.
"""

from __future__ import annotations

import argparse
import collections
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckpt_migrate.format import dtypes, releases  # noqa: E402
from ckpt_migrate.format.tree import (  # noqa: E402
    DictNode,
    FullTensorLeaf,
    MemoryData,
    MissingLeaf,
    NamedTupleNode,
    Node,
    OpaqueLeaf,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
    get_path,
    set_path,
)
from ckpt_migrate.format.write import write_checkpoint  # noqa: E402

FIXTURE_RELEASES = ("1.7", "1.8", "1.9", "2.0", "2.3", "2.10")
Step = collections.namedtuple("Step", ["count", "scale"])


def _tensor(array: np.ndarray, dtype: str | None = None) -> TensorLeaf:

    dt = dtype or dtypes.from_storage(array.dtype).name
    return TensorLeaf(dt, tuple(array.shape), MemoryData(np.asarray(array, order="C")))


def _bf16(bits: list[int], shape: tuple[int, ...]) -> TensorLeaf:
    return _tensor(np.array(bits, dtype="<u2").view("<i2").reshape(shape), "bfloat16")


def build_tree(release: str) -> Node:
    """The fixture's tree. Deterministic: seeded data, fixed order."""
    rel = releases.get(release)
    rng = np.random.default_rng(20261121)
    f32 = lambda *s: rng.standard_normal(s).astype("<f4")  # noqa: E731
    embed = _tensor(f32(6, 4))
    w = _tensor(f32(4, 3))
    model = DictNode(
        [
            ("embedding_layer.word_embeddings.weight", embed),
            ("lm_head.weight", embed),  # a tie: one tensor under two names
            ("fc.weight", w),
            ("fc.bias", _bf16([0x3FC0, 0xC000, 0x7FC1], (3,))),  # 1.5, -2.0, NaN with payload
            ("norm.scale", _bf16([0x8000, 0x7F80, 0xFF80, 0x0001], (2, 2))),  # -0, inf, -inf, tiny
            ("half", _tensor(np.array([1.0, -0.0, np.inf, 65504.0], dtype="<f2"))),
            ("double", _tensor(np.array([[np.pi, -0.0], [np.nan, 1e-300]], dtype="<f8"))),
            ("ids", _tensor(np.arange(-3, 3, dtype="<i8"))),
            ("i32", _tensor(np.array([2**31 - 1, -(2**31)], dtype="<i4"))),
            ("i16", _tensor(np.array([-7, 7], dtype="<i2"))),
            ("mask", _tensor(np.array([[True, False], [False, True]]))),
            ("bytes_u8", _tensor(np.arange(250, 256, dtype="u1"))),
            ("scale", _tensor(np.array(0.5, dtype="<f4"))),  # 0-d
            ("empty", _tensor(np.zeros((0, 3), dtype="<f4"))),
        ],
        ordered=True,
    )
    state = DictNode(
        [
            (
                0,
                DictNode(
                    [("exp_avg", _tensor(f32(6, 4))), ("step", _tensor(np.array(10.0, "<f4")))]
                ),
            ),
            (
                1,
                DictNode(
                    [("exp_avg", _tensor(f32(4, 3))), ("step", _tensor(np.array(10.0, "<f4")))]
                ),
            ),
        ]
    )
    group = DictNode(
        [
            ("lr", ValueLeaf(0.1)),
            ("betas", SeqNode("tuple", [ValueLeaf(0.9), ValueLeaf(0.999)])),
            ("eps", ValueLeaf(1e-8)),
            ("amsgrad", ValueLeaf(False)),
            ("params", SeqNode("list", [ValueLeaf(0), ValueLeaf(1)])),
        ]
    )
    optimizer = DictNode([("state", state), ("param_groups", SeqNode("list", [group]))])
    scheduler = DictNode(  # MultiStepLR: its "milestones" are not SequentialLR's
        [
            ("milestones", DictNode([(5, ValueLeaf(1))])),
            ("gamma", ValueLeaf(0.5)),
            ("base_lrs", SeqNode("list", [ValueLeaf(0.1)])),
            ("last_epoch", ValueLeaf(4 if release == "1.7" else 10)),  # 1.7: stale
            ("_last_lr", SeqNode("list", [ValueLeaf(0.05)])),
        ]
    )
    if release == "1.9":  # SequentialLR: warm-up then decay; sub-scheduler values stale
        warmup = DictNode(
            [
                ("base_lrs", SeqNode("list", [ValueLeaf(0.1)])),
                ("last_epoch", ValueLeaf(3)),
                ("start_factor", ValueLeaf(0.1)),
            ]
        )
        decay = DictNode(
            [
                ("base_lrs", SeqNode("list", [ValueLeaf(0.1)])),
                ("last_epoch", _tensor(np.array(2, dtype="<i8"))),  # CS-X runs saved 0-d tensors
                ("T_max", ValueLeaf(100)),
            ]
        )
        scheduler = DictNode(
            [
                ("_schedulers", SeqNode("list", [warmup, decay])),
                ("_milestones", SeqNode("list", [ValueLeaf(5)])),
                ("last_epoch", ValueLeaf(7)),
                ("_last_lr", SeqNode("list", [ValueLeaf(0.05)])),
            ]
        )
    misc = DictNode(
        [
            ("none", ValueLeaf(None)),
            ("text", ValueLeaf("text with . and /")),
            ("unicode", ValueLeaf("значение ✓ 日本")),
            ("nan", ValueLeaf(float("nan"))),
            ("inf", ValueLeaf(float("-inf"))),
            ("neg_zero", ValueLeaf(-0.0)),
            ("flag", ValueLeaf(True)),
            ("big", ValueLeaf(-(2**62))),
            ("zeros", FullTensorLeaf("float32", (2, 3), 0.0)),
            ("empty_dict", DictNode([])),
            ("empty_list", SeqNode("list", [])),
            ("empty_tuple", SeqNode("tuple", [])),
            ("key with space", ValueLeaf(1)),
            ("key/with/slash", _tensor(np.array([1.0, 2.0], dtype="<f4"))),
            ("key.with.dots", ValueLeaf("dots")),
            (7, DictNode([(3, ValueLeaf("int keys"))])),
        ]
    )
    items: list[tuple[str | int, Node]] = [
        ("model", model),
        ("optimizer", optimizer),
        ("lr_scheduler", scheduler),
        ("global_step", ValueLeaf(10)),
        ("misc", misc),
    ]
    if rel.format >= 0.3:  # ObjectH5Type and int beyond int64 need the tagged formats
        misc.items.append(("object", OpaqueLeaf(pickle.dumps({"opaque": [1, 2]}, protocol=4))))
        misc.items.append(("huge", ValueLeaf(2**70)))
        misc.items.append(
            (
                "array",
                TensorLeaf(
                    "int32", (2, 2), MemoryData(np.arange(4, dtype="<i4").reshape(2, 2)), numpy=True
                ),
            )
        )
    if rel.legacy:  # format 0.5 cannot name namedtuple classes
        misc.items.append(
            ("step", NamedTupleNode("Step", Step._fields, [ValueLeaf(3), ValueLeaf(0.5)]))
        )
    else:  # sets are containers only for the 2.10 writer
        misc.items.append(("set", SeqNode("set", [ValueLeaf(1), ValueLeaf(2), ValueLeaf(3)])))
    root = DictNode(items)
    if release == "1.7":  # 1.7 pickled this 1.x class into the spec (MODELZOO_HISTORY §1.2)
        scheduler.origin = "TensorScalarDict"
    if release == "1.9":
        # A 1.x appliance save skipped one name of a tied pair (MODELZOO_HISTORY §1.1).
        set_path(root, ("model", "lm_head.weight"), MissingLeaf("model.lm_head.weight"))
    assert get_path(root, ("global_step",)) is not None
    return root


def write_fixture(release: str, out_dir: Path, force: bool = False) -> Path:
    path = out_dir / f"release-{release}.mdl"
    if path.exists():
        if not force:
            return path
        path.unlink()
    write_checkpoint(build_tree(release), path, release, allow_missing=True)
    if release == "1.9":
        import h5py

        with h5py.File(path, "a") as f:  # a graph-tensor argument: not named by the spec
            f["__model.x.arg_0"] = np.arange(3, dtype="<f4")
    return path


def write_format_test(out_dir: Path, force: bool = False) -> Path:
    """A 2.0 checkpoint of the format's test leaves, named as a training run names it (the
    README's library examples load it)."""
    path = out_dir / "format-test" / "checkpoint_100.mdl"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        if not force:
            return path
        path.unlink()
    write_checkpoint(build_tree("2.0"), path, "2.0")
    return path


def write_example(out_dir: Path) -> Path:
    """The README's example, an old training run: the GPT-2 run of ``models/gpt2-1.9``
    (checkpoint and ``params.yaml``; ``make_model_fixtures.py`` writes them) with the dataloader
    side files its two workers left at steps 50 and 100 (8 samples a step)."""
    example = out_dir / "example"
    example.mkdir(parents=True, exist_ok=True)
    for name in ("checkpoint_100.mdl", "params.yaml"):
        shutil.copyfile(out_dir / "models" / "gpt2-1.9" / name, example / name)
    write_side_file_set(example / "dataloader", 100, {0: 400, 1: 400}, earlier=50)
    return example


SIDE_FILE_VARIANTS = {
    # name: (data step in the global file, {worker id: samples}, extra files)
    "good": (10, {0: 640, 1: 640, 2: 600}, {}),
    "missing_worker": (10, {0: 640, 2: 600}, {}),
    "duplicate_worker": (
        10,
        {0: 640, 1: 640, 2: 600},
        {"data_iter_state_file_worker_01_step_10.txt": "640"},
    ),
    "stray_notes": (10, {0: 640, 1: 640, 2: 600}, {"notes.txt": "resumed by hand"}),
    "wrong_step": (12, {0: 700, 1: 700, 2: 680}, {}),
}


def write_side_files(out_dir: Path) -> Path:
    """1.9 dataloader side files for release-1.9.mdl (global_step 10) and broken variants."""
    base = out_dir / "release-1.9-data-iter"
    for name, (step, workers, extra) in SIDE_FILE_VARIANTS.items():
        write_side_file_set(base / name, step, workers, earlier=5, extra=extra)
    return base


def write_side_file_set(
    d: Path,
    step: int,
    workers: dict[int, int],
    *,
    earlier: int,
    extra: dict[str, str] | None = None,
) -> None:
    """The side files a 1.9 run left in ``d`` (MODELZOO_HISTORY.md §2.1): the global file naming
    the data step and each worker's samples at it; the worker files of the checkpoint at step
    ``earlier`` accumulate beside them (half the samples) and must be ignored."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "data_iter_checkpoint_state_file_global").write_text(f"{step}\n")
    for wid, samples in workers.items():
        (d / f"data_iter_state_file_worker_{wid}_step_{step}.txt").write_text(f"{samples}\n")
        (d / f"data_iter_state_file_worker_{wid}_step_{earlier}.txt").write_text(
            f"{samples // 2}\n"
        )
    for fname, text in (extra or {}).items():
        (d / fname).write_text(text + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "fixtures")
    parser.add_argument("--force", action="store_true", help="rewrite existing fixtures")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for release in FIXTURE_RELEASES:
        print(write_fixture(release, args.out, args.force))
    print(write_format_test(args.out, args.force))
    print(write_side_files(args.out))
    print(write_example(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
