"""Read a Hugging Face ``pytorch_model.bin`` (or its ``pytorch_model-0000x-of-0000y.bin`` shards)
one tensor at a time, for the Hugging Face import.

``torch.load(weights_only=True, mmap=True)``: no code runs from the file and the storages stay
memory-mapped, so a tensor's bytes are paged in only when it is read. Tensors come out as numpy
arrays in their storage dtype (bfloat16 as its raw 16-bit pattern in int16, as everywhere in
ckpt-migrate). torch is imported on first use, so importing this module costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_migrate import jsonfile
from ckpt_migrate.errors import CorruptCheckpointError, UnsafeContentError, UnsupportedContentError
from ckpt_migrate.torch import weights_load

SINGLE = "pytorch_model.bin"
INDEX = "pytorch_model.bin.index.json"


@dataclass(frozen=True)
class BinTensor:
    """One tensor of a ``.bin`` file: dtype (torch name), shape, and its data on demand."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    tensor: Any  # the memory-mapped torch.Tensor

    def read(self) -> np.ndarray:
        import torch

        t = self.tensor.detach().contiguous()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        return t.numpy().copy()


def bin_files(directory: Path) -> list[Path]:
    """The ``.bin`` files of ``directory``: the index's shards, or ``pytorch_model.bin``."""
    index = directory / INDEX
    if index.exists():
        return [directory / f for f in jsonfile.shard_names(index)]
    single = directory / SINGLE
    return [single] if single.exists() else []


def read_bin_directory(directory: Path) -> dict[str, BinTensor]:
    """Every tensor of the directory's ``.bin`` files, memory-mapped (torch's zip format) or
    read whole (its format before 1.6)."""
    out: dict[str, BinTensor] = {}
    for path in bin_files(directory):
        try:
            state = weights_load.load(path)
        except weights_load.NewerPickle as exc:
            raise UnsupportedContentError(
                path, f"cannot be read by torch.load(weights_only=True): {exc}", exc.FIX
            ) from None
        except weights_load.Refused as exc:
            raise UnsafeContentError(
                path, f"refused by torch.load(weights_only=True): {exc}"
            ) from None
        except weights_load.Unreadable as exc:
            raise CorruptCheckpointError(path, f"cannot be read by torch.load ({exc})") from None
        if not isinstance(state, dict):
            raise CorruptCheckpointError(path, "does not hold a state dict")
        import torch  # (imported by the load: a file that cannot be torch's is refused first)

        for name, t in state.items():
            if not isinstance(t, torch.Tensor):
                continue
            dtype = str(t.dtype).removeprefix("torch.")
            out[str(name)] = BinTensor(str(name), dtype, tuple(t.shape), t)
    return out
