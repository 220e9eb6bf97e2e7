"""Files of the real cerebras.pytorch 2.6.0 … 2.9.0, read by ckpt-migrate and written for them.

``fixtures/real-cstorch-2.6-2.9/by-release/CASE-X.mdl.xz`` is the state of
``real-cstorch-2.10/CASE.mdl`` saved by release X's own ``cstorch.save``; X's ``cstorch.load``
gave ``real-cstorch-2.10/CASE.expected.json`` for each (the README there). Those tests run
everywhere. With ``CKPT_MIGRATE_CSTORCH_PYTHON`` and ``CKPT_MIGRATE_CSTORCH_2X_PATHS`` (see
tests/real_cstorch.py) each listed release's real loader also reads every such file, and every
file ckpt-migrate writes at that release (``write_checkpoint``, ``save``, ``upgrade --to X``
up and down, ``import-hf --to X``) with exactly the contents our reader gives.
"""

from __future__ import annotations

import lzma
import warnings
from pathlib import Path

import h5py
import pytest
import torch
from conftest import FIXTURES, MODELS, REAL, one_line_error, run_cli
from digest import diff_digests, digest, load_expected, untied
from real_cstorch import real_digest, requires_targets_2x, target_version, targets_2x

import ckpt_migrate as cm
from ckpt_migrate.errors import UnsupportedContentError
from ckpt_migrate.format import releases
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.write import write_checkpoint

REAL_2X = FIXTURES / "real-cstorch-2.6-2.9"
PACKED = sorted((REAL_2X / "by-release").glob("*.mdl.xz"))
VERSIONS = ("2.6.0", "2.7.0", "2.7.1", "2.8.0", "2.9.0")
CASES = ("basic", "dtypes", "nested", "numpy_scalars", "scalars_misc", "tied")


def _case(packed: Path) -> tuple[str, str]:
    case, _, version = packed.name.removesuffix(".mdl.xz").rpartition("-")
    return case, version


def _unpack(packed: Path, where: Path) -> Path:
    dst = where / packed.name.removesuffix(".xz")
    dst.write_bytes(lzma.decompress(packed.read_bytes()))
    return dst


def _ours(path: Path) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return digest(cm.load(path, allow_missing=True, objects_mode="data"))


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory) -> dict[Path, Path]:
    where = tmp_path_factory.mktemp("real2x")
    return {packed: _unpack(packed, where) for packed in PACKED}


def test_every_case_of_every_release_is_shipped():
    assert {_case(p) for p in PACKED} == {(c, v) for c in CASES for v in VERSIONS}


@pytest.mark.parametrize("packed", PACKED, ids=lambda p: p.name.removesuffix(".mdl.xz"))
def test_reads_what_each_release_wrote_exactly(packed, unpacked):
    case, version = _case(packed)
    path = unpacked[packed]
    with h5py.File(path, "r") as f:
        assert f.attrs["__cstorch_version__"] == version
    with read_checkpoint(path) as ckpt:
        assert ckpt.release.name == version.rsplit(".", 1)[0]
    expected = load_expected(case)
    ours = _ours(path)
    assert ours == expected, "\n".join(diff_digests(expected, ours))


def test_upgrade_and_downgrade_keep_the_contents(unpacked, tmp_path):
    sources = list(unpacked.values())
    done = run_cli("upgrade", *sources, "--output-dir", tmp_path / "up", "-q")
    assert done.returncode == 0, done.stderr
    older = [s for s in sources if not s.name.startswith("scalars_misc")]  # (an empty key: 0.5)
    for to in ("2.0", "2.3"):  # (uint16-64 tensors go no lower than 2.3: test_downgrade.py)
        these = [s for s in older if s.name.startswith("dtypes") == (to == "2.3")]
        done = run_cli("upgrade", *these, "--to", to, "--output-dir", tmp_path / "down", "-q")
        assert done.returncode == 0, done.stderr
    for src in sources:
        expected = load_expected(_case(src.with_suffix(".mdl.xz"))[0])
        assert _ours(tmp_path / "up" / src.name) == expected, src.name
        if src in older:
            assert untied(_ours(tmp_path / "down" / src.name)) == untied(expected), src.name


