"""CS tensors that Model Zoo's own HF → CS import leaves out (the records' ``hf.cs_absent``):
the export of such a file gives what can be given and states, one line per tensor, what was
missing and what the output holds instead.

Model Zoo, tag Release_2.10.0, ``tools/checkpoint_converters/``: BERT's MLM decoder bias
(``bert.py`` line 589: ``cls.predictions.bias`` is matched with ``exists="left"`` and dropped,
and ``save_pretrained`` stores the bias only under that name), T5's shared embeddings
(``t5.py`` line 628: ``shared.weight`` dropped, ``encoder/decoder.embed_tokens`` read, which
``save_pretrained`` leaves out as ties). What Model Zoo's own export makes of such files: BERT
with the bias zero-filled (we do the same, and say so); T5 with ``shared``, both
``embed_tokens`` and ``lm_head`` randomly initialised by transformers, a broken model, which we
refuse unless the user opts in by name (:data:`OPT_IN`).

A declared tensor is stood in for by a placeholder leaf, so the family's plan runs unchanged;
the outputs built from it are then zeros or left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_migrate import catalogue
from ckpt_migrate.catalogue import Absent
from ckpt_migrate.errors import UnsupportedContentError
from ckpt_migrate.format.dtypes import by_name
from ckpt_migrate.format.tree import DataSource, TensorLeaf
from ckpt_migrate.hf import unconverted
from ckpt_migrate.hf.mapping import MappingError, Out

OPT_IN = "--allow-missing-tensors"
REIMPORT = (
    "re-import it from the Hugging Face source with `ckpt-migrate import-hf` (or "
    "convert_checkpoint.py --src-fmt hf), which keeps it"
)


@dataclass(frozen=True, eq=False)
class Zeros(DataSource):
    """A stand-in tensor of zeros (storage dtype), made when read."""

    dtype: str
    shape: tuple[int, ...]

    def read(self) -> np.ndarray:
        return np.zeros(self.shape, dtype=by_name(self.dtype).storage)

    def describe(self) -> str:
        return "zeros standing in for a tensor the file lacks"


@dataclass
class StandIns:
    """The placeholder leaves for one export, by declaration."""

    groups: list[tuple[Absent, tuple[str, ...]]] = field(default_factory=list)
    leaves: dict[str, TensorLeaf] = field(default_factory=dict)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.leaves)


def stand_ins(cs: Mapping[str, TensorLeaf], cs_model: Mapping[str, Any], name: str) -> StandIns:
    """Placeholders for every declared tensor the file lacks under all of its names (with its
    tie partners while the config ties them)."""
    record = catalogue.by_name(name)
    out = StandIns()
    if record is None or record.hf is None:
        return out
    groups = unconverted.tie_groups(record, cs_model)
    for absent in record.hf.cs_absent:
        if absent.models and name not in absent.models:
            continue
        names = list(absent.names)
        for group in groups:
            if set(group) & set(names):
                names += [n for n in group if n not in names]
        if any(n in cs for n in names):
            continue
        shape, dtype = _shape(absent, cs_model), _main_float(cs)
        leaf = TensorLeaf(dtype, shape, Zeros(dtype, shape))
        largest = max((x.nbytes for x in cs.values()), default=0)
        if absent.zeros and leaf.nbytes > largest:  # the config is not the file's to size
            raise MappingError(
                f"{names[0]} is missing and the config gives it {leaf.nbytes:,} bytes "
                f"({', '.join(absent.shape)} = {shape}), more than any tensor the file has"
            )
        out.groups.append((absent, tuple(names)))
        out.leaves.update({n: leaf for n in names})
    return out


def _shape(absent: Absent, cs_model: Mapping[str, Any]) -> tuple[int, ...]:
    dims = [cs_model.get(f) for f in absent.shape]
    for f, d in zip(absent.shape, dims):
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise MappingError(
                f"{absent.names[0]} is missing ({absent.why}) and the config's {f} ({d!r}) "
                "does not give its shape"
            )
    return tuple(dims)  # type: ignore[arg-type]


def _main_float(cs: Mapping[str, TensorLeaf]) -> str:
    sizes: dict[str, int] = {}
    for leaf in cs.values():
        if leaf.dtype in ("float32", "float16", "bfloat16"):
            sizes[leaf.dtype] = sizes.get(leaf.dtype, 0) + leaf.nbytes
    return max(sizes, key=lambda d: sizes[d]) if sizes else "float32"


def apply(
    plan: Sequence[Out], stand: StandIns, src: Path, allow: bool
) -> tuple[list[Out], dict[str, str]]:
    """The plan with the outputs of a missing, not zero-filled tensor left out (an error
    without ``allow``), and CS tensor -> what the output holds instead (one line each)."""
    plan = list(plan)
    report: dict[str, str] = {}
    for absent, names in stand.groups:
        outputs = [o.name for o in plan if set(o.inputs) & set(names)]
        if not outputs:
            continue
        missing = names[0]
        if absent.zeros:
            report[missing] = f"missing ({absent.why}): {', '.join(outputs)} {absent.holds}"
            continue
        if not allow:
            raise UnsupportedContentError(
                src,
                f"model tensor {missing} is missing ({absent.why}); without it the Hugging "
                f"Face model would have {', '.join(outputs)} {absent.holds}, which is not a "
                "usable model",
                f"{REIMPORT}; or pass {OPT_IN} to export the rest",
            )
        plan = [o for o in plan if o.name not in outputs]
        report[missing] = (
            f"missing ({absent.why}): {', '.join(outputs)} not written ({OPT_IN}); "
            f"transformers loads {'it' if len(outputs) == 1 else 'them'} {absent.holds}"
        )
    return plan, report
