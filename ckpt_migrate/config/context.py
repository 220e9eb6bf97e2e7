"""What a config step works on and reports: ``ConfigContext`` (the YAML document of one
``params.yaml`` and the model family) and the report entries (``ConfigChange``, ``ConfigUpgrade``).

Every release hop's ``CONFIG_OPERATIONS`` are functions ``op(ctx: ConfigContext)`` that edit
``ctx.data`` (ruamel round-trip objects: comments, key order and quoting survive) and report
every change through ``ctx``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ckpt_migrate.config import yaml_edit
from ckpt_migrate.hops.hop import Hop

Kind = Literal["changed", "added", "removed", "unknown", "note"]


@dataclass(frozen=True)
class ConfigChange:
    """One entry of the config report."""

    kind: Kind
    key: str
    old: Any = None
    new: Any = None
    hop: str = ""
    why: str = ""
    moved_to: str | None = None  # a key renamed or moved: its new place

    def line(self) -> str:
        where = f"{self.key} → {self.moved_to}" if self.moved_to else self.key
        if self.kind == "changed" and self.moved_to and _same(self.old, self.new):
            what = ""
        elif self.kind == "changed":
            what = f": {_show(self.old)} → {_show(self.new)}"
        elif self.kind == "added":
            what = f": {_show(self.new)}"
        elif self.kind in ("removed", "unknown"):
            what = f" (was {_show(self.old)})" if self.kind == "removed" else ""
        else:
            what = ""
        why = f" — {self.why}" if self.why else ""
        hop = f"[{self.hop}] " if self.hop else ""
        return f"{hop}{self.kind}: {where}{what}{why}"

    def to_json(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "key": self.key,
            "old": yaml_edit.plain(self.old),
            "new": yaml_edit.plain(self.new),
            "hop": self.hop,
            "why": self.why,
        }
        if self.moved_to:
            out["moved_to"] = self.moved_to
        return out


# A hop's run of this many changes for one reason (2.3's trainer layout moves 20 keys) is one
# line naming the first few; ``--json`` and the written file have every one.
GROUP_AT = 4
GROUP_SHOWN = 2


def grouped_lines(report: list[ConfigChange]) -> list[str]:
    """One line per change, except that a run of ``GROUP_AT`` or more changed, added or removed
    keys of one hop and one reason is one line; unknown keys and notes always stand alone."""
    out: list[str] = []
    i = 0
    while i < len(report):
        j = i + 1
        while j < len(report) and _groupable(report[i], report[j]):
            j += 1
        run = report[i:j]
        if len(run) < GROUP_AT:
            out.extend(c.line() for c in run)
        else:
            keys = [f"{c.key} → {c.moved_to}" if c.moved_to else c.key for c in run]
            shown = ", ".join(keys[:GROUP_SHOWN])
            out.append(f"[{run[0].hop}] {run[0].kind}: {len(run)} keys ({shown}, …) — {run[0].why}")
        i = j
    return out


def _groupable(a: ConfigChange, b: ConfigChange) -> bool:
    return (
        a.kind in ("changed", "added", "removed")
        and (a.kind, a.hop, a.why) == (b.kind, b.hop, b.why)
        and bool(a.why)
    )


def _same(a: Any, b: Any) -> bool:
    return yaml_edit.plain(a) == yaml_edit.plain(b)


def _show(value: Any) -> str:
    import json

    text = json.dumps(yaml_edit.plain(value), default=str)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass
class ConfigUpgrade:
    """The upgraded config text and the report of every change, with the hop that made it."""

    text: str
    report: list[ConfigChange]
    from_release: str = ""
    to_release: str = ""
    family: str | None = None
    family_source: str | None = None
    source: Path | None = None
    output: Path | None = None

    @property
    def changed(self) -> bool:
        return any(c.kind in ("changed", "added", "removed") for c in self.report)

    def count(self, kind: Kind) -> int:
        return sum(1 for c in self.report if c.kind == kind)

    def lines(self) -> list[str]:
        src = f"{self.source}: " if self.source else ""
        fam = f"{self.family} ({self.family_source})" if self.family else "unknown"
        head = f"{src}config {self.from_release} → {self.to_release}, model family {fam}"
        counts = ", ".join(
            f"{self.count(k)} {k}" for k in ("changed", "added", "removed", "unknown", "note")
        )
        lines = [head, *(f"  {line}" for line in grouped_lines(self.report)), f"  {counts}"]
        if self.output is not None:
            lines.append(f"  written to {self.output}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "source": str(self.source) if self.source else None,
            "output": str(self.output) if self.output else None,
            "from": self.from_release,
            "to": self.to_release,
            "family": self.family,
            "family_source": self.family_source,
            "report": [c.to_json() for c in self.report],
        }


@dataclass
class ConfigContext:
    """What a config operation sees: the document to edit, the family, inputs, the report."""

    data: Any
    family: str | None = None
    model_name: str | None = None  # Model Zoo registry name, when known for sure
    name_hint: str = ""  # why the name is not known, for the report
    num_csx: int | None = None
    report: list[ConfigChange] = field(default_factory=list)
    hop: Hop | None = None
    target: str = ""  # the release the whole upgrade goes to

    # ------------------------------------------------------------------ reporting
    def _record(self, kind: Kind, key: str, old: Any, new: Any, why: str, to: str | None) -> None:
        hop = f"{self.hop.source}→{self.hop.target}" if self.hop else ""
        self.report.append(
            ConfigChange(kind, key, _copy(old), _copy(new), hop, " ".join(why.split()), to)
        )

    def changed(self, key: str, old: Any, new: Any, why: str) -> None:
        self._record("changed", key, old, new, why, None)

    def moved(self, key: str, to: str, value: Any, why: str, new: Any = ...) -> None:
        self._record("changed", key, value, value if new is ... else new, why, to)

    def added(self, key: str, new: Any, why: str) -> None:
        self._record("added", key, None, new, why, None)

    def removed(self, key: str, old: Any, why: str) -> None:
        self._record("removed", key, old, None, why, None)

    def unknown(self, key: str, value: Any, why: str) -> None:
        self._record("unknown", key, value, value, why, None)

    def note(self, key: str, why: str) -> None:
        self._record("note", key, None, None, why, None)

    def flag_to_value(
        self, path: str, section: Any, flag: str, key: str, new: Any, why: str
    ) -> None:
        """Replace the flag ``section[flag]`` by ``key: new`` in its place. If ``key`` is already
        set, the flag is dropped when the two agree and both are kept (and reported) when not."""
        old = section[flag]
        where = f"{path}.{flag}"
        if key not in section:
            yaml_edit.rename(section, flag, key, new)
            self.moved(where, f"{path}.{key}", old, why, new=new)
        elif section[key] == new:
            yaml_edit.take(section, flag)
            self.removed(where, old, f"{key} already says {new!r} ({why})")
        else:
            self.unknown(where, old, f"conflicts with {key} {section[key]!r}: both kept, decide")

    # ------------------------------------------------------------------ layout
    @property
    def legacy(self) -> bool:
        """The pre-2.3 layout (train_input/model/optimizer/runconfig at the top)."""
        return "trainer" not in self.data

    def section(self, name: str) -> Any:
        """A top-level mapping of the legacy layout, or None."""
        value = self.data.get(name) if self.legacy else None
        return value if yaml_edit.is_map(value) else None

    def model_sections(self) -> list[tuple[str, Any]]:
        """(path, mapping) of every model section, in either layout."""
        if self.legacy:
            model = self.section("model")
            return [("model", model)] if model is not None else []
        out = []
        for path, trainer in self.trainers():
            init = trainer.get("init")
            model = init.get("model") if yaml_edit.is_map(init) else None
            if yaml_edit.is_map(model):
                out.append((f"{path}.init.model", model))
        return out

    def trainers(self) -> list[tuple[str, Any]]:
        trainer = self.data.get("trainer")
        if yaml_edit.is_map(trainer):
            return [("trainer", trainer)]
        if yaml_edit.is_seq(trainer):
            return [(f"trainer[{i}]", t) for i, t in enumerate(trainer) if yaml_edit.is_map(t)]
        return []

    def model_keys(self) -> set[str]:
        return {str(k) for _, m in self.model_sections() for k in m}


def _copy(value: Any) -> Any:
    """A snapshot for the report (later steps may edit the same mapping)."""
    return yaml_edit.plain(value)
