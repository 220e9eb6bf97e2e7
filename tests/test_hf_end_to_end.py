"""Every Hugging Face family through the real commands (issue #23): a tiny random
``transformers`` model saved with ``save_pretrained`` -> ``ckpt-migrate import-hf`` (a 2.10
checkpoint and its params.yaml) -> ``ckpt-migrate export-hf`` -> the same tensors bit for bit,
the same config as data, and the same logits from ``from_pretrained``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import one_line_error, run_cli, written_to_after

from ckpt_migrate.cli.commands import verify
from ckpt_migrate.format.read import read_checkpoint

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "fixtures" / "models"

SMALL = {"vocab_size": 96}
DECODER = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, **SMALL}

# model name -> (transformers class, config) for one tiny model of each family
CASES = {
    # n_inner given: a null one comes back as its value, 4 x n_embd, as Model Zoo writes it
    "gpt2": (
        "GPT2LMHeadModel",
        transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_inner=256, rotary_dim=8, **SMALL),
    ),
    "gptj": (
        "GPTJForCausalLM",
        transformers.GPTJConfig(n_embd=64, n_layer=2, n_head=4, n_inner=256, rotary_dim=8, **SMALL),
    ),
    "codegen": (
        "CodeGenForCausalLM",
        transformers.CodeGenConfig(
            n_embd=64, n_layer=2, n_head=4, n_inner=256, rotary_dim=8, **SMALL
        ),
    ),
    "gpt-neox": (
        "GPTNeoXForCausalLM",
        transformers.GPTNeoXConfig(intermediate_size=128, **DECODER),
    ),
    "falcon": (
        "FalconForCausalLM",
        transformers.FalconConfig(  # multi_query means nothing to the new architecture: off
            new_decoder_architecture=True, multi_query=False, num_kv_heads=2, **DECODER
        ),
    ),
    "bloom": (
        "BloomForCausalLM",
        transformers.BloomConfig(hidden_size=64, n_head=4, n_layer=2, **SMALL),
    ),
    "llama": (
        "LlamaForCausalLM",
        transformers.LlamaConfig(intermediate_size=128, num_key_value_heads=2, **DECODER),
    ),
    "mistral": (
        "MistralForCausalLM",
        transformers.MistralConfig(
            intermediate_size=128, num_key_value_heads=2, sliding_window=4, **DECODER
        ),
    ),
    "mixtral": (
        "MixtralForCausalLM",
        transformers.MixtralConfig(
            intermediate_size=64,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            **DECODER,
        ),
    ),
    # exact GELU: CS geglu is exact, HF's default gelu_pytorch_tanh comes back as "gelu"
    "gemma2": (
        "Gemma2ForCausalLM",
        transformers.Gemma2Config(
            intermediate_size=128,
            num_key_value_heads=2,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=4,
            hidden_activation="gelu",
            **DECODER,
        ),
    ),
    "starcoder": (
        "GPTBigCodeForCausalLM",
        transformers.GPTBigCodeConfig(
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_inner=256,
            multi_query=True,
            **SMALL,
            bos_token_id=0,
            eos_token_id=0,  # StarCoder's (Model Zoo writes them)
        ),
    ),
    "bert": (
        "BertForPreTraining",
        transformers.BertConfig(intermediate_size=128, **DECODER),
    ),
    "roberta": (
        "RobertaForMaskedLM",
        transformers.RobertaConfig(intermediate_size=128, **DECODER),
    ),
    "t5": (
        "T5ForConditionalGeneration",
        transformers.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, **SMALL),
    ),
}


def _inputs(name: str) -> dict:
    ids = torch.arange(12).reshape(1, 12) % 90 + 3
    if name == "t5":
        return {"input_ids": ids, "decoder_input_ids": ids[:, :5]}
    return {"input_ids": ids}


def _logits(model, name: str):
    with torch.no_grad():
        out = model(**_inputs(name))
    return out.prediction_logits if name == "bert" else out.logits


def _tensors(directory: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(safetensors_numpy.load_file(str(file)))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_import_then_export_is_exact_for_every_family(name, tmp_path):
    cls_name, config = CASES[name]
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config).eval()
    original = tmp_path / "hf"
    model.save_pretrained(original)

    ckpt, params = tmp_path / "model.mdl", tmp_path / "params.yaml"
    proc = run_cli("import-hf", original, ckpt, "--config-out", params, "--model", name, "--json")
    assert proc.returncode == 0, proc.stderr
    imported = json.loads(proc.stdout)
    assert imported["release"] == "2.10" and imported["tensors"] > 0

    back = tmp_path / "back"
    proc = run_cli("export-hf", ckpt, back, "--config", params, "--model", name, "-q")
    assert proc.returncode == 0, proc.stderr

    before, after = _tensors(original), _tensors(back)
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert after[key].dtype == value.dtype and np.array_equal(after[key], value), key

    cfg_before = json.loads((original / "config.json").read_text())
    cfg_after = json.loads((back / "config.json").read_text())
    assert cfg_after["architectures"] == [cls_name]
    again = type(config)(**cfg_after).to_diff_dict()
    expected = config.to_diff_dict()
    for bookkeeping in ("transformers_version", "dtype", "torch_dtype", "architectures"):
        again.pop(bookkeeping, None), expected.pop(bookkeeping, None)
    assert {k: again.get(k) for k in expected} == expected, cfg_before

    reloaded = getattr(transformers, cls_name).from_pretrained(back).eval()
    assert torch.equal(_logits(reloaded, name), _logits(model, name))


def test_exported_tensor_data_begins_on_a_64_byte_boundary(tmp_path):
    """The header is padded so that a loader mapping the file (``transformers`` 5) hands the
    kernels 64-byte aligned tensors: on 8-byte alignment alone a reloaded CLIP model computed
    outputs 2.4e-7 from the same weights in memory (``test_clip_vit_round_trip``)."""
    src = MODELS / "gpt2-1.9"
    out = tmp_path / "hf"
    proc = run_cli("export-hf", src / "checkpoint_100.mdl", out, "--config", src / "params.yaml")
    assert proc.returncode == 0, proc.stderr
    files = sorted(out.glob("*.safetensors"))
    assert files
    for file in files:
        with open(file, "rb") as fh:
            length = int.from_bytes(fh.read(8), "little")
            header = fh.read(length)
        assert (8 + length) % 64 == 0, length
        assert header.rstrip(b" ").endswith(b"}") and json.loads(header)
        assert safetensors_numpy.load_file(str(file))  # the reference reader takes the padding


def test_the_source_is_closed_while_the_shards_are_read_back(tmp_path, monkeypatch):
    """Once every tensor is read, the export closes the source's file while it reads its
    shards back (``H5Handle.let_go``: its HDF5 caches were 25 MiB of a 112k-tensor export's
    peak, issue 33); a read after that opens it again (``test_h5io``)."""
    from ckpt_migrate.format.h5.io import H5Handle
    from ckpt_migrate.hf import export as hf_export
    from ckpt_migrate.hf import safetensors_io

    handles: list = []
    real_init, real_verify = H5Handle.__init__, safetensors_io.verify

    def init(self, *args, **kwargs):
        handles.append(self)
        real_init(self, *args, **kwargs)

    def verify(*args, **kwargs):
        assert handles and all(h._file is None for h in handles)  # (closed, not yet reopened)
        return real_verify(*args, **kwargs)

    monkeypatch.setattr(H5Handle, "__init__", init)
    monkeypatch.setattr(safetensors_io, "verify", verify)
    src = MODELS / "gpt2-1.9"
    result = hf_export.export(
        src / "checkpoint_100.mdl", tmp_path / "hf", config=src / "params.yaml"
    )
    assert result.files and result.tensors > 0

    # A head stored as a copy of the embedding: the tie's check reads both after the shards
    # were read back, from the file opened again; a head that is no copy is refused then.
    from ckpt_migrate.errors import UnsupportedContentError
    from ckpt_migrate.format.tree import MemoryData, TensorLeaf, iter_leaves, map_leaves
    from ckpt_migrate.format.write import write_checkpoint

    for change, refused in ((0.0, False), (1.0, True)):
        copy = tmp_path / f"copy{change}.mdl"
        with read_checkpoint(src / "checkpoint_100.mdl") as ckpt:
            leaves = {r.name: r.leaf for r in iter_leaves(ckpt.root)}
            emb = leaves["model.model.embedding_layer.word_embeddings.weight"]
            head = TensorLeaf(emb.dtype, emb.shape, MemoryData(emb.data.read() + change))
            root = map_leaves(ckpt.root, lambda r, h=head: h if "lm_head" in r.name else r.leaf)
            write_checkpoint(root, copy, "1.9", allow_missing=True)  # (its tied norm)
        out = tmp_path / f"hf{change}"
        if refused:
            with pytest.raises(UnsupportedContentError, match=r"lm_head\.weight differs from"):
                hf_export.export(copy, out, config=src / "params.yaml")
        else:
            done = hf_export.export(copy, out, config=src / "params.yaml")
            assert done.tensors == result.tensors


def test_the_plan_and_the_sources_are_let_go_of_before_the_shards_are_read_back(
    tmp_path, monkeypatch
):
    """While the shards are read back, the export holds what the read-back and ``safe_open``
    need, and the ties' source tensors: no plan output or entry, no other source tensor
    (issue 33)."""
    import gc

    from ckpt_migrate.format.tree import H5Data, TensorLeaf
    from ckpt_migrate.hf import directories, safetensors_io
    from ckpt_migrate.hf import export as hf_export
    from ckpt_migrate.hf.mapping import Out
    from ckpt_migrate.hf.safetensors_io import Entry

    events: list[str] = []
    held: set[str] = set()
    real_ties = hf_export._check_ties
    real_grouped, real_verify = directories.grouped, safetensors_io.verify

    def grouped(*args):
        events.append("plan")
        return real_grouped(*args)

    def verify(*args, **kwargs):
        gc.collect()
        alive = [o for o in gc.get_objects() if isinstance(o, (Out, TensorLeaf, Entry))]
        assert not [o for o in alive if isinstance(o, (Out, Entry))]
        held.update(o.data.name for o in alive if isinstance(o.data, H5Data))
        events.append("verify")
        return real_verify(*args, **kwargs)

    def check_ties(src, ties, leaves, digests):
        # the source tensors still held are the ties' (compared once the shards are checked)
        assert held and held <= {leaf.data.name for leaf in leaves.values()}
        events.append("ties")
        return real_ties(src, ties, leaves, digests)

    monkeypatch.setattr(directories, "grouped", grouped)
    monkeypatch.setattr(safetensors_io, "verify", verify)
    monkeypatch.setattr(hf_export, "_check_ties", check_ties)
    src = MODELS / "gpt2-1.9"
    result = hf_export.export(
        src / "checkpoint_100.mdl", tmp_path / "hf", config=src / "params.yaml"
    )
    assert result.tensors > 0
    assert events == ["plan", "verify", "ties"]


def test_the_source_is_made_ready_to_read_before_the_plan(tmp_path, monkeypatch):
    """The export makes the map of overlapping data (``H5Handle.ready_to_read``) once the
    trees are let go of and before its plan is made: made at the first tensor read, beside
    the plan, it took 25 MiB more at 150k tensors (issue 33)."""
    from ckpt_migrate.format.h5.io import H5Handle
    from ckpt_migrate.hf import directories
    from ckpt_migrate.hf import export as hf_export

    events: list[str] = []
    real_ready, real_grouped = H5Handle.ready_to_read, directories.grouped

    def ready(self):
        events.append("ready")
        return real_ready(self)

    def grouped(*args):
        events.append("plan")
        return real_grouped(*args)

    monkeypatch.setattr(H5Handle, "ready_to_read", ready)
    monkeypatch.setattr(directories, "grouped", grouped)
    src = MODELS / "gpt2-1.9"
    hf_export.export(src / "checkpoint_100.mdl", tmp_path / "hf", config=src / "params.yaml")
    assert events == ["ready", "plan"]


def modules_first_imported_by_the_read(src: Path, config: Path, out: Path, model: str = "") -> list:
    """The modules a fresh interpreter first imports once ``export`` has opened ``src``."""
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from ckpt_migrate.hf import export\n"
        "real, late = export.read_checkpoint, {}\n"
        "def opened(*args, **kwargs):\n"
        "    late['before'] = set(sys.modules)\n"
        "    return real(*args, **kwargs)\n"
        "export.read_checkpoint = opened\n"
        "src, config, out, model = sys.argv[1:]\n"
        "export.export(src, out, config=config, model=model or None)\n"
        "print(json.dumps(sorted(set(sys.modules) - late['before'])))\n"
    )
    args = [sys.executable, "-c", script, str(src), str(config), str(out), model]
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_export_loads_its_code_before_the_source_is_read(tmp_path):
    """In a fresh interpreter, no module is first imported once the export has opened its
    source (a 1.9 and a 2.0 file; Model Zoo's own import output in
    ``test_hf_modelzoo_files``): the hops, every family's rules, the YAML reader and
    ``safetensors`` are loaded first. Loaded amid a 150k-tensor tree, their objects kept that
    tree's memory from being given back (issue 33)."""
    for name in ("gpt2-1.9", "gpt2-2.0"):
        src = MODELS / name
        late = modules_first_imported_by_the_read(
            src / "checkpoint_100.mdl", src / "params.yaml", tmp_path / name
        )
        assert late == [], name


