"""A release-1.9 training checkpoint laid out as the 1.9 library wrote it, for the tests and
``benchmarks/bench_s3.py``.

The state is a small GPT-style model as a 1.9 run saves it: bf16 weights (stored as int16 with
``is_bfloat16``), zero biases and LayerNorm weights of ones, fp32 Adam moments with a 0-d
``step`` tensor per parameter (torch 1.13's Adam), no Adam state yet for the embedding rows of
tokens never seen (zeros), a LinearLR scheduler and the global step. The root attributes (the
spec) come from ``ckpt_migrate.save``; every dataset is then written again the way 1.9's
``H5Saver`` did (FORMAT.md §3.3): ``require_dataset`` with hdf5plugin ``LZ4()`` and h5py's
default chunking for ``ndim > 0``, a contiguous dataset for a 0-d tensor, the data in one
write, the attributes after it. HDF5 then packs the small datasets (the ``step`` scalars,
chunks of zeros) into small-data blocks between the large ones' chunks, as in real files.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import h5py
import hdf5plugin

import ckpt_migrate as cm


def state(hidden: int = 128, layers: int = 3, vocab: int = 1024, seed: int = 0) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    model = {"model.embedding_layer.word_embeddings.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.transformer_decoder.layers.{i}."
        for name in ("q", "k", "v", "output"):
            model[f"{p}self_attn.proj_{name}_dense_layer.weight"] = (hidden, hidden)
            model[f"{p}self_attn.proj_{name}_dense_layer.bias"] = (hidden,)
        model[f"{p}norm1.weight"] = (hidden,)
        model[f"{p}norm1.bias"] = (hidden,)
        model[f"{p}ffn.ffn.0.linear_layer.weight"] = (4 * hidden, hidden)
        model[f"{p}ffn.ffn.0.linear_layer.bias"] = (4 * hidden,)
        model[f"{p}ffn.ffn.1.linear_layer.weight"] = (hidden, 4 * hidden)
    model["model.lm_head.weight"] = (vocab, hidden)
    weights = {}
    for key, shape in model.items():
        if key.endswith("bias"):
            t = torch.zeros(shape)
        elif "norm" in key:
            t = torch.ones(shape)
        else:
            t = torch.randn(shape, generator=gen) * 0.02
        weights[key] = t.bfloat16()
    adam = {}
    for index, t in enumerate(weights.values()):
        m = torch.randn(t.shape, generator=gen) * 1e-3
        v = torch.rand(t.shape, generator=gen) * 1e-6
        if t.shape[0] == vocab:  # tokens never seen: no gradient, no state
            m[vocab // 2 :] = 0
            v[vocab // 2 :] = 0
        adam[index] = {"step": torch.tensor(100.0), "exp_avg": m, "exp_avg_sq": v}
    group = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    group["params"] = list(range(len(weights)))
    return {
        "model": weights,
        "optimizer": {"state": adam, "param_groups": [group]},
        "lr_scheduler": {
            "start_factor": 1.0,
            "end_factor": 0.1,
            "total_iters": 1000,
            "base_lrs": [1e-4],
            "last_epoch": 100,
            "_last_lr": [1e-4],
        },
        "global_step": 100,
    }


def write(path: Path, release: str = "1.9", **shape: int) -> Path:
    """Write the checkpoint to ``path`` (a new file) with the 1.9 writer's layout."""
    with tempfile.TemporaryDirectory() as tmp:
        ours = Path(tmp) / "ours.mdl"
        cm.save(state(**shape), ours, release)
        relayout(ours, path)
    return path


def relayout(src: Path, dst: Path) -> None:
    """``src``'s root attributes and datasets, every dataset written as H5Saver wrote it."""
    with h5py.File(src, "r") as old, h5py.File(dst, "w-") as new:
        for key, value in old.attrs.items():
            new.attrs[key] = value
        for name in old:
            ds = old[name]
            if ds.shape is None:
                out = new.create_dataset(name, data=h5py.Empty(ds.dtype))
            elif ds.ndim == 0:
                out = new.create_dataset(name, data=ds[()])
            else:
                out = new.require_dataset(name, ds.shape, ds.dtype, **hdf5plugin.LZ4())
                out[...] = ds[...]
            for key, value in ds.attrs.items():
                out.attrs[key] = value
