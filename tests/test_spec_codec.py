"""Tests for the legacy ``__spec__`` codec: the restricted unpickler, the decoder and the encoder.

Fixtures: FORMAT_EXAMPLES.md A.1 (an emulated torch ≤2.0 spec pickled by dill 0.3.8) and the output
of real torch 2.4.0 + dill 0.3.8 (the cerebras-pytorch 2.10 environment) for a small state dict.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import copyreg
import importlib
import io
import json
import os
import pickle
import pickletools
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_migrate.errors import (
    CkptError,
    CorruptCheckpointError,
    UnsafeContentError,
    UnsupportedContentError,
)
from ckpt_migrate.format.budgets import MAX_DEPTH
from ckpt_migrate.format.legacy.spec_decode import (
    decode_spec,
    decode_spec_hex,
    decode_spec_info,
    spec_bytes_from_hex,
)
from ckpt_migrate.format.legacy.spec_encode import encode_spec, encode_spec_hex
from ckpt_migrate.format.tree import (
    DictNode,
    MissingLeaf,
    NamedTupleNode,
    Node,
    SeqNode,
    ValueLeaf,
    iter_leaves,
    structure_equal,
)

A1_HEX = (
    "8004952c020000000000008c13746f7263682e7574696c732e5f707974726565948c08547265655370656394"
    "93942981947d94288c0474797065948c0a64696c6c2e5f64696c6c948c0a5f6c6f61645f747970659493948c"
    "046469637494859452948c07636f6e74657874945d94288c056d6f64656c948c096f7074696d697a6572948c"
    "0b676c6f62616c5f7374657094658c0e6368696c6472656e5f7370656373945d942868022981947d94286805"
    "680b680c5d94288c0177948c0162946568115d942868008c084c656166537065639493942981947d94286805"
    "4e680c4e68115d948c0a6e756d5f6c6561766573944b017562681a2981947d942868054e680c4e68115d9468"
    "1e4b01756265681e4b02756268022981947d94286805680b680c5d94288c057374617465948c0c706172616d"
    "5f67726f757073946568115d942868022981947d94286805680b680c5d9468115d94681e4b00756268022981"
    "947d9428680568088c046c6973749485945294680c4e68115d9468022981947d94286805680b680c5d94288c"
    "026c72948c06706172616d73946568115d9428681a2981947d942868054e680c4e68115d94681e4b01756268"
    "022981947d942868056830680c4e68115d9428681a2981947d942868054e680c4e68115d94681e4b01756268"
    "1a2981947d942868054e680c4e68115d94681e4b01756265681e4b02756265681e4b03756261681e4b037562"
    "65681e4b037562681a2981947d942868054e680c4e68115d94681e4b01756265681e4b0675622e"
)

TORCH24_HEX = (
    "80049527020000000000008c13746f7263682e7574696c732e5f707974726565948c08547265655370656394"
    "93942981947d94288c0474797065948c0a64696c6c2e5f64696c6c948c0a5f6c6f61645f747970659493948c"
    "046469637494859452948c07636f6e74657874945d94288c016d948c0174948c016e948c0165944b00658c0e"
    "6368696c6472656e5f7370656373945d942868022981947d942868058c0b636f6c6c656374696f6e73948c0b"
    "4f72646572656444696374949394680c5d94288c0177948c0162946568125d942868008c084c656166537065"
    "639493942981947d942868054e680c4e68125d948c096e756d5f6e6f646573944b018c0a6e756d5f6c656176"
    "6573944b018c0c6e756d5f6368696c6472656e944b007562681f6568224b0368234b0268244b027562680229"
    "81947d9428680568088c057475706c659485945294680c4e68125d9428681f68022981947d9428680568088c"
    "046c6973749485945294680c4e68125d9428681f681f6568224b0368234b0268244b0275626568224b056823"
    "4b0368244b02756268022981947d9428680568168c0a6e616d65647475706c65949394680c68068c125f6372"
    "656174655f6e616d65647475706c659493948c024e54948c016194681b86948c085f5f6d61696e5f5f948794"
    "529468125d9428681f681f6568224b0368234b0268244b02756268022981947d94286805680b680c5d946812"
    "5d9468224b0168234b0068244b007562681f6568224b0e68234b0868244b0575622e"
)
# The object TORCH24_HEX was made from, with ``NT = collections.namedtuple("NT", ["a", "b"])``
# defined in ``__main__``: ``dill.dumps(tree_flatten(obj)[1])`` under torch 2.4.0 + dill 0.3.8.
#   {"m": OrderedDict(w=1, b=2), "t": (1, [2, 3]), "n": NT(4, 5), "e": {}, 0: 7}

A1 = bytes.fromhex(A1_HEX)
TORCH24 = bytes.fromhex(TORCH24_HEX)
A1_NAMES = [
    "model.w",
    "model.b",
    "optimizer.param_groups.0.lr",
    "optimizer.param_groups.0.params.0",
    "optimizer.param_groups.0.params.1",
    "global_step",
]


# --------------------------------------------------------------------------- helpers


def leaf() -> MissingLeaf:
    return MissingLeaf("")


def names(root: Node) -> list[str]:
    return [ref.name for ref in iter_leaves(root)]


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and "\r" not in text
    return text


def py_to_tree(obj: Any) -> Node:
    """The neutral tree torch's pytree would make of a Python object (FORMAT.md §2.1)."""
    if type(obj) in (dict, collections.OrderedDict):
        items = [(k, py_to_tree(v)) for k, v in obj.items()]
        return DictNode(items, ordered=type(obj) is collections.OrderedDict)
    if type(obj) in (list, tuple):
        return SeqNode(type(obj).__name__, [py_to_tree(v) for v in obj])
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        return NamedTupleNode(type(obj).__name__, tuple(obj._fields), [py_to_tree(v) for v in obj])
    return leaf()


# A tiny pickle assembler, so hostile and malformed pickles need neither torch nor dill.
P = pickle


def u(text: str) -> bytes:
    data = text.encode()
    if len(data) < 256:
        return P.SHORT_BINUNICODE + bytes([len(data)]) + data
    return P.BINUNICODE + len(data).to_bytes(4, "little") + data


def g(module: str, name: str) -> bytes:
    return u(module) + u(name) + P.STACK_GLOBAL


def call(func: bytes, *args: bytes) -> bytes:
    return func + P.MARK + b"".join(args) + P.TUPLE + P.REDUCE


def lst(*items: bytes) -> bytes:
    return P.EMPTY_LIST + (P.MARK + b"".join(items) + P.APPENDS if items else b"")


def load_type(name: str) -> bytes:
    return call(g("dill._dill", "_load_type"), u(name))


def spec(type_: bytes, ctx: bytes, children: list[bytes], cls: str = "TreeSpec") -> bytes:
    state = u("type") + type_ + u("context") + ctx + u("children_specs") + lst(*children)
    return (
        g("torch.utils._pytree", cls)
        + P.EMPTY_TUPLE
        + P.NEWOBJ
        + P.EMPTY_DICT
        + P.MARK
        + state
        + P.SETITEMS
        + P.BUILD
    )


LEAF = spec(P.NONE, P.NONE, [], "LeafSpec")


def pkl(body: bytes, proto: int = 4) -> bytes:
    return P.PROTO + bytes([proto]) + body + P.STOP


# --------------------------------------------------------------------------- A.1 and torch 2.4


def test_a1_decodes_to_the_documented_leaves() -> None:
    info = decode_spec_info(A1, path="tiny_r1.9.mdl")
    assert names(info.root) == A1_NAMES
    assert (info.protocol, info.style, info.had_tensor_scalar_dict) == (4, "plain", False)
    root = info.root
    assert isinstance(root, DictNode) and not root.ordered
    assert root.keys() == ["model", "optimizer", "global_step"]
    optimizer = root.get("optimizer")
    assert isinstance(optimizer, DictNode)
    state = optimizer.get("state")
    assert isinstance(state, DictNode) and state.items == []  # kept, though it has no leaves
    groups = optimizer.get("param_groups")
    assert isinstance(groups, SeqNode) and groups.kind == "list"
    refs = list(iter_leaves(root))
    assert all(isinstance(r.leaf, MissingLeaf) and r.leaf.name == r.name for r in refs)
    assert len({id(r.leaf) for r in refs}) == len(refs)  # fresh placeholders, no accidental ties


