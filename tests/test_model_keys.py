"""Model-key steps: patterns on whole segments, the per-release rename tables, order and ties.

Expected keys are written by hand from MODELZOO_HISTORY.md §3.5 (the 2.0→2.1 rows) and §3.8
(the 2.1→2.2 sparsity move), never computed with the code under test.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ckpt_migrate.errors import UnsupportedContentError
from ckpt_migrate.format.compare import tensor_sha256
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import (
    DictNode,
    MemoryData,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
    get_path,
    iter_leaves,
)
from ckpt_migrate.format.write import write_checkpoint
from ckpt_migrate.hops import graph
from ckpt_migrate.hops.hop import StepContext
from ckpt_migrate.models.detect import choose_family
from ckpt_migrate.models.keys import KeyPattern, KeyRename
from ckpt_migrate.models.steps import report_unknown_keys

L0 = "transformer_decoder.layers.0"


def tensor(*shape: int, fill: float = 0.0) -> TensorLeaf:
    return TensorLeaf("float32", shape, MemoryData(np.full(shape, fill, dtype="<f4")))


def run(source: str, root: DictNode, model: str | None = None, **inputs) -> StepContext:
    """Run the operations of the hop from ``source`` as the engine does."""
    hop = next(h for h in graph.load().hops if h.source == source)
    ctx = StepContext(root, None, dict(inputs), hop=hop)
    ctx.inputs["model_family"] = choose_family(root, model)
    for op in hop.operations:
        op(ctx)
    return ctx


def model_keys(root: DictNode) -> list[str]:
    return [k for k, _ in root.get("model").items]


def gpt2_model(prefix: str = "model.") -> DictNode:
    keys = [
        "embedding_layer.word_embeddings.weight",
        "embedding_layer.position_embeddings.weight",
        f"{L0}.self_attn.proj_q_dense_layer.weight",
        f"{L0}.self_attn.proj_q_dense_layer.bias",
        f"{L0}.norm1.weight",
        f"{L0}.norm1.bias",
        f"{L0}.norm3.weight",
        f"{L0}.norm3.bias",
        f"{L0}.ffn.ffn.0.linear_layer.weight",
        f"{L0}.ffn.ffn.0.linear_layer.bias",
        "transformer_decoder.norm.weight",
    ]
    items = [(prefix + k, tensor(2, 2, fill=i)) for i, k in enumerate(keys)]
    items.append((prefix + "lm_head.weight", items[0][1]))  # tied to the word embeddings
    return DictNode(items, ordered=True)


def adam(n: int) -> DictNode:
    state = DictNode([(i, DictNode([("exp_avg", tensor(2, 2))])) for i in range(n)])
    group = DictNode(
        [("lr", ValueLeaf(0.1)), ("params", SeqNode("list", list(map(ValueLeaf, range(n)))))]
    )
    return DictNode([("state", state), ("param_groups", SeqNode("list", [group]))])


# --------------------------------------------------------------------------- patterns


def test_patterns_match_whole_segments():
    assert KeyPattern("lm_head.weight").match("lm_head.weight") == []
    assert KeyPattern("lm_head.weight").match("my_lm_head.weight") is None
    assert KeyPattern("lm_head.weight").match("lm_head.weight.extra") is None
    assert KeyPattern("a.b").match("aXb") is None  # '.' is no wildcard
    layer = KeyPattern("transformer_decoder.layers.#.norm1.bias")
    assert layer.match("transformer_decoder.layers.12.norm1.bias") == ["12"]
    assert layer.match("transformer_decoder.layers.x.norm1.bias") is None
    proj = KeyPattern("self_attn.proj_{q,k}_dense_layer.{weight,bias}")
    assert proj.match("self_attn.proj_k_dense_layer.bias") == ["k", "bias"]
    assert proj.match("self_attn.proj_v_dense_layer.bias") is None
    assert KeyPattern("linear_layer{,_for_glu}").match("linear_layer") == [""]
    rest = KeyPattern("relative_pe_helper.**")
    assert rest.match("relative_pe_helper.a.b") == ["a.b"]
    assert rest.match("relative_pe_helper") == [""]
    assert KeyPattern("*.x").match("anything.x") == ["anything"]


def test_rename_keeps_the_optional_model_prefix():
    rule = KeyRename("{bert_encoder,bert}.p", "$1.q", ("bert",), "why")
    assert rule.apply("bert.p") == "bert.q"
    assert rule.apply("model.bert_encoder.p") == "model.bert_encoder.q"
    assert rule.apply("model.other.p") is None


# --------------------------------------------------------------------------- 2.0 → 2.1 tables

# (family, 2.0 key, 2.1 key): MODELZOO_HISTORY.md §3.5, the 2.0→2.1 rows, written by hand.
PE = "embedding_layer.position_embeddings"
HELPER = "embedding_layer.position_embed_helper"
BIAS = "relative_attention_bias"
RENAMES_2_1 = [
    ("gpt2", f"{PE}.weight", f"{PE}.embed.weight"),
    ("gpt2", PE, f"{PE}.fpe"),
    ("gpt2", f"relative_pe_helper.{BIAS}.weight", f"{HELPER}.{BIAS}.weight"),
    ("gpt2", "relative_pe_helper.slopes", f"{HELPER}.slopes"),
    ("bloom", "relative_pe_helper.slopes", f"{HELPER}.slopes"),
    ("falcon", PE, f"{PE}.fpe"),
    ("llama", f"{PE}.weight", f"{PE}.embed.weight"),
    ("gptj", f"relative_pe_helper.{BIAS}.bias", f"{HELPER}.{BIAS}.bias"),
    ("bert", f"bert_encoder.{PE}.weight", f"bert_encoder.{PE}.embed.weight"),
    ("bert", f"bert.{PE}", f"bert.{PE}.fpe"),
    (
        "t5",
        "encoder_embeddings.position_embeddings.weight",
        "encoder_embeddings.position_embeddings.embed.weight",
    ),
    ("t5", "decoder_embeddings.position_embeddings", "decoder_embeddings.position_embeddings.fpe"),
    (
        "t5",
        f"relative_position_encoder.{BIAS}.weight",
        f"encoder_embeddings.position_embed_helper.{BIAS}.weight",
    ),
    (
        "t5",
        f"relative_position_decoder.{BIAS}.weight",
        f"decoder_embeddings.position_embed_helper.{BIAS}.weight",
    ),
]


@pytest.mark.parametrize("prefix", ["", "model."])
@pytest.mark.parametrize(("family", "old", "new"), RENAMES_2_1)
def test_2_0_to_2_1_renames(family, old, new, prefix):
    leaf = tensor(3)
    root = DictNode([("model", DictNode([("other.weight", tensor(1)), (prefix + old, leaf)]))])
    ctx = run("2.0", root, model=family)
    assert model_keys(root) == ["other.weight", prefix + new]
    assert root.get("model").get(prefix + new) is leaf  # moved, not copied
    assert any(f"model.{prefix}{old} → model.{prefix}{new}" in c for c in ctx.changes)


@pytest.mark.parametrize(
    ("family", "key"),
    [
        ("bert", "relative_pe_helper.slopes"),  # BERT: only the two position-embedding rules
        ("bert", "embedding_layer.position_embeddings.weight"),  # BERT keys sit under bert_encoder
        ("gpt2", "encoder_embeddings.position_embeddings.weight"),  # a T5 rule
        ("t5", "embedding_layer.position_embeddings.weight"),  # a GPT rule
        ("gpt2", "my_embedding_layer.position_embeddings.weight"),  # not a whole segment
        ("gpt2", "decoder.embedding_layer.position_embeddings.weight"),  # not at the model root
        ("gpt2", "embedding_layer.position_embeddings.embed.weight"),  # already 2.1
    ],
)
def test_2_0_to_2_1_leaves_other_keys_alone(family, key):
    root = DictNode([("model", DictNode([(key, tensor(1))]))])
    ctx = run("2.0", root, model=family)
    assert model_keys(root) == [key]
    assert not ctx.changes


def test_renames_keep_ties_and_data_objects():
    model = gpt2_model()
    pos = model.get("model.embedding_layer.position_embeddings.weight")
    model.items.append(("model.extra_alias", pos))  # the same tensor at a second key
    root = DictNode([("model", model), ("optimizer", adam(11))])
    run("2.0", root, model="gpt2")
    new = root.get("model")
    assert new.get("model.embedding_layer.position_embeddings.embed.weight") is pos
    assert new.get("model.extra_alias") is pos
    assert new.get("model.lm_head.weight") is new.get(
        "model.embedding_layer.word_embeddings.weight"
    )
    assert get_path(root, ("optimizer",)) is root.get("optimizer")  # optimizer untouched


def test_unknown_model_is_not_renamed_and_the_report_says_so():
    root = DictNode(
        [("model", DictNode([("embedding_layer.position_embeddings.weight", tensor(1))]))]
    )
    ctx = run("2.0", root)  # no decoder layers: no family can be told
    assert model_keys(root) == ["embedding_layer.position_embeddings.weight"]
    assert not ctx.changes
    (warning,) = [w for w in ctx.warnings if "position-embedding" in w]
    assert "model family unknown" in warning and "--model" in warning and "gpt2" in warning


def test_unknown_model_without_matching_keys_is_not_warned_about():
    """No key matches any family's rules: nothing can be missed, so nothing is said."""
    root = DictNode([("model", DictNode([("fc.weight", tensor(1))]))])
    ctx = run("2.0", root)
    assert not [w for w in ctx.warnings if "model family unknown" in w], ctx.warnings
    assert model_keys(root) == ["fc.weight"]


