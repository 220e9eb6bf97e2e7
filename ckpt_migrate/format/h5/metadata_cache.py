"""HDF5's metadata cache, per open file, kept small: an upgrade, a reader or a writer visits
each object header once, so that HDF5's default (up to 32 MiB of headers, several times that
decoded) only makes memory grow with the tensor count (issue 33). Room is left for the heaps of
link names that every look-up by name reads whole."""

from __future__ import annotations

import h5py

METADATA_CACHE_MAX = 1 << 20
SYMBOL_TABLE_MESSAGE = 0x11  # (an old-style group's: the B-tree and local heap of its names)
MAX_NAME_HEAP = 256 << 20  # (a heap HDF5 would read whole anyway; the cap only lets it stay)
HDF5_MAX_CACHE = 128 << 20  # (H5C__MAX_MAX_CACHE_SIZE: a larger max_size is refused)


def bounded_metadata_cache(f: h5py.File, names: int | None = None) -> h5py.File:
    """Cap HDF5's metadata cache (32 MiB by default, per open file): an upgrade visits each
    object header once, so a bigger cache only makes memory grow with the tensor count.

    The cap counts the headers' on-disk bytes, not their decoded form in memory, which is
    several times larger: at 4 MiB the cache held every header of a 3,567-object checkpoint
    and the benchmark upgrade's peak RSS grew from 163 to 190 MiB from 1,552 to 2,832 tensors;
    at 1 MiB it is 142 MiB at both sizes, and no slower (256 KiB made the 6 GB patch slower).

    The cap leaves room, beyond that, for the root's heap of link names (``names`` bytes,
    by default ``root_name_heap(local_only=True)``; a file being written passes 0, its own
    root's heap being the one it fills: the copy-patch, which also looks names up in the old
    root as it fills a new one, gives both room with ``GroupNameRoom``): h5py's default root
    keeps every name in one local heap, which HDF5 reads whole for each look-up by name; a
    cache smaller than the heap evicted and read it again on every look-up, 0.44 ms each at
    62k links against 0.04 ms, so that a 50k-tensor upgrade spent most of its time
    there, quadratic in the tensor count (issue 33). No more room than that: the heap, used at
    every look-up, stays in it, and the headers keep the 1 MiB they had (room for twice the
    heap held 105 MiB more of headers at 62k objects). A new-style root keeps its names in a
    fractal heap, read block by block, never whole: room for it let the cache keep as much
    more of the headers (11 MB of room at 112k tensors: 63 MB more held decoded while an
    export read its tensors, issue 33), for 4-8 % less time where every tensor of such a
    file is looked up by name (each look-up reads its heap block again)."""
    config = f.id.get_mdc_config()
    names = root_name_heap(f, local_only=True) if names is None else names
    # (a damaged or huge heap's size: beyond HDF5's own limit the setting raised, exit 1)
    config.max_size = min(METADATA_CACHE_MAX + names, HDF5_MAX_CACHE)
    config.min_size = min(config.min_size, METADATA_CACHE_MAX)
    config.initial_size = min(config.initial_size, METADATA_CACHE_MAX)
    config.set_initial_size = True
    f.id.set_mdc_config(config)
    return f


class GroupNameRoom:
    """Room in ``f``'s metadata cache (``bounded_metadata_cache``) for the root's heap of link
    names (``root_heap`` bytes, measured elsewhere) and for the one of a group being filled,
    once the two no longer fit in the cache's 1 MiB: each link added dirties the group's heap,
    each look-up by name loads the root's, and a cache too small for both evicted one for the
    other, writing the group's whole and reading both again for the next link. A 50k-tensor
    copy-patch moved 359 GB through the page cache that way (79 GB of it written) and took
    105 s against 30 s (issue 33; benchmarks/README.md, eighth session).

    The group's heap is reckoned from the names added (each stored with its terminating zero,
    8-byte aligned; HDF5 doubles a full heap, so up to twice that), not asked of HDF5: the
    question walks the group's B-tree through the same cache, and the order HDF5 flushes its
    metadata in decides where it writes, so asking changed the bytes of outputs whose heaps
    fitted. Until they no longer fit, the cache (and so the file) stays as it was. The room
    follows the heap as it grows (every ``EVERY`` links), so that the object headers keep the
    1 MiB they have: room for the heap's final size from the start held 130 MiB more of them
    at 50k. A new-style group (``local`` false: its names in a fractal heap, found through a
    B-tree of their hashes, as ``create_wide_root`` makes one) is read block by block and
    needs none."""

    EVERY = 256

    def __init__(self, f: h5py.File, root_heap: int, *, local: bool) -> None:
        self._f, self._root, self._local = f, root_heap, local
        self._names = self._links = 0
        self._groups: set[str] = set()
        self._given = False

    def added(self, name: str) -> None:
        """Count the link ``name`` (a path from the group) adds; every ``EVERY``, fit the room."""
        if not self._local:
            return
        top, slash, _ = name.partition("/")
        if slash:  # a link into a group of the group: the group's own name, once
            if top in self._groups:
                return
            self._groups.add(top)
        self._names += (len(top.encode("utf-8", "surrogateescape")) + 8) // 8 * 8
        self._links += 1
        if self._links % self.EVERY == 0:
            heap = min(2 * self._names, MAX_NAME_HEAP)
            if self._given or self._root + heap > METADATA_CACHE_MAX:
                self._given = True
                bounded_metadata_cache(self._f, self._root + heap)


def root_name_heap(f: h5py.File, *, local_only: bool = False) -> int:
    """The bytes of the heap that holds the root group's link names (``H5Oget_info``'s
    ``meta_size.obj.heap_size``: an old-style group's local heap, a new-style one's fractal
    heap, or 0 for that with ``local_only``: it is read block by block), at most
    ``MAX_NAME_HEAP``."""
    try:
        info = h5py.h5o.get_info(f.id)
    except (OSError, RuntimeError, ValueError):  # (the readers name a damaged root)
        return 0
    if local_only and not info.hdr.mesg.present & 1 << SYMBOL_TABLE_MESSAGE:
        return 0
    return min(info.meta_size.obj.heap_size, MAX_NAME_HEAP)
