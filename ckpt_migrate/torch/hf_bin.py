"""Read a Hugging Face ``pytorch_model.bin`` (or its ``pytorch_model-0000x-of-0000y.bin`` shards)
one tensor at a time, for the Hugging Face import.

``torch.load(weights_only=True, mmap=True)``: no code runs from the file and the storages stay
memory-mapped, so a tensor's bytes are paged in only when it is read. Tensors come out as numpy
arrays in their storage dtype (bfloat16 as its raw 16-bit pattern in int16, as everywhere in
ckpt-migrate). torch is imported on first use, so importing this module costs nothing.
"""

from __future__ import annotations

import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_migrate import jsonfile
from ckpt_migrate.errors import CorruptCheckpointError, UnsafeContentError

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
    """Every tensor of the directory's ``.bin`` files, memory-mapped (nothing read yet)."""
    import pickle

    import torch

    out: dict[str, BinTensor] = {}
    for path in bin_files(directory):
        try:
            # (the zip format torch has written since 1.6 is mapped, not read; an older file,
            # as the first Hub models were saved, can only be read whole)
            mmap = zipfile.is_zipfile(path)
            with warnings.catch_warnings():  # (torch's notes on pickle protocols: not ours)
                warnings.simplefilter("ignore")
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as exc:
            raise UnsafeContentError(
                path, f"refused by torch.load(weights_only=True): {_unpickler_reason(exc)}"
            ) from None
        except (OSError, RuntimeError, ValueError, EOFError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CorruptCheckpointError(path, f"cannot be read by torch.load ({reason})") from None
        if not isinstance(state, dict):
            raise CorruptCheckpointError(path, "does not hold a state dict")
        for name, t in state.items():
            if not isinstance(t, torch.Tensor):
                continue
            dtype = str(t.dtype).removeprefix("torch.")
            out[str(name)] = BinTensor(str(name), dtype, tuple(t.shape), t)
    return out


def _unpickler_reason(exc: Exception) -> str:
    """What torch's restricted unpickler met (``Unsupported operand 63``), without the advice
    around it: its first line offers ``weights_only=False``, which this tool never does."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    _, found, rest = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in (rest if found else text).splitlines() if line.strip()]
    return (lines[0].split(". ")[0] if lines else "unpickling")[:200]
