"""The Model Zoo names whose Hugging Face side is a directory of model directories (issue #35
item 1): Dragon+ (``q_encoder/`` + ``ctx_encoder/``, two ``BertModel`` s), LLaVA and MM-Simple
LLaVA (``image_model/``, a ``CLIPVisionModel``, + ``text_model/``, the original LLaVA code's
``LlavaLlamaForCausalLM``). Model Zoo, tag Release_2.10.0: ``dragon_plus.py``, ``llava.py``,
``mm_simple.py`` over ``base_converter.py``'s ``*_UnpackedHF_PackedCS`` classes.

Tiny random ``transformers`` models go HF -> import -> export (bit for bit back) and CS ->
export -> import (bit for bit back); every exported directory loads with ``from_pretrained``
with no missing or unexpected key; the CS names and config are Model Zoo's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import one_line_error, run_cli
from test_hf_end_to_end import _tensors
from test_hf_more_families import CLIP

from ckpt_migrate.config import yaml_edit
from ckpt_migrate.config.context import ConfigContext
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import iter_leaves
from ckpt_migrate.hf import safetensors_io as st
from ckpt_migrate.hf.export import export
from ckpt_migrate.hf.import_ import import_hf

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

BERT = transformers.BertConfig(
    vocab_size=50,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=40,
)


class LlavaConfig(transformers.LlamaConfig):
    """The LLaVA code's text config (``llava/model/language_model/llava_llama.py``): LLaMA's
    with the ``mm_*`` fields; ``model_type`` as Model Zoo writes it (llava.py line 708)."""

    model_type = "llava"


class LlavaLlamaModel(transformers.LlamaModel):
    """LLaMA + ``mm_projector`` (LLaVA's ``multimodal_projector/builder.py``: ``mlp<N>x_gelu``
    is ``Linear, GELU, Linear, ...``)."""

    def __init__(self, config):
        super().__init__(config)
        count = int(re.fullmatch(r"mlp(\d+)x_gelu", config.mm_projector_type).group(1))
        layers = [torch.nn.Linear(config.mm_hidden_size, config.hidden_size)]
        for _ in range(count - 1):
            layers += [torch.nn.GELU(), torch.nn.Linear(config.hidden_size, config.hidden_size)]
        self.mm_projector = torch.nn.Sequential(*layers)


class LlavaLlamaForCausalLM(transformers.LlamaForCausalLM):
    config_class = LlavaConfig

    def __init__(self, config):
        super().__init__(config)
        self.model = LlavaLlamaModel(config)
        self.post_init()


def _llava_text(projector: str = "mlp2x_gelu") -> LlavaConfig:
    return LlavaConfig(
        vocab_size=64,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        mm_projector_type=projector,
        mm_hidden_size=CLIP.hidden_size,
        mm_vision_select_layer=-2,
        mm_vision_select_feature="patch",
        tune_mm_mlp_adapter=False,
        mm_use_im_start_end=False,
        mm_use_im_patch_token=False,
    )


def _save_dragon(directory: Path) -> dict:
    torch.manual_seed(0)
    models = {}
    for part in ("q_encoder", "ctx_encoder"):
        models[part] = transformers.BertModel(BERT, add_pooling_layer=False).eval()
        models[part].save_pretrained(directory / part)
    return models


def _save_llava(directory: Path, projector: str = "mlp2x_gelu") -> dict:
    torch.manual_seed(0)
    image = transformers.CLIPVisionModel(CLIP).eval()
    image.save_pretrained(directory / "image_model")
    # Model Zoo's layout (llava.py line 57) and transformers 4's: ``vision_model.`` names
    file = directory / "image_model" / "model.safetensors"
    tensors = {"vision_model." + n: t for n, t in safetensors_torch.load_file(file).items()}
    safetensors_torch.save_file(tensors, file, metadata={"format": "pt"})
    text = LlavaLlamaForCausalLM(_llava_text(projector)).eval()
    text.save_pretrained(directory / "text_model")
    return {"image_model": image, "text_model": text}


def _cs(path: Path) -> dict[str, np.ndarray]:
    with read_checkpoint(path) as ckpt:
        return {r.name: r.leaf.data.read() for r in iter_leaves(ckpt.root.get("model"))}


def _model_config(params: Path) -> dict:
    data, _ = yaml_edit.load(params.read_text(), params)
    return dict(yaml_edit.plain(ConfigContext(data).model_sections()[0][1]))


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    for key, value in a.items():
        assert b[key].dtype == value.dtype and np.array_equal(b[key], value), key


def _both_ways(tmp: Path, name: str, parts: tuple[str, ...]) -> tuple[Path, Path, Path]:
    """HF -> CS -> HF and that CS -> HF -> CS, bit for bit; returns (CS, params, exported)."""
    ckpt, params, back = tmp / "m.mdl", tmp / "params.yaml", tmp / "back"
    import_hf(tmp / "hf", ckpt, model=name, config_out=params)
    result = export(ckpt, back, model=name, config=params)
    assert sorted(result.files) == sorted(
        f"{p}/{f}" for p in parts for f in ("config.json", "model.safetensors")
    )
    assert {p.name for p in back.iterdir()} == set(parts)  # nothing else, no temporary left
    assert not [p for p in tmp.iterdir() if p.name.startswith(".")]
    for part in parts:
        _same(_tensors(tmp / "hf" / part), _tensors(back / part))
    again = tmp / "again.mdl"
    import_hf(back, again, model=name)
    _same(_cs(ckpt), _cs(again))
    return ckpt, params, back


def _reload(cls, directory: Path, **kw):
    model, info = cls.from_pretrained(directory, output_loading_info=True, **kw)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def test_dragon_round_trip_loads_and_computes_the_same(tmp_path):
    models = _save_dragon(tmp_path / "hf")
    ckpt, params, back = _both_ways(tmp_path, "dragon", ("q_encoder", "ctx_encoder"))
    ids = torch.tensor([[1, 5, 7, 2]])
    for part, model in models.items():
        reloaded = _reload(transformers.BertModel, back / part, add_pooling_layer=False)
        assert json.loads((back / part / "config.json").read_text())["architectures"] == [
            "BertModel"
        ]
        with torch.no_grad():
            assert torch.equal(reloaded(ids).last_hidden_state, model(ids).last_hidden_state)
    cs = _cs(ckpt)
    # dragon_plus.py lines 113-222 over bert.py lines 82-242 and 1238-1254
    layer = "transformer_encoder.layers.1."
    for prefix in ("question_encoder.", "ctx_encoder."):
        for name in (
            "embedding_layer.word_embeddings.weight",
            "embedding_layer.position_embeddings.embed.weight",
            "embedding_layer.segment_embeddings.weight",
            "embed_ln_f.weight",
            layer + "self_attn.proj_q_dense_layer.weight",
            layer + "self_attn.proj_output_dense_layer.bias",
            layer + "norm1.weight",
            layer + "ffn.ffn.0.linear_layer.weight",
            layer + "ffn.ffn.1.linear_layer.bias",
            layer + "norm2.bias",
        ):
            assert prefix + name in cs, prefix + name
    assert len(cs) == 2 * 37
    config = _model_config(params)
    # dragon_plus.py lines 355-371: two BERT sections and the bi-encoder's own fields
    assert config["q_encoder"]["hidden_size"] == 32 == config["ctx_encoder"]["hidden_size"]
    assert config["pooler_type"] == "cls" and config["use_biencoder"] is True
    assert config["q_encoder"]["pooler_nonlinearity"] == "tanh"


def test_dragon_pooler_is_dropped_both_ways(tmp_path):
    """dragon_plus.py lines 85-91 and 117-120: Model Zoo drops the pooler on either side."""
    torch.manual_seed(0)
    for part in ("q_encoder", "ctx_encoder"):
        transformers.BertModel(BERT).save_pretrained(tmp_path / "hf" / part)
    result = import_hf(tmp_path / "hf", tmp_path / "m.mdl", model="dragon")
    assert set(result.dropped) == {
        f"{p}/pooler.dense.{w}" for p in ("q_encoder", "ctx_encoder") for w in ("weight", "bias")
    }
    assert not [n for n in _cs(tmp_path / "m.mdl") if "pooler" in n]


def test_llava_round_trip_loads_in_llavas_classes(tmp_path):
    models = _save_llava(tmp_path / "hf")
    ckpt, params, back = _both_ways(tmp_path, "llava", ("image_model", "text_model"))
    image = _reload(transformers.CLIPVisionModel, back / "image_model")
    text = _reload(LlavaLlamaForCausalLM, back / "text_model")
    pixels, ids = torch.randn(1, 3, 16, 16), torch.tensor([[1, 5, 7, 2]])
    features = torch.randn(1, 3, CLIP.hidden_size)
    with torch.no_grad():
        assert torch.equal(
            image(pixels).last_hidden_state, models["image_model"](pixels).last_hidden_state
        )
        assert torch.equal(text(ids).logits, models["text_model"](ids).logits)
        assert torch.equal(
            text.model.mm_projector(features), models["text_model"].model.mm_projector(features)
        )
    cs = _cs(ckpt)
    hf_text = _tensors(tmp_path / "hf" / "text_model")
    # llava.py lines 135-191: nn.Sequential slot 2i is the CS FFN's linear i
    for i, slot in ((0, 0), (1, 2)):
        for w in ("weight", "bias"):
            cs_name = f"projector_image_model.ffn.{i}.linear_layer.{w}"
            assert np.array_equal(cs[cs_name], hf_text[f"model.mm_projector.{slot}.{w}"])
    # llava.py lines 57 and 121-134: the tower under image_model., LLaMA under text_model.
    assert "image_model.embedding_layer.cls_embedding" in cs
    assert "image_model.encoder.transformer_encoder.layers.1.norm2.weight" in cs
    assert "text_model.lm_head.weight" in cs
    assert "text_model.embedding_layer.word_embeddings.weight" in cs
    assert not [n for n in cs if n.startswith("vit_model.") or "classifier" in n]
    config = _model_config(params)
    # llava.py lines 396-406 and 492-539
    assert config["image_model"]["name"] == "ViTModel"
    assert config["text_model"]["name"] == "LlamaModel"
    assert config["projector"]["image_model"] == {
        "name": "FeedForwardNetwork",
        "input_unit": 32,
        "layers_units": [48, 48],
        "layers_activation": ["gelu", None],
        "use_bias": True,
    }
    assert config["freeze"] == ["^image_model"]
    assert config["image_feature_select_layer_idx"] == -2
    assert config["image_start_idx"] == 1 and config["loss_scaling"] == "num_tokens"
    text_json = json.loads((back / "text_model" / "config.json").read_text())
    assert text_json["architectures"] == ["LlavaLlamaForCausalLM"]
    assert text_json["model_type"] == "llava" and text_json["mm_projector_type"] == "mlp2x_gelu"
    assert text_json["mm_hidden_size"] == 32 and text_json["mm_vision_select_layer"] == -2


def test_llava_reads_transformers_5_tower_names(tmp_path):
    """transformers 5 saves a ``CLIPVisionModel`` without ``vision_model.`` (and loads either):
    the same CS checkpoint as from Model Zoo's spelling."""
    _save_llava(tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "a.mdl", model="llava")
    torch.manual_seed(0)
    transformers.CLIPVisionModel(CLIP).save_pretrained(tmp_path / "hf" / "image_model")
    assert not [n for n in _tensors(tmp_path / "hf" / "image_model") if "vision_model" in n]
    import_hf(tmp_path / "hf", tmp_path / "b.mdl", model="llava")
    _same(_cs(tmp_path / "a.mdl"), _cs(tmp_path / "b.mdl"))
    # a tower saved with its projection: the projection is dropped (llava.py lines 61-74)
    transformers.CLIPVisionModelWithProjection(CLIP).save_pretrained(
        tmp_path / "hf" / "image_model"
    )
    result = import_hf(tmp_path / "hf", tmp_path / "c.mdl", model="llava")
    assert set(result.dropped) == {"image_model/visual_projection.weight"}
    assert _cs(tmp_path / "c.mdl").keys() == _cs(tmp_path / "a.mdl").keys()


