"""The output directory of an export: written beside its target, every file fsynced, then
renamed into place (an existing one, with ``force``, moved aside first and removed after).

``force`` replaces only a Hugging Face model directory: one holding nothing but the files an
export writes and those ``save_pretrained`` and the Hub keep beside them (tokenizer, generation
config, model card), at most one directory down. Any other directory (the checkpoint's own, a
home directory) is refused, never removed."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from ckpt_migrate.atomic import check_parent, fsync_dir, fsync_path, io_error
from ckpt_migrate.errors import UsageError
from ckpt_migrate.hf.safetensors_io import INDEX, SINGLE
from ckpt_migrate.interrupt import Interrupt
from ckpt_migrate.sidenames import side_name

# What an export writes (``safetensors_io.shard_names``, ``directories.write``), and what
# transformers' ``save_pretrained``, its tokenizers' and the Hub's model pages keep beside it
_MODEL_FILES = {"config.json", SINGLE, INDEX, "pytorch_model.bin", "pytorch_model.bin.index.json"}
_BESIDE = {
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "preprocessor_config.json",
    "README.md",
    ".gitattributes",
}
_SHARD = re.compile(r"(model-\d{5}-of-\d{5}\.safetensors|pytorch_model-\d{5}-of-\d{5}\.bin)")


def _exported(name: str) -> bool:
    return name in _MODEL_FILES or name in _BESIDE or _SHARD.fullmatch(name) is not None


def _foreign(directory: Path, depth: int = 0) -> str | None:
    """An entry of ``directory`` that is not a file of a Hugging Face model, or None."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if depth == 0 and entry.is_dir(follow_symlinks=False):
                inner = _foreign(Path(entry.path), 1)
                if inner is not None:
                    return f"{entry.name}/{inner}"
            elif not (entry.is_file(follow_symlinks=False) and _exported(entry.name)):
                return entry.name
    return None


def _check_replaceable(target: Path) -> None:
    try:
        found = _foreign(target)
    except OSError as exc:
        raise io_error(target, exc) from None
    if found is not None:
        raise UsageError(
            target,
            f"holds {found}, not a file of a Hugging Face model directory; --force replaces "
            "only such a directory",
            "choose another output directory",
        )


def check_output_dir(target: Path, force: bool) -> None:
    if target.exists() or target.is_symlink():
        if not target.is_dir() or target.is_symlink():  # (--force would not replace it either)
            raise UsageError(
                target,
                "exists and is not a directory; an export is a directory, and --force replaces "
                "only a directory",
                "choose another output directory",
            )
        if not force:
            raise UsageError(
                target, "already exists; refusing to overwrite it", "remove it or pass --force"
            )
        _check_replaceable(target)
    check_parent(target)


@contextlib.contextmanager
def atomic_dir(target: Path, *, force: bool = False, like: Path | None = None) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``target``; on success every file and
    directory in it, and itself, are fsynced and it is renamed to ``target`` (an existing one,
    with ``force``, is moved aside first and removed after). On any error the temporary
    directory is removed. ``like``: the file it is made from; whom that file does not let
    read, the directory does not let in (within the umask, from its creation on)."""
    target = Path(os.path.abspath(target))  # (``.`` has no name to put the temporary beside)
    check_output_dir(target, force)
    tmp = target.with_name(side_name(target.name, ".tmp", "."))
    try:
        tmp.mkdir(0o777 if like is None else _searchable(stat.S_IMODE(os.stat(like).st_mode)))
    except OSError as exc:
        raise io_error(target, exc) from None
    try:
        yield tmp
        for where, subdirs, files in os.walk(tmp, topdown=False):  # a directory after its files
            for name in files:
                fsync_path(Path(where, name))
            for name in subdirs:
                fsync_dir(Path(where, name))
        fsync_dir(tmp)
        with Interrupt.hold():  # (never the old one moved aside and the new one not in place)
            Interrupt.check()
            _publish_dir(tmp, target, force)
            Interrupt.note_published(target)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise io_error(target, exc) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _searchable(mode: int) -> int:
    """A directory's mode for a file's: the owner's full access, and each class that may read
    the file may list and enter it."""
    readers = mode & 0o044
    return 0o700 | readers | (readers >> 2)


def _publish_dir(tmp: Path, target: Path, force: bool) -> None:
    old = None
    if target.exists():
        if not force:
            raise UsageError(target, "appeared meanwhile; refusing to overwrite it")
        _check_replaceable(target)  # (as it is now, not as it was when the export began)
        old = target.with_name(side_name(target.name, ".old", "."))
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except OSError:
        if old is not None:
            os.rename(old, target)
        raise
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
