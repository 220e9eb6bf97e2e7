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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ckpt_migrate.format.tree import Node

Operation = Callable[["StepContext"], None]


@dataclass(frozen=True)
class InputSpec:
    """An extra input a hop may use (e.g. the 1.9 dataloader side files)."""

    name: str  # option name without dashes, e.g. "data_iter_dir"
    help: str
    required: bool = False  # without it the hop fails (else it runs and says what it skipped)


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
        )


def _first_line(text: str | None) -> str:
    return text.strip().splitlines()[0] if text and text.strip() else ""


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
        return f"[{self.hop.source}→{self.hop.target}] {message}" if self.hop else message
