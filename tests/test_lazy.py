"""LazyTensor and the storage <-> tensor conversions (ckpt_migrate/lazy.py)."""

from __future__ import annotations

import copy
import io
import pickle
import threading
import time
import warnings

import numpy as np
import pytest
import torch

from ckpt_migrate.errors import CorruptCheckpointError, UnsupportedContentError
from ckpt_migrate.torch.lazy import (
    LazyTensor,
    is_lazy,
    materialize,
    storage_to_tensor,
    tensor_to_storage,
)


class Counting:
    """A loader that returns a copy of ``value`` and counts its calls."""

    def __init__(self, value: torch.Tensor, delay: float = 0.0):
        self.value = value
        self.delay = delay
        self.calls = 0

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        return self.value.clone()


def lazy(value: torch.Tensor, source: str = "ckpt.mdl:/model/w") -> tuple[LazyTensor, Counting]:
    loader = Counting(value)
    dtype = str(value.dtype).removeprefix("torch.")
    return LazyTensor.create(tuple(value.shape), dtype, loader, source), loader


def bits(t: torch.Tensor) -> list[int]:
    """The raw 16-bit patterns of a bf16/fp16 tensor."""
    return t.view(torch.int16).flatten().tolist()


# A bf16 tensor with -0.0, +-inf, a quiet NaN, a NaN with a payload and a negative NaN.
BF16_PATTERNS = [0x0000, -0x8000, 0x3F80, 0x7F80, -0x0080, 0x7FC0, 0x7F81, -0x003F, 0x0001]


def bf16_special() -> torch.Tensor:
    return torch.tensor(BF16_PATTERNS, dtype=torch.int16).view(torch.bfloat16)


# -- storage_to_tensor / tensor_to_storage --------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "value"),
    [
        ("float32", torch.tensor([[1.5, -2.0], [0.0, 3.25]])),
        ("float64", torch.tensor([1e300, -0.0], dtype=torch.float64)),
        ("float16", torch.tensor([65504.0, -0.0, 1e-7], dtype=torch.float16)),
        ("int64", torch.tensor([-(2**63), 2**63 - 1])),
        ("int32", torch.tensor([-(2**31), 7], dtype=torch.int32)),
        ("int16", torch.tensor([-(2**15), 5], dtype=torch.int16)),
        ("int8", torch.tensor([-128, 127], dtype=torch.int8)),
        ("uint8", torch.tensor([0, 255], dtype=torch.uint8)),
        ("uint16", torch.tensor([0, 65535], dtype=torch.uint16)),
        ("uint32", torch.tensor([0, 2**32 - 1], dtype=torch.uint32)),
        ("uint64", torch.tensor([0, 2**64 - 1], dtype=torch.uint64)),
        ("bool", torch.tensor([[True, False, True]])),
        ("float32", torch.tensor(2.5)),
        ("int64", torch.zeros((0, 3), dtype=torch.int64)),
        ("bfloat16", torch.zeros((2, 0, 4), dtype=torch.bfloat16)),
    ],
)
def test_round_trip(dtype, value):
    arr, name = tensor_to_storage(value)
    assert name == dtype
    assert arr.shape == tuple(value.shape)
    assert arr.flags.c_contiguous
    assert arr.dtype.byteorder in "<|="
    back = storage_to_tensor(arr, dtype)
    assert back.dtype == value.dtype
    assert torch.equal(back, value)


def test_bf16_bit_exact_nan_payloads_and_negative_zero():
    t = bf16_special()
    arr, name = tensor_to_storage(t)
    assert name == "bfloat16"
    assert arr.dtype == np.dtype("<i2")
    assert arr.tolist() == BF16_PATTERNS
    back = storage_to_tensor(arr, "bfloat16")
    assert back.dtype == torch.bfloat16
    assert bits(back) == BF16_PATTERNS
    assert storage_to_tensor(arr.astype(np.uint16), "bfloat16").view(torch.int16).tolist() == (
        BF16_PATTERNS
    )


def test_bf16_zero_dim():
    t = torch.tensor(-0.0, dtype=torch.bfloat16)
    arr, _ = tensor_to_storage(t)
    assert arr.shape == () and int(arr) == -0x8000
    back = storage_to_tensor(arr, "bfloat16")
    assert back.shape == () and bits(back) == [-0x8000]


