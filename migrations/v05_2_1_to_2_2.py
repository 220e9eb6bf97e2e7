"""2.1 → 2.2: no container change (format 0.4); only the release advances.

Container. 2.2 writes the same 0.4 layout as 2.1: ``__H5_TYPE__`` tags, hex-dill ``__spec__``
(torch 2.2.1 ``TreeSpec``, the same ``"dataclass"`` pickle style), ``__version__ = 0.4`` and
``__cstorch_version__`` (now ``"2.2.0"``, set by the writer from the target release).

Sources: FORMAT.md §1.1 (2.1.0 … 2.4.x write 0.4 with ``__cstorch_version__``), §6.2 (torch per
release from MZ ``requirements.txt``).

Content changes handled elsewhere (MODELZOO_HISTORY.md §0, §3.6):

* state: sparsity masks move from optimizer state into ``model.<weight>_mask`` (converter base
  class hooks) — :func:`move_sparsity_masks` below;
* config: ``use_cs_grad_accum`` → ``micro_batch_size``, ``autogen_policy`` dropped, sparsity
  schema rewritten (``_remove_deprecated_runconfig_params_2_2``, ``_convert_sparsity_params_2_2``)
  — see the config steps. Model keys: none (fallback converter).

Steps for those are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

import re

from ckpt_migrate.config.context import ConfigContext
from ckpt_migrate.config.yaml_edit import is_map, is_seq, new_map, new_seq, put, rename, take
from ckpt_migrate.errors import UnsupportedContentError
from ckpt_migrate.format.tree import DictNode, Key, Node, SeqNode, TensorLeaf, ValueLeaf, is_leaf
from ckpt_migrate.hops.hop import InputSpec, StepContext
from ckpt_migrate.hops.trainer_metadata import record_release_in_metadata
from ckpt_migrate.models.keys import model_state, split_prefix

SOURCE = "2.1"
TARGET = "2.2"
CHANGES = ()

# Model keys: none (``fallback_converters`` ``BaseCheckpointConverter_CS21_CS22`` copies them).
MASK_SUFFIX = "_mask"


DROP_OPTION = "--drop-orphan-sparsity"


def move_sparsity_masks(ctx: StepContext) -> None:
    """Move sparsity masks from the optimizer's sparsity state into the model as ``<w>_mask``.

    2.2 redesigned sparsity: a mask is a model buffer ``model["<weight>_mask"]``, the sparsity
    step and each parameter's schedule position live in a new top-level ``sparsity`` state,
    and ``optimizer["sparsity"]`` is gone. The 2.1 layout moved here is the one Model Zoo's
    hook reads: ``optimizer.sparsity = {state: {<model key>: {mask, …}}, step,
    param_groups: [{param_names: [...], sparsity: {step}, …}]}`` → ``model[<key>_mask]`` (placed
    right after its weight, the tensor itself moved, not copied), ``sparsity.step`` and
    ``sparsity.sparsity = {<name>: {index: <group step>}}``; ``optimizer.sparsity`` is removed.
    Per-weight state 2.2 has no place for (a mask whose weight is not in the model, a weight
    without a mask, other per-weight tensors) is refused unless ``--drop-orphan-sparsity``
    drops it, each entry reported: Model Zoo's hook drops it silently, and keeping it in
    ``optimizer.sparsity`` makes the next release's converter fail (its same hook reads
    ``optimizer.sparsity.param_groups``, which such a leftover lacks: Model Zoo tag
    Release_2.3.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/base_converter.py``
    lines 797 and 812; the same lines are 796/811 at Release_2.2.0, 815/830 at
    Release_2.10.0). Group settings that 2.2 reads from the config are reported with their
    values as they are removed. Applies to every model family. Source: MODELZOO_HISTORY.md §0
    (2.1→2.2 row), §3.8 ("HEAD additions in the CS↔CS base-class hooks":
    ``f1fd1e0:src/cerebras/modelzoo/tools/checkpoint_converters/base_converter.py``
    ``BaseCheckpointConverter_CS_CS.post_checkpoint_convert``), §4.3
    (strict 2.3+ loading needs a ``<w>_mask`` key in ``model``).
    """
    root = ctx.root
    optimizer = root.get("optimizer") if isinstance(root, DictNode) else None
    sparsity = optimizer.get("sparsity") if isinstance(optimizer, DictNode) else None
    state = sparsity.get("state") if isinstance(sparsity, DictNode) else None
    model = model_state(root)
    if not isinstance(state, DictNode) or model is None:
        return
    assert isinstance(root, DictNode) and isinstance(optimizer, DictNode)
    assert isinstance(sparsity, DictNode)
    if root.get("sparsity") is not None:
        raise UnsupportedContentError(
            ctx.source_path,
            "the checkpoint has both a 2.1 optimizer.sparsity state and a 2.2 top-level "
            "'sparsity' state",
            "upgrade the checkpoint as it was saved, not a partly converted one",
        )
    _refuse_orphans(ctx, state, [k for k, _ in model.items])
    keys = [k for k, _ in model.items]
    for weight, per_weight in list(state.items):
        name = _model_key(weight, keys)
        mask = per_weight.get("mask") if isinstance(per_weight, DictNode) else None
        if name is not None and mask is not None:
            _insert_mask(ctx, model, name, mask)
    step = sparsity.get("step")
    new_state = DictNode([("step", step)] if step is not None else [])
    schedule = _schedule(sparsity)
    if schedule.items:
        new_state.items.append(("sparsity", schedule))
    root.items.append(("sparsity", new_state))
    ctx.changed(
        "sparsity: new top-level state from optimizer.sparsity ("
        + ", ".join(str(k) for k, _ in new_state.items)
        + ")"
    )
    _report_settings(ctx, sparsity)
    optimizer.pop("sparsity")
    ctx.changed("optimizer.sparsity: removed (2.2 has no optimizer sparsity state)")


def _orphans(state: DictNode, keys: list[Key]) -> list[tuple[str, str]]:
    """``(place, why)`` of every per-weight entry 2.2 has no place for."""
    out = []
    for weight, per_weight in state.items:
        mask = per_weight.get("mask") if isinstance(per_weight, DictNode) else None
        if mask is None:
            out.append((f"optimizer.sparsity.state.{weight}", "no 'mask' in its state"))
        elif _model_key(weight, keys) is None:
            out.append((f"optimizer.sparsity.state.{weight}", "its weight is not in the model"))
        else:
            assert isinstance(per_weight, DictNode)
            out.extend(
                (f"optimizer.sparsity.state.{weight}.{k}", "2.2 keeps only the mask")
                for k, _ in per_weight.items
                if k != "mask"
            )
    return out


def _refuse_orphans(ctx: StepContext, state: DictNode, keys: list[Key]) -> None:
    """Refuse per-weight sparsity state 2.2 cannot hold, or drop it with the opt-in."""
    orphans = _orphans(state, keys)
    if not orphans:
        return
    if not ctx.inputs.get("drop_orphan_sparsity"):
        place, why = orphans[0]
        more = f" and {len(orphans) - 1} more" if len(orphans) > 1 else ""
        raise UnsupportedContentError(
            ctx.source_path,
            f"2.2 has no place for {place} ({why}){more}; kept in optimizer.sparsity it would "
            "make the checkpoint unloadable by the next release's tools",
            f"pass {DROP_OPTION} to drop it (each dropped entry is reported)",
        )
    for place, why in orphans:
        ctx.warn(f"{place}: dropped ({DROP_OPTION}; {why})")


def _model_key(weight: Key, keys: list[Key]) -> Key | None:
    """The model key the sparsity state names, allowing for the optional ``model.`` prefix."""
    if weight in keys:
        return weight
    if isinstance(weight, str):
        prefix, bare = split_prefix(weight)
        for candidate in (bare, "model." + weight) if prefix else ("model." + weight,):
            if candidate in keys:
                return candidate
    return None


def _insert_mask(ctx: StepContext, model: DictNode, name: Key, mask: Node) -> None:
    mask_key = f"{name}{MASK_SUFFIX}"
    existing = model.get(mask_key)
    if existing is not None:
        if existing is mask:
            return
        raise UnsupportedContentError(
            ctx.source_path,
            f"model already has {mask_key!r} and the optimizer holds another mask for {name!r}",
            "upgrade the checkpoint as it was saved, not a partly converted one",
        )
    at = next(i for i, (k, _) in enumerate(model.items) if k == name)
    model.items.insert(at + 1, (mask_key, mask))
    ctx.changed(f"optimizer.sparsity.state.{name}.mask → model.{mask_key}")


def _schedule(sparsity: DictNode) -> DictNode:
    """``{param name: {"index": group's sparsity step}}`` (a tensor step stays one tensor)."""
    out = DictNode([])
    groups = sparsity.get("param_groups")
    for group in groups.items if isinstance(groups, SeqNode) else []:
        if not isinstance(group, DictNode):
            continue
        settings = group.get("sparsity")
        names = group.get("param_names")
        step = settings.get("step") if isinstance(settings, DictNode) else None
        if step is None or not isinstance(names, SeqNode):
            continue
        for leaf in names.items:
            if isinstance(leaf, ValueLeaf) and isinstance(leaf.value, str):
                index = step if isinstance(step, TensorLeaf) else _copy(step)
                out.items.append((leaf.value, DictNode([("index", index)])))
    return out


def _copy(node: Node) -> Node:
    return ValueLeaf(node.value) if isinstance(node, ValueLeaf) else node


def _report_settings(ctx: StepContext, sparsity: DictNode) -> None:
    """Name what 2.2 no longer keeps in the checkpoint (it comes from the config now)."""
    groups = sparsity.get("param_groups")
    for g, group in enumerate(groups.items if isinstance(groups, SeqNode) else []):
        if not isinstance(group, DictNode):
            continue
        for key, value in group.items:
            if key in ("param_names", "params"):
                continue
            if key == "sparsity" and isinstance(value, DictNode):
                value = DictNode([(k, v) for k, v in value.items if k != "step"])
                if not value.items:
                    continue
            ctx.changed(
                f"optimizer.sparsity.param_groups.{g}.{key} = {_show(value)}: removed "
                "(2.2 reads it from the sparsity config)"
            )


def _show(node: Node) -> str:
    if isinstance(node, ValueLeaf):
        return repr(node.value)
    if is_leaf(node):
        return type(node).__name__
    if isinstance(node, DictNode):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in node.items) + "}"
    return "[" + ", ".join(_show(v) for v in node.items) + "]"  # type: ignore[union-attr]


OPERATIONS = (move_sparsity_masks, record_release_in_metadata)
INPUTS = (
    InputSpec(
        "drop_orphan_sparsity",
        "2.1 → 2.2: drop per-weight sparsity state 2.2 cannot hold (a mask whose weight the "
        "model lacks; Model Zoo drops it silently), each reported. Default: refuse.",
        aliases=("--drop_orphan_sparsity",),
    ),
)


def refuse_sparsity_state(ctx: StepContext) -> None:
    """Downgrade: a checkpoint with 2.2 sparsity state cannot go back to 2.1.

    2.1 kept each mask in ``optimizer.sparsity.state`` beside per-group settings
    (``param_groups``) that 2.2 no longer stores (:func:`move_sparsity_masks` reports them as
    it drops them), so Model Zoo's backward conversion would invent them. Without sparsity
    state (no top-level ``sparsity``, no ``model.<w>_mask``) nothing is lost and the hop is
    undone by the 2.1 writer alone.
    """
    root = ctx.root
    model = model_state(root)
    masks = [k for k, _ in model.items if str(k).endswith(MASK_SUFFIX)] if model else []
    has_state = isinstance(root, DictNode) and root.get("sparsity") is not None
    if masks or has_state:
        what = f"model.{masks[0]}" if masks else "the top-level 'sparsity' state"
        raise UnsupportedContentError(
            ctx.source_path,
            f"cannot downgrade to 2.1: {what} is 2.2 sparsity state, and 2.1's optimizer "
            "sparsity settings (param_groups) it would need are not in the checkpoint",
            "keep the checkpoint at 2.2 or later",
        )


DOWN_OPERATIONS = (refuse_sparsity_state, record_release_in_metadata)
DOWN_CONFIG_OPERATIONS = None  # micro_batch_size and the 2.2 sparsity schema have no 2.1 form


# ---------------------------------------------------------------------------- config steps


def use_cs_grad_accum_to_micro_batch_size(ctx: ConfigContext) -> None:
    """``runconfig.use_cs_grad_accum`` → ``micro_batch_size`` in each input section.

    2.2 removed the flag: gradient accumulation is set per input by ``micro_batch_size``
    (``"auto"`` lets the compiler choose, ``null`` turns it off). ``false`` becomes
    ``micro_batch_size: null``; ``true`` becomes ``"auto"`` unless a value is already set.
    Source: ``f1fd1e0:.../base_converter.py`` ``_remove_deprecated_runconfig_params_2_2``
    (MODELZOO_HISTORY.md §3.6). Model Zoo also creates missing input sections; here only the
    sections the config has are changed.
    """
    run = ctx.section("runconfig")
    if run is None or "use_cs_grad_accum" not in run:
        return
    enable = run["use_cs_grad_accum"]
    if not isinstance(enable, bool):
        ctx.unknown("runconfig.use_cs_grad_accum", enable, "expected true or false; kept")
        return
    take(run, "use_cs_grad_accum")
    ctx.removed("runconfig.use_cs_grad_accum", enable, "2.2 sets micro_batch_size per input")
    sections = [(n, ctx.section(n)) for n in ("train_input", "eval_input")]
    sections = [(n, s) for n, s in sections if s is not None]
    if not sections:
        ctx.note("micro_batch_size", "no train_input or eval_input to carry it")
    for name, section in sections:
        if not enable:
            old = section.get("micro_batch_size", None)
            put(section, "micro_batch_size", None)
            ctx.changed(
                f"{name}.micro_batch_size",
                old,
                None,
                "use_cs_grad_accum was false: null turns gradient accumulation off",
            )
        elif "micro_batch_size" not in section:
            put(section, "micro_batch_size", "auto")
            ctx.added(
                f"{name}.micro_batch_size",
                "auto",
                "use_cs_grad_accum was true: the compiler chooses",
            )


def drop_autogen_policy(ctx: ConfigContext) -> None:
    """Remove ``runconfig.autogen_policy`` (2.2 dropped it).

    Source: ``f1fd1e0:.../base_converter.py`` ``_remove_deprecated_runconfig_params_2_2``
    (MODELZOO_HISTORY.md §3.6).
    """
    run = ctx.section("runconfig")
    if run is not None and "autogen_policy" in run:
        old, _ = take(run, "autogen_policy")
        ctx.removed("runconfig.autogen_policy", old, "2.2 dropped it")


_REGEX_ONLY = set("(){}|+?^$\\")
# A regex character class a glob can hold: ``[qkv]``, ``[a-z0-9_]``, ``[^.]`` (no escapes,
# no nested brackets, no POSIX ``[:name:]``).
_CLASS = re.compile(r"\[(\^?)([^\[\]\\^]+)\]")


def regex_to_glob(pattern: str) -> str | None:
    """A 2.1 ``param_name_patterns`` regex as a 2.2 ``param_filter`` glob, or None if it cannot
    be one.

    2.2's cerebras.pytorch sparsity matches ``param_filter`` as ``fnmatch`` globs, whose
    ``[seq]`` / ``[!seq]`` classes are regex classes (issue #20): ``[qkv]`` is kept as it is and
    ``[^x]`` becomes ``[!x]``. Model Zoo only replaces ``.*`` by ``*`` (a ``.`` stays a dot,
    as parameter names mean it): Model Zoo tags Release_2.2.0 and Release_2.10.0,
    ``src/cerebras/modelzoo/tools/checkpoint_converters/base_converter.py``
    ``_convert_sparsity_params_2_2``, ``regex_to_glob`` (lines 1858-1860 and 2136-2138), so
    ``".*proj_[qkv]_dense_layer.weight"`` becomes ``"*proj_[qkv]_dense_layer.weight"``.
    ``\\.`` becomes ``.``; anything else regex-only (groups, alternation, anchors, ``+``,
    ``?``, escapes, ``{n}``) has no glob equivalent here.
    """
    classes: list[str] = []

    def hold(match: re.Match[str]) -> str:
        classes.append(f"[{'!' if match[1] else ''}{match[2]}]")
        return f"\1{len(classes) - 1}\1"

    text = _CLASS.sub(hold, pattern).replace("\\.", "\0").replace(".*", "*")
    if any(ch in _REGEX_ONLY or ch in "[]" for ch in text):
        return None
    text = text.replace("\0", ".")
    return re.sub("\1(\\d+)\1", lambda m: classes[int(m[1])], text)


def sparsity_schema_2_2(ctx: ConfigContext) -> None:
    """Sparsity config to 2.2's schema (``type`` → ``algorithm``, regex → glob ``param_filter``).

    ``type`` → ``algorithm``, ``schedule`` → ``update``, ``sparsity_schedule`` → ``schedule`` +
    ``update.steps``, ``param_name_patterns`` (regex) → ``param_filter`` (glob). Follows
    ``f1fd1e0:.../base_converter.py`` ``_convert_sparsity_params_2_2``
    (MODELZOO_HISTORY.md §3.6): static sparsity with only a level becomes that number; an
    integer ``update`` of 1 is dropped, other integers become ``{freq: N}``; a non-numeric
    ``sparsity`` becomes ``schedule``; a dict of patterns becomes one group per pattern. A
    regex a glob cannot express is kept as ``param_name_patterns`` and reported, not rewritten
    into a filter that selects other parameters.
    """
    if not ctx.legacy or "sparsity" not in ctx.data:
        return
    sp = ctx.data["sparsity"]
    if isinstance(sp, (int, float)) or not is_map(sp):
        return
    if "type" in sp:
        old = sp["type"]
        rename(sp, "type", "algorithm")
        ctx.moved("sparsity.type", "sparsity.algorithm", old, "2.2 sparsity schema")
    if sp.get("algorithm") == "static":
        old, _ = take(sp, "algorithm")
        ctx.removed("sparsity.algorithm", old, "static is 2.2's default algorithm")
        if list(sp) == ["sparsity"] and isinstance(sp["sparsity"], (int, float)):
            level = sp["sparsity"]
            put(ctx.data, "sparsity", level)
            ctx.changed("sparsity", {"sparsity": level}, level, "static sparsity: just the level")
            return
    if "schedule" in sp:
        old = sp["schedule"]
        rename(sp, "schedule", "update")
        ctx.moved("sparsity.schedule", "sparsity.update", old, "2.2 sparsity schema")
    if "sparsity_schedule" in sp:
        pairs = sp["sparsity_schedule"]
        if not is_seq(pairs) or not all(is_seq(p) and len(p) == 2 for p in pairs):
            ctx.unknown("sparsity.sparsity_schedule", pairs, "expected [[step, level], ...]; kept")
        else:
            steps = new_seq(p[0] for p in pairs)
            levels = new_seq(p[1] for p in pairs)
            steps.fa.set_flow_style()
            levels.fa.set_flow_style()
            rename(sp, "sparsity_schedule", "schedule", levels)
            put(sp, "update", new_map({"steps": steps}), after="schedule")
            ctx.moved(
                "sparsity.sparsity_schedule",
                "sparsity.schedule + sparsity.update.steps",
                pairs,
                "2.2 sparsity schema",
                new={"schedule": list(levels), "update": {"steps": list(steps)}},
            )
    if "sparsity" in sp and not isinstance(sp["sparsity"], (int, float)):
        old = sp["sparsity"]
        rename(sp, "sparsity", "schedule")
        ctx.moved("sparsity.sparsity", "sparsity.schedule", old, "2.2: a level schedule")
    if "update" in sp and isinstance(sp["update"], int) and not isinstance(sp["update"], bool):
        old = sp["update"]
        if old == 1:
            take(sp, "update")
            ctx.removed("sparsity.update", old, "updating every step is 2.2's default")
        else:
            put(sp, "update", new_map({"freq": old}))
            ctx.changed("sparsity.update", old, {"freq": old}, "2.2 sparsity schema")
    if "param_name_patterns" in sp:
        _patterns_to_filter(ctx, sp)


def _patterns_to_filter(ctx: ConfigContext, sp: object) -> None:
    patterns = sp["param_name_patterns"]  # type: ignore[index]
    key = "sparsity.param_name_patterns"
    why = "2.2 selects parameters with a glob param_filter"
    if isinstance(patterns, str):
        glob = regex_to_glob(patterns)
        if glob is None:
            ctx.unknown(key, patterns, "a regex no glob can express: write param_filter by hand")
            return
        rename(sp, "param_name_patterns", "param_filter", glob)
        ctx.moved(key, "sparsity.param_filter", patterns, why, new=glob)
    elif is_seq(patterns):
        globs = [regex_to_glob(str(p)) for p in patterns]
        if any(g is None for g in globs):
            bad = [p for p, g in zip(patterns, globs) if g is None]
            ctx.unknown(key, patterns, f"regexes no glob can express: {bad}; write param_filter")
            return
        rename(sp, "param_name_patterns", "param_filter", new_seq(globs))
        ctx.moved(key, "sparsity.param_filter", patterns, why, new=globs)
    elif is_map(patterns):
        globs = {p: regex_to_glob(str(p)) for p in patterns}
        if any(g is None for g in globs.values()):
            bad = [p for p, g in globs.items() if g is None]
            ctx.unknown(key, patterns, f"regexes no glob can express: {bad}; write the groups")
            return
        import copy

        take(sp, "param_name_patterns")
        groups = new_seq()
        for pattern, overrides in patterns.items():
            group = new_map({"param_filter": globs[pattern]})
            for k, v in sp.items():  # type: ignore[attr-defined]
                group[k] = copy.deepcopy(v)
            for k, v in (overrides or {}).items():
                group[k] = copy.deepcopy(v)
            groups.append(group)
        put(ctx.data, "sparsity", groups)
        ctx.moved(key, "sparsity (one group per pattern)", patterns, why, new=groups)
    else:
        ctx.unknown(key, patterns, "expected a regex, a list or a mapping; kept")


CONFIG_OPERATIONS = (
    use_cs_grad_accum_to_micro_batch_size,
    drop_autogen_policy,
    sparsity_schema_2_2,
)
