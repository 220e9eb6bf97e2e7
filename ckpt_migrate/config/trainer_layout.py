"""The 2.3 Trainer layout: where each key of a legacy params.yaml goes under ``trainer:``.

Release 2.3 replaced the legacy ``train_input / eval_input / model / optimizer / sparsity /
runconfig`` layout by ``trainer: {init: {...}, fit: {...}, validate: ..., validate_all: ...}``.
The mapping below follows Model Zoo's ``TRAINER_PARAMS_TO_LEGACY`` table and
``convert_legacy_params_to_trainer_params`` (``src/cerebras/modelzoo/trainer/utils.py``,
MODELZOO_HISTORY.md §3.6, §4.5): which runconfig keys become backend, loop, checkpoint, logging,
callback and logger settings, which model and optimizer keys become precision settings, how
``optimizer_type`` and the ``learning_rate`` schedule are restructured. It differs on purpose
in one way: upstream drops every key it cannot place (with a warning); here such keys stay in
their legacy section and are reported as unknown.

Mappings, sections and schedules are moved as the same ruamel objects, so their comments
travel with them; a moved scalar keeps its end-of-line comment.
"""

from __future__ import annotations

from typing import Any

from ckpt_migrate.config import yaml_edit, yaml_headings
from ckpt_migrate.config.trainer_tables import (
    CALLBACKS,
    GLOBAL_FLAGS,
    INIT_ORDER,
    LEGACY_SECTIONS,
    LR_SCHEDULERS,
    MODEL_TO_PRECISION,
    OPTIMIZER_TO_PRECISION,
    PRECISION_ORDER,
    RUNCONFIG_TO_INIT,
    TENSORBOARD,
    WANDB,
    WHY,
    scheduler_class,
)
from ckpt_migrate.config.yaml_edit import (
    carry_start_comments,
    is_map,
    is_seq,
    key_col,
    new_map,
    new_seq,
    put,
    take,
)
from ckpt_migrate.format import releases


class _Builder:
    """Collects values for trainer.init and puts them in the Trainer's order at the end."""

    def __init__(self, ctx: Any, step: int) -> None:
        self.ctx = ctx
        self.step = step  # the output's indentation: init's keys stand at twice it
        self.init: dict[str, Any] = {}  # top-level init key -> value or nested dict of slots
        self.callbacks: list[tuple[Any, str]] = []  # (callback mapping, source path)

    def slot(
        self, path: tuple[str, ...], value: Any, comment: str | None, source: str, above: str = ""
    ) -> None:
        """``value`` (its end-of-line ``comment``, the comment lines ``above`` it) to go to
        ``trainer.init.<path>``."""
        node = self.init
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = (value, comment, above)
        self.ctx.moved(source, "trainer.init." + ".".join(path), value, WHY)

    def move(self, section: Any, key: str, path: tuple[str, ...], source: str) -> None:
        """Take ``key`` out of ``section`` with its comments, for ``trainer.init.<path>``."""
        above = yaml_headings.above(section, key, key_col(section, key) or 0)
        value, comment = take(section, key)
        self.slot(path, value, comment, source, above)

    def build(self) -> Any:
        init = new_map()
        for key in INIT_ORDER:
            if key in self.init:
                _put_slot(init, key, self.init[key], 2 * self.step, self.step, key == "precision")
        if self.callbacks:
            put(init, "callbacks", new_seq(cb for cb, _ in self.callbacks), index=_at(init))
        return init


def _at(init: Any) -> int:
    """Where ``callbacks`` goes: before ``loggers`` if present, else at the end."""
    keys = list(init)
    return keys.index("loggers") if "loggers" in keys else len(keys)


def _put_slot(
    parent: Any, key: str, slot: Any, col: int, step: int, precision: bool = False
) -> None:
    """Put ``slot`` (a value and its comments, or a dict of them) at ``parent[key]``, which
    the output writes at column ``col``."""
    if isinstance(slot, dict):
        child = new_map()
        keys = [k for k in PRECISION_ORDER if k in slot] if precision else list(slot)
        for sub in keys:
            _put_slot(child, sub, slot[sub], col + step, step)
        put(parent, key, child)
    else:
        value, comment, *above = slot
        put(parent, key, value, comment=comment)
        yaml_headings.put(parent, key, above[0] if above else "", col)