def test_storage_to_tensor_big_endian_and_read_only_and_strided():
    big = np.array([1.5, -2.0, 3.0], dtype=">f4")
    t = storage_to_tensor(big, "float32")
    assert t.tolist() == [1.5, -2.0, 3.0]
    big_bf16 = np.array(BF16_PATTERNS, dtype=">i2")
    assert bits(storage_to_tensor(big_bf16, "torch.bfloat16")) == BF16_PATTERNS

    ro = np.arange(4, dtype=np.int64)
    ro.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.from_numpy warns about read-only arrays
        t = storage_to_tensor(ro, "int64")
    t.add_(1)  # the read-only input was copied, not shared
    assert ro.tolist() == [0, 1, 2, 3]

    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::-2]
    assert storage_to_tensor(strided, "float32").tolist() == strided.tolist()


def test_storage_to_tensor_rejects_wrong_storage_dtype():
    with pytest.raises(ValueError, match="cannot read"):
        storage_to_tensor(np.zeros(3, np.float32), "int32")
    with pytest.raises(ValueError, match="cannot read"):
        storage_to_tensor(np.zeros(3, np.float32), "bfloat16")
    with pytest.raises(ValueError, match="unsupported tensor dtype"):
        storage_to_tensor(np.zeros(3, np.float32), "float8")


def test_tensor_to_storage_detaches_and_handles_views():
    w = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    arr, name = tensor_to_storage(w.t())
    assert name == "float32"
    assert arr.flags.c_contiguous
    assert arr.tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2])
def test_tensor_to_storage_rejects_unsupported_dtypes(dtype):
    t = torch.zeros(2).to(dtype)
    with pytest.raises(UnsupportedContentError) as info:
        tensor_to_storage(t)
    assert str(info.value) == (
        f"tensor dtype {dtype} cannot be stored in a checkpoint;"
        " convert it to a supported dtype first"
    )


def test_tensor_to_storage_of_lazy_tensor():
    x, loader = lazy(bf16_special())
    arr, name = tensor_to_storage(x)
    assert name == "bfloat16" and arr.tolist() == BF16_PATTERNS
    assert loader.calls == 1


# -- LazyTensor: metadata without reading -------------------------------------------------


