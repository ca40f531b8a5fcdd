"""plan_steps and step_arrays against their token-by-token references (the scheduler's first
implementation, kept here): the same steps, rows and padded arrays on random forests (shared
states, repeated questions, multi-token options), cut into random chunks, cold and after
prefix-cache hits. The engine fills a step a segment run at a time because this host work
precedes every step's first kernel (benchmarks/host_prep.py)."""

from __future__ import annotations

import numpy as np
import pytest

from prism_jax.config import EngineConfig
from prism_jax.forest import bucket, build_forest
from prism_jax.kv_pages import DUMMY_PAGE, PagePool
from prism_jax.prefix_cache import PrefixCache
from prism_jax.prompts import RenderedQuestion
from prism_jax.scheduler import _chain_tables, place, plan_steps, readout_arrays, release
from prism_jax.scheduler import step_arrays as step_arrays_by_runs

CFG = EngineConfig(
    page_size=4,
    kv_pages=512,
    token_buckets=(8, 16, 64, 256),
    row_buckets=(1, 4, 16, 64),
    candidate_buckets=(2, 4, 8, 256),
)


def reference_plan(forest, placements, chunk):
    """[(work [(segment, offset)], written, rows)] one token at a time."""
    work = [
        (i, j)
        for i, (seg, p) in enumerate(zip(forest.segments, placements, strict=True))
        if p.computed
        for j in range(len(seg.tokens))
    ]
    rows_at: dict[tuple[int, int], list[int]] = {}
    for r, at in enumerate(forest.row_at):
        rows_at.setdefault(at, []).append(r)
    steps = []
    for lo in range(0, len(work), chunk):
        part = work[lo : lo + chunk]
        written = {seg: off + 1 for seg, off in part}
        steps.append((part, written, [r for at in part for r in rows_at.get(at, [])]))
    return steps


def work(plan) -> list[tuple[int, int]]:
    """(segment, offset) of each token the step computes, from its runs."""
    return [(seg, off + i) for seg, off, count in plan.runs for i in range(count)]


def reference_arrays(forest, placements, plan, engine, num_pages):
    """step_arrays filled one token at a time."""
    n, page_size = len(work(plan)), engine.page_size
    t = bucket(n, engine.token_buckets, "tokens in one step")
    segs, flat, chain_index = _chain_tables(
        forest, placements, plan, t, engine.chain_depth, num_pages
    )
    tokens = np.zeros(t, np.int32)
    positions = np.full(t, -1, np.int32)
    chain_of = np.full(t, -1, np.int32)
    slot = np.full(t, DUMMY_PAGE * page_size, np.int32)
    index_of = {}
    for i, (seg, off) in enumerate(work(plan)):
        s = forest.segments[seg]
        tokens[i], positions[i] = s.tokens[off], s.start + off
        chain_of[i] = chain_index[seg]
        slot[i] = placements[seg].pages[off // page_size] * page_size + off % page_size
        index_of[(seg, off)] = i
    out = dict(tokens=tokens, positions=positions, slot=slot, chain_of=chain_of)
    out |= dict(chain_segments=segs, pages_flat=flat)
    return out | readout_arrays(forest, plan.rows, index_of, engine)


def _questions(rng, vocab=500):
    def toks(n):
        return tuple(int(x) for x in rng.integers(0, vocab, n))

    root = toks(int(rng.integers(1, 9)))
    states = [root + toks(int(rng.integers(0, 40))) for _ in range(2)]
    out = []
    for _ in range(int(rng.integers(1, 7))):
        options = [(int(x),) for x in rng.choice(vocab, int(rng.integers(2, 5)), replace=False)]
        if rng.random() < 0.4:  # leaves under the answer slot
            options[0] = (options[0][0], *toks(int(rng.integers(1, 4))))
        q = RenderedQuestion(states[int(rng.integers(0, 2))], toks(int(rng.integers(1, 9))),
                             tuple(options))  # fmt: skip
        out += [q] * int(rng.integers(1, 3))  # repeats share their branch, keep their rows
    return out, len(root)


@pytest.mark.parametrize("trial", range(12))
def test_runs_match_the_token_by_token_reference(trial, rng):
    cache = PrefixCache(PagePool(CFG.kv_pages, CFG.page_size))
    qs, root_len = _questions(rng)
    for hit in (False, True):  # the second pass finds every prefix in the cache
        forest = build_forest(qs, root_len)
        placements = place(forest, cache)
        cached = [not p.computed for p in placements]
        assert cached == [hit and s.cacheable for s in forest.segments]
        chunk = int(rng.choice([1, 3, 7, 16, 64, 256]))
        plans = plan_steps(forest, placements, chunk)
        want = reference_plan(forest, placements, chunk)
        assert [(work(p), p.written, p.rows) for p in plans] == want, f"chunk {chunk}"
        for plan in plans:
            got = step_arrays_by_runs(forest, placements, plan, CFG, CFG.kv_pages)
            ref = reference_arrays(forest, placements, plan, CFG, CFG.kv_pages)
            assert got.keys() == ref.keys()
            for key, value in ref.items():
                np.testing.assert_array_equal(got[key], value, err_msg=f"{key}, hit={hit}")
                assert got[key].dtype == value.dtype, key
        release(placements, cache, completed=True)


def test_a_numpy_token_tuple_is_one_segment_with_the_int_tuple():
    ints = RenderedQuestion((5, 6, 7), (8,), ((1,), (2,)))
    numpy_ints = RenderedQuestion(tuple(np.int64(x) for x in (5, 6, 7)), (9,), ((1,), (2,)))
    forest = build_forest([ints, numpy_ints])
    assert [len(s.tokens) for s in forest.segments] == [3, 1, 1], "the prefix is shared"
