"""The calibration statistics smoothing is chosen from: packing, caching (smoothing_calibration)."""

from __future__ import annotations

import numpy as np

from prism_jax.model import smoothing_calibration as cal
from tests.model.test_smoothing import case


def test_statistics_are_cached(rng, tmp_path, monkeypatch):
    monkeypatch.setenv("PRISM_JAX_CACHE", str(tmp_path))
    config, tensors, tokens = case("qwen3", rng, outliers=False)
    calls = []
    compute = cal.activation_absmax
    monkeypatch.setattr(cal, "activation_absmax", lambda *a: calls.append(1) or compute(*a))
    key = cal.tokens_key([tokens])
    first = cal.cached_activation_absmax(config, tensors, key, lambda: [tokens])
    second = cal.cached_activation_absmax(config, tensors, key, lambda: [tokens])
    assert len(calls) == 1 and len(list((tmp_path / "smoothing").glob("*.npz"))) == 1
    assert first.keys() == second.keys()
    assert all(np.array_equal(first[k], second[k]) for k in first)
    other = cal.tokens_key([tokens[:-1]])  # other calibration: recomputed
    cal.cached_activation_absmax(config, tensors, other, lambda: [tokens[:-1]])
    assert len(calls) == 2
    tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1  # other weights: too
    cal.cached_activation_absmax(config, tensors, key, lambda: [tokens])
    assert len(calls) == 3


def test_pack_sequences_isolates_sequences():
    rows = cal.pack_sequences([[1, 2, 3], [6] * 7, [4, 5], [9] * 20], row_len=8)
    # Longest first: [9]*20 cut to 8 fills a row, [6]*7 another, [1, 2, 3] + [4, 5] the last.
    assert [r.valid.sum() for r in rows] == [8, 7, 5]
    r = rows[2]
    assert r.tokens[:5].tolist() == [1, 2, 3, 4, 5] and r.positions[:5].tolist() == [0, 1, 2, 0, 1]
    assert r.mask[4, 3] and not r.mask[3, 4] and not r.mask[4, 2] and r.mask[2, 0]
    assert r.valid.tolist() == [True] * 5 + [False] * 3
    assert r.segment.tolist() == [0, 0, 0, 1, 1, -1, -1, -1]


# --- real weights ---------------------------------------------------------------------------------
