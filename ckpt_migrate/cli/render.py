"""Text printers of every command: plain data in (from ``cli.commands``), lines out.

Results go to stdout, warnings and errors to stderr. rich is imported only by the printers that
draw tables, so that the TensorFlow scripts, which share this module, start without it.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING, Any

from ckpt_migrate.cli import jsontext
from ckpt_migrate.cli.console import echo, echo_lines, echo_pieces, safe

REPORT_FIELDS = ("bytes_read", "bytes_sent", "bytes_copied", "seconds")  # model_dir.report

if TYPE_CHECKING:
    from ckpt_migrate.config.upgrade import ConfigOutcome
    from ckpt_migrate.engine.upgrade import UpgradeResult
    from ckpt_migrate.format.deep_check import DeepReport
    from ckpt_migrate.model_dir.upgrade_dir import DirEntry


def emit_json(data: Any) -> None:
    """``data`` as indented JSON (``jsontext``), written as it is encoded (``echo_pieces``)."""
    echo_pieces(jsontext.pieces(data))


def inspect(data: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    console = _console(soft_wrap=True)  # long names are never wrapped
    console.print(Text(safe(data["path"]), style="bold"))
    console.print(
        f"release {data['release_label']}  format {data['format']}  "
        f"leaves {data['leaf_count']}  tensor bytes {data['tensor_bytes']:,}"
    )
    if "note" in data:
        console.print(Text(f"note: {data['note']}", style="yellow"))
    if data["bytes_by_dtype"]:
        table = Table("dtype", "tensors", "bytes")
        for dtype, d in sorted(data["bytes_by_dtype"].items()):
            table.add_row(dtype, str(d["tensors"]), f"{d['bytes']:,}")
        console.print(table)
    echo_lines(data["outline"])
    if data.get("outline_summary"):
        console.print("(a summary: --all shows every leaf, --depth N that many levels)")
    if data["missing"]:
        console.print(Text(f"missing leaves ({len(data['missing'])}):", style="yellow"))
        echo_lines(f"  {name}" for name in data["missing"])
    if data["unreferenced_datasets"]:
        count = len(data["unreferenced_datasets"])
        console.print(Text(f"datasets not named by the spec ({count}):", style="yellow"))
        echo_lines(f"  {name}" for name in data["unreferenced_datasets"])


def _console(soft_wrap: bool = False) -> Any:
    """rich's console for a table, taking no text as markup or emoji codes: a file named
    ``[bold]x:smile:.mdl`` was shown as a bold ``x😄.mdl``."""
    from rich.console import Console

    return Console(highlight=False, markup=False, emoji=False, soft_wrap=soft_wrap)


def from_torch(out: dict[str, Any]) -> None:
    echo(
        f"wrote {out['output']} (release {out['release']}, format {out['format']}, "
        f"{out['tensors']} tensors, {out['tensor_bytes']:,} bytes)"
    )


def hf_result(out: dict[str, Any], quiet: bool = False) -> None:
    """``export-hf`` / ``import-hf``: what was written, and every tensor left out, and why."""
    if not quiet:
        for name, why in out.get("dropped", {}).items():
            echo(f"  left out {name}: {why}")
        for name, instead in out.get("missing", {}).items():
            echo(f"  {name} {instead}")
        for warning in out.get("warnings", []):
            echo(f"  warning: {warning}", err=True)
    kind = f"release {out['release']}" if "release" in out else f"{out.get('shards', 1)} file(s)"
    echo(
        f"{out['source']}: {out['model']} written to {out['output']} ({kind}, "
        f"{out['tensors']} tensors, {out['bytes']:,} bytes, {out['seconds']:.2f}s)"
    )


def history(data: dict[str, Any]) -> None:
    for rel in data["releases"]:
        echo(f"{rel['name']:>5}  format {rel['format']}  {rel['spec']}; {rel['type_tags']}")
    echo("")
    for hop in data["hops"]:
        hop_lines(hop, "", show_state=False)
    echo(f"newest: {data['newest']}")


def hop_lines(hop: dict, indent: str, *, show_state: bool) -> None:
    fmt = f" [format {hop['format'][0]} → {hop['format'][1]}]" if hop["format"] else ""
    echo(f"{indent}{hop['from']} → {hop['to']}{fmt}  ({hop['module'].rsplit('.', 1)[-1]})")
    for line in hop["changes"]:
        echo(f"{indent}    - {line}")
    for inp in hop["inputs"]:
        state = "given" if inp["given"] else ("REQUIRED" if inp["required"] else "optional")
        label = f" ({state})" if show_state else ""
        echo(f"{indent}    input --{inp['name'].replace('_', '-')}{label}: {inp['help']}")


def warnings(lines: list[str]) -> None:
    for line in lines:
        echo(f"warning: {line}", err=True)


def plan(plan: dict) -> None:
    warnings(plan.get("warnings", []))  # (a dry run said its own)
    if plan["current"]:
        echo(f"{plan['source']}: already at {plan['to']}; nothing to do")
        return
    echo(f"{plan['source']}: {plan['from']} → {plan['to']} in {len(plan['hops'])} hop(s)")
    if plan.get("model"):
        echo(f"  model: {plan['model']['summary']}")
    for hop in plan["hops"]:
        hop_lines(hop, "  ", show_state=True)
    free = plan["free_available"]
    echo(
        f"  reads {plan['bytes_to_read']:,} bytes, writes up to {plan['bytes_to_write']:,} bytes; "
        f"needs {plan['free_needed']:,} bytes free in {plan['output_dir']}"
        + (f" ({free:,} available)" if free is not None else "")
    )


def config_outcome(cfg: ConfigOutcome | None) -> None:
    """The config report of ``upgrade --config`` (stdout), or its error (stderr)."""
    if cfg is None:
        return
    if cfg.error:
        echo(f"error: {cfg.error}", err=True)
    for line in cfg.lines():
        echo(line)


def messages(res: UpgradeResult, quiet: bool = False, listed_by: str = "") -> None:
    """An upgrade's warnings (stderr) and reported changes (stdout; not when ``quiet``); shared
    with the scripts."""
    warnings(res.warnings)
    if quiet:
        return
    if res.model and res.status in ("upgraded", "planned"):
        echo(f"  model: {res.model['summary']}")
    for line in fold_runs(res.changes, listed_by):
        echo(f"  {line}")


_NUMBER = re.compile(r"\d+")


def fold_runs(
    lines: list[str], listed_by: str = "", *, least: int = 6, shown: int = 2
) -> list[str]:
    """A run of at least ``least`` lines alike but for their numbers (each layer's rename,
    each scheduler stage's ``last_epoch``) as its first ``shown`` lines and a count: a model of
    80 layers, or 3,000 scheduler stages, is not a screen of lines each. ``listed_by``: the
    option that lists every line (the scripts have none)."""
    where = f" ({listed_by} lists each)" if listed_by else ""
    out: list[str] = []
    i = 0
    while i < len(lines):
        shape = _NUMBER.sub("#", lines[i])
        end = i + 1
        while end < len(lines) and _NUMBER.sub("#", lines[end]) == shape:
            end += 1
        if end - i >= least:
            out += lines[i : i + shown]
            tag = lines[i].split("] ", 1)[0] + "] " if lines[i].startswith("[") else ""
            out.append(f"{tag}… and {end - i - shown:,} more like these{where}")
        else:
            out += lines[i:end]
        i = end
    return out


def upgrade_result(res: UpgradeResult, quiet: bool = False) -> None:
    messages(res, quiet, "--json")
    if res.status == "failed":
        echo(f"error: {res.error}", err=True)
        return
    if res.status == "current":
        where = "left alone"
        if res.placed and res.output is not None:
            where = f"{res.placed} into {res.output.parent}"
        echo(f"{res.source}: already at {res.to_release}; {where}")
        return
    if res.status == "planned" and res.plan is not None:
        if quiet:
            hops = f"{res.from_release} → {res.to_release} in {len(res.hops)} hop(s)"
            echo(f"{res.source}: {hops}; dry run, nothing written")
            return
        plan(res.plan)
        echo(f"{res.source}: dry run; nothing written")
        return
    extra = f", backup {res.backup}" if res.backup else ""
    echo(
        f"{res.source}: {res.from_release} → {res.to_release} written to {res.output} "
        f"({res.strategy}, verified: {res.verified}, {res.seconds:.2f}s{extra}); "
        f"tensor data {res.tensor_data}"
    )


def dir_entry(entry: DirEntry, quiet: bool = False) -> None:
    res = entry.result
    if res is not None and entry.status in ("upgraded", "planned", "failed"):
        upgrade_result(res, quiet)
    elif entry.status == "current" and res is not None:
        placed = entry.action and res.output is not None
        where = f"; {entry.action} into {res.output.parent}" if placed else "; left alone"
        echo(f"{entry.path}: already at {res.to_release}{where}")
    elif entry.status == "already-upgraded" and res is not None:
        echo(f"{entry.path}: already upgraded to {res.to_release} in {res.output}")
    elif entry.status == "not-selected":
        echo(f"{entry.path}: left alone ({entry.reason})")
    else:
        echo(f"{entry.path}: {entry.kind}, {entry.status.replace('-', ' ')} ({entry.reason})")


def dir_summary(entries: list[DirEntry], worst: int) -> None:
    from rich.table import Table

    table = Table("file", "kind", "outcome", "release", title="upgrade-dir summary")
    for e in entries:
        res = e.result
        release = ""
        if res is not None and res.from_release and res.to_release:
            release = f"{res.from_release} → {res.to_release}"
            if res.from_release == res.to_release:
                release = res.to_release
        outcome = e.status + (f" ({e.action})" if e.action else "")
        table.add_row(safe(e.path.name), e.kind, outcome, release)
    console = _console()
    console.print(table)
    counts = Counter(e.status for e in entries)
    totals = ", ".join(f"{n} {status}" for status, n in counts.items())
    console.print(dir_totals(entries), soft_wrap=True)
    console.print(f"{totals}; exit {worst}")


def dir_totals(entries: list[DirEntry]) -> str:
    """The fleet report's sums (``model_dir.report``: each checkpoint's bytes and time)."""
    t: Counter[str] = Counter()
    for e in entries:
        row = e.to_json() if e.kind == "checkpoint" else {}
        t.update({k: row.get(k) or 0 for k in REPORT_FIELDS})
    return (
        f"bytes read {t['bytes_read']:,.0f}, sent {t['bytes_sent']:,.0f}, copied server-side "
        f"or shared {t['bytes_copied']:,.0f}; {t['seconds']:.1f}s of upgrades"
    )


def deep_check(report: DeepReport) -> None:
    """Each damaged tensor on a line of its own, then the one-line refusal (exit 2)."""
    where = safe(str(report.path))
    for name, problem in report.damaged:
        echo(f"{where}: {safe(name)} does not decode: {safe(problem)}")
    echo(f"{where}: {report.tensors} tensors, {report.bytes_decoded:,} bytes decoded")
    error = report.error()
    if error is not None:
        raise error


def verify(data: dict[str, Any]) -> None:
    for d in data["differences"]:
        echo(f"{d['name']}: {d['what']}")
    verdict = "identical" if data["identical"] else f"{len(data['differences'])} difference(s)"
    echo(f"{data['tensors_compared']} tensors compared{compared_how(data)}: {verdict}")


def compared_how(data: dict[str, Any]) -> str:
    """How ``verify`` compared the tensors, where any were equal as stored (not decoded)."""
    stored, total = data["tensors_equal_as_stored"], data["tensors_compared"]
    if not stored:
        return ""
    rest = f", {total - stored} decoded and hashed" if stored < total else ""
    return f" ({stored} equal as stored, not decoded{rest})"


def tf_to_h5(data: dict[str, Any]) -> None:
    for note in data["notes"]:
        echo(f"note: {note}", err=True)
    if data["excluded"]:
        echo(f"excluded {len(data['excluded'])} variable(s): {', '.join(data['excluded'][:5])}")
    step = data["global_step"]
    step_text = "" if step is None else f"; global step {step} ({data['global_step_variable']})"
    echo(
        f"wrote {data['output']} (release {data['release']}, format {data['format']}, "
        f"{data['variables']} variable(s), {data['tensor_bytes']:,} tensor bytes, "
        f"verified: {data['verified']}{step_text})"
    )


def h5_to_tf(data: dict[str, Any]) -> None:
    for note in data["notes"]:
        echo(f"note: {note}", err=True)
    if data["excluded"]:
        echo(f"excluded {len(data['excluded'])} leaf/leaves: {', '.join(data['excluded'][:5])}")
    for out in data["outputs"]:
        for note in out["notes"]:
            echo(f"note: {note}", err=True)
        picked = f" [{out['selector']}]" if out["selector"] else ""
        sliced = f", {len(out['sliced'])} variable(s) split into slices" if out["sliced"] else ""
        echo(
            f"wrote {out['prefix']}{picked} ({out['variables']} variable(s), "
            f"{out['tensor_bytes']:,} bytes in {out['data_files']} data file(s){sliced})"
        )
    if data["state_file"]:
        echo(f"wrote {data['state_file']}")
    if data["global_step"] is not None:
        echo(f"global step {data['global_step']}")
    echo(f"verified: {data['verified']}")