def convert(ctx: Any) -> None:
    """Rewrite a legacy params document in place into the 2.3 trainer layout."""
    data = ctx.data
    if not ctx.legacy:
        ctx.note("trainer", "already in the 2.3 trainer layout: nothing to restructure")
        return
    sections = {name: data.get(name) for name in (*LEGACY_SECTIONS, "wandb") if name in data}
    for name, value in sections.items():
        if not is_map(value) and not (name == "sparsity" and value is not None):
            ctx.unknown(name, value, f"expected a mapping; kept as is, not part of the {WHY}")
    cols = {name: key_col(value) or 0 for name, value in sections.items()}  # (before any move)
    step = next((c for c in cols.values() if c), 2)  # (the output's indentation)
    headings = {name: yaml_headings.pop(data, name, 0) for name in sections if is_map(data[name])}
    b = _Builder(ctx, step)
    run = sections.get("runconfig") if is_map(sections.get("runconfig")) else None
    model = sections.get("model") if is_map(sections.get("model")) else None
    optimizer = sections.get("optimizer") if is_map(sections.get("optimizer")) else None
    sparsity = sections.get("sparsity")
    train = sections.get("train_input") if is_map(sections.get("train_input")) else None
    evaluate = sections.get("eval_input") if is_map(sections.get("eval_input")) else None
    wandb = sections.get("wandb") if is_map(sections.get("wandb")) else None

    checkpoint_path = None
    if run is not None:
        if "mode" in run:
            old, _ = take(run, "mode")
            ctx.removed(
                "runconfig.mode",
                old,
                "the 2.3 trainer takes the mode from the command line "
                "(IGNORE_LEGACY_KEYS in convert_legacy_params_to_trainer_params)",
            )
        for key, path in RUNCONFIG_TO_INIT.items():
            if key in run:
                b.move(run, key, path, f"runconfig.{key}")
        if "checkpoint_path" in run:
            checkpoint_path = take(run, "checkpoint_path")

    if model is not None:
        _precision_from_model(ctx, b, model)
    log_summaries = None
    if optimizer is not None:
        for key, dest in OPTIMIZER_TO_PRECISION.items():
            if key in optimizer:
                b.move(optimizer, key, ("precision", dest), f"optimizer.{key}")
                if key == "log_summaries":
                    log_summaries = b.init["precision"][dest][:2]
        if "grad_accum_steps" in optimizer:
            b.move(
                optimizer,
                "grad_accum_steps",
                ("loop", "grad_accum_steps"),
                "optimizer.grad_accum_steps",
            )

    _callbacks(ctx, b, run, model, optimizer, sparsity, train, evaluate, log_summaries)
    loggers = _loggers(ctx, run, wandb)

    # Whole sections, in the order the Trainer lists them.
    if model is not None:
        take(data, "model")
        b.init["model"] = (model, None)
        ctx.moved("model", "trainer.init.model", "(section)", WHY, new="(section)")
    if optimizer is not None:
        schedulers = _schedulers(ctx, optimizer)
        converted = _optimizer(ctx, optimizer)
        take(data, "optimizer")
        if converted is not None:
            b.init["optimizer"] = (converted, None)
        if schedulers is not None:
            b.init["schedulers"] = (schedulers, None)
    if sparsity is not None:
        take(data, "sparsity")
        b.init["sparsity"] = (sparsity, None)
        ctx.moved("sparsity", "trainer.init.sparsity", "(section)", WHY, new="(section)")
    if loggers:
        b.init["loggers"] = (new_seq(loggers), None)

    trainer = new_map()
    put(trainer, "init", b.build())
    fit = new_map()
    if train is not None:
        take(data, "train_input")
        put(fit, "train_dataloader", train)
        ctx.moved("train_input", "trainer.fit.train_dataloader", "(section)", WHY, new="(section)")
    if evaluate is not None:
        take(data, "eval_input")
        put(fit, "val_dataloader", evaluate)
        ctx.moved("eval_input", "trainer.fit.val_dataloader", "(section)", WHY, new="(section)")
    if checkpoint_path is not None:
        put(fit, "ckpt_path", checkpoint_path[0], comment=checkpoint_path[1])
        ctx.moved("runconfig.checkpoint_path", "trainer.fit.ckpt_path", checkpoint_path[0], WHY)
    if train is not None:  # a fit section needs a train dataloader
        put(trainer, "fit", fit)
    elif checkpoint_path is not None or evaluate is not None:
        ctx.note("trainer.fit", "no train_input: no fit section (the Trainer requires one)")
    if evaluate is not None:
        evaluate.yaml_set_anchor("val_dataloader", always_dump=True)
        validate = new_map({"val_dataloader": evaluate})
        validate_all = new_map({"val_dataloaders": evaluate})
        if checkpoint_path is not None:
            put(validate, "ckpt_path", checkpoint_path[0])
            put(validate_all, "ckpt_paths", checkpoint_path[0])
        put(trainer, "validate", validate)
        put(trainer, "validate_all", validate_all)
        ctx.added(
            "trainer.validate",
            "(val_dataloader: the same mapping as trainer.fit.val_dataloader)",
            f"{WHY}: eval_input also drives validate and validate_all",
        )

    # The trainer goes first; what could not be placed stays where it was, reported.
    put(data, "trainer", trainer, index=0)
    for name in ("runconfig", "wandb"):
        section = data.get(name)
        if is_map(section) and not section:
            # Its comments (commented-out settings, often) go where its keys went: to the
            # start of trainer.init, two indentation steps in (one as in the file's first
            # section, which sets the output's indentation).
            carry_start_comments(section, trainer["init"], 2 * step - cols[name])
            take(data, name)
        elif is_map(section):
            for key in list(section):
                ctx.unknown(
                    f"{name}.{key}",
                    section[key],
                    "no place in the 2.3 trainer layout (Model Zoo drops it with a warning); "
                    f"kept under {name}: move it or delete it before running 2.3 or later",
                )
    _place_headings(trainer, headings, 2 * step)
    for key in list(data):
        if key != "trainer" and key not in ("runconfig", "wandb") and key not in sections:
            ctx.unknown(
                str(key),
                data[key],
                "not a legacy section the 2.3 trainer layout knows; kept at the top level",
            )


