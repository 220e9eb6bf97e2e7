"""What hops call for model keys: apply a rename table for the model's family, and report the
keys the family's tables do not know (never dropped silently).
"""

from __future__ import annotations

from collections.abc import Iterable

from ckpt_migrate.errors import UnsupportedContentError
from ckpt_migrate.hops.hop import StepContext
from ckpt_migrate.models.detect import choose_family, family_of, unknown_keys
from ckpt_migrate.models.keys import (
    KeyRename,
    apply_renames,
    model_keys,
    model_state,
    optimizer_indexed,
    plan_renames,
)


def step_family(ctx: StepContext) -> str | None:
    """The model family a step works for: the engine's choice (``--model`` or detected), or,
    for a step run on its own, detected now and kept in ``ctx.inputs``."""
    choice = family_of(ctx.inputs)
    if choice is None:
        choice = choose_family(ctx.root, ctx.inputs.get("model"))
        ctx.inputs["model_family"] = choice
    return choice.family


def rename_model_keys(ctx: StepContext, rules: Iterable[KeyRename], what: str) -> None:
    """Apply a hop's model-specific rename table for the step's family, reporting every rename.

    For an unknown family nothing is renamed, and the report says so, with the keys that the
    rules of some family would have renamed; when no key matches any family's rules nothing is
    missed, and nothing is said.
    """
    rules = tuple(rules)
    family = step_family(ctx)
    target = ctx.hop.target if ctx.hop is not None else "the target release"
    if family is None:
        would = plan_renames(model_keys(ctx.root), rules)
        if would:
            fams = sorted({f for r in would for f in r.rule.families})
            shown = ", ".join(f"{r.old} → {r.new}" for r in would[:3])
            more = f" and {len(would) - 3} more" if len(would) > 3 else ""
            detail = f"{len(would)} key(s) match them for {'/'.join(fams)}: {shown}{more}"
            ctx.warn(
                f"model family unknown: {what} (model-specific) not applied; {detail}; "
                "pass --model NAME to apply them"
            )
        # else no key matches any family's rules: nothing is missed, so nothing to warn about
        return
    mine = [r for r in rules if family in r.families]
    renames, notes = apply_renames(
        ctx.root, mine, target=target, inputs=ctx.inputs, source_path=ctx.source_path
    )
    for r in renames:
        ctx.changed(f"model.{r.old} → model.{r.new} ({family}: {r.rule.why})")
    for note in notes:
        ctx.changed(note)


def report_unknown_keys(ctx: StepContext) -> None:
    """List the model keys the family's key tables do not know: kept unchanged, never dropped
    silently. With ``drop_unmatched_keys`` (``convert_checkpoint.py --drop-unmatched-keys``)
    they are dropped and each is reported, unless that would remove a parameter while the
    optimizer keeps its state by parameter index."""
    choice = family_of(ctx.inputs)
    model = model_state(ctx.root)
    if choice is None or choice.family is None or model is None:
        return
    unknown = unknown_keys(model_keys(ctx.root), choice.family)
    if not unknown:
        return
    family = choice.family
    if not ctx.inputs.get("drop_unmatched_keys"):
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        ctx.warn(
            f"model: {len(unknown)} key(s) not in the {family} key tables, kept unchanged: "
            f"{', '.join(unknown[:8])}{more}"
        )
        return
    drop = set(unknown)
    kept_leaves = {id(v) for k, v in model.items if k not in drop}
    lost = [k for k, v in model.items if k in drop and id(v) not in kept_leaves]
    if lost and optimizer_indexed(ctx.root):
        raise UnsupportedContentError(
            ctx.source_path,
            f"--drop-unmatched-keys would remove {len(lost)} model tensor(s) ({lost[0]}…) while "
            "the optimizer keeps its state by parameter index, misaligning it",
            "omit --drop-unmatched-keys: unmatched keys are kept unchanged",
        )
    model.items = [(k, v) for k, v in model.items if k not in drop]
    for key in unknown:
        ctx.changed(f"model.{key}: dropped (--drop-unmatched-keys; not in the {family} key tables)")
