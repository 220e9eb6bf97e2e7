"""The Hugging Face pipeline end to end on real files: transformers' own ``save_pretrained``
output -> a CS checkpoint (2.10 and 2.0) -> back to HF, bitwise; sharding; a 1.9 checkpoint
exported in one call; ``pytorch_model.bin`` imports; the refusals; memory."""

from __future__ import annotations

import json
import shutil
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import CKPT, MODELS, release_of

from ckpt_migrate.errors import CkptError, UnsupportedContentError, UsageError
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import DictNode, MemoryData, TensorLeaf, iter_leaves
from ckpt_migrate.format.write import write_checkpoint
from ckpt_migrate.hf import safetensors_io as st
from ckpt_migrate.hf.arrays import LastRead
from ckpt_migrate.hf.export import export
from ckpt_migrate.hf.import_ import import_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")
pytest.importorskip("safetensors.torch")

IGNORED = {"transformers_version", "dtype", "torch_dtype", "bos_token_id", "eos_token_id"}


def _tiny(tmp_path: Path, tied: bool = True) -> tuple[Path, object]:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_embd=64,
        n_layer=2,
        n_head=4,
        vocab_size=128,
        n_positions=32,
        n_inner=256,
        tie_word_embeddings=tied,
    )
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    out = tmp_path / f"hf-{'tied' if tied else 'untied'}"
    model.save_pretrained(out)
    return out, model


def _tensors(directory: Path) -> dict[str, np.ndarray]:
    out = {}
    files = sorted(directory.glob("*.safetensors"))
    assert files
    for f in files:
        with safetensors.safe_open(str(f), framework="numpy") as fh:
            for k in fh.keys():  # noqa: SIM118
                out[k] = fh.get_tensor(k)
    return out


def _config(directory: Path) -> dict:
    """The config as transformers reads it (defaults filled in), minus bookkeeping and the
    tokenizer's token ids (not part of a CS model config)."""
    data = transformers.GPT2Config.from_pretrained(directory).to_dict()
    return {k: v for k, v in data.items() if k not in IGNORED}


def _logits(directory: Path) -> torch.Tensor:
    model = transformers.GPT2LMHeadModel.from_pretrained(directory).eval()
    with torch.no_grad():
        return model(torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])).logits


@pytest.mark.parametrize("release", ["2.10", "2.0"])
@pytest.mark.parametrize("tied", [True, False])
def test_hf_to_cs_to_hf_is_bitwise(tmp_path: Path, release: str, tied: bool):
    hf_dir, _ = _tiny(tmp_path, tied)
    ckpt, params = tmp_path / "model.mdl", tmp_path / "params.yaml"
    imported = import_hf(hf_dir, ckpt, release=release, config_out=params)
    assert release_of(ckpt) == release and imported.model == "gpt2"
    assert imported.tensors == 36 + (0 if tied else 1)  # 16 per layer, 4 outside, lm_head
    with read_checkpoint(ckpt) as c:
        names = {r.name: r.leaf for r in iter_leaves(c.root)}
    pos = "model.embedding_layer.position_embeddings." + (
        "weight" if release == "2.0" else "embed.weight"
    )
    assert pos in names
    if tied:  # one tensor under both names, as a tied model's state dict has it
        assert (
            names["model.lm_head.weight"] is names["model.embedding_layer.word_embeddings.weight"]
        )
    text = params.read_text()
    assert ("trainer:" in text) == (release != "2.0")

    back = tmp_path / "back"
    exported = export(ckpt, back, config=params)
    assert exported.files == ["config.json", "model.safetensors"] and exported.dropped == {}
    original, again = _tensors(hf_dir), _tensors(back)
    assert sorted(original) == sorted(again)
    for k, v in original.items():
        assert again[k].dtype == v.dtype and np.array_equal(again[k], v), k
    assert _config(back) == _config(hf_dir)
    assert torch.equal(_logits(back), _logits(hf_dir))


def test_sharded_export_loads_in_transformers(tmp_path: Path):
    hf_dir, _ = _tiny(tmp_path)
    ckpt, params = tmp_path / "m.mdl", tmp_path / "p.yaml"
    import_hf(hf_dir, ckpt, config_out=params)
    out = tmp_path / "sharded"
    result = export(ckpt, out, config=params, shard_size="100KB")
    assert result.shards > 1
    names = st.file_names(result.shards)
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, st.INDEX, "config.json"])
    index = json.loads((out / st.INDEX).read_text())
    assert index["metadata"]["total_size"] == result.bytes
    assert set(index["weight_map"].values()) == set(names)
    for name in names:  # no shard over the limit unless it holds a single larger tensor
        tensors, _ = st.read_header(out / name)
        size = sum(t.entry.nbytes for t in tensors.values())
        assert size <= 100_000 or len(tensors) == 1
    assert torch.equal(_logits(out), _logits(hf_dir))
    assert _tensors(out).keys() == _tensors(hf_dir).keys()
    # the sharded directory imports too, and a second export is the same bytes
    ckpt2 = tmp_path / "m2.mdl"
    import_hf(out, ckpt2)
    export(ckpt2, tmp_path / "single", config=params)
    assert _same(tmp_path / "single", hf_dir)


