"""``python -m ckpt_migrate``: the ``ckpt-migrate`` command."""

import sys

from ckpt_migrate.cli import main

sys.exit(main())
