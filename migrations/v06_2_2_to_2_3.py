"""2.2 → 2.3: no container change (format 0.4); only the release advances.

Container. 2.3 writes the same 0.4 layout as 2.1/2.2 (``__cstorch_version__`` becomes ``"2.3.0"``,
set by the writer from the target release). 2.3 introduces the Model Zoo Trainer
(``cc48e20:src/cerebras/modelzoo/trainer/``), which changes how checkpoints are driven, not the
container.

Sources: FORMAT.md §1.1, §6.2; MODELZOO_HISTORY.md §0 (commit ``cc48e20`` = 2.3.0).

Content changes handled elsewhere (MODELZOO_HISTORY.md §0, §3.5, §3.6):

* config: the legacy ``train_input/model/optimizer/runconfig`` layout → ``trainer: {init, fit}``
  (``convert_legacy_params_to_trainer_params``, ``f1fd1e0:src/cerebras/modelzoo/trainer/
  utils.py``); GPT-2 drops ``use_position_embedding``, ``alibi_implementation``,
  ``weight_initialization_seed`` (``ConfigConverter_GPT2Model_CS22_CS23``) — see the config steps;
* model keys: none for most models (``Converter_GPT2LMHeadModel_CS22_CS23`` is config only) —
  see the model-key steps.

Steps for those are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

SOURCE = "2.2"
TARGET = "2.3"
CHANGES = ()

# Model-key and config steps go here.
OPERATIONS = ()
INPUTS = ()
