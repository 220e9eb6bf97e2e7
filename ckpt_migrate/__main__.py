"""``python -m ckpt_migrate``: the ``ckpt-migrate`` command."""

from ckpt_migrate.cli import run

run()
