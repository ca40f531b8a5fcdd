"""Static shapes: warmup compiles every bucket, after which no workload compiles anything,
whatever its size, chunking, readout width or cache state."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from prism_jax.config import EngineConfig, ModelConfig
from prism_jax.engine import Engine
from prism_jax.model import init_random
from prism_jax.prompts import RenderedQuestion
from tests.model.tiny import TINY_HF_CONFIGS

BUCKETS = EngineConfig(
    page_size=8,
    kv_pages=160,
    token_buckets=(16, 64, 256),
    row_buckets=(1, 4, 16),
    candidate_buckets=(2, 8, 256),
)


@pytest.fixture(scope="module")
def engine() -> Engine:
    config = ModelConfig.from_hf_config(
        dict(TINY_HF_CONFIGS["gemma3"], max_position_embeddings=1024)
    )
    return Engine(
        config,
        init_random(config, "int8", seed=3),
        None,
        None,
        engine_config=BUCKETS,
        warmup=True,
        progress=False,
    )


class CompileCounter:
    """Counts XLA backend compilations and persistent-cache loads while active."""

    EVENTS = ("/jax/core/compile/backend_compile_duration",)

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, event: str, *args, **kwargs) -> None:
        if event in self.EVENTS or event == "/jax/compilation_cache/cache_hits":
            self.count += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self)
        jax.monitoring.register_event_listener(self)
        return self

    def __exit__(self, *exc) -> None:
        jax.monitoring.unregister_event_duration_listener(self)
        jax.monitoring.unregister_event_listener(self)


def _workload(rng, vocab: int) -> list[list[RenderedQuestion]]:
    def toks(n):
        return tuple(int(x) for x in rng.integers(0, vocab, n))

    state = toks(90)
    return [
        [RenderedQuestion(state, toks(4), ((1,), (2,)))],  # small, two candidates
        [RenderedQuestion(state, toks(5), ((1,), (2,), (3,)))],  # prefix-cache hit
        [RenderedQuestion(toks(30), toks(6), tuple((i,) for i in range(200)))],  # 200 options
        [RenderedQuestion(toks(7), toks(3), ((5, 6, 7), (5, 8), (9,)))],  # leaves + lse
        [RenderedQuestion(state, toks(8), ((1,), (2,))) for _ in range(12)],  # 12 rows
        [RenderedQuestion(toks(400), toks(3), ((1,), (2,)))],  # longer than the largest bucket
    ]


def test_warmup_compiles_every_bucket_once(engine):
    keys = engine.runner.bucket_keys()
    assert engine.runner.compilations == len(keys)
    assert ("forward", 256) in keys and ("readout", 256, 16, 256) in keys
    assert ("lse", 16, 1) in keys and ("readout", 16, 16, 2) in keys


def test_each_call_gets_one_integer_buffer(engine):
    """Every numpy input is its own host-to-device copy: each forward part takes its layers'
    weights, their pools, the previous part's carry and one packed int32 buffer; the readout
    the embedding, hidden and one buffer."""
    runner = engine.runner
    parts = runner.executable(("forward", 64))
    assert len(parts) == len(runner.parts)
    weights_passed = 0
    for i, part in enumerate(parts):
        args, kwargs = part.args_info
        assert not kwargs and len(args) == 4, "forward part(weights, kv, carry, packed)"
        weights, kv, carry, packed = args
        weights_passed += len(weights)
        assert len(kv) == len(runner.parts[i])
        assert all(a.donated for a in jax.tree.leaves(kv)), "the pool is updated in place"
        assert (carry is None) == (i == 0)
        assert packed.dtype == np.int32 and len(packed.shape) == 1
    assert weights_passed >= len(runner._param_leaves)
    args, kwargs = runner.executable(("readout", 64, 4, 8)).args_info
    assert not kwargs and len(args) == 3, "readout(embedding, hidden, packed)"
    assert args[2].dtype == np.int32 and len(args[2].shape) == 1


def test_steady_state_never_compiles(engine, rng):
    before = engine.runner.compilations
    with CompileCounter() as counter:
        for qs in _workload(rng, engine.config.vocab_size):
            result = engine.run(qs)
            assert all(np.isclose(sum(p), 1.0) for p in result.probabilities)
        engine.run(_workload(rng, engine.config.vocab_size)[0], chunk=7)
    assert counter.count == 0, f"{counter.count} compilations after warmup"
    assert engine.runner.compilations == before


def test_the_counter_sees_a_compilation():
    """The check above can fail: a fresh shape does register."""
    with CompileCounter() as counter:
        jax.jit(lambda x: x * 3 + 1)(np.arange(17.0)).block_until_ready()
    assert counter.count >= 1


def test_stats_report_the_pool(engine):
    stats = engine.stats()
    k, _ = engine.runner.kv[0]
    assert stats["kv_pool_bytes"] == 2 * len(engine.runner.kv) * k.size * k.dtype.itemsize
    assert stats["kv_pages_total"] == BUCKETS.kv_pages - 1


def test_more_readout_rows_than_tokens_never_compiles(rng):
    """Identical questions share their forest branch but keep one readout row each, so a step
    can read more rows than it computes tokens: 24 rows on an 8-token step (16-token bucket,
    64-row bucket). Warmup must have compiled that readout too."""
    config = ModelConfig.from_hf_config(
        dict(TINY_HF_CONFIGS["gemma3"], max_position_embeddings=1024)
    )
    buckets = EngineConfig(
        page_size=8,
        kv_pages=64,
        token_buckets=(16, 64),
        row_buckets=(1, 4, 16, 64),
        candidate_buckets=(2, 8, 256),
    )
    engine = Engine(
        config, init_random(config, "int8", seed=5), None, None,
        engine_config=buckets, warmup=True, progress=False,
    )  # fmt: skip
    vocab = config.vocab_size
    state = tuple(int(x) for x in rng.integers(0, vocab, 40))
    engine.run([RenderedQuestion(state, (7, 8), ((1,), (2,)))])  # the state is now cached
    question = RenderedQuestion(
        state, tuple(int(x) for x in rng.integers(0, vocab, 8)), ((1,), (2,))
    )
    with CompileCounter() as counter:
        result = engine.run([question] * 24)
    assert counter.count == 0, f"{counter.count} compilations after warmup"
    assert len(result.probabilities) == 24
    assert len({tuple(p) for p in result.probabilities}) == 1, "identical questions, same bits"
