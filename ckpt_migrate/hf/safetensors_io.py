"""Stream tensors into safetensors files (and read them back lazily).

safetensors puts a JSON header first (names, dtypes, shapes, byte offsets), then every tensor's
bytes back to back. The writer takes the names, dtypes and shapes up front, writes the header,
then each tensor as it is built, so the process holds one tensor at a time; a hash of each
tensor's bytes is kept for the read-back check. Sharding follows ``transformers``'
``save_pretrained``: ``model-00001-of-00003.safetensors`` files of at most ``max_shard_size``
bytes (a larger tensor gets a shard of its own) and ``model.safetensors.index.json`` with
``metadata.total_size`` and ``weight_map``; a single ``model.safetensors`` when all fits.
"""

from __future__ import annotations

import gc
import json
import math
import os
import struct
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ckpt_migrate import jsonfile
from ckpt_migrate.errors import (
    CkptIOError,
    CorruptCheckpointError,
    UsageError,
    VerificationError,
    require,
)
from ckpt_migrate.format.dtypes import by_name

# torch dtype name -> safetensors dtype tag (bf16 travels as its raw 16-bit pattern).
ST_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
    "bool": "BOOL",
}
TORCH_DTYPES = {tag: name for name, tag in ST_DTYPES.items()}
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
DEFAULT_SHARD_SIZE = "10GB"  # Model Zoo's --hf-shard-size default (base_converter.py line 939)


def parse_size(size: int | str) -> int:
    """Bytes of ``"5GB"`` / ``"500MB"`` / ``"2GiB"`` / ``1000`` as transformers'
    ``convert_file_size_to_int`` reads them (decimal GB, binary GiB; a lower-case ``b`` is bits)."""
    value = size if isinstance(size, int) else _size_of(size.strip())
    if value is None:
        raise UsageError(None, f"shard size {size!r} is not a size", "write it like 5GB or 500MB")
    if value < 1:  # (a negative one was taken, and wrote a shard per tensor)
        raise UsageError(None, f"shard size must be at least 1 byte, not {size!r}")
    return value


def _size_of(text: str) -> int | None:
    units = (("GIB", 2**30), ("MIB", 2**20), ("KIB", 2**10), ("GB", 10**9), ("MB", 10**6))
    units += (("KB", 10**3),)
    if text.isdigit():
        return int(text)
    for unit, factor in units:
        if text.upper().endswith(unit):
            try:
                value = int(text[: -len(unit)]) * factor
            except ValueError:
                return None
            return value // 8 if unit[-2:] != "IB" and text.endswith("b") else value
    return None


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    dtype: str  # torch dtype name
    shape: tuple[int, ...]
    # computed once (asked eight times a tensor: np.prod took 2 s of 150k); slots, not a
    # dictionary each: 150k entries (issue 33)
    nbytes: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        nbytes = math.prod(self.shape) * by_name(self.dtype).storage.itemsize
        object.__setattr__(self, "nbytes", nbytes)


def shard(entries: list[Entry], max_size: int) -> list[list[Entry]]:
    """Greedy in order, as huggingface_hub's ``split_state_dict_into_shards_factory``: a tensor
    that does not fit starts a new shard; one larger than ``max_size`` stands alone."""
    shards: list[list[Entry]] = []
    current: list[Entry] = []
    size = 0
    for e in entries:
        if e.nbytes > max_size:
            shards.append([e])
            continue
        if current and size + e.nbytes > max_size:
            shards.append(current)
            current, size = [], 0
        current.append(e)
        size += e.nbytes
    if current or not shards:
        shards.append(current)
    return shards


