"""The model fixtures upgraded across releases: exact keys, bit-identical tensors, real loads.

The expected key lists and renames are written by hand from MODELZOO_HISTORY.md §3.5 (the CS
key names used since 1.7 and the 2.0→2.1 rows), not computed by the code under test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import CKPT, MODELS, ROOT, run_cli
from digest import digest
from real_cstorch import real_digest, requires_real_cstorch

import ckpt_migrate as cm
from ckpt_migrate.cli import commands
from ckpt_migrate.format.compare import tensor_sha256
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import DictNode, MemoryData, TensorLeaf, ValueLeaf, iter_leaves
from ckpt_migrate.format.write import write_checkpoint

L0 = "transformer_decoder.layers.0"

# GPT-2 at 2.0 (gpt2_hf_cs.py names; 1.x GPT-2 also keeps ln_f, tied to transformer_decoder.norm)
GPT2_2_0 = [
    "embedding_layer.word_embeddings.weight",
    "embedding_layer.position_embeddings.weight",
    "ln_f.weight",
    "ln_f.bias",
    f"{L0}.self_attn.proj_q_dense_layer.weight",
    f"{L0}.self_attn.proj_q_dense_layer.bias",
    f"{L0}.self_attn.proj_k_dense_layer.weight",
    f"{L0}.self_attn.proj_k_dense_layer.bias",
    f"{L0}.self_attn.proj_v_dense_layer.weight",
    f"{L0}.self_attn.proj_v_dense_layer.bias",
    f"{L0}.self_attn.proj_output_dense_layer.weight",
    f"{L0}.self_attn.proj_output_dense_layer.bias",
    f"{L0}.norm1.weight",
    f"{L0}.norm1.bias",
    f"{L0}.norm3.weight",
    f"{L0}.norm3.bias",
    f"{L0}.ffn.ffn.0.linear_layer.weight",
    f"{L0}.ffn.ffn.0.linear_layer.bias",
    f"{L0}.ffn.ffn.1.linear_layer.weight",
    f"{L0}.ffn.ffn.1.linear_layer.bias",
    "transformer_decoder.norm.weight",
    "transformer_decoder.norm.bias",
    "lm_head.weight",
]
GPT2_RENAMES = {
    "embedding_layer.position_embeddings.weight": "embedding_layer.position_embeddings.embed.weight"
}
GPT2_TIES = {  # 2.10 key -> the key it is tied to
    "transformer_decoder.norm.weight": "ln_f.weight",
    "transformer_decoder.norm.bias": "ln_f.bias",
    "lm_head.weight": "embedding_layer.word_embeddings.weight",
}


def _t5_layer(stack: str, cross: bool) -> list[str]:
    keys = []
    for attn in ("self_attn", "multihead_attn") if cross else ("self_attn",):
        keys += [f"{stack}.layers.0.{attn}.proj_{p}_dense_layer.weight" for p in "qkv"]
        keys += [f"{stack}.layers.0.{attn}.proj_output_dense_layer.weight"]
        keys += [f"{stack}.layers.0.norm{1 if attn == 'self_attn' else 2}.weight"]
    keys += [f"{stack}.layers.0.ffn.ffn.0.linear_layer.weight"]
    keys += [f"{stack}.layers.0.ffn.ffn.1.linear_layer.weight"]
    keys += [f"{stack}.layers.0.norm{3 if cross else 2}.weight", f"{stack}.norm.weight"]
    return keys


# T5 at 2.0 (t5.py names and 2.0's registration order)
T5_2_0 = [
    "encoder_embeddings.word_embeddings.weight",
    "decoder_embeddings.word_embeddings.weight",
    "relative_position_encoder.relative_attention_bias.weight",
    "relative_position_decoder.relative_attention_bias.weight",
    *_t5_layer("encoder", cross=False),
    *_t5_layer("decoder", cross=True),
    "lm_head.weight",
]
T5_RENAMES = {
    "relative_position_encoder.relative_attention_bias.weight": (
        "encoder_embeddings.position_embed_helper.relative_attention_bias.weight"
    ),
    "relative_position_decoder.relative_attention_bias.weight": (
        "decoder_embeddings.position_embed_helper.relative_attention_bias.weight"
    ),
}
T5_TIES = {
    "decoder_embeddings.word_embeddings.weight": "encoder_embeddings.word_embeddings.weight",
    "lm_head.weight": "encoder_embeddings.word_embeddings.weight",
}
BERT_RENAMES = {
    "bert_encoder.embedding_layer.position_embeddings.weight": (
        "bert_encoder.embedding_layer.position_embeddings.embed.weight"
    )
}
EXPECTED = {"gpt2": GPT2_RENAMES, "t5": T5_RENAMES, "bert": BERT_RENAMES, "llama": {}}


def upgrade(src: Path, out: Path, *args: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        "upgrade",
        "--drop-dataloader-state",
        str(src),
        "--output-dir",
        str(out),
        "--json",
        *args,
    ]
    proc = run_cli(*cmd)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return json.loads(proc.stdout)


def model_leaves(path: Path) -> tuple[list[str], dict]:
    """(model keys without the ``model.`` prefix, leaf name -> leaf) of a checkpoint."""
    with read_checkpoint(path) as ckpt:
        keys = [k.removeprefix("model.") for k, _ in ckpt.root.get("model").items]
        leaves = {r.name: r.leaf for r in iter_leaves(ckpt.root)}
        return keys, {n: (leaf, _hash(leaf)) for n, leaf in leaves.items()}


def _hash(leaf):
    return tensor_sha256(leaf) if isinstance(leaf, TensorLeaf) else None


def test_fixtures_are_what_make_model_fixtures_writes(tmp_path):
    scripts = str(ROOT / "scripts")
    sys.path.insert(0, scripts)
    try:
        import make_model_fixtures
    finally:  # (not ``pop(0)``: the script may put the project's root before it)
        sys.path.remove(scripts)
    from ckpt_migrate.format.compare import signature

    for family in make_model_fixtures.FAMILIES:
        for release in make_model_fixtures.RELEASES:
            fresh = make_model_fixtures.write_fixture(family, release, tmp_path)
            committed = MODELS / f"{family}-{release}" / CKPT
            with read_checkpoint(fresh) as a, read_checkpoint(committed) as b:
                assert a.release.name == b.release.name == release
                assert signature(a.root, hash_tensors=True) == signature(
                    b.root, hash_tensors=True
                ), f"{family}-{release}: rerun scripts/make_model_fixtures.py --force"
            assert (committed.parent / "params.yaml").is_file()


@pytest.mark.parametrize(("family", "keys"), [("gpt2", GPT2_2_0), ("t5", T5_2_0)])
def test_fixture_keys_are_the_real_names(family, keys):
    got, _ = model_leaves(MODELS / f"{family}-2.0" / CKPT)
    assert got == keys


@pytest.mark.parametrize(
    ("family", "keys", "renames", "ties"),
    [("gpt2", GPT2_2_0, GPT2_RENAMES, GPT2_TIES), ("t5", T5_2_0, T5_RENAMES, T5_TIES)],
)
def test_2_0_to_2_10_renames_exactly_and_keeps_every_tensor(tmp_path, family, keys, renames, ties):
    src = MODELS / f"{family}-2.0" / CKPT
    res = upgrade(src, tmp_path)
    out = tmp_path / CKPT
    assert res["from_release"] == "2.0" and res["to_release"] == "2.10"
    assert res["family"] == family and res["model"]["source"] == "detected"
    got, after = model_leaves(out)
    assert got == [renames.get(k, k) for k in keys]  # same order, exactly the table's renames
    _, before = model_leaves(src)
    for key in keys:  # every tensor bit-identical to the one at its 2.0 key
        assert after[f"model.model.{renames.get(key, key)}"][1] == before[f"model.model.{key}"][1]
    for key, partner in ties.items():  # ties are still one tensor
        assert after[f"model.model.{key}"][0] is after[f"model.model.{partner}"][0]
    # everything outside the renamed keys is identical (optimizer, scheduler, step)
    diffs = commands.verify(src, out)["differences"]
    renamed = {f"model.model.{k}" for k in renames} | {f"model.model.{v}" for v in renames.values()}
    assert {d["name"] for d in diffs} == renamed
    rename_lines = [c for c in res["changes"] if " → model." in c]
    assert len(rename_lines) == len(renames)
    assert not [w for w in res["warnings"] if "key tables" in w]  # no unknown keys


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "t5"])
def test_1_9_to_2_0_gives_the_2_0_fixture(tmp_path, family):
    """1.9 and 2.0 fixtures hold the same tensors; 1.9 misses the tied names and has stale
    scheduler values. Upgrading 1.9 to 2.0 must give exactly the 2.0 file."""
    src = MODELS / f"{family}-1.9" / CKPT
    config = MODELS / f"{family}-1.9" / "params.yaml"
    upgrade(src, tmp_path, "--to", "2.0", "--config", str(config))
    diff = commands.verify(tmp_path / CKPT, MODELS / f"{family}-2.0" / CKPT)
    assert diff["identical"], diff["differences"]


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "t5"])
def test_1_9_to_2_10_in_one_run(tmp_path, family):
    src = MODELS / f"{family}-1.9" / CKPT
    res = upgrade(src, tmp_path)
    assert len(res["hops"]) == 11 and res["family"] == family
    got, _ = model_leaves(tmp_path / CKPT)
    expected, _ = model_leaves(MODELS / f"{family}-2.0" / CKPT)
    assert got == [EXPECTED[family].get(k, k) for k in expected]


def test_renames_stay_metadata_only_in_a_copy_patch_upgrade(tmp_path):
    """With tensors large enough for copy-patch, a renamed tensor's dataset is moved, not
    copied: index verification proves it is the source's stored object, full verification
    re-hashes it."""
    rng = np.random.default_rng(7)

    def big(*shape):
        return TensorLeaf("float32", shape, MemoryData(rng.standard_normal(shape).astype("<f4")))

    word = big(512, 256)
    model = DictNode(
        [
            ("model.embedding_layer.word_embeddings.weight", word),
            ("model.embedding_layer.position_embeddings.weight", big(512, 256)),
            (f"model.{L0}.self_attn.proj_q_dense_layer.weight", big(256, 256)),
            (f"model.{L0}.self_attn.proj_q_dense_layer.bias", big(256)),
            (f"model.{L0}.norm1.weight", big(256)),
            (f"model.{L0}.norm1.bias", big(256)),
            (f"model.{L0}.norm3.weight", big(256)),
            (f"model.{L0}.ffn.ffn.0.linear_layer.weight", big(256, 256)),
            (f"model.{L0}.ffn.ffn.0.linear_layer.bias", big(256)),
            ("model.lm_head.weight", word),
        ],
        ordered=True,
    )
    src = tmp_path / CKPT
    write_checkpoint(DictNode([("model", model), ("global_step", ValueLeaf(1))]), src, "2.0")
    for mode in ("index", "full"):
        res = upgrade(src, tmp_path / mode, "--verify", mode)
        assert res["strategy"] == "copy-patch" and res["verified"] == mode
        _, after = model_leaves(tmp_path / mode / CKPT)
        _, before = model_leaves(src)
        new = "model.model.embedding_layer.position_embeddings.embed.weight"
        assert after[new][1] == before["model.model.embedding_layer.position_embeddings.weight"][1]
        assert (
            after["model.model.lm_head.weight"][0]
            is after["model.model.embedding_layer.word_embeddings.weight"][0]
        )


@requires_real_cstorch()
def test_real_library_loads_the_upgraded_fixtures(tmp_path):
    outputs = {}
    for family, expected in (("gpt2", GPT2_2_0), ("t5", T5_2_0)):
        for release in ("1.9", "2.0"):
            out = tmp_path / f"{family}-{release}"
            upgrade(MODELS / f"{family}-{release}" / CKPT, out)
            outputs[out / CKPT] = [EXPECTED[family].get(k, k) for k in expected]
    results = real_digest(list(outputs))
    for path, keys in outputs.items():
        result = results[path]
        assert result["ok"], f"{path}: {result.get('error')}"
        theirs = result["digest"]
        assert theirs == digest(cm.load(path)), path
        model = next(node for _, key, node in theirs["root"]["items"] if key == "model")
        assert [key.removeprefix("model.") for _, key, _ in model["items"]] == keys
