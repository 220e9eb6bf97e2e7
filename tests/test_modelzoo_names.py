"""Issue #20, part B: every model name Model Zoo 2.10's converter knows is accepted by
``--model``, listed by ``convert_checkpoint.py list``, and converted (checkpoint and config)
from 2.0 through every hop to 2.10 on a tiny generated model of its family, then back down to
2.3 (and, once per family, the checkpoint to 2.0).

The 54 names: tag Release_2.10.0, src/cerebras/modelzoo/tools/checkpoint_converters/
registry.py, the keys of ``converters`` (lines 173-316) and the aliases below it (lines
319-333).
"""

from __future__ import annotations

import sys

import pytest
import yaml
from conftest import ROOT

from ckpt_migrate.cli.commands import verify
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import DictNode
from ckpt_migrate.format.write import write_checkpoint
from ckpt_migrate.models.detect import detect_family
from ckpt_migrate.models.names import GPT_STYLE, KEYLESS, MODELZOO_NAMES, resolve_name

sys.path.insert(0, str(ROOT / "scripts"))
try:
    import convert_checkpoint as cc
    import make_model_fixtures as mmf
finally:
    sys.path.pop(0)

MODELZOO_2_10 = [
    "bert",
    "bert-sequence-classifier",
    "bert-token-classifier",
    "bert-summarization",
    "bert-qa",
    "bloom",
    "bloom-headless",
    "btlm",
    "btlm-headless",
    "clip-vit",
    "codegen",
    "codegen-headless",
    "esm-2",
    "dpo",
    "dragon",
    "falcon",
    "falcon-headless",
    "gemma2",
    "gpt2",
    "gpt2-headless",
    "gptj",
    "gptj-headless",
    "gpt-neox",
    "gpt-neox-headless",
    "jais",
    "llama",
    "llama-headless",
    "llava",
    "mmsimple-llava",
    "mistral",
    "mistral-headless",
    "mixtral",
    "mixtral-headless",
    "roberta",
    "santacoder",
    "santacoder-headless",
    "starcoder",
    "starcoder-headless",
    "t5",
    "ul2",
    "flan-ul2",
    "transformer",
    "llamaV2",
    "llamaV2-headless",
    "code-llama",
    "code-llama-headless",
    "octocoder",
    "octocoder-headless",
    "wizardcoder",
    "wizardcoder-headless",
    "sqlcoder",
    "sqlcoder-headless",
    "wizardlm",
    "wizardlm-headless",
]
# The tiny model of each family's key layout (keyless families: a small vision-style model).
LAYOUT = {
    **{f: "gpt2" for f in GPT_STYLE},
    **{f: "llama" for f in ("llama", "mistral", "mixtral", "gemma2")},
    "bert": "bert",
    "t5": "t5",
}


def test_the_table_holds_exactly_model_zoo_2_10s_54_names():
    assert len(MODELZOO_2_10) == 54
    assert [m.name for m in MODELZOO_NAMES] == MODELZOO_2_10
    for name in MODELZOO_2_10:
        assert resolve_name(name)[0] == next(m.family for m in MODELZOO_NAMES if m.name == name)


def test_list_shows_all_54_names(capsys):
    assert cc.main(["list", "--hide-notes"]) == 0
    out = capsys.readouterr().out
    listed = [line.split(":", 1)[0] for line in out.splitlines() if not line.startswith(" ")]
    assert listed[:54] == MODELZOO_2_10
    assert out.count("without lm_head") == sum(n.endswith("-headless") for n in MODELZOO_2_10)


def _tiny_model(family: str, headless: bool) -> DictNode:
    if family in KEYLESS:
        tree = mmf.build_tree("gpt2", "2.0")
        model = tree.get("model")
        model.items = [(k.replace("model.", "model.encoder."), v) for k, v in model.items]
    else:
        tree = mmf.build_tree(LAYOUT[family], "2.0")
        model = tree.get("model")
    if headless:
        model.items = [(k, v) for k, v in model.items if ".lm_head." not in f".{k}"]
    return tree


