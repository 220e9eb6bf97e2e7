"""A root edit's texts written by a process of their own (``engine.rootattrs``, issue 33): the
same bytes as written here, on roots this tool wrote and on the real 2.6 and 2.9 libraries';
an upgrade that takes that way verified as any other; its failures told as they would be here."""

from __future__ import annotations

import errno
import lzma
import sys
from pathlib import Path

import h5py
import pytest
from test_rootedit import _source, _upgrade

from ckpt_migrate.engine import rootattrs, rootedit, rootverify
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade

ROOT = Path(__file__).resolve().parents[1]


def _file(tmp_path: Path, source: str) -> Path:
    if source == "ours":
        return _source(tmp_path / "ours.mdl", experts=3)
    path = tmp_path / f"{source}.mdl"
    packed = ROOT / "fixtures" / "real-cstorch-2.6-2.9" / f"{source}.mdl.xz"
    path.write_bytes(lzma.decompress(packed.read_bytes()))
    return path


@pytest.mark.parametrize("source", ["ours", "trainer-2.9.0", "gpt2-2.6.0"])
def test_texts_written_apart_leave_the_bytes_written_here(tmp_path, source):
    """Every kind of edit (a text rewritten in place, a new one, one removed, the spec) by the
    other process and by this one: the same file, byte for byte."""
    src = _file(tmp_path, source)
    with h5py.File(src, "r") as f:
        spec = f.attrs["__spec__"]
        removed = [n for n in f.attrs if n.endswith(".__metadata__")][:1]
    texts = {
        "__spec__": rootattrs.utf8(spec.replace("[", "[ ", 1)),
        "__cstorch_version__": rootattrs.utf8("2.10.0"),
        "a.new.__metadata__": rootattrs.utf8('{"ünï": "cödé"}'),
    }
    outs = []
    for how in (rootattrs.write_here, rootattrs.write_apart):
        out = tmp_path / f"{how.__name__}.mdl"
        out.write_bytes(src.read_bytes())
        how(out, removed, texts)
        outs.append(out.read_bytes())
        with h5py.File(out, "r") as f:
            assert f.attrs["__spec__"].encode() == texts["__spec__"]
            assert not any(name in f.attrs for name in removed)
    assert outs[0] == outs[1]


def test_an_upgrade_whose_texts_are_large_writes_them_apart(tmp_path, monkeypatch):
    """Past ``APART`` bytes of text this process never opens the output to write (its
    ``write_here`` would fail here, not in the other process), and the edit is verified as
    read back: what the other process wrote is what was planned."""
    src = _source(tmp_path / "src.mdl", experts=4)
    monkeypatch.setattr(rootattrs, "APART", 0)

    def refused(*args: object) -> None:
        raise AssertionError("written in the upgrading process")

    monkeypatch.setattr(rootattrs, "write_here", refused)
    checked = []
    real = rootverify.verify_edit
    monkeypatch.setattr(
        rootverify, "verify_edit", lambda *a: checked.append(real(*a)) or checked[-1]
    )
    result, out = _upgrade(src, tmp_path / "out")
    assert result.strategy == rootedit.STRATEGY and checked == [True]
    with h5py.File(out, "r") as f:
        assert f.attrs["__cstorch_version__"] == "2.10.0"


def test_a_text_that_does_not_hold_what_was_written_fails_the_check(tmp_path, monkeypatch):
    """The check compares each written text as it reads it (not kept): one character changed
    in the other process's spec is found."""
    src = _source(tmp_path / "src.mdl", experts=4)
    monkeypatch.setattr(rootattrs, "APART", 0)
    real = rootattrs.write_apart

    def changed(path: Path, removed: list[str], texts: dict[str, bytes]) -> None:
        spec = texts["__spec__"]
        real(path, removed, {**texts, "__spec__": spec.replace(b"[", b"(", 1)})

    monkeypatch.setattr(rootattrs, "write_apart", changed)
    result = upgrade(src, UpgradeOptions(target="2.10", output_dir=tmp_path / "out"))
    assert result.status == "failed" and "'__spec__' does not hold what was written" in (
        result.error or ""
    )
    assert not (tmp_path / "out" / src.name).exists()


@pytest.mark.parametrize(
    ("text", "raw", "same"),
    [
        ("plain", b"plain", True),
        ("ünïcödé" * 3, ("ünïcödé" * 3).encode(), True),
        ("a\udcffb", b"a\xffb", True),  # an undecodable byte, as the reader escapes it
        ("abc", b"abd", False),
        ("abc", b"abcd", False),
        ("abcd", b"abc", False),
    ],
)
def test_a_text_is_compared_with_its_bytes_a_slice_at_a_time(text, raw, same):
    assert rootverify._encodes_as(text, raw, step=2) is same


def test_a_failure_there_is_told_as_it_would_be_here(tmp_path, monkeypatch):
    """A missing file is its OSError with its errno and path; a process that stops without
    an answer is an OSError with its last words; an upgrade that meets it fails with one line
    naming the output, and leaves none."""
    missing = tmp_path / "missing.mdl"
    with pytest.raises(OSError) as caught:
        rootattrs.write_apart(missing, [], {"x": b"y"})
    assert caught.value.errno == errno.ENOENT and caught.value.filename == str(missing)

    monkeypatch.setattr(
        rootattrs,
        "_command",
        lambda: [sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit('stopped')"],
    )
    with pytest.raises(OSError, match="the root attributes' writer stopped: stopped"):
        rootattrs.write_apart(missing, [], {"x": b"y" * (1 << 20)})

    src = _source(tmp_path / "src.mdl", experts=2)
    monkeypatch.setattr(rootattrs, "APART", 0)
    result = upgrade(src, UpgradeOptions(target="2.10", output_dir=tmp_path / "out"))
    assert result.status == "failed" and result.exit_code == 5
    told = "write failed (the root attributes' writer stopped: stopped)"
    assert result.error == f"{tmp_path / 'out' / src.name}: {told}"
    assert list((tmp_path / "out").iterdir()) == []
