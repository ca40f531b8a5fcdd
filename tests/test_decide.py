"""System One semantics without a model: question limits, confidence formulas, the forest's
attention mask and positions, and the host's option probabilities."""

import numpy as np
import pytest

from prism_jax.decide import (
    answer,
    choice_confidence,
    option_probabilities,
    option_probabilities_host,
    score_confidence,
)
from prism_jax.forest import build_forest
from prism_jax.prompts import RenderedQuestion
from prism_jax.questions import DecisionRequestError, Question, parse_questions
from prism_jax.scheduler import pad


def test_limits_and_messages():
    many = {f"o{i}": None for i in range(256)}
    with pytest.raises(DecisionRequestError, match="Too many choices. Must have at most 255"):
        parse_questions({"q": {"type": "choice", "criteria": many}})
    most = dict(list(many.items())[:255])
    assert len(parse_questions({"q": {"type": "choice", "criteria": most}})["q"].keys) == 255
    with pytest.raises(DecisionRequestError, match="at most 10 levels") as e:
        parse_questions({"q": {"type": "score", "criteria": [str(i) for i in range(11)]}})
    assert e.value.status == 400
    with pytest.raises(DecisionRequestError, match="needs instructions or at least one described"):
        parse_questions({"q": {"type": "noul"}})
    with pytest.raises(DecisionRequestError) as e:
        parse_questions({"q": {"type": "poll"}})
    assert e.value.status == 422
    q = parse_questions({"q": {"type": "noul", "criteria": {"false": "not spam"}}})["q"]
    assert q.keys == ("true", "false") and q.descriptions == (None, "not spam")


def test_confidence_formulas():
    assert choice_confidence(np.array([1.0, 0.0, 0.0, 0.0])) == 1.0
    assert choice_confidence(np.array([0.25] * 4)) == pytest.approx(0.0)
    assert choice_confidence(np.array([0.7, 0.3])) == pytest.approx((0.7 - 0.5) / 0.5)
    # score: n = 3, D = (1 + 0 + 1) / 3; k = 1; sum p|i-k| = 0.2 + 0.2
    assert score_confidence(np.array([0.2, 0.6, 0.2])) == pytest.approx(1 - 0.4 / (2 / 3))
    assert score_confidence(np.array([0.5, 0.0, 0.5])) == 0.0  # clipped at zero
    a = answer(
        Question("score", None, ("0", "1", "2"), ("low", "mid", "high")), np.array([0.2, 0.3, 0.5])
    )
    assert a["score"] == pytest.approx(1.3) and a["legend"] == {"0": "low", "1": "mid", "2": "high"}
    assert answer(Question("noul", "x", ("true", "false"), (None, None)), np.array([0.8, 0.2])) == {
        "type": "noul",
        "noul": 0.8,
    }


def test_forest_shares_prefix_and_masks_branches():
    prefix = (1, 2, 3)
    q1 = RenderedQuestion(prefix, (10, 11), ((50,), (51,)))
    q2 = RenderedQuestion(prefix, (20,), ((60, 61, 62), (63,)))
    f = build_forest([q1, q2])
    # prefix once, then q1's branch, q2's branch, then q2's leaf (60, 61) for the 3-token option
    assert f.tokens == [1, 2, 3, 10, 11, 20, 60, 61]
    assert f.positions == [0, 1, 2, 3, 4, 3, 4, 5]
    m = f.mask()
    assert m[4, :5].all() and not m[4, 5:].any()  # q1's slot: prefix + own branch
    assert m[5, :3].all() and not m[5, 3:5].any() and m[5, 5]  # q2 never sees q1
    assert m[7, [0, 1, 2, 5, 6, 7]].all() and not m[7, [3, 4]].any()  # leaf: q2 path only
    assert f.use_lse == [False, True, True, True]  # q1 candidate-only; q2 full vocabulary
    assert f.terms[1][0] == [(1, 0), (2, 0), (3, 0)]
    batch = pad(f)
    assert batch["tokens"].shape == (64,) and batch["chain_of"][63] == -1  # padding
    assert batch["positions"][63] == -1 and batch["slot"][63] // 16 == 0  # dummy page
    # segments: prefix, q1 branch, q2 branch, q2 leaf -> one chain each, ancestors first
    assert list(batch["chain_of"][:8]) == [0, 0, 0, 1, 1, 2, 3, 3]
    leaf_chain = batch["chain_segments"][3]
    assert [tuple(x[:2]) for x in leaf_chain[:3]] == [(0, 3), (3, 1), (4, 2)]


def test_host_probabilities_match_jax_and_ignore_padding():
    rng = np.random.default_rng(0)
    table = np.log(rng.dirichlet(np.ones(4), size=3)).astype(np.float32)  # (R=3, C=4)
    terms = np.array([[[0, -1], [1, -1], [-1, -1]], [[4, 8], [5, -1], [6, 9]]], np.int32)
    host = option_probabilities_host(table, terms)
    jax_probs = np.asarray(option_probabilities(table, terms))
    assert len(host[0]) == 2 and len(host[1]) == 3
    np.testing.assert_allclose(host[0], jax_probs[0, :2], rtol=1e-6)
    np.testing.assert_allclose(host[1], jax_probs[1], rtol=1e-6)
    assert jax_probs[0, 2] == 0.0
    e = np.exp(table.astype(np.float64)).reshape(-1)
    s = np.array([e[4] * e[8], e[5], e[6] * e[9]])
    np.testing.assert_allclose(host[1], s / s.sum(), rtol=1e-12)
