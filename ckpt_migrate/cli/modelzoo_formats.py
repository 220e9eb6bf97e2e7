"""Model Zoo's converter names: ``cs-X.Y`` formats, the release of a source file, and output
names (``scripts/convert_checkpoint.py``; tag Release_2.10.0,
``src/cerebras/modelzoo/tools/convert_checkpoint.py``)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any, NamedTuple

from ckpt_migrate import jsonfile
from ckpt_migrate.config.upgrade import config_release
from ckpt_migrate.engine.plan import source_release
from ckpt_migrate.errors import UsageError
from ckpt_migrate.format import provenance, releases
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.releases import Release
from ckpt_migrate.hf import safetensors_io as st
from ckpt_migrate.hops import graph
from ckpt_migrate.models.keys import KeyRename
from ckpt_migrate.models.names import MODELZOO_NAMES, resolve_name
from ckpt_migrate.torch import hf_bin

FORMAT_RE = re.compile(r"cs-(\d+)\.(\d+)(?:\.\d+)?")
EXTENSIONS_RE = re.compile(r"(?:\.[A-Za-z]+)+$")


def parse_format(text: str, *, source: bool) -> Release | None:
    """A ``cs-X.Y`` format as a release (two-digit minors: ``cs-2.10`` is 2.10, not 2.1).

    ``cs-auto`` (source only) gives None: detect it from the file. ``cs-current`` (target
    only) is the newest release this tool knows (Model Zoo takes the installed cerebras.pytorch;
    none is needed here).
    """
    flag = "--src-fmt" if source else "--tgt-fmt"
    value = text.strip().lower()
    if source and value == "cs-auto":
        return None
    if not source and value == "cs-current":
        return releases.LATEST
    if value == "hf":  # (the verbs take it before asking for a release)
        raise UsageError(None, f"{flag} hf: Hugging Face is not a Cerebras release")
    match = FORMAT_RE.fullmatch(value)
    special = "cs-auto" if source else "cs-current"
    if match is None:
        raise UsageError(
            None,
            f"{flag} {text!r} is not a Cerebras format",
            f"use cs-X.Y (e.g. cs-2.0) or {special}",
        )
    name = f"{int(match[1])}.{int(match[2])}"
    if name not in releases.BY_NAME:
        known = ", ".join(f"cs-{r.name}" for r in releases.RELEASES)
        raise UsageError(None, f"{flag} {text!r}: unknown release {name}", f"known: {known}")
    return releases.BY_NAME[name]


def stem(filename: str) -> str:
    """The name without its alphabetic extensions, as Model Zoo strips them
    (``checkpoint_1.7.mdl`` → ``checkpoint_1.7``, ``params.yaml`` → ``params``)."""
    return EXTENSIONS_RE.sub("", filename) or filename


def output_name(path: Path, tgt: Release, suffix: str) -> str:
    return f"{stem(path.name)}_to_cs-{tgt.name}{suffix}"


class Source(NamedTuple):
    """A source checkpoint's release, what to say about it, and its config's release."""

    release: str
    note: str | None
    config: str  # the config's release: the checkpoint's, unless it was upgraded without it


def resolve_source(
    path: Path,
    wanted: Release | None,
    config: tuple[Path, str] | None = None,
    family: str | None = None,
) -> Source:
    """The release to convert from, and that of ``config`` (its path and text), if given.

    ``cs-auto`` reads what the file says, as ``ckpt-migrate`` detects it (root attributes, so
    pre-2.1 files work too, and the ``__metadata__[-1].version`` Model Zoo reads where it names
    an older model than the stamp, or the file has none: ``format.trainer_release``). An
    explicit ``cs-X.Y`` that contradicts a file which states its release is refused (the
    stamp of a file read by its ``__metadata__`` is taken), unless ckpt-migrate upgraded the
    file from that release: the documentation's workflow runs ``fix_checkpoint_spec.py`` (here
    an upgrade to 2.0) and then converts from ``cs-1.9``, the config's release. Where the file
    cannot tell (0.5 without a version), the user's word is taken. A config beside a checkpoint
    ckpt-migrate upgraded without it is at the release ``config.upgrade.config_release`` finds.
    """

    with read_checkpoint(path) as ckpt:
        detected = source_release(ckpt)
        said = ckpt.detected
        earlier = provenance.sources(ckpt.provenance) or []
    certain = said.cstorch_version is not None or said.format < 0.5 or bool(said.metadata_version)
    if said.metadata_version is not None:
        how = f"__metadata__ version {said.metadata_version!r}"
    elif said.cstorch_version is not None:
        how = f"__cstorch_version__ {said.cstorch_version}"
    else:
        how = f"format {said.format}"
    if wanted is None:
        release, note = detected.name, f"cs-auto: release {detected.name} ({how})"
        if not certain:
            note += f"; the file cannot tell 2.5–2.10 apart: {detected.name} assumed"
    elif certain and wanted.name != detected.name and wanted != said.said:
        if wanted.name not in earlier or wanted.version > detected.version:
            raise UsageError(
                path,
                f"--src-fmt cs-{wanted.name}, but the file says release {detected.name} ({how})",
                f"pass --src-fmt cs-auto or cs-{detected.name}",
            )
        note = (
            f"cs-{wanted.name}: ckpt-migrate upgraded this checkpoint from {wanted.name} to "
            f"{detected.name} (fix_checkpoint_spec.py or an upgrade); the checkpoint goes on from "
            f"{detected.name}, its config from {wanted.name}"
        )
        return Source(detected.name, note, wanted.name)
    else:
        release, note = wanted.name, None
    if config is None:
        return Source(release, note, release)
    start, why = config_release(config[1], release, earlier, family=family, source=config[0])
    return Source(release, "\n".join(filter(None, [note, why and f"{config[0]}: {why}"])), start)


def listed(model: str | None) -> list[tuple[str, str, str | None, bool, str | None]]:
    """(name, family, registry name, headless, Model Zoo's oldest release) of the names to
    list."""
    key = None if model in ("all", None) else model.strip().lower()
    if key is not None:
        family, registry = resolve_name(key)
    found = [
        (m.name, m.family, m.registry, m.headless, m.modelzoo_from)
        for m in MODELZOO_NAMES
        if key is None or m.name.lower() == key
    ]
    return found if found or key is None else [(key, family, registry, False, None)]


def key_rules(family: str) -> list[tuple[str, list[Any]]]:
    """(hop, KeyRename rules for ``family``) from every hop module's rule tables."""
    out = []
    for hop in graph.load().hops:
        module = importlib.import_module(hop.module)
        rules = [
            rule
            for value in vars(module).values()
            if isinstance(value, tuple) and value and all(isinstance(r, KeyRename) for r in value)
            for rule in value
            if family in rule.families
        ]
        if rules:
            out.append((f"{hop.source}→{hop.target}", rules))
    return out


def hf_source(given: Path, config: Path) -> tuple[Path, Path | None]:
    """The Hugging Face directory of ``convert --src-fmt hf CHECKPOINT --config CONFIG``, and
    the config.json to read (None: the directory's own, or each sub-directory's).

    ``CHECKPOINT`` is the directory or a file in it, which must exist and be one the import
    reads (Model Zoo loads the file it is named, not its neighbours). ``CONFIG`` is a
    config.json, or the directory itself: Model Zoo's converters of a model in sub-directories
    take "the path to the outer directory to both the --config argument and checkpoint_file
    argument" (tag Release_2.10.0, ``checkpoint_converters/base_converter.py``,
    ``BaseCheckpointConverter_UnpackedHF_PackedCS.converter_note``; the LLaVA README's
    command line, tags Release_2.2.0-2.4.3).
    """
    if not given.exists():
        raise UsageError(
            given, "no such file or directory", "name the Hugging Face directory or a file in it"
        )
    hf_dir = given if given.is_dir() else given.parent
    read = _weights_read(hf_dir)
    if given.is_file() and read and given.name not in read:
        raise UsageError(
            given,
            f"is not what the import reads: it reads {read[0]} of {hf_dir} (safetensors first)",
            f"name the directory or {read[0]}, or move the other weights out of it",
        )
    if not config.is_dir():
        return hf_dir, config
    if config.resolve() != hf_dir.resolve():
        raise UsageError(
            config,
            f"--config names a directory other than the checkpoint's ({hf_dir})",
            "pass the config.json, or the checkpoint's directory itself",
        )
    return hf_dir, None


def _weights_read(hf_dir: Path) -> list[str]:
    """The weight files an import of ``hf_dir`` reads, its index first (``hf/import_.py``
    ``_tensors``); empty: none."""
    for index, single in ((st.INDEX, st.SINGLE), (hf_bin.INDEX, hf_bin.SINGLE)):
        if (hf_dir / index).is_file():
            return [index, *jsonfile.shard_names(hf_dir / index)]
        if (hf_dir / single).is_file():
            return [single]
    return []
