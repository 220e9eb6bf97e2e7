"""2.4 → 2.5: format 0.4 → 0.5; JSON treespec, __TYPE__ serializers, namedtuples → tuples.

Container. 2.5 replaces the legacy layout with format 0.5, written by ``cstorch.save`` on top of
the appliance storage layer:

* ``__spec__`` becomes ``json.dumps([structure, treespec], indent=4)`` with torch's protocol-1
  JSON treespec; each leaf gets a ``<leaf>.__metadata__`` JSON root attribute;
* datasets carry ``__TYPE__`` (the serializer class name) instead of ``__H5_TYPE__``, live at
  the verbatim leaf name (``/`` makes groups) instead of a quoted root name;
* Python scalars, strings and ``None`` become JSON-only metadata (no dataset);
* a value seen twice (by object identity) is written once; later places become ``LinkedObject``;
* ``__version__ = 0.5``, ``__cstorch_version__``, and ``__SUCCESS__`` written last.

The writer for 2.5 does all of that. The one tree edit is for namedtuples: 0.5 can only name
namedtuple classes registered with the real library, so they become tuples
(:func:`namedtuples_to_tuples`).

Sources: FORMAT.md §1.1 (``CS:cerebras/pytorch/storage/constants.py``
``CURRENT_CKPT_FORMAT_VERSION = 0.5``; 2.5 as the first 0.5 release is inferred: MZ 2.4.3
``8a80b37`` still imports ``PyTorchH5Saver``, MZ 2.5.0 ``ccbe5f7:src/cerebras/modelzoo/cli/
checkpoint_cli.py`` uses ``cerebras.appliance.storage.H5Reader``), §4 (``CS:cerebras/pytorch/
storage/save.py:save``, ``AP:cerebras/appliance/storage/h5_storage.py:H5Writer``,
``context.py:SerializationContext``), §4.2 (namedtuple registration), §4.6 (ties), §7.2.

Content changes handled elsewhere (MODELZOO_HISTORY.md §0, §4): model keys and config: none
(2.4→2.5 fallback converter registered). MZ 2.5 also adds a checkpoint index file, S3
``checkpoint_root`` and ``strict_version`` to the Trainer (``ccbe5f7``); none is inside the
checkpoint file. Further steps are appended to ``OPERATIONS`` below.
"""

from __future__ import annotations

from ckpt_migrate.config.context import ConfigContext
from ckpt_migrate.config.yaml_edit import is_map, new_map, put, take
from ckpt_migrate.format.tree import DictNode, Key, NamedTupleNode, Node, SeqNode
from ckpt_migrate.hops.hop import StepContext
from ckpt_migrate.hops.trainer_metadata import record_release_in_metadata

SOURCE = "2.4"
TARGET = "2.5"
FORMAT = (0.4, 0.5)
CHANGES = (
    "structure re-encoded as JSON treespec (protocol 1) plus one <leaf>.__metadata__ JSON "
    "attribute per leaf",
    "datasets tagged __TYPE__ (serializer class name) instead of __H5_TYPE__, named by the "
    "verbatim leaf name instead of the quoted one",
    "scalars/strings/None become JSON-only metadata (no dataset)",
    "ties become LinkedObject metadata pointing to the first place",
    "root __version__ = 0.5 and __cstorch_version__; __SUCCESS__ written last",
)


def namedtuples_to_tuples(ctx: StepContext) -> None:
    """Turn every namedtuple into a plain tuple (format 0.5 cannot name their classes).

    Release 2.5 (format 0.5) stores the structure as torch's JSON treespec, where a namedtuple
    node's context is the *registered* serialized name of its class; cstorch registers only its
    own ``NestedObject``, so any other namedtuple cannot be saved (torch's
    ``_namedtuple_serialize`` raises ``NotImplementedError``). The items are kept in order; the
    class and field names are lost, and each converted place is reported. Leaves are not touched,
    so ties stay ties.

    Source: FORMAT.md §4.2 (reading rules), §7.2 step 2 ("convert them to tuples or fail").
    """
    # id of a converted namedtuple -> (that node, kept alive so ids stay unique; its tuple)
    done: dict[int, tuple[NamedTupleNode, SeqNode]] = {}

    def convert(node: Node, path: tuple[Key, ...]) -> Node:
        if isinstance(node, DictNode):
            for i, (key, child) in enumerate(node.items):
                new = convert(child, (*path, key))
                if new is not child:
                    node.items[i] = (key, new)
            return node
        if isinstance(node, (SeqNode, NamedTupleNode)):
            if id(node) in done:  # the same container at two places stays one container
                return done[id(node)][1]
            for i, child in enumerate(node.items):
                new = convert(child, (*path, i))
                if new is not child:
                    node.items[i] = new
            if isinstance(node, NamedTupleNode):
                where = ".".join(str(k) for k in path) or "<root>"
                fields = ", ".join(node.fields)
                ctx.changed(f"{where}: namedtuple {node.name}({fields}) written as a tuple")
                done[id(node)] = (node, SeqNode("tuple", list(node.items)))
                return done[id(node)][1]
        return node

    ctx.root = convert(ctx.root, ())


OPERATIONS = (namedtuples_to_tuples, record_release_in_metadata)
INPUTS = ()