def _place_headings(trainer: Any, headings: dict[str, str], col: int) -> None:
    """Each moved section's heading above its new place; runconfig's above the first of the
    keys its settings went to."""
    init = trainer["init"]
    from_run = {path[0] for path in RUNCONFIG_TO_INIT.values()}
    places = {
        "model": (init, "model"),
        "optimizer": (init, "optimizer" if "optimizer" in init else "schedulers"),
        "sparsity": (init, "sparsity"),
        "runconfig": (init, next((k for k in init if k in from_run), None)),
        "wandb": (init, "loggers"),
        "train_input": (trainer.get("fit") or {}, "train_dataloader"),
        "eval_input": (trainer.get("fit") or trainer.get("validate") or {}, "val_dataloader"),
    }
    for name, heading in headings.items():
        parent, key = places.get(name, (init, None))
        if key not in parent:  # (nothing of it has a place of its own: the trainer's start)
            parent, key = init, next(iter(init), None)
        if key is not None:
            yaml_headings.put(parent, key, heading, col)


def _precision_from_model(ctx: Any, b: _Builder, model: Any) -> None:
    """``model.mixed_precision`` / ``model.fp16_type`` -> ``precision.enabled`` / ``fp16_type``,
    a copy staying in the model.

    Model Zoo 2.3 and 2.4 map them into ``trainer.init.precision`` and then write them back into
    the model ("Continue to allow mixed_precision/fp16_type in model params"): Model Zoo tags
    Release_2.3.0 ``src/cerebras/modelzoo/trainer/utils.py`` lines 1034-1050 and Release_2.4.0
    the same file, lines 892-908; 2.4's ``GPT2ModelConfig`` declares both as deprecated fields
    (Release_2.4.0 ``src/cerebras/modelzoo/models/nlp/gpt2/model.py`` lines 70-71). 2.5 drops
    them again (the 2.4 → 2.5 config step).
    """
    for key, dest in MODEL_TO_PRECISION.items():
        if key in model:
            value, comment = model[key], yaml_headings.end_comment(model, key)  # (kept too)
            b.slot(("precision", dest), value, comment, f"model.{key}")
            if ctx.target and releases.get(ctx.target).version >= releases.get("2.5").version:
                continue  # the 2.4 → 2.5 step removes the copy again
            ctx.note(
                f"model.{key}",
                "also kept in the model: 2.3 and 2.4 read it from both places "
                "(Model Zoo's convert_legacy_params_to_trainer_params copies it back)",
            )


