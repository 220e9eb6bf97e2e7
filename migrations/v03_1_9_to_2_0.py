"""1.9 → 2.0: format 0.3 → 0.4; torch tensors tagged TorchTensorH5Type.

Container. 2.0 writes root ``__version__ = 0.4`` and still no ``__cstorch_version__`` (OLD-PTH5
``save_spec`` writes only ``__spec__`` and ``__version__``). Torch tensors are tagged
``TorchTensorH5Type`` (bf16 stored as int16 bits with ``is_bfloat16``); from 0.4 on
``NumpyArrayH5Type`` means a real numpy array. The spec is still the hex of a dill-pickled torch
(≤2.0) ``TreeSpec``. No tree edit is needed for the tags: the reader already takes 0.3
``NumpyArrayH5Type`` as tensors, and the writer for 2.0 writes ``TorchTensorH5Type``.

Sources: FORMAT.md §1.1 (``CS:cerebras/pytorch/storage/_legacy/pt_h5_saver.py:
CkptVersion.from_file``: 0.4→"2.0", "checkpoints from 2.0 and earlier carry no cstorch
version"; OLD-PTH5 ``__version__ = 0.4``), §1.4, §3.3 (OLD-PTH5 ``TorchTensorH5Type.save``),
§7.1 items 4–5.

Content changes handled elsewhere — the 1.9 → 2.0 release steps, appended to ``OPERATIONS``
below (FORMAT.md §7.1; MODELZOO_HISTORY.md §0, §1, §2, §3.5, §3.6):

* spec fix: 1.x specs name ``cerebras_pytorch.utils.tensor_scalar_dict.TensorScalarDict``, which
  2.0 no longer has; it becomes a plain ``dict`` (``c1ef453:modelzoo/compat/
  fix_checkpoint_spec.py:fix_checkpoint``);
* tied weights missing from 1.x appliance saves (``lm_head.weight`` ↔
  ``embedding_layer.word_embeddings.weight``, ``ln_f`` ↔ ``transformer_decoder.norm``), restored
  as ties (same script, ``fix_duplicate_weights``);
* scheduler: stale ``lr_scheduler…last_epoch`` rewritten from the global step (same script,
  ``fix_last_epoch``; ``e2a52f1:.../run_cstorch_flow.py`` did it at load for ≤0.3 files);
* dataloader: 1.9 kept its state in side files, 2.0 in ``checkpoint["dataloader"]``
  (``c1ef453:modelzoo/compat/data_iter_state_conversion.py``); the side files come in through
  ``INPUTS``;
* grad scaler under ``amp`` (1.x ``PyTorchBaseModel``) vs ``grad_scaler`` (2.0): no Model Zoo
  tool migrates it;
* model-key and config changes: ``use_rms_norm`` / ``use_biasless_norm`` / ``use_t5_layer_norm``
  → ``norm_type``; no key renames (``c1ef453:.../gpt2_hf_cs.py`` and siblings, "Model didn't
  change") — see the model-key steps.
"""

from __future__ import annotations

from ckpt_migrate.migration import InputSpec

SOURCE = "1.9"
TARGET = "2.0"
FORMAT = (0.3, 0.4)
CHANGES = (
    "torch tensors tagged TorchTensorH5Type instead of NumpyArrayH5Type "
    "(NumpyArrayH5Type now means a numpy array)",
    "root attribute __version__ = 0.4 (still no __cstorch_version__)",
)

# Container: nothing to edit in the tree. Spec fix, tied weights, scheduler, dataloader and
# model-key steps go here.
OPERATIONS = ()
INPUTS = (
    InputSpec(
        "data_iter_dir",
        "directory with the 1.9 dataloader side files (data_iter_checkpoint_state_file_global, "
        "data_iter_state_file_worker_<id>_step_<step>.txt)",
    ),
    InputSpec("dataloader_type", "map or iterable"),
)
