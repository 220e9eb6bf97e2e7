"""The preflight child of a reader that opens no object behind a link (issue 33).

``preflight(path, scope=...)`` forks one child that runs :func:`walk`: it tries, through HDF5,
exactly what such a reader reads through HDF5, so that a crash or an endless loop in HDF5's C
code (``preflight``'s docstring) ends the child, not the command:

* ``"root"`` (``check``): the root attributes named in :data:`ROOT_NAMES`, those present,
  and whether ``__spec__`` is;
* ``"outline"`` (``inspect``, ``plan``, a dry run of a chain that edits only the root): the
  root attributes named in :data:`OUTLINE_NAMES`, those present, the root's object info and
  creation properties (``attrtable.root_texts`` asks for them), and every link of the root
  (its name and whether it leaves the file), without opening an object. The leaves'
  ``__metadata__`` strings are read by ``attrtable`` alone, the pure-Python one-pass reader
  whose reads are bounded by the file's size; a root it cannot read, or a leaf it has no text
  for, makes the outline read give way to the full one (``facts.OutlineTooShort``), which
  reads them through HDF5 after the full walk.

A dataset never opened cannot make HDF5 crash; one that a reader of the outline later needs
after all (a tensor's data, an array's stored dtype) is read only after the full walk
(``format.read``'s ``_WalkFirst``). Progress is ticked every 1,000 attributes or links.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py

from ckpt_migrate.format.h5.boundary import link_problem
from ckpt_migrate.format.h5.io import bounded_metadata_cache, forbid_plugin_loading, link_names
from ckpt_migrate.format.h5.root import superblock_offset
from ckpt_migrate.format.h5.walkreads import END, FIRST, SECOND, TICK, Refused, read_attributes
from ckpt_migrate.format.provenance import PROVENANCE_ATTR

# What a reader of the release alone reads of the root (``format.read.read_release``): these
# values, and whether ``__spec__`` is there (its value, 27 MB at 150k leaves, is not read).
ROOT_NAMES = ("__version__", "__cstorch_version__", "__SUCCESS__")
# And what the outline read reads of the root through HDF5 (``format.read.read_outline``).
OUTLINE_NAMES = (*ROOT_NAMES, "__spec__", PROVENANCE_ATTR)


def walk(path: Path, tick: int, links: bool) -> None:
    """Try the root's attributes (``OUTLINE_NAMES`` with ``links``, else ``ROOT_NAMES``)
    and, with ``links``, what ``attrtable`` asks HDF5 and every link; then say the walk's two
    parts are done (nothing stored measured: ``Findings.stored`` is 0 and means nothing for
    these scopes)."""
    forbid_plugin_loading()
    with bounded_metadata_cache(h5py.File(path, "r", locking=False, rdcc_nbytes=0)) as f:
        if links:
            f.id.get_create_plist().get_sizes()
            superblock_offset(f)
            h5py.h5o.get_info(f.id)
        else:
            h5py.h5a.exists(f.id, b"__spec__")
        wanted = OUTLINE_NAMES if links else ROOT_NAMES
        names = [n.encode() for n in wanted if h5py.h5a.exists(f.id, n.encode())]
        read_attributes(f.id, tick, names=names)
        if links:
            _visit_links(f, path, tick)
    os.write(tick, b"%s0,0%s%s0%s" % (FIRST, END, SECOND, END))


def _visit_links(f: h5py.File, path: Path, tick: int) -> None:
    """Every link of the root (``io.link_names``), no object opened."""
    seen = 0

    def take(name: bytes, info: h5py.h5l.LinkInfo) -> None:
        nonlocal seen
        if link_problem(path, "", info) is not None:
            raise Refused  # a link out of the file: never followed
        seen += 1
        if seen % 1000 == 0:
            os.write(tick, TICK)

    link_names(f, take)