def test_create_and_metadata_read_nothing():
    x, loader = lazy(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert isinstance(x, torch.Tensor) and is_lazy(x)
    assert x.shape == (2, 3) and x.size() == torch.Size([2, 3]) and x.size(1) == 3
    assert x.dtype == torch.float32 and x.device == torch.device("cpu")
    assert x.dim() == 2 and x.ndim == 2 and x.numel() == 6 and len(x) == 2
    assert x.element_size() == 4 and x.nbytes == 24 and x.stride() == (3, 1)
    assert x.is_contiguous() and x.is_floating_point() and not x.requires_grad
    assert repr(x) == (
        "LazyTensor(shape=(2, 3), dtype=torch.float32, source='ckpt.mdl:/model/w', loaded=False)"
    )
    assert str(x) == repr(x) and f"{x}" == repr(x)
    assert not x.is_loaded
    assert loader.calls == 0


def test_create_validates_arguments():
    with pytest.raises(ValueError, match="negative"):
        LazyTensor.create((2, -1), "float32", lambda: torch.zeros(2))
    with pytest.raises(ValueError, match="unsupported tensor dtype"):
        LazyTensor.create((2,), "complex64", lambda: torch.zeros(2))
    with pytest.raises(TypeError, match=r"LazyTensor\.create"):
        LazyTensor(torch.zeros(2))
    x = LazyTensor.create([2], torch.bfloat16, lambda: torch.zeros(2, dtype=torch.bfloat16))
    assert x.dtype == torch.bfloat16 and x.shape == (2,)


# -- LazyTensor: ops materialize once ------------------------------------------------------


def test_ops_materialize_once():
    value = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    x, loader = lazy(value)
    results = [
        x + 1,
        torch.sum(x),
        x.clone(),
        x.to(torch.float64),
        x.double(),
        x[1],
        x[:, 1:],
        x == 2,
        x > 1,
        x.t(),
        x @ torch.ones(3),
    ]
    assert loader.calls == 1 and x.is_loaded
    assert not any(is_lazy(r) for r in results)
    assert all(type(r) is torch.Tensor for r in results)
    assert torch.equal(results[0], value + 1)
    assert results[1].item() == 15.0
    assert torch.equal(results[2], value)
    assert results[3].dtype == torch.float64 and torch.equal(results[3], value.double())
    assert torch.equal(results[5], value[1]) and torch.equal(results[6], value[:, 1:])
    assert results[7].tolist() == [[False, False, True], [False, False, False]]
    assert torch.equal(results[10], value.sum(1))
    assert torch.equal(x, value) and torch.equal(value, x)
    assert x.tolist() == value.tolist()
    assert x.float() is x  # same dtype: torch returns the tensor itself, still lazy-backed
    assert [row.tolist() for row in x] == value.tolist()
    assert loader.calls == 1
    assert "loaded=True" in repr(x)


def test_zero_dim_item_and_format():
    x, loader = lazy(torch.tensor(3.5))
    assert x.item() == 3.5 and float(x) == 3.5 and bool(x)
    assert f"{x:.2f}" == "3.50"
    assert loader.calls == 1


def test_empty_and_integer_and_bool_tensors():
    for value in [
        torch.zeros((0, 4)),
        torch.zeros((3, 0), dtype=torch.int64),
        torch.tensor([True, False]),
        torch.tensor([[0, 255]], dtype=torch.uint8),
        torch.tensor([2**62, -5], dtype=torch.int64),
        torch.tensor([1.0, -0.0, 65504.0], dtype=torch.float16),
    ]:
        x, loader = lazy(value)
        assert x.shape == value.shape and x.dtype == value.dtype
        assert torch.equal(x.clone(), value)
        assert loader.calls == 1


def test_bf16_lazy_bit_exact():
    x, loader = lazy(bf16_special())
    assert bits(x.clone()) == BF16_PATTERNS
    assert bits(materialize(x)) == BF16_PATTERNS
    assert loader.calls == 1


def test_numpy_and_array():
    value = torch.arange(6, dtype=torch.int32).reshape(3, 2)
    x, loader = lazy(value)
    arr = x.numpy()
    assert isinstance(arr, np.ndarray) and arr.dtype == np.int32
    assert arr.tolist() == value.tolist()
    assert np.asarray(x).tolist() == value.tolist()
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    assert np.array(x, copy=True).tolist() == value.tolist()
    assert loader.calls == 1


def test_materialize_and_is_lazy():
    value = torch.ones(3)
    x, loader = lazy(value)
    real = materialize(x)
    assert type(real) is torch.Tensor and torch.equal(real, value)
    assert materialize(x) is real  # the cache, not a copy
    assert loader.calls == 1
    plain = torch.zeros(2)
    assert materialize(plain) is plain and materialize(5) == 5
    assert not is_lazy(plain) and not is_lazy(real) and is_lazy(x)


# -- in-place ops, shape changes, autograd ---------------------------------------------------


def test_in_place_ops_change_the_cached_data():
    x, loader = lazy(torch.ones(4))
    assert x.add_(1) is x
    assert x.sum().item() == 8.0
    x.mul_(3)[0] = -1.0
    assert x.tolist() == [-1.0, 6.0, 6.0, 6.0]
    assert materialize(x).tolist() == [-1.0, 6.0, 6.0, 6.0]
    x.data.zero_()  # .data shares the cached storage, like a plain tensor
    assert x.sum().item() == 0.0
    plain = torch.zeros(4)
    plain.add_(x + 2)
    assert plain.tolist() == [2.0] * 4
    assert loader.calls == 1


def test_shape_changing_in_place_ops_raise():
    x, _ = lazy(torch.ones(2, 3))
    for op in (lambda t: t.t_(), lambda t: t.unsqueeze_(0), lambda t: t.resize_(6)):
        with pytest.raises(RuntimeError, match="change the shape"):
            op(x)
    assert x.shape == (2, 3) and x.sum().item() == 6.0

    y, _ = lazy(torch.ones(3))
    with pytest.warns(UserWarning, match="resized"), pytest.raises(RuntimeError, match="shape"):
        torch.add(torch.ones(4), 1, out=y)
    with pytest.raises(RuntimeError, match="unusable"):  # never silently wrong afterwards
        y.sum()


def test_out_argument_same_shape_works():
    y, _ = lazy(torch.ones(3))
    torch.add(torch.arange(3.0), 1, out=y)
    assert y.tolist() == [1.0, 2.0, 3.0]


def test_autograd_is_refused():
    x, loader = lazy(torch.ones(2))
    with pytest.raises(RuntimeError, match="cannot require grad"):
        x.requires_grad_()
    with pytest.raises(RuntimeError, match="cannot require grad"):
        x.requires_grad = True
    x.requires_grad_(False)
    x.requires_grad = False
    assert not x.requires_grad
    p = materialize(x).requires_grad_()
    (p * 3).sum().backward()
    assert p.grad.tolist() == [3.0, 3.0]
    assert loader.calls == 1


# -- loading errors, threads ------------------------------------------------------------------


def test_loader_shape_or_dtype_mismatch_is_a_clear_error():
    x = LazyTensor.create((2, 3), "float32", lambda: torch.zeros(3, 2), "ckpt.mdl:/model/w")
    with pytest.raises(CorruptCheckpointError) as info:
        x + 1
    message = str(info.value)
    assert message.startswith("ckpt.mdl:/model/w: ")
    assert "(3, 2)" in message and "(2, 3)" in message and "changed" in message
    y = LazyTensor.create((2,), "float32", lambda: torch.zeros(2, dtype=torch.float64))
    with pytest.raises(CorruptCheckpointError, match="float64"):
        y.sum()


def test_failed_load_is_retried():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("disk hiccup")
        return torch.ones(2)

    x = LazyTensor.create((2,), "float32", flaky)
    with pytest.raises(OSError):
        x.sum()
    assert not x.is_loaded
    assert x.sum().item() == 2.0 and len(calls) == 2


def test_threads_load_once():
    loader = Counting(torch.arange(1000.0), delay=0.05)
    x = LazyTensor.create((1000,), "float32", loader)
    results = []
    barrier = threading.Barrier(8)

    def work():
        barrier.wait()
        results.append(x.sum().item())

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [499500.0] * 8
    assert loader.calls == 1


# -- torch.nn / torch.optim --------------------------------------------------------------------


def test_module_load_state_dict():
    torch.manual_seed(0)
    source = torch.nn.Linear(4, 3)
    sd = source.state_dict()
    lazy_sd = {}
    loaders = []
    for key, value in sd.items():
        lazy_sd[key], loader = lazy(value)
        loaders.append(loader)
    target = torch.nn.Linear(4, 3)
    result = target.load_state_dict(lazy_sd)
    assert not result.missing_keys and not result.unexpected_keys
    assert all(loader.calls == 1 for loader in loaders)
    assert type(target.weight) is torch.nn.Parameter and target.weight.requires_grad
    assert torch.equal(target.weight, source.weight) and torch.equal(target.bias, source.bias)
    x = torch.randn(2, 4)
    assert torch.equal(target(x), source(x))


def test_module_load_state_dict_shape_mismatch_reads_nothing():
    bad, loader = lazy(torch.zeros(3, 5))
    ok, _ = lazy(torch.zeros(3))
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        torch.nn.Linear(4, 3).load_state_dict({"weight": bad, "bias": ok}, strict=True)
    assert loader.calls == 0


def test_module_load_state_dict_assign_needs_materialize():
    sd = torch.nn.Linear(2, 2).state_dict()
    lazy_sd = {k: lazy(v)[0] for k, v in sd.items()}
    target = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError):
        target.load_state_dict(lazy_sd, assign=True)
    target.load_state_dict({k: materialize(v) for k, v in lazy_sd.items()}, assign=True)
    assert torch.equal(target.weight, sd["weight"])


