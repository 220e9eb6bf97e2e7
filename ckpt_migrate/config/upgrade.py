"""Upgrade a Model Zoo ``params.yaml`` hop by hop, alongside its checkpoint.

Each release hop module declares ``CONFIG_OPERATIONS``, small functions ``op(ctx:
ConfigContext)`` that edit the YAML document in ``ctx.data`` (ruamel round-trip objects, so
comments, key order and quoting survive) and report every change through ``ctx``. Nothing is
dropped silently: a key a step cannot map stays where it is and is reported as ``unknown``.

The family (gpt2, llama, bert, t5, ...) decides the model-specific steps. It comes from the
caller (``--model``, or the family the checkpoint's keys showed), else from the config itself:
its own ``name`` (2.4+), or keys only one family has. A guess from keys is good enough for a
rule keyed on that very key (``use_biasless_norm`` exists only in GPT-J-style configs), never
for writing a model name: ``trainer.init.model.name`` is written only from a name the user or
the config gave, or a family whose Model Zoo name is unambiguous; otherwise the report asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_migrate import catalogue
from ckpt_migrate.atomic import atomic_output, check_parent, check_writable
from ckpt_migrate.config import yaml_edit
from ckpt_migrate.config.context import ConfigChange, ConfigContext, ConfigUpgrade
from ckpt_migrate.errors import CkptError, UsageError
from ckpt_migrate.format import releases
from ckpt_migrate.hops import graph
from ckpt_migrate.hops.hop import Hop
from ckpt_migrate.models.names import MODEL_NAMES, NAME_FROM_FAMILY, config_group, resolve_name

# Keys only one family's 1.x/2.x model config has (Model Zoo model classes' parameters), from
# the catalogue; encoder models first (BERT's markers do not count beside decoder_nonlinearity,
# which only T5/transformer configs have).
_MARKERS = tuple(
    (r.name, r.config_markers, r.marker_veto)
    for r in reversed(catalogue.families())
    if r.config_markers
)


# Families whose checkpoints have another family's keys and no signature of their own (Mistral's
# are LLaMA's): the keys cannot tell them apart, the config may.
_UNTOLD: dict[str, tuple[str, ...]] = {}
for _r in catalogue.families():
    if _r.same_keys_as and _r.signature is None:
        _UNTOLD[_r.same_keys_as] = (*_UNTOLD.get(_r.same_keys_as, ()), _r.name)

# ---------------------------------------------------------------------------- family


def family_from_config(data: Any) -> tuple[str | None, str | None, str]:
    """(family, registry name if the config names its model, evidence) from the config itself."""
    ctx = ConfigContext(data)
    for path, model in ctx.model_sections():
        for key in ("name", "model_name"):
            value = model.get(key)
            if isinstance(value, str) and value.strip().lower() in MODEL_NAMES:
                family, registry = MODEL_NAMES[value.strip().lower()]
                return family, registry, f"{path}.{key} = {value!r}"
    keys = ctx.model_keys()
    for family, markers, veto in _MARKERS:
        found = sorted(keys & markers)
        if found and not keys & veto:
            return family, None, f"model keys only {family} configs have: {', '.join(found)}"
    return None, None, ""


def _resolve_family(
    data: Any, family: str | None, family_source: str | None
) -> tuple[str | None, str | None, str, str | None]:
    """(family, registry name or None, hint when no name, where the family came from)."""
    if family is not None:
        fam, registry = resolve_name(family)
        if family_source is None:  # the caller vouches for the exact model (e.g. --model)
            hint = "" if registry else f"Model Zoo has no registry name for {family!r}"
            return fam, registry, hint, "from --model"
        # A family seen in the checkpoint's keys: the name only where variants cannot differ.
        registry = NAME_FROM_FAMILY.get(fam)
        hint = "" if registry else f"the {fam} family has several Model Zoo models"
        cfg_family, cfg_registry, evidence = family_from_config(data)
        if cfg_registry and cfg_family == fam:
            return fam, cfg_registry, "", f"{family_source}; {evidence}"
        alike = _UNTOLD.get(fam, ())
        if cfg_family in alike:  # the config tells apart what the keys cannot
            fam, registry = resolve_name(cfg_family)
            return fam, cfg_registry or registry, "", f"{family_source}; {evidence}"
        if registry and alike:
            hint = (
                f"from the checkpoint keys, which {' and '.join(alike)} checkpoints share: "
                f"pass --model {alike[0]} for one"
            )
        return fam, registry, hint, family_source
    fam, registry, evidence = family_from_config(data)
    if fam is None:
        return None, None, "the model family is unknown", None
    hint = "" if registry else f"the family was only inferred from config keys ({evidence})"
    return fam, registry, hint, f"config: {evidence}"


# ---------------------------------------------------------------------------- entry points


def upgrade_config_text(
    text: str,
    from_release: str,
    to_release: str,
    *,
    family: str | None = None,
    num_csx: int | None = None,
    source: Path | None = None,
    family_source: str | None = None,
) -> ConfigUpgrade:
    """Run every hop's config steps from ``from_release`` to ``to_release`` on ``text``.

    ``family`` is a model name or alias (``--model``); with ``family_source`` set it is only a
    family seen elsewhere (e.g. ``"checkpoint keys"``), not a user's word for the exact model.
    Returns the new text (the input unchanged, byte for byte, when nothing changed) and the
    report.
    """
    if num_csx is not None and num_csx < 1:
        raise UsageError(None, f"--num-csx must be at least 1, not {num_csx}")
    src, tgt = releases.get(from_release), releases.get(to_release)
    hops = graph.load().path(src, tgt)
    data, style = yaml_edit.load(text, source)
    fam, registry, hint, fam_source = _resolve_family(data, family, family_source)
    ctx = ConfigContext(data, fam, registry, hint, num_csx, target=tgt.name)
    for repeat in style.repeats:
        ctx.note(
            ".".join(repeat.key),
            f"given twice with the same value (lines {repeat.first} and {repeat.again}): read "
            "once, and written once where the config changes",
        )
    if fam is None and hops:
        ctx.note(
            "model",
            "model family unknown (no --model, not seen in the checkpoint, not evident from "
            "the config): model-specific config steps are skipped",
        )
    seen, _, evidence = family_from_config(data)
    if fam and seen and config_group(seen) != config_group(fam):
        ctx.note(
            "model",
            f"the config looks like {seen} ({evidence}), but {fam} was given; "
            f"{fam}'s config steps are applied",
        )
    started_legacy = ctx.legacy
    skipped: list[str] = []
    for hop in hops:
        ctx.hop = hop
        if not hop.config_reversible and ctx.legacy and _across_trainer_layout(hop):
            # Model Zoo 2.3.0 shipped its configs in the legacy layout, which 2.2 reads as is.
            ctx.note("trainer", "the config is in the legacy layout: nothing of the 2.3 trainer "
                     "layout to undo")  # fmt: skip
            continue
        if not hop.config_reversible:
            raise UsageError(
                source,
                f"cannot downgrade the config from {src.name} to {tgt.name}: the "
                f"{hop.source} → {hop.target} config changes cannot be undone here",
                "downgrade only the checkpoint (ckpt-migrate upgrade without a config) and "
                "keep the older params.yaml",
            )
        if not started_legacy and not hop.is_downgrade and _before_trainer_layout(hop):
            if hop.config_operations:
                skipped.append(f"{hop.source}→{hop.target}")
            continue
        for operation in hop.config_operations:
            operation(ctx)
    ctx.hop = None
    if skipped:
        ctx.report.insert(
            0,
            ConfigChange(
                "note",
                "trainer",
                hop=skipped[0],
                why=f"the config is already in the 2.3+ trainer layout: the steps of "
                f"{', '.join(skipped)} (legacy layout) were not applied",
            ),
        )
    out = ConfigUpgrade(
        text=text,
        report=ctx.report,
        from_release=src.name,
        to_release=tgt.name,
        family=fam,
        family_source=fam_source,
        source=source,
    )
    if out.changed:  # else the text stays byte for byte the input's
        dumped = yaml_edit.dump(data, style).replace("\n", yaml_edit.line_ending(text))
        out.text = "\ufeff" * text.startswith("\ufeff") + dumped  # (a Windows editor's BOM)
    return out


def config_release(
    text: str,
    current: str,
    earlier: Sequence[str],
    *,
    family: str | None = None,
    family_source: str | None = None,
    source: Path | None = None,
) -> tuple[str, str | None]:
    """The release a config is at, beside a checkpoint of release ``current`` that ckpt-migrate
    upgraded from the releases ``earlier`` (its provenance records' sources), and why when
    that is not ``current``.

    ``fix_checkpoint_spec.py`` and ``data_iter_state_conversion.py`` upgrade a checkpoint to 2.0
    and leave its config as it was, as Model Zoo's scripts did, and so does an upgrade without
    ``--config``. Upgraded from 2.0 with that checkpoint, a 1.9 config kept ``use_rms_norm``,
    which 2.0 no longer reads, and nothing said so. The config is at the oldest of those
    releases whose steps to the next one would still rename or add a key of it (such a step
    finds nothing to do a second time), else at ``current``. A value changed in place is no
    evidence (T5's 1.8 inversion of one would change it a second time), nor is a key removed
    (Model Zoo's own 2.0 configs kept 1.9's server counts, which the 1.9 → 2.0 step removes)."""
    now = releases.get(current).version
    chain = sorted(
        {r for r in earlier if r in releases.BY_NAME and releases.get(r).version < now},
        key=lambda r: releases.get(r).version,
    )
    for older, newer in zip(chain, [*chain[1:], current]):
        trial = upgrade_config_text(
            text, older, newer, family=family, family_source=family_source, source=source
        )
        evidence = [c for c in trial.report if c.kind == "added" or c.moved_to]
        if evidence:
            what = evidence[0].line().split("] ", 1)[-1].split(" — ")[0]
            return older, (
                f"the checkpoint was upgraded from {older} by ckpt-migrate without its config, "
                f"which is still {older}'s ({what}): upgraded from {older}"
            )
    return current, None


def _across_trainer_layout(hop: Hop) -> bool:
    """The hop between 2.2 and 2.3 (either way), whose config step is the trainer layout."""
    from packaging.version import Version

    low, high = sorted((Version(hop.source), Version(hop.target)))
    return low <= Version("2.2") < high


def _before_trainer_layout(hop: Hop) -> bool:
    from packaging.version import Version

    return Version(hop.target) <= Version("2.2")


def upgrade_config_file(
    src: Path,
    dst: Path,
    from_release: str,
    to_release: str,
    *,
    family: str | None = None,
    num_csx: int | None = None,
    family_source: str | None = None,
) -> ConfigUpgrade:
    """Upgrade the config file ``src`` into ``dst``: written beside ``dst`` to a temporary file,
    fsynced, then moved into place; an existing ``dst`` is never overwritten (clear error)."""
    src, dst = Path(src), Path(dst)
    text = yaml_edit.read_config(src)
    result = upgrade_config_text(
        text,
        from_release,
        to_release,
        family=family,
        num_csx=num_csx,
        source=src,
        family_source=family_source,
    )
    return write_upgraded(result, src, dst)


def write_upgraded(result: ConfigUpgrade, src: Path, dst: Path) -> ConfigUpgrade:
    """An upgraded config's text into ``dst``: written beside it, fsynced, moved into place,
    never over an existing file (``src``: the config it came from, whose permissions it
    takes)."""
    with atomic_output(dst, like=src) as tmp:
        tmp.write_text(result.text, encoding="utf-8", newline="")
    result.output = dst
    return result


def default_output(config: Path, to_release: str, output_dir: Path | None) -> Path:
    """Where ``upgrade --config`` writes the upgraded config when ``--config-out`` is absent.

    With ``--output-dir D``: ``D/<config name>``, as checkpoints keep their names there. Beside
    the source config (``--inplace``, or ``D`` being the config's own directory):
    ``<config stem>.<to-release><suffix>``, e.g. ``params.2.10.yaml``. Never the config itself.
    """
    name = releases.get(to_release).name
    if output_dir is not None:
        target = output_dir / config.name
        if not _same_place(target, config):
            return target
    return config.with_name(f"{config.stem}.{name}{config.suffix or '.yaml'}")


def _same_place(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


@dataclass
class ConfigOutcome:
    """The config part of one ``upgrade`` result: the upgrade, or why there is none."""

    result: ConfigUpgrade | None = None
    error: str | None = None
    exit_code: int = 0
    message: str | None = None  # e.g. "not written (dry run)"

    def lines(self) -> list[str]:
        if self.error:
            return []
        out = self.result.lines() if self.result else []
        if self.message:
            out.append(f"  {self.message}")
        return out

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = self.result.to_json() if self.result else {}
        if self.error:
            data["error"] = self.error
        if self.message:
            data["message"] = self.message
        return data


class ConfigAlongside:
    """``upgrade --config``: the config goes from the checkpoint's release to the same target.

    Everything that can be checked before a checkpoint is touched is checked in the
    constructor (the config parses, its output does not exist, ``--num-csx`` is sane). The
    config is upgraded once, with the first checkpoint that did not fail; a later checkpoint
    from another release gets a warning.
    """

    def __init__(
        self,
        config: Path,
        *,
        config_out: Path | None,
        num_csx: int | None,
        target: str,
        output_dir: Path | None,
        dry_run: bool,
        model: str | None,
        rerun: bool = False,
    ) -> None:
        """``rerun`` (``upgrade-dir``): an existing output is accepted if it is what this run
        would write (an earlier, interrupted run wrote it), and the config is written even when
        already at the target, so that the output directory is complete."""
        if num_csx is not None and num_csx < 1:
            raise UsageError(None, f"--num-csx must be at least 1, not {num_csx}")
        self.config = Path(config)
        self.text = yaml_edit.read_config(self.config)
        yaml_edit.load(self.text, self.config)
        if model is not None:
            resolve_name(model)
        self.output = config_out or default_output(self.config, target, output_dir)
        if _same_place(self.output, self.config):
            raise UsageError(
                self.output, "would overwrite the config itself", "pass another --config-out"
            )
        self.rerun = rerun
        # (a dry run too: it fails where the run would; it passed an existing output)
        if self.output.exists() and not rerun:
            raise UsageError(
                self.output,
                "already exists; refusing to overwrite it",
                f"remove it or pass {'another ' if config_out else ''}--config-out",
            )
        # upgrade-dir (rerun) and upgrade create the --output-dir the default goes into
        made = rerun or (config_out is None and output_dir is not None)
        if not made:
            check_parent(self.output)
        check_writable(self.output.parent)  # (else refused once the checkpoint was written)
        self.num_csx, self.dry_run, self.model = num_csx, dry_run, model
        self.target = releases.get(target).name
        self.done: ConfigUpgrade | None = None
        self.done_source = self.done_from = ""

    def run(self, res: Any) -> ConfigOutcome | None:
        """Upgrade the config for checkpoint result ``res`` (an ``engine.UpgradeResult``)."""
        if res.status == "failed" or res.from_release is None:
            return None
        if self.done is not None:
            if res.from_release != self.done_from:
                res.warnings.append(
                    f"--config was upgraded from {self.done.from_release} (as "
                    f"{self.done_source}); this checkpoint is from {res.from_release}: upgrade "
                    "its config separately"
                )
            return None
        family, source = self.model, None
        if family is None and getattr(res, "family", None):
            family, source = res.family, "checkpoint keys"
        try:
            named = {"family": family, "family_source": source, "source": self.config}
            earlier = getattr(res, "upgraded_from", None) or ()
            start, why = config_release(self.text, res.from_release, earlier, **named)
            result = upgrade_config_text(
                self.text, start, res.to_release, num_csx=self.num_csx, **named
            )
            if why:
                result.report.insert(0, ConfigChange("note", "release", why=why))
            self.done, self.done_source, self.done_from = result, str(res.source), res.from_release
            if start == res.to_release and not self.rerun:
                return ConfigOutcome(result, message="not written: already at the target")
            if self.dry_run or res.status == "planned":
                return ConfigOutcome(result, message=f"not written (dry run): {self.output}")
            if self.rerun and self.output.exists():
                if yaml_edit.read_config(self.output) != result.text:
                    raise UsageError(
                        self.output,
                        "already exists and differs from this run's upgrade of the config; "
                        "refusing to overwrite it",
                        "remove it or pass --config-out",
                    )
                return ConfigOutcome(result, message=f"already there: {self.output}")

            return ConfigOutcome(write_upgraded(result, self.config, self.output))
        except CkptError as exc:
            return ConfigOutcome(error=f"config: {exc}", exit_code=exc.exit_code)