def _callbacks(
    ctx: Any,
    b: _Builder,
    run: Any,
    model: Any,
    optimizer: Any,
    sparsity: Any,
    train: Any,
    evaluate: Any,
    log_summaries: Any,
) -> None:
    sources = {"runconfig": run, "model": model, "optimizer": optimizer}
    flags = new_map()
    if run is not None:
        for key, flag in GLOBAL_FLAGS.items():
            if key in run:
                value, comment = take(run, key)
                put(flags, flag, value, comment=comment)
                ctx.moved(f"runconfig.{key}", f"callbacks GlobalFlags {flag}", value, WHY)
    if flags:
        b.callbacks.append((new_map({"GlobalFlags": flags}), "runconfig"))
    for name, section, cb in (
        ("train_input", train, "ScopedTrainFlags"),
        ("eval_input", evaluate, "ScopedValidateFlags"),
    ):
        if section is not None and "micro_batch_size" in section:
            value, comment = take(section, "micro_batch_size")
            args = new_map()
            put(args, "csx.performance.micro_batch_size", value, comment=comment)
            b.callbacks.append((new_map({cb: args}), name))
            ctx.moved(f"{name}.micro_batch_size", f"callbacks {cb}", value, WHY)
    for callback, arg, (section_name, key) in CALLBACKS:
        if section_name == "sparsity":
            value = _sparsity_summaries(sparsity)
            if value is None:
                continue
            comment = None
        elif section_name == "optimizer" and key == "log_summaries":
            if log_summaries is None:
                continue
            value, comment = log_summaries
        else:
            section = sources.get(section_name)
            if section is None or key not in section:
                continue
            if callback == "Listener":
                _listeners(ctx, b, section)
                continue
            value, comment = take(section, key)
        where = f"{section_name}.{key}"
        if arg is None:
            setting: Any = new_map() if value is True else (None if value is False else value)
        else:
            setting = new_map()
            put(setting, arg, value, comment=comment)
        b.callbacks.append((new_map({callback: setting}), where))
        ctx.moved(where, f"callbacks {callback}", value, WHY)


def _sparsity_summaries(sparsity: Any) -> Any:
    """The LogSparsity setting: true if any sparsity group asks for summaries."""
    groups = [sparsity] if is_map(sparsity) else list(sparsity) if is_seq(sparsity) else []
    flags = [g["add_summaries"] for g in groups if is_map(g) and "add_summaries" in g]
    if not flags:
        return None
    return any(bool(f) for f in flags)


def _listeners(ctx: Any, b: _Builder, run: Any) -> None:
    experimental = run.get("experimental")
    if not is_map(experimental) or "listeners" not in experimental:
        return
    listeners = experimental["listeners"]
    good = [
        item
        for item in (listeners if is_seq(listeners) else [])
        if is_map(item) and "listener_type" in item
    ]
    if not is_seq(listeners) or len(good) != len(listeners):
        ctx.unknown(
            "runconfig.experimental.listeners",
            listeners,
            "every listener needs a listener_type to become a 2.3 callback; kept as is",
        )
        return
    take(experimental, "listeners")
    for item in good:
        kind = str(item["listener_type"])
        take(item, "listener_type")
        b.callbacks.append((new_map({kind: item}), "runconfig.experimental.listeners"))
        ctx.moved("runconfig.experimental.listeners", f"callbacks {kind}", item, WHY)
    if not experimental:
        take(run, "experimental")


