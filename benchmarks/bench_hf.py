#!/usr/bin/env python
"""Benchmark the Hugging Face export and import on a multi-GB GPT-2-shaped checkpoint.

    python benchmarks/bench_hf.py [--hidden 1280] [--layers 20] [--vocab 50257] [--dir DIR]
                                  [--fill random|constant]

Generates a CS 2.10 checkpoint (random tensors by default, one at a time, so LZ4 saves nothing
and every read costs what a real checkpoint's does), exports it to an HF
directory and imports that back to a CS checkpoint, each in a fresh process, and reports the
wall time and the peak RSS of each process against the largest tensor (target: peak <= largest
tensor + 256 MiB, the interpreter and its imports included). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckpt_migrate.format.tree import DataSource, DictNode, TensorLeaf  # noqa: E402
from ckpt_migrate.format.write import write_checkpoint  # noqa: E402

MiB = 1 << 20


@dataclass(eq=False)
class Filled(DataSource):
    """A tensor made when the writer asks for it: seeded normal values, or a constant (cheap to
    generate, but LZ4 then shrinks the file to almost nothing)."""

    shape: tuple[int, ...]
    value: float
    random: bool = True

    def read(self) -> np.ndarray:
        if self.random:
            rng = np.random.default_rng(int(self.value * 1e3))
            return rng.standard_normal(self.shape, dtype=np.float32)
        return np.full(self.shape, self.value, np.float32)

    def describe(self) -> str:
        return "generated"


def generate(
    path: Path, hidden: int, layers: int, vocab: int, positions: int = 1024, random: bool = True
) -> tuple[int, int]:
    """Write the checkpoint; return the largest tensor's bytes and all tensors' bytes."""
    h, f = hidden, 4 * hidden
    count = [0]

    def t(*shape: int) -> TensorLeaf:
        count[0] += 1
        return TensorLeaf("float32", shape, Filled(shape, count[0] * 1e-3, random))

    emb = t(vocab, h)
    items = [
        ("embedding_layer.word_embeddings.weight", emb),
        ("embedding_layer.position_embeddings.embed.weight", t(positions, h)),
    ]
    for i in range(layers):
        pre = f"transformer_decoder.layers.{i}."
        for x in ("q", "k", "v", "output"):
            items += [(f"{pre}self_attn.proj_{x}_dense_layer.weight", t(h, h))]
            items += [(f"{pre}self_attn.proj_{x}_dense_layer.bias", t(h))]
        for n in ("norm1", "norm3"):
            items += [(f"{pre}{n}.weight", t(h)), (f"{pre}{n}.bias", t(h))]
        items += [(f"{pre}ffn.ffn.0.linear_layer.weight", t(f, h))]
        items += [(f"{pre}ffn.ffn.0.linear_layer.bias", t(f))]
        items += [(f"{pre}ffn.ffn.1.linear_layer.weight", t(h, f))]
        items += [(f"{pre}ffn.ffn.1.linear_layer.bias", t(h))]
    items += [("transformer_decoder.norm.weight", t(h)), ("transformer_decoder.norm.bias", t(h))]
    items += [("lm_head.weight", emb)]
    write_checkpoint(DictNode([("model", DictNode(items))]), path, "2.10")
    return max(leaf.nbytes for _, leaf in items), sum({id(x): x.nbytes for _, x in items}.values())


def params_yaml(path: Path, hidden: int, layers: int, vocab: int, positions: int = 1024) -> None:
    path.write_text(
        "model:\n"
        f"  vocab_size: {vocab}\n  hidden_size: {hidden}\n  num_heads: {hidden // 64}\n"
        f"  num_hidden_layers: {layers}\n  max_position_embeddings: {positions}\n"
        f"  filter_size: {4 * hidden}\n  share_embedding_weights: true\n"
    )


def child(argv: list[str]) -> None:
    """Run one step in this (fresh) process, then print its peak RSS in KiB (``VmHWM``: this
    process image's own high-water mark; ``ru_maxrss`` would include the forked parent's)."""
    _step(argv)
    status = Path("/proc/self/status").read_text()
    print(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


def _step(argv: list[str]) -> None:
    what = argv[0]
    if what == "export":
        from ckpt_migrate.hf.export import export

        export(argv[1], argv[2], config=argv[3], shard_size="2GB")
    elif what == "import":
        from ckpt_migrate.hf.import_ import import_hf

        import_hf(argv[1], argv[2], config_out=argv[3])
    elif argv[1] == "export":  # the interpreter plus the imports alone: the baselines
        import ckpt_migrate.hf.export
    else:
        import ckpt_migrate.hf.import_  # noqa: F401


def measure(*args: str | Path) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of ``bench_hf.py --child ARGS``."""
    from bench_upgrade import ENV  # (in this process only: the children measure their imports)

    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *map(str, args)],
        capture_output=True,
        text=True,
        env=ENV,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{args[0]} failed: {proc.stderr}")
    return time.monotonic() - start, int(proc.stdout.split()[-1]) / 1024


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    from bench_upgrade import warm_bytecode

    warm_bytecode()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1280)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: tmp)")
    parser.add_argument("--fill", choices=("random", "constant"), default="random")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_hf.", dir=args.dir))
    try:
        ckpt, params = work / "model.mdl", work / "params.yaml"
        start = time.monotonic()
        largest, tensor_bytes = generate(
            ckpt, args.hidden, args.layers, args.vocab, random=args.fill == "random"
        )
        made = time.monotonic() - start
        params_yaml(params, args.hidden, args.layers, args.vocab)
        _, base_exp = measure("baseline", "export")
        _, base_imp = measure("baseline", "import")
        t_exp, rss_exp = measure("export", ckpt, work / "hf", params)
        t_imp, rss_imp = measure("import", work / "hf", work / "back.mdl", work / "back.yaml")
        target = largest / MiB + 256
        report = {
            "tensor_bytes": tensor_bytes,
            "checkpoint_file_bytes": ckpt.stat().st_size,  # LZ4 shrinks constant tensors
            "fill": args.fill,
            "largest_tensor_mib": round(largest / MiB, 1),
            "generate_s": round(made, 1),
            "export": {
                "seconds": round(t_exp, 1),
                "peak_rss_mib": round(rss_exp, 1),
                "baseline_rss_mib": round(base_exp, 1),  # interpreter + imports
            },
            "import": {
                "seconds": round(t_imp, 1),
                "peak_rss_mib": round(rss_imp, 1),
                "baseline_rss_mib": round(base_imp, 1),
            },
            "target_mib": round(target, 1),
            "within_target": rss_exp <= target and rss_imp <= target,
        }
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
