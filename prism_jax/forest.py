"""Requests -> one token forest: root/trunk prefixes, question branches, option leaves.

Every shared token is computed once. A token attends to its own segment up to itself and to
every ancestor segment; positions continue from the parent, so a branch sees exactly the
positions it would see as a lone prompt. Segments are deduplicated by (parent, tokens): the
same root or state asked about by several questions, or by several requests of one step, is one
segment. Prefix segments (root, trunk) are what the prefix cache may keep; branches and leaves
hold readout rows and are computed every time.
"""

from __future__ import annotations

import bisect
import dataclasses

import numpy as np

from prism_jax.prompts import RenderedQuestion


@dataclasses.dataclass(frozen=True)
class Segment:
    tokens: tuple[int, ...]
    parent: int  # segment index, -1 for a root
    start: int  # absolute position of the first token
    cacheable: bool  # a prefix (root or trunk): the prefix cache may keep its KV


@dataclasses.dataclass
class Forest:
    segments: list[Segment] = dataclasses.field(default_factory=list)
    # Readout rows: (segment, offset in the segment) of the token whose next-token
    # distribution is read, its candidate token ids, and whether it needs the vocabulary lse.
    row_at: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    candidates: list[list[int]] = dataclasses.field(default_factory=list)
    use_lse: list[bool] = dataclasses.field(default_factory=list)
    # terms[q][o]: (row, column) pairs whose log-probabilities add up to option o's score
    terms: list[list[list[tuple[int, int]]]] = dataclasses.field(default_factory=list)
    # the segments each question reads (its chain, root first)
    question_chains: list[list[int]] = dataclasses.field(default_factory=list)
    _index: dict[tuple[int, tuple[int, ...]], int] = dataclasses.field(default_factory=dict)

    def add_segment(self, ids: tuple[int, ...], parent: int, start: int, cacheable: bool) -> int:
        """The segment for ids under parent; an identical one is reused."""
        assert ids, "a segment has at least one token"
        # A tuple is kept as it is: converting a 4K-token state id by id put a Python call per
        # token into every step's host work (numpy integers in a tuple hash and compare as the
        # ints they hold).
        tokens = ids if type(ids) is tuple else tuple(map(int, ids))
        index = self._index.setdefault((parent, tokens), len(self.segments))  # one hash
        if index == len(self.segments):
            self.segments.append(Segment(tokens, parent, start, cacheable))
        return index

    def add_row(self, seg: int, offset: int, candidates: list[int], use_lse: bool) -> int:
        self.row_at.append((seg, offset))
        self.candidates.append(candidates)
        self.use_lse.append(use_lse)
        return len(self.row_at) - 1

    def chain(self, seg: int) -> list[int]:
        """seg and its ancestors, root first."""
        out = []
        while seg >= 0:
            out.append(seg)
            seg = self.segments[seg].parent
        return out[::-1]

    # --- the flat view (segments concatenated in order) --------------------------------------
    def offsets(self) -> list[int]:
        return list(np.cumsum([0] + [len(s.tokens) for s in self.segments])[:-1])

    @property
    def tokens(self) -> list[int]:
        return [t for s in self.segments for t in s.tokens]

    @property
    def positions(self) -> list[int]:
        return [s.start + i for s in self.segments for i in range(len(s.tokens))]

    @property
    def segment_of(self) -> list[int]:
        return [i for i, s in enumerate(self.segments) for _ in s.tokens]

    @property
    def rows(self) -> list[int]:
        offsets = self.offsets()
        return [offsets[seg] + off for seg, off in self.row_at]

    def computed_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.segments)

    def mask(self) -> np.ndarray:
        """bool [T, T] over the flat view: mask[q, k] = k in q's segment up to q, or in an
        ancestor segment."""
        s = len(self.segments)
        ancestor = np.zeros((s, s), dtype=bool)  # ancestor[a, b]: b is a or an ancestor of a
        for a in range(s):
            ancestor[a, self.chain(a)] = True
        seg = np.asarray(self.segment_of)
        idx = np.arange(len(seg))
        same = seg[:, None] == seg[None, :]
        return ancestor[seg[:, None], seg[None, :]] & (~same | (idx[None, :] <= idx[:, None]))


def _single_token_fast_path(q: RenderedQuestion) -> bool:
    firsts = [o[0] for o in q.options]
    return all(len(o) == 1 for o in q.options) and len(set(firsts)) == len(firsts)


def _add_prefix(f: Forest, prefix: tuple[int, ...], root_len: int) -> int:
    """The prefix as a root segment (shared instructions) and a trunk (the state) when the
    prefix starts with the engine's root tokens; else one segment. -1 when empty."""
    parent, start = -1, 0
    if 0 < root_len < len(prefix):
        parent = f.add_segment(prefix[:root_len], -1, 0, cacheable=True)
        start = root_len
    if len(prefix) > start:
        parent = f.add_segment(prefix[start:], parent, start, cacheable=True)
    return parent


def _add_question(f: Forest, q: RenderedQuestion, root_len: int) -> None:
    parent = _add_prefix(f, q.prefix, root_len)
    start = len(q.prefix)
    branch = f.add_segment(q.branch, parent, start, cacheable=False)
    slot = len(q.branch) - 1
    f.question_chains.append(f.chain(branch))
    if _single_token_fast_path(q):
        # Candidate-only readout: renormalised over the options, no vocabulary pass.
        row = f.add_row(branch, slot, [o[0] for o in q.options], use_lse=False)
        f.terms.append([[(row, c)] for c in range(len(q.options))])
        return
    firsts = list(dict.fromkeys(o[0] for o in q.options))
    row = f.add_row(branch, slot, firsts, use_lse=True)
    question_terms = []
    for option in q.options:
        terms = [(row, firsts.index(option[0]))]
        if len(option) > 1:  # leaf: feed option[:-1]; token j predicts option[j + 1]
            leaf = f.add_segment(option[:-1], branch, start + len(q.branch), cacheable=False)
            f.question_chains[-1] = sorted(set(f.question_chains[-1]) | {leaf})
            for j in range(1, len(option)):
                terms.append((f.add_row(leaf, j - 1, [option[j]], use_lse=True), 0))
        question_terms.append(terms)
    f.terms.append(question_terms)


def build_forest(questions: list[RenderedQuestion], root_len: int = 0) -> Forest:
    """One forest for all questions; identical segments are computed once. root_len: how many
    leading prefix tokens are the shared instructions (their own cacheable root segment)."""
    assert questions, "a forest needs at least one question"
    f = Forest()
    for q in questions:
        _add_question(f, q, root_len)
    return f


def bucket(n: int, buckets: tuple[int, ...], what: str) -> int:
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"{what} = {n} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]
