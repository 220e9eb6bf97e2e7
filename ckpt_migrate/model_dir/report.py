"""The fleet report of ``upgrade-dir``: what each checkpoint cost, in bytes and time.

Per checkpoint (``--json``, issue 34): ``bytes_read`` (of the source, or fetched from the
store), ``bytes_sent`` (written to the output, or uploaded to the store), ``bytes_copied`` (not
moved through this machine: shared with the source by the filesystem, or copied by the store
server-side) and ``seconds``; the human summary adds them up.

* object store (``remote.upgrade``): read = the GETs (metadata, fills, the result's check),
  sent = the uploaded part bytes, copied = the ``UploadPartCopy`` bytes (chain steps included);
* local upgrade: sent = ``bytes_written``, copied = ``bytes_shared`` (clone, server-side
  copy), read = the rest of the source (the copy worker and a rewrite read all of it);
* a checkpoint already at the target put into the output: a hard link is all copied (shared),
  a copy reads and sends the file; an output already there costs nothing.
"""

from __future__ import annotations

from ckpt_migrate.engine.upgrade import UpgradeResult

FIELDS = ("bytes_read", "bytes_sent", "bytes_copied")
COUNTED = ("upgraded", "current", "already-upgraded")  # statuses whose bytes are reported


def traffic(res: UpgradeResult, status: str) -> dict[str, int]:
    """The three byte counts of one checkpoint (none for a failed or planned one)."""
    if status not in COUNTED:
        return {}
    t = res.transfer
    if t is not None:
        read = t.get("fetched", 0) + t.get("verify_fetched", 0)
        return _counts(read, t.get("uploaded", 0), t.get("copied", 0))
    if status != "upgraded":
        size = _size(res)
        if res.placed == "linked":
            return _counts(0, 0, size)
        if res.placed == "copied":
            return _counts(size, size, 0)
        return _counts(0, 0, 0)
    size = _size(res)
    return _counts(max(0, size - res.bytes_shared), res.bytes_written, res.bytes_shared)


def _counts(read: int, sent: int, copied: int) -> dict[str, int]:
    return dict(zip(FIELDS, (read, sent, copied), strict=True))


def _size(res: UpgradeResult) -> int:
    """The source's size: in place, the backup's (the source's name holds the output now)."""
    try:
        return (res.backup or res.source).stat().st_size
    except OSError:
        return 0
