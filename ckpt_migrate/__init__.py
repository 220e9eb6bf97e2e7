"""ckpt-migrate: read, write and upgrade Cerebras-style PyTorch HDF5 checkpoints.

The API mirrors ``torch.save``/``torch.load``. torch itself is imported only by the functions
that need it, so the migration path and the CLI's ``--help`` never pay for it.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = [
    "CheckpointManager",
    "__version__",
    "from_torch",
    "h5_to_tf",
    "load",
    "read_checkpoint",
    "save",
    "tf_to_h5",
    "to_torch",
    "write_checkpoint",
]


def __getattr__(name: str) -> Any:
    if name == "CheckpointManager":
        from .manager import CheckpointManager

        return CheckpointManager
    if name == "tf_to_h5":
        from .tf_to_h5 import tf_to_h5

        return tf_to_h5
    if name == "h5_to_tf":
        from .h5_to_tf import h5_to_tf

        return h5_to_tf
    if name in ("load", "save", "to_torch", "from_torch"):
        from . import api

        return getattr(api, name)
    if name == "read_checkpoint":
        from .reader import read_checkpoint

        return read_checkpoint
    if name == "write_checkpoint":
        from .writer import write_checkpoint

        return write_checkpoint
    raise AttributeError(f"module 'ckpt_migrate' has no attribute {name!r}")
