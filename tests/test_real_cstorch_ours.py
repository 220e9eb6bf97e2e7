"""Files ckpt-migrate writes, loaded by the real cerebras.pytorch 2.10 (optional).

Skipped unless CKPT_MIGRATE_CSTORCH_PYTHON names an interpreter with cerebras.pytorch. Every
file our writers or ``upgrade`` produce must load in the real library with exactly the contents
our own reader gives. One documented difference: the real legacy (0.3/0.4) reader loads the two
names of a hard-linked tie as separate objects (FORMAT.md §5.5), so ``tied_to`` marks are
compared only for 0.5 files.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import FIXTURES, MODELS, REAL
from digest import diff_digests, digest, untied
from real_cstorch import real_digest, requires_real_cstorch

import ckpt_migrate as cm
from ckpt_migrate.format import releases
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.write import write_checkpoint

pytestmark = requires_real_cstorch()

SOURCES = [REAL / f"{c}.mdl" for c in ("basic", "nested", "dtypes", "scalars_misc", "tied")] + [
    FIXTURES / f"release-{r}.mdl" for r in ("1.7", "1.8", "1.9", "2.0", "2.3", "2.10")
]


def _ours(path: Path) -> dict:
    return digest(cm.load(path, allow_missing=True, objects_mode="data"))


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[Path, str]:
    """Every source written at 0.3 (1.9), 0.4 (2.0, 2.3) and 0.5 (2.10), plus upgrade outputs."""
    out = tmp_path_factory.mktemp("ours")
    files: dict[Path, str] = {}
    for src in SOURCES:
        with read_checkpoint(src) as ckpt:
            for release in ("1.9", "2.0", "2.3", "2.10"):
                if src.stem == "scalars_misc" and release != "2.10":
                    continue  # an empty key cannot be a dataset name before 0.5
                if src.stem == "dtypes" and release in ("1.9", "2.0"):
                    continue  # uint16-64 tensors: 2.3 and later (tests/test_downgrade.py)
                dst = out / f"{src.stem}-as-{release}.mdl"
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    write_checkpoint(ckpt.root, dst, release, allow_missing=True)
                files[dst] = release
    for src in sorted(FIXTURES.glob("release-*.mdl")):
        with read_checkpoint(src) as ckpt:
            version = ckpt.release.version
        for release in ("2.0", "2.10"):
            if releases.get(release).version <= version:
                continue
            d = out / f"up-{release}-{src.stem}"
            d.mkdir()
            side = []
            if src.stem == "release-1.9":  # with its dataloader side files
                good = FIXTURES / "release-1.9-data-iter" / "good"
                side = ["--data-iter-dir", str(good), "--dataloader-type", "iterable"]
            elif src.stem == "release-1.8":  # 1.8 kept side files too; this fixture has none
                side = ["--drop-dataloader-state"]
            args = ["upgrade", str(src), "--to", release, "--output-dir", str(d), *side]
            subprocess.run(
                [sys.executable, "-m", "ckpt_migrate", *args],
                check=True,
                capture_output=True,
            )
            if (d / src.name).exists():
                files[d / src.name] = release
    for src in [REAL / f"{c}.mdl" for c in ("basic", "nested", "dtypes", "tied")] + [
        MODELS / f"{f}-2.0" / "checkpoint_100.mdl" for f in ("gpt2", "llama", "bert", "t5")
    ]:  # downgrades (issue #20): from 2.10 to the 0.4 releases
        newest = out / f"newest-{src.parent.name}-{src.stem}"
        _cli("upgrade", src, "--output-dir", newest, "-q")
        # (uint16-64 tensors go no lower than 2.3: tests/test_downgrade.py)
        for release in ("2.4", "2.3" if src.stem == "dtypes" else "2.0"):
            d = out / f"down-{release}-{src.parent.name}-{src.stem}"
            _cli("upgrade", newest / src.name, "--to", release, "--output-dir", d, "-q")
            files[d / src.name] = release
    files.update(_hf_imports(out))
    return files


def _cli(*args: str | Path) -> None:
    command = [sys.executable, "-m", "ckpt_migrate", *map(str, args)]
    subprocess.run(command, check=True, capture_output=True)


def _hf_imports(out: Path) -> dict[Path, str]:
    """Checkpoints import-hf writes (issue #23), from a tiny GPT-2 and a tiny LLaMA."""
    transformers = pytest.importorskip("transformers")
    files = {}
    for name, model in (
        ("gpt2", transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1,
                                                                      n_head=2, vocab_size=64))),
        ("llama", transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            vocab_size=64))),
    ):  # fmt: skip
        model.save_pretrained(out / f"hf-{name}")
        for release in ("2.0", "2.10"):
            dst = out / f"hf-{name}-{release}.mdl"
            _cli("import-hf", out / f"hf-{name}", dst, "--release", release, "--model", name)
            files[dst] = release
    return files


def test_real_library_loads_everything_we_write_with_the_same_contents(written):
    results = real_digest(list(written))
    failures = []
    for path, release in written.items():
        result = results[path]
        if not result["ok"]:
            failures.append(f"{path.name}: real load failed: {result['error']}")
            continue
        ours = _ours(path)
        theirs = result["digest"]
        if releases.get(release).legacy:
            ours, theirs = untied(ours), untied(theirs)
        if ours != theirs:
            failures.append(f"{path.name}: " + "; ".join(diff_digests(ours, theirs)[:5]))
    assert not failures, "\n".join(failures)
    assert len(written) >= 60