def _config(family: str) -> str:
    model = {"hidden_size": 4, "num_hidden_layers": 1, "vocab_size": 10}
    if family == "t5":
        model = {"d_model": 4, "encoder_num_hidden_layers": 1, "src_vocab_size": 10}
    doc = {
        "train_input": {"data_processor": "GptHDF5MapDataProcessor", "batch_size": 8},
        "model": {**model, "mixed_precision": True, "use_bfloat16": True},
        "optimizer": {"optimizer_type": "AdamW", "learning_rate": 2e-5, "weight_decay_rate": 0.01},
        "runconfig": {"max_steps": 10, "checkpoint_steps": 5},
    }
    return yaml.safe_dump(doc, sort_keys=False)


FIRST_OF_FAMILY = {m.family: m for m in reversed(MODELZOO_NAMES)}
# The checkpoint's keys depend on the family and on whether it is headless, not on the name: the
# checkpoint legs run once per pair, the config legs (which write the name) for every name.
FIRST_OF_LAYOUT = {(m.family, m.headless): m for m in reversed(MODELZOO_NAMES)}


@pytest.mark.parametrize("model", MODELZOO_NAMES, ids=lambda m: m.name)
def test_convert_and_convert_config_from_2_0_to_2_10(model, tmp_path, capsys):
    """Every hop from 2.0 to 2.10 for the name's family: the 2.0→2.1 key renames where the
    family has them, the model-independent steps for all, and a 2.10 config whose model name is
    Model Zoo's registry name (asked for, not guessed, where Model Zoo has none)."""
    config = tmp_path / "params.yaml"
    config.write_text(_config(model.family))
    args = ["--model", model.name, "--src-fmt", "cs-2.0", "--tgt-fmt", "cs-2.10"]
    back = ["--model", model.name, "--src-fmt", "cs-2.10", "--tgt-fmt", "cs-2.3"]
    only, only_down = tmp_path / "config-only", tmp_path / "config-only-down"
    assert cc.main(["convert-config", str(config), *args, "--output-dir", str(only)]) == 0
    config_2_10 = only / "params_to_cs-2.10.yaml"
    assert cc.main(["convert-config", str(config_2_10), *back, "--output-dir", str(only_down)]) == 0
    capsys.readouterr()
    done = yaml.safe_load(config_2_10.read_text())
    init = done["trainer"]["init"]
    assert init.get("model", {}).get("name") == model.registry
    assert init["precision"] == {"enabled": True, "fp16_type": "bfloat16"}
    down_config = yaml.safe_load((only_down / "params_to_cs-2.10_to_cs-2.3.yaml").read_text())
    assert "name" not in down_config["trainer"]["init"].get("model", {})
    if model is not FIRST_OF_LAYOUT[(model.family, model.headless)]:
        return

    src = tmp_path / f"{model.name}.mdl"
    write_checkpoint(_tiny_model(model.family, model.headless), src, "2.0")
    out = tmp_path / "out"
    convert = ["convert", str(src), *args, "--config", str(config), "--output-dir", str(out)]
    assert cc.main(convert) == 0
    capsys.readouterr()
    with read_checkpoint(out / f"{model.name}_to_cs-2.10.mdl") as ckpt:
        assert ckpt.release.name == "2.10"
        keys = [k for k, _ in ckpt.root.get("model").items]
    renamed = "model.embedding_layer.position_embeddings.embed.weight"
    if LAYOUT.get(model.family) == "gpt2":
        assert renamed in keys and "model.embedding_layer.position_embeddings.weight" not in keys
    if model.headless:
        assert not any(k.endswith("lm_head.weight") for k in keys)
    assert (out / "params_to_cs-2.10.yaml").read_text() == config_2_10.read_text()

    # and down again, as far as the hops can be undone: checkpoint and config to 2.3, the
    # checkpoint alone to 2.0, where it equals the original leaf for leaf
    newest, down = out / f"{model.name}_to_cs-2.10.mdl", tmp_path / "down"
    assert (
        cc.main(
            ["convert", str(newest), *back, "--config", str(config_2_10), "--output-dir", str(down)]
        )
        == 0
    )
    capsys.readouterr()
    with read_checkpoint(down / f"{model.name}_to_cs-2.10_to_cs-2.3.mdl") as ckpt:
        assert ckpt.release.name == "2.3"
        assert [k for k, _ in ckpt.root.get("model").items] == keys
    assert (down / "params_to_cs-2.10_to_cs-2.3.yaml").read_text() == (
        only_down / "params_to_cs-2.10_to_cs-2.3.yaml"
    ).read_text()
    if model is not FIRST_OF_FAMILY[model.family]:
        return  # the 2.0 leg once per family: its backward steps are the family's
    oldest = UpgradeOptions(target="2.0", output_dir=tmp_path / "2.0", inputs={"model": model.name})
    assert upgrade(newest, oldest).status == "upgraded"
    # (but the __metadata__ list the script's conversions started, as Model Zoo's converter does)
    differences = verify(src, tmp_path / "2.0" / newest.name)["differences"]
    assert differences, "the __metadata__ list"
    assert all(d["name"].startswith("__metadata__.") for d in differences), differences