def _same(a: Path, b: Path) -> bool:
    x, y = _tensors(a), _tensors(b)
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def test_shard_size_parses_like_transformers():
    from transformers.utils.hub import convert_file_size_to_int

    for text in ("5GB", "500MB", "2GiB", "8Mb", "+5MB", " 5 GB", "3KiB", "10kb"):
        assert st.parse_size(text) == convert_file_size_to_int(text), text
    assert st.parse_size("1000") == 1000 and st.parse_size(1234) == 1234
    with pytest.raises(UsageError):
        st.parse_size("big")
    # transformers takes these and shards a file per tensor; a size under a byte is refused
    for text in ("-5MB", "0MB", "0", -3):
        with pytest.raises(UsageError, match="at least 1 byte"):
            st.parse_size(text)


def test_release_1_9_checkpoint_exports_in_one_call(tmp_path: Path):
    src = MODELS / "gpt2-1.9" / CKPT
    out = tmp_path / "hf"
    result = export(src, out, config=MODELS / "gpt2-1.9" / "params.yaml")
    assert result.from_release == "1.9" and result.model == "gpt2"
    hf = _tensors(out)
    with read_checkpoint(src) as c:
        cs = {
            r.name: r.leaf.data.read()
            for r in iter_leaves(c.root.get("model"))
            if isinstance(r.leaf, TensorLeaf)
        }
    assert np.array_equal(
        hf["transformer.wte.weight"], cs["model.embedding_layer.word_embeddings.weight"]
    )
    assert np.array_equal(
        hf["transformer.wpe.weight"], cs["model.embedding_layer.position_embeddings.weight"]
    )
    q, k, v = (
        cs[f"model.transformer_decoder.layers.0.self_attn.proj_{x}_dense_layer.weight"]
        for x in "qkv"
    )
    assert np.array_equal(hf["transformer.h.0.attn.c_attn.weight"], np.concatenate([q, k, v]).T)
    assert np.array_equal(hf["transformer.ln_f.weight"], cs["model.ln_f.weight"])
    assert "lm_head.weight" not in hf  # tied: save_pretrained leaves it out too
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], cfg["n_inner"]) == (4, 1, 10, 8)
    model = transformers.GPT2LMHeadModel.from_pretrained(out)
    assert torch.equal(model.lm_head.weight, model.transformer.wte.weight)


def _one_line(exc: CkptError) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


def test_refusals(tmp_path: Path):
    hf_dir, _ = _tiny(tmp_path)
    ckpt, params = tmp_path / "m.mdl", tmp_path / "p.yaml"
    import_hf(hf_dir, ckpt, config_out=params)
    with pytest.raises(UsageError) as err:  # an existing output, without force
        export(ckpt, hf_dir, config=params)
    assert "--force" in _one_line(err.value)
    with pytest.raises(UsageError) as err:
        import_hf(hf_dir, ckpt)
    assert "already exists" in _one_line(err.value)
    with pytest.raises(UsageError) as err:
        export(ckpt, tmp_path / "x", model="llama-xyz", config=params)
    assert "llama-xyz" in _one_line(err.value)
    with pytest.raises(UsageError) as err:
        export(ckpt, tmp_path / "x")
    assert "--config" in _one_line(err.value)
    with pytest.raises(UsageError) as err:
        import_hf(hf_dir, tmp_path / "old.mdl", release="1.9")
    assert "2.0" in _one_line(err.value)
    given = tmp_path / "given-config.json"  # a config of its own, named as the output
    shutil.copyfile(hf_dir / "config.json", given)
    with pytest.raises(UsageError) as err:
        import_hf(hf_dir, given, config=given, force=True)
    assert "the config this import reads" in _one_line(err.value)
    assert given.read_bytes() == (hf_dir / "config.json").read_bytes()
    # force replaces: the directory is complete afterwards
    export(ckpt, hf_dir, config=params, force=True)
    assert torch.equal(_logits(hf_dir), _logits(hf_dir))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".tmp", ".old"))]


