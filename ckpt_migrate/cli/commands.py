"""One function per CLI verb, each a thin call into the engine (like Alembic's ``command.py``).

They return plain data; ``cli.py`` decides how to print it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpt_migrate.format import outline
from ckpt_migrate.format.read import read_checkpoint


def inspect(path: str | Path) -> dict[str, Any]:
    with read_checkpoint(path) as ckpt:
        data = outline.report(ckpt)
        data["outline"] = outline.outline_lines(ckpt.root)
    return data


def to_torch(src: str | Path, dst: str | Path, *, allow_missing: bool = False) -> dict[str, Any]:
    from ckpt_migrate.torch.api import to_torch as convert

    out = convert(src, dst, allow_missing=allow_missing)
    return {"source": str(src), "output": str(out)}


def from_torch(src: str | Path, dst: str | Path, release: str | None = None) -> dict[str, Any]:
    from ckpt_migrate.torch.api import from_torch as convert

    rep = convert(src, dst, release)
    return {
        "source": str(src),
        "output": str(rep.path),
        "release": rep.release.name,
        "format": rep.release.format,
        "tensors": rep.tensors,
        "tensor_bytes": rep.tensor_bytes,
        "notes": rep.notes,
    }


def tf_to_h5(saver_paths: list, h5_path: str | Path, **options: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from ckpt_migrate.tf.to_h5 import tf_to_h5 as convert

    rep = convert(saver_paths, h5_path, **options)
    data = asdict(rep)
    data.update(output=str(rep.path), release=rep.release.name, format=rep.release.format)
    del data["path"]
    return data


def h5_to_tf(h5_path: str | Path, saver_path: str | Path, **options: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from ckpt_migrate.tf.from_h5 import h5_to_tf as convert

    options["max_shard_bytes"] = options.pop("max_shard_size", "1GiB")
    return asdict(convert(h5_path, saver_path, **options))


def history() -> dict[str, Any]:
    from ckpt_migrate.format import releases
    from ckpt_migrate.hops import graph

    g = graph.load()
    return {
        "releases": [
            {"name": r.name, "format": r.format, "spec": r.spec_encoding, "type_tags": r.type_tags}
            for r in releases.RELEASES
        ],
        "newest": g.newest,
        "hops": [h.to_json() for h in g.hops],
    }


def plan(
    path: str | Path,
    target: str = "latest",
    source_release: str | None = None,
    output_dir: Path | None = None,
    inputs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from ckpt_migrate.engine.plan import make_plan
    from ckpt_migrate.models.detect import choose_family

    with read_checkpoint(path, release=source_release) as ckpt:
        data = make_plan(ckpt, target, output_dir=output_dir, inputs=inputs).to_json()
        choice = choose_family(ckpt.root, (inputs or {}).get("model"))
        data["model"] = choice.to_json()
        return data


def upgrade(paths: list[Path], opts: Any, progress: Any = None) -> list[Any]:
    from ckpt_migrate.engine.upgrade import upgrade as run

    return [run(p, opts, progress) for p in paths]


def upgrade_dir(model_dir: Path, opts: Any, progress: Any = None, on_entry: Any = None) -> list:
    from ckpt_migrate.model_dir.upgrade_dir import upgrade_dir as run

    return run(model_dir, opts, progress, on_entry)


def config_alongside(config: Path, **options: Any) -> Any:
    """``upgrade --config``: checks the config and its output now, upgrades it per result."""
    from ckpt_migrate.config.upgrade import ConfigAlongside

    return ConfigAlongside(config, **options)


def check(path: str | Path, target: str = "latest", source_release: str | None = None) -> dict:
    from ckpt_migrate.engine.upgrade import check as run

    return run(path, target, source_release)


def verify(a: str | Path, b: str | Path, *, allclose: bool = False) -> dict[str, Any]:
    from ckpt_migrate.format.compare import compare_trees

    with read_checkpoint(a) as left, read_checkpoint(b) as right:
        diffs, compared = compare_trees(left.root, right.root, allclose=allclose)
    return {
        "left": str(a),
        "right": str(b),
        "tensors_compared": compared,
        "identical": not diffs,
        "differences": [{"name": d.name, "what": d.what} for d in diffs],
    }


def step_inputs(
    *,
    data_iter_dir: Path | None = None,
    dataloader_type: str | None = None,
    shuffle_seed: int | None = None,
    allow_step_mismatch: bool = False,
    config: Path | None = None,
    model: str | None = None,
) -> dict[str, Any]:
    """The extra inputs hops may use, as the engine takes them (only those given)."""
    from ckpt_migrate.errors import UsageError

    inputs: dict[str, Any] = {}
    if model is not None:
        from ckpt_migrate.models.detect import canonical_family

        canonical_family(model)  # an unknown name fails here, before any file is read
        inputs["model"] = model
    if data_iter_dir is not None:
        inputs["data_iter_dir"] = data_iter_dir
    if dataloader_type is not None:
        if dataloader_type not in ("map", "iterable"):
            raise UsageError(
                None, f"--dataloader-type must be map or iterable, not {dataloader_type!r}"
            )
        inputs["dataloader_type"] = dataloader_type
    if shuffle_seed is not None:
        inputs["shuffle_seed"] = shuffle_seed
    if allow_step_mismatch:
        inputs["allow_step_mismatch"] = True
    if config is not None:
        inputs["config"] = load_config(config)
    return inputs


def load_config(path: Path) -> dict[str, Any]:
    import yaml

    from ckpt_migrate.errors import UsageError

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(path, f"cannot read the config ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise UsageError(path, f"not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise UsageError(path, "config is not a YAML mapping")
    return data
