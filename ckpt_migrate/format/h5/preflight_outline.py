"""The preflight child of a reader that opens no object behind a link (issue 33).

``preflight(path, scope=...)`` forks one child that runs :func:`walk`: it tries, through HDF5,
exactly what such a reader reads through HDF5, so that a crash or an endless loop in HDF5's C
code (``preflight``'s docstring) ends the child, not the command:

* ``"root"`` (``check``): the root attributes named in :data:`ROOT_NAMES`, those present,
  and whether ``__spec__`` is;
* ``"outline"`` (``inspect``, ``plan``, a dry run of a chain that edits only the root): the
  root attributes named in :data:`OUTLINE_NAMES`, those present, the root's object info,
  creation properties and link count (``attrtable.root_texts`` and ``linktable.of_root`` ask
  for them), without opening an object or iterating the links. The leaves' ``__metadata__``
  strings and the root's links are read by ``attrtable`` and ``linktable`` alone, pure-Python
  one-pass readers whose reads are bounded by the file's size; a root they cannot read, a
  link that is not a hard link, or a leaf with no text makes the outline read give way to
  the full one (``facts.OutlineTooShort``), which reads them through HDF5 after the full
  walk.

A dataset never opened cannot make HDF5 crash; one that a reader of the outline later needs
after all (a tensor's data, an array's stored dtype) is read only after the full walk
(``format.read``'s ``_WalkFirst``). Progress is ticked every 1,000 attributes.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py

from ckpt_migrate.format.h5.io import bounded_metadata_cache, forbid_plugin_loading
from ckpt_migrate.format.h5.root import root_header
from ckpt_migrate.format.h5.walkreads import END, FIRST, SECOND, read_attributes
from ckpt_migrate.format.provenance import PROVENANCE_ATTR

# What a reader of the release alone reads of the root (``format.read.read_release``): these
# values, and whether ``__spec__`` is there (its value, 27 MB at 150k leaves, is not read).
ROOT_NAMES = ("__version__", "__cstorch_version__", "__SUCCESS__")
# And what the outline read reads of the root through HDF5 (``format.read.read_outline``;
# ``__spec__`` and the leaves' texts are read by ``attrtable``).
OUTLINE_NAMES = (*ROOT_NAMES, PROVENANCE_ATTR)


def walk(path: Path, tick: int, outline: bool) -> None:
    """Try the root's attributes (``OUTLINE_NAMES`` for the ``outline`` scope, else
    ``ROOT_NAMES``) and, for the outline, what ``attrtable`` and ``linktable`` ask HDF5 (the
    root's object info, creation properties and link count); then say the walk's
    two parts are done (nothing stored measured: ``Findings.stored`` is 0 and means nothing
    for these scopes)."""
    forbid_plugin_loading()
    with bounded_metadata_cache(h5py.File(path, "r", locking=False, rdcc_nbytes=0)) as f:
        if outline:
            root_header(f)
            f.id.get_num_objs()
        h5py.h5a.exists(f.id, b"__spec__")
        wanted = OUTLINE_NAMES if outline else ROOT_NAMES
        names = [n.encode() for n in wanted if h5py.h5a.exists(f.id, n.encode())]
        read_attributes(f.id, tick, names=names)
    os.write(tick, b"%s0,0%s%s0%s" % (FIRST, END, SECOND, END))