def test_unused_cs_tensors_are_refused_unless_dropped(tmp_path: Path):
    hf_dir, _ = _tiny(tmp_path)
    ckpt, params = tmp_path / "m.mdl", tmp_path / "p.yaml"
    import_hf(hf_dir, ckpt, config_out=params)
    with read_checkpoint(ckpt) as c:
        model = DictNode(
            [
                (
                    r.name.removeprefix("model."),
                    TensorLeaf(r.leaf.dtype, r.leaf.shape, MemoryData(r.leaf.data.read())),
                )
                for r in iter_leaves(c.root.get("model"))
            ]
        )
    model.items.append(
        ("extra.adapter.weight", TensorLeaf("float32", (2,), MemoryData(np.zeros(2, np.float32))))
    )
    extra = tmp_path / "extra.mdl"
    write_checkpoint(DictNode([("model", model)]), extra, "2.10")
    with pytest.raises(UnsupportedContentError) as err:
        export(extra, tmp_path / "x", config=params)
    line = _one_line(err.value)
    assert "extra.adapter.weight" in line and "--drop-unmatched-keys" in line
    assert not (tmp_path / "x").exists()
    result = export(extra, tmp_path / "x", config=params, drop_unmatched_keys=True)
    assert list(result.dropped) == ["extra.adapter.weight"]


def test_unknown_model_type_on_import(tmp_path: Path):
    hf_dir, _ = _tiny(tmp_path)
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "mystery", ["MysteryForCausalLM"]
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError) as err:
        import_hf(hf_dir, tmp_path / "m.mdl")
    line = _one_line(err.value)  # (not "--model": no name takes a config of another type)
    assert "model_type 'mystery' has no Hugging Face rules here" in line and "gpt2" in line
    with pytest.raises(UnsupportedContentError, match="model_type = 'mystery', not gpt2"):
        import_hf(hf_dir, tmp_path / "m.mdl", model="gpt2")


