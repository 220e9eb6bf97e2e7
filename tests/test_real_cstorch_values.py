"""Values the real cerebras.pytorch 2.10 saves that ckpt-migrate once misreported.

Each file under ``fixtures/real-cstorch-2.10/`` named here was written by the real
``cstorch.save`` (the READMEs there); its ``expected.json`` is what the real ``cstorch.load``
gave back. These tests run everywhere; the real loader's own check of what ckpt-migrate
writes is opt-in (``CKPT_MIGRATE_CSTORCH_PYTHON``, tests/real_cstorch.py).
"""

from __future__ import annotations

import json

import pytest
from conftest import REAL, one_line_error, run_cli

import ckpt_migrate as cm
from ckpt_migrate.errors import UnsupportedContentError

REFUSED = REAL / "refused"


def test_a_deque_the_real_writer_saved_is_refused_for_what_it_is(tmp_path):
    """The real 2.10 writes a deque as torch's ``collections.deque`` node and reads it back as a
    deque; the refusal said ckpt-migrate "would need importing code named by the file", which
    is true of a defaultdict, not of a deque."""
    src = REFUSED / "deque.mdl"
    expected = json.loads((REFUSED / "deque.expected.json").read_text())
    assert expected["root"]["items"][1][2]["type"] == "collections.deque"  # the real loader's
    for verb in (["inspect"], ["check", "--deep"], ["upgrade", "--to", "2.0", "-o", tmp_path]):
        line = one_line_error(run_cli(*verb, src), 2, "'collections.deque' at 'recent_losses'")
        assert "a deque, which ckpt-migrate does not read" in line, line
        assert "list(the_deque)" in line and "importing" not in line and "damaged" not in line
    with pytest.raises(UnsupportedContentError, match="a deque"):
        cm.load(src)