def test_a1_reencodes_byte_for_byte() -> None:
    root = decode_spec(A1)
    assert encode_spec(root, "plain") == A1
    assert encode_spec_hex(root, "plain") == A1_HEX
    assert decode_spec_hex(A1_HEX) is not None


def test_real_torch24_pickle_decodes_and_reencodes_byte_for_byte() -> None:
    info = decode_spec_info(TORCH24)
    assert (info.protocol, info.style) == (4, "dataclass")
    assert names(info.root) == ["m.w", "m.b", "t.0", "t.1.0", "t.1.1", "n.0", "n.1", "0"]
    root = info.root
    assert isinstance(root, DictNode)
    assert root.keys() == ["m", "t", "n", "e", 0]
    m = root.get("m")
    assert isinstance(m, DictNode) and m.ordered
    n = root.get("n")
    assert isinstance(n, NamedTupleNode) and (n.name, n.fields) == ("NT", ("a", "b"))
    t = root.get("t")
    assert isinstance(t, SeqNode) and t.kind == "tuple"
    # torch 2.4 shares one _LEAF_SPEC, which dill memoises; the encoder does the same.
    assert encode_spec(root, "dataclass") == TORCH24


def test_hex_forms_are_accepted() -> None:
    for text in (A1_HEX, A1_HEX.upper(), f"  {A1_HEX}\n", A1_HEX.encode()):
        assert names(decode_spec_hex(text)) == A1_NAMES
    assert spec_bytes_from_hex(A1_HEX) == A1


# --------------------------------------------------------------------------- hostile pickles


@pytest.fixture
def tripwire(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[str]]:
    """Arms recorders on everything a hostile spec would like to run; returns the arming call."""
    calls: list[str] = []

    def arm() -> list[str]:
        def recorder(what: str) -> Callable[..., Any]:
            def record(*args: Any, **kwargs: Any) -> None:
                calls.append(what)

            return record

        monkeypatch.setattr(os, "system", recorder("os.system"))
        if os.name == "posix":
            import posix

            monkeypatch.setattr(posix, "system", recorder("posix.system"))
        monkeypatch.setattr(subprocess, "Popen", recorder("subprocess.Popen"))
        monkeypatch.setattr(importlib, "import_module", recorder("importlib.import_module"))
        monkeypatch.setattr(builtins, "eval", recorder("eval"))
        monkeypatch.setattr(builtins, "exec", recorder("exec"))
        return calls

    return arm


class _Evil:
    def __init__(self, func: Callable[..., Any], *args: Any):
        self.reduction = (func, args)

    def __reduce__(self) -> Any:
        return self.reduction


def _hostile_cases(cmd: str, sentinel: Path) -> list[tuple[str, bytes, str]]:
    """(id, pickle, what the refusal must name). Built before the tripwire is armed."""
    touch = [u("touch"), u(str(sentinel))]
    return [
        (
            "os.system GLOBAL+REDUCE",
            P.PROTO + b"\x02" + P.GLOBAL + b"os\nsystem\n" + u(cmd) + P.TUPLE1 + P.REDUCE + P.STOP,
            "os.system",
        ),
        (
            "builtins.eval",
            pkl(call(g("builtins", "eval"), u(f"__import__('os').system({cmd!r})"))),
            "builtins.eval",
        ),
        ("posix.system STACK_GLOBAL", pkl(call(g("posix", "system"), u(cmd))), "posix.system"),
        ("stock pickler os.system", pickle.dumps(_Evil(os.system, cmd), protocol=4), ".system"),
        ("stock pickler proto 2", pickle.dumps(_Evil(os.system, cmd), protocol=2), ".system"),
        (
            "dill _create_function",
            pkl(call(g("dill._dill", "_create_function"), P.NONE, P.EMPTY_DICT)),
            "dill._dill._create_function",
        ),
        (
            "dill _create_code",
            pkl(call(g("dill._dill", "_create_code"), u("x"))),
            "dill._dill._create_code",
        ),
        ("dill _load_type code", pkl(load_type("code")), "dill._dill._load_type('code')"),
        ("dill _load_type function", pkl(load_type("FunctionType")), "_load_type('FunctionType')"),
        (
            "setattr on a builtin type",
            pkl(call(g("builtins", "setattr"), load_type("dict"), u("__qualname__"), u("x"))),
            "builtins.setattr",
        ),
        (
            "setattr on a TreeSpec",
            pkl(
                call(
                    g("builtins", "setattr"),
                    g("torch.utils._pytree", "TreeSpec") + P.EMPTY_TUPLE + P.NEWOBJ,
                    u("__reduce__"),
                    u("x"),
                )
            ),
            "builtins.setattr",
        ),
        ("subprocess.Popen", pkl(call(g("subprocess", "Popen"), lst(*touch))), "subprocess.Popen"),
        (
            "importlib.import_module",
            pkl(call(g("importlib", "import_module"), u("antigravity"))),
            "importlib.import_module",
        ),
        (
            "os.system inside a TreeSpec context",
            pkl(spec(load_type("dict"), lst(call(g("os", "system"), u(cmd))), [LEAF])),
            "os.system",
        ),
        (
            "os.system as a defaultdict default_factory",
            pkl(spec(g("collections", "defaultdict"), lst(g("os", "system"), lst(u("a"))), [LEAF])),
            "os.system",
        ),
        ("INST of os.system", b"(S'" + cmd.encode() + b"'\nios\nsystem\n.", "os.system"),
        ("OBJ of os.system", b"(cos\nsystem\nS'" + cmd.encode() + b"'\no.", "os.system"),
        (
            "calling an allowed marker",
            pkl(call(g("collections", "OrderedDict"), lst())),
            "calls collections.OrderedDict",
        ),
        (
            "instantiating an allowed marker",
            pkl(g("collections", "OrderedDict") + P.EMPTY_TUPLE + P.NEWOBJ),
            "instantiates collections.OrderedDict",
        ),
        (
            "INST of an allowed marker",
            b"(icollections\nOrderedDict\n.",
            "instantiates collections.OrderedDict",
        ),
        (
            "copyreg._reconstructor of a non-spec class",
            pkl(
                call(
                    g("copyreg", "_reconstructor"),
                    g("collections", "deque"),
                    g("builtins", "object"),
                    P.NONE,
                )
            ),
            "copyreg._reconstructor",
        ),
        ("persistent id", pkl(u(cmd) + P.BINPERSID), "persistent id"),
        ("fake module", pkl(call(g("evil_module_xyz", "thing"), u(cmd))), "evil_module_xyz.thing"),
    ]


def test_hostile_pickles_are_refused_and_nothing_runs(
    tripwire: Callable[[], list[str]], tmp_path: Path
) -> None:
    sentinel = tmp_path / "pwned"
    cases = _hostile_cases(f"touch {sentinel}", sentinel)
    calls = tripwire()
    for case_id, data, named in cases:
        with pytest.raises(UnsafeContentError) as exc:
            decode_spec(data, path="evil.mdl")
        text = one_line(exc)
        assert text.startswith("evil.mdl: legacy spec pickle "), case_id
        assert named in text, (case_id, text)
        assert "it was not loaded" in text, case_id
    assert calls == []
    assert not sentinel.exists()


