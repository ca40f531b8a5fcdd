"""Bitwise determinism of the forest engine (DESIGN.md, numerics contract): a question's
probabilities keep their exact bits when it is asked (a) alone, (b) with 2, 7 or 31 other
questions on the same state, (c) next to unrelated requests in the same step, (d) after a
prefix-cache hit on its state, (e) with the state split across prefill chunks at arbitrary
boundaries, (f) in a larger token bucket, (g) with other pages free or taken, (j) with k and v
stored into the pool by qkv_rope instead of tree_attention; and the pure make_decide_fn gives
the engine's bits. Tiny random INT8 models (Gemma 3 with sliding layers,
Qwen 3), a state longer than two attention tiles; on CPU here and on the H200 through
benchmarks/gpu_suite.sh (the `device` parameter)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from prism_jax.config import INT8_ONE_DIGIT, INT8_PROJECTIONS, EngineConfig, ModelConfig
from prism_jax.engine import Engine
from prism_jax.model import init_random
from prism_jax.prompts import RenderedQuestion
from tests.conftest import assert_bitwise_equal
from tests.model.tiny import TINY_HF_CONFIGS

ROOT, TRUNK = 21, 150  # root instructions, state: positions span three 64-key tiles
BUCKETS = EngineConfig(
    page_size=8,
    kv_pages=320,
    token_buckets=(16, 64, 256, 1024),
    row_buckets=(1, 4, 16, 64),
    candidate_buckets=(2, 4, 8, 256),
)


def _tokens(rng, n, vocab):
    return tuple(int(x) for x in rng.integers(0, vocab, n))


def _question(rng, prefix, vocab, multi_token: bool) -> RenderedQuestion:
    branch = _tokens(rng, int(rng.integers(3, 13)), vocab)
    firsts = [int(x) for x in rng.choice(vocab, int(rng.integers(2, 6)), replace=False)]
    options = tuple((f,) for f in firsts)
    if multi_token:  # two options sharing a first token: leaves and the vocabulary pass
        options = ((firsts[0], *_tokens(rng, 2, vocab)), (firsts[0],), *options[1:])
    return RenderedQuestion(prefix, branch, options)


# The default INT8 has two digits (config.INT8_TWO_DIGITS, issue 7; its GELU remainder once
# came from XLA's tanh and lost bit-invariance on the GPU); "-one-digit" is "int8-1digit".
# "-digits-attn": ModelConfig.attention_numerics = "digits" (ops.tree_attention_digits).
@pytest.fixture(params=["gemma3", "qwen3", "gemma3-one-digit", "gemma3-digits-attn"])
def setup(request, device, rng):
    family = request.param.removesuffix("-one-digit").removesuffix("-digits-attn")
    hf = dict(TINY_HF_CONFIGS[family], max_position_embeddings=2048)
    config = ModelConfig.from_hf_config(hf)
    assert config.int8_two_digit_rows == config.int8_two_digit_weights == INT8_PROJECTIONS
    if request.param.endswith("-one-digit"):
        config = config.replace(**INT8_ONE_DIGIT)
    if request.param.endswith("-digits-attn"):
        config = config.replace(attention_numerics="digits")
    with jax.default_device(device):
        params = init_random(config, "int8", seed=int(rng.integers(1 << 30)))
        engine = Engine(config, params, None, None, engine_config=BUCKETS)
    engine.root_len = ROOT
    v = config.vocab_size
    root = _tokens(rng, ROOT, v)
    prefix = root + _tokens(rng, TRUNK, v)
    questions = [_question(rng, prefix, v, multi_token=i % 3 == 0) for i in range(36)]
    unrelated = [_question(rng, root + _tokens(rng, 40, v), v, i == 0) for i in range(5)]
    return device, engine, questions, unrelated


def _run(device, engine, qs, **kw):
    with jax.default_device(device):
        return engine.run(qs, **kw)


def _cold(device, engine, qs, **kw):
    engine.cache.clear()
    return _run(device, engine, qs, **kw).probabilities


def _check(got, want, what):
    assert_bitwise_equal(np.asarray(got, np.float64), np.asarray(want, np.float64), what)


def test_forest_variations_keep_every_bit(setup, rng):
    device, engine, qs, unrelated = setup
    targets = [0, 1, 5]  # 0 has multi-token options
    alone = {i: _cold(device, engine, [qs[i]])[0] for i in targets}
    for k in (2, 7, 31):  # (b) with k others, the target at a random place
        for i in targets:
            others = [q for j, q in enumerate(qs) if j != i][:k]
            at = int(rng.integers(0, k + 1))
            got = _cold(device, engine, others[:at] + [qs[i]] + others[at:])[at]
            _check(got, alone[i], f"question {i} with {k} others at {at}")
    mixed = unrelated[:3] + [qs[i] for i in targets] + unrelated[3:]  # (c)
    got = _cold(device, engine, mixed)[3 : 3 + len(targets)]
    for i, p in zip(targets, got, strict=True):
        _check(p, alone[i], f"question {i} next to unrelated requests")
    engine.cache.clear()
    _run(device, engine, [qs[10]])  # (d) the state is now cached
    for i in targets:
        result = _run(device, engine, [qs[i]])
        assert result.cached_tokens(0) == ROOT + TRUNK
        assert result.computed_tokens < 40, "a cache hit computes only the new tokens"
        _check(result.probabilities[0], alone[i], f"question {i} after a prefix-cache hit")


def test_chunks_buckets_and_pages_keep_every_bit(setup, rng):
    device, engine, qs, _ = setup
    batch = [qs[0], qs[3], qs[4]]
    want = _cold(device, engine, batch)
    chunks = sorted({int(c) for c in rng.integers(1, 120, 3)} | {ROOT + 1})
    for chunk in chunks:  # (e) arbitrary boundaries, mid-page and mid-tile
        engine.cache.clear()
        result = _run(device, engine, batch, chunk=chunk)
        assert result.steps > 1
        for a, b in zip(result.probabilities, want, strict=True):
            _check(a, b, f"prefill in chunks of {chunk}")
    got = _cold(device, engine, batch, min_tokens=BUCKETS.token_buckets[-1])  # (f)
    for a, b in zip(got, want, strict=True):
        _check(a, b, "padded into the largest bucket")
    engine.cache.clear()  # (g) other pages taken: the request lands on different pages
    free = engine.pool.free_page_ids()
    taken = sorted(int(p) for p in rng.choice(free, len(free) // 2, replace=False))
    engine.pool.reserve(taken)
    try:
        got = _run(device, engine, batch).probabilities
    finally:
        engine.pool.free(taken)
    for a, b in zip(got, want, strict=True):
        _check(a, b, "with half of the pages taken")


def test_forward_in_parts_keeps_every_bit(setup):
    """(h) the forward as one executable per layer (EngineConfig.forward_layers_per_call, what
    the GPU runs in parts of 1 to 32) against one executable for all layers, and a prefix-cache hit
    on the pool the parts wrote."""
    device, engine, qs, _ = setup
    # The reference runs every layer but the last in one call, then the last (the tail).
    assert [len(p) for p in engine.runner.parts] == [engine.config.num_layers - 1, 1]
    batch = [qs[0], qs[3]]
    want = _cold(device, engine, batch) + _cold(device, engine, [qs[4]])
    split = dataclasses.replace(BUCKETS, forward_layers_per_call=1)
    with jax.default_device(device):
        parts = Engine(engine.config, engine.params, None, None, engine_config=split)
    parts.root_len = ROOT
    assert len(parts.runner.parts) == engine.config.num_layers
    got = _run(device, parts, batch).probabilities
    hit = _run(device, parts, [qs[4]])
    assert hit.cached_tokens(0) == ROOT + TRUNK
    for a, b in zip(got + hit.probabilities, want, strict=True):
        _check(a, b, "forward in one-layer parts")


def test_the_whole_last_layer_gives_the_same_bits(setup, rng):
    """(i) the last layer for every token (readout_only_last_layer=False) against the default,
    which carries only the readout rows past its attention: a forest with leaves (the
    vocabulary pass), prefill in chunks, a prefix-cache hit on what the default wrote, and
    more readout rows than the step has tokens."""
    device, engine, qs, _ = setup
    batch = [qs[0], qs[3], qs[7]]
    chunk = int(rng.integers(20, 120))
    want = _cold(device, engine, batch) + _cold(device, engine, batch, chunk=chunk)
    whole = dataclasses.replace(BUCKETS, readout_only_last_layer=False)
    with jax.default_device(device):
        other = Engine(engine.config, engine.params, None, None, engine_config=whole)
    other.root_len = ROOT
    assert [len(p) for p in other.runner.parts] == [engine.config.num_layers]
    got = _cold(device, other, batch) + _cold(device, other, batch, chunk=chunk)
    for a, b in zip(got, want, strict=True):
        _check(a, b, "the whole last layer")
    repeated = [qs[5]] * 20  # 20 rows of a few tokens once the state is cached
    _run(device, engine, [qs[1]])
    _run(device, other, [qs[1]])
    hit, ref = _run(device, engine, repeated), _run(device, other, repeated)
    assert hit.cached_tokens(0) == ref.cached_tokens(0) == ROOT + TRUNK
    for a, b in zip(hit.probabilities, ref.probabilities, strict=True):
        _check(a, b, "20 readout rows on a cache hit")


def test_kv_stored_by_qkv_rope_gives_the_same_bits(setup, rng, monkeypatch):
    """(j) qkv_rope storing each layer's k and v in the pool (the default) against
    PRISM_QKV_ROPE_KV=off, where tree_attention writes them; a forest, prefill in chunks and a
    prefix-cache hit on the keys each stored."""
    device, engine, qs, _ = setup
    batch = [qs[0], qs[3], qs[7]]
    chunk = int(rng.integers(20, 120))

    def run_with(switch: str):
        monkeypatch.setenv("PRISM_QKV_ROPE_KV", switch)  # read when a step is traced
        with jax.default_device(device):
            fresh = Engine(engine.config, engine.params, None, None, engine_config=BUCKETS)
        fresh.root_len = ROOT
        cold = _cold(device, fresh, batch) + _cold(device, fresh, batch, chunk=chunk)
        _run(device, fresh, [qs[1]])
        hit = _run(device, fresh, [qs[5], qs[6]])
        assert hit.cached_tokens(0) == ROOT + TRUNK, "the follow-up must hit the prefix cache"
        return cold + hit.probabilities

    want = run_with("off")
    got = run_with("on")
    for a, b in zip(got, want, strict=True):
        _check(a, b, "k and v stored by qkv_rope")


def test_make_decide_fn_gives_the_engines_bits(setup):
    from prism_jax.decide import make_table_fn, option_probabilities_host
    from prism_jax.forest import build_forest
    from prism_jax.scheduler import pad

    device, engine, qs, _ = setup
    batch = [qs[0], qs[2]]
    want = _cold(device, engine, batch)
    arrays = pad(build_forest(batch, ROOT), BUCKETS)
    table_fn = jax.jit(make_table_fn(engine.config, page_size=BUCKETS.page_size))
    with jax.default_device(device):
        table = np.asarray(table_fn(engine.params, arrays))
    got = option_probabilities_host(table, arrays["terms"])
    for a, b in zip(got, want, strict=True):
        _check(a, b, "make_decide_fn vs engine")