def test_mmsimple_llava_round_trip_and_layout(tmp_path):
    models = _save_llava(tmp_path / "hf", "mlp3x_gelu")
    ckpt, params, back = _both_ways(tmp_path, "mmsimple-llava", ("image_model", "text_model"))
    _reload(transformers.CLIPVisionModel, back / "image_model")
    text = _reload(LlavaLlamaForCausalLM, back / "text_model")
    ids = torch.tensor([[3, 1, 4]])
    with torch.no_grad():
        assert torch.equal(text(ids).logits, models["text_model"](ids).logits)
    cs = _cs(ckpt)
    # mm_simple.py lines 50-144
    assert "image_model.image_model_list.0.0.embedding_layer.cls_embedding" in cs
    assert "image_model.projection.ffn.2.linear_layer.weight" in cs
    assert "text_model.lm_head.weight" in cs
    config = _model_config(params)
    # mm_simple.py lines 405-452 (and save, lines 324-330: no image_model section)
    assert "image_model" not in config and "image_start_idx" not in config
    images = config["image_model_list"]
    encoder = images["image_models"][0]["image_encoder"]
    assert encoder["name"] == "ViTModel" and encoder["image_layer_idx"] == -2
    assert images["image_feature_select_mode"] == "patch"
    assert images["global_image_projection"]["layers_units"] == [48, 48, 48]