def test_refusal_message_is_the_documented_one() -> None:
    with pytest.raises(UnsafeContentError) as exc:
        decode_spec(pkl(call(g("os", "system"), u("true"))), path="x.mdl")
    assert str(exc.value) == (
        "x.mdl: legacy spec pickle refers to os.system, which a checkpoint spec never contains; "
        "the file may be malicious; it was not loaded"
    )
    assert exc.value.path == "x.mdl"


def test_names_from_the_file_cannot_break_the_message_line() -> None:
    with pytest.raises(UnsafeContentError) as exc:
        decode_spec(pkl(g("os\n\x1b[31m", "sys\ttem" + "x" * 500)))
    text = one_line(exc)
    assert "\x1b" not in text and "\t" not in text and len(text) < 400


def test_copyreg_extension_codes_are_refused(
    tripwire: Callable[[], list[str]], tmp_path: Path
) -> None:
    sentinel = tmp_path / "pwned"
    code = 0x7A5E
    copyreg.add_extension("os", "system", code)
    try:
        calls = tripwire()
        data = pkl(
            P.EXT2 + code.to_bytes(2, "little") + u(f"touch {sentinel}") + P.TUPLE1 + P.REDUCE
        )
        with pytest.raises(UnsafeContentError, match="extension registry"):
            decode_spec(data)
        for op in (P.EXT1 + b"\x05", P.EXT4 + (7).to_bytes(4, "little")):
            with pytest.raises(UnsafeContentError, match="extension registry"):
                decode_spec(pkl(op))
    finally:
        copyreg.remove_extension("os", "system", code)
    assert calls == [] and not sentinel.exists()


def test_a_fake_module_is_never_imported() -> None:
    decode_spec(A1)  # warm up: anything the decoder itself needs is loaded now
    before = set(sys.modules)
    for data in (
        pkl(call(g("evil_module_xyz", "thing"), u("x"))),
        P.PROTO + b"\x02" + P.GLOBAL + b"evil_module_xyz\nthing\n" + P.STOP,
        pkl(spec(g("evil_module_xyz", "thing"), P.NONE, [])),
    ):
        with pytest.raises(UnsafeContentError, match=r"evil_module_xyz\.thing"):
            decode_spec(data)
    assert "evil_module_xyz" not in sys.modules
    assert set(sys.modules) == before


def test_decoding_imports_nothing_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    decode_spec(A1)
    hostile = pkl(call(g("os", "system"), u("true")))
    imported: list[str] = []
    real_import = builtins.__import__

    def spy(name: str, *args: Any, **kwargs: Any) -> Any:
        imported.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", spy)
    info = decode_spec_info(TORCH24)
    root = decode_spec(A1)
    with contextlib.suppress(UnsafeContentError):
        decode_spec(hostile)
    monkeypatch.undo()
    assert imported == []
    assert names(root) == A1_NAMES and info.style == "dataclass"


# --------------------------------------------------------------------------- allowed oddities


def test_dill_qualname_setattr_on_a_namedtuple_is_accepted() -> None:
    # dill 0.3.8 post-processing when __qualname__ differs: setattr(cls, "__qualname__", ...), POP.
    nt_class = (
        g("dill._dill", "_create_namedtuple")
        + P.MARK
        + u("NT")
        + u("a")
        + u("b")
        + P.TUPLE2
        + u("__main__")
        + P.TUPLE
        + P.REDUCE
        + P.BINPUT
        + b"\x00"
        + call(g("builtins", "setattr"), P.BINGET + b"\x00", u("__qualname__"), u("Outer.NT"))
        + P.POP
    )
    data = pkl(spec(g("collections", "namedtuple"), nt_class, [LEAF, LEAF]))
    root = decode_spec(data)
    assert isinstance(root, NamedTupleNode)
    assert (root.name, root.fields, names(root)) == ("NT", ("a", "b"), ["0", "1"])


@pytest.mark.parametrize(
    "module",
    ["cerebras_pytorch.utils.tensor_scalar_dict", "cerebras.pytorch.utils.tensor_scalar_dict"],
)
def test_tensor_scalar_dict_reads_as_a_dict_and_is_remembered(module: str) -> None:
    inner = spec(g(module, "TensorScalarDict"), lst(u("loss"), u("acc")), [LEAF, LEAF])
    info = decode_spec_info(pkl(spec(load_type("dict"), lst(u("metrics")), [inner])))
    assert info.had_tensor_scalar_dict
    metrics = info.root.get("metrics")  # type: ignore[union-attr]
    assert isinstance(metrics, DictNode) and not metrics.ordered
    assert names(info.root) == ["metrics.loss", "metrics.acc"]
    assert not decode_spec_info(A1).had_tensor_scalar_dict


def test_plain_pickle_builtin_globals_and_int_and_bool_keys() -> None:
    # The stock pickler would write builtins.dict rather than dill's _load_type("dict").
    data = pkl(
        spec(
            g("builtins", "dict"),
            lst(P.BININT1 + b"\x00", P.NEWTRUE, u("x")),
            [LEAF, spec(g("builtins", "list"), P.NONE, [LEAF]), LEAF],
        )
    )
    root = decode_spec(data)
    assert isinstance(root, DictNode)
    keys = root.keys()  # DictNode.keys() is a list
    assert [(type(k), k) for k in keys] == [(int, 0), (bool, True), (str, "x")]
    assert names(root) == ["0", "True.0", "x"]


def test_a_root_leaf_has_the_empty_name() -> None:
    root = decode_spec(pkl(LEAF))
    assert isinstance(root, MissingLeaf) and root.name == ""


def test_slots_dataclass_state_of_newer_torch_is_accepted() -> None:
    # torch >= 2.5: BUILD state is [type, _context, _children, num_nodes, num_leaves, num_children].
    def node(type_: bytes, ctx: bytes, children: list[bytes], cls: str = "TreeSpec") -> bytes:
        counts = [P.BININT1 + b"\x01", P.BININT1 + b"\x01", P.BININT1 + b"\x00"]
        state = lst(type_, ctx, lst(*children), *counts)  # counts are not checked
        return g("torch.utils._pytree", cls) + P.EMPTY_TUPLE + P.NEWOBJ + state + P.BUILD

    leaf_ = node(P.NONE, P.NONE, [], "LeafSpec")
    info = decode_spec_info(pkl(node(load_type("dict"), lst(u("a"), u("b")), [leaf_, leaf_])))
    assert info.style == "dataclass" and names(info.root) == ["a", "b"]


# --------------------------------------------------------------------------- unsupported nodes


def test_deque_and_defaultdict_are_refused_as_unsupported() -> None:
    deque = pkl(
        spec(load_type("dict"), lst(u("q")), [spec(g("collections", "deque"), P.NONE, [LEAF])])
    )
    with pytest.raises(UnsupportedContentError) as exc:
        decode_spec(deque, path="d.mdl")
    assert "collections.deque" in one_line(exc) and "['q']" in str(exc.value)
    factory = pkl(
        spec(g("collections", "defaultdict"), lst(load_type("list"), lst(u("a"))), [LEAF])
    )
    with pytest.raises(UnsupportedContentError, match=r"collections\.defaultdict"):
        decode_spec(factory)
    builtin_factory = pkl(
        spec(g("collections", "defaultdict"), lst(g("builtins", "int"), lst(u("a"))), [LEAF])
    )
    with pytest.raises(UnsupportedContentError, match=r"collections\.defaultdict"):
        decode_spec(builtin_factory)


# --------------------------------------------------------------------------- corrupt input


def _bomb(levels: int) -> bytes:
    body = LEAF + P.BINPUT + b"\x00"
    for i in range(1, levels + 1):
        prev = P.BINGET + bytes([i - 1])
        body = body + P.POP + spec(load_type("list"), P.NONE, [prev, prev]) + P.BINPUT + bytes([i])
    return pkl(body)


