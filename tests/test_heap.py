"""``heap``: a large block freed no longer moves glibc's threshold (``fix_mmap_threshold``);
the heap's free pages are given back (``give_back_freed``)."""

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


_TRIM_PROBE = textwrap.dedent(
    """
    import os, sys

    def resident():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    blocks = [bytearray(1000) for _ in range(100_000)]  # 100 MB of small blocks, from the heap
    kept = blocks[::64]  # one in 64 stays: the heap cannot shrink from its top
    del blocks
    before = resident()
    if sys.argv[1] == "given back":
        from ckpt_migrate import heap
        heap.give_back_freed()
    print(before - resident())
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_small_blocks_stay_resident_until_given_back():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}

    def returned(mode: str) -> int:
        run = [sys.executable, "-c", _TRIM_PROBE, mode]
        return int(subprocess.run(run, capture_output=True, text=True, check=True, env=env).stdout)

    assert returned("kept") < 8 << 20  # glibc's own rule: the holes stay resident
    assert returned("given back") > 64 << 20