def test_directories_are_found_or_named(tmp_path):
    """Without --model, Dragon's sub-directories name it; LLaVA's fit two names."""
    _save_dragon(tmp_path / "dragon")
    proc = run_cli("import-hf", tmp_path / "dragon", tmp_path / "d.mdl", "-q")
    assert proc.returncode == 0, proc.stderr
    _save_llava(tmp_path / "llava")
    proc = run_cli("import-hf", tmp_path / "llava", tmp_path / "l.mdl")
    one_line_error(proc, 2, "llava and mmsimple-llava", "--model llava")


def test_a_failed_export_leaves_nothing(tmp_path, monkeypatch):
    """The directories are written inside one temporary directory renamed at the end: a
    failure in the second leaves no output and no temporary."""
    _save_dragon(tmp_path / "hf")
    params = tmp_path / "params.yaml"
    import_hf(tmp_path / "hf", tmp_path / "m.mdl", model="dragon", config_out=params)
    calls = []
    real = st.verify

    def failing(directory, written):
        calls.append(directory.name)
        if len(calls) == 2:
            raise OSError(5, "disk gone")
        return real(directory, written)

    monkeypatch.setattr(st, "verify", failing)
    with pytest.raises(Exception, match="write failed"):
        export(tmp_path / "m.mdl", tmp_path / "out", model="dragon", config=params)
    assert calls == ["q_encoder", "ctx_encoder"]
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_llava_text_model_without_llava_parts_is_named(tmp_path):
    """A plain LLaMA as text_model/: Model Zoo assumes mm_hidden_size 64 (llava.py line 685)
    and starts the projector from random values (lines 280-312); ours names what is missing."""
    _save_llava(tmp_path / "hf")
    file = tmp_path / "hf" / "text_model" / "model.safetensors"
    tensors = safetensors_torch.load_file(file)
    plain = {n: t for n, t in tensors.items() if "mm_projector" not in n}
    safetensors_torch.save_file(plain, file, metadata={"format": "pt"})
    config = tmp_path / "hf" / "text_model" / "config.json"
    fields = json.loads(config.read_text())
    proc = run_cli("import-hf", tmp_path / "hf", tmp_path / "m.mdl", "--model", "llava")
    one_line_error(proc, 2, "no LLaVA projector", "model.mm_projector", "llava.py")
    config.write_text(json.dumps({k: v for k, v in fields.items() if k != "mm_hidden_size"}))
    with pytest.raises(Exception, match=r"mm_hidden_size: text_model/config\.json lacks"):
        import_hf(tmp_path / "hf", tmp_path / "m.mdl", model="llava")
    assert not (tmp_path / "m.mdl").exists()


