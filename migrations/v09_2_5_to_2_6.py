"""2.5 → 2.6: no container change (format 0.5); only the release advances.

Container. 2.6 writes the same 0.5 layout as 2.5 (``__cstorch_version__`` becomes ``"2.6.0"``,
set by the writer from the target release). The 2.6.0 ``cerebras-pytorch`` and
``cerebras-appliance`` storage code is identical to 2.10's except for cosmetic changes (checked
with ``diff -r``); whether 2.5 wrote exactly the same is inferred, no 2.5 wheel being available.

Sources: FORMAT.md §0 (CS26/AP26 vs CS/AP 2.10), §1.1 (2.5 as first 0.5 release inferred).

Content changes handled elsewhere (MODELZOO_HISTORY.md §0, §3.9): model keys and config: none.
A ``CS25_CS26`` fallback converter class exists at HEAD (added in 2.9.0 ``c569f87``) but is not
registered in ``fallback_converters``.
Steps for release-specific content are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

from ckpt_migrate.hops.trainer_metadata import record_release_in_metadata

SOURCE = "2.5"
TARGET = "2.6"
CHANGES = ()

# Model-key and config steps go here.
OPERATIONS = (record_release_in_metadata,)
INPUTS = ()


# Downgrade: the older release's writer undoes the container; the hop's only tree step is the
# ``__metadata__`` stamp, which records the older release (Model Zoo's converters stamp their
# target in either direction: ``base_converter.py`` lines 745-753, ``update_ckpt_metadata``).
DOWN_OPERATIONS = (record_release_in_metadata,)
DOWN_CONFIG_OPERATIONS = ()  # no config step to undo