def file_names(count: int) -> list[str]:
    if count == 1:
        return [SINGLE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


DATA_ALIGNMENT = 64


def header_parts(entries: list[Entry], metadata: Mapping[str, str]) -> Iterator[bytes]:
    """The length-prefixed JSON header, in pieces to be written one after the other, padded
    with spaces (as the format allows) so that the tensor data begins on a 64-byte boundary.
    A loader that maps the file (``transformers`` 5 does) then hands the kernels tensors
    aligned as ones the process allocated: on 8-byte alignment alone a CLIP model reloaded
    from the export computed outputs 2.4e-7 apart from the same weights in memory (vectorised
    loops split differently).

    The bytes are those of ``json.dumps`` of the header as one object, made entry by entry
    twice (once for the length, once to write) and never held: the object and its joined text
    held 100 and 49 MB more at 112k entries than the pieces, and the pieces were the write's
    peak (280 MiB, 268 without them; issue 33)."""
    size = sum(map(len, _header_body(entries, metadata)))
    padding = -(size + 8) % DATA_ALIGNMENT
    yield struct.pack("<Q", size + padding)
    yield from _header_body(entries, metadata)
    yield b" " * padding


def _header_body(entries: list[Entry], metadata: Mapping[str, str]) -> Iterator[bytes]:
    yield json.dumps({"__metadata__": dict(metadata)}, separators=(",", ":"))[:-1].encode()
    for e, (begin, end) in zip(entries, _offsets(entries)):
        shape = ",".join(map(str, e.shape))
        tag = ST_DTYPES[e.dtype]
        yield (
            f',{json.dumps(e.name)}:{{"dtype":"{tag}","shape":[{shape}],'
            f'"data_offsets":[{begin},{end}]}}'.encode()
        )
    yield b"}"


def _offsets(entries: Iterable[Entry]) -> Iterator[tuple[int, int]]:
    """Each tensor's byte range in the data that follows the header, in order."""
    offset = 0
    for e in entries:
        yield offset, offset + e.nbytes
        offset += e.nbytes


@dataclass
class Written:
    """A write's record of its plan, all its read-back checks: a few objects a file, nothing
    a tensor (the 150k entries of a plan were 36 MiB of the read-back's peak, issue 33)."""

    files: list[str] = field(default_factory=list)
    # file -> the xxh3-128 of each tensor's bytes, in the order written
    hashes: dict[str, bytearray] = field(default_factory=dict)
    # file -> the xxh3-64 of each tensor's name, dtype and shape (``_listed``), in that order
    listings: dict[str, bytearray] = field(default_factory=dict)
    # file -> each tensor's size in bytes, in that order
    sizes: dict[str, array] = field(default_factory=dict)
    total_size: int = 0
    headers: dict[str, bytes] = field(default_factory=dict)  # file -> the hash of its header

    @property
    def tensors(self) -> int:
        return sum(map(len, self.sizes.values()))


def _listed(name: str, tag: str, shape: Iterable[int]) -> bytes:
    """What the read-back compares of one tensor's listing: its name, safetensors dtype tag
    and shape, hashed (the name's length first: no two listings read alike)."""
    text = name.encode("utf-8", "surrogatepass")
    dims = ",".join(map(str, shape))
    return xxhash.xxh3_64_digest(b"%d:%s%s[%s]" % (len(text), text, tag.encode(), dims.encode()))


def _raw(array: np.ndarray, e: Entry) -> memoryview:
    storage = by_name(e.dtype).storage
    if array.dtype != storage or tuple(array.shape) != e.shape:
        raise VerificationError(
            None, f"{e.name}: built {array.dtype}{array.shape}, planned {storage}{e.shape}"
        )
    flat = np.ascontiguousarray(array).reshape(-1)
    return memoryview(flat.view(np.uint8))


def _check_names(entries: list[Entry]) -> None:
    """Each name once, none the header's own, and each UTF-8 text: an export's plan is built
    output by output (``mapping.build_one``), and a name given twice would be one header entry
    (the text of one object) over two tensors' bytes, or one index entry for two shards; a
    name with a lone surrogate (which JSON escapes) is a header ``safetensors`` refuses."""
    seen = {"__metadata__"}
    for e in entries:
        if e.name in seen:
            raise VerificationError(None, f"{e.name}: planned twice for one safetensors model")
        if not e.name.isascii():
            try:
                e.name.encode("utf-8")
            except UnicodeEncodeError:
                raise VerificationError(
                    None, f"{e.name!r}: not UTF-8 text, which a safetensors header cannot hold"
                ) from None
        seen.add(e.name)


def write_stream(
    directory: Path,
    entries: list[Entry],
    arrays: Iterable[tuple[str, np.ndarray]],
    max_shard_size: int,
    metadata: Mapping[str, str] | None = None,
) -> Written:
    """Write ``arrays`` (yielded in ``entries`` order) into ``directory`` as safetensors shards
    and, for several shards, the index. Holds one array at a time."""
    meta = {"format": "pt", **(metadata or {})}
    _check_names(entries)
    groups = shard(entries, max_shard_size)
    names = file_names(len(groups))
    out = Written(files=list(names))
    source: Iterator[tuple[str, np.ndarray]] = iter(arrays)
    for fname, group in zip(names, groups):
        with open(directory / fname, "wb") as fh:
            digest = xxhash.xxh3_128()
            for part in header_parts(group, meta):
                digest.update(part)
                fh.write(part)
            out.headers[fname] = digest.digest()
            hashes = out.hashes[fname] = bytearray()
            listing = out.listings[fname] = bytearray()
            for e in group:
                listing += _listed(e.name, ST_DTYPES[e.dtype], e.shape)
            out.sizes[fname] = array("Q", (e.nbytes for e in group))
            for e in group:
                name, built = next(source)
                if name != e.name:
                    raise VerificationError(None, f"{name} built where {e.name} was planned")
                data = _raw(built, e)
                hashes += xxhash.xxh3_128_digest(data)
                fh.write(data)
                del built, data
                out.total_size += e.nbytes
            fh.flush()
            os.fsync(fh.fileno())
    if next(source, None) is not None:
        raise VerificationError(None, "more tensors were built than planned")
    if len(names) > 1:
        params = sum(math.prod(e.shape) for e in entries)
        index = {  # as transformers 5 writes it (modeling_utils.py, save_pretrained)
            "metadata": {"total_parameters": params, "total_size": out.total_size},
            "weight_map": {e.name: f for f, group in zip(names, groups) for e in group},
        }
        text = json.dumps(index, indent=2, sort_keys=True) + "\n"
        (directory / INDEX).write_text(text, encoding="utf-8")
        out.files.append(INDEX)
    return out


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Stored:
    """Where one tensor of a safetensors file is."""

    path: Path
    entry: Entry
    offset: int  # absolute byte offset in the file

    def read(self) -> np.ndarray:
        storage = by_name(self.entry.dtype).storage
        count = math.prod(self.entry.shape)
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = np.fromfile(fh, dtype=storage, count=count)
        if data.size != count:
            raise CorruptCheckpointError(self.path, f"{self.entry.name}: the file is truncated")
        return data.reshape(self.entry.shape)


def read_header(path: Path) -> tuple[dict[str, Stored], dict[str, str]]:
    """The tensors of one safetensors file (no data read) and its ``__metadata__``."""
    try:
        if not path.is_file():  # (a named pipe's read waits for a writer)
            raise ValueError("not a regular file")
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > jsonfile.MAX_BYTES:
                raise ValueError("header too large")
            header = jsonfile.loads(fh.read(length))
    except (ValueError, struct.error) as exc:
        raise CorruptCheckpointError(path, f"not a safetensors file ({exc})") from None
    except OSError as exc:
        raise CkptIOError.reading(path, exc) from None
    if not isinstance(header, dict):
        raise CorruptCheckpointError(path, "not a safetensors file (its header is not an object)")
    meta = header.pop("__metadata__", {}) or {}
    size = path.stat().st_size
    out = {}
    shapes: dict[tuple[int, ...], tuple[int, ...]] = {}  # (one tuple a shape: 150k tensors)
    for name, info in header.items():
        try:
            tag = info.get("dtype")
            begin, end = (int(x) for x in info["data_offsets"])
            shape = tuple(int(d) for d in info["shape"])
            shape = shapes.setdefault(shape, shape)
        except (AttributeError, KeyError, TypeError, ValueError):
            raise CorruptCheckpointError(path, f"{name}: not a safetensors tensor entry") from None
        if tag not in TORCH_DTYPES:
            raise CorruptCheckpointError(path, f"{name}: unsupported safetensors dtype {tag!r}")
        entry = Entry(name, TORCH_DTYPES[tag], shape)
        if min(shape, default=0) < 0 or begin < 0 or end - begin != entry.nbytes:
            raise CorruptCheckpointError(path, f"{name}: its shape and byte range disagree")
        if 8 + length + end > size:
            raise CorruptCheckpointError(path, f"{name}: its byte range does not fit the file")
        out[name] = Stored(path, entry, 8 + length + begin)
    _check_tiled(path, out, 8 + length, size)
    return out, meta


def _check_tiled(path: Path, tensors: dict[str, Stored], start: int, size: int) -> None:
    """The tensors' byte ranges must cover the data from ``start`` to the end of the file, end
    to end, as the safetensors library requires ("invalid offset", "incomplete metadata"): two
    tensors in one range read each other's values, and a gap or a tail is damage."""
    at = start
    for stored in sorted(tensors.values(), key=lambda s: (s.offset, s.entry.nbytes)):
        if stored.offset != at:
            what = "overlaps another tensor's" if stored.offset < at else "leaves a gap before it"
            raise CorruptCheckpointError(path, f"{stored.entry.name}: its byte range {what}")
        at += stored.entry.nbytes
    if at != size:
        raise CorruptCheckpointError(
            path, f"{size - at:,} bytes after its last tensor: the file is not a whole safetensors"
        )


def read_directory(directory: Path) -> dict[str, Stored]:
    """Every tensor of an HF directory's safetensors (the index's shards, or the single file)."""
    index = directory / INDEX
    files = jsonfile.shard_names(index) if index.exists() else [SINGLE]
    out: dict[str, Stored] = {}
    for fname in files:
        tensors, _ = read_header(directory / fname)
        out.update(tensors)
    return out


SLAB_BYTES = 16 << 20  # read-back granularity: the check holds one slab, not one tensor


def _digest_back(fd: int, path: Path, offset: int, size: int) -> bytes:
    """The hash of ``size`` bytes of ``path`` (open as ``fd``) from ``offset``, read back in
    slabs (``pread``: a memory map, as ``safe_open`` uses, would keep every page read resident
    in this process)."""
    h = xxhash.xxh3_128()
    while size:
        block = os.pread(fd, min(size, SLAB_BYTES), offset)
        if not block:
            raise VerificationError(path, "the file is truncated")
        h.update(block)
        size, offset = size - len(block), offset + len(block)
    return h.digest()


def verify(directory: Path, written: Written) -> None:
    """Check every file ``written`` records: its header must be the bytes written (so each
    tensor lies where the plan put it), ``safetensors.safe_open`` must list the tensors the
    plan put in it, each with its dtype and shape (in the order of their data where the reader
    can say it: ``offset_keys``, safetensors 0.5), and each tensor's bytes, read back a slab at
    a time, must hash as they did while being written. The plan is compared by the record the
    write kept of it, not by the plan's entries, which are let go of first: at 150k tensors
    they were 36 MiB beside what ``safe_open`` takes to parse the header (118 MiB, 141 for a
    moment; issue 33), and what the write left in reference cycles (and Python's free lists)
    is collected first: the read-back then began at 104 MiB, not 133. The header is compared,
    not parsed: parsed, 150k entries took 200 MB."""
    safetensors = require("safetensors", "hf")
    gc.collect()
    unreadable = getattr(safetensors, "SafetensorError", ())  # (the real library's refusal)

    for fname in written.files:
        if fname not in written.hashes:  # (the index)
            continue
        path = directory / fname
        start = _header_checked(path, written.headers.get(fname))
        try:
            with safetensors.safe_open(str(path), framework="numpy") as f:
                _check_listing(path, f, written.listings[fname])
        except unreadable as exc:
            raise VerificationError(path, f"safetensors cannot read it back ({exc})") from None
        hashes, offset = memoryview(written.hashes[fname]), start
        with open(path, "rb", buffering=0) as fh:  # (once: 150k tensors were 150k opens)
            for i, size in enumerate(written.sizes[fname]):
                if _digest_back(fh.fileno(), path, offset, size) != hashes[16 * i : 16 * i + 16]:
                    raise VerificationError(path, f"{_nth(path, i)}: the bytes read back differ")
                offset += size


def _nth(path: Path, i: int) -> str:
    """The name of the ``i``-th tensor of ``path`` in data order, for an error: the write's
    record keeps no names."""
    stored = sorted(read_header(path)[0].items(), key=lambda item: item[1].offset)
    return stored[i][0]


def _check_listing(path: Path, f: Any, planned: bytearray) -> None:
    """``f`` (``safe_open`` of ``path``) lists the tensors whose ``_listed`` hashes are
    ``planned``: in the order of their data where the reader can say it (``offset_keys``),
    else as a set (``keys`` is sorted)."""
    in_order = getattr(f, "offset_keys", None)
    names = in_order() if in_order is not None else f.keys()
    count = len(planned) // 8
    if len(names) != count:
        raise VerificationError(path, f"lists {len(names)} tensors, {count} were planned")
    listed = bytearray()
    for name in names:
        piece = f.get_slice(name)
        listed += _listed(name, piece.get_dtype(), piece.get_shape())
    if in_order is None and sorted(_words(listed)) != sorted(_words(planned)):
        raise VerificationError(path, "lists tensors, dtypes or shapes other than planned")
    if in_order is not None and listed != planned:
        i = next(i for i in range(count) if listed[8 * i : 8 * i + 8] != planned[8 * i : 8 * i + 8])
        raise VerificationError(
            path, f"lists {names[i]} as tensor {i + 1}, not as planned (name, dtype, shape)"
        )


def _words(digests: bytearray) -> array:
    return array("Q", bytes(digests))


def _header_checked(path: Path, digest: bytes | None) -> int:
    """Where the data of ``path`` begins, once its header, read in slabs, hashes as the one
    written (the length prefix included)."""
    h = xxhash.xxh3_128()
    try:
        with open(path, "rb") as fh:
            prefix = fh.read(8)
            h.update(prefix)
            length = left = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else 0
            while left > 0:
                block = fh.read(min(left, SLAB_BYTES))
                if not block:
                    break
                h.update(block)
                left -= len(block)
    except OSError as exc:
        raise VerificationError(path, f"cannot be read back ({exc.strerror or exc})") from None
    if len(prefix) != 8 or left or h.digest() != digest:
        raise VerificationError(path, "its header differs from the one written")
    return 8 + length