def _trained_adam() -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 3)).pow(2).sum().backward()
        opt.step()
    return model, copy.deepcopy(opt.state_dict())


def _lazy_tree(obj, loaders):
    if isinstance(obj, torch.Tensor):
        x, loader = lazy(obj)
        loaders.append(loader)
        return x
    if isinstance(obj, dict):
        return {k: _lazy_tree(v, loaders) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_lazy_tree(v, loaders) for v in obj]
    return obj


def _step_after_loading(model_sd, opt_sd):
    model = torch.nn.Linear(3, 2)
    model.load_state_dict(model_sd)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    opt.load_state_dict(opt_sd)
    torch.manual_seed(2)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 3)).pow(2).sum().backward()
        opt.step()
    return model, opt


def test_optimizer_load_state_dict_and_step_match_plain_tensors():
    trained, opt_sd = _trained_adam()
    model_sd = copy.deepcopy(trained.state_dict())
    state = opt_sd["state"][0]
    assert {"step", "exp_avg", "exp_avg_sq"} <= set(state)

    plain_model, plain_opt = _step_after_loading(copy.deepcopy(model_sd), copy.deepcopy(opt_sd))

    loaders = []
    lazy_model_sd = _lazy_tree(model_sd, loaders)
    lazy_opt_sd = _lazy_tree(opt_sd, loaders)
    assert is_lazy(lazy_opt_sd["state"][0]["exp_avg"]) and is_lazy(lazy_opt_sd["state"][0]["step"])
    lazy_model, lazy_opt = _step_after_loading(lazy_model_sd, lazy_opt_sd)

    assert all(loader.calls == 1 for loader in loaders)
    for a, b in zip(plain_model.parameters(), lazy_model.parameters(), strict=True):
        assert torch.equal(a, b)
    plain_state = plain_opt.state_dict()["state"]
    lazy_state = lazy_opt.state_dict()["state"]
    for key in plain_state:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(materialize(lazy_state[key][name]), plain_state[key][name])
    # the original (unloaded) source data is untouched: the optimizer changed the caches
    assert lazy_state[0]["step"].item() == 5.0 and opt_sd["state"][0]["step"].item() == 3.0