def _loggers(ctx: Any, run: Any, wandb: Any) -> list[Any]:
    loggers = []
    for source, section, keys, logger in (
        (run, "runconfig", TENSORBOARD, "TensorBoardLogger"),
        (wandb, "wandb", WANDB, "WandbLogger"),
    ):
        settings = new_map()
        for key in keys if source is not None else ():
            if key in source:
                value, comment = take(source, key)
                put(settings, key, value, comment=comment)
                ctx.moved(f"{section}.{key}", f"loggers {logger} {key}", value, WHY)
        if settings:
            loggers.append(new_map({logger: settings}))
    return loggers


def _optimizer(ctx: Any, optimizer: Any) -> Any:
    """``{optimizer_type: X, ...}`` -> ``{X: {...}}`` (Model Zoo ``convert_optimizer_params``)."""
    if "optimizer_type" not in optimizer:
        ctx.unknown(
            "optimizer",
            optimizer,
            "no optimizer_type: the 2.3 layout names the optimizer class as the key; "
            "moved as is to trainer.init.optimizer, set its class by hand",
        )
        ctx.moved("optimizer", "trainer.init.optimizer", "(section)", WHY, new="(section)")
        return optimizer
    kind, comment = take(optimizer, "optimizer_type")
    out = new_map()
    put(out, str(kind), optimizer, comment=comment)
    ctx.moved(
        "optimizer",
        f"trainer.init.optimizer.{kind}",
        "(section)",
        f"{WHY}: optimizer_type becomes the key",
        new="(section)",
    )
    return out


def _schedulers(ctx: Any, optimizer: Any) -> Any:
    """``optimizer.learning_rate`` -> ``schedulers`` (Model Zoo ``convert_lr_scheduler``)."""
    if "learning_rate" not in optimizer:
        return None
    value = optimizer["learning_rate"]
    if is_map(value) or is_seq(value):
        problem = _schedule_problem(value)
        if problem:
            ctx.unknown(
                "optimizer.learning_rate", value, f"{problem}; kept in the optimizer section"
            )
            return None
        before = yaml_edit.plain(value)
        take(optimizer, "learning_rate")
        schedule = _convert_schedule(value)
        source = "optimizer.learning_rate"
    else:
        try:
            rate = float(value)
        except (TypeError, ValueError):
            ctx.unknown("optimizer.learning_rate", value, "neither a number nor a schedule; kept")
            return None
        before = yaml_edit.plain(value)
        schedule = new_map({"ConstantLR": new_map({"learning_rate": rate})})
        source = "optimizer.learning_rate"
    if optimizer.get("adjust_learning_rate"):  # muP: the schedule is scaled per parameter
        schedule = new_map({"ScalePerParamLR": new_map({"scheduler": schedule})})
    why = WHY if is_map(value) or is_seq(value) else f"{WHY}: a constant rate becomes ConstantLR"
    ctx.moved(source, "trainer.init.schedulers", before, why, new=[schedule])
    return new_seq([schedule])


def _schedule_problem(params: Any) -> str | None:
    if is_seq(params):
        mains = {
            str(item["main_scheduler"]).lower()
            for item in params
            if is_map(item) and "main_scheduler" in item
        }
        if len(mains) > 1:
            return f"conflicting main_scheduler values {sorted(mains)}"
        for item in params:
            problem = _schedule_problem(item)
            if problem:
                return problem
        return None
    if not is_map(params) or "scheduler" not in params:
        return "a schedule entry without scheduler"
    if scheduler_class(str(params["scheduler"])) is None:
        return f"unknown scheduler {params['scheduler']!r} (known: {', '.join(LR_SCHEDULERS)})"
    return None


def _convert_schedule(params: Any) -> Any:
    if is_seq(params):
        yaml_headings.open_first_item(params)
        mains = set()
        items = []
        for item in params:
            if "main_scheduler" in item:
                mains.add(str(take(item, "main_scheduler")[0]).lower())
            items.append(_convert_schedule(item))
        key = "ChainedScheduler" if mains & {"chained", "chainedlr"} else "SequentialLR"
        if len(items) == 1 and key == "SequentialLR":
            return items[0]
        return new_map({key: new_map({"schedulers": new_seq(items)})})
    kind, comment = take(params, "scheduler")
    out = new_map()
    put(out, scheduler_class(str(kind)), params, comment=comment)
    return out
