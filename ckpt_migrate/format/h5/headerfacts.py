"""A legacy checkpoint's datasets described from their object headers' bytes alone (issue 33).

A legacy file (formats 0.1-0.4, releases up to 2.4) keeps every leaf in a dataset: a tensor's
dtype and shape, a scalar's value, a string's text in its attributes. Its reader learns them
from the facts of the preflight walk (``preflight.Findings``), which opens every dataset
through HDF5 in forked children: 17 s for 188k datasets on two cores. A reader that reads no
tensor data (``inspect``, ``plan``) needs only those facts, and they are bytes of each
dataset's object header. This reads them so, in pure Python (``headers``: no HDF5 code runs on
a dataset, every read bounded by the file's size), and gives them in the walk's own shape, so
that the reader cannot tell them apart:

* the dataspace (§IV.A.2.b of the HDF5 File Format Specification 3.0): the shape, ``()`` or
  none; the datatype (§IV.A.2.d): one of the standard numbers or h5py's bool, byte for byte
  as HDF5 encodes them (``boundary``'s standard numbers; a dataset of any other type is not
  answered);
* the attributes (§IV.A.2.m, compact): scalar numbers, booleans and variable-length strings
  (the global heap, §III.E), and a full tensor's ``shape``, as the walk's ``read_attributes``
  collects them;
* the layout (§IV.A.2.i, version 3 or 4): a compact or contiguous dataset's stored bytes and a
  scalar's value, a chunked one's (version 3) stored bytes summed over its version-1 B-tree
  of chunks (§III.A.1), as ``H5Dget_chunk_info`` lists them;
* what the boundary refuses (external storage, a virtual layout, a filter outside
  ``ALLOWED_FILTERS``), a budget the walk enforces (``budgets.dataset_problem``, data past the
  end of the file), and anything not understood (a shared message, another version, a group
  behind a link, an attribute value it cannot decode, a header that contradicts itself) make
  ``HeaderReader.dataset`` raise ``Undecided``, and the scan (``headerscan``) answers None:
  the file is then read in full, which names any problem.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import h5py
import numpy as np

from ckpt_migrate.format import budgets
from ckpt_migrate.format.h5.attrtable import (
    STRING_REF,
    HeapFile,
    attribute_heap,
    is_vlen_string,
    message_fields,
)
from ckpt_migrate.format.h5.boundary import ALLOWED_FILTERS, ALLOWED_TYPE_CLASSES
from ckpt_migrate.format.h5.facts import Shared
from ckpt_migrate.format.h5.fractalheap import UNDEF
from ckpt_migrate.format.h5.headers import (
    LAST_KNOWN,
    SHARED,
    KeepUnknown,
    Read,
    file_reader,
    read_header,
)
from ckpt_migrate.format.h5.storagescan import Undecided, filter_ids
from ckpt_migrate.format.h5.storedheader import chunk_keys, dataspace_shape, number_type
from ckpt_migrate.format.h5.walkreads import BF16, SHAPE, is_shape

_DATASPACE, _DATATYPE, _EXTERNAL, _LAYOUT, _FILTERS = 0x01, 0x03, 0x07, 0x08, 0x0B
_ATTRIBUTE, _ATTRIBUTE_INFO = 0x0C, 0x15
_GROUP = frozenset((0x02, 0x06, 0x11))  # link info, link, symbol table: a group's messages
_KINDS = KeepUnknown(
    (_DATASPACE, _DATATYPE, _EXTERNAL, _LAYOUT, _FILTERS, _ATTRIBUTE, _ATTRIBUTE_INFO, *_GROUP)
)
_COMPACT, _CONTIGUOUS, _CHUNKED = 0, 1, 2
_VLEN = 9  # the variable-length datatype class
_LIMIT = 1 << 10  # continuation blocks of one dataset's header
_WINDOW = 64 << 10
_KEPT = 4096  # distinct messages remembered


class HeaderReader:
    """The datasets' headers and chunk indexes of one file, every byte read counted: they do
    not overlap, so a file that makes this read more than twice its size (blocks named by
    many headers, say) is not one a writer made, and is not answered."""

    def __init__(self, fd: int, size: int, base: int) -> None:
        self._read: Read = file_reader(fd, size, base, window=_WINDOW)
        self.spent = 0
        self.heap = HeapFile(fd, base, size - base)  # (variable-length strings)
        self.file_bytes, self.base = size, base
        self.described: dict[tuple[int, bytes], Any] = {}  # (``_described``)
        self.attributes: dict[bytes, tuple[str, Any]] = {}  # (``_attribute``)
        self.shared = Shared()

    def read(self, at: int, n: int) -> bytes:
        self.spent += n
        if self.spent > 2 * self.file_bytes + (1 << 20):
            raise Undecided("the headers are larger than the file")
        return self._read(at, n)

    def dataset(self, address: int) -> tuple[tuple, int]:
        """(its facts, the bytes it stores) of the dataset whose header is at ``address``."""
        found: dict[int, Any] = {}
        scalars: dict[str, Any] = {}
        header = read_header(self.read, address, set(), _LIMIT, kinds=_KINDS)
        for kind, flags, body in header.messages:
            if flags & SHARED or kind in _GROUP or kind == _EXTERNAL:
                raise Undecided("a shared message, a group, or external storage")
            if kind > LAST_KNOWN:  # (the walk names it: ``boundary.header_problem``)
                raise Undecided("a message of a type HDF5 does not know")
            if kind == _ATTRIBUTE:
                self._attribute(body, scalars)
            elif kind == _ATTRIBUTE_INFO:
                if attribute_heap(body) != UNDEF:
                    raise Undecided("attributes in dense storage")
            elif kind in found:
                raise Undecided(f"message {kind} twice")
            else:
                found[kind] = body if kind == _LAYOUT else self._described(kind, body)
        if not {_DATASPACE, _DATATYPE, _LAYOUT} <= found.keys():
            raise Undecided("not a dataset")
        dtype, shape = found[_DATATYPE], found[_DATASPACE]
        declared = 0 if not shape else math.prod(shape) * dtype.itemsize
        stored, end, value = self._storage(found[_LAYOUT], declared)
        if end > self.file_bytes or budgets.dataset_problem(declared, stored) is not None:
            raise Undecided("a budget the walk enforces")
        number = None
        if shape == () and dtype.kind in "biuf":
            if value is None or len(value) < dtype.itemsize:
                raise Undecided("a scalar with no stored value")
            number = np.frombuffer(value, dtype, 1)[0].item()
        return self.shared.fact(address, dtype.str, shape, scalars, number), stored

    def _described(self, kind: int, body: bytes) -> Any:
        """A datatype message's numpy dtype, a dataspace message's shape, or a filter
        pipeline's body once its filters are allowed: remembered by the message's bytes (every
        tensor of one dtype and shape has the same)."""
        key = (kind, body)
        known = self.described.get(key)
        if known is None:
            if kind == _DATATYPE:
                known = number_type(body, exact=False)
                if known is None:
                    raise Undecided("not a standard number type")
            elif kind == _DATASPACE:
                known = (dataspace_shape(body),)
            elif any(code not in ALLOWED_FILTERS for code in filter_ids(body)):
                raise Undecided("a filter checkpoints do not use")
            else:
                known = body
            if len(self.described) < _KEPT:
                self.described[key] = known
        return known[0] if kind == _DATASPACE else known

    def _storage(self, body: bytes, declared: int) -> tuple[int, int, bytes | None]:
        """(bytes stored, end of the last, the stored bytes of a compact or contiguous dataset
        of at most 16 bytes: a scalar's value) of a data layout message."""
        version, kind = body[0], body[1]
        if version not in (3, 4):
            raise Undecided(f"layout message version {version}")
        if kind == _COMPACT:
            n = struct.unpack_from("<H", body, 2)[0]
            if 4 + n > len(body):
                raise Undecided("compact data runs past its message")
            return n, 0, body[4 : 4 + n]
        if kind == _CONTIGUOUS:
            at, n = struct.unpack_from("<QQ", body, 2)
            if at == UNDEF:
                return 0, 0, None
            return n, self.base + at + n, self.read(at, n) if n <= 16 else None
        if kind == _CHUNKED and version == 3:
            rank = body[2]
            at = struct.unpack_from("<Q", body, 3)[0]
            if budgets.dataset_problem(declared, self.file_bytes) is not None:
                raise Undecided("declares more than the file could expand to")
            return (*self._chunks(at, rank), None) if at != UNDEF else (0, 0, None)
        raise Undecided(f"layout class {kind} of version {version}")

    def _chunks(self, root: int, rank: int) -> tuple[int, int]:
        """(bytes stored, end of the last) of the chunks a version-1 B-tree indexes: each
        leaf entry's key holds its chunk's stored size (§III.A.1, node type 1)."""
        total = end = 0
        for body, pos, child in chunk_keys(self.read, root, rank):
            n = struct.unpack_from("<I", body, pos)[0]
            total += n
            end = max(end, self.base + child + n)
        return total, end

    def _attribute(self, body: bytes, scalars: dict[str, Any]) -> None:
        """Collect a scalar number, boolean or variable-length string as the walk does
        (``walkreads.read_attributes``): other shapes are stepped over, other types of a
        scalar not answered. What the message's name, type and shape say is remembered by
        their bytes (every tensor's ``__H5_TYPE__`` has the same, its text elsewhere)."""
        data_at = message_fields(body)[6]
        key = body[:data_at]
        known = self.attributes.get(key)
        if known is None:
            known = _attribute_kind(key)
            if len(self.attributes) < _KEPT:
                self.attributes[key] = known
        name, reads = known
        if reads is None:
            return  # an array or no value: not collected
        if isinstance(reads, tuple):  # a full tensor's shape: (its integer type, length)
            number, n = reads
            raw = body[data_at : data_at + n * number.itemsize]
            scalars[name] = np.frombuffer(raw, number, n).tolist()
            return
        if name in scalars:
            raise Undecided(f"attribute {name!r} twice")
        if reads is _TEXT:
            length, collection, index = STRING_REF.unpack_from(body, data_at)
            if collection in (0, UNDEF):
                raise Undecided("a null string")
            text = self.heap.heap_text(collection, index, length)
            if text is None:
                raise Undecided("string longer than its heap object")
            scalars[name] = text
        else:
            raw = body[data_at : data_at + reads.itemsize]
            scalars[name] = np.frombuffer(raw, reads, 1)[0].item()


_TEXT = np.dtype(object)  # (``_attribute_kind``: a variable-length string)


def _attribute_kind(head: bytes) -> tuple[str, Any]:
    """(name, what its value is read as) of an attribute message up to its data: ``_TEXT``,
    a number's dtype, (an integer dtype, a length) for a full tensor's ``shape``, or None for a
    value not collected (another array, or none)."""
    version, flags = head[0], head[1]
    if version not in (1, 2, 3) or (version != 1 and flags & 0x03):
        raise Undecided("attribute message version or shared parts")
    name_at, name_n, type_at, type_n, space_at, space_n, _ = message_fields(head)
    if name_n < 1 or space_at + space_n > len(head) or head[name_at + name_n - 1] != 0:
        raise Undecided("attribute message fields")
    name = head[name_at : name_at + name_n - 1].decode("utf-8", "surrogateescape")
    dtype = head[type_at : type_at + type_n]
    kind = dtype[0] & 0x0F if dtype else -1
    if len(dtype) < 8 or kind not in ALLOWED_TYPE_CLASSES | {_VLEN}:
        raise Undecided("attribute type class")
    shape = dataspace_shape(head[space_at : space_at + space_n])
    if shape != ():
        number = number_type(dtype, exact=True)
        if name == SHAPE.decode() and shape is not None and is_shape(number, shape):
            assert number is not None
            return name, (number, shape[0])
        if name == BF16.decode():
            raise Undecided("an is_bfloat16 flag that is not a scalar")  # (the walk reads it)
        return name, None
    if is_vlen_string(dtype):
        return name, _TEXT
    if kind == _VLEN:
        raise Undecided("a variable-length sequence")
    number = number_type(dtype, exact=True)
    if number is None and kind == h5py.h5t.ENUM:
        raise Undecided("an enum other than bool")
    return name, number  # (a fixed-length string or opaque bytes: not collected)
