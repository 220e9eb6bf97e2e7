"""``--json`` text (``cli.jsontext``) is the standard library's indented JSON, character for
character: on every kind of value it encodes, on large containers written in batches, and on
what the commands print."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES

from ckpt_migrate.cli import commands, jsontext


def _stdlib(data: object) -> str:
    return "".join(json.JSONEncoder(indent=2, default=str).iterencode(data))


def _ours(data: object) -> str:
    return "".join(jsontext.pieces(data))


SCALARS = [
    "",
    "plain",
    'quote " back \\ slash',
    "tab\tnew\nline\x00\x1f",
    "é ü 漢字 \U0001f600",
    "\ud800",
    0,
    -1,
    2**80,
    True,
    False,
    None,
    0.0,
    -0.0,
    1.5,
    1e300,
    5e-324,
    float("nan"),
    float("inf"),
    -float("inf"),
    Path("/a/b"),
    np.int64(3),
    np.float32(0.5),
    b"raw",
]


def _random(rng: random.Random, depth: int) -> object:
    roll = rng.random()
    if depth > 3 or roll < 0.5:
        return rng.choice(SCALARS)
    size = rng.choice([0, 1, 2, 5])
    if roll < 0.7:
        return [_random(rng, depth + 1) for _ in range(size)]
    if roll < 0.8:
        return tuple(_random(rng, depth + 1) for _ in range(size))
    keys = ["k", "é", 1, -2, 1.5, True, False, None, float("inf")]
    return {rng.choice(keys): _random(rng, depth + 1) for _ in range(size)}


@pytest.mark.parametrize("value", [*SCALARS, [], {}, (), [[]], {"a": {}}], ids=repr)
def test_every_kind_of_value(value):
    for data in (value, [value], {"key": value}, {"a": [value, {"b": (value,)}]}):
        assert _ours(data) == _stdlib(data)


def test_random_nests():
    rng = random.Random(33)
    for _ in range(2000):
        data = _random(rng, 0)
        assert _ours(data) == _stdlib(data)


def test_large_containers_in_batches():
    big = [{"name": f"model.layer.{i}", "value": "tensor float32[8, 8]"} for i in range(3000)]
    nested = {"leaves": big, "outline": [f"  {i}: x" for i in range(2500)], "empty": []}
    data = {"top": nested, "list": [big[:1500], list(range(jsontext.BATCH + 1))], "n": 1}
    parts = list(jsontext.pieces(data))
    assert "".join(parts) == _stdlib(data)
    assert len(parts) > 8 and max(map(len, parts)) < 200_000


def test_a_key_json_cannot_write_is_refused_as_json_refuses_it():
    for data in ({(1, 2): 1}, {"a": [{b"x": 1}]}):
        with pytest.raises(TypeError):
            _stdlib(data)
        with pytest.raises(TypeError):
            _ours(data)


def test_what_the_commands_print():
    for name in ("release-1.9.mdl", "release-2.10.mdl", "real-cstorch-2.10/tied.mdl"):
        data = commands.inspect(FIXTURES / name)
        assert _ours(data) == _stdlib(data)
        data = commands.plan(FIXTURES / name, "2.10")
        assert _ours(data) == _stdlib(data)
    assert _ours(commands.history()) == _stdlib(commands.history())
