"""1.8 → 1.9: format 0.2 → 0.3; datasets tagged __H5_TYPE__ instead of flag attributes.

Container. 1.9 writes root ``__version__ = 0.3`` and tags every dataset with ``__H5_TYPE__``, the
class name of the "H5Type" that saved it, instead of the 1.7/1.8 flag attributes: ``None`` →
``NoneH5Type``, ``str`` → ``StringH5Type`` with attribute ``string_value`` (1.8: ``is_string`` +
``string_val``), Python ``bool``/``int``/``float`` → ``ScalarH5Type`` (a shape-``()`` dataset;
1.8: ``is_scalar`` on tensor data), anything unknown → ``ObjectH5Type``. Torch tensors are tagged
``NumpyArrayH5Type`` in 0.3, with ``is_bfloat16``; readers of 0.3 files take that tag as a torch
tensor (``PyTorchH5Saver._load_by_typename``). ``__cstorch_version__`` is still not written.

No tree edit is needed: the reader already turns 0.1/0.2 flags and 0.3 ``NumpyArrayH5Type``
tensors into the neutral tree, and the writer for 1.9 writes the 0.3 tags.

Sources: FORMAT.md §1.1 (``CS:cerebras/pytorch/storage/_legacy/pt_h5_saver.py:
CkptVersion.from_file``: 0.3→"1.9"), §1.4 (≤0.3 ``NumpyArrayH5Type`` read as tensors), §3.3
(tags: OLD-H5SAVER ``_save_tensor_to_checkpoint`` writes ``save_type.__name__``), §3.4 (the
untagged reader's comment: "saved in a release 1.8 or lower").

Content changes handled elsewhere (MODELZOO_HISTORY.md §0, §3.5, §3.6):

* model keys: none — the converters group ``("cs-1.8", "cs-1.9")`` as one format
  (``97bdaf4`` ``formats()``);
* config: ``batch_size`` changes from per-CSX to global (1.9 release note); no Model Zoo tool
  rescales it (``f1fd1e0:.../base_converter.py`` ``BaseConfigConverter_CS18_CS19``) — see the
  config steps.

Steps for those are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

from ckpt_migrate.config.context import ConfigContext

SOURCE = "1.8"
TARGET = "1.9"
FORMAT = (0.2, 0.3)
CHANGES = (
    "datasets tagged with __H5_TYPE__ instead of is_none/is_string/is_scalar/is_constructible/"
    "filepath flags",
    "strings kept in attribute string_value instead of string_val",
    "torch tensors tagged NumpyArrayH5Type (0.3 readers take them as tensors)",
    "root attribute __version__ = 0.3",
)

# Container: nothing to edit in the tree. Model-key and config steps go here.
OPERATIONS = ()
INPUTS = ()


# ---------------------------------------------------------------------------- config steps


def batch_size_per_system_to_global(ctx: ConfigContext) -> None:
    """``batch_size`` becomes the global batch: multiplied by ``--num-csx N``, else reported.

    1.9.1 release note: ``batch_size`` is now the global batch, split evenly across
    ``num_csx`` systems (it was per CS-X), and must be divisible by ``num_csx``
    (``97bdaf4:RELEASE-NOTES.md``). No Model Zoo tool rescales it: ``BaseConfigConverter_
    CS18_CS19`` copies every key (MODELZOO_HISTORY.md §3.6, §5). How many systems the 1.8 run
    used is in neither the checkpoint nor (reliably) the config, so it is never guessed.
    """
    for name in ("train_input", "eval_input"):
        section = ctx.section(name)
        if section is None or "batch_size" not in section:
            continue
        key, old = f"{name}.batch_size", section["batch_size"]
        if isinstance(old, bool) or not isinstance(old, int):
            ctx.unknown(key, old, "not an integer; 1.9 reads batch_size as the global batch")
            continue
        if ctx.num_csx is None:
            runconfig = ctx.section("runconfig") or {}
            hint = (
                f" (runconfig.num_csx is {runconfig['num_csx']})" if "num_csx" in runconfig else ""
            )
            ctx.note(
                key,
                f"left at {old}: 1.8 read it per CS-X system, 1.9 as the global batch over "
                f"all systems; pass --num-csx N, the systems the 1.8 run used{hint}, to "
                "multiply it",
            )
        elif ctx.num_csx == 1:
            ctx.note(key, f"left at {old}: one system (--num-csx 1), per-system = global")
        else:
            section["batch_size"] = old * ctx.num_csx
            ctx.changed(
                key,
                old,
                old * ctx.num_csx,
                f"1.9 reads batch_size as the global batch: {old} per system × "
                f"{ctx.num_csx} systems (--num-csx)",
            )


CONFIG_OPERATIONS = (batch_size_per_system_to_global,)
