"""``torch.load(weights_only=True)`` of a file that is not ours (``from-torch``, ``import-hf``'s
``pytorch_model.bin``): torch's zip format (1.6+) mapped, an older file read whole, and torch's
refusals reduced to what its restricted unpickler met, without its advice to load with
``weights_only=False``, which this tool never does."""

from __future__ import annotations

import pickle
import re
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckpt_migrate.errors import CkptError, NotACheckpointError, UnsupportedContentError
from ckpt_migrate.format.h5 import sniff


class Refused(Exception):
    """The restricted unpickler refused the file: ``str`` is what it met."""


class NewerPickle(Refused):
    """A pickle of protocol 4 or later (``torch.save(..., pickle_protocol=4)``, or Python's own
    ``pickle.dump``): torch's weights-only unpickler stops at the FRAME opcode those protocols
    write first (149), whatever the pickle holds."""

    FIX = "save it again with torch.save's default pickle_protocol (2)"


class Unreadable(Exception):
    """torch cannot read the file (empty, cut short, not a torch.save file): ``str`` says why."""


def load(path: Path, each_storage: Callable[[], None] | None = None) -> Any:
    """The object ``path`` holds, loaded on the CPU with ``weights_only=True``.
    ``each_storage``: called as each storage is loaded (torch calls a ``map_location`` that is
    a function once a storage), the one count of torch's own unpickling there is. A file
    that cannot be torch's (by its first bytes) is refused before torch is imported (2.5 s
    here)."""
    if not Path(path).is_file():  # (a named pipe's read waits for a writer)
        raise Unreadable("not a regular file")
    not_torchs = _not_torchs(path)
    if not_torchs is not None:
        raise not_torchs
    import torch

    try:
        with warnings.catch_warnings():  # (torch's notes on pickle protocols: not the user's)
            warnings.simplefilter("ignore")
            mmap = zipfile.is_zipfile(path)  # (torch maps only its zip format)
            where: Any = "cpu" if each_storage is None else _counted(each_storage)
            return torch.load(path, map_location=where, weights_only=True, mmap=mmap)
    except Exception as exc:  # (whatever torch meets in bytes that are not ours)
        raise _failure(path, exc) from None


def _counted(each_storage: Callable[[], None]) -> Callable[[Any, str], Any]:
    def on_the_cpu(storage: Any, location: str) -> Any:
        each_storage()
        return storage.cpu()  # (a storage saved on a GPU is read on the CPU)

    return on_the_cpu


def _not_torchs(path: Path) -> Unreadable | None:
    """Why ``path`` cannot be a ``torch.save`` file by its first bytes, if it cannot."""
    with open(path, "rb") as f:
        head = f.read(2)
    if not head:
        return Unreadable("the file is empty")
    if head != b"PK" and head[:1] != pickle.PROTO:  # (torch.save writes its zip format, or
        # before 1.6 a pickle of protocol 2 or later, which opens with this opcode)
        return Unreadable("neither torch's zip format nor a pickle of protocol 2 or later")
    return None


def _failure(path: Path, exc: Exception) -> Refused | Unreadable:
    """Why torch could not load ``path``: what its restricted unpickler refused, or, where
    torch's words are bare (an ``EOFError``, a ``KeyError`` of an opcode's byte, a zip reader's
    assertion, an opcode of bytes that are no pickle), what the file's first bytes say."""
    with open(path, "rb") as f:  # (its first bytes are torch's: ``_not_torchs``)
        is_zip = f.read(2) == b"PK"  # (a zip archive's first bytes, which torch's format is)
    if isinstance(exc, pickle.UnpicklingError):
        why = _reason(exc, "WeightsUnpickler error:")
        if why == f"Unsupported operand {pickle.FRAME[0]}":
            return NewerPickle(
                f"a pickle of protocol 4 or later, whose FRAME opcode ({pickle.FRAME[0]}) "
                "torch's weights-only reader does not take"
            )
        return Refused(why)
    if is_zip:
        why = _reason(exc)
        if not zipfile.is_zipfile(path):
            return Unreadable(f"a zip archive cut short or damaged: {why}")
        return Unreadable(f"a zip archive, but not torch's: {why}")
    if isinstance(exc, KeyError | EOFError):
        return Unreadable(f"a pickle cut short or damaged: {_reason(exc)}")
    return Unreadable(_reason(exc))


def _reason(exc: Exception, after: str = "") -> str:
    """The first line of ``exc`` that says something (after ``after`` where it appears, after
    the place of a failed assertion in torch's C++), its first sentence, ANSI escapes taken
    out; the exception's type where its words are none or bare (a ``KeyError``'s key)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    if after and after in text:
        text = text.split(after, 1)[1]
    text = re.sub(r"^\s*\[enforce fail at [^\]]*\][\s.]*", "", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    first = lines[0].split(". ")[0][:200]
    return f"{type(exc).__name__}: {first}" if isinstance(exc, KeyError) else first


def refusal(src_path: Path, exc: Exception) -> CkptError:
    """Why ``from_torch`` cannot read ``src_path``: torch's reason, unless it is HDF5."""
    if sniff.is_hdf5(src_path):
        return NotACheckpointError(
            src_path,
            "is an HDF5 file (a Cerebras H5 checkpoint?), not a torch.save file",
            "inspect or upgrade it as it is; to-torch writes a torch.save file of it",
        )
    if isinstance(exc, Refused):
        return UnsupportedContentError(
            src_path,
            f"not loadable with weights_only=True ({exc})",
            NewerPickle.FIX
            if isinstance(exc, NewerPickle)
            else "only plain tensors, containers and scalars are accepted",
        )
    return NotACheckpointError(src_path, f"not a torch.save file ({exc})")