CORRUPT_CASES: list[tuple[str, bytes, str]] = [
    ("empty", b"", "truncated"),
    ("not a TreeSpec", pickle.dumps({"a": 1}, protocol=4), "not a TreeSpec"),
    ("an int", pickle.dumps(5, protocol=2), "not a TreeSpec"),
    ("a bare LeafSpec class", pkl(g("torch.utils._pytree", "LeafSpec")), "not a TreeSpec"),
    (
        "unbuilt TreeSpec",
        pkl(g("torch.utils._pytree", "TreeSpec") + P.EMPTY_TUPLE + P.NEWOBJ),
        "not a TreeSpec",
    ),
    (
        "keys vs children",
        pkl(spec(load_type("dict"), lst(u("a"), u("b")), [LEAF])),
        "2 keys but 1 children",
    ),
    (
        "float key",
        pkl(spec(load_type("dict"), lst(P.BINFLOAT + b"\x3f\xf0" + b"\x00" * 6), [LEAF])),
        "key that is a float",
    ),
    (
        "duplicate key",
        pkl(spec(load_type("dict"), lst(u("a"), u("a")), [LEAF, LEAF])),
        "repeats the key",
    ),
    ("dict context None", pkl(spec(load_type("dict"), P.NONE, [LEAF])), "not a list"),
    ("leaf with children", pkl(spec(P.NONE, P.NONE, [LEAF])), "leaf spec at <root> has children"),
    (
        "child not a spec",
        pkl(spec(load_type("list"), P.NONE, [u("x")])),
        "is a str, not a TreeSpec",
    ),
    (
        "children not a list",
        pkl(
            g("torch.utils._pytree", "TreeSpec")
            + P.EMPTY_TUPLE
            + P.NEWOBJ
            + P.EMPTY_DICT
            + P.MARK
            + u("type")
            + load_type("list")
            + u("context")
            + P.NONE
            + u("children_specs")
            + u("x")
            + P.SETITEMS
            + P.BUILD
        ),
        "children_specs at <root> is a str",
    ),
    ("type not a container", pkl(spec(load_type("NoneType"), P.NONE, [])), "builtins.NoneType"),
    (
        "namedtuple without class",
        pkl(spec(g("collections", "namedtuple"), P.NONE, [LEAF])),
        "as its class",
    ),
    (
        "namedtuple field count",
        pkl(
            spec(
                g("collections", "namedtuple"),
                call(g("dill._dill", "_create_namedtuple"), u("NT"), u("a") + P.TUPLE1, u("m")),
                [LEAF, LEAF],
            )
        ),
        "1 fields but 2 children",
    ),
    (
        "namedtuple bad name",
        pkl(call(g("dill._dill", "_create_namedtuple"), u("N T"), P.EMPTY_TUPLE, u("m"))),
        "not identifiers",
    ),
    (
        "state without type",
        pkl(
            g("torch.utils._pytree", "TreeSpec") + P.EMPTY_TUPLE + P.NEWOBJ + P.EMPTY_DICT + P.BUILD
        ),
        "no 'type'",
    ),
    (
        "state is a str",
        pkl(g("torch.utils._pytree", "TreeSpec") + P.EMPTY_TUPLE + P.NEWOBJ + u("x") + P.BUILD),
        "not a dict",
    ),
    (
        "built twice",
        pkl(spec(P.NONE, P.NONE, [], "LeafSpec") + P.EMPTY_DICT + P.BUILD),
        "built twice",
    ),
    ("BUILD on a list", pkl(P.EMPTY_LIST + P.EMPTY_DICT + P.BUILD), "BUILD on a list"),
    (
        "NEWOBJ with args",
        pkl(g("torch.utils._pytree", "TreeSpec") + u("a") + P.TUPLE1 + P.NEWOBJ),
        "with arguments",
    ),
    ("REDUCE of a str", pkl(u("a") + P.EMPTY_TUPLE + P.REDUCE), "REDUCE calls a str"),
    ("wrong arity", pkl(call(g("dill._dill", "_load_type"))), "called with 0 arguments"),
    ("unknown opcode", b"\x80\x04\xff.", "KeyError"),
    ("bad protocol", b"\x80\x09.", "unsupported pickle protocol"),
    ("memo miss", pkl(P.BINGET + b"\x07"), "Memo value not found"),
    ("memo at a negative index", pkl(P.NONE + P.PUT + b"0\n" + P.GET + b"-1\n"), "index -1"),
    ("memo out of order", pkl(P.NONE + P.BINPUT + b"\x05"), "memo index 5 out of order"),
    ("memo far out of order", pkl(P.NONE + P.LONG_BINPUT + b"\xff" * 4), "out of order"),
    ("STOP missing", pkl(LEAF)[:-1], "truncated"),
    ("out-of-band buffer", pkl(P.NEXT_BUFFER), "out-of-band"),
]


def _self_cycle() -> bytes:
    return pkl(
        g("torch.utils._pytree", "TreeSpec")
        + P.EMPTY_TUPLE
        + P.NEWOBJ
        + P.BINPUT
        + b"\x00"
        + P.EMPTY_DICT
        + P.MARK
        + u("type")
        + load_type("list")
        + u("context")
        + P.NONE
        + u("children_specs")
        + lst(P.BINGET + b"\x00")
        + P.SETITEMS
        + P.BUILD
    )


CORRUPT_CASES.append(("self cycle", _self_cycle(), "contains itself"))


def _built_then_got(what: str) -> bytes:
    """A leaf whose state dict (memo 0) and children list (memo 1) are memoised, built, and then
    one of them fetched again: no writer does this (an instance's own state), and the unpickler
    has let go of them (``SpecUnpickler._let_go_of``)."""
    state = u("type") + P.NONE + u("context") + P.NONE + u("children_specs") + P.EMPTY_LIST
    leaf = (
        g("torch.utils._pytree", "LeafSpec")
        + P.EMPTY_TUPLE
        + P.NEWOBJ
        + P.EMPTY_DICT
        + P.MEMOIZE
        + P.MARK
        + state
        + P.MEMOIZE
        + P.SETITEMS
        + P.BUILD
    )
    return pkl(leaf + P.BINGET + (b"\x00" if what == "state" else b"\x01"))


CORRUPT_CASES += [
    ("a built state fetched again", _built_then_got("state"), "memo index 0 is a TreeSpec state"),
    ("a built leaf's list fetched again", _built_then_got("list"), "memo index 1 is a TreeSpec"),
]


@pytest.mark.parametrize(
    ("case_id", "data", "reason"), CORRUPT_CASES, ids=[c[0] for c in CORRUPT_CASES]
)
def test_malformed_pickles_are_corrupt_with_one_line(
    case_id: str, data: bytes, reason: str
) -> None:
    with pytest.raises(CorruptCheckpointError) as exc:
        decode_spec(data, path="bad.mdl")
    text = one_line(exc)
    assert text.startswith("bad.mdl: legacy __spec__ is not a readable pickle ("), text
    assert reason in text, text


def test_every_truncation_of_a1_is_corrupt() -> None:
    for n in range(len(A1)):
        with pytest.raises(CorruptCheckpointError) as exc:
            decode_spec(A1[:n])
        one_line(exc)


def test_random_garbage_and_mutations_only_raise_checkpoint_errors() -> None:
    rng = random.Random(20240611)
    samples = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 120))) for _ in range(400)]
    for _ in range(1500):
        data = bytearray(A1 if rng.random() < 0.7 else TORCH24)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        samples.append(bytes(data))
    for data in samples:
        try:
            decode_spec(data)
        except (CorruptCheckpointError, UnsafeContentError, UnsupportedContentError) as exc:
            assert "\n" not in str(exc)


def test_a_memo_bomb_is_stopped_by_the_node_budget() -> None:
    assert len(_bomb(60)) < 8_000  # would expand to 2**61 nodes
    with pytest.raises(CorruptCheckpointError, match="more than 1,000,000 nodes"):
        decode_spec(_bomb(60))
    assert len(names(decode_spec(_bomb(8)))) == 2**8  # shared records are fine when small


