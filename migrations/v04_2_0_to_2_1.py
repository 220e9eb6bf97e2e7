"""2.0 → 2.1: format stays 0.4; root __cstorch_version__ added.

Container. 2.1 keeps format 0.4 and the ``__H5_TYPE__`` tags but also writes the root attribute
``__cstorch_version__`` (vlen string, the appliance version, e.g. ``"2.1.0"``): the legacy saver's
``_CURR_CKPT_VERSION = CkptVersion(0.4, <appliance __version__>)`` writes both attributes through
``CkptVersion.to_file``. With it, readers tell 2.1–2.4 files apart, while a 0.4 file without it is
taken as 2.0. The ``__spec__`` pickle now imitates the newer torch ``TreeSpec`` (a frozen
dataclass whose state adds ``num_nodes``/``num_leaves``/``num_children``; the release table's
``spec_torch = "dataclass"`` for 2.1–2.4, see ``ckpt_migrate.spec_pickle``), which the spec writer
derives from the target release.

Sources: FORMAT.md §1.1 (``CS:cerebras/pytorch/storage/_legacy/pt_h5_saver.py``
``_CURR_CKPT_VERSION``; ``MZ e2a52f1:modelzoo/common/pytorch/run_cstorch_flow.py`` uses
``extract_version(...).ckpt_version``), §1.2, §1.3, §6.2 (TreeSpec state by torch version).

Content changes handled elsewhere (MODELZOO_HISTORY.md §0, §3.5, §3.6):

* model keys: embedding refactor, ``position_embeddings`` → ``.embed`` / ``.fpe``,
  ``relative_pe_helper`` → ``embedding_layer.position_embed_helper``
  (``f1fd1e0:.../gpt2_hf_cs.py`` ``Converter_GPT2LMHeadModel_CS20_CS21``, ``t5.py``, ``bert.py``)
  — see the model-key steps;
* config: optimizer/scheduler argument aliases, ``use_bfloat16`` → ``fp16_type``, POL moved to
  runconfig, obsolete runconfig keys removed — see the config steps.

Steps for those are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

SOURCE = "2.0"
TARGET = "2.1"
CHANGES = (
    'root attribute __cstorch_version__ added (e.g. "2.1.0")',
    "__spec__ pickle imitates the newer torch TreeSpec (frozen dataclass with node counts)",
)

# Container: nothing to edit in the tree. Model-key and config steps go here.
OPERATIONS = ()
INPUTS = ()
