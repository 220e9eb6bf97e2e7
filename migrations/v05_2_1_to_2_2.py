"""2.1 → 2.2: no container change (format 0.4); only the release advances.

Container. 2.2 writes the same 0.4 layout as 2.1: ``__H5_TYPE__`` tags, hex-dill ``__spec__``
(torch 2.2.1 ``TreeSpec``, the same ``"dataclass"`` pickle style), ``__version__ = 0.4`` and
``__cstorch_version__`` (now ``"2.2.0"``, set by the writer from the target release).

Sources: FORMAT.md §1.1 (2.1.0 … 2.4.x write 0.4 with ``__cstorch_version__``), §6.2 (torch per
release from MZ ``requirements.txt``).

Content changes handled elsewhere (MODELZOO_HISTORY.md §0, §3.6):

* state: sparsity masks move from optimizer state into ``model.<weight>_mask`` (converter base
  class hooks) — see the model-key steps;
* config: ``use_cs_grad_accum`` → ``micro_batch_size``, ``autogen_policy`` dropped, sparsity
  schema rewritten (``_remove_deprecated_runconfig_params_2_2``, ``_convert_sparsity_params_2_2``)
  — see the config steps. Model keys: none (fallback converter).

Steps for those are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

SOURCE = "2.1"
TARGET = "2.2"
CHANGES = ()

# Model-key and config steps go here.
OPERATIONS = ()
INPUTS = ()