# -- pickling, torch.save, deepcopy ------------------------------------------------------------


def test_torch_save_stores_plain_tensors():
    value = torch.arange(5, dtype=torch.int64)
    x, loader = lazy(value)
    b, _ = lazy(bf16_special())
    buf = io.BytesIO()
    torch.save({"a": x, "b": b, "nested": [x]}, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    assert type(back["a"]) is torch.Tensor and torch.equal(back["a"], value)
    assert back["b"].dtype == torch.bfloat16 and bits(back["b"]) == BF16_PATTERNS
    assert back["nested"][0].data_ptr() == back["a"].data_ptr()  # sharing kept
    assert loader.calls == 1


def test_torch_save_after_in_place_change_saves_the_change():
    x, _ = lazy(torch.zeros(2))
    x.add_(7)
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True).tolist() == [7.0, 7.0]


def test_pickle_and_deepcopy_give_plain_tensors():
    value = torch.tensor([[1.0, 2.0]])
    x, loader = lazy(value)
    for other in (pickle.loads(pickle.dumps(x)), copy.deepcopy(x)):
        assert type(other) is torch.Tensor and torch.equal(other, value)
    tree = copy.deepcopy({"a": x, "b": x})
    assert tree["a"] is tree["b"]
    tree["a"].add_(1)  # a real copy: the LazyTensor is unchanged
    assert torch.equal(x, value)
    assert loader.calls == 1


def test_a_loaded_state_lets_go_of_its_file_when_it_is_let_go_of(tmp_path):
    """``load`` of the real library's file: once the state is dropped, the file is closed
    without waiting for the cycle collector (the tree builder's memo of tensors lived in a
    cycle, and kept the file open: another open of it with other locking flags then failed)."""
    import gc
    import shutil

    import h5py
    from conftest import REAL

    import ckpt_migrate as cm

    path = tmp_path / "basic.mdl"
    shutil.copyfile(REAL / "basic.mdl", path)
    gc.collect()
    gc.disable()
    try:
        state = cm.load(path, objects_mode="data")
        assert is_lazy(state["model"]["w"])
        del state
        names = [h5py.h5f.get_name(i) for i in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)]
        assert str(path).encode() not in names
        with h5py.File(path, "r+") as f:  # (the default locking flags, for writing)
            assert "__spec__" in f.attrs
    finally:
        gc.enable()


SHARE_MEMORY = """
import sys, torch, ckpt_migrate
state = ckpt_migrate.load(sys.argv[1])
w = state["w"]
assert w.share_memory_() is w and w.is_shared()
assert w.data_ptr() == w.untyped_storage().data_ptr() != 0
print(w.tolist())
"""


def test_a_loaded_tensors_storage_is_its_datas(tmp_path):
    """The wrapper has no storage of its own: ``share_memory_()`` on a loaded tensor ended the
    process with a segmentation fault, ``data_ptr()`` was 0, and ``safetensors``'
    ``save_file`` of a loaded state failed ("invalid python storage"). Each now answers with
    the data's storage (loading it first)."""
    import subprocess
    import sys

    from safetensors.torch import load_file, save_file

    import ckpt_migrate

    path = tmp_path / "w.mdl"
    ckpt_migrate.save({"w": torch.arange(4.0), "b": torch.ones(3, dtype=torch.bfloat16)}, path)
    proc = subprocess.run(
        [sys.executable, "-c", SHARE_MEMORY, str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout == "[0.0, 1.0, 2.0, 3.0]\n", proc.stderr
    state = ckpt_migrate.load(path)
    save_file(state, tmp_path / "w.safetensors")
    back = load_file(tmp_path / "w.safetensors")
    assert torch.equal(back["w"], torch.arange(4.0)) and back["b"].dtype == torch.bfloat16
    assert torch.equal(back["b"], torch.ones(3, dtype=torch.bfloat16))
