"""ckpt-migrate: read, write and upgrade Cerebras-style PyTorch HDF5 checkpoints.

The API mirrors ``torch.save``/``torch.load``. torch itself is imported only by the functions
that need it, so the migration path and the CLI's ``--help`` never pay for it.
"""

from __future__ import annotations

from typing import Any

from ckpt_migrate._version import __version__

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
        from ckpt_migrate.model_dir.manager import CheckpointManager

        return CheckpointManager
    if name == "tf_to_h5":
        from ckpt_migrate.tf.to_h5 import tf_to_h5

        return tf_to_h5
    if name == "h5_to_tf":
        from ckpt_migrate.tf.from_h5 import h5_to_tf

        return h5_to_tf
    if name in ("load", "save", "to_torch", "from_torch"):
        from ckpt_migrate.torch import api

        return getattr(api, name)
    if name == "read_checkpoint":
        from ckpt_migrate.format.read import read_checkpoint

        return read_checkpoint
    if name == "write_checkpoint":
        from ckpt_migrate.format.write import write_checkpoint

        return write_checkpoint
    raise AttributeError(f"module 'ckpt_migrate' has no attribute {name!r}")
