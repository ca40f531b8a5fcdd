"""Requests -> one token forest: root/trunk prefixes, question branches, option leaves.

Every shared token is computed once. A token attends to its own segment up to itself and to
every ancestor segment; positions continue from the parent, so a branch sees exactly the
positions it would see as a lone prompt. The forest is flat numpy (T tokens, R readout rows,
C candidates per row); padding to static buckets happens in `pad`.
"""

from __future__ import annotations

import bisect
import dataclasses

import numpy as np

from prism_jax.prompts import RenderedQuestion

TOKEN_BUCKETS = tuple(2**i for i in range(6, 15))  # 64 ... 16384
ROW_BUCKETS = tuple(2**i for i in range(0, 11))  # 1 ... 1024
CAND_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclasses.dataclass
class Forest:
    tokens: list[int] = dataclasses.field(default_factory=list)
    positions: list[int] = dataclasses.field(default_factory=list)
    segment_of: list[int] = dataclasses.field(default_factory=list)  # per token
    parents: list[int] = dataclasses.field(default_factory=list)  # per segment, -1 = root
    rows: list[int] = dataclasses.field(default_factory=list)  # token index per readout row
    candidates: list[list[int]] = dataclasses.field(default_factory=list)
    use_lse: list[bool] = dataclasses.field(default_factory=list)
    # terms[q][o]: (row, column) pairs whose log-probabilities add up to option o's score
    terms: list[list[list[tuple[int, int]]]] = dataclasses.field(default_factory=list)
    prefix_segments: dict[tuple[int, ...], int] = dataclasses.field(default_factory=dict)

    def add_segment(self, ids: tuple[int, ...], parent: int, start: int) -> int:
        seg = len(self.parents)
        self.parents.append(parent)
        for i, t in enumerate(ids):
            self.tokens.append(int(t))
            self.positions.append(start + i)
            self.segment_of.append(seg)
        return seg

    def add_row(self, token_index: int, candidates: list[int], use_lse: bool) -> int:
        self.rows.append(token_index)
        self.candidates.append(candidates)
        self.use_lse.append(use_lse)
        return len(self.rows) - 1

    def computed_tokens(self) -> int:
        return len(self.tokens)

    def mask(self) -> np.ndarray:
        """bool [T, T]: mask[q, k] = k in q's segment up to q, or in an ancestor segment."""
        s = len(self.parents)
        ancestor = np.eye(s, dtype=bool)  # ancestor[a, b]: b is a or an ancestor of a
        for a in range(s):
            b = self.parents[a]
            while b >= 0:
                ancestor[a, b] = True
                b = self.parents[b]
        seg = np.asarray(self.segment_of)
        idx = np.arange(len(seg))
        same = seg[:, None] == seg[None, :]
        return ancestor[seg[:, None], seg[None, :]] & (~same | (idx[None, :] <= idx[:, None]))


def _single_token_fast_path(q: RenderedQuestion) -> bool:
    firsts = [o[0] for o in q.options]
    return all(len(o) == 1 for o in q.options) and len(set(firsts)) == len(firsts)


def _add_question(f: Forest, q: RenderedQuestion) -> None:
    parent = f.prefix_segments.get(q.prefix, -1)
    if q.prefix and parent < 0:
        parent = f.add_segment(q.prefix, -1, 0)
        f.prefix_segments[q.prefix] = parent
    start = len(q.prefix)
    f.add_segment(q.branch, parent, start)
    slot = len(f.tokens) - 1
    branch_seg = f.segment_of[slot]
    if _single_token_fast_path(q):
        # Candidate-only readout: renormalised over the options, no vocabulary pass.
        row = f.add_row(slot, [o[0] for o in q.options], use_lse=False)
        f.terms.append([[(row, c)] for c in range(len(q.options))])
        return
    firsts = list(dict.fromkeys(o[0] for o in q.options))
    row = f.add_row(slot, firsts, use_lse=True)
    question_terms = []
    for option in q.options:
        terms = [(row, firsts.index(option[0]))]
        if len(option) > 1:  # leaf: feed option[:-1]; token j predicts option[j + 1]
            f.add_segment(option[:-1], branch_seg, start + len(q.branch))
            leaf_end = len(f.tokens)
            for j in range(1, len(option)):
                leaf_row = f.add_row(leaf_end - len(option) + j, [option[j]], use_lse=True)
                terms.append((leaf_row, 0))
        question_terms.append(terms)
    f.terms.append(question_terms)


def build_forest(questions: list[RenderedQuestion]) -> Forest:
    """One forest for all questions; identical prefixes are computed once."""
    assert questions, "a forest needs at least one question"
    f = Forest()
    for q in questions:
        _add_question(f, q)
    return f


def bucket(n: int, buckets: tuple[int, ...], what: str) -> int:
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"{what} = {n} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]


def pad(f: Forest) -> dict[str, np.ndarray]:
    """Static-shape arrays for one jitted step (T, R, C, Q, O, L padded to buckets)."""
    t = bucket(len(f.tokens), TOKEN_BUCKETS, "tokens in one step")
    r = bucket(len(f.rows), ROW_BUCKETS, "readout rows in one step")
    c = bucket(max(len(x) for x in f.candidates), CAND_BUCKETS, "candidates per row")
    n = len(f.tokens)
    mask = np.zeros((t, t), bool)
    mask[:n, :n] = f.mask()
    mask[np.arange(n, t), np.arange(n, t)] = True  # padding attends only itself: no NaN rows
    ids = np.zeros((r, c), np.int32)
    counts = np.ones(r, np.int32)
    for i, cands in enumerate(f.candidates):
        ids[i, : len(cands)] = cands
        counts[i] = len(cands)
    rows = np.zeros(r, np.int32)
    rows[: len(f.rows)] = f.rows
    use_lse = np.zeros(r, bool)
    use_lse[: len(f.use_lse)] = f.use_lse
    q = len(f.terms)
    o = max(len(x) for x in f.terms)
    length = max(len(terms) for x in f.terms for terms in x)
    term_index = np.full((q, o, length), -1, np.int32)  # flat index row * C + column
    for qi, options in enumerate(f.terms):
        for oi, terms in enumerate(options):
            for li, (row, col) in enumerate(terms):
                term_index[qi, oi, li] = row * c + col
    tokens = np.zeros(t, np.int32)
    tokens[:n] = f.tokens
    positions = np.zeros(t, np.int32)
    positions[:n] = f.positions
    return dict(tokens=tokens, positions=positions, mask=mask, rows=rows, cand_ids=ids,
                cand_counts=counts, use_lse=use_lse, terms=term_index)
