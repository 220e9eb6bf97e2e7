"""Where an upgraded file goes: the output directory (``--output-dir``), the output file in
it, and the backup an in-place upgrade keeps, each checked before anything is written."""

from __future__ import annotations

from pathlib import Path

from ckpt_migrate.atomic import check_fits, check_output, refuse_file_on_the_way, same_file
from ckpt_migrate.errors import UsageError
from ckpt_migrate.format.releases import Release


def check_output_dir(out_dir: Path) -> None:
    """Refuse an output directory that is a file, or lies under one."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(out_dir, "is not a directory", "choose another --output-dir")
    refuse_file_on_the_way(out_dir)


def output_path(src: Path, output_dir: Path | None, *, force: bool) -> Path:
    """``output_dir/<name>``; a missing ``output_dir`` (a dry run's) is taken as one the real
    run would make (``_upgrade``: ``made_directory``)."""
    assert output_dir is not None  # (``check_destination`` checked it)
    if not output_dir.exists():
        return output_dir / src.name
    return output_file(src, output_dir / src.name, "use --inplace", force=force)


def output_file(src: Path, target: Path, elsewhere: str, *, force: bool = False) -> Path:
    """``target``, checked; ``elsewhere`` is the fix when it is the source itself."""
    if same_file(target, src):
        raise UsageError(src, "the output would be the source itself", elsewhere)
    check_output(target, force=force)
    return target


def backup_path(src: Path, release: Release) -> Path:
    backup = src.with_name(f"{src.name}.pre-{release.name}.bak")
    check_fits(src, backup.name[len(src.name) :], "a backup", "write it elsewhere with -o DIR")
    if (backup.exists() or backup.is_symlink()) and not same_file(backup, src):
        raise UsageError(backup, "backup already exists", "move it away, then retry")
    return backup
