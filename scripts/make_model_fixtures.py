#!/usr/bin/env python
"""Write the small model checkpoints in ``fixtures/models/<family>-<release>/``.

    python scripts/make_model_fixtures.py [--out fixtures/models] [--force]

Each ``checkpoint_100.mdl`` is a tiny (hidden size 4, one layer) but complete training
checkpoint of one model family as its release saved it: the real Cerebras state-dict key names
in the model's registration order, with the ``model.`` prefix 1.8–2.0 saves carry (MODELZOO_
HISTORY.md §3.5), tied weights as ties, Adam state keyed by parameter index, a SequentialLR
scheduler and the global step. The 1.9 files lack the tied names a 1.x appliance save skipped
(§1.1) and carry a stale sub-scheduler ``last_epoch`` (§1.2), as real 1.9 files do.

Key names: GPT-2 from ``gpt2_hf_cs.py`` (HF→CS rules; 1.x GPT-2 also has ``ln_f`` tied to
``transformer_decoder.norm``), Llama from ``llama.py`` (gated FFN ``linear_layer_for_glu``,
RMSNorm without biases, untied ``lm_head``), BERT from ``bert.py`` (1.6→1.7 table: the
``bert_encoder``/``bert_mlm_head``/``bert_cls_head`` pre-training model, learned positions),
T5 from ``t5.py`` (relative position bias per stack, shared embeddings and ``lm_head``), all
under ``f1fd1e0:src/cerebras/modelzoo/tools/checkpoint_converters/`` as cited in §3.5. The
hand-written ``params.yaml`` beside each checkpoint is not generated here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckpt_migrate.format.tree import (  # noqa: E402
    DictNode,
    Leaf,
    MemoryData,
    MissingLeaf,
    Node,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
)
from ckpt_migrate.format.write import write_checkpoint  # noqa: E402

RELEASES = ("1.9", "2.0")
FAMILIES = ("gpt2", "llama", "bert", "t5")
STEP = 100
H, V, P, F, LAYERS, HEADS, BUCKETS = 4, 10, 6, 8, 1, 2, 4
CHECKPOINT = f"checkpoint_{STEP}.mdl"

# (key, shape, tied to an earlier key or None)
Param = tuple[str, tuple[int, ...], str | None]


def _linear(name: str, out: int, inp: int, bias: bool = True) -> list[Param]:
    params: list[Param] = [(f"{name}.weight", (out, inp), None)]
    if bias:
        params.append((f"{name}.bias", (out,), None))
    return params


def _norm(name: str, bias: bool = True) -> list[Param]:
    return [(f"{name}.weight", (H,), None), *([(f"{name}.bias", (H,), None)] if bias else [])]


def _attention(prefix: str, bias: bool) -> list[Param]:
    out: list[Param] = []
    for proj in ("q", "k", "v", "output"):
        out += _linear(f"{prefix}.proj_{proj}_dense_layer", H, H, bias)
    return out


def gpt2_params() -> list[Param]:
    """GPT2LMHeadModel (learned positions, LayerNorm, biases, lm_head tied to the embeddings)."""
    params: list[Param] = [
        ("embedding_layer.word_embeddings.weight", (V, H), None),
        ("embedding_layer.position_embeddings.weight", (P, H), None),
        *_norm("ln_f"),
    ]
    for i in range(LAYERS):
        layer = f"transformer_decoder.layers.{i}"
        params += _attention(f"{layer}.self_attn", bias=True)
        params += _norm(f"{layer}.norm1") + _norm(f"{layer}.norm3")
        params += _linear(f"{layer}.ffn.ffn.0.linear_layer", F, H)
        params += _linear(f"{layer}.ffn.ffn.1.linear_layer", H, F)
    params += [
        ("transformer_decoder.norm.weight", (H,), "ln_f.weight"),
        ("transformer_decoder.norm.bias", (H,), "ln_f.bias"),
        ("lm_head.weight", (V, H), "embedding_layer.word_embeddings.weight"),
    ]
    return params


def llama_params() -> list[Param]:
    """GPT2LMHeadModel configured as Llama: rotary (no position keys), RMSNorm, SwiGLU."""
    params: list[Param] = [("embedding_layer.word_embeddings.weight", (V, H), None)]
    params += _norm("ln_f", bias=False)
    for i in range(LAYERS):
        layer = f"transformer_decoder.layers.{i}"
        params += _attention(f"{layer}.self_attn", bias=False)
        params += _norm(f"{layer}.norm1", bias=False) + _norm(f"{layer}.norm3", bias=False)
        params += _linear(f"{layer}.ffn.ffn.0.linear_layer_for_glu", F, H, bias=False)
        params += _linear(f"{layer}.ffn.ffn.0.linear_layer", F, H, bias=False)
        params += _linear(f"{layer}.ffn.ffn.1.linear_layer", H, F, bias=False)
    params += [
        ("transformer_decoder.norm.weight", (H,), "ln_f.weight"),
        ("lm_head.weight", (V, H), None),  # Llama does not share embedding weights
    ]
    return params


def bert_params() -> list[Param]:
    """BertPretrainModel: encoder, pooler, MLM head (classifier tied to the embeddings), NSP."""
    enc = "bert_encoder"
    params: list[Param] = [
        (f"{enc}.embedding_layer.word_embeddings.weight", (V, H), None),
        (f"{enc}.embedding_layer.position_embeddings.weight", (P, H), None),
        (f"{enc}.embedding_layer.segment_embeddings.weight", (2, H), None),
        *_norm(f"{enc}.embed_ln_f"),
    ]
    for i in range(LAYERS):
        layer = f"{enc}.transformer_encoder.layers.{i}"
        params += _attention(f"{layer}.self_attn", bias=True)
        params += _norm(f"{layer}.norm1")
        params += _linear(f"{layer}.ffn.ffn.0.linear_layer", F, H)
        params += _linear(f"{layer}.ffn.ffn.1.linear_layer", H, F)
        params += _norm(f"{layer}.norm2")
    params += _linear(f"{enc}.pooler.pooler.ffn.0.linear_layer", H, H)
    params += _linear("bert_mlm_head.mlm_transform.ffn.ffn.0.linear_layer", H, H)
    params += _norm("bert_mlm_head.mlm_transform.ln")
    params += [
        (
            "bert_mlm_head.classifier.ffn.0.linear_layer.weight",
            (V, H),
            f"{enc}.embedding_layer.word_embeddings.weight",
        ),
        ("bert_mlm_head.classifier.ffn.0.linear_layer.bias", (V,), None),
    ]
    params += _linear("bert_cls_head.classifier.ffn.0.linear_layer", 2, H)
    return params


def t5_params() -> list[Param]:
    """T5ForConditionalGeneration (2.0 registration order: embeddings, relative position
    helpers, encoder, decoder, lm_head); RMSNorm, no biases, shared embeddings and head."""
    shared = "encoder_embeddings.word_embeddings.weight"
    params: list[Param] = [
        (shared, (V, H), None),
        ("decoder_embeddings.word_embeddings.weight", (V, H), shared),
        ("relative_position_encoder.relative_attention_bias.weight", (BUCKETS, HEADS), None),
        ("relative_position_decoder.relative_attention_bias.weight", (BUCKETS, HEADS), None),
    ]
    for i in range(LAYERS):
        layer = f"encoder.layers.{i}"
        params += _attention(f"{layer}.self_attn", bias=False)
        params += _norm(f"{layer}.norm1", bias=False)
        params += _linear(f"{layer}.ffn.ffn.0.linear_layer", F, H, bias=False)
        params += _linear(f"{layer}.ffn.ffn.1.linear_layer", H, F, bias=False)
        params += _norm(f"{layer}.norm2", bias=False)
    params += _norm("encoder.norm", bias=False)
    for i in range(LAYERS):
        layer = f"decoder.layers.{i}"
        params += _attention(f"{layer}.self_attn", bias=False)
        params += _norm(f"{layer}.norm1", bias=False)
        params += _attention(f"{layer}.multihead_attn", bias=False)
        params += _norm(f"{layer}.norm2", bias=False)
        params += _linear(f"{layer}.ffn.ffn.0.linear_layer", F, H, bias=False)
        params += _linear(f"{layer}.ffn.ffn.1.linear_layer", H, F, bias=False)
        params += _norm(f"{layer}.norm3", bias=False)
    params += _norm("decoder.norm", bias=False)
    params.append(("lm_head.weight", (V, H), "decoder_embeddings.word_embeddings.weight"))
    return params


PARAMS: dict[str, Callable[[], list[Param]]] = {
    "gpt2": gpt2_params,
    "llama": llama_params,
    "bert": bert_params,
    "t5": t5_params,
}
LEARNING_RATE = {"gpt2": 6e-4, "llama": 3e-4, "bert": 1e-4, "t5": 1e-3}


def _tensor(array: np.ndarray) -> TensorLeaf:
    array = np.ascontiguousarray(array)
    dtype = {"<f4": "float32", "<i8": "int64"}[array.dtype.str]
    return TensorLeaf(dtype, tuple(array.shape), MemoryData(array))


def build_tree(family: str, release: str) -> Node:
    """The fixture's tree. Deterministic: seeded data, fixed order."""
    # One seed per family: the 1.9 and 2.0 files hold the same tensors.
    rng = np.random.default_rng(20261122 + FAMILIES.index(family))
    model = DictNode(ordered=True)
    by_key: dict[str, Leaf] = {}
    order: list[str] = []  # distinct parameters, for the optimizer's indices
    for key, shape, tie in PARAMS[family]():
        if tie is not None:
            leaf = by_key[tie]
        else:
            leaf = _tensor(rng.standard_normal(shape).astype("<f4"))
            order.append(key)
        by_key[key] = leaf
        model.items.append((f"model.{key}", leaf))
    state = DictNode(
        [
            (
                i,
                DictNode(
                    [
                        ("step", _tensor(np.array(float(STEP), "<f4"))),
                        ("exp_avg", _tensor(rng.standard_normal(by_key[k].shape).astype("<f4"))),
                        ("exp_avg_sq", _tensor(rng.random(by_key[k].shape).astype("<f4"))),
                    ]
                ),
            )
            for i, k in enumerate(order)
        ]
    )
    lr = LEARNING_RATE[family]
    group = DictNode(
        [
            ("lr", ValueLeaf(lr)),
            ("betas", SeqNode("tuple", [ValueLeaf(0.9), ValueLeaf(0.95)])),
            ("eps", ValueLeaf(1e-8)),
            ("weight_decay", ValueLeaf(0.01)),
            ("amsgrad", ValueLeaf(False)),
            ("params", SeqNode("list", [ValueLeaf(i) for i in range(len(order))])),
        ]
    )
    optimizer = DictNode([("state", state), ("param_groups", SeqNode("list", [group]))])
    milestone = 50
    # SequentialLR(warm-up LinearLR, decay LinearLR) at step 100; 1.9 saved the sub-schedulers'
    # last_epoch values stale (2.0's fix_last_epoch sets them to 100 and 100 - 50).
    last_epochs = (milestone, STEP) if release == "1.9" else (STEP, STEP - milestone)
    subs = [
        DictNode(
            [
                ("start_factor", ValueLeaf(start)),
                ("end_factor", ValueLeaf(end)),
                ("total_iters", ValueLeaf(iters)),
                ("base_lrs", SeqNode("list", [ValueLeaf(lr)])),
                ("last_epoch", ValueLeaf(last)),
                ("_step_count", ValueLeaf(steps + 1)),
                ("_last_lr", SeqNode("list", [ValueLeaf(lr)])),
            ]
        )
        for (start, end, iters), last, steps in zip(
            ((0.01, 1.0, milestone), (1.0, 0.0, 1000)), last_epochs, (STEP, STEP - milestone)
        )
    ]
    scheduler = DictNode(
        [
            ("_schedulers", SeqNode("list", subs)),
            ("_milestones", SeqNode("list", [ValueLeaf(milestone)])),
            ("last_epoch", ValueLeaf(STEP)),
            ("_last_lr", SeqNode("list", [ValueLeaf(lr)])),
        ]
    )
    if release == "1.9":  # a 1.x appliance save left out every tied name after the first
        for i, (key, leaf) in enumerate(model.items):
            if sum(1 for _, other in model.items[:i] if other is leaf):
                model.items[i] = (key, MissingLeaf(f"model.{key}"))
    return DictNode(
        [
            ("model", model),
            ("optimizer", optimizer),
            ("lr_scheduler", scheduler),
            ("global_step", ValueLeaf(STEP)),
        ]
    )


def fixture_path(out_dir: Path, family: str, release: str) -> Path:
    return out_dir / f"{family}-{release}" / CHECKPOINT


def write_fixture(family: str, release: str, out_dir: Path, force: bool = False) -> Path:
    path = fixture_path(out_dir, family, release)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        if not force:
            return path
        path.unlink()
    write_checkpoint(build_tree(family, release), path, release, allow_missing=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "fixtures" / "models")
    parser.add_argument("--force", action="store_true", help="rewrite existing fixtures")
    args = parser.parse_args(argv)
    for family in FAMILIES:
        for release in RELEASES:
            print(write_fixture(family, release, args.out, args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