# --------------------------------------------------------------------------- order, collisions


def t5_untied_root(with_optimizer: bool) -> DictNode:
    keys = [
        "encoder_embeddings.word_embeddings.weight",
        "decoder_embeddings.word_embeddings.weight",  # its own tensor: not shared
        "relative_position_encoder.relative_attention_bias.weight",
        "relative_position_decoder.relative_attention_bias.weight",
        "encoder.layers.0.self_attn.proj_q_dense_layer.weight",
        "decoder.layers.0.multihead_attn.proj_q_dense_layer.weight",
    ]
    model = DictNode([(f"model.{k}", tensor(2, i + 1)) for i, k in enumerate(keys)], ordered=True)
    items = [("model", model)]
    if with_optimizer:
        items.append(("optimizer", adam(len(keys))))
    return DictNode(items)


def test_rename_that_reorders_parameters_is_refused_with_indexed_optimizer_state():
    # 2.1 moves the decoder's relative bias into decoder_embeddings, so with untied embeddings
    # it comes before the encoder's in parameters(): optimizer index 2 would change tensor.
    root = t5_untied_root(with_optimizer=True)
    before = model_keys(root)
    with pytest.raises(UnsupportedContentError) as info:
        run("2.0", root, model="t5")
    message = str(info.value)
    assert "parameter order" in message and "optimizer" in message and "\n" not in message
    assert "relative_position_encoder" in message
    assert model_keys(root) == before  # nothing half-renamed


