"""2.8 → 2.9: no container change (format 0.5); only the release advances.

Container. 2.9 writes the same 0.5 layout as 2.8 (``__cstorch_version__`` becomes ``"2.9.0"``,
set by the writer from the target release); the storage code of 2.6 and 2.10 is identical except
for cosmetic changes.

Sources: FORMAT.md §0 (CS26/AP26 vs CS/AP 2.10), §1.1, §4; MODELZOO_HISTORY.md §0 (``c569f87``
= 2.9.0).

Content changes handled elsewhere (MODELZOO_HISTORY.md §0, §3.9): model keys and config: none
(``CS28_CS29`` fallback class added in ``c569f87``, not registered).
Steps for release-specific content are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

from ckpt_migrate.hops.trainer_metadata import record_release_in_metadata

SOURCE = "2.8"
TARGET = "2.9"
CHANGES = ()

# Model-key and config steps go here.
OPERATIONS = (record_release_in_metadata,)
INPUTS = ()


# Downgrade: the older release's writer undoes the container; the hop's only tree step is the
# ``__metadata__`` stamp, which records the older release (Model Zoo's converters stamp their
# target in either direction: ``base_converter.py`` lines 745-753, ``update_ckpt_metadata``).
DOWN_OPERATIONS = (record_release_in_metadata,)
DOWN_CONFIG_OPERATIONS = ()  # no config step to undo
