"""Write one tensor's data into a new dataset, streaming, without holding the tensor twice.

Data that already sits LZ4-compressed in a chunked dataset is copied chunk by chunk as stored
bytes (``read_direct_chunk``/``write_direct_chunk``): never decoded, never recompressed. Anything
else is streamed in slabs of at most ``COPY_BLOCK_BYTES``.
"""

from __future__ import annotations

from collections.abc import Callable

import h5py
import numpy as np

from ckpt_migrate.errors import CorruptCheckpointError
from ckpt_migrate.format import dtypes
from ckpt_migrate.format.h5 import chunks
from ckpt_migrate.format.h5.io import (
    COPY_BLOCK_BYTES,
    DAMAGED_HDF5,
    LZ4_FILTER_ID,
    filters_of,
    iter_slabs,
    lz4_options,
    read_slab,
)
from ckpt_migrate.format.tree import H5Data, TensorLeaf

PlaceTensor = Callable[[h5py.Group, str, TensorLeaf], h5py.Dataset]


def write_tensor(f: h5py.Group, name: str, leaf: TensorLeaf) -> h5py.Dataset:
    """Create dataset ``name`` holding ``leaf``'s data in its storage dtype, as the real writers do:

    LZ4 (filter 32004) and auto-chunking when ``ndim > 0``; contiguous and uncompressed when 0-d.
    """
    storage = dtypes.by_name(leaf.dtype).storage
    shape = tuple(leaf.shape)
    src = leaf.data
    if isinstance(src, H5Data):
        ds_src = src.handle.dataset(src.name)
        if shape and _raw_copy_possible(ds_src, storage, shape):
            return _copy_chunks(f, name, ds_src)
        if shape:
            dst = f.create_dataset(name, shape=shape, dtype=storage, **lz4_options())
            for sl in iter_slabs(shape, storage.itemsize):
                dst[sl] = _as_storage(read_slab(ds_src, sl), storage)
            return dst
        return f.create_dataset(name, data=_as_storage(read_slab(ds_src, ()), storage))
    array = src.read()
    array = _as_storage(np.asarray(array), storage)
    if array.shape != shape:
        raise ValueError(f"{name}: data has shape {array.shape}, leaf says {shape}")
    if not shape:
        return f.create_dataset(name, data=array)
    dst = f.create_dataset(name, shape=shape, dtype=storage, **lz4_options())
    if array.size:
        for sl in iter_slabs(shape, storage.itemsize):
            dst[sl] = array[sl]
    return dst


def _as_storage(array: np.ndarray, storage: np.dtype) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype == storage or (storage.kind == "b" and array.dtype.kind == "b"):
        return array
    if (
        array.dtype.itemsize == storage.itemsize
        and array.dtype.kind in "iu"
        and storage.kind in "iu"
    ):
        return array.view(storage)  # same bits (e.g. bf16 patterns held as uint16)
    if array.dtype.newbyteorder("<") == storage.newbyteorder("<"):
        return array.astype(storage)
    raise ValueError(f"cannot store {array.dtype} data as {storage}")


def _raw_copy_possible(ds: h5py.Dataset, storage: np.dtype, shape: tuple[int, ...]) -> bool:
    if ds.chunks is None or ds.shape != shape or ds.dtype != storage or ds.size == 0:
        return False
    pipeline = filters_of(ds)
    chunk_bytes = int(np.prod(ds.chunks, dtype=np.int64)) * storage.itemsize
    return (
        len(pipeline) == 1 and pipeline[0][0] == LZ4_FILTER_ID and chunk_bytes <= COPY_BLOCK_BYTES
    )


def _copy_chunks(f: h5py.Group, name: str, src: h5py.Dataset) -> h5py.Dataset:
    try:
        chunks.check_read(src, ())  # copied as stored, so checked as a decode would check them
        # A damaged header can declare a type h5py cannot make again (an enum with odd names)
        dst = f.create_dataset(
            name, shape=src.shape, dtype=src.dtype, chunks=src.chunks, **lz4_options()
        )
        sid, did = src.id, dst.id
        for i in range(sid.get_num_chunks()):
            info = sid.get_chunk_info(i)
            mask, data = sid.read_direct_chunk(info.chunk_offset)
            did.write_direct_chunk(info.chunk_offset, data, mask)
    except DAMAGED_HDF5 as exc:
        raise CorruptCheckpointError(
            src.file.filename,
            f"cannot copy the chunks of dataset {src.name.lstrip('/')!r} ({exc})",
            "the file may be damaged; use another copy",
        ) from None
    return dst
