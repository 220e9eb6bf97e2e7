"""``heap.fix_mmap_threshold``: a large block freed no longer moves glibc's threshold."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_PROBE = textwrap.dedent(
    """
    import ctypes, sys

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    if sys.argv[1] == "fixed":
        from ckpt_migrate import heap
        heap.fix_mmap_threshold(128 << 10)
    big = bytearray(8 << 20)  # a mapping of its own; freed, glibc's threshold rises to it
    del big
    before = libc.mallinfo2().hblks
    block = bytearray(1 << 20)
    print(libc.mallinfo2().hblks - before)
    """
)


def _mapped_blocks(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True, env=env
    )
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_megabyte_block_stays_a_mapping_after_a_larger_one_is_freed():
    try:
        default = _mapped_blocks("default")
    except subprocess.CalledProcessError as exc:  # (no mallinfo2: glibc before 2.33, musl)
        pytest.skip(f"this C library cannot be asked: {exc.stderr.strip().splitlines()[-1]}")
    assert default == 0  # glibc's own rule: 1 MiB now comes from the heap
    assert _mapped_blocks("fixed") == 1
