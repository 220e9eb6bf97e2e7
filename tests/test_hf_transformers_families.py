"""Hugging Face directories written by the installed ``transformers`` (``save_pretrained`` of
tiny random models) through ``import-hf`` and ``export-hf`` as a user runs them: only the
directory and the params.yaml the import wrote, no ``--model``. The export must come back as
the same model class with the same tensors, bit for bit, and the same outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import one_line_error, run_cli

from ckpt_migrate.hf.export import export
from ckpt_migrate.hf.import_ import import_hf

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]])


def _saved(model, directory: Path):
    """``model`` with random (not the initial) weights, saved by ``save_pretrained``."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    model.eval().save_pretrained(directory)
    return model


def _tensors(directory: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update({k: v.numpy() for k, v in safetensors_torch.load_file(str(file)).items()})
    return out


def _outputs(model) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=IDS)
    return out.logits


def _round_trip(hf: Path, tmp_path: Path) -> Path:
    ckpt, params, back = tmp_path / "m.mdl", tmp_path / "params.yaml", tmp_path / "back"
    import_hf(hf, ckpt, config_out=params)
    export(ckpt, back, config=params)
    return back


@pytest.mark.parametrize("multi_query", [False, True])
def test_a_starcoder_export_is_a_starcoder_model_by_its_config(tmp_path, multi_query):
    """The params.yaml names ``starcoder``, whose keys are GPT-2's: exported as GPT-2 (MHA:
    Conv1D-transposed weights, another class) or refused on the K shape (MQA) before."""
    config = transformers.GPTBigCodeConfig(
        vocab_size=96, n_embd=64, n_layer=2, n_head=4, n_positions=64, multi_query=multi_query
    )
    model = _saved(transformers.GPTBigCodeForCausalLM(config), tmp_path / "hf")
    back = _round_trip(tmp_path / "hf", tmp_path)
    before, after = _tensors(tmp_path / "hf"), _tensors(back)
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert after[key].dtype == value.dtype and np.array_equal(after[key], value), key
    again = transformers.AutoModelForCausalLM.from_pretrained(back).eval()
    assert type(again) is transformers.GPTBigCodeForCausalLM
    assert again.config.multi_query is multi_query
    assert torch.equal(_outputs(again), _outputs(model))


def test_an_esm2_export_is_an_esm2_model_by_its_config(tmp_path):
    """The params.yaml names ``esm2``, whose keys are BERT's: refused before with "the keys are
    those of bert and of roberta … pass --model bert or --model roberta", neither right."""
    config = transformers.EsmConfig(
        vocab_size=33,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=66,
        pad_token_id=1,
        mask_token_id=32,
        position_embedding_type="rotary",
    )
    model = _saved(transformers.EsmForMaskedLM(config), tmp_path / "hf")
    back = _round_trip(tmp_path / "hf", tmp_path)
    again = transformers.AutoModelForMaskedLM.from_pretrained(back).eval()
    assert type(again) is transformers.EsmForMaskedLM
    assert torch.equal(_outputs(again), _outputs(model))


@pytest.mark.parametrize("kind", ["Llama", "Mistral", "Mixtral"])
def test_a_headless_llama_like_directory_is_told_by_its_class(tmp_path, kind):
    """``LlamaModel`` & co. save their tensors without ``model.``: their directory was taken
    for the LM-head model's and refused as "missing tensors: lm_head.weight,
    model.embed_tokens.weight, …" (``--model llama-headless`` was needed)."""
    config = getattr(transformers, f"{kind}Config")(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = _saved(getattr(transformers, f"{kind}Model")(config), tmp_path / "hf")
    ckpt, params, back = tmp_path / "m.mdl", tmp_path / "params.yaml", tmp_path / "back"
    imported = import_hf(tmp_path / "hf", ckpt, config_out=params)
    assert imported.model == f"{kind.lower()}-headless"
    export(ckpt, back, config=params, model=imported.model)
    before, after = _tensors(tmp_path / "hf"), _tensors(back)
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert np.array_equal(after[key], value), key
    again = getattr(transformers, f"{kind}Model").from_pretrained(back).eval()
    with torch.no_grad():
        want, got = model(input_ids=IDS), again(input_ids=IDS)
    assert torch.equal(got.last_hidden_state, want.last_hidden_state)


def test_a_falcon_of_one_norm_and_kv_groups_exports(tmp_path):
    """Falcon 11B's layout: the new decoder architecture with one layer norm
    (``num_ln_in_parallel_attn: 1``) and KV groups neither 1 nor one per head. It imported,
    and its export was refused: "use_untied_layer_norm: false needs num_kv_groups of 1 or
    num_heads in HF Falcon"."""
    config = transformers.FalconConfig(
        vocab_size=96,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        new_decoder_architecture=True,
        num_kv_heads=2,
        num_ln_in_parallel_attn=1,
    )
    model = _saved(transformers.FalconForCausalLM(config), tmp_path / "hf")
    back = _round_trip(tmp_path / "hf", tmp_path)
    before, after = _tensors(tmp_path / "hf"), _tensors(back)
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert np.array_equal(after[key], value), key
    again = transformers.FalconForCausalLM.from_pretrained(back).eval()
    assert again.config.new_decoder_architecture and again.config.num_kv_heads == 2
    assert again.config.num_ln_in_parallel_attn == 1
    assert torch.equal(_outputs(again), _outputs(model))


@pytest.mark.parametrize(
    ("cls", "served"),
    [("BertForMaskedLM", "BertForPreTraining"), ("LlamaForSequenceClassification", "LlamaModel")],
)
def test_a_class_no_rules_convert_is_named_in_the_refusal(tmp_path, cls, served):
    """A head class Model Zoo has no converter for: the refusal named only the tensors the
    ``model_type``'s rules missed ("HF tensor bert.pooler.dense.bias is missing (4 missing)",
    "missing tensors: lm_head.weight"), not that the class is the reason."""
    kind = "Bert" if cls.startswith("Bert") else "Llama"
    config = getattr(transformers, f"{kind}Config")(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    _saved(getattr(transformers, cls)(config), tmp_path / "hf")
    proc = run_cli("import-hf", tmp_path / "hf", tmp_path / "m.mdl", "-q")
    one_line_error(proc, None, "missing", f"architectures {cls}", served, skip_warnings=True)
    assert not (tmp_path / "m.mdl").exists()


@pytest.mark.parametrize("activation", ["gelu_pytorch_tanh", "gelu"])
def test_gemma2_tanh_gelu_is_imported_with_a_warning(tmp_path, activation):
    """Every Gemma 2 on the Hub says ``gelu_pytorch_tanh``; CS ``geglu`` is the exact GELU
    (Model Zoo's approximation). The import said nothing, and the CS model and the exported
    one compute other outputs (max 4.5e-4 on this model)."""
    config = transformers.Gemma2Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        hidden_activation=activation,
    )
    transformers.Gemma2ForCausalLM(config).save_pretrained(tmp_path / "hf")
    imported = import_hf(tmp_path / "hf", tmp_path / "m.mdl")
    noted = [w for w in imported.warnings if "imported approximately" in w]
    if activation == "gelu":
        assert noted == []
    else:
        assert len(noted) == 1 and "hidden_activation='gelu_pytorch_tanh'" in noted[0]
        assert "exact GELU" in noted[0]
