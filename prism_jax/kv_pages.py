"""The KV page pool: host-side page allocation and the device arrays it indexes.

Each layer has a key pool and a value pool [P, L, K, H] (P pages of L token slots; int8
[P, L, K, 2H + 16] packed digit rows when the model attends in digits). Page 0 is
reserved as the dummy page: padding tokens write there and no real segment ever owns it, so a
padded step never touches live KV. The device arrays are donated through the jitted step
(the tree_attention custom call aliases them), so XLA updates them in place.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from prism_jax.config import ModelConfig
from prism_jax.ops.tree_attention_digits import packed_row_bytes

DUMMY_PAGE = 0

KVPool = tuple[tuple[jax.Array, jax.Array], ...]  # per layer (k_pages, v_pages)


class OutOfPages(RuntimeError):
    """The pool cannot hold what a step needs, even after evicting the prefix cache."""


class PagePool:
    """Free-list allocator over pages 1 .. P-1 (page 0 is the dummy page).

    Allocation takes the lowest free pages first, so the same sequence of requests on a fresh
    engine always lands on the same pages (audits can still vary this: see `reserve`).
    """

    def __init__(self, num_pages: int, page_size: int) -> None:
        assert num_pages >= 2, f"a pool needs the dummy page and at least one more, got {num_pages}"
        assert page_size >= 1, f"page_size must be >= 1, got {page_size}"
        self.num_pages = num_pages
        self.page_size = page_size
        self._free = list(range(num_pages - 1, 0, -1))  # pop() takes the lowest page

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return self.num_pages - 1 - len(self._free)

    @property
    def usable_pages(self) -> int:
        return self.num_pages - 1

    def free_page_ids(self) -> list[int]:
        return sorted(self._free)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise OutOfPages(f"need {count} KV pages, {len(self._free)} free of {self.num_pages}")
        return [self._free.pop() for _ in range(count)]

    def free(self, pages: list[int]) -> None:
        assert DUMMY_PAGE not in pages, "the dummy page is never allocated, so never freed"
        assert len(set(pages)) == len(pages), f"pages freed twice in one call: {pages}"
        self._free.extend(pages)
        self._free.sort(reverse=True)
        assert len(self._free) <= self.num_pages - 1, "more pages freed than were allocated"

    def reserve(self, pages: list[int]) -> None:
        """Takes specific pages out of the free list (audits: 'other pages taken')."""
        wanted = set(pages)
        missing = sorted(wanted - set(self._free))
        assert not missing, f"pages {missing} are not free"
        self._free = [p for p in self._free if p not in wanted]


def kv_dtype(precision: str) -> jnp.dtype:
    """Keys and values are stored as the attention computes them: bf16 models in bf16, int8
    and fp32 models in fp32 (the int8 epilogue produces fp32)."""
    return jnp.bfloat16 if precision == "bf16" else jnp.float32


def kv_row_shape(config: ModelConfig, precision: str) -> tuple[tuple[int, int], jnp.dtype]:
    """(K, last dim) and dtype of one position's pool row: H floats, or for attention in digits
    (ModelConfig.attention_numerics) the packed INT8 digit rows of ops.tree_attention_digits."""
    if config.attention_numerics == "digits":
        return (config.num_kv_heads, packed_row_bytes(config.head_dim)), jnp.int8
    return (config.num_kv_heads, config.head_dim), kv_dtype(precision)


def kv_bytes_per_page(config: ModelConfig, page_size: int, precision: str) -> int:
    (k, w), dtype = kv_row_shape(config, precision)
    return 2 * config.num_layers * page_size * k * w * jnp.dtype(dtype).itemsize


def init_kv_pool(config: ModelConfig, num_pages: int, page_size: int, precision: str) -> KVPool:
    """Zero-filled pools: absent keys read as exact zeros, never garbage."""
    row, dtype = kv_row_shape(config, precision)
    shape = (num_pages, page_size, *row)
    return tuple(
        (jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(config.num_layers)
    )