# Downgrade: tuples stay tuples (format 0.4 stores them; the namedtuple classes 2.5 dropped are
# not in the file to restore), the 0.4 writer undoes the container, and ``__metadata__`` records
# the older release (``base_converter.py`` lines 745-753, ``update_ckpt_metadata``).
DOWN_OPERATIONS = (record_release_in_metadata,)


# ---------------------------------------------------------------------------- config steps

# model key -> its trainer.init.precision key
_MODEL_PRECISION = {"mixed_precision": "enabled", "fp16_type": "fp16_type"}


def model_precision_keys_to_precision(ctx: ConfigContext) -> None:
    """Remove ``model.mixed_precision`` / ``model.fp16_type``: 2.5 reads them only from
    ``trainer.init.precision`` (where a value only the model had is moved).

    2.3 and 2.4 kept a copy in the model (see the 2.2 → 2.3 trainer layout); 2.5 prunes both
    when it converts a legacy config (Model Zoo tag Release_2.5.0,
    ``src/cerebras/modelzoo/trainer/utils.py`` ``TRAINER_POST_CONVERSION_PRUNE_LIST``, lines
    682-686) and its model config classes forbid unknown fields (``config/base_config.py``
    line 36, ``extra="forbid"``), so a 2.4 config that still has them fails in 2.5. Model Zoo's
    own 2.4 → 2.5 converter (``BaseConfigConverter_CS24_CS25``, a fallback) leaves them there.
    A model value that contradicts the precision section is kept and reported
    (MODELZOO_HISTORY.md §3.6 for the config converters).
    """
    for path, trainer in ctx.trainers():
        init = trainer.get("init")
        model = init.get("model") if is_map(init) else None
        if not is_map(model):
            continue
        for key, dest in _MODEL_PRECISION.items():
            if key not in model:
                continue
            where = f"{path}.init.model.{key}"
            precision = init.get("precision")
            if not is_map(precision):
                precision = new_map()
                put(init, "precision", precision)
            if dest not in precision:
                value, comment = take(model, key)
                put(precision, dest, value, comment=comment)
                ctx.moved(where, f"{path}.init.precision.{dest}", value, "2.5 reads it there")
            elif precision[dest] == model[key]:
                value, _ = take(model, key)
                ctx.removed(where, value, f"2.5 forbids it; {path}.init.precision.{dest} holds it")
            else:
                ctx.unknown(
                    where,
                    model[key],
                    f"contradicts {path}.init.precision.{dest} = {precision[dest]!r} and 2.5 "
                    "forbids it in the model: decide, then delete it",
                )


def drop_norm_first(ctx: ConfigContext) -> None:
    """Remove ``model.norm_first: true``: 2.5's decoder configs have no such field.

    Every GPT-2-style decoder builds its layers pre-LN: ``GPT2LMHeadModel`` passes
    ``norm_first=True`` to its decoder layers (``f1fd1e0:src/cerebras/modelzoo/models/nlp/gpt2/
    gpt2_model.py`` lines 881 and 922; its config class has had no ``norm_first`` since
    Release_2.5.0), and the model config classes forbid unknown fields (Release_2.5.0
    ``config/base_config.py`` line 36), so a config that still names it fails to load. Model
    Zoo's own HF converters write ``norm_first: true`` (``llama.py`` lines 719 and 737) and its
    2.4 → 2.5 fallback converter leaves it. ``false`` is a post-LN model 2.5 cannot build: kept
    and reported.
    """
    for path, model in ctx.model_sections():
        if "norm_first" not in model:
            continue
        if model["norm_first"] is True:
            value, _ = take(model, "norm_first")
            ctx.removed(f"{path}.norm_first", value, "2.5 builds pre-LN only and forbids it")
        else:
            ctx.unknown(
                f"{path}.norm_first",
                model["norm_first"],
                "2.5 builds decoders pre-LN only and has no norm_first: this model cannot be "
                "expressed there",
            )


CONFIG_OPERATIONS = (model_precision_keys_to_precision, drop_norm_first)


def precision_keys_back_into_model(ctx: ConfigContext) -> None:
    """Downgrade: copy ``trainer.init.precision`` back into ``model.mixed_precision`` /
    ``model.fp16_type``, where 2.3 and 2.4 keep them beside the precision section.

    The inverse of :func:`model_precision_keys_to_precision`: Model Zoo's 2.3 trainer layout
    copies them into the model (tag Release_2.3.0 ``src/cerebras/modelzoo/trainer/utils.py``
    lines 1034-1050, Release_2.4.0 lines 892-908), and its 2.4 models read them there. A value
    the model already has is left as it is.
    """
    for path, trainer in ctx.trainers():
        init = trainer.get("init")
        model = init.get("model") if is_map(init) else None
        precision = init.get("precision") if is_map(init) else None
        if not is_map(model) or not is_map(precision):
            continue
        for key, source in _MODEL_PRECISION.items():
            if source in precision and key not in model:
                put(model, key, precision[source])
                ctx.added(f"{path}.init.model.{key}", precision[source], "2.4 models read it there")


DOWN_CONFIG_OPERATIONS = (precision_keys_back_into_model,)
