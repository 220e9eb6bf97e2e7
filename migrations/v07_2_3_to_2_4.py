"""2.3 → 2.4: no container change (format 0.4); only the release advances.

Container. 2.4 is the last release writing the legacy 0.4 layout (``__cstorch_version__``
``"2.4.0"``, set by the writer from the target release): MZ 2.4.3 (``8a80b37``) still imports
``cerebras.pytorch.saver.pt_h5_saver.PyTorchH5Saver``.

Sources: FORMAT.md §1.1 (evidence for 2.5 as the first 0.5 release), §6.2.

Content changes handled elsewhere (MODELZOO_HISTORY.md §0, §3.6):

* config: ``trainer.init.model.name`` becomes required
  (``BaseConfigConverter_CS_CS.post_config_convert``); ``mixed_precision: True`` no longer
  injected by the converters (removed in ``608d5a3``) — see the config steps;
* model keys: none (fallback converter) — see the model-key steps.

Steps for those are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

SOURCE = "2.3"
TARGET = "2.4"
CHANGES = ()

# Model-key and config steps go here.
OPERATIONS = ()
INPUTS = ()