def _nested(depth: int) -> bytes:
    body = LEAF
    for _ in range(depth):
        body = spec(load_type("dict"), lst(u("a")), [body])
    return pkl(body)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 3000])
def test_deep_nesting_is_stopped_by_the_depth_budget(depth: int) -> None:
    """Past what the real library reads back: unsupported, not damaged (``budgets``)."""
    with pytest.raises(UnsupportedContentError, match="nested more than 494 containers deep"):
        decode_spec(_nested(depth))
    assert names(decode_spec(_nested(MAX_DEPTH))) == [".".join(["a"] * MAX_DEPTH)]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("zz", "not hex text"),
        ("abc", "not hex text"),
        ("", "is empty"),
        ("   \n", "is empty"),
        ("80 04 95".encode("utf-16"), "not hex text"),
        (b"\xff\xfe", "non-ASCII"),
    ],
)
def test_invalid_hex_is_corrupt(text: str | bytes, problem: str) -> None:
    with pytest.raises(CorruptCheckpointError) as exc:
        decode_spec_hex(text, path="h.mdl")
    assert problem in one_line(exc)
    with pytest.raises(CorruptCheckpointError):
        spec_bytes_from_hex(text)


# --------------------------------------------------------------------------- round trips


def _trees() -> dict[str, Node]:
    big = DictNode([(f"layer_{i:05d}.attention.weight_{'x' * 20}", leaf()) for i in range(2500)])
    deep: Node = leaf()
    for i in range(60):
        deep = DictNode([(f"d{i % 3}", deep)]) if i % 2 else SeqNode("list", [deep, leaf()])
    point = ("Point", ("x", "y"))
    return {
        "a1": decode_spec(A1),
        "root leaf": leaf(),
        "root empty dict": DictNode([]),
        "empty containers": DictNode(
            [
                ("d", DictNode([])),
                ("o", DictNode([], ordered=True)),
                ("l", SeqNode("list")),
                ("t", SeqNode("tuple")),
                ("s", SeqNode("set")),
                ("n", NamedTupleNode("Empty", (), [])),
            ]
        ),
        "int keys": DictNode(
            [
                (0, leaf()),
                (1, DictNode([(2, leaf())])),
                ("1", leaf()),
                (-5, leaf()),
                (2**70, leaf()),
            ]
        ),
        "bool key": DictNode([(True, leaf()), ("False", leaf())]),
        "ordered": DictNode(
            [("model", DictNode([("a.w", leaf()), ("a.b", leaf())], ordered=True)), ("x", leaf())],
            ordered=True,
        ),
        "namedtuples": SeqNode(
            "tuple",
            [
                NamedTupleNode(*point, [leaf(), DictNode([("k", leaf())])]),
                NamedTupleNode(*point, [SeqNode("set", [leaf()]), leaf()]),
                NamedTupleNode("Point", ("x", "y", "z"), [leaf(), leaf(), leaf()]),
            ],
        ),
        "strings": DictNode(
            [
                ("ünïcode ✓", leaf()),
                ("k" * 300, leaf()),
                ("a/b", leaf()),
                ("type", leaf()),
                ("", leaf()),
            ]
        ),
        "dotted collision": DictNode(
            [("a.b", DictNode([("c", leaf())])), ("a", DictNode([("b.c", leaf())]))]
        ),
        "big": DictNode([("model", big), ("optimizer", SeqNode("list", [big]))]),
        "deep": deep,
    }


TREES = _trees()


@pytest.mark.parametrize("style", ["plain", "dataclass"])
@pytest.mark.parametrize("tree_id", list(TREES))
def test_round_trip(tree_id: str, style: str) -> None:
    tree = TREES[tree_id]
    data = encode_spec(tree, style)
    assert data[:2] == b"\x80\x04" and data[2:3] == P.FRAME
    info = decode_spec_info(data)
    assert structure_equal(info.root, tree)
    assert names(info.root) == names(tree)
    assert (info.style, info.protocol) == (style, 4)
    assert encode_spec(info.root, style) == data  # stable


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 5])
def test_round_trip_other_protocols(protocol: int) -> None:
    tree = TREES["namedtuples"]
    for style in ("plain", "dataclass"):
        data = encode_spec(tree, style, protocol=protocol)
        ops = {op.name for op, _, _ in pickletools.genops(data)}
        if protocol < 4:
            assert "GLOBAL" in ops and "STACK_GLOBAL" not in ops
        if protocol < 2:
            assert b"copy_reg\n_reconstructor" in data and b"__builtin__\nobject" in data
        info = decode_spec_info(data)
        assert structure_equal(info.root, tree) and names(info.root) == names(tree)
        assert info.protocol == (protocol if protocol >= 2 else 0)


def test_big_spec_uses_several_frames_and_batches() -> None:
    data = encode_spec(TREES["big"], "dataclass")
    ops = [op.name for op, _, _ in pickletools.genops(data)]
    assert ops.count("FRAME") > 1 and len(data) > 2 * 64 * 1024
    assert ops.count("APPENDS") > 4  # stock batching: at most 1000 items per APPENDS


class _CaptureSpec:
    """Filled by BUILD through ``__dict__``, like the torch classes."""


class _CaptureLeaf(_CaptureSpec):
    pass


class _CapturingUnpickler(pickle.Unpickler):
    """Reads our own output with stand-ins that keep the raw state (trusted input only)."""

    def find_class(self, module: str, name: str) -> Any:
        table = {
            ("torch.utils._pytree", "TreeSpec"): _CaptureSpec,
            ("torch.utils._pytree", "LeafSpec"): _CaptureLeaf,
            ("dill._dill", "_load_type"): {
                "dict": dict,
                "list": list,
                "tuple": tuple,
                "set": set,
            }.get,
            ("dill._dill", "_create_namedtuple"): lambda n, f, m, d=None: collections.namedtuple(
                n, f, module=m
            ),
            ("collections", "OrderedDict"): collections.OrderedDict,
            ("collections", "namedtuple"): collections.namedtuple,
        }
        return table[(module, name)]


def _check_counts(s: _CaptureSpec, style: str) -> tuple[int, int]:
    keys = list(vars(s))
    if style == "plain":
        assert keys == ["type", "context", "children_specs", "num_leaves"]
    else:
        assert keys == [
            "type",
            "context",
            "children_specs",
            "num_nodes",
            "num_leaves",
            "num_children",
        ]
    if s.type is None:
        assert isinstance(s, _CaptureLeaf) and s.context is None and s.children_specs == []
        nodes, leaves = 1, 1
    else:
        nodes, leaves = 1, 0
        for child in s.children_specs:
            n, lv = _check_counts(child, style)
            nodes, leaves = nodes + n, leaves + lv
    assert s.num_leaves == leaves
    if style == "dataclass":
        assert (s.num_nodes, s.num_children) == (nodes, len(s.children_specs))
    return nodes, leaves


@pytest.mark.parametrize("style", ["plain", "dataclass"])
def test_state_keys_and_counts(style: str) -> None:
    for tree in TREES.values():
        spec_obj = _CapturingUnpickler(io.BytesIO(encode_spec(tree, style))).load()
        _check_counts(spec_obj, style)
    data = encode_spec(TREES["a1"], style)
    leafspecs = data.count(b"LeafSpec")
    assert leafspecs == 1  # the class is memoised either way
    newobjs = [op.name for op, _, _ in pickletools.genops(data)].count("NEWOBJ")
    assert newobjs == (7 + 6 if style == "plain" else 7 + 1)  # 7 containers; leaves shared in 2.4


