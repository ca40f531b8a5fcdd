"""Metrics on cases small enough to compute by hand."""

import math

import pytest

from prism_jax.eval import metrics


def test_wilson_matches_the_closed_form():
    # p = 0.8, n = 10, z = 1.96: centre (0.8 + 0.19208) / 1.38416 = 0.716737,
    # half 1.96 * sqrt(0.016 + 0.0096040) / 1.38416 = 0.226581
    lo, hi = metrics.wilson(8, 10, z=1.96)
    assert lo == pytest.approx(0.716737 - 0.226581, abs=2e-6)
    assert hi == pytest.approx(0.716737 + 0.226581, abs=2e-6)


def test_wilson_edges():
    assert metrics.wilson(0, 0) == (0.0, 1.0)
    lo, hi = metrics.wilson(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.161125, abs=1e-5)  # z^2 / (n + z^2)
    lo, hi = metrics.wilson(20, 20)
    assert hi == 1.0 and lo == pytest.approx(1 - 0.161125, abs=1e-5)


def test_accuracy_takes_the_first_top_option_on_ties():
    probs = [[0.7, 0.3], [0.5, 0.5], [0.2, 0.8], [0.1, 0.6, 0.3]]
    out = metrics.accuracy(probs, [0, 1, 1, 1])
    assert out["n"] == 4 and out["correct"] == 3 and out["accuracy"] == 0.75


def test_ece_and_bins_by_hand():
    # bin 9 [0.9, 1]: conf 0.95, 0.95 -> acc 1/2 -> gap 0.45, weight 2/4
    # bin 6 [0.6, 0.7): conf 0.6, 0.6 -> acc 1 -> gap 0.4, weight 2/4
    conf = [0.95, 0.95, 0.6, 0.6]
    correct = [True, False, True, True]
    assert metrics.ece(conf, correct) == pytest.approx(0.5 * 0.45 + 0.5 * 0.4)
    bins = metrics.reliability_bins(conf, correct)
    assert [b["n"] for b in bins] == [0, 0, 0, 0, 0, 0, 2, 0, 0, 2]
    assert math.isnan(bins[0]["accuracy"])
    assert metrics.reliability_bins([1.0], [True])[-1]["n"] == 1  # the last bin is closed


def test_brier_by_hand():
    # (0.7-1)^2 + 0.3^2 = 0.18 ; 0.5^2 + (0.5-1)^2 = 0.5 ; mean 0.34
    assert metrics.brier([[0.7, 0.3], [0.5, 0.5]], [0, 1]) == pytest.approx(0.34)
    assert metrics.brier([[0.0, 1.0, 0.0]], [0]) == pytest.approx(2.0)


def test_calibration_of_a_perfectly_confident_right_run():
    cal = metrics.calibration([[1.0, 0.0], [0.0, 1.0]], [0, 1])
    assert cal["ece"] == 0.0 and cal["brier"] == 0.0 and cal["mean_confidence"] == 1.0


def test_agreement_counts_flips_dp_and_their_effect_on_accuracy():
    a = [[0.6, 0.4], [0.4, 0.6], [0.9, 0.1], [0.51, 0.49]]
    b = [[0.4, 0.6], [0.4, 0.6], [0.8, 0.2], [0.49, 0.51]]
    gold = [1, 1, 0, 0]
    out = metrics.agreement(a, b, gold)
    assert out["flips"] == 2 and out["flip_rate"] == 0.5
    assert out["max_dp"] == pytest.approx(0.2)
    assert out["mean_dp"] == pytest.approx((0.2 + 0 + 0.1 + 0.02) / 4)
    # item 0: b fixes it; item 3: b breaks it
    assert (out["fixed"], out["broke"], out["accuracy_delta"]) == (1, 1, 0.0)
    assert metrics.agreement(a, a)["flips"] == 0 and "fixed" not in metrics.agreement(a, a)
    # reference margins 0.6 - 0.4 (just under 0.2 in floating point) twice, 0.8 and 0.02
    by = {(b["lo"], b["hi"]): (b["n"], b["flips"]) for b in out["by_margin"]}
    assert by[(0.1, 0.2)] == (2, 1) and by[(0.2, 1.0)] == (1, 0) and by[(0.01, 0.05)] == (1, 1)
    assert by[(0.0, 0.01)] == (0, 0)


def test_mcnemar_exact_by_hand():
    # 1 fixed, 4 broke: P(X <= 1) for Bin(5, 1/2) = 6/32, two-sided 12/32
    assert metrics.mcnemar_p(1, 4) == pytest.approx(12 / 32)
    assert metrics.mcnemar_p(3, 3) == 1.0 and metrics.mcnemar_p(0, 0) == 1.0
    assert metrics.mcnemar_p(0, 10) == pytest.approx(2 / 1024)
