"""Tests of the "cstorch-digest-v1" test helper (tests/digest.py), without the real library.

Expected hashes are computed here from known bytes with hashlib/struct, independently of the
helper. Where a reference case holds no random data (empty, emptyish, key_collision*,
scalars_misc, part of dtypes) the state dict is rebuilt by hand and must reproduce the
reference ``*.expected.json`` byte for byte.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from digest import (
    FIXTURES_DIR,
    FORMAT,
    canonical_json,
    diff_digests,
    digest,
    digest_json,
    load_expected,
)

TESTS_DIR = Path(__file__).resolve().parent


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def root(obj):
    return digest(obj)["root"]


def leaf(type_name, value):
    return {"kind": "leaf", "type": type_name, "value": value}


def tensor_node(dtype, shape, data: bytes, kind="tensor", **extra):
    return {"kind": kind, "dtype": dtype, "shape": list(shape), "sha256": sha(data), **extra}


def strip_hashes(node):
    """A copy of a digest node tree with every sha256 blanked (for structure-only checks)."""
    if isinstance(node, dict):
        return {k: ("-" if k == "sha256" else strip_hashes(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [strip_hashes(v) for v in node]
    return node


# --------------------------------------------------------------------------- tensors


def test_float32_tensor_bytes_and_node():
    t = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.float32)
    assert digest(t) == {
        "format": FORMAT,
        "root": tensor_node("float32", [2, 2], struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)),
    }


def test_bf16_hashed_as_its_16_bit_pattern():
    # 1.0, -2.0, quiet nan, smallest subnormal, -inf, -0.0, 1.25
    bits = [0x3F80, 0xC000, 0x7FC0, 0x0001, 0xFF80, 0x8000, 0x3FA0]
    signed = [b - 0x10000 if b >= 0x8000 else b for b in bits]
    t = torch.tensor(signed, dtype=torch.int16).view(torch.bfloat16)
    assert root(t) == tensor_node("bfloat16", [7], struct.pack("<7H", *bits))
    # The same bits from float values.
    t2 = torch.tensor([1.0, -2.0, 1.25], dtype=torch.bfloat16)
    assert root(t2)["sha256"] == sha(struct.pack("<3H", 0x3F80, 0xC000, 0x3FA0))


def test_bool_tensor_is_one_byte_per_element():
    t = torch.tensor([[True, False, True], [False, False, True]])
    assert root(t) == tensor_node("bool", [2, 3], bytes([1, 0, 1, 0, 0, 1]))
    assert root(torch.tensor(True)) == tensor_node("bool", [], b"\x01")


@pytest.mark.parametrize(
    ("dtype", "name", "values", "fmt"),
    [
        (torch.float16, "float16", [1.0, -0.5, 65504.0], "<3e"),
        (torch.float64, "float64", [0.1, -1e300, 2.5], "<3d"),
        (torch.int16, "int16", [-32768, 1, 32767], "<3h"),
        (torch.int32, "int32", [-(2**31), 7, 2**31 - 1], "<3i"),
        (torch.int64, "int64", [-(2**63), -7, 2**63 - 1], "<3q"),
        (torch.uint8, "uint8", [0, 128, 255], "<3B"),
        (torch.uint16, "uint16", [0, 0x8000, 0xFFFF], "<3H"),
        (torch.uint32, "uint32", [0, 2**31, 2**32 - 1], "<3I"),
        (torch.uint64, "uint64", [0, 1, 2**62], "<3Q"),
        (torch.int8, "int8", [-128, 0, 127], "<3b"),
    ],
)
def test_tensor_dtypes_little_endian(dtype, name, values, fmt):
    t = torch.tensor(values, dtype=dtype)
    assert root(t) == tensor_node(name, [3], struct.pack(fmt, *values))


def test_zero_d_and_empty_tensors():
    assert root(torch.tensor(3.5)) == tensor_node("float32", [], struct.pack("<f", 3.5))
    assert root(torch.tensor(-7)) == tensor_node("int64", [], struct.pack("<q", -7))
    assert root(torch.empty(0)) == tensor_node("float32", [0], b"")
    assert root(torch.empty(0, 3, dtype=torch.int64)) == tensor_node("int64", [0, 3], b"")
    assert root(torch.empty(2, 0, dtype=torch.bfloat16))["sha256"] == sha(b"")


def test_non_contiguous_tensor_hashed_row_major():
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert root(a.t()) == tensor_node("float32", [3, 2], struct.pack("<6f", 0, 3, 1, 4, 2, 5))
    assert root(a[:, 1]) == tensor_node("float32", [2], struct.pack("<2f", 1, 4))
    # expand (stride 0) materialises the repeated values
    e = torch.tensor([1, 2], dtype=torch.int32).expand(2, 2)
    assert root(e) == tensor_node("int32", [2, 2], struct.pack("<4i", 1, 2, 1, 2))


class _MyTensor(torch.Tensor):
    pass


def test_tensor_subclasses_and_parameters():
    data = torch.tensor([1.0, 2.0])
    expected = tensor_node("float32", [2], struct.pack("<2f", 1.0, 2.0))
    assert root(data.as_subclass(_MyTensor)) == expected
    assert root(torch.nn.Parameter(data.clone())) == expected  # requires_grad: detached
    bf = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.bfloat16), requires_grad=False)
    assert root(bf) == tensor_node("bfloat16", [1], struct.pack("<H", 0x3F80))


# --------------------------------------------------------------------------- ties


def test_ties_in_dicts_and_lists():
    w = torch.tensor([1.0, 2.0])
    x = torch.tensor([3.0])
    state = {
        "model": {"embed.weight": w, "lm_head.weight": w},
        "opt": {"state": {0: {"p": x}}},
        "copies": [w, x, (w,)],
        "not_tied": w.clone(),
    }
    r = root(state)
    model = r["items"][0][2]["items"]
    assert "tied_to" not in model[0][2]
    assert model[1][2]["tied_to"] == "model.embed.weight"
    assert "tied_to" not in r["items"][1][2]["items"][0][2]["items"][0][2]["items"][0][2]
    copies = r["items"][2][2]["items"]
    assert [c.get("tied_to") for c in copies[:2]] == ["model.embed.weight", "opt.state.0.p"]
    assert copies[2]["items"][0]["tied_to"] == "model.embed.weight"
    not_tied = r["items"][3][2]
    assert "tied_to" not in not_tied
    # A tie carries the full tensor node too.
    assert {k: v for k, v in copies[0].items() if k != "tied_to"} == model[0][2]
    assert not_tied["sha256"] == model[0][2]["sha256"]


def test_tie_first_met_inside_a_list_uses_positions():
    t = torch.zeros(2)
    r = root({"groups": [{"a": 1}, [None, t]], "again": t, "deep": {"x": [[t]]}})
    assert r["items"][1][2]["tied_to"] == "groups.1.1"
    assert r["items"][2][2]["items"][0][2]["items"][0]["items"][0]["tied_to"] == "groups.1.1"
    # at the root
    assert root([t, t])["items"][1]["tied_to"] == "0"


def test_tied_path_format_matches_reference_file():
    # Rebuild the structure of the reference "tied" case with our own data: everything but
    # the hashes must match tied.expected.json, including every tied_to path.
    emb = torch.randn(6, 4)
    x = torch.randn(3)
    state = {
        "model": {"embed.weight": emb, "lm_head.weight": emb, "x": x},
        "copies": [emb, x, emb],
        "not_tied": emb.clone(),
    }
    expected = load_expected("tied")
    assert strip_hashes(digest(state)) == strip_hashes(expected)
    ties = []

    def collect(node):
        if isinstance(node, dict):
            if "tied_to" in node:
                ties.append(node["tied_to"])
            for v in node.values():
                collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)

    collect(expected)
    assert ties == ["model.embed.weight", "model.embed.weight", "model.x", "model.embed.weight"]


def test_numpy_arrays_are_never_tied():
    a = np.arange(3)
    r = root({"a": a, "b": a})
    assert "tied_to" not in r["items"][1][2]


# --------------------------------------------------------------------------- containers


def test_dict_types_key_types_and_insertion_order():
    od = collections.OrderedDict([("z", 1), (5, "five"), ("a", None)])
    r = root({"od": od, 0: {}, "b": {"y": 1, "x": 2}})
    assert r == {
        "kind": "dict",
        "type": "dict",
        "items": [
            [
                "str",
                "od",
                {
                    "kind": "dict",
                    "type": "OrderedDict",
                    "items": [
                        ["str", "z", leaf("int", 1)],
                        ["int", 5, leaf("str", "five")],
                        ["str", "a", leaf("NoneType", None)],
                    ],
                },
            ],
            ["int", 0, {"kind": "dict", "type": "dict", "items": []}],
            [
                "str",
                "b",
                {
                    "kind": "dict",
                    "type": "dict",
                    "items": [["str", "y", leaf("int", 1)], ["str", "x", leaf("int", 2)]],
                },
            ],
        ],
    }


@pytest.mark.parametrize("bad_key", [1.5, (1, 2), True, b"k", None])
def test_unsupported_key_types_raise(bad_key):
    with pytest.raises(TypeError, match="key"):
        digest({"outer": {bad_key: 1}})


def test_lists_tuples_and_empty_containers():
    r = root({"l": [1, [2, ()]], "t": ("a", 2.5), "e": []})
    assert r["items"] == [
        [
            "str",
            "l",
            {
                "kind": "list",
                "items": [
                    leaf("int", 1),
                    {"kind": "list", "items": [leaf("int", 2), {"kind": "tuple", "items": []}]},
                ],
            },
        ],
        ["str", "t", {"kind": "tuple", "items": [leaf("str", "a"), leaf("float", "2.5")]}],
        ["str", "e", {"kind": "list", "items": []}],
    ]


def test_set_items_sorted_by_canonical_json():
    r = root({10, 9, 2})
    # canonical JSON order is textual: "...value": 10}" < "...2}" < "...9}"
    assert r == {
        "kind": "set",
        "type": "set",
        "items": [leaf("int", 10), leaf("int", 2), leaf("int", 9)],
    }
    mixed = root({"b", 1, None, 2.5})
    assert mixed["items"] == sorted(mixed["items"], key=canonical_json)
    assert canonical_json(leaf("int", 1)) == json.dumps(leaf("int", 1), sort_keys=True)
    assert root(frozenset())["type"] == "frozenset"


# --------------------------------------------------------------------------- leaves


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (float("nan"), "nan"),
        (-0.0, "-0.0"),
        (0.0, "0.0"),
        (float("inf"), "inf"),
        (float("-inf"), "-inf"),
        (0.1, "0.1"),
        (1e300, "1e+300"),
        (5e-324, "5e-324"),
    ],
)
def test_float_leaves_use_repr(value, text):
    assert root(value) == leaf("float", text)


def test_int_bool_str_none_leaves():
    big = 2**70 + 1
    assert root(big) == leaf("int", big)
    assert root(-(2**64)) == leaf("int", -(2**64))
    assert json.loads(digest_json(big))["root"]["value"] == big  # exact through JSON
    assert root(True) == leaf("bool", True)
    assert root(False) == leaf("bool", False)
    assert root(0) == leaf("int", 0)
    assert root("значение ✓") == leaf("str", "значение ✓")
    assert root(None) == leaf("NoneType", None)


def test_bytes_leaf_is_hex():
    assert root(b"\x00\x01abc") == leaf("bytes", "0001616263")
    assert root(b"") == leaf("bytes", "")


class _Thing:
    def __repr__(self):
        return "<thing>"


@pytest.mark.parametrize(
    ("obj", "type_name", "text"),
    [
        (_Thing(), f"{__name__}._Thing", "<thing>"),
        (complex(1, 2), "builtins.complex", "(1+2j)"),
        (bytearray(b"ab"), "builtins.bytearray", "bytearray(b'ab')"),
        (torch.float32, "torch.dtype", "torch.float32"),
    ],
)
def test_anything_else_is_a_generic_leaf(obj, type_name, text):
    assert root(obj) == {"kind": "leaf", "type": type_name, "repr": text}


# --------------------------------------------------------------------------- numpy


@pytest.mark.parametrize(
    ("obj", "type_name", "hex_"),
    [
        (np.float64(1.5), "numpy.float64", "000000000000f83f"),
        (np.float32(1.5), "numpy.float32", "0000c03f"),
        (np.bool_(True), "numpy.bool", "01"),
        (np.int64(-1), "numpy.int64", "ff" * 8),
    ],
)
def test_a_numpy_scalar_is_its_dtype_and_bytes(obj, type_name, hex_):
    """Not its repr: numpy 2 writes ``np.float32(1.5)`` where the real library's numpy 1.25
    wrote ``1.5``, and renamed ``bool_``."""
    assert root(obj) == {"kind": "leaf", "type": type_name, "hex": hex_}


def test_numpy_arrays():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert root(a) == tensor_node("float32", [2, 3], struct.pack("<6f", *range(6)), kind="ndarray")
    assert root(a.T) == tensor_node(
        "float32", [3, 2], struct.pack("<6f", 0, 3, 1, 4, 2, 5), kind="ndarray"
    )
    big_endian = np.array([1, -2], dtype=">i4")
    assert root(big_endian) == tensor_node("int32", [2], struct.pack("<2i", 1, -2), "ndarray")
    assert root(np.array([True, False])) == tensor_node("bool", [2], b"\x01\x00", "ndarray")
    assert root(np.array(7, dtype=np.int64)) == tensor_node(
        "int64", [], struct.pack("<q", 7), "ndarray"
    )
    assert root(np.zeros((0, 2), dtype=np.float64)) == tensor_node(
        "float64", [0, 2], b"", "ndarray"
    )
    with pytest.raises(TypeError):
        digest(np.array([object()]))


def test_numpy_only_state_dict_does_not_import_torch():
    code = (
        "import sys, numpy as np\n"
        f"sys.path.insert(0, {str(TESTS_DIR)!r})\n"
        "import digest\n"
        "d = digest.digest({'a': np.arange(3), 'b': [1.5, None]})\n"
        "assert d['root']['items'][0][2]['kind'] == 'ndarray', d\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- reference files


def test_digest_json_format():
    text = digest_json({"b": 1, "a": [0.5]})
    assert text == json.dumps(digest({"b": 1, "a": [0.5]}), indent=1, sort_keys=True)
    assert text.startswith('{\n "format": "cstorch-digest-v1",\n "root": {\n  "items": [')
    assert digest_json("ключ").count("ключ") == 1  # non-ASCII kept, as in the reference


def test_load_expected_by_name_or_path():
    by_name = load_expected("tied")
    assert by_name["format"] == FORMAT
    assert load_expected(FIXTURES_DIR / "tied.mdl") == by_name
    assert load_expected(str(FIXTURES_DIR / "tied.expected.json")) == by_name


def _reference_text(case: str) -> str:
    return (FIXTURES_DIR / f"{case}.expected.json").read_text(encoding="utf-8")


def _scalars_misc_state() -> dict:
    return {
        "none": None,
        "true": True,
        "false": False,
        "int": 42,
        "neg_int": -5,
        "big_int": 2**62,
        "huge_int": 2**70,
        "float": 0.1,
        "neg_zero": -0.0,
        "nan": math.nan,
        "inf": math.inf,
        "str": "text",
        "empty_str": "",
        "unicode_str": "значение ✓ 日本",
        "long_str": "x" * 70000,
        "key.with.dots": 1,
        "key/with/slash": torch.ones(2),
        "key with space": 2,
        "": "empty key",
        3: "int key",
        "ключ": "unicode key",
        "bytes": b"\x00\x01abc",
        "np_array": np.arange(6, dtype=np.float32).reshape(2, 3),
        "np_array_i64": np.arange(3, dtype=np.int64),
        "set": {1, 2, 3},
    }


@pytest.mark.parametrize(
    ("case", "state"),
    [
        ("empty", lambda: {}),
        (
            "emptyish",
            lambda: {
                "model": {},
                "optimizer": {"state": {}, "param_groups": []},
                "lr_scheduler": {},
                "global_step": 0,
            },
        ),
        ("key_collision", lambda: {"a.b": 1, "a": {"b": 2}}),
        (
            "key_collision_int_str",
            lambda: {"m": collections.OrderedDict([(1, "one"), ("1", "string one")])},
        ),
        ("scalars_misc", _scalars_misc_state),
    ],
)
def test_reference_cases_without_random_data_reproduce_exactly(case, state):
    text = digest_json(state())
    assert text + "\n" == _reference_text(case), "\n".join(
        diff_digests(load_expected(case), json.loads(text))
    )


def test_reference_dtypes_reproducible_entries():
    expected = {k: node for _, k, node in load_expected("dtypes")["root"]["items"]}
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    rebuilt = {
        "uint8": torch.arange(12, dtype=torch.uint8).reshape(3, 4),
        "uint16": torch.tensor(list(range(12)), dtype=torch.uint16).reshape(3, 4),
        "uint32": torch.tensor(list(range(12)), dtype=torch.uint32).reshape(3, 4),
        "uint64": torch.tensor(list(range(12)), dtype=torch.uint64).reshape(3, 4),
        "scalar_f32": torch.tensor(3.5),
        "scalar_i64": torch.tensor(-7),
        "scalar_bf16": torch.tensor(1.25, dtype=torch.bfloat16),
        "scalar_bool": torch.tensor(True),
        "empty_1d": torch.empty(0),
        "empty_2d_i64": torch.empty(0, 3, dtype=torch.int64),
        "transposed": a.t(),
        "slice_view": torch.arange(10, dtype=torch.float32)[2:5],
        "special_f32": torch.tensor([math.nan, math.inf, -math.inf, -0.0, 1e-45]),
    }
    for key, t in rebuilt.items():
        assert root(t) == expected[key], key


def _check_node(node, where="root"):
    kind = node["kind"]
    if kind in ("tensor", "ndarray"):
        allowed = {"kind", "dtype", "shape", "sha256"} | (
            {"tied_to"} if kind == "tensor" else set()
        )
        assert set(node) <= allowed and set(node) >= allowed - {"tied_to"}, where
        assert len(node["sha256"]) == 64 and all(isinstance(s, int) for s in node["shape"])
    elif kind == "dict":
        assert set(node) == {"kind", "type", "items"} and node["type"] in ("dict", "OrderedDict")
        for key_type, key, child in node["items"]:
            assert key_type == {str: "str", int: "int"}[type(key)], where
            _check_node(child, f"{where}.{key}")
    elif kind in ("list", "tuple", "set"):
        assert set(node) == ({"kind", "items", "type"} if kind == "set" else {"kind", "items"})
        if kind == "set":
            assert node["items"] == sorted(node["items"], key=canonical_json), where
        for i, child in enumerate(node["items"]):
            _check_node(child, f"{where}.{i}")
    else:
        assert kind == "leaf", where
        leaf_keys = ({"kind", "type", "value"}, {"kind", "type", "repr"}, {"kind", "type", "hex"})
        assert set(node) in leaf_keys, where


def test_reference_files_are_well_formed_and_complete():
    manifest = json.loads((FIXTURES_DIR / "manifest.json").read_text(encoding="utf-8"))
    cases = sorted(p.name.removesuffix(".mdl") for p in FIXTURES_DIR.glob("*.mdl"))
    assert cases and set(cases) == set(manifest["cases"])
    for case in cases:
        expected = load_expected(case)
        assert expected["format"] == FORMAT and set(expected) == {"format", "root"}
        _check_node(expected["root"])
        # Every reference file is exactly digest_json's output format.
        assert json.dumps(expected, indent=1, sort_keys=True, ensure_ascii=False) + "\n" == (
            _reference_text(case)
        )


def test_diff_digests_names_paths():
    a = digest({"m": {"w": torch.zeros(2), "k": 1}, "l": [1, 2]})
    b = digest({"m": {"w": torch.ones(2), "k": 1}, "l": [1, 3]})
    assert diff_digests(a, a) == []
    diffs = diff_digests(a, b)
    assert len(diffs) == 2
    assert diffs[0].startswith("m.w: sha256")
    assert diffs[1].startswith("l.1: value: 2 != 3")
    assert diff_digests(digest({"a": 1}), digest({"b": 1}))[0].startswith("<root>: keys")
