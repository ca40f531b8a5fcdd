"""Step planning on the host: placement through the prefix cache, chunked steps that cut
anywhere, slots on the segment's own pages, chains with growing lengths, and clean release."""

from __future__ import annotations

import numpy as np
import pytest

from prism_jax.config import EngineConfig
from prism_jax.forest import build_forest
from prism_jax.kv_pages import OutOfPages, PagePool
from prism_jax.prefix_cache import PrefixCache
from prism_jax.prompts import RenderedQuestion
from prism_jax.scheduler import place, plan_steps, release, step_arrays

CFG = EngineConfig(
    page_size=4,
    kv_pages=64,
    token_buckets=(8, 16, 64),
    row_buckets=(1, 4),
    candidate_buckets=(2, 4, 256),
)
PREFIX = tuple(range(100, 110))  # root 3 + trunk 7
QS = [
    RenderedQuestion(PREFIX, (1, 2, 3), ((7,), (8,))),
    RenderedQuestion(PREFIX, (4, 5), ((9, 10, 11), (12,))),
]


def _setup():
    cache = PrefixCache(PagePool(CFG.kv_pages, CFG.page_size))
    forest = build_forest(QS, root_len=3)
    return cache, forest, place(forest, cache)


def test_segments_root_trunk_branches_leaf():
    _, forest, placements = _setup()
    kinds = [(s.start, len(s.tokens), s.cacheable) for s in forest.segments]
    assert kinds == [(0, 3, True), (3, 7, True), (10, 3, False), (10, 2, False), (12, 2, False)]
    assert [len(p.pages) for p in placements] == [1, 2, 1, 1, 1]
    assert forest.question_chains == [[0, 1, 2], [0, 1, 3, 4]]


def test_chunks_cut_anywhere_and_read_every_row_once():
    _, forest, placements = _setup()
    steps = plan_steps(forest, placements, chunk=5)
    assert [s.tokens for s in steps] == [5, 5, 5, 2]
    assert sorted(r for s in steps for r in s.rows) == list(range(len(forest.row_at)))
    assert steps[0].written == {0: 3, 1: 2}  # the trunk is half written after step 0
    arrays = step_arrays(forest, placements, steps[1], CFG, num_pages=CFG.kv_pages)
    # step 1 = trunk tokens 2..6: its chain is root (3 tokens) + trunk written up to 7
    chain = arrays["chain_segments"][arrays["chain_of"][0]]
    assert tuple(chain[0][:2]) == (0, 3) and tuple(chain[1][:2]) == (3, 7)
    trunk_pages = placements[1].pages
    expect = [trunk_pages[o // 4] * 4 + o % 4 for o in range(2, 7)]
    assert list(arrays["slot"][:5]) == expect
    assert arrays["tokens"].shape == (8,) and list(arrays["positions"][5:]) == [-1] * 3
    assert (arrays["slot"][5:] // CFG.page_size == 0).all()  # padding -> dummy page


def test_cache_hit_computes_only_the_branches():
    cache, forest, placements = _setup()
    release(placements, cache, completed=True)
    again = place(build_forest(QS, root_len=3), cache)
    assert [p.computed for p in again] == [False, False, True, True, True]
    assert again[1].pages == placements[1].pages
    steps = plan_steps(forest, again, chunk=64)
    assert len(steps) == 1 and steps[0].tokens == 3 + 2 + 2


def test_failed_run_gives_everything_back():
    cache, forest, placements = _setup()
    release(placements, cache, completed=False)
    assert cache.pool.free_pages == cache.pool.usable_pages and cache.cached_pages == 0
    small = PrefixCache(PagePool(4, CFG.page_size))  # 3 pages: the forest needs 6
    with pytest.raises(OutOfPages):
        place(build_forest(QS, root_len=3), small)
    assert small.pool.free_pages == 3 and small.cached_pages == 0


def test_readout_rows_index_the_step():
    _, forest, placements = _setup()
    (step,) = plan_steps(forest, placements, chunk=64)
    arrays = step_arrays(forest, placements, step, CFG, num_pages=CFG.kv_pages)
    toks = arrays["tokens"]
    assert [int(toks[i]) for i in arrays["rows"][: len(step.rows)]] == [3, 5, 9, 10]
    assert arrays["cand_ids"].shape == (4, 2)
    assert list(arrays["lse_of"]) == [1, 2, 3]  # q2's rows need the vocabulary pass
    np.testing.assert_array_equal(arrays["lse_rows"][:3], arrays["rows"][1:4])
