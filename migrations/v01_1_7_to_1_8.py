"""1.7 → 1.8: format 0.1 → 0.2; root __version__ = 0.2, datasets still untagged.

Container. 1.8 writes root ``__version__ = 0.2`` (float64); a 1.7 file may lack the attribute,
and every reader takes a missing ``__version__`` as 0.1. Neither release writes
``__cstorch_version__``. Both use the untagged per-dataset encoding (``is_none``, ``is_string`` +
``string_val``, ``is_scalar``, ``is_constructible``, ``filepath`` flags) and the hex-dill
``__spec__`` with quoted dataset names at the root. What else differs between 0.1 and 0.2 cannot be
determined from the available sources, so no tree change is made.

Sources: FORMAT.md §1.1 (version map: ``CS:cerebras/pytorch/storage/_legacy/pt_h5_saver.py:
CkptVersion.from_file`` maps 0.1→"1.7", 0.2→"1.8"; a missing ``__version__`` defaults to 0.1,
also in OLD-PTH5), §3.1, §3.4 (flag encoding, from ``PyTorchH5Saver._load_tensor_from_checkpoint``),
§8 (0.1 vs 0.2 an open point). Release notes ``MZ e2a52f1:RELEASE-NOTES.md`` 1.8.0 known issue:
the experimental PyTorch API did not save checkpoints at steps 0 and 1 in the correct format.

Content changes handled elsewhere (MODELZOO_HISTORY.md §0, §3.5, §3.6):

* model keys: no renames; 1.8's ``PyTorchBaseModel`` may add a ``model.`` prefix and
  ``state_version`` 0.2 (``a1f6f51:modelzoo/common/pytorch/PyTorchBaseModel.py``) — see the
  model-key steps;
* config: T5 ``use_pre_encoder_decoder_layer_norm`` negated, BERT gains ``pooler_nonlinearity``
  / ``mlm_nonlinearity`` (``ConfigConverter_T5_CS17_CS18``, ``ConfigConverter_Bert_CS16_CS18``) —
  see the config steps.

Steps for those are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

SOURCE = "1.7"
TARGET = "1.8"
FORMAT = (0.1, 0.2)
CHANGES = ("root attribute __version__ = 0.2 written (a 1.7 file may lack it: absent means 0.1)",)

# Container: nothing to edit in the tree. Model-key and config steps go here.
OPERATIONS = ()
INPUTS = ()
