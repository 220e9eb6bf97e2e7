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

from ckpt_migrate.config.context import ConfigContext
from ckpt_migrate.config.yaml_edit import put, take
from ckpt_migrate.hops.trainer_metadata import record_release_in_metadata

SOURCE = "2.3"
TARGET = "2.4"
CHANGES = ()

# Model-key and config steps go here.
OPERATIONS = (record_release_in_metadata,)
INPUTS = ()


# Downgrade: the older release's writer undoes the container; the hop's only tree step is the
# ``__metadata__`` stamp, which records the older release (Model Zoo's converters stamp their
# target in either direction: ``base_converter.py`` lines 745-753, ``update_ckpt_metadata``).
DOWN_OPERATIONS = (record_release_in_metadata,)


# ---------------------------------------------------------------------------- config steps


def add_model_name(ctx: ConfigContext) -> None:
    """Add ``trainer.init.model.name``, the model's Model Zoo registry name (required in 2.4).

    "As of CS 2.4, all model configs are required to have a ``name`` key": Model Zoo's
    ``BaseConfigConverter_CS_CS.post_config_convert`` writes the converter's model name there
    (MODELZOO_HISTORY.md §3.6). The name comes from ``--model`` or the config; from a family
    seen only in the checkpoint's keys when that family has a single Model Zoo model (LLaMA's
    keys are Mistral's too: the config's sliding window tells them apart, else the report says
    the keys could not). Anything else is never guessed: the report asks for it (registry
    names, e.g. ``gpt2``, ``gptj``, ``llama``, ``bert/classifier``, ``t5``, ``transformer``:
    Model Zoo ``registry.yaml``).
    """
    sections = ctx.model_sections()
    if not sections:
        ctx.unknown("trainer.init.model.name", None, "no model section: 2.4 needs one with a name")
    for path, model in sections:
        if "name" in model:
            continue
        if ctx.model_name is None:
            ctx.unknown(
                f"{path}.name",
                None,
                f"2.4 requires the model's registry name and {ctx.name_hint or 'it is unknown'}:"
                " set it by hand (or pass --model)",
            )
            continue
        put(model, "name", ctx.model_name, index=0, above_comments=True)
        why = "2.4 requires the model's registry name"
        ctx.added(
            f"{path}.name", ctx.model_name, f"{why} ({ctx.name_hint})" if ctx.name_hint else why
        )


CONFIG_OPERATIONS = (add_model_name,)


def remove_model_name(ctx: ConfigContext) -> None:
    """Downgrade: remove ``trainer.init.model.name``, which 2.4 introduced (:func:`add_model_name`).

    2.3's model configs have no ``name`` field; Model Zoo's CS23↔CS24 config converter is
    bidirectional (``base_converter.py`` lines 340-360) and its ``post_config_convert`` adds the
    name only going up.
    """
    for path, model in ctx.model_sections():
        if "name" in model:
            value, _ = take(model, "name")
            ctx.removed(f"{path}.name", value, "2.3 model configs have no name")


DOWN_CONFIG_OPERATIONS = (remove_model_name,)
