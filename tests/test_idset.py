"""``engine.idset.IdSet``: the ids of the tensors an upgrade wrote, linked or proved, kept as
machine words (issue 33), answering as the ``set`` of ``int`` it replaces."""

from __future__ import annotations

import random

from ckpt_migrate.engine.idset import IdSet


def test_it_answers_as_a_set_of_the_same_ids():
    rng = random.Random(33)
    objects = [object() for _ in range(5000)]
    ids = IdSet()
    model: set[int] = set()
    for obj in rng.choices(objects, k=4000):  # (with repeats, in no order)
        ids.add(id(obj))
        model.add(id(obj))
    assert len(ids) == len(model) and ids == model and list(ids) == sorted(model)
    assert all((id(obj) in ids) == (id(obj) in model) for obj in objects)
    later = object()
    assert id(later) not in ids
    ids.add(id(later))  # an add after a question
    assert id(later) in ids and len(ids) == len(model) + 1


def test_empty_and_odd_questions():
    ids = IdSet()
    assert len(ids) == 0 and ids == set() and list(ids) == [] and 5 not in ids
    ids = IdSet([7, 3, 7, 2**64 - 1])
    assert len(ids) == 3 and ids == {3, 7, 2**64 - 1} and ids == IdSet([3, 7, 2**64 - 1])
    assert -1 not in ids and 2**64 not in ids and "7" not in ids and 7.0 not in ids
    assert ids != {3, 7} and ids != [3, 7, 2**64 - 1]