def test_encoder_refuses_what_torch_could_not_have_written() -> None:
    with pytest.raises(UnsupportedContentError, match=r"key 1\.5"):
        encode_spec(DictNode([(1.5, leaf())]))  # type: ignore[list-item]
    with pytest.raises(UnsupportedContentError, match="repeats a key"):
        encode_spec(DictNode([("a", leaf()), ("a", leaf())]))
    with pytest.raises(UnsupportedContentError, match="2 fields but 1 items"):
        encode_spec(NamedTupleNode("P", ("x", "y"), [leaf()]))
    with pytest.raises(UnsupportedContentError, match="namedtuple"):
        encode_spec(NamedTupleNode("P", ("_x",), [leaf()]))
    with pytest.raises(UnsupportedContentError):
        encode_spec(SeqNode("deque", [leaf()]))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        encode_spec(leaf(), "slots")
    # Any leaf kind becomes a LeafSpec.
    assert names(decode_spec(encode_spec(DictNode([("v", ValueLeaf(3))])))) == ["v"]


# --------------------------------------------------------------------------- property test

_IDENT = st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True).filter(
    lambda s: not __import__("keyword").iskeyword(s)
)
_KEYS = st.one_of(st.text(max_size=6), st.integers(-(10**20), 10**20))


def _extend(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    dicts = st.builds(
        DictNode,
        st.lists(st.tuples(_KEYS, children), max_size=4, unique_by=lambda kv: kv[0]),
        st.booleans(),
    )
    seqs = st.builds(
        SeqNode, st.sampled_from(["list", "tuple", "set"]), st.lists(children, max_size=4)
    )
    named = st.lists(children, max_size=4).flatmap(
        lambda items: st.builds(
            NamedTupleNode,
            st.from_regex(r"[A-Z][A-Za-z0-9]{0,5}", fullmatch=True),
            st.lists(_IDENT, min_size=len(items), max_size=len(items), unique=True).map(tuple),
            st.just(items),
        )
    )
    return st.one_of(dicts, seqs, named)


_TREES_ST = st.recursive(st.builds(MissingLeaf, st.just("")), _extend, max_leaves=25)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=_TREES_ST, style=st.sampled_from(["plain", "dataclass"]))
def test_property_round_trip(tree: Node, style: str) -> None:
    info = decode_spec_info(encode_spec(tree, style))
    assert structure_equal(info.root, tree)
    assert names(info.root) == names(tree)
    assert info.style == style


# --------------------------------------------------------------------------- real dill / torch


def _need(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"interop check needs {module} ({exc})")


# Objects for the real-dill byte-exactness check; run both here and in a clean subprocess.
_OBJECTS_SRC = textwrap.dedent(
    """
    import collections
    OD = collections.OrderedDict
    Pair = collections.namedtuple("Pair", ["first", "second"], module="__main__")
    Hp = collections.namedtuple("Hp", ["lr", "betas", "eps"], module="__main__")
    OBJECTS = {
        "a1": {
            "model": {"w": 0, "b": 1},
            "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
            "global_step": 10,
        },
        "mixed": {
            "m": OD(w=1, b=2), "t": (1, [2, 3]), "n": Pair(4, (5, 6)), "h": Hp(1, (2, 3), 4),
            "p": Pair(7, 8), "e": {}, "l": [], 0: 7, 3: {"exp_avg": 1, "step": 2},
        },
        "big": {
            "model": OD((f"layer{i}.w" + "x" * 20, i) for i in range(3000)),
            "opt": {"state": {i: {"exp_avg": 0, "exp_avg_sq": 0} for i in range(1200)}},
        },
        "root_leaf": 5,
    }
    """
)

# A stand-in for torch's _pytree with the TreeSpec data layout of torch <= 2.0 ("plain") and of
# torch 2.4 ("dataclass": six fields, one shared LeafSpec), for ``dill.dumps`` in a subprocess.
_FAKE_PYTREE_SRC = textwrap.dedent(
    """
    import collections

    class TreeSpec:
        def __init__(self, type, context, children_specs, style):
            self.type = type
            self.context = context
            self.children_specs = children_specs
            if style == "dataclass":
                self.num_nodes = 1 + sum(c.num_nodes for c in children_specs)
                self.num_leaves = sum(c.num_leaves for c in children_specs)
                self.num_children = len(children_specs)
            else:
                self.num_leaves = sum(c.num_leaves for c in children_specs)

    class LeafSpec(TreeSpec):
        def __init__(self, style):
            super().__init__(None, None, [], style)
            if style == "dataclass":
                self.num_nodes, self.num_leaves, self.num_children = 1, 1, 0
            else:
                self.num_leaves = 1

    def flatten(obj, style, shared=None):
        if type(obj) in (dict, collections.OrderedDict):
            kids = [flatten(v, style, shared) for v in obj.values()]
            return TreeSpec(type(obj), list(obj.keys()), kids, style)
        if type(obj) in (list, tuple):
            return TreeSpec(type(obj), None, [flatten(v, style, shared) for v in obj], style)
        if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
            kids = [flatten(v, style, shared) for v in obj]
            return TreeSpec(collections.namedtuple, type(obj), kids, style)
        if style == "dataclass":
            return shared
        return LeafSpec(style)
    """
)

_DUMP_SRC = textwrap.dedent(
    """
    import json, sys
    import dill
    import torch.utils._pytree as fake
    exec(sys.argv[1])
    out = {}
    for name, obj in OBJECTS.items():
        for style in ("plain", "dataclass"):
            spec = fake.flatten(obj, style, fake.LeafSpec("dataclass"))
            out[f"{name}/{style}"] = dill.dumps(spec).hex()
    print(json.dumps({"dill": dill.__version__, "dumps": out}))
    """
)


def _objects() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(_OBJECTS_SRC, namespace)
    return namespace["OBJECTS"]


def test_encoder_matches_real_dill_byte_for_byte(tmp_path: Path) -> None:
    _need("dill")
    pkg = tmp_path / "torch" / "utils"
    pkg.mkdir(parents=True)
    (tmp_path / "torch" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "_pytree.py").write_text(_FAKE_PYTREE_SRC)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", _DUMP_SRC, _OBJECTS_SRC],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["dumps"]["a1/plain"] == A1_HEX  # the fake reproduces FORMAT_EXAMPLES A.1
    for name, obj in _objects().items():
        tree = py_to_tree(obj)
        for style in ("plain", "dataclass"):
            expected = result["dumps"][f"{name}/{style}"]
            ours = encode_spec_hex(tree, style)
            assert ours == expected, (name, style, f"dill {result['dill']}")


class _Torch24Spec:
    """The data layout a pickled torch TreeSpec has; BUILD fills ``__dict__``."""


class _Torch24Leaf(_Torch24Spec):
    pass


def _to_real_spec(pt: Any, s: _Torch24Spec) -> Any:
    if s.type is None:
        return pt.treespec_leaf() if hasattr(pt, "treespec_leaf") else pt.LeafSpec()
    return pt.TreeSpec(s.type, s.context, [_to_real_spec(pt, c) for c in s.children_specs])