def test_a_malformed_config_is_refused_before_the_source_is_read(tmp_path, monkeypatch):
    from ckpt_migrate.errors import UsageError
    from ckpt_migrate.hf import export as hf_export

    def opened(*args, **kwargs):
        raise AssertionError("the source was read")

    monkeypatch.setattr(hf_export, "read_checkpoint", opened)
    config = tmp_path / "params.yaml"
    config.write_text("model: [unclosed\n", encoding="utf-8")
    src = MODELS / "gpt2-1.9" / "checkpoint_100.mdl"
    with pytest.raises(UsageError, match="not valid YAML") as caught:
        hf_export.export(src, tmp_path / "hf", config=config)
    assert str(config) in str(caught.value)
    assert not (tmp_path / "hf").exists()


def test_a_missing_hf_extra_is_refused_before_the_source_is_read(tmp_path, monkeypatch):
    """Without ``safetensors`` (the ``hf`` extra), the export ends with the install hint before
    it reads anything: the read-back needs it, at the end of a long write."""
    import sys

    from ckpt_migrate.errors import UsageError
    from ckpt_migrate.hf import export as hf_export

    def opened(*args, **kwargs):
        raise AssertionError("the source was read")

    monkeypatch.setattr(hf_export, "read_checkpoint", opened)
    monkeypatch.setitem(sys.modules, "safetensors", None)  # (an import of it fails)
    src = MODELS / "gpt2-1.9"
    with pytest.raises(UsageError, match=r"ckpt-migrate\[hf\]"):
        hf_export.export(src / "checkpoint_100.mdl", tmp_path / "hf", config=src / "params.yaml")
    assert not (tmp_path / "hf").exists()


