"""The conversion verbs' work, one function per verb (as ``commands``): Hugging Face
(``export-hf``, ``import-hf``) and TensorFlow (``tensorflow-to-h5``, ``h5-to-tensorflow``).

Loaded by the package face (``cli.conversions``) when one of them runs: their engines are not
the read-side verbs' (``commands``). The TensorFlow verbs prepare the process for a command
line (``tf.saver.setup_cli_process``): they are only called from one.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from ckpt_migrate.hf import export as hf_export
from ckpt_migrate.hf import import_ as hf_import
from ckpt_migrate.tf import from_h5, to_h5
from ckpt_migrate.tf.saver import setup_cli_process


def export_hf(src: str | Path, output_dir: str | Path, **options: Any) -> dict[str, Any]:
    """``export-hf``: the options are :func:`ckpt_migrate.hf.export.export`'s."""
    return hf_export.export(src, output_dir, **options).to_json()


def import_hf(src: str | Path, dst: str | Path, **options: Any) -> dict[str, Any]:
    """``import-hf``: the options are :func:`ckpt_migrate.hf.import_.import_hf`'s."""
    return hf_import.import_hf(src, dst, **options).to_json()


def tf_to_h5(saver_paths: list, h5_path: str | Path, **options: Any) -> dict[str, Any]:
    setup_cli_process()
    rep = to_h5.tf_to_h5(saver_paths, h5_path, **options)
    data = asdict(rep)
    data.update(output=str(rep.path), release=rep.release.name, format=rep.release.format)
    del data["path"]
    return data


def h5_to_tf(h5_path: str | Path, saver_path: str | Path, **options: Any) -> dict[str, Any]:
    setup_cli_process()
    options["max_shard_bytes"] = options.pop("max_shard_size", "1GiB")
    return asdict(from_h5.h5_to_tf(h5_path, saver_path, **options))
