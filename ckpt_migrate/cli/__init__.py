"""Every console script: ``ckpt-migrate``, ``tensorflow-to-h5``, ``h5-to-tensorflow``.

``main`` is imported lazily, so that ``ckpt_migrate.cli:main`` stays the ``ckpt-migrate`` entry
point while ``cli.tf`` (the TensorFlow scripts) does not load typer.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """The ``ckpt-migrate`` command (see ``cli.main``)."""
    from ckpt_migrate.cli.main import main as run

    return run(argv)