def test_a_1_9_checkpoint_exports_in_one_command(tmp_path):
    src = MODELS / "gpt2-1.9"
    out = tmp_path / "hf"
    proc = run_cli(
        "export-hf", src / "checkpoint_100.mdl", out, "--config", src / "params.yaml", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["from_release"] == "1.9" and result["model"] == "gpt2"
    model = transformers.GPT2LMHeadModel.from_pretrained(out)
    assert model.config.n_layer == 1


def test_from_beside_the_files_own_release_is_said(tmp_path):
    """``export-hf --from`` reads the file as that release; the release the file names is
    said beside it (the reader's warnings were dropped by the export)."""
    src = MODELS / "gpt2-2.0"
    at_26 = tmp_path / "2.6"
    argv = ["upgrade", src / "checkpoint_100.mdl", "--to", "2.6", "-o", at_26, "-q"]
    assert run_cli(*argv, "--drop-dataloader-state").returncode == 0
    argv = ["export-hf", at_26 / "checkpoint_100.mdl", tmp_path / "hf", "--config"]
    proc = run_cli(*argv, src / "params.yaml", "--from", "2.8", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["from_release"] == "2.8", result
    said, config = result["warnings"]
    assert said == (
        "the file says it is release 2.6 (__cstorch_version__ 2.6.0); it is read as 2.8, as "
        "--from says, and the hops start there"
    )
    # (the checkpoint went up to 2.6 without its config, which is still 2.0's)
    assert "upgraded from 2.0 by ckpt-migrate without its config" in config


def test_models_with_the_same_keys_need_the_name(tmp_path):
    """A LLaMA and a Mistral checkpoint have the same keys: no guess between two HF layouts."""
    src = MODELS / "llama-2.0"
    proc = run_cli(
        "export-hf", src / "checkpoint_100.mdl", tmp_path / "hf", "--config", src / "params.yaml"
    )
    one_line_error(proc, 2, "llama and of mistral", "--model llama or --model mistral")
    assert not (tmp_path / "hf").exists()


def test_an_existing_output_is_kept_without_force(tmp_path):
    cls_name, config = CASES["gpt2"]
    model = getattr(transformers, cls_name)(config)
    model.save_pretrained(tmp_path / "hf")
    ckpt = tmp_path / "m.mdl"
    assert run_cli("import-hf", tmp_path / "hf", ckpt, "--model", "gpt2").returncode == 0
    before = ckpt.read_bytes()
    proc = run_cli("import-hf", tmp_path / "hf", ckpt, "--model", "gpt2")
    one_line_error(proc, 2, str(ckpt), "--force")
    assert ckpt.read_bytes() == before
    shutil.rmtree(tmp_path / "hf")


def test_an_export_to_an_existing_file_is_refused_once_with_the_fix(tmp_path):
    """Given a file as the export's directory, the refusal said to pass ``--force``, and with
    it the second refusal said a file is not replaced: one line now says both, with the fix
    that works. Input: Model Zoo's GPT-2 checkpoint of release 1.9."""
    src = MODELS / "gpt2-1.9"
    taken = tmp_path / "hf"
    taken.write_text("mine\n")
    argv = ["export-hf", src / "checkpoint_100.mdl", taken, "--config", src / "params.yaml"]
    for force in ([], ["--force"]):
        proc = run_cli(*argv, *force)
        one_line_error(proc, 2, "exists and is not a directory", "choose another output")
        assert "pass --force" not in proc.stderr
    assert taken.read_text() == "mine\n"


def test_an_export_names_the_source_directory_then_the_config_beside_it(tmp_path):
    """``export-hf MODEL_DIR out`` said to pass ``--config params.yaml``, and with it said the
    source was a directory: the directory is said first, then the missing config with the
    run's own ``params.yaml`` where Model Zoo keeps it, beside the checkpoint (a checkpoint
    alone: the bare name). Input: Model Zoo's GPT-2 model directory of release 2.0."""
    src = MODELS / "gpt2-2.0"
    out = tmp_path / "hf"
    one_line_error(run_cli("export-hf", src, out), 2, "is a directory", "name a .mdl file")
    proc = run_cli("export-hf", src / "checkpoint_100.mdl", out)
    one_line_error(proc, 2, "needs the run's model config", f"--config {src / 'params.yaml'}")
    alone = tmp_path / "alone" / "checkpoint_100.mdl"
    alone.parent.mkdir()
    shutil.copyfile(src / "checkpoint_100.mdl", alone)
    proc = run_cli("export-hf", alone, out)
    assert proc.stderr.rstrip().endswith("pass --config params.yaml"), proc.stderr
    assert not out.exists()


def test_force_replaces_a_model_directory_never_the_checkpoints_own(tmp_path):
    """``export-hf CKPT DIR --force`` replaced DIR whatever it held: given the checkpoint's own
    directory, it removed the checkpoint, its params.yaml and the rest. It now replaces only a
    directory of a Hugging Face model's files (one down at most), an earlier export with the
    tokenizer kept beside it among them."""
    run = tmp_path / "run"
    shutil.copytree(MODELS / "gpt2-1.9", run)
    (run / "notes.txt").write_text("mine\n")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    ckpt, params = run / "checkpoint_100.mdl", run / "params.yaml"
    for out in (run, tmp_path):  # its own directory; one holding it one level down
        proc = run_cli("export-hf", ckpt, out, "--config", params, "--force")
        one_line_error(proc, 2, str(out), "not a file of a Hugging Face model directory")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    hf = tmp_path / "hf"
    assert run_cli("export-hf", ckpt, hf, "--config", params).returncode == 0
    (hf / "tokenizer.json").write_text("{}")
    exported = sorted(p.name for p in hf.iterdir())
    proc = run_cli("export-hf", ckpt, ".", "--config", params, "--force", cwd=hf)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in hf.iterdir()) == sorted(set(exported) - {"tokenizer.json"})
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_import_with_force_replaces_no_file_of_the_model_it_reads(tmp_path):
    """``import-hf DIR DIR/model.safetensors --force`` replaced the model's weights with the
    checkpoint, and ``--config-out DIR/config.json`` its config, with success. A directory
    ``save_pretrained`` wrote (files we did not write)."""
    cls_name, config = CASES["gpt2"]
    hf = tmp_path / "hf"
    getattr(transformers, cls_name)(config).save_pretrained(hf)
    before = {p.name: p.read_bytes() for p in hf.iterdir()}
    for args in (
        (hf / "model.safetensors",),
        (tmp_path / "m.mdl", "--config-out", hf / "config.json"),
    ):
        proc = run_cli("import-hf", hf, *args, "--model", "gpt2", "--force")
        one_line_error(proc, 2, "which this import reads; --force replaces nothing there")
    assert {p.name: p.read_bytes() for p in hf.iterdir()} == before
    assert not (tmp_path / "m.mdl").exists()
    # the config's output naming the checkpoint's: with --force the config replaced the
    # checkpoint, reported as written; without, it was refused once the checkpoint was written
    for force in ((), ("--force",)):
        out = tmp_path / "m.mdl"
        proc = run_cli("import-hf", hf, out, "--config-out", out, "--model", "gpt2", *force)
        one_line_error(proc, 2, "is the checkpoint's output too")
        assert not out.exists()


def test_a_layer_count_of_true_is_refused_both_ways(tmp_path):
    """Python takes true for 1: a one-layer model whose config said ``true`` exported and
    imported with success, and the config written on the other side said
    ``num_hidden_layers: true``."""
    src = MODELS / "gpt2-1.9"
    text = (src / "params.yaml").read_text()
    assert "num_hidden_layers: 1\n" in text
    params = tmp_path / "params.yaml"
    params.write_text(text.replace("num_hidden_layers: 1\n", "num_hidden_layers: true\n"))
    proc = run_cli("export-hf", src / "checkpoint_100.mdl", tmp_path / "hf", "--config", params)
    one_line_error(proc, 2, "num_hidden_layers is true, not a layer count")
    good = tmp_path / "good"
    proc = run_cli("export-hf", src / "checkpoint_100.mdl", good, "--config", src / "params.yaml")
    assert proc.returncode == 0, proc.stderr
    config = json.loads((good / "config.json").read_text())
    (good / "config.json").write_text(json.dumps({**config, "n_layer": True}))
    proc = run_cli("import-hf", good, tmp_path / "m.mdl", "--model", "gpt2")
    one_line_error(proc, 2, "n_layer is true, not a layer count")


@pytest.mark.parametrize("name", ["gpt2", "bert", "t5"])
def test_import_to_2_0_is_the_2_10_import_downgraded(name, tmp_path):
    """Two ways to a 2.0 checkpoint agree: ``import-hf --release 2.0`` writes 2.0's key names
    (the 2.1 renames undone, e.g. T5's ``relative_position_encoder``) and the same tensors as
    ``import-hf --release 2.10`` followed by ``upgrade --to 2.0``."""
    cls_name, config = CASES[name]
    torch.manual_seed(0)
    getattr(transformers, cls_name)(config).save_pretrained(tmp_path / "hf")
    direct, newest = tmp_path / "direct.mdl", tmp_path / "newest.mdl"
    for out, release in ((direct, "2.0"), (newest, "2.10")):
        proc = run_cli("import-hf", tmp_path / "hf", out, "--release", release, "--model", name)
        assert proc.returncode == 0, proc.stderr
    proc = run_cli("upgrade", newest, "--to", "2.0", "-o", tmp_path / "down", "--model", name)
    assert proc.returncode == 0, proc.stderr
    result = verify(direct, tmp_path / "down" / newest.name)
    assert [d for d in result["differences"] if d["name"].startswith("model.")] == []
    with read_checkpoint(direct) as ckpt:
        keys = [k for k, _ in ckpt.root.get("model").items]
    assert not any(".embed.weight" in k or "position_embed_helper" in k for k in keys)


def test_a_source_written_to_while_it_is_exported_publishes_nothing(tmp_path, monkeypatch):
    """The export reads the checkpoint's tensors as it writes the shards: a job writing over
    the file meanwhile gave a model directory of parts of two versions. Model Zoo's GPT-2
    fixture, written to (its modification time moved) once the shards are read back."""
    from ckpt_migrate.errors import VerificationError
    from ckpt_migrate.hf import export as hf_export
    from ckpt_migrate.hf import safetensors_io

    model = MODELS / "gpt2-2.0"
    src = tmp_path / "checkpoint_100.mdl"
    shutil.copyfile(model / "checkpoint_100.mdl", src)
    written_to_after(monkeypatch, safetensors_io, "verify", src)
    with pytest.raises(VerificationError, match="was written to while it was read"):
        hf_export.export(src, tmp_path / "hf", config=model / "params.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == [src.name]


def test_a_model_written_to_while_it_is_imported_publishes_nothing(tmp_path, monkeypatch):
    """``import-hf`` reads the shards' tensors as it writes the checkpoint: a shard written
    to meanwhile gave a checkpoint of parts of two versions. Model Zoo's GPT-2 fixture,
    exported to Hugging Face, its shard written to before the checkpoint is published."""
    from ckpt_migrate.errors import VerificationError
    from ckpt_migrate.format import write
    from ckpt_migrate.hf import export as hf_export
    from ckpt_migrate.hf import import_ as hf_import

    model = MODELS / "gpt2-2.0"
    hf = tmp_path / "hf"
    hf_export.export(model / "checkpoint_100.mdl", hf, config=model / "params.yaml")
    (shard,) = hf.glob("*.safetensors")
    written_to_after(monkeypatch, write, "check_written", shard)
    with pytest.raises(VerificationError, match="was written to while it was read"):
        hf_import.import_hf(hf, tmp_path / "ckpt.mdl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
