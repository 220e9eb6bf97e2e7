"""What export and import share: the family lookup, dtype casts, the optional family hooks,
and the output directory written beside its target and renamed into place."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ckpt_migrate.atomic import Interrupt, fsync_dir, fsync_path, io_error
from ckpt_migrate.errors import UnsupportedContentError, UsageError
from ckpt_migrate.hf import families
from ckpt_migrate.hf.mapping import MappingError, Out, Shape

Progress = Callable[[str, int, int], None]  # (stage, done, total)
FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def family_for(name: str) -> ModuleType:
    """The family module that serves model ``name``; a one-line error naming ``--model``."""
    table = families.by_name()
    if canonical_name(name) in table:
        return table[canonical_name(name)]
    known = ", ".join(sorted(table)) or "none yet"
    raise UsageError(
        None,
        f"no Hugging Face conversion rules for model {name!r}",
        f"pass --model with one of: {known}",
    )


def canonical_name(name: str) -> str:
    """``name`` as the family modules spell it (model names are case-insensitive)."""
    folded = {k.lower(): k for k in families.by_name()}
    return folded.get(name.strip().lower(), name)


def mapping_failed(path: Path | None, exc: MappingError) -> UnsupportedContentError:
    return UnsupportedContentError(path, str(exc))


def hook(module: ModuleType, name: str, *args: Any) -> dict[str, str]:
    """An optional family hook (``cs_ties``, ``cs_dropped``, ``hf_dropped``); {} if absent."""
    fn = getattr(module, name, None)
    return dict(fn(*args)) if fn is not None else {}


def strip_model_prefix(names: list[str]) -> dict[str, str]:
    """Bare CS name -> stored name: 1.8-2.0 saves (and files upgraded from them) carry a
    ``model.`` prefix inside the ``model`` state (Model Zoo strips it either way,
    ``helper.py`` ``Build_HF_CS_Converter_WithOptionalModel``)."""
    prefixed = bool(names) and all(n.startswith("model.") for n in names)
    return {(n[len("model.") :] if prefixed else n): n for n in names}


def check_dtype(dtype: str | None) -> None:
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise UsageError(None, f"--dtype {dtype!r} is not one of {', '.join(FLOAT_DTYPES)}")


def cast(array: np.ndarray, src: str, dst: str | None) -> np.ndarray:
    """``array`` (in ``src``'s storage dtype; bf16 as int16) as ``dst``'s storage dtype.
    bf16 <- float32 rounds to nearest even, as torch does; ints and bools are never cast."""
    if dst is None or dst == src or src not in FLOAT_DTYPES:
        return array
    if src == "bfloat16":
        bits = array.view(np.uint16).astype(np.uint32) << 16
        value = bits.view(np.float32)
    else:
        value = array.astype(np.float32)
    if dst == "bfloat16":
        bits = value.astype(np.float32).view(np.uint32)
        rounded = bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))
        rounded = np.where(np.isnan(value), bits | np.uint32(0x400000), rounded)
        return (rounded >> 16).astype(np.uint16).view(np.int16)
    return value.astype(np.float16 if dst == "float16" else np.float32)


def out_dtype(inputs: tuple[str, ...], dtypes: Mapping[str, str], default: str) -> str:
    """The dtype of an output: its inputs' (they must agree), ``default`` if it has none."""
    seen = {dtypes[i] for i in inputs}
    if len(seen) > 1:
        raise MappingError(f"inputs {', '.join(inputs)} have different dtypes {sorted(seen)}")
    return seen.pop() if seen else default


class LastRead:
    """``read`` keeping the last input read: the outputs a plan cuts from one fused tensor (Q,
    K and V of a ``c_attn``, the experts of a fused MoE weight) come one after another, so the
    fused tensor is read once. The kept array is read-only and dropped before another is read:
    at most one input more than the output being built is held."""

    def __init__(self, read: Callable[[str], np.ndarray]) -> None:
        self._read = read
        self._name: str | None = None
        self._array: np.ndarray | None = None

    def __call__(self, name: str) -> np.ndarray:
        if name != self._name or self._array is None:
            self._name, self._array = None, None
            array = self._read(name)
            array.flags.writeable = False
            self._name, self._array = name, array
        return self._array


def build_one(out: Out, read: Callable[[str], np.ndarray]) -> np.ndarray:
    """``mapping.run`` for one output (same checks). A plain call, not a generator: no
    suspended frame keeps the previous output alive while the next one is built."""
    inputs = [read(name) for name in out.inputs]
    expected = out.out_shape({n: tuple(x.shape) for n, x in zip(out.inputs, inputs)})
    value = out.build(*inputs)
    del inputs
    if tuple(value.shape) != tuple(expected):
        raise MappingError(f"{out.name}: built shape {value.shape}, expected {expected}")
    return value


def shapes_of(plan: list[Any], shapes: Mapping[str, Shape]) -> dict[str, Shape]:
    out = {}
    for o in plan:
        out[o.name] = tuple(int(d) for d in o.out_shape(shapes))
    return out


# --------------------------------------------------------------------------- output directory


def check_output_dir(target: Path, force: bool) -> None:
    if target.exists() or target.is_symlink():
        if not force:
            raise UsageError(
                target, "already exists; refusing to overwrite it", "remove it or pass --force"
            )
        if not target.is_dir() or target.is_symlink():
            raise UsageError(target, "is not a directory; --force replaces only a directory")
    if not target.parent.is_dir():
        raise UsageError(target, "its parent directory does not exist", "create it first")


@contextlib.contextmanager
def atomic_dir(target: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``target``; on success its files and itself
    are fsynced and it is renamed to ``target`` (an existing one, with ``force``, is moved
    aside first and removed after). On any error the temporary directory is removed."""
    target = Path(target)
    check_output_dir(target, force)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.mkdir()
    except OSError as exc:
        raise io_error(target, exc) from None
    try:
        yield tmp
        for child in tmp.iterdir():
            fsync_path(child)
        fsync_dir(tmp)
        Interrupt.check()
        _publish_dir(tmp, target, force)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise io_error(target, exc) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _publish_dir(tmp: Path, target: Path, force: bool) -> None:
    old = None
    if target.exists():
        if not force:
            raise UsageError(target, "appeared meanwhile; refusing to overwrite it")
        old = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.old")
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


def refuse_unused(
    src: Path, unused: list[str], name: str, drop: bool, what: str = "tensor"
) -> None:
    """Tensors the family's rules do not convert are an error unless dropped by name."""
    if unused and not drop:
        raise UnsupportedContentError(
            src,
            f"{len(unused)} {what}(s) the {name} rules do not convert: "
            + ", ".join(unused[:4])
            + (" ..." if len(unused) > 4 else ""),
            "pass --drop-unmatched-keys (drop_unmatched_keys=True) to leave them out",
        )


# Config fields that say how many layers a plan walks (HF and CS spellings).
_LAYER_COUNTS = (
    "n_layer",
    "n_layers",
    "num_layers",
    "num_hidden_layers",
    "num_decoder_layers",
    "encoder_num_hidden_layers",
    "decoder_num_hidden_layers",
)


def check_layer_counts(path: Path, config: Mapping[str, Any], tensors: int) -> None:
    """A config may not declare more layers than the file has tensors: the plan walks every
    declared layer, so a crafted count would buy minutes of CPU before any tensor is missed."""
    for key in _LAYER_COUNTS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= tensors:
            raise UnsupportedContentError(
                path, f"{key} is {value}, but the model has {tensors} tensors"
            )


def plain(result: Any) -> dict[str, Any]:
    """A result dataclass as JSON-ready data: paths as strings."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(result).items()}
