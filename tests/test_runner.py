"""Static shapes: warmup compiles every bucket, after which no workload compiles anything,
whatever its size, chunking, readout width or cache state."""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np
import pytest

from prism_jax.config import EngineConfig, ModelConfig
from prism_jax.engine import Engine
from prism_jax.model import init_random
from prism_jax.prompts import RenderedQuestion
from prism_jax.runner import Runner
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
    assert len(set(keys)) == len(keys)
    # readout_only_last_layer: the last layer per (tokens, rows), readouts per hidden rows R.
    assert ("forward", 256) in keys and ("tail", 256, 16) in keys and ("tail", 16, 1) in keys
    assert ("readout", 16, 16, 256) in keys and ("readout", 1, 1, 2) in keys
    assert ("lse", 16, 1) in keys and ("lse", 1, 1) in keys and ("lse", 1, 4) not in keys
    assert not [k for k in keys if k[0] == "readout" and k[1] != k[2]]


def test_whole_last_layer_keys():
    """readout_only_last_layer=False: no tail, readouts of hidden [T, D] at R rows."""
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS["qwen3"])
    whole = dataclasses.replace(BUCKETS, readout_only_last_layer=False)
    runner = Runner(config, init_random(config, "int8", seed=0), whole)
    keys = runner.bucket_keys()
    assert runner.parts == (range(config.num_layers),)
    assert not [k for k in keys if k[0] == "tail"]
    assert ("readout", 256, 16, 256) in keys and ("lse", 16, 64 // 4) in keys


def test_the_tail_runs_the_last_layer_on_the_rows(engine):
    """Past the attention, the last layer's GEMMs take the R readout rows (2R: two digits),
    not the step's T tokens; only its fused q/k/v projection (two calls with two digits)
    sees every token."""
    t, r = 256, 4
    text = engine.runner.executable(("tail", t, r)).as_text()
    rows = [
        int(m.group(1))
        for line in text.splitlines()
        if 'custom_call_target="prism_int8_gemm"' in line
        for m in [re.search(r"= \(?f32\[(\d+),", line)]
    ]
    small = [m for m in rows if m <= 2 * r]
    assert len(small) >= 3 and len(rows) - len(small) <= 2, rows
    assert all(m >= t for m in rows if m > 2 * r), rows


def test_the_forward_returns_the_rows_hidden(engine, rng):
    """With the tail, runner.forward gives hidden [R, D] in the order of arrays["rows"]."""
    from prism_jax.forest import build_forest
    from prism_jax.scheduler import place, plan_steps, release, step_arrays

    vocab = engine.config.vocab_size
    state = tuple(int(x) for x in rng.integers(0, vocab, 30))
    qs = [RenderedQuestion(state, (i + 1, i + 2), ((1,), (2,))) for i in range(3)]
    forest = build_forest(qs, 0)
    placements = place(forest, engine.cache)
    try:
        (plan,) = plan_steps(forest, placements, 64)
        arrays = step_arrays(forest, placements, plan, BUCKETS, engine.pool.num_pages)
        hidden = engine.runner.forward(arrays)
    finally:
        release(placements, engine.cache, completed=False)
    assert hidden.shape == (arrays["rows"].shape[0], engine.config.hidden_size)


def test_each_call_gets_one_integer_buffer(engine):
    """Every numpy input is its own host-to-device copy: each forward part takes its layers'
    weights, their pools, the previous part's carry and one packed int32 buffer; the readout
    the embedding, hidden and one buffer."""
    runner = engine.runner
    parts = runner.executable(("forward", 64)) + (runner.executable(("tail", 64, 4)),)
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
    args, kwargs = runner.executable(("readout", 4, 4, 8)).args_info
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


def test_readouts_land_in_host_memory_with_the_same_bits(engine, rng):
    """readout_memory="pinned_host" (the default) has the readout and lse executables write
    host memory; "device" keeps them on the device. Both give the same probabilities, bit for
    bit, on every question of the workload (multi-token options take the lse path)."""
    device = Engine(
        engine.config,
        engine.params,
        None,
        None,
        engine_config=dataclasses.replace(BUCKETS, readout_memory="device"),
        progress=False,
    )
    kinds = {}
    for key, runner in (("host", engine.runner), ("device", device.runner)):
        shardings = [
            runner.executable(("readout", 1, 1, 2)).output_shardings,
            runner.executable(("lse", 1, 1)).output_shardings,
        ]
        kinds[key] = {s.memory_kind for s in jax.tree.leaves(shardings)}
        devices = {d for s in jax.tree.leaves(shardings) for d in s.device_set}
        assert devices == runner._embedding.devices(), "the engine's device, not devices()[0]"
    assert kinds == {"host": {"pinned_host"}, "device": {"device"}}, kinds
    for qs in _workload(rng, engine.config.vocab_size)[:4]:
        got, want = engine.run(qs).probabilities, device.run(qs).probabilities
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64))


def test_an_unknown_readout_memory_is_refused():
    with pytest.raises(AssertionError, match="readout_memory must be one of"):
        EngineConfig(readout_memory="unified")