def test_check_deep_passes_each_release_file(unpacked):
    done = run_cli("check", "--deep", *unpacked.values())
    assert done.returncode == 10, done.stdout + done.stderr
    assert done.stdout.count("needs upgrading to 2.10") == len(unpacked), done.stdout


@pytest.mark.parametrize("name", ["defaultdict", "optimizer_state_defaultdict"])
def test_a_defaultdict_the_real_2_9_wrote_is_refused_as_unsupported_not_damaged(name, tmp_path):
    # 2.9.0 names a defaultdict's leaves after its context (``d.<class 'list'>.0``), and its
    # loader reads them back as a defaultdict; ckpt-migrate does not import the factory.
    path = _unpack(REAL_2X / "unsupported" / f"{name}-2.9.0.mdl.xz", tmp_path)
    with pytest.raises(UnsupportedContentError, match=r"'collections\.defaultdict' at 'd'"):
        cm.load(path)
    line = one_line_error(run_cli("check", "--deep", path), 2, "collections.defaultdict")
    assert "re-save the state dict with a dict" in line and "__metadata__" not in line


# --------------------------------------------------- the real 2.6 … 2.9 loaders (opt-in)


@pytest.fixture(scope="module", params=targets_2x() or [None])
def target(request) -> tuple[str, str]:
    if request.param is None:
        pytest.skip("CKPT_MIGRATE_CSTORCH_2X_PATHS is not set")
    return request.param, target_version(request.param)


@requires_targets_2x()
def test_real_loader_reads_every_release_file(target, unpacked):
    directory, _ = target
    results = real_digest(list(unpacked.values()), target=directory)
    for packed, path in unpacked.items():
        result = results[path]
        assert result["ok"], f"{path.name}: {result['error']}"
        assert result["digest"] == load_expected(_case(packed)[0]), path.name


def _cli(*args: str | Path) -> None:
    done = run_cli(*args, "-q")
    assert done.returncode == 0, done.stderr


def _written_at(release: str, out: Path) -> list[Path]:
    """Every way ckpt-migrate writes a file of ``release``."""
    files = []
    for case in CASES:
        with read_checkpoint(REAL / f"{case}.mdl") as ckpt, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_checkpoint(ckpt.root, out / f"w-{case}.mdl", release, allow_missing=True)
        files.append(out / f"w-{case}.mdl")
        _cli("upgrade", REAL / f"{case}.mdl", "--to", release, "-o", out / f"down-{case}")
        files.append(out / f"down-{case}" / f"{case}.mdl")
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3).bfloat16()}}
    state["model"]["tie"] = state["model"]["w"]
    cm.save(state, out / "save.mdl", release)
    files.append(out / "save.mdl")
    for src in [FIXTURES / "release-2.0.mdl", FIXTURES / "release-2.3.mdl"] + [
        MODELS / f"{family}-2.0" / "checkpoint_100.mdl" for family in ("gpt2", "llama", "t5")
    ]:
        dst = out / f"up-{src.parent.name}-{src.stem}"
        _cli("upgrade", src, "--to", release, "-o", dst)
        files.append(dst / src.name)
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(out / "hf-gpt2")
    _cli("import-hf", out / "hf-gpt2", out / "hf.mdl", "--to", release, "--model", "gpt2")
    return [*files, out / "hf.mdl"]


@requires_targets_2x()
def test_real_loader_of_a_release_reads_what_we_write_for_it(target, tmp_path):
    directory, version = target
    release = releases.get(".".join(version.split(".")[:2])).name
    files = _written_at(release, tmp_path)
    results = real_digest(files, target=directory)
    failures = []
    for path in files:
        result = results[path]
        if not result["ok"]:
            failures.append(f"{path.name}: {version} cannot load it: {result['error']}")
        elif result["digest"] != _ours(path):
            failures.append(f"{path}: " + "; ".join(diff_digests(_ours(path), result["digest"])))
    assert not failures, "\n".join(failures)