def test_a_part_config_may_not_buy_layers(tmp_path):
    """A part's config is checked as a model's is: no layer count beyond the file's tensors."""
    _save_dragon(tmp_path / "hf")
    config = tmp_path / "hf" / "ctx_encoder" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "num_hidden_layers": 10**9}))
    with pytest.raises(Exception, match="num_hidden_layers is 1000000000, but the model has 74"):
        import_hf(tmp_path / "hf", tmp_path / "m.mdl", model="dragon")


def test_a_config_without_a_part_section_is_named(tmp_path):
    _save_dragon(tmp_path / "hf")
    params = tmp_path / "params.yaml"
    import_hf(tmp_path / "hf", tmp_path / "m.mdl", model="dragon", config_out=params)
    data, _ = yaml_edit.load(params.read_text(), params)
    del ConfigContext(data).model_sections()[0][1]["ctx_encoder"]
    params.write_text(yaml_edit.dump(data, yaml_edit.guess_style("")))
    with pytest.raises(Exception, match="dragon: the model config has no ctx_encoder section"):
        export(tmp_path / "m.mdl", tmp_path / "out", model="dragon", config=params)
    assert not (tmp_path / "out").exists()


def test_one_given_config_for_a_model_of_sub_directories_is_refused(tmp_path):
    """``import_hf(config=...)`` names one config.json; a Dragon+ is read from each
    sub-directory's own, so a given one is refused rather than silently ignored."""
    from ckpt_migrate.errors import UsageError
    from ckpt_migrate.hf.import_ import import_hf

    _save_dragon(tmp_path / "dragon")
    given = tmp_path / "dragon" / "q_encoder" / "config.json"
    with pytest.raises(UsageError, match=r"sub-directories \(q_encoder, ctx_encoder\)"):
        import_hf(tmp_path / "dragon", tmp_path / "d.mdl", model="dragon", config=given)
    assert not (tmp_path / "d.mdl").exists()


