"""What a migration step is, and the context it runs in.

Modelled on PyTorch Lightning's ``utilities/migration/migration.py``: each release hop is a
module of ``ckpt_migrate.migrations`` declaring ``SOURCE``, ``TARGET`` and ``OPERATIONS``, a tuple
of small functions, each with a docstring saying which release changed what and where that fact
was learned. An operation edits the neutral tree in ``ctx.root`` (structure and values; tensor
data is only read when an operation transforms it) and reports every change through ``ctx``.

Container-format changes (type tags, version attributes, the 0.4 → 0.5 re-encoding) need no
tree edit: the writer of the target release encodes them. A hop declares them in ``FORMAT`` so a
plan can show them.

A hop's changes to the run's ``params.yaml`` are ``CONFIG_OPERATIONS``, functions of a
:class:`ckpt_migrate.config.upgrade.ConfigContext`, run by ``upgrade --config``.

Downgrades walk hops backwards, as Model Zoo's converters can (every CS <-> CS converter is
bidirectional). A hop that can be undone declares ``DOWN_OPERATIONS`` (tree steps that undo
``OPERATIONS``; the older release's writer undoes ``FORMAT``) and, where its config steps can be
undone, ``DOWN_CONFIG_OPERATIONS``. Without them the hop is one way and ``DOWN_REFUSAL`` says
what would be lost. :meth:`Hop.reverse` makes the backward hop the engine runs like any other.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ckpt_migrate.format.tree import Node

Operation = Callable[["StepContext"], None]


def root_level(operation: Operation) -> Operation:
    """Declare that ``operation`` edits only values the 0.5 format keeps in root attributes
    (``__metadata__``, scalars, the structure), never a tensor, a pickled object or a name
    that has a dataset: a hop made of such operations, with no container change, leaves every
    dataset of a 0.5 file as it is (:attr:`Hop.root_only`), and the engine then edits the
    root of a copy instead of rebuilding the tree (``engine.rootedit``)."""
    operation.root_level = True  # type: ignore[attr-defined]
    return operation


@dataclass(frozen=True)
class InputSpec:
    """An extra input a hop may use (e.g. the 1.9 dataloader side files), declared once: the
    commands that run hops (``upgrade``, ``upgrade-dir``, ``plan``) and the scripts build their
    options from it (``cli.hop_options``)."""

    name: str  # option name without dashes, e.g. "data_iter_dir"
    help: str
    required: bool = False  # without it the hop fails (else it runs and says what it skipped)
    # "option": an option built from this declaration; "verb": the verbs' own option of that
    # name (--config, which they also upgrade); "script": set by a script, never typed
    given_by: str = "option"
    kind: str = "flag"  # flag | path | int | choice: what the option takes
    choices: tuple[str, ...] = ()  # kind "choice"
    aliases: tuple[str, ...] = ()  # more spellings the scripts accept (Model Zoo's documented)
    needs: tuple[str, ...] = ()  # inputs that must be given with this one
    excludes: tuple[str, ...] = ()  # inputs that cannot be given with this one

    @property
    def option(self) -> bool:
        return self.given_by == "option"

    @property
    def flag(self) -> str:
        """The ``ckpt-migrate`` spelling: ``--data-iter-dir``."""
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Hop:
    source: str
    target: str
    module: str  # dotted module name, for messages
    doc: str
    operations: tuple[Operation, ...] = ()
    inputs: tuple[InputSpec, ...] = ()
    format: tuple[float, float] | None = None  # (from, to) when the on-disk format changes
    changes: tuple[str, ...] = ()  # what the target release's writer changes on disk
    # params.yaml steps, op(ctx: config_upgrade.ConfigContext) -> None (``upgrade --config``)
    config_operations: tuple[Callable[..., None], ...] = ()
    # Downgrades: None means the hop cannot be undone, for the reason in ``down_refusal``.
    down_operations: tuple[Operation, ...] | None = None
    down_config_operations: tuple[Callable[..., None], ...] | None = None
    down_refusal: str = ""
    reversed_from: str | None = None  # set on a backward hop: the module it undoes

    @property
    def is_downgrade(self) -> bool:
        return self.reversed_from is not None

    def reverse(self) -> Hop:
        """The backward hop (``target`` → ``source``) that undoes this one; the caller checks
        ``down_operations`` first. Its config steps are ``down_config_operations`` (none when
        they cannot be undone: ``config_reversible`` says so)."""
        assert self.down_operations is not None, self.module
        return Hop(
            source=self.target,
            target=self.source,
            module=self.module,
            doc=f"{self.target} → {self.source}: undoes {self.summary}",
            operations=self.down_operations,
            inputs=(),
            format=(self.format[1], self.format[0]) if self.format else None,
            changes=tuple(f"{self.source}'s writer undoes: {change}" for change in self.changes),
            config_operations=self.down_config_operations or (),
            down_config_operations=self.down_config_operations,
            reversed_from=self.module,
        )

    @classmethod
    def at(cls, release: str, operations: tuple[Operation, ...]) -> Hop:
        """Operations run on a file already at ``release``, written back at it: a script's one
        step (``data_iter_state_conversion.py`` on the 2.0 file ``fix_checkpoint_spec.py``
        wrote adds the dataloader state, as Model Zoo's does)."""
        first = operations[0]
        return cls(
            source=release,
            target=release,
            module=first.__module__,
            doc=f"{release}: {_first_line(first.__doc__) or first.__name__}",
            operations=operations,
        )

    @property
    def config_reversible(self) -> bool:
        """False for a backward hop whose forward config steps cannot be undone."""
        return not self.is_downgrade or self.down_config_operations is not None

    @property
    def root_only(self) -> bool:
        """Whether this hop changes nothing but root-level values: no container change
        (``format``, ``changes``) and only :func:`root_level` operations."""
        return (
            self.format is None
            and not self.changes
            and all(getattr(op, "root_level", False) for op in self.operations)
        )

    @property
    def summary(self) -> str:
        return (
            self.doc.strip().splitlines()[0]
            if self.doc.strip()
            else f"{self.source} → {self.target}"
        )

    def describe(self) -> list[str]:
        """One line per thing this hop changes, for plans and ``history``."""
        lines = [_first_line(op.__doc__) or op.__name__ for op in self.operations]
        lines.extend(self.changes)
        lines.extend(f"config: {line}" for line in self.describe_config())
        return lines or ["no change: only the release advances"]

    def describe_config(self) -> list[str]:
        """One line per config step (``upgrade --config``)."""
        return [_first_line(op.__doc__) or op.__name__ for op in self.config_operations]

    def to_json(self, given: Any = ()) -> dict[str, Any]:
        """The hop as data; ``given`` names the inputs the user supplied."""
        return {
            "from": self.source,
            "to": self.target,
            "module": self.module,
            "summary": self.summary,
            "format": list(self.format) if self.format else None,
            "changes": self.describe(),
            "config_changes": self.describe_config(),
            "inputs": [
                {"name": i.name, "help": i.help, "required": i.required, "given": i.name in given}
                for i in self.inputs
                if i.given_by != "script"
            ],
        }

    @classmethod
    def from_module(cls, module: ModuleType) -> Hop:
        return cls(
            source=str(module.SOURCE),
            target=str(module.TARGET),
            module=module.__name__,
            doc=module.__doc__ or "",
            operations=tuple(getattr(module, "OPERATIONS", ())),
            inputs=tuple(getattr(module, "INPUTS", ())),
            format=getattr(module, "FORMAT", None),
            changes=tuple(getattr(module, "CHANGES", ())),
            config_operations=tuple(getattr(module, "CONFIG_OPERATIONS", ())),
            down_operations=_optional_tuple(module, "DOWN_OPERATIONS"),
            down_config_operations=_optional_tuple(module, "DOWN_CONFIG_OPERATIONS"),
            down_refusal=getattr(module, "DOWN_REFUSAL", ""),
        )


def _optional_tuple(module: ModuleType, name: str) -> tuple[Any, ...] | None:
    value = getattr(module, name, None)
    return None if value is None else tuple(value)


def _first_line(text: str | None) -> str:
    """A docstring's first sentence, whole: its first paragraph's lines joined up to the
    first full stop that ends one (a summary wrapped over two lines was cut mid-sentence)."""
    if not text or not text.strip():
        return ""
    paragraph = " ".join(text.strip().split("\n\n")[0].split())
    end = re.search(r"(?<!\be\.g)(?<!\bi\.e)\.(?=\s|$)", paragraph)
    return paragraph if end is None else paragraph[: end.end()]


@dataclass
class StepContext:
    """What an operation sees: the tree to edit, the user's inputs, and a change log."""

    root: Node
    source_path: Path | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    strict: bool = False
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    hop: Hop | None = None

    def changed(self, message: str) -> None:
        self.changes.append(self._tag(message))

    def warn(self, message: str) -> None:
        self.warnings.append(self._tag(message))

    def _tag(self, message: str) -> str:
        if self.hop is None:
            return message
        hop = self.hop
        return (
            f"[{hop.source}] {message}"
            if hop.source == hop.target
            else f"[{hop.source}→{hop.target}] {message}"
        )
