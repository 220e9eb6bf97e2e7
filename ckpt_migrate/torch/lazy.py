"""Lazy tensors for ``ckpt_migrate.load`` and the numpy <-> torch conversions of stored data.

``load`` returns a state dict whose tensors are :class:`LazyTensor`: nothing is read from disk
until a tensor's data is first used. Only this module (and the paths that need torch) imports
torch; the rest of the package works on numpy arrays in their *storage dtype* (``dtypes.py``):
the tensor's own dtype, except bfloat16, which is stored as its raw 16-bit pattern in int16.

Why a wrapper subclass
    ``LazyTensor`` must be a real ``torch.Tensor``: ``torch.optim.Optimizer.load_state_dict`` and
    ``nn.Module.load_state_dict`` only treat values that are ``torch.Tensor`` instances as
    tensors. ``torch.Tensor._make_wrapper_subclass`` gives an object that carries shape, dtype
    and device but no storage, so metadata (``shape``, ``dtype``, ``size()``, ``numel()``...)
    needs no read. Every ATen op on it reaches ``__torch_dispatch__``, which swaps each
    LazyTensor argument for its loaded tensor and runs the op on plain tensors; results are
    plain tensors, never LazyTensors (except an op that returns a LazyTensor argument itself,
    as in-place ops do).

Caching
    The first use calls the loader once, under a per-object lock (two threads racing still read
    once), checks that the data has the shape and dtype the index promised, keeps the tensor on
    the object and drops the loader. Later uses reuse that tensor: the data is read at most once
    per object and then stays in memory for as long as the LazyTensor lives. If the loader
    raises, nothing is cached and the next use tries again.

In-place ops
    ``x.add_(1)`` applies to the cached tensor (loading it first), so later reads see the change,
    exactly as with a plain tensor; ``materialize(x)`` returns that same cached tensor. Ops that
    would change the shape (``resize_``, ``t_``, ``unsqueeze_``...) raise instead of letting the
    wrapper and its data disagree. ``x.data = y`` takes ``y`` as the data when it has ``x``'s
    shape and dtype, and raises otherwise, for the same reason.

``repr``
    Never reads: it shows shape, dtype, source and whether the data is loaded. To see the
    values, print ``materialize(x)``.

Autograd
    Not supported: a LazyTensor never requires grad; ``requires_grad_(True)`` and
    ``x.requires_grad = True`` raise. Use ``materialize(x).requires_grad_()`` (or
    ``x.clone().requires_grad_()``). For the same reason ``nn.Parameter(x)``, and so
    ``load_state_dict(..., assign=True)``, need ``materialize(x)``; the default
    ``load_state_dict`` copies and works. Conversions return plain tensors: ``x.detach()``,
    ``x.data``, ``copy.deepcopy(x)``, pickling and ``torch.save`` (which stores an ordinary
    tensor that ``torch.load(weights_only=True)`` reads without this package).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ckpt_migrate.errors import CorruptCheckpointError, UnsupportedContentError
from ckpt_migrate.format import dtypes

__all__ = [
    "LazyTensor",
    "is_lazy",
    "materialize",
    "storage_to_tensor",
    "tensor_to_storage",
    "torch_dtype",
]

# Ops that change a tensor's shape in place (besides those tagged ``inplace_view``).
_RESIZING_OPS = frozenset({"resize_", "resize_as_", "set_", "sparse_resize_"})


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    return getattr(torch, dtypes.by_name(str(dtype)).name)


def storage_to_tensor(array: np.ndarray, dtype: str) -> torch.Tensor:
    """The tensor of torch dtype ``dtype`` (``"float32"``, ``"bfloat16"``...) held in ``array``.

    ``array`` is in the storage dtype (int16 bit patterns for bfloat16), any byte order, any
    layout; read-only, big-endian or non-contiguous arrays are copied, other arrays may be
    shared with the returned tensor.
    """
    d = dtypes.by_name(dtype)
    arr = np.asarray(array)
    have = arr.dtype
    if d.name == "bfloat16":
        ok = have.kind in "iu" and have.itemsize == 2
    else:
        ok = (have.kind, have.itemsize) == (d.storage.kind, d.storage.itemsize)
    if not ok:
        raise ValueError(f"cannot read a {have} array as torch.{d.name} (stored as {d.storage})")
    if not have.isnative:
        arr = arr.astype(have.newbyteorder("="))
    if not (arr.flags.c_contiguous and arr.flags.writeable):
        arr = arr.copy(order="C")
    if d.name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def tensor_to_storage(t: torch.Tensor) -> tuple[np.ndarray, str]:
    """``(array, dtype name)`` for writing ``t``: a C-contiguous little-endian array in the
    storage dtype (bfloat16 as its int16 bit pattern, NaN payloads kept).

    Detaches, moves to CPU and loads LazyTensors; the array may share memory with ``t``.
    """
    name = str(t.dtype).removeprefix("torch.")
    if name not in dtypes.BY_NAME:
        raise UnsupportedContentError(
            None,
            f"tensor dtype {t.dtype} cannot be stored in a checkpoint",
            "convert it to a supported dtype first",
        )
    if t.is_nested:  # (a strided nested tensor's layout is torch.strided)
        raise UnsupportedContentError(
            None,
            "a nested tensor cannot be stored in a checkpoint",
            "store its tensors as a list (t.unbind()) or padded (t.to_padded_tensor(0))",
        )
    if t.layout != torch.strided:
        raise UnsupportedContentError(
            None,
            f"tensor layout {t.layout} cannot be stored in a checkpoint",
            "convert it to a dense tensor first (t.to_dense())",
        )
    if t.device.type == "meta":
        raise UnsupportedContentError(
            None,
            "a tensor on the meta device has no data to store",
            "load or initialise it on a real device first",
        )
    t = materialize(t).detach().cpu().resolve_neg().contiguous()
    if name == "bfloat16":
        t = t.view(torch.int16)
    arr = t.numpy().astype(dtypes.BY_NAME[name].storage, copy=False)  # swaps only on big-endian
    return arr, name


def read_once(x: LazyTensor) -> torch.Tensor:
    """``x``'s data without keeping it on ``x``: the cached tensor if ``x`` is loaded, else a
    fresh read (checked like a first use) that is dropped when the caller drops it."""
    value = x._lazy_value
    if value is not None:
        return value
    with x._lazy_lock:
        if x._lazy_value is not None:
            return x._lazy_value
        return x._lazy_load()


def is_lazy(x: object) -> bool:
    """True if ``x`` is a :class:`LazyTensor` (loaded or not)."""
    return isinstance(x, LazyTensor)


def materialize(x: Any) -> Any:
    """The plain tensor behind a LazyTensor (loading it if needed); anything else unchanged.

    The result is the cached tensor itself, not a copy: changes to it are seen through ``x``.
    """
    return x._lazy_get() if isinstance(x, LazyTensor) else x


def _unwrap(x: Any, lazies: list[LazyTensor]) -> Any:
    """``x`` with each ``LazyTensor`` in it replaced by its data (appended to ``lazies``).

    Not a closure of ``__torch_dispatch__``: one that calls itself is a reference cycle, which
    kept every tensor an op was given, and its file open, until the garbage collector ran."""
    if isinstance(x, LazyTensor):
        lazies.append(x)
        return x._lazy_get()
    if isinstance(x, (list, tuple)):
        return type(x)([_unwrap(v, lazies) for v in x])
    return x


def _rewrap(x: Any, own: dict[int, LazyTensor]) -> Any:
    """``x`` with each tensor that is a ``LazyTensor``'s own data (``own``, by id) replaced by
    that wrapper (in-place and out= ops return their argument)."""
    if isinstance(x, torch.Tensor) and id(x) in own:
        return own[id(x)]
    if isinstance(x, (list, tuple)):
        return type(x)([_rewrap(v, own) for v in x])
    return x


class LazyTensor(torch.Tensor):
    """A CPU tensor whose data is read by ``loader`` on first use (see the module docstring)."""

    # Ops go straight to __torch_dispatch__; the default __torch_function__ would re-wrap
    # plain results as (dataless) LazyTensors.
    __torch_function__ = torch._C._disabled_torch_function_impl

    _lazy_loader: Callable[[], torch.Tensor] | None
    _lazy_value: torch.Tensor | None
    _lazy_lock: threading.Lock
    _lazy_source: str

    def __new__(cls, *args: Any, **kwargs: Any) -> LazyTensor:
        raise TypeError("make a LazyTensor with LazyTensor.create(shape, dtype, loader)")

    @classmethod
    def create(
        cls,
        shape: tuple[int, ...],
        dtype: str,
        loader: Callable[[], torch.Tensor],
        source: str = "",
    ) -> LazyTensor:
        """A LazyTensor of ``shape`` and torch dtype ``dtype`` (``"float32"``...; a
        ``torch.dtype`` works too). ``loader()`` returns the data as a tensor of exactly that
        shape and dtype; it is called at most once. ``source`` names the data in messages
        (e.g. ``"ckpt.mdl:/model/layer.weight"``)."""
        shape = tuple(int(n) for n in shape)
        if any(n < 0 for n in shape):
            raise ValueError(f"negative dimension in shape {shape}")
        self = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=torch_dtype(dtype), device="cpu", requires_grad=False
        )
        self._lazy_loader = loader
        self._lazy_value = None
        self._lazy_lock = threading.Lock()
        self._lazy_source = source
        return self

    @property
    def is_loaded(self) -> bool:
        """True once the data has been read."""
        return self._lazy_value is not None

    # -- loading -------------------------------------------------------------------------

    def _lazy_get(self) -> torch.Tensor:
        value = self._lazy_value
        if value is None:
            with self._lazy_lock:
                value = self._lazy_value
                if value is None:
                    value = self._lazy_load()
                    self._lazy_value = value
                    self._lazy_loader = None
        return value

    def _lazy_load(self) -> torch.Tensor:
        loader = self._lazy_loader
        assert loader is not None
        value = loader()
        if not isinstance(value, torch.Tensor) or isinstance(value, LazyTensor):
            raise TypeError(
                f"{self._describe()}: the loader returned {type(value).__name__}, not a tensor"
            )
        if value.shape != self.shape or value.dtype != self.dtype:
            raise CorruptCheckpointError(
                self._lazy_source or None,
                f"the data read is {value.dtype} of shape {tuple(value.shape)} but the checkpoint"
                f" listed {self.dtype} of shape {tuple(self.shape)}; the file may have changed"
                " since it was opened",
                "load the checkpoint again",
            )
        return value.detach().cpu().contiguous()  # contiguous, like the wrapper's strides

    def _lazy_poison(self, why: str) -> str:
        """Make every later use raise (the wrapper no longer describes its data); the message."""
        message = f"{self._describe()} is unusable: {why}"

        def broken() -> torch.Tensor:
            raise RuntimeError(message)

        with self._lazy_lock:
            self._lazy_value = None
            self._lazy_loader = broken
        return message

    def _describe(self) -> str:
        source = f", source={self._lazy_source!r}" if self._lazy_source else ""
        return f"LazyTensor(shape={tuple(self.shape)}, dtype={self.dtype}{source})"

    # -- every ATen op -------------------------------------------------------------------

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        lazies: list[LazyTensor] = []
        reshapes = (
            torch.Tag.inplace_view in func.tags or func.overloadpacket.__name__ in _RESIZING_OPS
        )
        if reshapes and args and isinstance(args[0], LazyTensor):
            raise RuntimeError(
                f"{func} would change the shape of {args[0]._describe()} in place;"
                " apply it to materialize(x) instead"
            )
        out = func(
            *_unwrap(args, lazies), **{k: _unwrap(v, lazies) for k, v in (kwargs or {}).items()}
        )
        for lazy in lazies:  # an out= argument may have been resized
            value = lazy._lazy_value
            if value is not None and (value.shape != lazy.shape or value.dtype != lazy.dtype):
                raise RuntimeError(lazy._lazy_poison(f"{func} changed its shape or dtype"))

        # An op that returns a LazyTensor's own data (in-place and out= ops) returns the wrapper.
        own = {id(lazy._lazy_value): lazy for lazy in lazies}
        return _rewrap(out, own)

    # -- Python-level Tensor methods that do not go through dispatch ----------------------

    def numpy(self, *, force: bool = False) -> np.ndarray:
        """The loaded data as a numpy array (sharing memory with the cached tensor)."""
        return self._lazy_get().numpy(force=force)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self.numpy()
        if dtype is not None:
            arr = arr.astype(dtype, copy=False)
        return arr.copy() if copy else arr

    def tolist(self) -> Any:
        return self._lazy_get().tolist()

    # The wrapper has no storage of its own: asked for one (``share_memory_`` segfaulted, and
    # ``safetensors.torch.save_file`` of a loaded state failed), it answers with the data's.

    def data_ptr(self) -> int:
        return self._lazy_get().data_ptr()

    def untyped_storage(self) -> torch.UntypedStorage:
        return self._lazy_get().untyped_storage()

    def _typed_storage(self) -> Any:
        return self._lazy_get()._typed_storage()

    def storage(self) -> Any:
        return self._lazy_get().storage()

    def is_shared(self) -> bool:
        return self._lazy_get().is_shared()

    def share_memory_(self) -> LazyTensor:
        self._lazy_get().share_memory_()
        return self

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return self._describe()[:-1] + f", loaded={self.is_loaded})"

    def __format__(self, format_spec: str) -> str:
        if self.dim() == 0:  # like a plain 0-d tensor: format the number (reads the data)
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Pickle and torch.save store the plain tensor: a file that loads with
        # torch.load(weights_only=True) and does not need ckpt_migrate.
        return self._lazy_get().__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        result = copy.deepcopy(self._lazy_get(), memo)
        memo[id(self)] = result
        return result

    @property
    def data(self) -> torch.Tensor:
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        """``x.data = y``: later reads (and ``save``) see ``y``'s values, sharing its memory as
        with a plain tensor. Another shape or dtype would leave the wrapper describing data it
        does not hold, so it raises (torch's setter changed the shape; reads then failed and
        ``save`` wrote the file's old data)."""
        value = materialize(new) if isinstance(new, torch.Tensor) else None
        if value is None or value.shape != self.shape or value.dtype != self.dtype:
            what = (
                f"{value.dtype} of shape {tuple(value.shape)}"
                if value is not None
                else type(new).__name__
            )
            raise RuntimeError(
                f"{self._describe()}: .data = {what} would change the tensor's shape or dtype"
                f" ({self.dtype} of shape {tuple(self.shape)}); put the new tensor in its"
                " place in the state dict instead"
            )
        value = value.detach().cpu().contiguous()
        with self._lazy_lock:
            self._lazy_value, self._lazy_loader = value, None

    @property
    def requires_grad(self) -> bool:
        return torch.Tensor.requires_grad.__get__(self)

    @requires_grad.setter
    def requires_grad(self, requires_grad: bool) -> None:
        self.requires_grad_(requires_grad)

    def requires_grad_(self, requires_grad: bool = True) -> LazyTensor:
        if requires_grad:
            raise RuntimeError(
                f"{self._describe()} cannot require grad;"
                " use materialize(x).requires_grad_() or x.clone().requires_grad_()"
            )
        return self