def test_every_file_of_every_sub_directory_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    """The published directory is durable all the way down: each part's shards and
    ``config.json``, and each sub-directory, are fsynced before the rename."""
    from ckpt_migrate.hf import outdir

    _save_dragon(tmp_path / "hf")
    params = tmp_path / "params.yaml"
    import_hf(tmp_path / "hf", tmp_path / "m.mdl", model="dragon", config_out=params)
    real = outdir.fsync_path
    seen: list[Path] = []
    monkeypatch.setattr(outdir, "fsync_path", lambda p: (seen.append(Path(p)), real(p))[1])
    monkeypatch.setattr(outdir, "fsync_dir", lambda p: (seen.append(Path(p)), real(p))[1])
    export(tmp_path / "m.mdl", tmp_path / "out", model="dragon", config=params)
    out = tmp_path / "out"
    tmp = next(p for p in seen if p.name.startswith(".out.") and p.name.endswith(".tmp"))
    synced_names = {p.relative_to(tmp) for p in seen if p != tmp and tmp in p.parents}
    on_disk = {p.relative_to(out) for p in out.rglob("*")}
    assert on_disk == synced_names
    assert {Path("q_encoder/config.json"), Path("ctx_encoder"), Path("q_encoder")} <= on_disk


def test_the_plan_is_let_go_of_before_the_last_directory_is_read_back(tmp_path, monkeypatch):
    """The tensors of every directory come from one generator, which holds the plan and the
    source tensors: the last directory takes whatever it has left, so that the writer's ask
    for one more ends it before that directory is read back (issue 33). Dragon+ from two
    ``save_pretrained`` BERTs: the plan is alive while the first directory is read back (the
    second's tensors are still to come), gone at the second."""
    import gc

    from ckpt_migrate.hf.mapping import Out

    _save_dragon(tmp_path / "hf")
    params = tmp_path / "params.yaml"
    import_hf(tmp_path / "hf", tmp_path / "m.mdl", model="dragon", config_out=params)
    alive: list[tuple[str, bool]] = []
    real = st.verify

    def verify(directory, written):
        gc.collect()
        alive.append((directory.name, any(isinstance(o, Out) for o in gc.get_objects())))
        return real(directory, written)

    monkeypatch.setattr(st, "verify", verify)
    export(tmp_path / "m.mdl", tmp_path / "out", model="dragon", config=params)
    assert alive == [("q_encoder", True), ("ctx_encoder", False)]
