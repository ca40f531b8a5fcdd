"""The tree_attention benchmark's problems: step tables from the engine's own forest and
scheduler code, and the exact work each step asks for (for attention_bench.py).

Letters: T tokens of the step (padded to a token bucket), N query heads, K kv heads, H head dim,
P pages, L page size, B batches of the dense baseline, Tq its queries, S its keys.

A case is one engine step: `scheduler.step_arrays` on a `Forest` whose segments are placed on
consecutive pages (page 0 is the dummy page), cut by `plan_steps` into chunks of the largest
token bucket, as `Engine.decide` does. Cached context (decode) is a placement with
computed=False, i.e. a prefix-cache hit. `account` counts what the step must do: the keys each
real token sees (so FLOPs count only unmasked keys) and the KV rows the step reads at least once.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from prism_jax.config import EngineConfig
from prism_jax.forest import Forest
from prism_jax.scheduler import Placement, plan_steps, step_arrays

TABLES = ("slot", "positions", "chain_of", "chain_segments", "pages_flat")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    arrays: dict  # step_arrays' slot, positions, chain_of, chain_segments, pages_flat
    num_pages: int  # P of the pool (page 0 included)
    what: str  # one line: what one call of this case is


def _place(forest: Forest, page_size: int, cached: set[int]) -> tuple[list[Placement], int]:
    """Consecutive pages per segment from page 1; segments in `cached` are prefix-cache hits."""
    out, nxt = [], 1
    for i, seg in enumerate(forest.segments):
        count = -(-len(seg.tokens) // page_size)
        out.append(Placement(list(range(nxt, nxt + count)), i not in cached, None))
        nxt += count
    return out, nxt


def _steps(forest: Forest, cached: set[int], engine: EngineConfig) -> tuple[list[dict], int]:
    placements, num_pages = _place(forest, engine.page_size, cached)
    plans = plan_steps(forest, placements, chunk=engine.max_step_tokens)
    steps = [step_arrays(forest, placements, p, engine, num_pages) for p in plans]
    return [{k: a[k] for k in TABLES} for a in steps], num_pages


def _tokens(seed: int, n: int) -> tuple[int, ...]:
    return tuple(int(x) for x in np.random.default_rng(seed).integers(3, 200_000, n))


def forest_prefill(engine: EngineConfig, root: int, state: int, branches: int, blen: int) -> Case:
    """Root + state (trunk) + `branches` question branches under it, all computed in one step."""
    f = Forest()
    r = f.add_segment(_tokens(1, root), -1, 0, cacheable=True)
    s = f.add_segment(_tokens(2, state), r, root, cacheable=True)
    for b in range(branches):
        f.add_segment(_tokens(10 + b, blen), s, root + state, cacheable=False)
    (step,), p = _steps(f, set(), engine)
    total = root + state + branches * blen
    what = f"forest prefill: root {root} + state {state} + {branches}x{blen} = {total} tokens"
    return Case(f"forest_{root}+{state}+{branches}x{blen}", step, p, what)


def one_question(engine: EngineConfig, length: int) -> Case:
    """One prompt of `length` tokens computed from scratch (e2e_decide's one_question step):
    a state prefill that fits one step."""
    steps, p = state_prefill(engine, length)
    assert len(steps) == 1, f"a {length}-token question takes {len(steps)} steps, not one"
    return Case(f"question_{length}", steps[0], p, f"one question: a {length}-token prompt")


def follow_up(engine: EngineConfig, root: int, state: int, blen: int) -> Case:
    """A `blen`-token question under a cached root + state (e2e_decide's follow_up_4k step)."""
    f = Forest()
    r = f.add_segment(_tokens(1, root), -1, 0, cacheable=True)
    s = f.add_segment(_tokens(2, state), r, root, cacheable=True)
    f.add_segment(_tokens(10, blen), s, root + state, cacheable=False)
    (step,), p = _steps(f, {r, s}, engine)
    what = f"follow-up: {blen} question tokens on a cached {root} + {state} prefix"
    return Case(f"followup_{root}+{state}+{blen}", step, p, what)


def state_prefill(engine: EngineConfig, length: int) -> tuple[list[dict], int]:
    """A `length`-token state prefilled from scratch: every chunk's tables (the engine's cut)."""
    f = Forest()
    f.add_segment(_tokens(3, length), -1, 0, cacheable=True)
    return _steps(f, set(), engine)


def state_chunk(engine: EngineConfig, length: int, which: int) -> Case:
    steps, p = state_prefill(engine, length)
    idx = which % len(steps)
    lo = idx * engine.max_step_tokens
    hi = min(lo + engine.max_step_tokens, length)
    what = f"chunk {idx + 1}/{len(steps)} of a {length}-token state: queries {lo}..{hi - 1}"
    tag = "first" if idx == 0 else "last"
    return Case(f"state{length}_{tag}_chunk", steps[idx], p, what)


def decode(engine: EngineConfig, seqs: int, context: int) -> Case:
    """`seqs` sequences, each `context` cached tokens (prefix-cache hits) + 1 new token."""
    f = Forest()
    cached = set()
    for b in range(seqs):
        ctx = f.add_segment(_tokens(100 + b, context), -1, 0, cacheable=True)
        cached.add(ctx)
        f.add_segment(_tokens(10_000 + b, 1), ctx, context, cacheable=False)
    (step,), p = _steps(f, cached, engine)
    what = f"decode: {seqs} sequences x {context} cached tokens, 1 new token each"
    return Case(f"decode_{seqs}x{context}", step, p, what)


def chain_rows(segs: np.ndarray, pages_flat: np.ndarray, page_size: int):
    """(positions, pool rows) a chain [S, 3] holds, in increasing position (segments of the
    engine's chains never overlap and come ancestors first)."""
    pos, rows = [], []
    for start, length, first in segs:
        if length <= 0:
            continue
        rel = np.arange(length)
        pos.append(start + rel)
        rows.append(pages_flat[first + rel // page_size] * page_size + rel % page_size)
    pos, rows = np.concatenate(pos), np.concatenate(rows)
    assert np.all(np.diff(pos) > 0), "chain segments overlap or are out of order"
    return pos, rows


def visible(arrays: dict, page_size: int, window: int):
    """Per chain: (token indices, keys each sees [T_c], pool rows read by any of them [R_c])."""
    chain_of, positions = arrays["chain_of"], arrays["positions"]
    out = []
    for c in np.unique(chain_of[(chain_of >= 0) & (positions >= 0)]):
        t = np.nonzero((chain_of == c) & (positions >= 0))[0]
        pos, rows = chain_rows(arrays["chain_segments"][c], arrays["pages_flat"], page_size)
        qpos = positions[t]
        lo = qpos - window + 1 if window > 0 else np.zeros_like(qpos)
        i_lo = np.searchsorted(pos, lo, "left")
        i_hi = np.searchsorted(pos, qpos, "right")
        cover = np.zeros(len(pos) + 1, np.int64)  # difference array over the chain's keys
        np.add.at(cover, i_lo, 1)
        np.add.at(cover, i_hi, -1)
        seen = np.cumsum(cover[:-1]) > 0
        out.append((t, i_hi - i_lo, rows[seen], pos, rows, i_lo, i_hi))
    return out


def account(
    arrays: dict, page_size: int, window: int, n: int, k: int, h: int, kv_item: int, q_item: int
) -> dict:
    """The step's useful work. flops = 2 * 2 * N * H * (keys seen, summed over real tokens)
    (q.k and p.v, unmasked keys only); bytes = each KV row read once (K * H keys + values) +
    real tokens' q read and out written + their k/v read and written into the pool."""
    per_chain = visible(arrays, page_size, window)
    tokens = sum(len(c[0]) for c in per_chain)
    keys = int(sum(int(c[1].sum()) for c in per_chain))
    rows = np.unique(np.concatenate([c[2] for c in per_chain])) if per_chain else np.zeros(0)
    kv_bytes = 2 * len(rows) * k * h * kv_item
    io_bytes = 2 * tokens * n * h * q_item + 2 * 2 * tokens * k * h * kv_item
    return {
        "tokens": tokens,
        "step_tokens": int(len(arrays["positions"])),
        "keys_attended": keys,
        "kv_rows_read": int(len(rows)),
        "flops": 4 * n * h * keys,
        "kv_bytes": kv_bytes,
        "bytes": kv_bytes + io_bytes,
    }


def _fill(mask: np.ndarray, lut: np.ndarray, chain, first_query: int) -> None:
    _, _, _, _, rows, i_lo, i_hi = chain
    for i, (a, z) in enumerate(zip(i_lo, i_hi, strict=True)):
        mask[first_query + i, lut[rows[a:z]]] = True


def dense_problem(arrays: dict, page_size: int, window: int):
    """The same attention as a dense batch for XLA: (B, Tq, S, mask bool [B, Tq, S]). Chains
    that share no KV row are separate batch entries (decode); otherwise one entry over every
    row read, each query masked to its own visible keys (forest, prefill chunk)."""
    per_chain = visible(arrays, page_size, window)
    seen = [c[2] for c in per_chain]
    allrows = np.unique(np.concatenate(seen))
    lut = np.zeros(int(allrows.max()) + 1, np.int64)
    if len(per_chain) > 1 and sum(map(len, seen)) == len(allrows):  # disjoint: a batch
        tq, s = max(len(c[0]) for c in per_chain), max(map(len, seen))
        mask = np.zeros((len(per_chain), tq, s), bool)
        for b, chain in enumerate(per_chain):
            lut[chain[2]] = np.arange(len(chain[2]))
            _fill(mask[b], lut, chain, 0)
        return len(per_chain), tq, s, mask
    lut[allrows] = np.arange(len(allrows))
    tq = sum(len(c[0]) for c in per_chain)
    mask = np.zeros((1, tq, len(allrows)), bool)
    done = 0
    for chain in per_chain:
        _fill(mask[0], lut, chain, done)
        done += len(chain[0])
    return 1, tq, len(allrows), mask
