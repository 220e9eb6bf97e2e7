"""1.9 → 2.0: format 0.3 → 0.4; torch tensors tagged TorchTensorH5Type.

Container. 2.0 writes root ``__version__ = 0.4`` and still no ``__cstorch_version__`` (OLD-PTH5
``save_spec`` writes only ``__spec__`` and ``__version__``). Torch tensors are tagged
``TorchTensorH5Type`` (bf16 stored as int16 bits with ``is_bfloat16``); from 0.4 on
``NumpyArrayH5Type`` means a real numpy array. The spec is still the hex of a dill-pickled torch
(≤2.0) ``TreeSpec``. No tree edit is needed for the tags: the reader already takes 0.3
``NumpyArrayH5Type`` as tensors, and the writer for 2.0 writes ``TorchTensorH5Type``.

Sources: FORMAT.md §1.1 (``CS:cerebras/pytorch/storage/_legacy/pt_h5_saver.py:
CkptVersion.from_file``: 0.4→"2.0", "checkpoints from 2.0 and earlier carry no cstorch
version"; OLD-PTH5 ``__version__ = 0.4``), §1.4, §3.3 (OLD-PTH5 ``TorchTensorH5Type.save``),
§7.1 items 4–5.

The 1.9 → 2.0 release steps are the ``OPERATIONS`` below (FORMAT.md §7.1; MODELZOO_HISTORY.md
§0, §1, §2); model-key and config changes are handled elsewhere:

* spec fix: 1.x specs name ``cerebras_pytorch.utils.tensor_scalar_dict.TensorScalarDict``, which
  2.0 no longer has; it becomes a plain ``dict`` (``c1ef453:modelzoo/compat/
  fix_checkpoint_spec.py:fix_checkpoint``);
* tied weights missing from 1.x appliance saves (``lm_head.weight`` ↔
  ``embedding_layer.word_embeddings.weight``, ``ln_f`` ↔ ``transformer_decoder.norm``), restored
  as ties (same script, ``fix_duplicate_weights``);
* scheduler: stale ``lr_scheduler…last_epoch`` rewritten from the global step (same script,
  ``fix_last_epoch``; ``e2a52f1:.../run_cstorch_flow.py`` did it at load for ≤0.3 files);
* dataloader: 1.9 kept its state in side files, 2.0 in ``checkpoint["dataloader"]``
  (``c1ef453:modelzoo/compat/data_iter_state_conversion.py``); the side files come in through
  ``INPUTS``;
* grad scaler under ``amp`` (1.x ``PyTorchBaseModel``) vs ``grad_scaler`` (2.0): no Model Zoo
  tool migrates it;
* model-key and config changes: ``use_rms_norm`` / ``use_biasless_norm`` / ``use_t5_layer_norm``
  → ``norm_type``; no key renames (``c1ef453:.../gpt2_hf_cs.py`` and siblings, "Model didn't
  change") — see the model-key steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ckpt_migrate import catalogue
from ckpt_migrate.config.context import ConfigContext
from ckpt_migrate.config.yaml_edit import put, rename, take
from ckpt_migrate.errors import MissingLeavesError
from ckpt_migrate.format.tree import (
    DictNode,
    Leaf,
    LeafRef,
    MemoryData,
    MissingLeaf,
    Node,
    SeqNode,
    TensorLeaf,
    ValueLeaf,
    format_path,
    int_value,
    iter_leaves,
    set_path,
)
from ckpt_migrate.hops.dataloader import convert_dataloader_state
from ckpt_migrate.hops.hop import InputSpec, StepContext
from ckpt_migrate.models import ties

SOURCE = "1.9"
TARGET = "2.0"
FORMAT = (0.3, 0.4)
CHANGES = (
    "torch tensors tagged TorchTensorH5Type instead of NumpyArrayH5Type "
    "(NumpyArrayH5Type now means a numpy array)",
    "root attribute __version__ = 0.4 (still no __cstorch_version__)",
)


def fix_spec(ctx: StepContext) -> None:
    """Turn every 1.x TensorScalarDict node of the spec into a plain dict.

    1.7 (and possibly 1.8) pickled ``cerebras_pytorch.utils.tensor_scalar_dict.TensorScalarDict``
    nodes into the spec; 2.0 cannot import that class.
    Source: ``c1ef453:modelzoo/compat/fix_checkpoint_spec.py:fix_checkpoint`` (inner
    ``fix_spec``), MODELZOO_HISTORY.md §1.2.
    """

    def walk(node: Node, path: tuple) -> None:
        if isinstance(node, DictNode):
            if node.origin == "TensorScalarDict":
                node.origin = None
                ctx.changed(f"{format_path(path)}: TensorScalarDict spec node is now a dict")
            for key, child in node.items:
                walk(child, (*path, key))
        elif isinstance(node, SeqNode) or hasattr(node, "fields"):
            for i, child in enumerate(node.items):  # type: ignore[union-attr]
                walk(child, (*path, i))

    walk(ctx.root, ())


def restore_tied_weights(ctx: StepContext) -> None:
    """Restore leaves a 1.x save skipped because they were one name of a tied pair.

    1.7–1.9 appliance saves passed ``duplicate_params_map`` and left one name of each tied pair
    without a dataset. The leaf becomes a tie to its partner (no data copied); a missing leaf no
    rule explains is an error, or None with ``--allow-missing``. Ties chain: T5's ``lm_head``
    is restored from the decoder embeddings once those are restored from the encoder's.
    Source: 2.0's ``fix_duplicate_weights`` (``c1ef453:modelzoo/compat/fix_checkpoint_spec.py``);
    the pairs of every family from the 2.1+ converters (MODELZOO_HISTORY.md §1.5).
    """
    model_config = _model_config(ctx)
    present = {ref.name: ref for ref in iter_leaves(ctx.root)}
    pending = [ref for ref in present.values() if isinstance(ref.leaf, MissingLeaf)]
    progress = True
    while pending and progress:
        progress, still = False, []
        for ref in pending:
            for partner, rule in ties.partners(ref.name, model_config):
                other = present.get(partner)
                if other is not None and not isinstance(other.leaf, MissingLeaf):
                    set_path(ctx.root, ref.path, other.leaf)
                    present[ref.name] = LeafRef(ref.name, ref.path, other.leaf)
                    ctx.changed(
                        f"{ref.name}: restored as a tie to {partner} ({rule.families[0]} rule)"
                    )
                    progress = True
                    break
            else:
                still.append(ref)
        pending = still
    unexplained = [ref.name for ref in pending]
    if unexplained and not ctx.inputs.get("allow_missing"):
        raise MissingLeavesError(
            ctx.source_path,
            f"{len(unexplained)} leaf/leaves named by the spec have no data and no tie rule "
            f"explains them: {', '.join(unexplained[:5])}",
            "pass --allow-missing to write them as None",
        )
    for name in unexplained:
        set_path(ctx.root, present[name].path, ValueLeaf(None))
        ctx.warn(f"{name}: missing from the file; written as None")


def recompute_last_epoch(ctx: StepContext) -> None:
    """Rewrite the LR scheduler ``last_epoch`` values from ``global_step``.

    1.x saved ``last_epoch`` values that did not follow the step count; 2.0's ``fix_last_epoch``
    set them to ``global_step``, and a SequentialLR's sub-scheduler ``i`` to
    ``max(global_step - milestones[i-1], 0)``. Schedulers are recognized by their state
    (``last_epoch`` with ``base_lrs``, SequentialLR by ``_schedulers`` and ``_milestones``), not by
    key substrings, so MultiStepLR's ``milestones`` are left alone. Values keep their type.
    Source: ``c1ef453:modelzoo/compat/fix_checkpoint_spec.py:fix_last_epoch``;
    ``e2a52f1:.../run_cstorch_flow.py`` did the same at load for ≤0.3 files (FORMAT.md §7.1).
    """
    if not isinstance(ctx.root, DictNode):
        return
    step_leaf = ctx.root.get("global_step")
    step = int_value(step_leaf) if step_leaf is not None else None
    if step is None:
        if _schedulers(ctx.root):
            ctx.warn("no integer global_step: LR scheduler last_epoch left as it is")
        return
    for path, sched in _schedulers(ctx.root):
        _set_last_epoch(ctx, sched, path, step)
        subs, milestones = sched.get("_schedulers"), sched.get("_milestones")
        if isinstance(subs, SeqNode) and isinstance(milestones, SeqNode):
            bounds = [0, *(int_value(m) or 0 for m in milestones.items)]
            for i, sub in enumerate(subs.items):
                if isinstance(sub, DictNode) and i < len(bounds):
                    _set_last_epoch(ctx, sub, (*path, "_schedulers", i), max(step - bounds[i], 0))


OPERATIONS = (fix_spec, restore_tied_weights, recompute_last_epoch, convert_dataloader_state)
DOWN_REFUSAL = (
    "it would lose information: 2.0 keeps the dataloader state inside the checkpoint and counts "
    "the scheduler's last_epoch differently; 1.9 kept the first in side files this tool does "
    "not write"
)
INPUTS = (
    InputSpec(
        "data_iter_dir",
        "Directory of the 1.8/1.9 dataloader side files (data_iter_checkpoint_state_file_global, "
        "data_iter_state_file_worker_<id>_step_<step>.txt), for 1.9 → 2.0.",
        kind="path",
        aliases=("--worker_data_iter_files_dir", "-w"),
        needs=("dataloader_type",),
    ),
    InputSpec(
        "dataloader_type",
        "The kind of dataloader the 1.9 run used, with --data-iter-dir (not guessed).",
        kind="choice",
        choices=("map", "iterable"),
        aliases=("--dataloader_type", "-d"),
    ),
    InputSpec(
        "shuffle_seed",
        "Seed of a map-style 1.9 dataloader (default: the config's train_input.shuffle_seed).",
        kind="int",
        aliases=("--shuffle_seed", "-s"),
    ),
    InputSpec(
        "allow_step_mismatch",
        "Accept dataloader side files of another step than the checkpoint's global_step.",
        aliases=("--allow_step_mismatch",),
    ),
    InputSpec(
        "drop_dataloader_state",
        "Upgrade a 1.8/1.9 file without its dataloader side files: the dataloader state is lost "
        "and training restarts from the first sample. Default: refuse.",
        aliases=("--drop_dataloader_state",),
        excludes=("data_iter_dir",),
    ),
    # The verbs' and scripts' own --config (a verb also upgrades the file itself).
    InputSpec("config", "the run's params.yaml: tie flags, shuffle seed", given_by="verb"),
    InputSpec(
        "dataloader_state_deferred",
        "a script's next step that converts the side files (no refusal without them)",
        given_by="script",
    ),
    InputSpec(
        "default_shuffle_seed",
        "a script's documented map-style seed, used when no seed is given (said as a warning)",
        given_by="script",
    ),
)


# --------------------------------------------------------------------------- helpers


def _model_config(ctx: StepContext) -> dict[str, Any] | None:
    config = ctx.inputs.get("config")
    if isinstance(config, dict) and isinstance(config.get("model"), dict):
        return config["model"]
    return None


def _is_scheduler(node: Node) -> bool:
    return (
        isinstance(node, DictNode)
        and node.get("last_epoch") is not None
        and (node.get("base_lrs") is not None or node.get("_schedulers") is not None)
    )


def _schedulers(root: DictNode) -> list[tuple[tuple, DictNode]]:
    """Scheduler states at the top level, or in a top-level list of schedulers."""
    found: list[tuple[tuple, DictNode]] = []
    for key, value in root.items:
        if _is_scheduler(value):
            found.append(((key,), value))  # type: ignore[arg-type]
        elif isinstance(value, SeqNode):
            found.extend(((key, i), v) for i, v in enumerate(value.items) if _is_scheduler(v))
    return found


def _set_last_epoch(ctx: StepContext, sched: DictNode, path: tuple, value: int) -> None:
    old = sched.get("last_epoch")
    before = int_value(old)
    if before is None or before == value:
        return
    new: Leaf
    if isinstance(old, TensorLeaf):
        storage = np.array(value, dtype=old.data.read().dtype)
        new = TensorLeaf(old.dtype, (), MemoryData(storage))
    else:
        new = ValueLeaf(value)
    sched.set("last_epoch", new)
    ctx.changed(f"{'.'.join(map(str, path))}.last_epoch: {before} → {value}")


# ---------------------------------------------------------------------------- config steps

# family -> (1.9 flag, norm_type when the flag is true, norm_type added when the flag is absent)
NORM_FLAGS: dict[str, tuple[str, str, str | None]] = {
    r.name: (r.norm_flag.flag, r.norm_flag.when_true, r.norm_flag.when_absent)
    for r in catalogue.families()
    if r.norm_flag is not None
}


def norm_flags_to_norm_type(ctx: ConfigContext) -> None:
    """``use_rms_norm`` / ``use_biasless_norm`` / ``use_t5_layer_norm`` → ``norm_type``.

    2.0 replaced the boolean flags by ``norm_type``: GPT-2, Llama and Bloom's ``use_rms_norm``
    (``rmsnorm``/``layernorm``; absent = false, so ``layernorm`` is written), GPT-J, NeoX and
    CodeGen's ``use_biasless_norm`` (``biasless-layernorm``/``layernorm``) and T5's
    ``use_t5_layer_norm`` (``rmsnorm``/``layernorm``). Source: MODELZOO_HISTORY.md §3.6;
    ``helper.py`` ``convert_use_rms_layer_norm_helper``/``convert_use_biasless_layer_norm_
    helper``, ``ConfigConverter_GPT2Model_CS18_CS20`` (its ``pre_convert_defaults`` are the
    only default), ``ConfigConverter_GPTJModel_CS18_CS20``, ``ConfigConverter_T5_CS18_CS20``.
    Where Model Zoo sets no default (GPT-J/NeoX/CodeGen, T5) none is invented: the 2.0 model
    default applies, the same as 1.9's (``layernorm``; T5 ``rmsnorm`` from
    ``use_t5_layer_norm`` defaulting to true), and the report says so. The flags are unique to
    their families, so with an unknown family a flag present still decides its rule.
    """
    flags = {flag for flag, _, _ in NORM_FLAGS.values()}
    for path, model in ctx.model_sections():
        present = [f for f in flags if f in model]
        rule = NORM_FLAGS.get(ctx.family or "")
        if rule is None and len(present) == 1:
            rule = next(r for r in NORM_FLAGS.values() if r[0] == present[0])
        for flag in present:
            if rule is None or flag != rule[0]:
                ctx.unknown(
                    f"{path}.{flag}",
                    model[flag],
                    f"not a {ctx.family or 'known family'} flag: kept, 2.0 uses norm_type",
                )
        if rule is None:
            continue
        flag, when_true, default = rule
        if flag in model:
            old = model[flag]
            if not isinstance(old, bool):
                ctx.unknown(f"{path}.{flag}", old, "expected true or false; not converted")
                continue
            new = when_true if old else "layernorm"
            ctx.flag_to_value(path, model, flag, "norm_type", new, "2.0 norm_type")
        elif "norm_type" not in model and default is not None:
            put(model, "norm_type", default)
            ctx.added(
                f"{path}.norm_type",
                default,
                f"no {flag} (1.9 default false); Model Zoo's 2.0 converter writes {default!r}",
            )
        elif "norm_type" not in model:
            ctx.note(
                f"{path}.norm_type",
                f"not added: no {flag} in the 1.9 config and Model Zoo's converter sets no "
                "default; 2.0's default norm_type is the same norm as 1.9's default",
            )


def remove_deprecated_runconfig_params(ctx: ConfigContext) -> None:
    """Remove runconfig keys 2.0 dropped; ``is_pretrained_checkpoint`` → ``load_checkpoint_states``.

    Removed: ``experimental_api, multireplica, num_replicas, save_losses, service_dir,
    use_appliance_data, num_act_servers, num_wgt_servers`` (2.0 chooses the server counts
    itself). ``keep_checkpoint_max`` (unused) → ``max_checkpoints``. ``is_pretrained_checkpoint:
    true`` → ``load_checkpoint_states: "model,dataloader"``: 2.0.2 deprecated the flag
    (``c1ef453:RELEASE-NOTES.md``). Model Zoo writes a *list* there, but 2.0's runner splits a
    comma-separated string (``c1ef453:.../run_cstorch_flow.py`` ``load_checkpoint``) and the
    documented type stays a comma-separated string, so the string is written: it loads in 2.0
    and later. Source: ``f1fd1e0:.../base_converter.py``
    ``_remove_deprecated_runconfig_params_2_1`` (run when the source is 1.9 or 2.0, so this step
    is in both hops), MODELZOO_HISTORY.md §3.6 (with the [I] note on list vs string).
    """
    run = ctx.section("runconfig")
    if run is None:
        return
    for key in (
        "experimental_api",
        "multireplica",
        "num_replicas",
        "save_losses",
        "service_dir",
        "use_appliance_data",
        "num_act_servers",
        "num_wgt_servers",
    ):
        if key in run:
            old, _ = take(run, key)
            why = "2.0 chooses the server counts itself" if "servers" in key else "2.0 dropped it"
            ctx.removed(f"runconfig.{key}", old, why)
    if "is_pretrained_checkpoint" in run:
        old = run["is_pretrained_checkpoint"]
        if old is True and "load_checkpoint_states" not in run:
            rename(run, "is_pretrained_checkpoint", "load_checkpoint_states", "model,dataloader")
            ctx.moved(
                "runconfig.is_pretrained_checkpoint",
                "runconfig.load_checkpoint_states",
                old,
                "deprecated in 2.0.2; a comma-separated string, as 2.0's runner splits it",
                new="model,dataloader",
            )
        else:
            take(run, "is_pretrained_checkpoint")
            why = (
                "deprecated in 2.0.2; load_checkpoint_states already set"
                if old is True
                else "deprecated in 2.0.2; false meant: load every state"
            )
            ctx.removed("runconfig.is_pretrained_checkpoint", old, why)
    if "keep_checkpoint_max" in run:
        old = run["keep_checkpoint_max"]
        if "max_checkpoints" in run:
            take(run, "keep_checkpoint_max")
            ctx.removed(
                "runconfig.keep_checkpoint_max",
                old,
                f"never used; max_checkpoints ({run['max_checkpoints']}) is the setting",
            )
        elif old is None:
            take(run, "keep_checkpoint_max")
            ctx.removed("runconfig.keep_checkpoint_max", old, "never used")
        else:
            rename(run, "keep_checkpoint_max", "max_checkpoints")
            ctx.moved(
                "runconfig.keep_checkpoint_max",
                "runconfig.max_checkpoints",
                old,
                "keep_checkpoint_max was never used; max_checkpoints is the intended setting",
            )


def drop_csconfig(ctx: ConfigContext) -> None:
    """Remove the ``csconfig`` section, unused since 1.9.

    Source: ``f1fd1e0:.../base_converter.py`` ``BaseConfigConverter_CS_CS.post_config_convert``
    ("csconfig is an old section ... not been used since 1.9", deleted when the source is 1.9
    or 2.0), MODELZOO_HISTORY.md §3.6.
    """
    if ctx.legacy and "csconfig" in ctx.data:
        old, _ = take(ctx.data, "csconfig")
        ctx.removed("csconfig", old, "unused since 1.9")


def drop_cerebras_section(ctx: ConfigContext) -> None:
    """Remove the top-level ``cerebras`` section (1.9's ``save_iter_state_path``).

    1.9 pointed ``cerebras.save_iter_state_path`` at the dataloader side files; 2.0 keeps that
    state in the checkpoint (``upgrade --data-iter-dir`` converts the files). Model Zoo's
    CS→CS config converters delete the section (``f1fd1e0:.../base_converter.py``
    ``post_config_convert``; MODELZOO_HISTORY.md §2, §3.6).
    """
    if ctx.legacy and "cerebras" in ctx.data:
        old, _ = take(ctx.data, "cerebras")
        ctx.removed(
            "cerebras", old, "2.0 keeps the dataloader state in the checkpoint, not side files"
        )


def keep_mixed_precision_as_set(ctx: ConfigContext) -> None:
    """Leave ``mixed_precision`` as the config sets it (Model Zoo 2.0–2.3 injected ``true``).

    Model Zoo's CS↔CS converters from 2.0 to 2.3 added ``mixed_precision: True`` to the model
    when absent (``c1ef453:.../base_converter.py`` ``BaseConfigConverter_CS_CS.__init__``,
    removed in 2.4.0 ``608d5a3``), which silently changes a run whose model default was false
    (MODELZOO_HISTORY.md §3.6 [I]). ckpt-migrate does not inject it; a config without the key
    is reported so the user can set it.
    """
    for path, model in ctx.model_sections():
        if "mixed_precision" not in model:
            ctx.note(
                f"{path}.mixed_precision",
                "not set and not added (Model Zoo's 2.0–2.3 converters inject true, which can "
                "change the run): the release's default applies; set it if the run used "
                "mixed precision",
            )


CONFIG_OPERATIONS = (
    norm_flags_to_norm_type,
    remove_deprecated_runconfig_params,
    drop_csconfig,
    drop_cerebras_section,
    keep_mixed_precision_as_set,
)
