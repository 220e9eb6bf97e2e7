"""The preflight child of a reader that opens no object behind a link (issue 33).

``preflight(path, scope=...)`` forks one child that runs :func:`walk`: it tries, through HDF5,
exactly what such a reader reads through HDF5, so that a crash or an endless loop in HDF5's C
code (``preflight``'s docstring) ends the child, not the command:

* ``"root"`` (``check``): the root attributes named in :data:`ROOT_NAMES`, those present,
  whether ``__spec__`` is, and the ``version`` leaves of a Trainer's ``__metadata__`` list
  (``trainer_release.last_entry``: root attributes in format 0.5, datasets' in 0.4);
* ``"outline"`` (``inspect``, ``plan``, a dry run of a chain that edits only the root): the
  root attributes named in :data:`OUTLINE_NAMES`, those present (and a legacy root's
  ``__spec__``, which a legacy file's reader reads through HDF5), the root's object info,
  creation properties and link count (``attrtable.root_texts`` and ``linktable.of_root`` ask
  for them), without opening an object or iterating the links. The leaves' ``__metadata__``
  strings and the root's links are read by ``attrtable`` and ``linktable`` alone, pure-Python
  one-pass readers whose reads are bounded by the file's size; a root they cannot read, a
  link that is not a hard link, or a leaf with no text makes the outline read give way to
  the full one (``facts.OutlineTooShort``), which reads them through HDF5 after the full
  walk. As its second part, the child of a format 0.5 root reads the root's links itself and
  hands them to the parent (``preflight.Rest.links``), which reads the root's attributes on
  the other core meanwhile; links it does not hand over the parent reads itself;
* ``"spec"`` (``plan`` of a chain that edits only a format 0.5 root): the ``root`` scope's,
  the root's object info and the ``__spec__`` text; as its second part, the root's links,
  handed to the parent as the outline's are (a link that is not a hard link is then named by
  the full read);
* ``"storage"`` (an upgrade of a chain that edits only the root): the outline's, then, as
  the rest of the second part, every dataset's header scanned for what a copy would carry
  out of the file (``storagescan``: the file's bytes, no HDF5 code run on them), on the second
  core while the parent reads the root; it reports only a clean scan, and the parent scans
  again itself to name anything else (``H5Handle.storage_scanned``).

A dataset never opened cannot make HDF5 crash; one that a reader of the outline later needs
after all (a tensor's data, an array's stored dtype) is read only after the full walk
(``format.read``'s ``_WalkFirst``). Progress is ticked every 1,000 attributes.
"""

from __future__ import annotations

import marshal
import os
from pathlib import Path

import h5py

from ckpt_migrate.errors import CkptError
from ckpt_migrate.format import trainer_release
from ckpt_migrate.format.h5 import linktable, storagescan
from ckpt_migrate.format.h5.io import forbid_plugin_loading
from ckpt_migrate.format.h5.metadata_cache import bounded_metadata_cache
from ckpt_migrate.format.h5.root import root_header, superblock_offset
from ckpt_migrate.format.h5.walkreads import END, FIRST, LINKS, SECOND, TICK, read_attributes
from ckpt_migrate.format.provenance import PROVENANCE_ATTR

# What a reader of the release alone reads of the root (``format.read.read_release``): these
# values, and whether ``__spec__`` is there (its value, 27 MB at 150k leaves, is not read).
ROOT_NAMES = ("__version__", "__cstorch_version__", "__SUCCESS__")
# And what the outline read reads of the root through HDF5 (``format.read.read_outline``;
# ``__spec__`` and the leaves' texts are read by ``attrtable``).
OUTLINE_NAMES = (*ROOT_NAMES, PROVENANCE_ATTR)
# And what a plan of hops that edit only the root reads (``format.read.read_root_outline``).
SPEC_NAMES = (*ROOT_NAMES, "__spec__")
_NAMES = {
    "root": ROOT_NAMES,
    "spec": SPEC_NAMES,
    "outline": OUTLINE_NAMES,
    "storage": OUTLINE_NAMES,
}


def walk(path: Path, tick: int, scope: str, links_fd: int | None = None) -> None:
    """Try the root's attributes (``OUTLINE_NAMES`` for the ``outline`` and ``storage``
    scopes, else ``ROOT_NAMES``) and, for the outline, what ``attrtable`` and ``linktable`` ask
    HDF5 (the root's object info, creation properties and link count); then say the walk's
    first part is done (nothing stored measured: ``Findings.stored`` is 0 and means nothing
    for these scopes). The second part: for the outline of a format 0.5 root, its links read
    and handed to the parent through ``links_fd`` (``_hand_over_links``), then the ``storage``
    scope's scan (``_scan``)."""
    forbid_plugin_loading()
    outline = scope in ("outline", "storage")
    with bounded_metadata_cache(h5py.File(path, "r", locking=False, rdcc_nbytes=0)) as f:
        if outline or scope == "spec":
            root_header(f)
            f.id.get_num_objs()
        spec = h5py.h5a.exists(f.id, b"__spec__")
        wanted = _NAMES[scope]
        legacy = outline and spec and not h5py.h5a.exists(f.id, b"__SUCCESS__")
        if legacy:
            wanted = (*wanted, "__spec__")  # a legacy root's structure, which its reader reads
        names = [n.encode() for n in wanted if h5py.h5a.exists(f.id, n.encode())]
        read_attributes(f.id, tick, names=names)
        if not outline:  # (and the version leaves of a Trainer's list, in either container)
            for fmt in (0.4, 0.5):
                trainer_release.last_entry(f, fmt)
        os.write(tick, b"%s0,0%s" % (FIRST, END))
        addresses = None
        if (outline and not legacy) or scope == "spec":  # (a legacy outline's: ``headerscan``)
            addresses = _hand_over_links(f, path, tick, links_fd)
        if scope == "storage" and not _scan(f, path, tick, addresses):
            raise RuntimeError("the datasets' storage is for the parent to judge")
    os.write(tick, b"%s0%s" % (SECOND, END))


def _hand_over_links(f: h5py.File, path: Path, tick: int, fd: int | None) -> dict[str, int] | None:
    """The root's links (``linktable``), written to ``fd`` (``marshal``) and said (``LINKS``):
    the parent reads the root's attributes meanwhile, then takes them (``preflight.Rest.links``)
    instead of reading them itself (0.25 s at 150k links, issue 33)."""
    addresses = linktable.of_root(f, path)
    if addresses is not None and fd is not None:
        with os.fdopen(os.dup(fd), "wb") as fh:
            fh.write(marshal.dumps(addresses))
    count = -1 if addresses is None or fd is None else len(addresses)
    os.write(tick, b"%s%d%s" % (LINKS, count, END))
    return addresses


def _scan(f: h5py.File, path: Path, tick: int, addresses: dict[str, int] | None) -> bool:
    """Whether no dataset behind the root's links (``addresses``) points outside the file
    (``storagescan``, in pure Python on the second core while the parent reads the root: 2-3 s
    at 150k datasets, issue 33). False for anything else: a link this cannot read, a header it
    does not understand, a dataset it refuses; the parent then scans again itself, naming it."""
    if addresses is None:
        return False
    try:
        return storagescan.scan(path, addresses, superblock_offset(f), lambda: os.write(tick, TICK))
    except CkptError:
        return False
