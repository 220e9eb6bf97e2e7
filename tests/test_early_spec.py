"""A legacy spec decoded while the preflight children walk the file (``legacy.early_spec``,
issue 33): an upgrade takes it where HDF5 finds the same root in the same file, and decodes
the spec itself otherwise; the output is the same either way."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import pytest
from conftest import sha256_file
from test_upgrade import fixture

from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.format.legacy import early_spec
from ckpt_migrate.format.legacy import read as legacy_read
from ckpt_migrate.format.legacy.early_spec import EarlySpec


def _sources(tmp_path: Path, real_layout_19: Path) -> list[Path]:
    """Our 1.9 fixture and a file laid out as the 1.9 library wrote it."""
    return [fixture("1.9", tmp_path), real_layout_19]


def _upgraded(src: Path, out: Path, **kw) -> Path:
    opts = UpgradeOptions(output_dir=out, inputs={"drop_dataloader_state": True}, **kw)
    result = upgrade(src, opts)
    assert result.status in ("upgraded", "planned"), result.error
    return out / src.name


def _decoded_where(monkeypatch) -> list[str]:
    """Where each spec is decoded: "early" (the thread) or "reader" (after the walk)."""
    where: list[str] = []
    real = legacy_read.decode_spec_info
    monkeypatch.setattr(
        early_spec, "decode_spec_info", lambda *a: where.append("early") or real(*a)
    )
    monkeypatch.setattr(
        legacy_read, "decode_spec_info", lambda *a, **k: where.append("reader") or real(*a, **k)
    )
    return where


def test_an_upgrade_takes_the_spec_decoded_while_the_walk_runs(
    tmp_path, real_layout_19, monkeypatch
):
    for src in _sources(tmp_path, real_layout_19):
        before = _upgraded(src, tmp_path / f"before-{src.parent.name}")
        where = _decoded_where(monkeypatch)
        after = _upgraded(src, tmp_path / f"after-{src.parent.name}")
        assert where == ["early"], src
        with h5py.File(before, "r") as a, h5py.File(after, "r") as b:  # (provenance aside)
            assert sorted(a.attrs) == sorted(b.attrs) and sorted(a) == sorted(b)
            assert a.attrs["__spec__"] == b.attrs["__spec__"]
        where.clear()
        _upgraded(src, tmp_path / f"dry-{src.parent.name}", dry_run=True)
        assert where == ["reader"], src  # (a dry run waits for the walk: no CPU taken from it)
        monkeypatch.undo()


def test_the_reader_decodes_the_spec_itself_where_the_early_one_does_not_answer(
    tmp_path, real_layout_19, monkeypatch
):
    src = real_layout_19
    digest = sha256_file(src)
    where = _decoded_where(monkeypatch)
    monkeypatch.setattr(early_spec, "EARLY_BYTES", 100)  # a spec too large to decode early
    _upgraded(src, tmp_path / "large")
    assert where == ["reader"]
    monkeypatch.undo()

    where = _decoded_where(monkeypatch)
    monkeypatch.setattr(early_spec, "spec_pickle", _fails)  # a problem met early
    _upgraded(src, tmp_path / "failed")
    assert where == ["reader"]
    assert sha256_file(src) == digest


def _fails(text: str, path: Path) -> bytes:
    raise ValueError("met early")


@pytest.mark.parametrize("change", ["touched", "rewritten"])
def test_a_spec_decoded_early_is_not_taken_for_a_file_changed_since(
    tmp_path, real_layout_19, change
):
    src = tmp_path / "c.mdl"
    src.write_bytes(real_layout_19.read_bytes())
    early = EarlySpec(src)
    early._thread.join()
    if change == "touched":
        os.utime(src, ns=(1, 1))
    else:
        src.write_bytes(fixture("1.9", tmp_path).read_bytes())
    with h5py.File(src, "r") as f:
        assert early.take(f) is None
    unchanged = EarlySpec(real_layout_19)
    with h5py.File(real_layout_19, "r") as f:
        assert unchanged.take(f) is not None
