"""The prefix cache: whole-segment matches under the same parent only, reference counts that
protect segments in use, LRU eviction of unreferenced leaves, capacity, and counters."""

import pytest

from prism_jax.kv_pages import OutOfPages, PagePool
from prism_jax.prefix_cache import PrefixCache


def ready(cache, parent, tokens, start):
    node = cache.insert(parent, tokens, start)
    node.ready = True
    cache.release(node)
    return node


def test_hit_needs_same_tokens_same_parent_and_ready():
    cache = PrefixCache(PagePool(32, page_size=4))
    root = cache.insert(None, (1, 2, 3), 0)
    assert cache.lookup(None, (1, 2, 3)) is None  # not ready yet: a miss
    root.ready = True
    cache.release(root)
    trunk = ready(cache, root, (4, 5, 6, 7, 8), 3)
    assert trunk.pages and len(trunk.pages) == 2
    assert cache.lookup(root, (4, 5, 6, 7, 8)) is trunk
    assert cache.lookup(None, (4, 5, 6, 7, 8)) is None  # same tokens, other parent
    assert cache.lookup(root, (4, 5, 6, 7)) is None  # whole segments only
    c = cache.counters
    assert (c.queries, c.hits, c.hit_tokens) == (4, 1, 5)


def test_referenced_segments_are_never_evicted():
    pool = PagePool(5, page_size=2)  # 4 usable pages
    cache = PrefixCache(pool)
    a = cache.insert(None, (1, 2, 3, 4), 0)  # 2 pages, referenced
    a.ready = True
    ready(cache, None, (9, 9, 9, 9), 0)  # 2 pages, unreferenced
    assert pool.free_pages == 0
    pages = cache.allocate(2)  # evicts the unreferenced one
    assert cache.lookup(None, (9, 9, 9, 9)) is None
    with pytest.raises(OutOfPages):
        cache.allocate(1)  # only the referenced segment is left
    pool.free(pages)


def test_lru_evicts_least_recently_used_leaf_first():
    pool = PagePool(7, page_size=2)  # 6 usable
    cache = PrefixCache(pool)
    old = ready(cache, None, (1, 1), 0)
    ready(cache, None, (2, 2), 0)
    new = ready(cache, None, (3, 3), 0)
    cache.release(cache.lookup(None, (1, 1)))  # touch `old`: now the most recent
    assert cache.allocate(4)  # 3 free + 1 eviction: `mid` goes, not `old`
    assert cache.lookup(None, (2, 2)) is None
    assert cache.lookup(None, (1, 1)) is old and old.pages
    assert new.pages
    assert cache.counters.evicted_segments == 1


def test_a_parent_is_evicted_only_after_its_children():
    pool = PagePool(4, page_size=2)  # 3 usable
    cache = PrefixCache(pool)
    root = ready(cache, None, (1, 2), 0)
    ready(cache, root, (3, 4), 2)
    cache.release(cache.lookup(None, (1, 2)))  # the root is now more recent than its child
    cache.allocate(3)  # needs everything: the child goes first, then the root
    assert cache.counters.evicted_segments == 2 and cache.cached_pages == 0


def test_capacity_trims_after_release():
    pool = PagePool(16, page_size=2)
    cache = PrefixCache(pool, capacity_pages=2)
    ready(cache, None, (1, 1), 0)
    ready(cache, None, (2, 2), 0)
    ready(cache, None, (3, 3), 0)
    assert cache.cached_pages <= 2
    assert cache.lookup(None, (3, 3)) is not None  # the newest stays


def test_discard_drops_a_failed_segment_and_its_pages():
    pool = PagePool(8, page_size=2)
    cache = PrefixCache(pool)
    node = cache.insert(None, (5, 6, 7), 0)
    cache.discard(node)
    assert pool.free_pages == 7 and cache.cached_pages == 0
    assert cache.lookup(None, (5, 6, 7)) is None
