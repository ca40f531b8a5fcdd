"""Static-shape step planning: a forest placed in the KV pool -> padded step arrays.

`place` resolves each forest segment against the prefix cache (a hit reuses its pages and
computes nothing) or gives it fresh pages. `plan_steps` cuts the tokens still to compute into
steps of at most `chunk` tokens, parents before children, cutting anywhere (even inside a
segment: a segment prefilled over several steps is one segment whose written length grows).
`step_arrays` pads one step to its buckets. The scheduler works on host data only; the runner
(engine.py) owns the device arrays.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from prism_jax.config import EngineConfig
from prism_jax.forest import Forest, bucket
from prism_jax.kv_pages import DUMMY_PAGE
from prism_jax.ops.tree_attention import pack_chains
from prism_jax.prefix_cache import Node, PrefixCache


@dataclasses.dataclass
class Placement:
    pages: list[int]
    computed: bool  # its tokens are computed in this run (False: a prefix-cache hit)
    node: Node | None  # the prefix-cache node (cacheable segments), else None


def place(forest: Forest, cache: PrefixCache) -> list[Placement]:
    """Pages for every segment; cacheable ones through the prefix cache. On failure every
    page and reference taken so far is given back before the error propagates."""
    out: list[Placement] = []
    try:
        for seg in forest.segments:
            parent = out[seg.parent].node if seg.parent >= 0 else None
            under_cached = seg.parent < 0 or parent is not None
            if seg.cacheable and under_cached:
                hit = cache.lookup(parent, seg.tokens)
                if hit is not None:
                    out.append(Placement(hit.pages, False, hit))
                    continue
                node = cache.insert(parent, seg.tokens, seg.start)
                out.append(Placement(node.pages, True, node))
            else:
                pages = cache.allocate(cache.pool.pages_for(len(seg.tokens)))
                out.append(Placement(pages, True, None))
    except Exception:
        release(out, cache, completed=False)
        raise
    return out


def release(placements: list[Placement], cache: PrefixCache, completed: bool) -> None:
    """After a run: segments computed into the cache become ready (or are dropped if the run
    failed), references are returned, ephemeral pages go back to the pool."""
    for p in reversed(placements):  # children before parents
        if p.node is None:
            cache.pool.free(p.pages)
        elif p.computed and not completed:
            cache.discard(p.node)
        else:
            p.node.ready = True
            cache.release(p.node)


@dataclasses.dataclass(frozen=True)
class StepPlan:
    # (segment, first offset, count) of the tokens computed in the step, in step order: a step
    # is a contiguous cut of the forest's tokens, so each segment is one run of it.
    runs: list[tuple[int, int, int]]
    written: dict[int, int]  # segment -> tokens written by the end of the step
    rows: list[int]  # forest readout rows whose token is computed in this step

    @property
    def tokens(self) -> int:
        return sum(count for _, _, count in self.runs)


def plan_steps(forest: Forest, placements: list[Placement], chunk: int) -> list[StepPlan]:
    """The tokens to compute, in segment order, cut into steps of at most `chunk` tokens.
    Whole runs of a segment at a time (no per-token Python: this is on every step's path)."""
    assert chunk >= 1, f"chunk must be >= 1, got {chunk}"
    base: dict[int, int] = {}  # computed segment -> its first token's index in the cut order
    runs: list[list[tuple[int, int, int]]] = []
    total = 0
    for i, (seg, p) in enumerate(zip(forest.segments, placements, strict=True)):
        if not p.computed:
            continue
        base[i] = total
        off, n = 0, len(seg.tokens)
        while off < n:
            if total % chunk == 0:
                runs.append([])
            count = min(n - off, chunk - total % chunk)
            runs[-1].append((i, off, count))
            off, total = off + count, total + count
    rows: list[list[tuple[int, int]]] = [[] for _ in runs]
    for r, (seg, off) in enumerate(forest.row_at):
        assert seg in base, f"readout row {r} is in segment {seg}, which is not computed"
        at = base[seg] + off
        rows[at // chunk].append((at, r))
    steps = [
        StepPlan(part, {seg: off + count for seg, off, count in part}, [r for _, r in sorted(x)])
        for part, x in zip(runs, rows, strict=True)
    ]
    assert sum(len(s.rows) for s in steps) == len(forest.row_at), "every row is read once"
    return steps


def _chain_tables(forest, placements, plan: StepPlan, c: int, s: int, pt: int):
    chains, chain_index = [], {}
    for seg, _, _ in plan.runs:  # one run per segment
        chain_index[seg] = len(chains)
        chain = []
        for a in forest.chain(seg):
            length = plan.written[a] if a == seg else len(forest.segments[a].tokens)
            chain.append((forest.segments[a].start, length, placements[a].pages))
        chains.append(chain)
    segs, flat = pack_chains(chains, num_chains=c, max_segments=s, num_pages=pt)
    return segs, flat, chain_index


def step_arrays(
    forest: Forest,
    placements: list[Placement],
    plan: StepPlan,
    engine: EngineConfig,
    num_pages: int,
    min_tokens: int = 0,
) -> dict[str, np.ndarray]:
    """One step padded to its buckets (at least the bucket of min_tokens): tokens, tables,
    and readout rows / candidates. Filled a segment run at a time."""
    t = bucket(max(plan.tokens, min_tokens), engine.token_buckets, "tokens in one step")
    page_size = engine.page_size
    segs, flat, chain_index = _chain_tables(
        forest, placements, plan, t, engine.chain_depth, num_pages
    )
    tokens = np.zeros(t, np.int32)
    positions = np.full(t, -1, np.int32)
    chain_of = np.full(t, -1, np.int32)
    slot = np.full(t, DUMMY_PAGE * page_size, np.int32)
    first_of = {}  # segment -> step index of its offset 0 (its run may start later)
    at = 0
    for seg, off, count in plan.runs:
        s, end = forest.segments[seg], at + count
        offsets = np.arange(off, off + count)
        tokens[at:end] = s.tokens[off : off + count]
        positions[at:end] = s.start + offsets
        chain_of[at:end] = chain_index[seg]
        pages = np.asarray(placements[seg].pages, np.int64)
        slot[at:end] = pages[offsets // page_size] * page_size + offsets % page_size
        first_of[seg] = at - off
        at = end
    out = dict(
        tokens=tokens,
        positions=positions,
        slot=slot,
        chain_of=chain_of,
        chain_segments=segs,
        pages_flat=flat,
    )
    index_of = {
        (seg, off): first_of[seg] + off for seg, off in (forest.row_at[r] for r in plan.rows)
    }
    out.update(readout_arrays(forest, plan.rows, index_of, engine))
    return out


def readout_arrays(forest: Forest, rows: list[int], index_of, engine: EngineConfig):
    """rows int32 [R] (token index in the step), cand_ids [R, C], cand_counts [R], and
    lse_rows int32 [R'] (step token index of the rows that need the vocabulary pass, first
    len(lse_of) of them; R' from the row buckets) with lse_of: those rows' positions in rows.
    out_rows: rows zero-padded to the largest row bucket (the forward's copy of them)."""
    r = bucket(max(len(rows), 1), engine.row_buckets, "readout rows in one step")
    widest = max([len(forest.candidates[x]) for x in rows] + [1])
    c = bucket(widest, engine.candidate_buckets, "candidates per row")
    idx = np.zeros(r, np.int32)
    ids = np.zeros((r, c), np.int32)
    counts = np.ones(r, np.int32)
    for i, x in enumerate(rows):
        idx[i] = index_of[forest.row_at[x]]
        ids[i, : len(forest.candidates[x])] = forest.candidates[x]
        counts[i] = len(forest.candidates[x])
    lse_of = [i for i, x in enumerate(rows) if forest.use_lse[x]]
    lse_rows = np.zeros(bucket(max(len(lse_of), 1), engine.row_buckets, "lse rows"), np.int32)
    lse_rows[: len(lse_of)] = idx[lse_of]
    out_rows = np.zeros(engine.row_buckets[-1], np.int32)
    out_rows[:r] = idx
    return dict(
        rows=idx,
        out_rows=out_rows,
        cand_ids=ids,
        cand_counts=counts,
        lse_rows=lse_rows,
        lse_of=np.asarray(lse_of, np.int32),
    )


def pad(forest: Forest, engine: EngineConfig | None = None) -> dict[str, np.ndarray]:
    """The whole forest as one step on a fresh pool (pages 1..n): the batch of
    `make_decide_fn`. Adds use_lse [R] and terms [Q, O, L] (flat indices row * C + column)."""
    engine = engine or EngineConfig(token_buckets=(64, 128, 256, 512, 1024, 2048, 4096, 8192))
    placements, next_page = [], 1
    for seg in forest.segments:
        count = -(-len(seg.tokens) // engine.page_size)
        placements.append(Placement(list(range(next_page, next_page + count)), True, None))
        next_page += count
    (plan,) = plan_steps(forest, placements, chunk=max(forest.computed_tokens(), 1))
    pt = bucket(next_page, engine.token_buckets, "KV pages of one forest")
    out = step_arrays(forest, placements, plan, engine, num_pages=pt)
    r, c = out["cand_ids"].shape
    order = {row: i for i, row in enumerate(plan.rows)}
    use_lse = np.zeros(r, bool)
    for row, i in order.items():
        use_lse[i] = forest.use_lse[row]
    out["use_lse"] = use_lse
    out["terms"] = term_index(forest, order, c)
    return out


def term_index(forest: Forest, order: dict[int, int], c: int) -> np.ndarray:
    """int32 [Q, O, L]: option terms as flat indices (table row order[row]) * c + column."""
    q = len(forest.terms)
    o = max(len(x) for x in forest.terms)
    length = max(len(terms) for x in forest.terms for terms in x)
    out = np.full((q, o, length), -1, np.int32)
    for qi, options in enumerate(forest.terms):
        for oi, terms in enumerate(options):
            for li, (row, col) in enumerate(terms):
                out[qi, oi, li] = order[row] * c + col
    return out
