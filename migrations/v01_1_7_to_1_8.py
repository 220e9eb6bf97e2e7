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
  ``state_version`` 0.2 (``a1f6f51:modelzoo/common/pytorch/PyTorchBaseModel.py``); unprefixed
  1.7 keys are kept as they are (:func:`keep_unprefixed_model_keys`);
* config: T5 ``use_pre_encoder_decoder_layer_norm`` negated, BERT gains ``pooler_nonlinearity``
  / ``mlm_nonlinearity`` (``ConfigConverter_T5_CS17_CS18``, ``ConfigConverter_Bert_CS16_CS18``) —
  see the config steps.

Steps for those are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

from ckpt_migrate import catalogue
from ckpt_migrate.config.context import ConfigContext
from ckpt_migrate.config.yaml_edit import put
from ckpt_migrate.hops.hop import StepContext
from ckpt_migrate.models.keys import KeyRename, model_keys, split_prefix

SOURCE = "1.7"
TARGET = "1.8"
FORMAT = (0.1, 0.2)
CHANGES = ("root attribute __version__ = 0.2 written (a 1.7 file may lack it: absent means 0.1)",)

# 1.7 → 1.8 renames no model key: the CS17→CS18 converters copy every key (``a1f6f51:.../t5.py``
# ``Converter_T5_CS17_CS18``; BERT the same), for every family.
KEY_RENAMES: tuple[KeyRename, ...] = ()


def keep_unprefixed_model_keys(ctx: StepContext) -> None:
    """Keep 1.7's unprefixed model keys as they are (1.8's ``model.`` prefix is optional).

    1.8's ``PyTorchBaseModel.get_state`` saves the model under ``model.``-prefixed keys with a
    top-level ``state_version`` 0.2; 1.7's ``get_state`` has neither, and 1.8's ``set_state``
    still loads a state without ``state_version`` into the inner module. Model Zoo's CS17→CS18
    converter keeps unprefixed keys as they are, and the 2.3+ Trainer loads a model dict whose
    keys are not all ``model.``-prefixed into the inner module too. So the upgrade neither adds
    the prefix nor ``state_version`` (adding only one of them would break 1.8/1.9 loading);
    every later key rule accepts both forms. A dict mixing both forms is reported: no loader
    accepts it whole.
    Source: MODELZOO_HISTORY.md §0 and §3.5 (1.7→1.8 row; ``a1f6f51:modelzoo/common/pytorch/
    PyTorchBaseModel.py`` ``get_state``/``set_state``, ``124ef1e:…/PyTorchBaseModel.py``,
    ``a1f6f51:.../t5.py`` ``Converter_T5_CS17_CS18``), §4.3 (``callbacks/model.py``).
    """
    keys = model_keys(ctx.root)
    prefixed = [k for k in keys if split_prefix(k)[0]]
    if prefixed and len(prefixed) < len(keys):  # nothing changes, so only a mix is reported
        ctx.warn(
            f"model: {len(prefixed)} of {len(keys)} keys carry the 1.8 'model.' prefix and "
            f"{len(keys) - len(prefixed)} do not (e.g. {prefixed[0]!r} and "
            f"{next(k for k in keys if not split_prefix(k)[0])!r}); kept as they are, but "
            "no release loads such a mix whole: check how this checkpoint was made"
        )


OPERATIONS = (keep_unprefixed_model_keys,)
INPUTS = ()


# ---------------------------------------------------------------------------- config steps


def flip_pre_encoder_decoder_layer_norm(ctx: ConfigContext) -> None:
    """T5/Transformer: negate ``use_pre_encoder_decoder_layer_norm`` (1.8 flipped its meaning).

    1.8.0 release note: the flag now means the opposite, and "1.7 checkpoints need their config
    updated" (``a1f6f51:RELEASE-NOTES.md``); Model Zoo's ``ConfigConverter_T5_CS17_CS18.
    flip_use_pre_encoder_decoder_layer_norm`` negates the value (MODELZOO_HISTORY.md §3.6,
    §5). A config without the key ran with 1.7's default, which 1.8 reads the other way round:
    that is reported, not guessed.
    """
    if ctx.family != catalogue.T5.name:
        return
    key = "use_pre_encoder_decoder_layer_norm"
    for path, model in ctx.model_sections():
        if key not in model:
            ctx.note(
                f"{path}.{key}",
                "not set: 1.8 reads this flag with the opposite meaning of 1.7, so the default "
                "no longer means what it did for this model; set it to the negation of the "
                "value the 1.7 run used",
            )
            continue
        old = model[key]
        if not isinstance(old, bool):
            ctx.unknown(f"{path}.{key}", old, "expected true or false; not negated, check it")
            continue
        model[key] = not old
        ctx.changed(f"{path}.{key}", old, not old, "1.8 inverted its meaning (T5/Transformer)")


def add_bert_nonlinearities(ctx: ConfigContext) -> None:
    """BERT: add ``pooler_nonlinearity = encoder_nonlinearity`` and ``mlm_nonlinearity: gelu``.

    1.8 split BERT's nonlinearities: the pooler and the MLM head got their own settings
    (``a1f6f51:RELEASE-NOTES.md``). 1.7's pooler used ``encoder_nonlinearity`` and its MLM head
    always gelu, so Model Zoo's ``ConfigConverter_Bert_CS16_CS18.post_config_convert`` writes
    exactly those values (MODELZOO_HISTORY.md §3.6). A 1.7 config that already has either key
    is not a 1.7 config in that respect: the key is kept and reported.
    """
    if ctx.family != catalogue.BERT.name:
        return
    for path, model in ctx.model_sections():
        last = "encoder_nonlinearity" if "encoder_nonlinearity" in model else None
        if "pooler_nonlinearity" in model:
            ctx.unknown(
                f"{path}.pooler_nonlinearity",
                model["pooler_nonlinearity"],
                "1.7 had no such key; kept as it is",
            )
        elif last is None:
            ctx.note(
                f"{path}.pooler_nonlinearity",
                "not added: no encoder_nonlinearity to copy (1.7's pooler used it); set "
                "pooler_nonlinearity to the encoder nonlinearity the 1.7 run used",
            )
        else:
            value = model["encoder_nonlinearity"]
            put(model, "pooler_nonlinearity", value, after=last)
            last = "pooler_nonlinearity"
            ctx.added(
                f"{path}.pooler_nonlinearity",
                value,
                "1.8 gave the pooler its own nonlinearity; 1.7 used encoder_nonlinearity",
            )
        if "mlm_nonlinearity" in model:
            ctx.unknown(
                f"{path}.mlm_nonlinearity", model["mlm_nonlinearity"], "1.7 had no such key"
            )
        else:
            put(model, "mlm_nonlinearity", "gelu", after=last)
            ctx.added(
                f"{path}.mlm_nonlinearity",
                "gelu",
                "1.8 gave the MLM head its own nonlinearity (default: encoder_nonlinearity); "
                "1.7's was always gelu",
            )


CONFIG_OPERATIONS = (flip_pre_encoder_decoder_layer_norm, add_bert_nonlinearities)