def test_reorder_without_optimizer_state_is_allowed_and_reported():
    root = t5_untied_root(with_optimizer=False)
    ctx = run("2.0", root, model="t5")
    assert "model.encoder_embeddings.position_embed_helper.relative_attention_bias.weight" in (
        model_keys(root)
    )
    assert any("parameter order" in c and "nothing is misaligned" in c for c in ctx.changes)


def test_shared_embeddings_keep_the_parameter_order():
    # The real T5 (shared embeddings): the decoder embedding is the encoder's tensor, so the
    # helpers land where the relative biases were: no reorder, the optimizer stays aligned.
    root = t5_untied_root(with_optimizer=True)
    model = root.get("model")
    shared = model.items[0][1]
    model.items[1] = (model.items[1][0], shared)
    run("2.0", root, model="t5")
    assert "model.decoder_embeddings.position_embed_helper.relative_attention_bias.weight" in (
        model_keys(root)
    )


def test_gpt_helper_registered_after_the_decoder_is_refused():
    model = gpt2_model()
    model.items.append(("model.relative_pe_helper.relative_attention_bias.weight", tensor(4, 2)))
    root = DictNode([("model", model), ("optimizer", adam(12))])
    with pytest.raises(UnsupportedContentError, match="parameter order"):
        run("2.0", root, model="gpt2")


