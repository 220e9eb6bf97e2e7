"""``torch.load(weights_only=True)`` of a file that is not ours (``from-torch``, ``import-hf``'s
``pytorch_model.bin``): torch's zip format (1.6+) mapped, an older file read whole, and torch's
refusals reduced to what its restricted unpickler met, without its advice to load with
``weights_only=False``, which this tool never does."""

from __future__ import annotations

import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any


class Refused(Exception):
    """The restricted unpickler refused the file: ``str`` is what it met."""


class Unreadable(Exception):
    """torch cannot read the file (empty, cut short, not a torch.save file): ``str`` says why."""


def load(path: Path) -> Any:
    """The object ``path`` holds, loaded on the CPU with ``weights_only=True``."""
    import torch

    if not Path(path).is_file():  # (a named pipe's read waits for a writer)
        raise Unreadable("not a regular file")
    try:
        with warnings.catch_warnings():  # (torch's notes on pickle protocols: not the user's)
            warnings.simplefilter("ignore")
            mmap = zipfile.is_zipfile(path)  # (torch maps only its zip format)
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        raise Refused(_reason(exc, "WeightsUnpickler error:")) from None
    except Exception as exc:  # (whatever else torch meets in bytes that are not ours)
        raise Unreadable(_reason(exc)) from None


def _reason(exc: Exception, after: str = "") -> str:
    """The first line of ``exc`` that says something (after ``after`` where it appears), its
    first sentence, ANSI escapes taken out."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    if after and after in text:
        text = text.split(after, 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0].split(". ")[0][:200] if lines else type(exc).__name__
