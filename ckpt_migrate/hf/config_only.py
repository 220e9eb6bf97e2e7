"""A config alone to or from Hugging Face: ``convert_checkpoint.py convert-config`` with ``hf``
on one side (Model Zoo: ``convert_config_from_file``, tag Release_2.10.0,
``src/cerebras/modelzoo/tools/convert_checkpoint.py`` lines 482-533, which the documentation
recommends before training to learn whether a config converts at all).

The config tables are the checkpoint conversions' own (``module.config_to_hf`` /
``config_to_cs``): a config converted alone is the one its checkpoint's conversion writes,
except for what only the tensors tell (``config.json``'s ``dtype``). A muP config is refused:
its multipliers are folded into the tensors (``hf/mup.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

from ckpt_migrate.atomic import atomic_output
from ckpt_migrate.config import yaml_edit
from ckpt_migrate.errors import UsageError
from ckpt_migrate.hf import directories, mup
from ckpt_migrate.hf.export import model_config
from ckpt_migrate.hf.import_ import check_release, read_config, write_config
from ckpt_migrate.hf.mapping import Family, MappingError
from ckpt_migrate.hf.rules import canonical_name, family_for, mapping_failed


def to_cs(config: Path, out: Path, model: str, release: str) -> Path:
    """The HF ``config.json`` ``config`` as the run's ``params.yaml`` of ``release``."""
    check_release(release)
    name, module = _rules(config, model)
    hf_config = read_config(config.parent, config)
    try:
        cs_model = module.config_to_cs(hf_config, name)
    except MappingError as exc:
        raise mapping_failed(config, exc) from None
    return write_config(cs_model, name, release, out, False)


def to_hf(config: Path, out: Path, model: str, release: str) -> Path:
    """The ``params.yaml`` ``config`` of ``release`` as an HF ``config.json``."""
    name, module = _rules(config, model)
    cs_model = model_config(yaml_edit.read_config(config), config, release, name)
    if mup.found(cs_model, name):
        raise UsageError(
            config,
            "is a muP config, whose multipliers the conversion folds into the tensors",
            "convert it with its checkpoint (convert --tgt-fmt hf)",
        )
    try:
        hf_config = module.config_to_hf(cs_model, name)
    except MappingError as exc:
        raise mapping_failed(config, exc) from None
    with atomic_output(out) as tmp:
        tmp.write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


def _rules(config: Path, model: str) -> tuple[str, Family]:
    name = canonical_name(model)
    module = family_for(name)
    if directories.of(module, name) != directories.ONE:
        dirs = ", ".join(directories.of(module, name))
        raise UsageError(
            config,
            f"{name} has a config.json in each of its sub-directories ({dirs})",
            "convert it with its checkpoint",
        )
    return name, module
