"""Prefix cache: a radix tree of computed token segments whose KV stays in the page pool.

A node is one segment (root instructions, a state) keyed by its parent node and its token
content, so the same state under the same instructions is found again however it was reached.
Nodes in use by a running step are referenced (refcount > 0) and never evicted; unreferenced
leaves are evicted least recently used first when the pool needs pages or the cache exceeds
its capacity. Only whole segments match (a state is reused when it is token-for-token equal).
"""

from __future__ import annotations

import dataclasses
import itertools

from prism_jax.kv_pages import PagePool


@dataclasses.dataclass(eq=False)
class Node:
    parent: Node | None
    tokens: tuple[int, ...]
    start: int  # absolute position of the first token
    pages: list[int]
    ready: bool = False  # KV written (set once the step that computes it has been issued)
    refcount: int = 0
    last_used: int = 0
    children: dict[tuple[int, ...], Node] = dataclasses.field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclasses.dataclass
class CacheCounters:
    queries: int = 0  # segment lookups
    hits: int = 0  # lookups that found a ready segment
    hit_tokens: int = 0  # tokens not recomputed thanks to hits
    evicted_segments: int = 0


class PrefixCache:
    """Radix tree over segments; capacity in pages (at most the pool's usable pages)."""

    def __init__(self, pool: PagePool, capacity_pages: int | None = None) -> None:
        cap = pool.usable_pages if capacity_pages is None else capacity_pages
        assert 0 <= cap <= pool.usable_pages, (
            f"prefix cache capacity {cap} pages exceeds the pool's {pool.usable_pages}"
        )
        self.pool = pool
        self.capacity_pages = cap
        self.counters = CacheCounters()
        self._roots: dict[tuple[int, ...], Node] = {}
        self._clock = itertools.count(1)
        self._cached_pages = 0

    @property
    def cached_pages(self) -> int:
        return self._cached_pages

    def _children(self, parent: Node | None) -> dict[tuple[int, ...], Node]:
        return self._roots if parent is None else parent.children

    def lookup(self, parent: Node | None, tokens: tuple[int, ...]) -> Node | None:
        """A ready node for `tokens` under `parent`, referenced for the caller, or None."""
        self.counters.queries += 1
        node = self._children(parent).get(tokens)
        if node is None or not node.ready:
            return None
        self.counters.hits += 1
        self.counters.hit_tokens += len(tokens)
        self.acquire(node)
        return node

    def insert(self, parent: Node | None, tokens: tuple[int, ...], start: int) -> Node:
        """A new, referenced, not yet ready node owning freshly allocated pages."""
        siblings = self._children(parent)
        assert tokens not in siblings, "insert only after a lookup missed"
        assert parent is None or parent.end == start, "a segment starts where its parent ends"
        pages = self.allocate(self.pool.pages_for(len(tokens)))
        node = Node(parent, tokens, start, pages)
        siblings[tokens] = node
        self._cached_pages += len(pages)
        self.acquire(node)
        return node

    def acquire(self, node: Node) -> None:
        node.refcount += 1
        node.last_used = next(self._clock)

    def release(self, node: Node) -> None:
        assert node.refcount > 0, "released a prefix-cache node that was not referenced"
        node.refcount -= 1
        self.trim()

    def discard(self, node: Node) -> None:
        """Drops a node whose KV was never completed (a failed step); it must be a leaf."""
        assert not node.children, "discard a failed node only before anything hangs below it"
        node.refcount = 0
        self._remove(node)

    def allocate(self, count: int) -> list[int]:
        """Pages from the pool, evicting unreferenced cached segments if needed."""
        while self.pool.free_pages < count and self._evict_one():
            pass
        return self.pool.allocate(count)

    def trim(self) -> None:
        """Evicts until the cache is within its capacity (only unreferenced leaves go)."""
        while self._cached_pages > self.capacity_pages and self._evict_one():
            pass

    def _evictable(self) -> list[Node]:
        out, stack = [], list(self._roots.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if not node.children and node.refcount == 0:
                out.append(node)
        return out

    def _evict_one(self) -> bool:
        candidates = self._evictable()
        if not candidates:
            return False
        self._remove(min(candidates, key=lambda n: n.last_used))
        self.counters.evicted_segments += 1
        return True

    def _remove(self, node: Node) -> None:
        del self._children(node.parent)[node.tokens]
        self.pool.free(node.pages)
        self._cached_pages -= len(node.pages)
        node.pages = []

    def clear(self) -> None:
        """Evicts every unreferenced segment (audits: 'cold cache')."""
        while self._evict_one():
            pass