def test_gpt_helper_right_after_the_embeddings_keeps_the_order():
    model = gpt2_model()
    model.items.insert(2, ("model.relative_pe_helper.slopes", tensor(2, 1)))
    root = DictNode([("model", model), ("optimizer", adam(12))])
    run("2.0", root, model="gpt2")
    assert model_keys(root)[2] == "model.embedding_layer.position_embed_helper.slopes"


def test_rename_onto_an_existing_key_is_refused():
    model = DictNode(
        [
            ("embedding_layer.position_embeddings.weight", tensor(1)),
            ("embedding_layer.position_embeddings.embed.weight", tensor(1)),
        ]
    )
    with pytest.raises(UnsupportedContentError, match="would both be named"):
        run("2.0", DictNode([("model", model)]), model="gpt2")


def test_sparsity_state_names_follow_the_renamed_weight():
    model = gpt2_model(prefix="")
    mask = TensorLeaf("bool", (2, 2), MemoryData(np.ones((2, 2), dtype=bool)))
    old = f"{PE}.weight"
    names = SeqNode("list", [ValueLeaf(old)])
    sparsity = DictNode(
        [
            ("state", DictNode([(old, DictNode([("mask", mask)]))])),
            ("param_groups", SeqNode("list", [DictNode([("param_names", names)])])),
        ]
    )
    root = DictNode([("model", model), ("optimizer", DictNode([("sparsity", sparsity)]))])
    run("2.0", root, model="gpt2")
    new = "embedding_layer.position_embeddings.embed.weight"
    assert sparsity.get("state").keys() == [new]
    names = get_path(sparsity, ("param_groups", 0, "param_names"))
    assert [leaf.value for leaf in names.items] == [new]


# --------------------------------------------------------------------------- unknown keys


def _with_unknown() -> DictNode:
    model = gpt2_model()
    model.items.append(("model.adapter.scale", tensor(2)))
    return DictNode([("model", model)])


def test_unknown_keys_are_listed_and_kept():
    root = _with_unknown()
    ctx = StepContext(root, None, {"model_family": choose_family(root)})
    report_unknown_keys(ctx)
    assert "model.adapter.scale" in model_keys(root)
    (warning,) = ctx.warnings
    assert "model.adapter.scale" in warning and "kept unchanged" in warning and "gpt2" in warning


def test_unknown_keys_dropped_only_on_request_and_never_under_indexed_optimizer():
    root = _with_unknown()
    ctx = StepContext(
        root, None, {"model_family": choose_family(root), "drop_unmatched_keys": True}
    )
    report_unknown_keys(ctx)
    assert "model.adapter.scale" not in model_keys(root)
    assert any("model.model.adapter.scale: dropped" in c for c in ctx.changes)
    root = _with_unknown()
    root.items.append(("optimizer", adam(12)))
    ctx = StepContext(
        root, None, {"model_family": choose_family(root), "drop_unmatched_keys": True}
    )
    with pytest.raises(UnsupportedContentError, match="parameter index"):
        report_unknown_keys(ctx)
    assert "model.adapter.scale" in model_keys(root)


def test_sparsity_masks_are_known_keys():
    model = gpt2_model()
    model.items.append((f"model.{L0}.ffn.ffn.0.linear_layer.weight_mask", tensor(2, 2)))
    root = DictNode([("model", model)])
    ctx = StepContext(root, None, {"model_family": choose_family(root)})
    report_unknown_keys(ctx)
    assert ctx.warnings == []


