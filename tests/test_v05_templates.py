"""A format 0.5 leaf's ``__metadata__`` document known by its template
(``format.v05.templates``, issue 33): a number scalar's by the template around its value's
token, decoded as JSON decodes it, on the real library's files and on documents laid out as
its writer lays them out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import pytest
from conftest import FIXTURES, real_2x_files

from ckpt_migrate.format.v05 import read as v05
from ckpt_migrate.format.v05.templates import Templates

SUFFIX = ".__metadata__"


def _documents(path: Path) -> dict[str, str]:
    """Every leaf's document, as the writer of ``path`` wrote it."""
    with h5py.File(path, "r") as f:
        return {k: f.attrs[k] for k in f.attrs if k.endswith(SUFFIX)}


def _made(pending: Any) -> Any:
    """What a reader keeps of a document, with the type of every value (1 and 1.0 differ)."""
    if pending.error is not None:
        return type(pending.error).__name__, str(pending.error)
    m = pending.m if pending.m is not None else pending.md_all
    return pending.m is not None, [(k, v, type(v)) for k, v in m.items()]


def _alone(key: str, text: str, path: Path) -> Any:
    """The document decoded from JSON, with nothing learnt before it."""
    return _made(v05._pending(key, text, Templates(), path))


class _Decodes:
    """Counts the documents decoded from JSON (``v05._parse_metadata``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        decode = v05._parse_metadata

        def counted(*args: Any) -> Any:
            self.count += 1
            return decode(*args)

        monkeypatch.setattr(v05, "_parse_metadata", counted)


def _real_files(tmp_path: Path) -> list[Path]:
    return sorted((FIXTURES / "real-cstorch-2.10").glob("*.mdl")) + real_2x_files(tmp_path)


def test_the_real_files_documents_are_read_as_json_reads_each_alone(tmp_path):
    numbers = 0
    for path in _real_files(tmp_path):
        singles: Templates[Any] = Templates()
        for key, text in _documents(path).items():
            made = v05._pending(key, text, singles, path)
            assert _made(made) == _alone(key, text, path), (path.name, key)
        numbers += len(singles.numbers)
    assert numbers >= 5  # (the files' int and float scalars: the path is taken)


def test_the_real_trainers_number_scalars_are_decoded_from_json_once(tmp_path, monkeypatch):
    path = next(p for p in real_2x_files(tmp_path) if p.name.startswith("trainer-2.9.0"))
    documents = _documents(path)
    scalars = [
        k
        for k, t in documents.items()
        if '"ScalarSerializer"' in t and type(json.loads(t)[k]["scalar_value"]) in (int, float)
    ]
    assert len(scalars) >= 30
    decodes = _Decodes(monkeypatch)
    singles: Templates[Any] = Templates()
    for key in scalars:
        v05._pending(key, documents[key], singles, path)
    assert decodes.count == 1  # (each decoded from JSON before: one template a value)


def _writer_layout(tmp_path: Path) -> tuple[str, str]:
    """The real 2.9 trainer's first int scalar: its key and its document (``json.dumps`` with
    an indent of 4, as the real writer makes them)."""
    path = next(p for p in real_2x_files(tmp_path) if p.name.startswith("trainer-2.9.0"))
    for key, text in _documents(path).items():
        if type(json.loads(text)[key].get("scalar_value")) is int:
            assert json.dumps(json.loads(text), indent=4) == text
            return key, text
    raise AssertionError("no int scalar")


def _with(text: str, key: str, name: str, token: str) -> tuple[str, str]:
    """The document ``text`` of ``key`` for the leaf ``name``, its value's token ``token``."""
    old = key[: -len(SUFFIX)]
    value = json.dumps(json.loads(text)[key]["scalar_value"])
    marker = f'"scalar_value": {value},'
    assert text.count(marker) == 1
    return f"{name}{SUFFIX}", text.replace(old, name).replace(marker, f'"scalar_value": {token},')


@pytest.mark.parametrize(
    ("token", "by_template"),
    [
        ("0", True),
        ("-0", True),
        ("-12", True),
        ("9" * 18, True),
        ("1.5", True),
        ("1e-05", True),
        ("-2.5E+3", True),
        ("1e400", True),  # (a float's overflow: inf, as JSON gives it)
        ("1" * 70, False),  # (left to JSON: longer than any value a writer makes)
        ("007", False),  # (not JSON: the document is refused as before)
        ("1.", False),
        ("NaN", False),
        ("-Infinity", False),
        ("true", False),
        ("null", False),
        ('"7"', False),
        ("1 ", False),
    ],
)
def test_a_number_token_in_the_learnt_place_decodes_as_json(
    tmp_path, monkeypatch, token, by_template
):
    key, text = _writer_layout(tmp_path)
    path = tmp_path / "x.mdl"
    singles: Templates[Any] = Templates()
    v05._pending(key, text, singles, path)
    assert len(singles.numbers) == 1
    other, document = _with(text, key, "optimizer.param_groups.0.params.17", token)
    expected = _alone(other, document, path)
    decodes = _Decodes(monkeypatch)
    assert _made(v05._pending(other, document, singles, path)) == expected
    assert (decodes.count == 0) is by_template


def test_a_key_that_ends_like_the_values_inside_another_string_is_not_learnt(tmp_path):
    key, text = _writer_layout(tmp_path)
    name = key[: -len(SUFFIX)]
    doc = json.loads(text)
    doc[key] = {'x"scalar_value': 7, "__TYPE__": "ScalarSerializer", "__NONE__": True}
    tricky = json.dumps(doc, indent=4).replace(
        '"__NONE__": true', '"__NONE__": true, "scalar_value":7'
    )
    singles: Templates[Any] = Templates()
    path = tmp_path / "x.mdl"
    assert _made(v05._pending(key, tricky, singles, path)) == _alone(key, tricky, path)
    assert singles.numbers == []
    other = tricky.replace(name, "b").replace(": 7,", ": 8,")
    assert _made(v05._pending("b" + SUFFIX, other, singles, path)) == _alone(
        "b" + SUFFIX, other, path
    )
