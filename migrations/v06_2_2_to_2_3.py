"""2.2 → 2.3: no container change (format 0.4); only the release advances.

Container. 2.3 writes the same 0.4 layout as 2.1/2.2 (``__cstorch_version__`` becomes ``"2.3.0"``,
set by the writer from the target release). 2.3 introduces the Model Zoo Trainer
(``cc48e20:src/cerebras/modelzoo/trainer/``), which changes how checkpoints are driven, not the
container.

Sources: FORMAT.md §1.1, §6.2; MODELZOO_HISTORY.md §0 (commit ``cc48e20`` = 2.3.0).

Content changes handled elsewhere (MODELZOO_HISTORY.md §0, §3.5, §3.6):

* config: the legacy ``train_input/model/optimizer/runconfig`` layout → ``trainer: {init, fit}``
  (``convert_legacy_params_to_trainer_params``, ``f1fd1e0:src/cerebras/modelzoo/trainer/
  utils.py``); GPT-2 drops ``use_position_embedding``, ``alibi_implementation``,
  ``weight_initialization_seed`` (``ConfigConverter_GPT2Model_CS22_CS23``) — see the config steps;
* model keys: none for most models (``Converter_GPT2LMHeadModel_CS22_CS23`` is config only) —
  see the model-key steps.

Steps for those are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

from ckpt_migrate import catalogue
from ckpt_migrate.config import trainer_layout, yaml_edit
from ckpt_migrate.config.context import ConfigContext
from ckpt_migrate.config.yaml_edit import is_map, put, rename, take
from ckpt_migrate.format import releases
from ckpt_migrate.hops.trainer_metadata import record_release_in_metadata

SOURCE = "2.2"
TARGET = "2.3"
CHANGES = ()

# Model-key and config steps go here.
OPERATIONS = (record_release_in_metadata,)
INPUTS = ()


# Downgrade: nothing in the checkpoint changed at 2.3 but ``__metadata__``, which records the
# older release (``base_converter.py`` lines 745-753, ``update_ckpt_metadata``). The config's
# trainer layout has no way back: Model Zoo's 2.2 → 2.3 config change is one way too
# (``convert_legacy_params_to_trainer_params``).
DOWN_OPERATIONS = (record_release_in_metadata,)
DOWN_CONFIG_OPERATIONS = None


# ---------------------------------------------------------------------------- config steps

MUP_2_2 = ("scale_qk_dot_by_d", "embeddings_scale", "output_logits_scale")


def rework_mup(ctx: ConfigContext) -> None:
    """muP: 2.3 derives the muP scales from ``mup_base_hidden_size``/``mup_base_filter_size``.

    A 2.2 muP config (``scale_qk_dot_by_d``, ``embeddings_scale`` and ``output_logits_scale``
    all set) gave them pre-applied: the width multiplier is ``1 / adjust_learning_rate.
    decoder_kernel``; ``adjust_learning_rate`` is removed, ``output_logits_scale`` becomes
    ``output_logits_alpha`` (times the multiplier), the two base sizes are added, and the
    ``initializer`` / ``output_layer_initializer`` std (and truncation bounds) are multiplied
    by ``sqrt(multiplier)`` (the output layer's also by ``sqrt(2 * num_hidden_layers)``), with
    Model Zoo's arithmetic. Source: Model Zoo tag Release_2.3.0, ``src/cerebras/modelzoo/tools/
    checkpoint_converters/mup.py`` lines 27-57 and 193-323 (``ConfigConverter_muP_CS22_CS23``),
    applied for a ``cs-2.3`` target by ``base_converter.py`` lines 1881-1898;
    MODELZOO_HISTORY.md §3.6.
    """
    model, optimizer = ctx.section("model"), ctx.section("optimizer")
    if model is None or not all(model.get(key) for key in MUP_2_2):
        return
    adjust = optimizer.get("adjust_learning_rate") if optimizer is not None else None
    kernel = adjust.get("decoder_kernel") if is_map(adjust) else None
    sizes = [model.get(key) for key in ("hidden_size", "filter_size", "num_hidden_layers")]
    if not _positive(kernel) or not all(_positive(size) for size in sizes):
        ctx.unknown(
            "model.output_logits_scale",
            model["output_logits_scale"],
            "a 2.2 muP config without optimizer.adjust_learning_rate.decoder_kernel, "
            "hidden_size, filter_size and num_hidden_layers: 2.3's muP parameters cannot be "
            "derived; set mup_base_hidden_size, mup_base_filter_size and output_logits_alpha",
        )
        return
    width = 1 / kernel
    hidden, filters, layers = sizes
    why = "2.3 muP rework (Model Zoo ConfigConverter_muP_CS22_CS23)"
    take(optimizer, "adjust_learning_rate")
    ctx.removed("optimizer.adjust_learning_rate", adjust, f"{why}: the width multiplier")
    for key, scale in (
        ("initializer", width**0.5),
        ("output_layer_initializer", width**0.5 * (2 * layers) ** 0.5),
    ):
        if key in model:
            old = yaml_edit.plain(model[key])
            if _scale_initializers(model[key], scale):
                ctx.changed(f"model.{key}", old, model[key], f"{why}: std unscaled")
    logits = model["output_logits_scale"]
    rename(model, "output_logits_scale", "output_logits_alpha", logits * width)
    ctx.moved("model.output_logits_scale", "model.output_logits_alpha", logits, why, logits * width)
    for key, size in (("mup_base_hidden_size", hidden), ("mup_base_filter_size", filters)):
        base = _number(size / width)
        put(model, key, base, after=None, index=list(model).index("output_logits_alpha"))
        ctx.added(f"model.{key}", base, why)


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _number_or_absent(value: object) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _number(value: float) -> int | float:
    return int(value) if value.is_integer() else value


def _scale_initializers(initializers: object, scale: float) -> bool:
    """Model Zoo's ``scale_initializers_by_dimension``, in place: ``normal`` and
    ``truncated_normal`` mappings scaled (a name given as a bare string is left as it is, as
    there). True when one was."""
    scaled = False
    for item in initializers if isinstance(initializers, list) else [initializers]:
        if not is_map(item) or not isinstance(item.get("name"), str):
            continue
        if not all(_number_or_absent(item.get(key)) for key in ("std", "a", "b")):
            continue  # (Model Zoo's arithmetic would fail on it; left for the run to report)
        name = item["name"].lower()
        if name == "normal":
            item["std"] = item.get("std", 1.0) * scale
            scaled = True
        elif name == "truncated_normal":
            std = item.get("std", 1.0)
            item["std"] = std * scale
            item["a"] = item.get("a", -2 * std) * scale
            item["b"] = item.get("b", 2 * std) * scale
            scaled = True
    return scaled


GPT2_DROPPED = ("use_position_embedding", "alibi_implementation", "weight_initialization_seed")


def drop_gpt2_deprecated_keys(ctx: ConfigContext) -> None:
    """GPT-2: remove the keys 2.3 deprecated (``use_position_embedding``, ...).

    The keys: ``use_position_embedding``, ``alibi_implementation``,
    ``weight_initialization_seed``. Source: ``f1fd1e0:.../gpt2_hf_cs.py``
    ``ConfigConverter_GPT2Model_CS22_CS23`` (rules with no action for the three keys;
    MODELZOO_HISTORY.md §3.6).
    """
    if ctx.family != catalogue.GPT2.name:
        return
    for path, model in ctx.model_sections():
        for key in GPT2_DROPPED:
            if key in model:
                old, _ = take(model, key)
                ctx.removed(f"{path}.{key}", old, "deprecated for GPT-2 in 2.3")


# GPT2ModelConfig's fields and its base ModelConfig's (Model Zoo's config classes,
# ``src/cerebras/modelzoo/models/nlp/gpt2/config.py``, ``config_manager/config_classes/base/
# model_config.py``), plus ``name`` (2.4). A model key outside them is rejected by those classes.
GPT2_MODEL_FIELDS = frozenset(
    [
        "name",
        "vocab_size",
        "embedding_layer_norm",
        "embedding_dropout_rate",
        "share_embedding_weights",
        "position_embedding_type",
        "max_position_embeddings",
        "position_embedding_offset",
        "num_relative_attention_buckets",
        "rotary_dim",
        "rope_theta",
        "pad_rope",
        "alibi_trainable_slopes",
        "pos_scaling_factor",
        "hidden_size",
        "num_hidden_layers",
        "dropout_rate",
        "norm_type",
        "layer_norm_epsilon",
        "num_heads",
        "attention_module",
        "extra_attention_params",
        "extra_ffn_params",
        "attention_type",
        "attention_dropout_rate",
        "use_projection_bias_in_attention",
        "use_ffn_bias_in_attention",
        "attention_softmax_fp32",
        "attention_kernel",
        "attention_sliding_window_length",
        "scale_qk_dot_by_layer_idx",
        "fixed_sparse_attention",
        "filter_size",
        "nonlinearity",
        "use_ffn_bias",
        "use_bias_in_output",
        "loss_scaling",
        "loss_weight",
        "mup_base_hidden_size",
        "mup_base_filter_size",
        "embeddings_scale",
        "output_logits_alpha",
        "scale_qk_dot_by_d",
        "attention_logits_alpha",
        "scale_output_logits_by_d",
        "lr_adjustment_groups",
        "output_logits_scale",
        "initializer",
        "initializer_range",
        "embedding_initializer",
        "output_layer_initializer",
        "ffn_initializer",
        "ffn_output_layer_initializer",
        "start_token",
        "loop_dim",
        "stop_sequences",
        "max_tokens",
        "temperature",
        "top_k",
        "top_p",
        "compute_eval_metrics",
        "moe",
        "moe_params",
        "fp16_type",
        "mixed_precision",
        "boundary_casting",
        "lora_params",
        "compression",
        "selective_grad",
    ]
)

# GPT-2 model fields added in 2.4 (Release_2.4.0 src/cerebras/modelzoo/models/nlp/gpt2/
# gpt2_model.py line 180): valid in an upgrade that goes on to 2.4 or later.
GPT2_FIELDS_FROM_2_4 = frozenset({"attention_sink_tokens"})


def report_unknown_gpt2_model_keys(ctx: ConfigContext) -> None:
    """GPT-2: report model keys that Model Zoo's GPT-2 model config class does not know.

    From 2.3 the model section is validated by config classes whose fields are the model's
    parameters (``GPT2ModelConfig`` and its base ``ModelConfig``: ``src/cerebras/modelzoo/
    models/nlp/gpt2/config.py``, ``config_manager/config_classes/base/model_config.py``); a
    key outside them fails the run. Such keys are kept (they may be a local fork's) and
    reported. Other families' classes are not tabulated here, so their keys are not checked.
    Fields 2.4 added (``attention_sink_tokens``: Model Zoo tag Release_2.4.0,
    ``src/cerebras/modelzoo/models/nlp/gpt2/gpt2_model.py`` line 180) are reported only when the
    upgrade stops at 2.3.
    Source: the classes named above; MODELZOO_HISTORY.md §3.8 (config conversion drops
    unmatched keys silently, which this report replaces).
    """
    if ctx.family != catalogue.GPT2.name:
        return
    later = ctx.target and releases.get(ctx.target).version >= releases.get("2.4").version
    for path, model in ctx.model_sections():
        for key in model:
            if str(key) in GPT2_FIELDS_FROM_2_4:
                if not later:
                    ctx.unknown(
                        f"{path}.{key}",
                        model[key],
                        "a GPT-2 field from 2.4 on, which 2.3's GPT2ModelConfig rejects: "
                        "upgrade to 2.4 or later, or delete it for 2.3",
                    )
                continue
            if str(key) not in GPT2_MODEL_FIELDS:
                ctx.unknown(
                    f"{path}.{key}",
                    model[key],
                    "not a field of Model Zoo's GPT-2 model config (GPT2ModelConfig), which "
                    "validates the model section: kept, check it",
                )


def legacy_to_trainer_layout(ctx: ConfigContext) -> None:
    """Restructure the legacy layout into ``trainer: {init: {...}, fit: {...}, validate...}``.

    2.3 introduced the Model Zoo Trainer (``cc48e20:src/cerebras/modelzoo/trainer/``) and its
    YAML form. Where each legacy key goes (runconfig → backend, loop, checkpoint, logging,
    callbacks, loggers; model/optimizer precision keys → ``precision``; ``optimizer_type`` →
    the optimizer's key; ``learning_rate`` → ``schedulers``; ``train_input``/``eval_input`` →
    dataloaders) follows ``convert_legacy_params_to_trainer_params`` and its mapping table
    (``src/cerebras/modelzoo/trainer/utils.py``; MODELZOO_HISTORY.md §3.6, §4.5): see
    :mod:`ckpt_migrate.config.trainer_layout`. Keys it has no place for are kept and reported.
    """
    trainer_layout.convert(ctx)


CONFIG_OPERATIONS = (
    rework_mup,
    drop_gpt2_deprecated_keys,
    report_unknown_gpt2_model_keys,
    legacy_to_trainer_layout,
)
