"""2.9 → 2.10: no container change (format 0.5); only the release advances.

Container. 2.10 writes the same 0.5 layout as 2.9 (``__cstorch_version__`` becomes
``"2.10.0"``, set by the writer from the target release). 2.10 is the release the format
reference was read from (``CS:cerebras/pytorch/storage/save.py``,
``AP:cerebras/appliance/storage/h5_storage.py``) and checked against with the real library.

Sources: FORMAT.md §0, §1.1 (0.5 written by 2.10.0 [R]), §4.

Content changes handled elsewhere (MODELZOO_HISTORY.md §0, §3.2): model keys and config: none;
Model Zoo HEAD (``f1fd1e0``, 2.10.0) has no ``cs-2.10`` converter format at all.
Steps for release-specific content are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

from ckpt_migrate.hops.trainer_metadata import record_release_in_metadata

SOURCE = "2.9"
TARGET = "2.10"
CHANGES = ()

# Model-key and config steps go here.
OPERATIONS = (record_release_in_metadata,)
INPUTS = ()


# Downgrade: the older release's writer undoes the container; the hop's only tree step is the
# ``__metadata__`` stamp, which records the older release (Model Zoo's converters stamp their
# target in either direction: ``base_converter.py`` lines 745-753, ``update_ckpt_metadata``).
DOWN_OPERATIONS = (record_release_in_metadata,)
DOWN_CONFIG_OPERATIONS = ()  # no config step to undo