@pytest.mark.parametrize(
    ("layout", "expected"), [("mixtral", "mixtral"), ("gemma2", "gemma2"), ("llama", "llama")]
)
def test_mixtral_and_gemma2_are_told_apart_from_llama_by_their_keys(layout, expected):
    """Mixtral's MoE FFN (``ffn.gate``, ``ffn.experts.experts.<i>``) and Gemma 2's post-norms
    (``norm1_post``, ``norm3_post``): Release_2.10.0 checkpoint_converters/mixtral.py lines
    96-166, gemma2.py lines 118 and 141."""
    keys = [k for k, _ in mmf.build_tree("llama", "2.0").get("model").items]
    if layout == "mixtral":
        keys = [k for k in keys if ".ffn.ffn." not in k]
        keys += [
            "model.transformer_decoder.layers.0.ffn.gate.weight",
            "model.transformer_decoder.layers.0.ffn.experts.experts.0.ffn.0.linear_layer.weight",
        ]
    elif layout == "gemma2":
        keys += [
            "model.transformer_decoder.layers.0.norm1_post.weight",
            "model.transformer_decoder.layers.0.norm3_post.weight",
        ]
    guess = detect_family(keys)
    assert guess.family == expected and guess.confidence == 1.0, guess.evidence


def test_gpt_neox_has_its_own_registry_name(tmp_path):
    """Model Zoo's registry.yaml (2.4 and 2.10) lists ``gpt-neox`` (GPTNeoXModel) apart from
    ``gptj``, and its converter registry maps ``gpt-neox-headless`` to it (registry.py lines
    338-355): the HF -> CS config writes it, and a config saying it chooses NeoX's HF layout
    (NeoX and Falcon share their CS keys)."""
    from ckpt_migrate.hf.export import _detected_name
    from ckpt_migrate.models.detect import choose_family
    from ckpt_migrate.models.names import resolve_name

    assert resolve_name("gpt-neox") == ("gpt-neox", "gpt-neox")
    assert resolve_name("gpt-neox-headless") == ("gpt-neox", "gpt-neox")
    assert resolve_name("gptj") == ("gptj", "gptj")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from ckpt_migrate.hf.import_ import import_hf

    cfg = transformers.GPTNeoXConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        intermediate_size=128,
        vocab_size=96,
    )
    model = transformers.GPTNeoXForCausalLM(cfg)
    model.save_pretrained(tmp_path / "hf")
    ckpt, params = tmp_path / "m.mdl", tmp_path / "params.yaml"
    import_hf(tmp_path / "hf", ckpt, model="gpt-neox", config_out=params)
    text = params.read_text()
    assert "name: gpt-neox\n" in text
    with read_checkpoint(ckpt) as opened:
        family = choose_family(opened.root, None)
    assert _detected_name(family, ckpt, text, params) == "gpt-neox"