# --------------------------------------------------------------------------- 1.7 → 1.8


def test_unprefixed_1_7_keys_are_kept():
    root = DictNode([("model", gpt2_model(prefix=""))])
    before = model_keys(root)
    ctx = run("1.7", root)
    assert model_keys(root) == before
    assert root.get("state_version") is None  # not added without the prefix
    assert not ctx.changes and not ctx.warnings


def test_prefixed_keys_need_no_note_and_a_mix_is_warned_about():
    root = DictNode([("model", gpt2_model())])
    ctx = run("1.7", root)
    assert not ctx.changes and not ctx.warnings
    model = gpt2_model()
    model.items.append(("fc.weight", tensor(1)))
    ctx = run("1.7", DictNode([("model", model)]))
    assert any("carry the 1.8 'model.' prefix" in w for w in ctx.warnings)


# --------------------------------------------------------------------------- 2.1 → 2.2


def _sparse_root() -> tuple[DictNode, dict[str, TensorLeaf]]:
    masks = {
        n: TensorLeaf("bool", (2, 2), MemoryData(np.array([[1, 0], [0, 1]], dtype=bool) ^ (i == 1)))
        for i, n in enumerate(["fc", "out", "gone"])
    }
    model = DictNode(
        [
            ("model.fc.weight", tensor(2, 2, fill=1)),
            ("model.fc.bias", tensor(2, fill=2)),
            ("model.out.weight", tensor(2, 2, fill=3)),
        ],
        ordered=True,
    )
    step = TensorLeaf("int64", (), MemoryData(np.array(7, dtype="<i8")))
    names = ["model.fc.weight", "model.out.weight"]
    sparsity = DictNode(
        [
            (
                "state",
                DictNode(
                    [
                        ("model.fc.weight", DictNode([("mask", masks["fc"])])),
                        ("out.weight", DictNode([("mask", masks["out"])])),  # no model. prefix
                        ("model.gone.weight", DictNode([("mask", masks["gone"])])),
                    ]
                ),
            ),
            ("step", step),
            (
                "param_groups",
                SeqNode(
                    "list",
                    [
                        DictNode(
                            [
                                ("param_names", SeqNode("list", [ValueLeaf(n) for n in names])),
                                ("sparsity", DictNode([("step", step)])),
                                ("init_method", ValueLeaf("random")),
                            ]
                        )
                    ],
                ),
            ),
        ]
    )  # fmt: skip
    optimizer = adam(3)
    optimizer.items.append(("sparsity", sparsity))
    root = DictNode([("model", model), ("optimizer", optimizer), ("global_step", ValueLeaf(7))])
    return root, masks


def test_2_1_to_2_2_moves_masks_into_the_model():
    root, masks = _sparse_root()
    get_path(root, ("optimizer", "sparsity", "state")).pop("model.gone.weight")
    ctx = run("2.1", root)
    model = root.get("model")
    assert model_keys(root) == [
        "model.fc.weight",
        "model.fc.weight_mask",
        "model.fc.bias",
        "model.out.weight",
        "model.out.weight_mask",
    ]
    assert model.get("model.fc.weight_mask") is masks["fc"]
    assert model.get("model.out.weight_mask") is masks["out"]
    sparsity = root.get("sparsity")
    assert sparsity.keys() == ["step", "sparsity"]
    schedule = sparsity.get("sparsity")
    assert schedule.keys() == ["model.fc.weight", "model.out.weight"]
    assert get_path(schedule, ("model.fc.weight", "index")) is sparsity.get("step")
    assert root.get("optimizer").get("sparsity") is None
    assert any("init_method = 'random': removed" in c for c in ctx.changes)
    assert get_path(root, ("optimizer", "state", 0, "exp_avg")) is not None  # Adam untouched


