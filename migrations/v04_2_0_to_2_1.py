"""2.0 → 2.1: format stays 0.4; root __cstorch_version__ added.

Container. 2.1 keeps format 0.4 and the ``__H5_TYPE__`` tags but also writes the root attribute
``__cstorch_version__`` (vlen string, the appliance version, e.g. ``"2.1.0"``): the legacy saver's
``_CURR_CKPT_VERSION = CkptVersion(0.4, <appliance __version__>)`` writes both attributes through
``CkptVersion.to_file``. With it, readers tell 2.1–2.4 files apart, while a 0.4 file without it is
taken as 2.0. The ``__spec__`` pickle now imitates the newer torch ``TreeSpec`` (a frozen
dataclass whose state adds ``num_nodes``/``num_leaves``/``num_children``; the release table's
``spec_torch = "dataclass"`` for 2.1–2.4, see ``format.legacy.spec_encode``), which the spec writer
derives from the target release.

Sources: FORMAT.md §1.1 (``CS:cerebras/pytorch/storage/_legacy/pt_h5_saver.py``
``_CURR_CKPT_VERSION``; ``MZ e2a52f1:modelzoo/common/pytorch/run_cstorch_flow.py`` uses
``extract_version(...).ckpt_version``), §1.2, §1.3, §6.2 (TreeSpec state by torch version).

Content changes handled elsewhere (MODELZOO_HISTORY.md §0, §3.5, §3.6):

* model keys: embedding refactor, ``position_embeddings`` → ``.embed`` / ``.fpe``,
  ``relative_pe_helper`` → ``embedding_layer.position_embed_helper``
  (``f1fd1e0:.../gpt2_hf_cs.py`` ``Converter_GPT2LMHeadModel_CS20_CS21``, ``t5.py``, ``bert.py``)
  — the tables and steps below;
* config: optimizer/scheduler argument aliases, ``use_bfloat16`` → ``fp16_type``, POL moved to
  runconfig, obsolete runconfig keys removed — see the config steps.

Steps for those are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

from ckpt_migrate import catalogue
from ckpt_migrate.config.context import ConfigContext
from ckpt_migrate.config.yaml_edit import new_map, new_seq, put, rename, take
from ckpt_migrate.hops.hop import StepContext
from ckpt_migrate.hops.trainer_metadata import record_release_in_metadata
from ckpt_migrate.models.keys import KeyRename
from ckpt_migrate.models.steps import rename_model_keys

from .v03_1_9_to_2_0 import drop_csconfig, remove_deprecated_runconfig_params

SOURCE = "2.0"
TARGET = "2.1"
CHANGES = (
    'root attribute __cstorch_version__ added (e.g. "2.1.0")',
    "__spec__ pickle imitates the newer torch TreeSpec (frozen dataclass with node counts)",
)

_REFACTOR = "2.1 embedding refactor"
_GPT_STYLE = catalogue.layout_families(catalogue.DECODER)
_BERT = catalogue.layout_families(catalogue.BERT_ENCODER)
_T5 = catalogue.layout_families(catalogue.ENCODER_DECODER)

# MODELZOO_HISTORY.md §3.5, 2.0→2.1 rows. Every rule also takes the optional ``model.`` prefix.
# GPT-style models: ``Converter_GPT2LMHeadModel_CS20_CS21`` (gpt2_hf_cs.py), reused by the
# GPT-J/NeoX/CodeGen/Llama/Bloom converters; Falcon's is GPT-J's (falcon.py).
POSITION_EMBEDDING_RENAMES: tuple[KeyRename, ...] = (
    KeyRename(
        "embedding_layer.position_embeddings.weight",
        "embedding_layer.position_embeddings.embed.weight",
        _GPT_STYLE,
        f"{_REFACTOR}: learned position embeddings",
    ),
    KeyRename(
        "embedding_layer.position_embeddings",
        "embedding_layer.position_embeddings.fpe",
        _GPT_STYLE,
        f"{_REFACTOR}: fixed position embeddings",
    ),
    # BERT (pre-training ``bert_encoder.``, fine-tuning ``bert.``): only these two
    # (``Converter_Bert_CS20_CS21``: "BERT only supported fixed").
    KeyRename(
        "{bert_encoder,bert}.embedding_layer.position_embeddings.weight",
        "$1.embedding_layer.position_embeddings.embed.weight",
        _BERT,
        f"{_REFACTOR}: learned position embeddings",
    ),
    KeyRename(
        "{bert_encoder,bert}.embedding_layer.position_embeddings",
        "$1.embedding_layer.position_embeddings.fpe",
        _BERT,
        f"{_REFACTOR}: fixed position embeddings",
    ),
    # T5 / transformer / UL2: encoder and decoder embeddings (``Converter_T5_CS20_CS21``).
    KeyRename(
        "{encoder,decoder}_embeddings.position_embeddings.weight",
        "$1_embeddings.position_embeddings.embed.weight",
        _T5,
        f"{_REFACTOR}: learned position embeddings",
    ),
    KeyRename(
        "{encoder,decoder}_embeddings.position_embeddings",
        "$1_embeddings.position_embeddings.fpe",
        _T5,
        f"{_REFACTOR}: fixed position embeddings",
    ),
)

POSITION_HELPER_RENAMES: tuple[KeyRename, ...] = (
    KeyRename(
        "relative_pe_helper.relative_attention_bias.{weight,bias}",
        "embedding_layer.position_embed_helper.relative_attention_bias.$1",
        _GPT_STYLE,
        f"{_REFACTOR}: relative position bias moves into the embedding layer",
    ),
    KeyRename(
        "relative_pe_helper.slopes",
        "embedding_layer.position_embed_helper.slopes",
        _GPT_STYLE,
        f"{_REFACTOR}: ALiBi slopes move into the embedding layer",
    ),
    KeyRename(
        "relative_position_encoder.relative_attention_bias.{weight,bias}",
        "encoder_embeddings.position_embed_helper.relative_attention_bias.$1",
        _T5,
        f"{_REFACTOR}: encoder relative position bias moves into the encoder embeddings",
    ),
    KeyRename(
        "relative_position_decoder.relative_attention_bias.{weight,bias}",
        "decoder_embeddings.position_embed_helper.relative_attention_bias.$1",
        _T5,
        f"{_REFACTOR}: decoder relative position bias moves into the decoder embeddings",
    ),
)


def rename_position_embeddings(ctx: StepContext) -> None:
    """Rename position embeddings to 2.1's ``position_embeddings.embed`` / ``.fpe`` (per family).

    2.1 refactored ``EmbeddingLayer``: a learned position embedding became the ``embed``
    submodule of ``position_embeddings`` and a fixed (sinusoidal) one its ``fpe`` buffer. The
    rules are :data:`POSITION_EMBEDDING_RENAMES`: GPT-style models at the model root, BERT
    under ``bert_encoder.``/``bert.``, T5 in both ``encoder_embeddings`` and
    ``decoder_embeddings``. Model-specific: an unknown model is left as it is, and reported.
    Source: MODELZOO_HISTORY.md §3.5 (2.0→2.1 rows); ``f1fd1e0:src/cerebras/modelzoo/tools/
    checkpoint_converters/gpt2_hf_cs.py`` ``Converter_GPT2LMHeadModel_CS20_CS21``,
    ``gptj_hf_cs.py``, ``bert.py`` ``Converter_Bert_CS20_CS21``, ``t5.py``
    ``Converter_T5_CS20_CS21``.
    """
    rename_model_keys(ctx, POSITION_EMBEDDING_RENAMES, "the 2.1 position-embedding renames")


def move_position_helpers(ctx: StepContext) -> None:
    """Move relative-position/ALiBi helpers into 2.1's ``…embeddings.position_embed_helper``.

    2.0 kept a GPT-style model's relative attention bias or ALiBi slopes in a top-level
    ``relative_pe_helper`` and T5's in ``relative_position_{encoder,decoder}``; 2.1 owns them
    in the embedding layer (``embedding_layer.position_embed_helper``,
    ``{encoder,decoder}_embeddings.position_embed_helper``). BERT has no such helper. Because
    the helper moves to another module, the parameter order can change; with optimizer state
    kept by parameter index that is refused (see ``model_keys.apply_renames``).
    Source: MODELZOO_HISTORY.md §3.5 (2.0→2.1 rows); ``f1fd1e0:.../gpt2_hf_cs.py``
    ``Converter_GPT2LMHeadModel_CS20_CS21``, ``t5.py`` ``Converter_T5_CS20_CS21``.
    """
    rename_model_keys(ctx, POSITION_HELPER_RENAMES, "the 2.1 position-helper moves")


OPERATIONS = (rename_position_embeddings, move_position_helpers, record_release_in_metadata)
INPUTS = ()


def unmove_position_helpers(ctx: StepContext) -> None:
    """Downgrade: move 2.1's ``position_embed_helper`` back to 2.0's ``relative_pe_helper`` /
    ``relative_position_{encoder,decoder}``.

    Model Zoo's CS20↔CS21 converters are bidirectional (``base_converter.py`` lines 340-360,
    ``supports_conversion``): the rules of :func:`move_position_helpers` read backwards.
    """
    rules = tuple(r.inverse() for r in POSITION_HELPER_RENAMES)
    rename_model_keys(ctx, rules, "the 2.1 position-helper moves, undone")


def unrename_position_embeddings(ctx: StepContext) -> None:
    """Downgrade: 2.1's ``position_embeddings.embed`` / ``.fpe`` back to 2.0's names.

    The rules of :func:`rename_position_embeddings` read backwards, as Model Zoo's bidirectional
    ``Converter_*_CS20_CS21`` do (``base_converter.py`` lines 340-360).
    """
    rules = tuple(r.inverse() for r in POSITION_EMBEDDING_RENAMES)
    rename_model_keys(ctx, rules, "the 2.1 position-embedding renames, undone")


DOWN_OPERATIONS = (
    unmove_position_helpers,
    unrename_position_embeddings,
    record_release_in_metadata,
)
DOWN_CONFIG_OPERATIONS = None  # optimizer/scheduler argument names have no 2.0 spelling here


# ---------------------------------------------------------------------------- config steps

# Arguments of the cstorch optimizers that 2.0 introduced under PyTorch's names (their
# constructors' signatures, cerebras-pytorch 2.10 ``optim/*.py``; the 2.0 names are the same),
# and the old names each replaces: one name, or several forming a tuple. Model Zoo reads the
# signatures from a pickled artifact (``artifacts/cs-2.0/optimizer_lrs_signatures.pkl``); this
# table needs no pickle.
OPTIMIZER_ARGS: dict[str, tuple[str, ...]] = {
    "adam": ("betas", "eps", "weight_decay"),
    "adamw": ("betas", "eps", "weight_decay"),
    "adamax": ("betas", "eps", "weight_decay"),
    "nadam": ("betas", "eps", "weight_decay"),
    "radam": ("betas", "eps", "weight_decay"),
    "lamb": ("betas", "eps", "weight_decay"),
    "lion": ("betas", "weight_decay"),
    "adafactor": ("eps", "weight_decay"),
    "adadelta": ("eps", "weight_decay"),
    "adagrad": ("weight_decay", "eps"),
    "rmsprop": ("eps", "weight_decay"),
    "sgd": ("weight_decay",),
    "asgd": ("weight_decay",),
    "rprop": ("etas", "step_sizes"),
}
OPTIMIZER_ALIASES: dict[str, tuple[str, ...]] = {
    "weight_decay": ("weight_decay_rate",),
    "betas": ("beta1", "beta2"),
    "eps": ("eps1", "eps2"),
    "etas": ("eta1", "eta2"),
    "step_sizes": ("step_size_min", "step_size_max"),
}
# The same for the LR schedulers (``optim/lr_scheduler.py``; ``scheduler: Linear`` is LinearLR),
# and their aliases: any one of the old names, first match wins.
SCHEDULER_ARGS: dict[str, tuple[str, ...]] = {
    "constantlr": ("learning_rate", "total_iters"),
    "polynomiallr": ("initial_learning_rate", "end_learning_rate", "total_iters", "power"),
    "linearlr": ("initial_learning_rate", "end_learning_rate", "total_iters"),
    "exponentiallr": ("initial_learning_rate", "total_iters", "decay_rate", "staircase"),
    "inverseexponentialtimedecaylr": (
        "initial_learning_rate",
        "step_exponent",
        "total_iters",
        "decay_rate",
        "staircase",
    ),
    "inversesquarerootdecaylr": ("initial_learning_rate", "scale", "warmup_steps"),
    "cosinedecaylr": ("initial_learning_rate", "end_learning_rate", "total_iters"),
    "piecewiseconstantlr": ("learning_rates", "milestones"),
    "multisteplr": ("initial_learning_rate", "gamma", "milestones"),
    "steplr": ("initial_learning_rate", "step_size", "gamma"),
    "cosineannealinglr": ("initial_learning_rate", "T_max", "eta_min"),
    "lambdalr": ("initial_learning_rate",),
    "cosineannealingwarmrestarts": ("initial_learning_rate", "T_0", "T_mult", "eta_min"),
    "multiplicativelr": ("initial_learning_rate", "coefficient"),
    "cycliclr": ("base_lr", "max_lr", "step_size_up", "step_size_down", "mode", "gamma"),
    "onecyclelr": ("initial_learning_rate", "max_lr", "total_steps", "pct_start"),
}
SCHEDULER_ALIASES: dict[str, tuple[str, ...]] = {
    "total_iters": ("steps", "decay_steps"),
    "initial_learning_rate": ("learning_rate", "base_lr"),
    "base_lr": ("learning_rate", "initial_learning_rate"),
    "learning_rates": ("values",),
    "milestones": ("boundaries",),
    "T_max": ("t_max",),
    "T_0": ("t_0",),
    "T_mult": ("t_mult",),
}
_ALL_OPTIMIZER_ALIASES = {a for names in OPTIMIZER_ALIASES.values() for a in names}
_WHY_ALIAS = "2.0 accepted the old name next to PyTorch's, 2.1 only PyTorch's"


def rename_optimizer_arguments(ctx: ConfigContext) -> None:
    """Optimizer arguments to PyTorch's names (``beta1``, ``beta2`` → ``betas``, ...).

    ``weight_decay_rate`` → ``weight_decay``, ``beta1`` + ``beta2`` → ``betas``, ``eps1`` +
    ``eps2`` → ``eps``, ``eta1/eta2`` → ``etas``, ``step_size_min/max`` → ``step_sizes``.
    2.0 renamed them to match PyTorch but still took the old names; 2.1 takes only the new
    ones. A name is replaced only where the optimizer has the new argument (Adafactor keeps its
    ``beta1``) and does not set it already. Source: ``f1fd1e0:.../base_converter.py``
    ``_apply_optimizer_transforms`` (MODELZOO_HISTORY.md §3.6); the argument table above is the
    cstorch signatures it reads from a pickle. An optimizer not in the table keeps its keys,
    and any old name it has is reported.
    """
    opt = ctx.section("optimizer")
    if opt is None:
        return
    kind = str(opt.get("optimizer_type", "")).lower()
    args = OPTIMIZER_ARGS.get(kind)
    if args is None:
        for key in [k for k in opt if k in _ALL_OPTIMIZER_ALIASES]:
            ctx.unknown(
                f"optimizer.{key}",
                opt[key],
                f"optimizer_type {opt.get('optimizer_type')!r} is not in the argument table; "
                "check whether 2.1 still accepts this name",
            )
        return
    for new in args:
        old_names = OPTIMIZER_ALIASES.get(new, ())
        if new in opt or not old_names:
            continue
        present = [n for n in old_names if n in opt]
        if not present:
            continue
        path = f"optimizer.{'+'.join(present)}"
        if len(old_names) == 1:
            old = opt[present[0]]
            rename(opt, present[0], new)
            ctx.moved(path, f"optimizer.{new}", old, _WHY_ALIAS)
        elif len(present) == len(old_names):
            values = [opt[n] for n in old_names]
            seq = new_seq(values)
            seq.fa.set_flow_style()
            rename(opt, present[0], new, seq)
            for name in present[1:]:
                take(opt, name)
            ctx.moved(path, f"optimizer.{new}", values, _WHY_ALIAS, new=values)
        else:
            for name in present:
                ctx.unknown(
                    f"optimizer.{name}",
                    opt[name],
                    f"2.1 takes {new} = [{', '.join(old_names)}] and only some are set; "
                    f"write {new} by hand",
                )


def rename_scheduler_arguments(ctx: ConfigContext) -> None:
    """LR scheduler arguments to PyTorch's names (``decay_steps`` → ``total_iters``, ...).

    Same change as the optimizer arguments. The aliases are those of Model Zoo's
    ``_apply_lrs_transforms`` (``f1fd1e0:.../base_converter.py``; MODELZOO_HISTORY.md §3.6):
    ``steps``/``decay_steps`` → ``total_iters``, ``learning_rate``/``base_lr`` ↔
    ``initial_learning_rate``, ``values`` → ``learning_rates``, ``boundaries`` →
    ``milestones``, ``t_max``/``t_0``/``t_mult`` → ``T_max``/``T_0``/``T_mult``; each applied
    only where the scheduler has the new argument (ConstantLR keeps ``learning_rate``). An
    unknown scheduler is reported and left alone.
    """
    opt = ctx.section("optimizer")
    if opt is None:
        return
    schedule = opt.get("learning_rate")
    entries = [schedule] if hasattr(schedule, "items") else schedule
    if not isinstance(entries, list):
        return
    for i, params in enumerate(entries):
        where = "optimizer.learning_rate" + (f"[{i}]" if entries is schedule else "")
        if not hasattr(params, "items") or "scheduler" not in params:
            continue
        name = str(params["scheduler"]).lower()
        args = SCHEDULER_ARGS.get(name) or SCHEDULER_ARGS.get(f"{name}lr")
        if args is None:
            ctx.unknown(
                f"{where}.scheduler",
                params["scheduler"],
                "scheduler not in the argument table: its arguments were not renamed",
            )
            continue
        for new in args:
            if new in params:
                continue
            for alias in SCHEDULER_ALIASES.get(new, ()):
                if alias in params:
                    old = params[alias]
                    rename(params, alias, new)
                    ctx.moved(f"{where}.{alias}", f"{where}.{new}", old, _WHY_ALIAS)
                    break


def move_precision_opt_level(ctx: ConfigContext) -> None:
    """Move ``precision_opt_level`` from ``model`` to ``runconfig``.

    2.1 reads the precision optimization level from the runconfig only; a value already there
    wins. Source: ``f1fd1e0:.../base_converter.py`` ``_apply_pol_transforms``
    (MODELZOO_HISTORY.md §3.6). Model Zoo leaves the key in ``model`` when the config has no
    runconfig section; here the section is created.
    """
    model = ctx.section("model")
    if model is None or "precision_opt_level" not in model:
        return
    value, comment = take(model, "precision_opt_level")
    run = ctx.section("runconfig")
    if run is None:
        run = new_map()
        put(ctx.data, "runconfig", run)
    if "precision_opt_level" in run:
        ctx.removed(
            "model.precision_opt_level",
            value,
            f"2.1 reads it from runconfig, which already sets {run['precision_opt_level']}",
        )
        return
    put(run, "precision_opt_level", value, comment=comment)
    ctx.moved("model.precision_opt_level", "runconfig.precision_opt_level", value, "2.1")


def use_bfloat16_to_fp16_type(ctx: ConfigContext) -> None:
    """``use_bfloat16: true|false`` → ``fp16_type: bfloat16|float16``.

    2.1 replaced the flag by ``fp16_type`` (which also allows ``cbfloat16``). Source:
    ``f1fd1e0:.../base_converter.py`` ``_apply_fp16_transforms`` (MODELZOO_HISTORY.md §3.6).
    """
    for path, model in ctx.model_sections():
        if "use_bfloat16" not in model:
            continue
        old = model["use_bfloat16"]
        if not isinstance(old, bool):
            ctx.unknown(f"{path}.use_bfloat16", old, "expected true or false; not converted")
            continue
        new = "bfloat16" if old else "float16"
        ctx.flag_to_value(path, model, "use_bfloat16", "fp16_type", new, "2.1 fp16_type")


def note_max_checkpoints_default(ctx: ConfigContext) -> None:
    """Say that 2.1.0 keeps only 5 checkpoints unless ``max_checkpoints`` is set.

    2.1.0 made ``max_checkpoints`` default to 5, deleting older checkpoints automatically;
    2.1.1 restored "keep all" (``de67aae:RELEASE-NOTES.md``, MODELZOO_HISTORY.md §5). Only a
    note, and only when the upgrade stops at 2.1: the value is the user's choice.
    """
    run = ctx.section("runconfig")
    if ctx.target == "2.1" and (run is None or "max_checkpoints" not in run):
        ctx.note(
            "runconfig.max_checkpoints",
            "not set: 2.1.0 keeps only the last 5 checkpoints and deletes older ones (2.1.1 "
            "keeps all); set it if you run 2.1.0",
        )


CONFIG_OPERATIONS = (
    remove_deprecated_runconfig_params,
    drop_csconfig,
    rename_optimizer_arguments,
    rename_scheduler_arguments,
    move_precision_opt_level,
    use_bfloat16_to_fp16_type,
    note_max_checkpoints_default,
)
