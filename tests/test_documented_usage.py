"""The release documentation's command lines, typed exactly as written (issue #31).

The 2.0 upgrade workflow: ``fix_checkpoint_spec.py`` first (``[-h] [--fixed_checkpoint_path P]
[--fix_inplace] checkpoint_path``), then ``data_iter_state_conversion.py`` for the dataloader
side files (``-c/--old_checkpoint``, ``-w/--worker_data_iter_files_dir``, ``-o/--output_file``,
optional ``-d/--dataloader_type`` (map) and ``-s/--shuffle_seed``), or Model Zoo's
``convert_checkpoint.py convert … --src-fmt cs-1.9 --tgt-fmt cs-2.0``. Each line runs on 1.7,
1.8 and 1.9 files, with and without side files, and its output holds what ``ckpt-migrate
upgrade`` writes for the same ground (the state dict as the loader returns it).
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, one_line_error, release_of, run_cli, run_script
from digest import diff_digests, digest, untied
from real_cstorch import real_digest, requires_real_cstorch

import ckpt_migrate as cm
from ckpt_migrate.hf.import_ import import_hf

SIDE = FIXTURES / "release-1.9-data-iter" / "good"  # step 10, as the release files
RELEASES = ("1.7", "1.8", "1.9")

FIX = "fix_checkpoint_spec.py checkpoint_10.mdl"
FIX_TO = "fix_checkpoint_spec.py --fixed_checkpoint_path fixed.mdl checkpoint_10.mdl"
FIX_INPLACE = "fix_checkpoint_spec.py --fix_inplace checkpoint_10.mdl"
DATA_ITER = "data_iter_state_conversion.py -c checkpoint_10_fixed.mdl -w side -o state.mdl"
DATA_ITER_LONG = (
    "data_iter_state_conversion.py --old_checkpoint checkpoint_10_fixed.mdl "
    "--worker_data_iter_files_dir side --output_file state.mdl --dataloader_type iterable "
    "--shuffle_seed 0"
)
CONVERT = (
    "convert_checkpoint.py convert checkpoint_10.mdl --model gpt2 --src-fmt cs-{release} "
    "--tgt-fmt cs-2.0 --config params.yaml"
)


def run_line(line: str, cwd: Path):
    """A documented line, verbatim, typed in the run's directory ``cwd``."""
    script, *args = shlex.split(line)
    return run_script(script, *args, cwd=cwd)


def state(path: Path) -> dict:
    """The state dict as the loader returns it, as a digest (values, ties, containers)."""
    return digest(cm.load(path, allow_missing=True, objects_mode="data"))