def test_2_1_to_2_2_refuses_a_mask_whose_weight_the_model_lacks():
    """Kept in ``optimizer.sparsity``, such a mask made Model Zoo's own 2.2→2.3 converter fail:
    its ``post_checkpoint_convert`` reads ``optimizer.sparsity.param_groups`` (Model Zoo tag
    Release_2.3.0, src/cerebras/modelzoo/tools/checkpoint_converters/base_converter.py line
    812). So the upgrade refuses, naming the entry and the opt-in."""
    root, _ = _sparse_root()
    with pytest.raises(UnsupportedContentError) as err:
        run("2.1", root)
    assert "optimizer.sparsity.state.model.gone.weight" in str(err.value)
    assert "its weight is not in the model" in str(err.value)
    assert "--drop-orphan-sparsity" in str(err.value)


def test_2_1_to_2_2_drops_an_orphan_mask_with_the_opt_in_and_says_so():
    root, masks = _sparse_root()
    ctx = run("2.1", root, drop_orphan_sparsity=True)
    assert root.get("optimizer").get("sparsity") is None  # nothing left for 2.3's hook to trip on
    assert "model.gone.weight_mask" not in model_keys(root)
    assert root.get("model").get("model.out.weight_mask") is masks["out"]
    assert any(
        "optimizer.sparsity.state.model.gone.weight: dropped (--drop-orphan-sparsity" in w
        for w in ctx.warnings
    )


def test_2_1_to_2_2_refuses_per_weight_state_beside_the_mask():
    root, _ = _sparse_root()
    state = get_path(root, ("optimizer", "sparsity", "state"))
    state.pop("model.gone.weight")
    state.get("model.fc.weight").items.append(("age", ValueLeaf(3)))
    with pytest.raises(UnsupportedContentError, match=r"model\.fc\.weight\.age \(2\.2 keeps only"):
        run("2.1", root)


def test_2_1_to_2_2_removes_the_optimizer_sparsity_when_everything_moved():
    root, _ = _sparse_root()
    state = get_path(root, ("optimizer", "sparsity", "state"))
    state.pop("model.gone.weight")
    ctx = run("2.1", root)
    assert root.get("optimizer").get("sparsity") is None
    assert any("optimizer.sparsity: removed" in c for c in ctx.changes)


def test_2_1_to_2_2_refuses_a_checkpoint_with_both_layouts():
    root, _ = _sparse_root()
    root.items.append(("sparsity", DictNode([])))
    with pytest.raises(UnsupportedContentError, match=r"both a 2\.1 optimizer\.sparsity"):
        run("2.1", root)


def test_sparse_2_1_file_upgrades_with_bit_identical_masks(tmp_path):
    root, _ = _sparse_root()
    src = tmp_path / "sparse.mdl"
    write_checkpoint(root, src, "2.1")
    out = tmp_path / "out"
    out.mkdir()
    args = ["upgrade", str(src), "--output-dir", str(out), "--json"]
    refused = subprocess.run(
        [sys.executable, "-m", "ckpt_migrate", *args], capture_output=True, text=True
    )
    assert refused.returncode == 2 and "--drop-orphan-sparsity" in refused.stdout
    assert not (out / src.name).exists()
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_migrate", *args, "--drop-orphan-sparsity"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["to_release"] == "2.10"
    with read_checkpoint(src) as a, read_checkpoint(out / src.name) as b:
        before = {r.name: r.leaf for r in iter_leaves(a.root)}
        after = {r.name: r.leaf for r in iter_leaves(b.root)}
        pairs = {
            "model.model.fc.weight_mask": "optimizer.sparsity.state.model.fc.weight.mask",
            "model.model.out.weight_mask": "optimizer.sparsity.state.out.weight.mask",
            "sparsity.step": "optimizer.sparsity.step",
        }
        for new, old in pairs.items():
            assert tensor_sha256(after[new]) == tensor_sha256(before[old]), new
        assert "optimizer.sparsity.param_groups.0.init_method" not in after
        assert not any(name.startswith("optimizer.sparsity") for name in after)