def _numbered(obj: Any, counter: list[int]) -> Any:
    """``obj`` with its leaves replaced by 0, 1, 2, ... in flatten order."""
    if type(obj) in (dict, collections.OrderedDict):
        return type(obj)((k, _numbered(v, counter)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(_numbered(v, counter) for v in obj)
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        return type(obj)(*(_numbered(v, counter) for v in obj))
    counter[0] += 1
    return counter[0] - 1


def _same(actual: Any, expected: Any) -> None:
    if isinstance(expected, tuple) and hasattr(type(expected), "_fields"):
        assert type(actual).__name__ == type(expected).__name__
        assert type(actual)._fields == type(expected)._fields
        assert type(actual).__bases__ == (tuple,)
    else:
        assert type(actual) is type(expected)
    if isinstance(expected, dict):
        assert list(actual) == list(expected)
        for k in expected:
            _same(actual[k], expected[k])
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            _same(a, e)
    else:
        assert actual == expected


@pytest.mark.parametrize("style", ["plain", "dataclass"])
def test_real_dill_loads_our_bytes_and_torch_unflattens(style: str) -> None:
    dill = _need("dill")
    pt = _need("torch.utils._pytree")

    class Loader(dill.Unpickler):  # type: ignore[misc,name-defined]
        # torch >= 2.5 made TreeSpec a slots dataclass whose __setstate__ takes a list, so it
        # cannot load any torch <= 2.4 spec pickle (not even a genuine one). The two classes are
        # swapped for the 2.4 data layout; everything else is real dill. The spec is then rebuilt
        # as a real TreeSpec and unflattened by real torch.
        def find_class(self, module: str, name: str) -> Any:
            if module == "torch.utils._pytree":
                return {"TreeSpec": _Torch24Spec, "LeafSpec": _Torch24Leaf}[name]
            return super().find_class(module, name)

    for name, obj in _objects().items():
        data = encode_spec(py_to_tree(obj), style)
        loaded = Loader(io.BytesIO(data)).load()
        real = _to_real_spec(pt, loaded)
        expected = _numbered(obj, [0])
        count = real.num_leaves
        assert count == len(pt.tree_flatten(expected)[0]), name
        _same(pt.tree_unflatten(list(range(count)), real), expected)


def test_real_torch_spec_pickles_decode() -> None:
    dill = _need("dill")
    pt = _need("torch.utils._pytree")
    for name, obj in _objects().items():
        leaves, spec_ = pt.tree_flatten(obj)
        info = decode_spec_info(dill.dumps(spec_))
        assert structure_equal(info.root, py_to_tree(obj)), name
        assert names(info.root) == _recurse_spec(spec_), name
        assert len(names(info.root)) == len(leaves)


def _recurse_spec(spec_: Any, scope: tuple[str, ...] = ()) -> list[str]:
    """FORMAT.md §2.2 applied to a real torch TreeSpec (names by context, else by position)."""
    if spec_.num_leaves == 0:
        return []
    children = (
        spec_.children() if callable(getattr(spec_, "children", None)) else spec_.children_specs
    )
    context = spec_.context
    if context:
        if isinstance(context, type) and issubclass(context, tuple) and hasattr(context, "_fields"):
            context = range(len(context._fields))
        out: list[str] = []
        for key, child in zip(context, children, strict=False):
            out += _recurse_spec(child, (*scope, str(key)))
        return out
    if not children:
        return [".".join(scope)]
    out = []
    for i, child in enumerate(children):
        out += _recurse_spec(child, (*scope, str(i)))
    return out


def test_real_torch_deque_and_defaultdict_are_unsupported() -> None:
    dill = _need("dill")
    pt = _need("torch.utils._pytree")
    for obj, what in (
        ({"q": collections.deque([1, 2])}, "collections.deque"),
        ({"d": collections.defaultdict(list, a=1)}, "collections.defaultdict"),
    ):
        data = dill.dumps(pt.tree_flatten(obj)[1])
        with pytest.raises(UnsupportedContentError, match=what):
            decode_spec(data)


def test_real_dill_namedtuple_with_changed_qualname_decodes() -> None:
    dill = _need("dill")
    pt = _need("torch.utils._pytree")
    nt = collections.namedtuple("NT", ["a", "b"])
    nt.__qualname__ = "Outer.NT"
    data = dill.dumps(pt.tree_flatten({"x": nt(1, 2)})[1])
    assert b"setattr" in data
    root = decode_spec(data)
    assert names(root) == ["x.0", "x.1"]


def test_any_checkpoint_error_is_one_line() -> None:
    for data in (b"\x80\x04", pkl(call(g("os", "system"), u("x")))):
        with pytest.raises(CkptError) as exc:
            decode_spec(data)
        one_line(exc)


def _json_reference(node):
    """The ``__spec__`` document built as dictionaries and written by ``json.dumps`` (the
    writer's former way), the oracle for the piece-by-piece writer."""
    from ckpt_migrate.format.tree import DictNode, is_leaf

    def spec(n):
        if is_leaf(n):
            return {"type": None, "context": None, "children_spec": []}
        if isinstance(n, DictNode):
            kind = "collections.OrderedDict" if n.ordered else "builtins.dict"
            return {
                "type": kind,
                "context": json.dumps(n.keys()),
                "children_spec": [spec(v) for _, v in n.items],
            }
        return {
            "type": f"builtins.{n.kind}",
            "context": "null",
            "children_spec": [spec(v) for v in n.items],
        }

    def shape(n):
        if is_leaf(n):
            return "*"
        if isinstance(n, DictNode):
            return {k: shape(v) for k, v in n.items}
        if n.kind == "set":
            raise TypeError
        return [shape(v) for v in n.items]

    try:
        structure = shape(node)
    except TypeError:
        structure = None
    return json.dumps([structure, json.dumps([1, spec(node)])], indent=4)


def test_the_spec_is_written_as_json_dumps_writes_it():
    from ckpt_migrate.format.tree import DictNode, SeqNode, ValueLeaf
    from ckpt_migrate.format.v05 import treespec

    leaf = ValueLeaf(1)
    trees = [
        leaf,
        DictNode([]),
        SeqNode("list", []),
        DictNode(
            [
                ('é"\n\\', leaf),
                (3, SeqNode("tuple", [leaf, DictNode([])])),
                ("x", SeqNode("list", [SeqNode("list", []), leaf])),
            ],
            ordered=True,
        ),
        DictNode([("s", SeqNode("set", [leaf])), ("t", leaf)]),
        SeqNode("tuple", [DictNode([("a", leaf), (0, leaf)])]),
    ]
    for tree in trees:
        assert treespec.root_spec_text(tree) == _json_reference(tree)


def test_the_spec_written_in_chunks_is_the_same_text(monkeypatch):
    """The pieces joined every few (``SPILL_EVERY``), the treespec escaped chunk by chunk:
    the text is still ``json.dumps``'s, wherever a chunk ends (an escape, a non-ASCII key)."""
    from ckpt_migrate.format.tree import DictNode, SeqNode, ValueLeaf
    from ckpt_migrate.format.v05 import treespec

    leaf = ValueLeaf(1)
    keys = ['é"\n\\', "plain.name", "ü\U0001f600", 'q"', "-", ""]
    tree = DictNode(
        [
            (f"{k}{i}" if i % 2 else k * (i + 1), SeqNode("list", [leaf, DictNode([(i, leaf)])]))
            for i, k in enumerate(keys * 5)
        ]
    )
    expected = _json_reference(tree)
    for every in (1, 2, 3, 7, 4096):
        monkeypatch.setattr(treespec, "SPILL_EVERY", every)
        assert treespec.root_spec_text(tree) == expected
        assert treespec.dumps(tree) == json.dumps([1, json.loads(json.loads(expected)[1])[1]])


def test_the_spec_of_a_wide_dict_holds_little_beside_its_text():
    """A dict's keys go into the spec's context a key at a time, and the pieces are joined as
    they come, not at the end of the dict: the key list's two JSON encodings and their copy
    were held at once, and every piece of a 150k-item dict (45 MB of an import's peak, issue
    33)."""
    import tracemalloc

    from ckpt_migrate.format.tree import DictNode, ValueLeaf
    from ckpt_migrate.format.v05 import treespec

    tree = DictNode([(f"model.layers.{i}.mlp.weight", ValueLeaf(1)) for i in range(20_000)])
    tracemalloc.start()
    try:
        text = treespec.root_spec_bytes(tree)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert text.decode() == _json_reference(tree)
    beside = peak - len(text)
    assert beside < len(text) // 4, (
        f"{beside / 2**20:.1f} MiB beside a {len(text) / 2**20:.1f} MiB text"
    )


def test_a_legacy_spec_is_read_from_the_file_not_through_h5py(tmp_path, monkeypatch):
    """A legacy root's ``__spec__`` (a variable-length string) is read by ``attrtable``:
    through h5py, HDF5's metadata cache kept the heap collection it came from for the rest of
    the read (60 MiB at 150k tensors, issue 33). One stored otherwise (a fixed-length string)
    is read by h5py as before, to the same tree; and the unpickler keeps no memo after it."""
    import h5py
    import numpy as np
    from conftest import MODELS

    from ckpt_migrate.format.legacy import read as legacy_read
    from ckpt_migrate.format.legacy.spec_unpickler import SpecUnpickler
    from ckpt_migrate.format.read import read_checkpoint
    from ckpt_migrate.format.tree import iter_leaves

    src = MODELS / "gpt2-1.9" / "checkpoint_100.mdl"
    with read_checkpoint(src) as ckpt:
        want = [(r.name, type(r.leaf).__name__) for r in iter_leaves(ckpt.root)]
    fixed = tmp_path / "fixed.mdl"
    fixed.write_bytes(src.read_bytes())
    with h5py.File(fixed, "r+") as f:
        text = f.attrs["__spec__"]
        del f.attrs["__spec__"]
        f.attrs["__spec__"] = np.bytes_(text.encode())  # a fixed-length string

    through_h5py: list[str] = []
    real_text = legacy_read.attr_text
    monkeypatch.setattr(legacy_read, "attr_text", lambda v: through_h5py.append(1) or real_text(v))
    memos: list[Any] = []
    real_load = SpecUnpickler.load
    monkeypatch.setattr(
        SpecUnpickler, "load", lambda self: (real_load(self), memos.append(self.memo))[0]
    )
    for path, by_h5py in ((src, 0), (fixed, 1)):
        with read_checkpoint(path) as ckpt:
            assert [(r.name, type(r.leaf).__name__) for r in iter_leaves(ckpt.root)] == want
        assert len(through_h5py) == by_h5py, path
    assert memos and all(m == [] for m in memos)


def _legacy_specs() -> dict[str, bytes]:
    """The legacy specs the real libraries wrote: the torch 2.4 + dill 0.3.8 pickle,
    FORMAT_EXAMPLES A.1, and that of every legacy file in ``fixtures/``."""
    import h5py
    from conftest import FIXTURES

    specs = {"torch 2.4": TORCH24, "A.1": A1}
    for path in sorted(FIXTURES.glob("**/*.mdl")):
        with h5py.File(path, "r") as f:
            if "__spec__" in f.attrs and not str(f.attrs["__spec__"]).lstrip().startswith("["):
                specs[path.relative_to(FIXTURES).as_posix()] = bytes.fromhex(
                    str(f.attrs["__spec__"]).strip()
                )
    assert len(specs) >= 12, sorted(specs)
    return specs


def test_the_list_memo_decodes_every_spec_as_pickles_own_memo_does():
    """The unpickler's memo is a list (``SpecUnpickler.load``); with pickle's own dictionary
    and its stock handlers in its place, every spec decodes to the same tree: the real torch
    2.4 + dill 0.3.8 pickle, FORMAT_EXAMPLES A.1, and the spec of every legacy file in
    ``fixtures/`` (releases 1.7 to 2.3, the four model families' 1.9 and 2.0 files)."""

    from ckpt_migrate.format import compare
    from ckpt_migrate.format.legacy import spec_decode
    from ckpt_migrate.format.legacy.spec_unpickler import SpecUnpickler

    # (and pickle's own BUILD: nothing is let go of from the memo, ``_let_go_of``)
    stock_ops = (P.MEMOIZE, P.PUT, P.BINPUT, P.LONG_BINPUT, P.GET, P.BINGET, P.LONG_BINGET, P.BUILD)

    class DictMemo(SpecUnpickler):
        dispatch = {  # noqa: RUF012 (the table pickle's load reads)
            **SpecUnpickler.dispatch,
            **{op[0]: pickle._Unpickler.dispatch[op[0]] for op in stock_ops},
        }

        def load(self):
            self.memo = {}
            loaded.append(self)
            return pickle._Unpickler.load(self)

    loaded: list[DictMemo] = []

    specs = _legacy_specs()
    for name, data in specs.items():
        ours = decode_spec_info(data)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(spec_decode, "SpecUnpickler", DictMemo)
            stock = decode_spec_info(data)
        assert compare.signature(ours.root) == compare.signature(stock.root), name
        assert names(ours.root) == names(stock.root), name
        assert (ours.protocol, ours.style) == (stock.protocol, stock.style), name
    assert len(loaded) == len(specs) and all(u.memo for u in loaded)  # (pickle's dict, used)


def test_the_memo_lets_go_of_each_leafs_state_once_it_is_built():
    """A leaf's state and its empty children list are let go of by the memo as ``BUILD`` uses
    them (``SpecUnpickler._let_go_of``): at 150k tensors they were 50 of the 90 MiB a 1.9
    spec's memo held until the end of the load (issue 33). Both styles of spec, with 300 leaves:
    at ``STOP`` the memo holds no leaf's state and no empty list, and the tree is whole."""

    at_stop: list[Any] = []
    Watching = _watching(at_stop)
    tree = DictNode([(f"w{i}", DictNode([("a", leaf()), ("b", leaf())])) for i in range(150)])
    for style in ("plain", "dataclass"):
        at_stop.clear()
        root = Watching(io.BytesIO(encode_spec(tree, style))).load()
        assert len(at_stop) > 300, style
        states = [o for o in at_stop if type(o) is dict]
        assert len(states) <= 151, (style, len(states))  # the containers' states at most
        assert not any(type(o) is list and not o for o in at_stop), style
        with pytest.MonkeyPatch.context() as m:
            from ckpt_migrate.format.legacy import spec_decode

            m.setattr(spec_decode, "SpecUnpickler", Watching)
            assert names(decode_spec(encode_spec(tree, style))) == names(tree), style
        assert root.children and all(len(c.children) == 2 for c in root.children), style


def _watching(at_stop: list[Any]) -> type:
    """A ``SpecUnpickler`` that keeps, at ``STOP``, what its memo still holds."""
    from ckpt_migrate.format.legacy.spec_unpickler import SpecUnpickler

    class Watching(SpecUnpickler):
        def _stop(self: Any) -> None:
            at_stop.extend(self.memo)
            SpecUnpickler.dispatch[P.STOP[0]](self)

        dispatch = {**SpecUnpickler.dispatch, P.STOP[0]: _stop}  # noqa: RUF012

    return Watching


def test_the_memo_lets_go_of_the_leaf_states_the_real_writers_pickled():
    """The same on the specs the real libraries wrote (``_legacy_specs``: torch 2.4 + dill,
    FORMAT_EXAMPLES A.1, the legacy fixtures of releases 1.7 to 2.3 and the model families):
    at ``STOP`` the memo holds no more states than the tree has containers and no empty
    list but an empty dict's context; the watched decoding names the same leaves (pickle's
    own memo and ``BUILD`` give the same trees: the test above)."""
    at_stop: list[Any] = []
    Watching = _watching(at_stop)
    for name, data in _legacy_specs().items():
        at_stop.clear()
        Watching(io.BytesIO(data)).load()
        tree = decode_spec(data)
        containers = list(_containers(tree))
        assert sum(type(o) is dict for o in at_stop) <= len(containers), name
        # (an empty dict's context is an empty list, kept: only children lists are let go of)
        empty = sum(not c.items for c in containers)
        assert sum(type(o) is list and not o for o in at_stop) <= empty, name
        with pytest.MonkeyPatch.context() as m:
            from ckpt_migrate.format.legacy import spec_decode

            m.setattr(spec_decode, "SpecUnpickler", Watching)
            assert names(decode_spec(data)) == names(tree), name


def _containers(node: Node) -> Iterator[Node]:
    if isinstance(node, (DictNode, SeqNode, NamedTupleNode)):
        yield node
        for child in node.items:
            yield from _containers(child[1] if isinstance(node, DictNode) else child)