def one_upgrade(src: Path, out_dir: Path, *extra: str) -> Path:
    proc = run_cli("upgrade", src, "--to", "2.0", "--output-dir", out_dir, *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out_dir / src.name


def upgrade_with_side_files(src: Path, out_dir: Path, kind: str, seed: int | None = None):
    seeded = () if seed is None else ("--shuffle-seed", str(seed))
    return one_upgrade(src, out_dir, "--data-iter-dir", SIDE, "--dataloader-type", kind, *seeded)


@pytest.fixture(params=RELEASES)
def run_dir(request, tmp_path) -> Path:
    """A training run's directory: a checkpoint of the release, its side files (``side``)."""
    shutil.copyfile(FIXTURES / f"release-{request.param}.mdl", tmp_path / "checkpoint_10.mdl")
    shutil.copytree(SIDE, tmp_path / "side")
    return tmp_path


def test_fix_then_convert_the_side_files_as_documented(run_dir):
    """``fix_checkpoint_spec.py CKPT`` fixes without a refusal (and names the next step where
    there are side files), ``data_iter_state_conversion.py -c -w -o`` adds the state with the
    documented defaults (map-style, seed 0, each said): the two steps hold what one upgrade
    with the same side files writes."""
    src = run_dir / "checkpoint_10.mdl"
    release = release_of(src)
    proc = run_line(FIX, run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fixed = run_dir / "checkpoint_10_fixed.mdl"
    assert release_of(fixed) == "2.0" and release_of(src) == release
    told = [line for line in proc.stdout.splitlines() if "data_iter_state_conversion.py" in line]
    assert len(told) == (0 if release == "1.7" else 1), proc.stdout  # 1.7 wrote no side files
    proc = run_line(DATA_ITER, run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "assuming a map-style dataloader" in proc.stdout
    assert "seed 0 assumed" in proc.stderr
    expected = upgrade_with_side_files(src, run_dir / "one", "map", seed=0)
    assert diff_digests(state(expected), state(run_dir / "state.mdl")) == []
    proc = run_line(DATA_ITER_LONG, run_dir)  # the long spellings, an iterable loader
    assert proc.returncode == 2 and "already exists" in proc.stderr  # never overwritten
    (run_dir / "state.mdl").unlink()
    proc = run_line(DATA_ITER_LONG, run_dir)
    assert proc.returncode == 0 and "assum" not in proc.stdout + proc.stderr, proc.stderr
    expected = upgrade_with_side_files(src, run_dir / "two", "iterable")
    assert diff_digests(state(expected), state(run_dir / "state.mdl")) == []


def test_fixing_alone_and_in_place(run_dir):
    """``--fixed_checkpoint_path`` and ``--fix_inplace`` (no question without a terminal, the
    original kept as a backup): the fixed file is what ``upgrade --to 2.0`` writes, without the
    dataloader state the next script adds."""
    src = run_dir / "checkpoint_10.mdl"
    release = release_of(src)
    proc = run_line(FIX_TO, run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    drop = () if release == "1.7" else ("--drop-dataloader-state",)
    expected = state(one_upgrade(src, run_dir / "one", *drop))
    assert diff_digests(expected, state(run_dir / "fixed.mdl")) == []
    original = src.read_bytes()
    proc = run_line(FIX_INPLACE, run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert release_of(src) == "2.0"
    [backup] = run_dir.glob("checkpoint_10.mdl.pre-*.bak")
    assert backup.read_bytes() == original
    assert diff_digests(expected, state(src)) == []
    proc = run_line(FIX, run_dir)  # a 2.0 file needs no fix
    assert proc.returncode == 0 and "nothing to fix" in proc.stdout


def test_the_side_files_straight_from_a_1_x_file(run_dir):
    """``data_iter_state_conversion.py`` on the old checkpoint itself does both steps."""
    src = run_dir / "checkpoint_10.mdl"
    line = DATA_ITER.replace("checkpoint_10_fixed.mdl", "checkpoint_10.mdl") + " -s 7"
    proc = run_line(line, run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = upgrade_with_side_files(src, run_dir / "one", "map", seed=7)
    assert diff_digests(state(expected), state(run_dir / "state.mdl")) == []


@pytest.mark.parametrize("with_side_files", [False, True], ids=["without", "with"])
def test_convert_checkpoint_as_model_zoo_does(tmp_path, with_side_files):
    """``convert … --src-fmt cs-1.9 --tgt-fmt cs-2.0`` on a 1.9 GPT-2 run: the side files the
    config names (``cerebras.save_iter_state_path``) are converted; without them the checkpoint
    is converted and one line says the dataloader state was not carried."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "example", run)
    config = run / "params.yaml"
    if with_side_files:  # relative to where the command runs, as Model Zoo takes it
        config.write_text(
            config.read_text() + '\ncerebras:\n  save_iter_state_path: "dataloader"\n'
        )
    line = CONVERT.format(release="1.9").replace("checkpoint_10.mdl", "checkpoint_100.mdl")
    proc = run_line(line, run)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = run / "checkpoint_100_to_cs-2.0.mdl"
    said = [line for line in proc.stdout.splitlines() if "dataloader" in line]
    if with_side_files:
        assert any("iterable-style state from 2 worker file(s) of step 100" in s for s in said)
        extra = ("--data-iter-dir", run / "dataloader", "--dataloader-type", "iterable")
    else:
        [line] = said
        assert "not carried" in line and "--data-iter-dir" in line and "params.yaml" in line
        extra = ("--drop-dataloader-state",)
    src = FIXTURES / "example" / "checkpoint_100.mdl"
    expected = one_upgrade(src, tmp_path / "one", *extra)
    assert diff_digests(state(expected), state(out)) == []


def test_convert_checkpoint_from_every_1_x_release(run_dir):
    """The documented ``convert`` line from cs-1.7, cs-1.8 and cs-1.9 (no side files named):
    converted, what one upgrade writes, and the dataloader line only where there was state."""
    src = run_dir / "checkpoint_10.mdl"
    release = release_of(src)
    shutil.copyfile(FIXTURES / "models" / "gpt2-1.9" / "params.yaml", run_dir / "params.yaml")
    proc = run_line(CONVERT.format(release=release), run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = [line for line in proc.stdout.splitlines() if "dataloader state" in line]
    assert len(said) == (0 if release == "1.7" else 1), proc.stdout
    drop = () if release == "1.7" else ("--drop-dataloader-state",)
    expected = one_upgrade(src, run_dir / "one", "--model", "gpt2", *drop)
    assert diff_digests(state(expected), state(run_dir / "checkpoint_10_to_cs-2.0.mdl")) == []


@requires_real_cstorch()
def test_the_real_library_loads_what_the_documented_lines_write(tmp_path):
    """Opt-in oracle (``CKPT_MIGRATE_CSTORCH_PYTHON``): the fixed file and the one with its
    dataloader state load in the real cerebras.pytorch 2.10 with the contents our loader gives
    (ties compared as the real legacy reader makes them: separate objects)."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "example", run)
    assert run_line("fix_checkpoint_spec.py checkpoint_100.mdl", run).returncode == 0
    line = "data_iter_state_conversion.py -c checkpoint_100_fixed.mdl -w dataloader -o state.mdl"
    assert run_line(line + " -d iterable", run).returncode == 0
    outputs = [run / "checkpoint_100_fixed.mdl", run / "state.mdl"]
    results = real_digest(outputs)
    for path in outputs:
        assert results[path]["ok"], results[path]["error"]
        assert untied(results[path]["digest"]) == untied(state(path)), path.name


# ------------------------------------------- Model Zoo's own convert_checkpoint.py lines, by tag

CONVERT_19 = (  # Model Zoo 1.8.0/1.9.1 `convert` had --export-h5-checkpoint (cbtorch.save: H5)
    "convert_checkpoint.py convert checkpoint_100.mdl --model gpt2 --src-fmt cs-1.9 "
    "--tgt-fmt cs-2.0 --config params.yaml --export-h5-checkpoint"
)
# Model Zoo 1.8.0-2.3.1 dispatched to "_" + command with "-" as "_" (CheckpointConverterCLI)
CONVERT_CONFIG_19 = (
    "convert_checkpoint.py convert_config params.yaml --model gpt2 --src-fmt cs-1.9 "
    "--tgt-fmt cs-2.0 --output-dir underscored"
)
# tags Release_2.2.0-2.4.3, models/multimodal/llava/README.md, steps 4 and 6
LLAVA_IN = (
    "convert_checkpoint.py convert --model llava --src-fmt hf --tgt-fmt cs-2.2 --output-dir "
    "/path/to/converted_checkpoint --config /path/to/pretrained/checkpoints "
    "/path/to/pretrained/checkpoints"
)
LLAVA_OUT = (
    "convert_checkpoint.py convert --model llava --src-fmt cs-2.2 --tgt-fmt hf --output-dir "
    "/path/to/hf_converted_checkpoint --config /path/to/cs_config.yaml "
    "/path/to/checkpoint_from_phase-2.mdl"
)
# tags Release_1.8.0-2.10.0, the GPT-J continuous_pretraining/README.md (its target release)
GPTJ_IN = (
    "convert_checkpoint.py convert {file} --config EleutherAI_gpt-j-6B_config.json --model gptj "
    "--src-fmt hf --tgt-fmt cs-2.3 --output-dir converted"
)


def test_model_zoo_1_9_spellings_of_convert(tmp_path):
    """``--export-h5-checkpoint`` and the ``convert_config`` command, as Model Zoo 1.8/1.9
    parsed them, run: the checkpoint is what one upgrade writes (always H5), the config what
    ``convert-config`` writes."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "models" / "gpt2-1.9", run)
    proc = run_line(CONVERT_19, run)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    src = run / "checkpoint_100.mdl"
    expected = one_upgrade(src, tmp_path / "one", "--model", "gpt2", "--drop-dataloader-state")
    assert diff_digests(state(expected), state(run / "checkpoint_100_to_cs-2.0.mdl")) == []
    proc = run_line(CONVERT_CONFIG_19, run)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = (run / "underscored" / "params_to_cs-2.0.yaml").read_text()
    assert written == (run / "params_to_cs-2.0.yaml").read_text()


def test_llava_lines_of_the_model_zoo_readme(tmp_path):
    """The LLaVA README's ``--config DIR DIR`` (Model Zoo: "pass the path to the outer directory
    to both the --config argument and checkpoint_file argument") imports the sub-directories
    transformers wrote; the way back names each config.json it wrote, and each exists."""
    pytest.importorskip("transformers")
    from test_hf_multi_dir import _save_llava

    _save_llava(tmp_path / "path" / "to" / "pretrained" / "checkpoints")
    other = LLAVA_IN.replace("--config /path/to/pretrained/checkpoints", f"--config {tmp_path}")
    proc = run_line(other.replace("/path/to", str(tmp_path / "path" / "to")), tmp_path)
    one_line_error(proc, 2, "a directory other than the checkpoint's")
    config = "--config /path/to/pretrained/checkpoints"
    part = LLAVA_IN.replace(config, f"{config}/text_model/config.json")
    proc = run_line(part.replace("/path/to", str(tmp_path / "path" / "to")), tmp_path)
    one_line_error(proc, 2, "not from one given config", "give the model directory")
    proc = run_line(LLAVA_IN.replace("/path/to", str(tmp_path / "path" / "to")), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "path" / "to" / "converted_checkpoint"
    expected = tmp_path / "one.mdl"
    hf = tmp_path / "path" / "to" / "pretrained" / "checkpoints"
    import_hf(hf, expected, release="2.2", model="llava")
    ckpt = out / "checkpoints_to_cs-2.2.mdl"
    assert diff_digests(state(expected), state(ckpt)) == []
    shutil.copyfile(ckpt, tmp_path / "path" / "to" / "checkpoint_from_phase-2.mdl")
    shutil.copyfile(out / "checkpoints_to_cs-2.2.yaml", tmp_path / "path" / "to" / "cs_config.yaml")
    proc = run_line(LLAVA_OUT.replace("/path/to", str(tmp_path / "path" / "to")), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = [line.split(" to ", 1)[1] for line in proc.stdout.splitlines() if "Config saved" in line]
    assert [Path(p).parent.name for p in said] == ["image_model", "text_model"], proc.stdout
    assert all(Path(p).is_file() for p in said)


def test_gptj_readme_line_reads_the_file_it_names(tmp_path):
    """The GPT-J README's ``convert <path to checkpoint file> --config <config.json>``: a
    ``pytorch_model.bin`` as transformers 4 saved it converts; a file that is not there is
    refused in one line (it converted the directory's other weights), nothing written; the
    line as the 1.8.0 README wrote it (``--tgt-fmt cs-1.8``) is refused with what to do."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    config = transformers.GPTJConfig(
        vocab_size=32, n_positions=16, n_embd=8, n_layer=1, n_head=2, rotary_dim=4
    )
    hf = tmp_path / "gpt-j-6B"
    transformers.GPTJForCausalLM(config).save_pretrained(hf)  # model.safetensors (5.x)
    shutil.copyfile(hf / "config.json", tmp_path / "EleutherAI_gpt-j-6B_config.json")
    proc = run_line(GPTJ_IN.format(file="gpt-j-6B/pytorch_model.bin"), tmp_path)
    one_line_error(proc, 2, "gpt-j-6B/pytorch_model.bin", "no such file")
    assert not (tmp_path / "converted").exists()
    weights = transformers.GPTJForCausalLM.from_pretrained(hf).state_dict()
    (hf / "model.safetensors").unlink()
    torch.save(weights, hf / "pytorch_model.bin")
    proc = run_line(GPTJ_IN.format(file="gpt-j-6B/pytorch_model.bin"), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_line(GPTJ_IN.format(file="gpt-j-6B").replace("cs-2.3", "cs-1.8"), tmp_path)
    one_line_error(proc, 2, "writes releases 2.0 and newer, not 1.8", "choose release 2.0")
    assert (tmp_path / "converted" / "pytorch_model_to_cs-2.3.mdl").is_file()
    assert (tmp_path / "converted" / "EleutherAI_gpt-j-6B_config_to_cs-2.3.yaml").is_file()


def test_a_named_bin_beside_safetensors_is_not_silently_swapped(tmp_path):
    """The GPT-J README names the checkpoint file; where that is a ``pytorch_model.bin`` but
    the directory also holds (other) safetensors, which the import reads, the line is refused
    in one line naming the file it would read: it wrote the safetensors' weights under the
    .bin's name."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = transformers.GPTJConfig(
        vocab_size=32, n_positions=16, n_embd=8, n_layer=1, n_head=2, rotary_dim=4
    )
    hf = tmp_path / "gpt-j-6B"
    torch.manual_seed(0)
    transformers.GPTJForCausalLM(config).save_pretrained(hf)  # model.safetensors
    torch.manual_seed(1)
    torch.save(transformers.GPTJForCausalLM(config).state_dict(), hf / "pytorch_model.bin")
    shutil.copyfile(hf / "config.json", tmp_path / "EleutherAI_gpt-j-6B_config.json")
    proc = run_line(GPTJ_IN.format(file="gpt-j-6B/pytorch_model.bin"), tmp_path)
    one_line_error(proc, 2, "pytorch_model.bin", "it reads model.safetensors")
    assert not (tmp_path / "converted").exists()
    proc = run_line(GPTJ_IN.format(file="gpt-j-6B/model.safetensors"), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "converted" / "model_to_cs-2.3.mdl").is_file()


def test_a_hugging_face_config_for_a_1_x_release_says_what_to_do(tmp_path):
    """``convert-config config.json --src-fmt hf --tgt-fmt cs-1.9`` (Model Zoo 1.9's own
    target): refused in one line that names the releases it writes, not as a checkpoint
    downgrade ("keep the checkpoint at its release"); cs-2.0 converts."""
    transformers = pytest.importorskip("transformers")
    transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2).save_pretrained(tmp_path)
    line = "convert_checkpoint.py convert-config config.json --model gpt2 --src-fmt hf --tgt-fmt {}"
    proc = run_line(line.format("cs-1.9"), tmp_path)
    one_line_error(proc, 2, "writes releases 2.0 and newer, not 1.9", "choose release 2.0")
    assert not (tmp_path / "config_to_cs-1.9.yaml").exists()
    assert run_line(line.format("cs-2.0"), tmp_path).returncode == 0
    assert (tmp_path / "config_to_cs-2.0.yaml").is_file()
