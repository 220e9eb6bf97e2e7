"""A group's links in one pass over the file's bytes (issue 33): each link's name and the
address of the object it names, no HDF5 code run and no object opened.

HDF5's own iteration (``H5Literate``) calls back into Python once per link and, for dense
storage, first builds and sorts a table of every link: about 1 s at 150k links before the
first callback, and only safe once a forked child has survived the same calls (``preflight``).
This reads what checkpoint writers write (HDF5 File Format Specification 3.0): the old-style
group of h5py's defaults, a symbol table (§IV.A.2.r: a version-1 B-tree of group nodes,
§III.A.1, whose leaves are symbol table nodes, §III.B, naming links in a local heap, §III.D),
and the new-style group, link messages (§IV.A.2.g) in the header (compact) or as the objects
of a fractal heap (dense: the link info message, §IV.A.2.c; ``fractalheap``).

Only hard links are answered: a soft, external or user-defined link, like anything this
reader does not know (other offset sizes, a shared message, a structure that contradicts
itself, a loop), makes ``links`` return None, and the caller reads the file in full,
which names any problem. Every read lies inside the file, every node and block is read once,
and no more of them than the file's size can hold.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
from collections.abc import Iterable
from pathlib import Path

import h5py

from ckpt_migrate.format.h5 import fractalheap
from ckpt_migrate.format.h5.fractalheap import UNDEF, Unknown
from ckpt_migrate.format.h5.headers import SHARED, HeaderError, Read, file_reader, read_header
from ckpt_migrate.format.h5.root import root_header

_LINK_INFO, _LINK, _SYMBOL_TABLE = 0x02, 0x06, 0x11
_HARD = 0
_ENTRY = 40  # a symbol table entry: name offset, header address, cache type, scratch pad
_SOFT_CACHE = 2  # an entry's cache type for a soft link
_WINDOW = 64 << 10
_MAX_DEPTH = 64


class _Links:
    def __init__(self, read: Read, size: int, nodes: list[int] | None = None) -> None:
        self.read = read
        self.visited: set[int] = set()
        self.limit = size // 8 + 16  # no more structures than the file can hold
        self.found: dict[str, int] = {}
        self.nodes = nodes  # (``prefetch``: the symbol table nodes' addresses, left unread)

    def visit(self, address: int) -> None:
        if address in self.visited or len(self.visited) >= self.limit:
            raise Unknown("group structures loop or are too many")
        self.visited.add(address)

    def add(self, name: bytes, address: int) -> None:
        key = name.decode("utf-8", "surrogateescape")
        if key in self.found:
            raise Unknown(f"link {key!r} twice")
        self.found[key] = address


def of_root(f: h5py.File, path: Path) -> dict[str, int] | None:
    """``links`` of the root group of ``f`` (open on ``path``), when their count is HDF5's
    (``H5Gget_info``, which reads the group's index, not its links); else None."""
    at = root_header(f)
    if at is None:
        return None
    try:
        found = links(path, *at)
    except OSError:  # (the full read names it)
        return None
    if found is None or len(found) != f.id.get_num_objs():
        return None
    return found


def same_as(output: h5py.File, out_path: Path, source: h5py.File, src_path: Path) -> bool:
    """Whether the root of ``output`` links through the bytes the root of ``source`` links
    through: the root's header at the same place, naming the same fractal heap by the same
    link info message and no other link, and every byte of that heap (its header, indirect
    and direct blocks) the source's. Its links are then the source's, unread (a root edit's
    check, ``engine.rootverify``: 0.2 s at 150k links)."""
    at = root_header(output)
    if at is None or at != root_header(source):
        return False
    try:
        with contextlib.ExitStack() as stack:
            reads = []
            for path in (out_path, src_path):
                fd = os.open(path, os.O_RDONLY)
                stack.callback(os.close, fd)
                reads.append(file_reader(fd, os.fstat(fd).st_size, at[1]))
            infos = [_only_link_info(read, at[0]) for read in reads]
            if infos[0] is None or infos[0] != infos[1]:
                return False
            heap = _heap_of(infos[0])
            if heap == UNDEF:
                return False
            return all(
                reads[0](place, n) == reads[1](place, n)
                for place, n in fractalheap.extent(reads[0], heap)
            )
    except (OSError, Unknown, HeaderError, struct.error):
        return False


def _only_link_info(read: Read, address: int) -> bytes | None:
    """The link info message of the group header at ``address``, if it has no other link
    message (none in the header, no symbol table)."""
    header = read_header(read, address, set(), 1 << 10)
    found = [m for m in header.messages if m.kind in (_LINK_INFO, _LINK, _SYMBOL_TABLE)]
    if len(found) != 1 or found[0].kind != _LINK_INFO or found[0].flags & SHARED:
        return None
    return found[0].body


def aliased(addresses: Iterable[int]) -> frozenset[int]:
    """The addresses that occur more than once in ``addresses`` (a link table's: the objects
    more than one name links, hard links; usually none)."""
    ordered = sorted(addresses)
    return frozenset(a for a, b in itertools.pairwise(ordered) if a == b)


def links(path: Path, address: int, base: int = 0) -> dict[str, int] | None:
    """Every link of the group whose object header is at ``address`` in ``path`` (relative to
    the superblock's ``base``; 8-byte offsets and lengths): name -> the address of the object
    it names. None when a link is not a hard link or the structure is not one this knows."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        links = _Links(file_reader(fd, size, base, window=_WINDOW), size)
        try:
            _group(links, address)
        except (Unknown, HeaderError, struct.error):
            return None
        return links.found
    finally:
        os.close(fd)


def prefetch_root(f: h5py.File, path: Path) -> None:
    """``prefetch`` of the root group of ``f`` in ``path``: ``f``'s own file, or a copy of it
    (the same bytes where the root's nodes lie, with pages of its own)."""
    at = root_header(f)
    if at is not None:
        prefetch(path, *at)


def prefetch(path: Path, address: int, base: int = 0) -> None:
    """Ask the kernel to read the symbol table nodes of the old-style group whose header is at
    ``address`` now, all at once: HDF5's walk of its links then finds them in the page cache
    instead of reading each in turn (a cold 1.9 root of 7,647 links keeps them in 1,620 nodes
    across 12 GB; issue 33). Only the B-tree's own nodes are read here. A hint: a group of
    another kind, or anything this reader does not know, is left alone."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            nodes: list[int] = []
            links = _Links(file_reader(fd, size, base), size, nodes)
            header = read_header(links.read, address, links.visited, links.limit)
            table = [m.body for m in header.messages if m.kind == _SYMBOL_TABLE]
            if len(table) != 1 or len(table[0]) < 16:
                return
            _btree(links, struct.unpack_from("<Q", table[0])[0], b"", 0)
            for node in sorted(nodes):
                os.posix_fadvise(fd, base + node, _PAGE, os.POSIX_FADV_WILLNEED)
        except (Unknown, HeaderError, struct.error):
            return
        finally:
            os.close(fd)


_PAGE = 4096  # (a node is 8 + 80 K bytes; K, the superblock's, is 4 by default)


def _group(links: _Links, address: int) -> None:
    header = read_header(links.read, address, links.visited, links.limit)
    for m in header.messages:
        if m.kind not in (_LINK_INFO, _LINK, _SYMBOL_TABLE):
            continue
        if m.flags & SHARED:
            raise Unknown("a shared link message")
        if m.kind == _LINK:
            _take_link(links, m.body)
        elif m.kind == _LINK_INFO:
            _dense(links, m.body)
        else:
            _symbol_table(links, m.body)


def _dense(links: _Links, info: bytes) -> None:
    """The link messages of the fractal heap a link info message names (none: compact)."""
    heap = _heap_of(info)
    if heap != UNDEF:
        fractalheap.walk(links.read, links.visited, heap, lambda b, at: _link_at(links, b, at))


def _heap_of(info: bytes) -> int:
    """The fractal heap a link info message names (``UNDEF``: none, the links are compact)."""
    if len(info) < 18 or info[0] != 0:
        raise Unknown("link info message")
    return struct.unpack_from("<Q", info, 2 + (8 if info[1] & 0x01 else 0))[0]


def _link_fields(body: bytes, pos: int = 0) -> tuple[int, int, int]:
    """(link type, where the name starts, its length) of the link message at ``pos``."""
    if pos + 3 > len(body):  # (the shortest: version, flags, a one-byte name length)
        raise Unknown("a link message shorter than its fields")
    version, flags = body[pos], body[pos + 1]
    if version != 1:
        raise Unknown(f"link message version {version}")
    at = pos + 2
    kind = _HARD
    if flags & 0x08:
        kind, at = body[at], at + 1
    at += (8 if flags & 0x04 else 0) + (1 if flags & 0x10 else 0)
    width = 1 << (flags & 0x03)
    length = int.from_bytes(body[at : at + width], "little")
    return kind, at + width, length


def _link_size(block: bytes, pos: int) -> int | None:
    """The length of the link message at ``pos`` of a heap block; None where none starts."""
    if pos + 2 > len(block) or block[pos] != 1:
        return None
    kind, at, length = _link_fields(block, pos)
    at += length
    if kind == _HARD:
        return at + 8 - pos
    return at + 2 + int.from_bytes(block[at : at + 2], "little") - pos


def _link_at(links: _Links, block: bytes, pos: int) -> int | None:
    """Take the link message at ``pos`` of a heap block (``fractalheap.TakeAt``)."""
    n = _link_size(block, pos)
    if n is None or pos + n > len(block):
        return None
    _take_link(links, block[pos : pos + n])
    return n


def _take_link(links: _Links, body: bytes) -> None:
    kind, at, length = _link_fields(body)
    if kind != _HARD:
        raise Unknown("a soft, external or user-defined link")
    if at + length + 8 > len(body) or length == 0:
        raise Unknown("a link message runs past its end")
    links.add(body[at : at + length], struct.unpack_from("<Q", body, at + length)[0])


def _symbol_table(links: _Links, body: bytes) -> None:
    """The links of an old-style group: its B-tree's symbol table nodes, names in its heap."""
    if len(body) < 16:
        raise Unknown("symbol table message")
    tree, heap = struct.unpack_from("<QQ", body)
    head = links.read(heap, 32)
    if head[:4] != b"HEAP" or head[4] != 0:
        raise Unknown(f"no local heap at {heap}")
    size, _free, data = struct.unpack_from("<QQQ", head, 8)
    names = links.read(data, size)
    _btree(links, tree, names, 0)


def _btree(links: _Links, at: int, names: bytes, depth: int) -> None:
    """A version-1 B-tree node of a group (type 0) and its subtree (§III.A.1)."""
    links.visit(at)
    head = links.read(at, 24)
    if head[:4] != b"TREE" or head[4] != 0 or depth > _MAX_DEPTH:
        raise Unknown(f"no group B-tree node at {at}")
    level, used = head[5], struct.unpack_from("<H", head, 6)[0]
    body = links.read(at + 24, used * 16 + 8)  # key, child, key, child, ..., key
    for i in range(used):
        child = struct.unpack_from("<Q", body, 8 + 16 * i)[0]
        if level > 0:
            _btree(links, child, names, depth + 1)
        elif links.nodes is not None:  # (each node once: as many as the file can hold)
            links.visit(child)
            links.nodes.append(child)
        else:
            _symbol_node(links, child, names)


def _symbol_node(links: _Links, at: int, names: bytes) -> None:
    links.visit(at)
    head = links.read(at, 8)
    if head[:5] != b"SNOD\x01":
        raise Unknown(f"no symbol table node at {at}")
    count = struct.unpack_from("<H", head, 6)[0]
    entries = links.read(at + 8, count * _ENTRY)
    for i in range(count):
        offset, address, cache = struct.unpack_from("<QQI", entries, i * _ENTRY)
        if cache == _SOFT_CACHE:
            raise Unknown("a soft link")
        end = names.find(b"\0", offset)
        if end <= offset:
            raise Unknown("a link name outside the group's heap")
        links.add(names[offset:end], address)
