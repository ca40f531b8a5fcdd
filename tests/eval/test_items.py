"""Gold indices and the seeded stratified sample."""

from collections import Counter

import pytest

from prism_jax.eval.items import (
    Item,
    gold_index,
    largest_remainder,
    set_quotas,
    stratified_sample,
)
from prism_jax.questions import parse_question


def _q(body):
    return parse_question("q", body)


def test_gold_index_per_question_type():
    choice = _q({"type": "choice", "criteria": {"a": None, "b": "bee"}})
    assert gold_index(choice, "b") == 1
    noul = _q({"type": "noul", "instructions": "Is it?"})
    assert (gold_index(noul, True), gold_index(noul, False)) == (0, 1)
    score = _q({"type": "score", "criteria": ["low", "mid", "high"]})
    assert gold_index(score, 2) == 2
    for q, bad in ((choice, "c"), (noul, "yes"), (score, 3), (score, True)):
        with pytest.raises(ValueError):
            gold_index(q, bad)


def test_largest_remainder_is_exact_and_proportional():
    assert largest_remainder(10, {"a": 50, "b": 30, "c": 20}) == {"a": 5, "b": 3, "c": 2}
    got = largest_remainder(7, {"a": 1, "b": 1, "c": 1})
    assert sum(got.values()) == 7 or got == {"a": 1, "b": 1, "c": 1}
    assert sum(largest_remainder(2, {"a": 1, "b": 1, "c": 1}).values()) == 2


def test_set_quotas_raise_small_sets_to_the_floor():
    q = set_quotas(100, {"big": 10000, "small": 30, "tiny": 5}, min_per_set=20)
    assert q == {"big": 75, "small": 20, "tiny": 5}
    assert set_quotas(10**6, {"a": 3}, 0) == {"a": 3}


def _items():
    out = []
    for s, strata in (("A", {"x": 60, "y": 30}), ("B", {"z": 10})):
        for stratum, n in strata.items():
            out += [
                Item(
                    f"{s}/{stratum}/{i}",
                    s,
                    f"{s}/{stratum}",
                    f"state {i}",
                    {"type": "noul", "instructions": "?"},
                    0,
                )
                for i in range(n)
            ]
    return out


def test_stratified_sample_is_seeded_proportional_and_shuffled():
    items = _items()
    a = stratified_sample(items, 20, seed=3)
    assert [it.id for it in a] == [it.id for it in stratified_sample(items, 20, seed=3)]
    assert [it.id for it in a] != [it.id for it in stratified_sample(items, 20, seed=4)]
    assert Counter(it.stratum for it in a) == {"A/x": 12, "A/y": 6, "B/z": 2}
    assert len({it.id for it in a}) == 20
    assert len(stratified_sample(items, None)) == len(items)
    floored = stratified_sample(items, 20, seed=3, min_per_set=5)
    assert Counter(it.set for it in floored) == {"A": 15, "B": 5}
