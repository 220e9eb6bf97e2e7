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