@pytest.mark.parametrize("sharded", [False, True])
def test_pytorch_model_bin_imports(tmp_path: Path, sharded: bool):
    hf_dir, model = _tiny(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "config.json").write_text((hf_dir / "config.json").read_text())
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    if sharded:
        keys = list(state)
        halves = {
            "pytorch_model-00001-of-00002.bin": keys[:10],
            "pytorch_model-00002-of-00002.bin": keys[10:],
        }
        for fname, part in halves.items():
            torch.save({k: state[k].clone() for k in part}, bin_dir / fname)
        weight_map = {k: f for f, part in halves.items() for k in part}
        (bin_dir / "pytorch_model.bin.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )
    else:  # as older transformers saved it: with the causal-mask buffers Model Zoo drops
        state = {k: v.clone() for k, v in state.items()}
        state["transformer.h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 32, 32, dtype=torch.uint8))
        state["transformer.h.0.attn.masked_bias"] = torch.tensor(-1e4)
        torch.save(state, bin_dir / "pytorch_model.bin")
    ckpt, params = tmp_path / "m.mdl", tmp_path / "p.yaml"
    result = import_hf(bin_dir, ckpt, config_out=params)
    buffers = [] if sharded else ["transformer.h.0.attn.bias", "transformer.h.0.attn.masked_bias"]
    assert sorted(result.dropped) == buffers
    export(ckpt, tmp_path / "back", config=params)
    assert _same(tmp_path / "back", hf_dir)


def _big_cs_checkpoint(path: Path, vocab: int, hidden: int = 64) -> int:
    """A GPT-2-shaped CS 2.10 checkpoint (one layer) whose embedding is ``vocab x hidden``."""
    rng = np.random.default_rng(0)
    h, f = hidden, 4 * hidden

    def t(*shape: int) -> TensorLeaf:
        return TensorLeaf("float32", shape, MemoryData(rng.standard_normal(shape, np.float32)))

    emb = t(vocab, h)
    items = [
        ("embedding_layer.word_embeddings.weight", emb),
        ("embedding_layer.position_embeddings.embed.weight", t(8, h)),
    ]
    pre = "transformer_decoder.layers.0."
    for x in ("q", "k", "v", "output"):
        items += [
            (f"{pre}self_attn.proj_{x}_dense_layer.weight", t(h, h)),
            (f"{pre}self_attn.proj_{x}_dense_layer.bias", t(h)),
        ]
    for n in ("norm1", "norm3"):
        items += [(f"{pre}{n}.weight", t(h)), (f"{pre}{n}.bias", t(h))]
    items += [
        (f"{pre}ffn.ffn.0.linear_layer.weight", t(f, h)),
        (f"{pre}ffn.ffn.0.linear_layer.bias", t(f)),
        (f"{pre}ffn.ffn.1.linear_layer.weight", t(h, f)),
        (f"{pre}ffn.ffn.1.linear_layer.bias", t(h)),
        ("transformer_decoder.norm.weight", t(h)),
        ("transformer_decoder.norm.bias", t(h)),
        ("lm_head.weight", emb),
    ]
    write_checkpoint(DictNode([("model", DictNode(items))]), path, "2.10")
    return emb.nbytes


def test_export_memory_stays_near_one_tensor(tmp_path: Path):
    ckpt = tmp_path / "big.mdl"
    largest = _big_cs_checkpoint(ckpt, vocab=262144)  # a 64 MiB embedding
    params = tmp_path / "p.yaml"
    params.write_text(
        "model:\n  vocab_size: 262144\n  hidden_size: 64\n  num_heads: 4\n"
        "  num_hidden_layers: 1\n  max_position_embeddings: 8\n  filter_size: 256\n"
    )
    tracemalloc.start()
    try:
        export(ckpt, tmp_path / "hf", config=params)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert largest == 64 << 20
    assert peak < 1.5 * largest, f"peak {peak / 2**20:.0f} MiB for a 64 MiB tensor"


def test_bfloat16_round_trip_and_dtype_cast(tmp_path: Path):
    hf_dir, model = _tiny(tmp_path)
    bf16 = tmp_path / "bf16"
    model.to(torch.bfloat16).save_pretrained(bf16)
    ckpt, params = tmp_path / "m.mdl", tmp_path / "p.yaml"
    import_hf(bf16, ckpt, config_out=params)
    with read_checkpoint(ckpt) as c:
        assert {r.leaf.dtype for r in iter_leaves(c.root)} == {"bfloat16"}
    export(ckpt, tmp_path / "back", config=params)
    assert _logits(tmp_path / "back").dtype == torch.bfloat16
    for d in (bf16, tmp_path / "back"):
        assert json.loads((d / "config.json").read_text())["dtype"] == "bfloat16"
    a = safetensors.torch.load_file(str(bf16 / "model.safetensors"))
    b = safetensors.torch.load_file(str(tmp_path / "back" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # float32 -> bfloat16 on export rounds as torch does; and back up to float32 exactly
    ckpt32, params32 = tmp_path / "f.mdl", tmp_path / "f.yaml"
    import_hf(hf_dir, ckpt32, config_out=params32)
    export(ckpt32, tmp_path / "cast", config=params32, dtype="bfloat16")
    c = safetensors.torch.load_file(str(tmp_path / "cast" / "model.safetensors"))
    f32 = safetensors.torch.load_file(str(hf_dir / "model.safetensors"))
    assert all(torch.equal(c[k], f32[k].to(torch.bfloat16)) for k in f32)
    export(ckpt, tmp_path / "up", config=params, dtype="float32")
    up = safetensors.torch.load_file(str(tmp_path / "up" / "model.safetensors"))
    assert all(torch.equal(up[k], a[k].to(torch.float32)) for k in a)


@pytest.mark.parametrize("tied", [True, False])
def test_headless(tmp_path: Path, tied: bool):
    hf_dir, model = _tiny(tmp_path, tied)
    ckpt, params = tmp_path / "m.mdl", tmp_path / "p.yaml"
    import_hf(hf_dir, ckpt, config_out=params)
    out = tmp_path / "headless"
    result = export(ckpt, out, model="gpt2-headless", config=params)
    assert list(result.dropped) == ([] if tied else ["lm_head.weight"])
    body = transformers.GPT2Model.from_pretrained(out).eval()
    ids = torch.tensor([[2, 7, 1, 8]])
    with torch.no_grad():
        assert torch.equal(body(ids).last_hidden_state, model.transformer(ids).last_hidden_state)
    # and a GPT2Model directory imports (lm_head: the embeddings when tied, else initialised)
    again = tmp_path / "again.mdl"
    assert import_hf(out, again).model == "gpt2-headless"
    with read_checkpoint(again) as c:
        leaves = {r.name: r.leaf for r in iter_leaves(c.root)}
        head = leaves["model.lm_head.weight"].data.read()
        wte = leaves["model.embedding_layer.word_embeddings.weight"].data.read()
    assert np.array_equal(head, wte) == tied


def test_the_pieces_of_a_fused_tensor_read_it_once():
    """Q, K and V cut from one c_attn come one after another: one read, kept read-only, and
    dropped once another tensor is read."""
    reads: list[str] = []
    read = LastRead(lambda name: reads.append(name) or np.arange(6.0))
    first = read("c_attn")
    assert read("c_attn") is first and not first.flags.writeable
    read("c_proj")
    read("c_attn")
    assert reads == ["c_attn", "c_proj", "c_attn"]


def test_the_read_back_names_a_shard_that_cannot_be_read(tmp_path: Path):
    """``safetensors_io.verify`` of shards of which one has gone (or cannot be opened) names
    that file in a verification error, not an internal one."""
    from ckpt_migrate.errors import VerificationError

    planned = [st.Entry(f"w{i}", "float32", (4, 4)) for i in range(6)]
    arrays = [(e.name, np.full((4, 4), i, np.float32)) for i, e in enumerate(planned)]
    written = st.write_stream(tmp_path, planned, iter(arrays), max_shard_size=100)
    assert len(written.files) > 2  # (several shards, and the index)
    st.verify(tmp_path, written)
    (tmp_path / written.files[1]).unlink()
    with pytest.raises(VerificationError, match=rf"{written.files[1]}.*cannot be read back"):
        st.verify(tmp_path, written)


def test_pytorch_model_bin_of_torch_before_1_6_imports(tmp_path: Path):
    """torch.save's format before 1.6 (a pickle, not a zip: how the first Hub models were saved,
    and transformers still loads them) was refused: torch maps only the zip format."""
    hf_dir, model = _tiny(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "config.json").write_text((hf_dir / "config.json").read_text())
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    torch.save(state, bin_dir / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(bin_dir / "pytorch_model.bin")
    ckpt, params = tmp_path / "m.mdl", tmp_path / "p.yaml"
    import_hf(bin_dir, ckpt, config_out=params)
    export(ckpt, tmp_path / "back", config=params)
    assert _same(tmp_path / "back", hf_dir)


def test_an_imports_tensors_let_go_of_what_they_are_built_from_once_written(
    tmp_path: Path, monkeypatch
):
    """Each tensor of an import is built once, as it is written; the rule it was built by and
    the reader of the safetensors entries are then let go, not held through the read-back
    (at 150k tensors they and the entries they reach were about 130 MB of the peak, issue
    33). A tensor whose build fails keeps them, and its description names its inputs."""
    from ckpt_migrate.hf import import_ as imp
    from ckpt_migrate.hf.mapping import Out

    hf_dir, _ = _tiny(tmp_path)  # (written by transformers' save_pretrained)
    trees: list = []
    real = imp.write_checkpoint
    monkeypatch.setattr(
        imp, "write_checkpoint", lambda root, *a, **k: trees.append(root) or real(root, *a, **k)
    )
    import_hf(hf_dir, tmp_path / "m.mdl")
    built = {id(r.leaf.data): r.leaf.data for r in iter_leaves(trees[0])}.values()
    assert len(built) > 20
    assert all(isinstance(b, imp.Built) and b.out is b.stored is None for b in built)
    first = next(iter(built))
    assert first.describe() == f"{first.name}, built and written"
    with pytest.raises(RuntimeError, match="already written"):
        first.read()

    def broken(x):
        raise ValueError("no")

    failing = imp.Built(Out("w", ("h.w",), broken), lambda n: np.zeros(2), "float32", "float32")
    with pytest.raises(ValueError):
        failing.read()
    assert failing.describe() == "w from h.w"


def test_config_fields_the_import_leaves_out_are_named(tmp_path: Path):
    """A model transformers saved with its own token ids and a field of someone's: the import
    left them out of the CS config, said nothing (``warnings == []``), and the export gave
    transformers' defaults back (bos/eos ``50256``, the field gone). Each is now named in one
    line; the model's name and the tensors' dtype, which the import reads, are not."""
    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
        intermediate_size=128, num_key_value_heads=2, bos_token_id=5, eos_token_id=[6, 7],
        pad_token_id=0,
    )  # fmt: skip
    hf_dir = tmp_path / "hf"
    transformers.LlamaForCausalLM(cfg).save_pretrained(hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, "my_custom_field": 1}))
    imported = import_hf(hf_dir, tmp_path / "m.mdl")
    [line] = [w for w in imported.warnings if "no place for" in w]
    assert "bos_token_id=5" in line and "eos_token_id=[6, 7]" in line and "pad_token_id=0" in line
    assert "my_custom_field=1" in line
    for read in ("architectures", "dtype", "transformers_version", "hidden_size", "model_type"):
        assert f" {read}=" not in line, read
