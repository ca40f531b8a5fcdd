"""The page pool: page 0 is never handed out, allocation is lowest-first and exact, frees and
reservations keep the books straight, and the device pools are zero-filled."""

import jax.numpy as jnp
import pytest

from prism_jax.config import ModelConfig
from prism_jax.kv_pages import DUMMY_PAGE, OutOfPages, PagePool, init_kv_pool, kv_bytes_per_page
from tests.model.tiny import TINY_HF_CONFIGS


def test_allocation_skips_the_dummy_page_and_takes_lowest_first():
    pool = PagePool(6, page_size=4)
    assert pool.usable_pages == 5 and pool.free_pages == 5
    assert pool.allocate(2) == [1, 2]
    assert pool.allocate(3) == [3, 4, 5]
    assert pool.free_pages == 0 and pool.used_pages == 5
    with pytest.raises(OutOfPages, match="need 1 KV pages, 0 free"):
        pool.allocate(1)
    pool.free([4, 2])
    assert pool.allocate(1) == [2]  # lowest free page again
    assert DUMMY_PAGE not in pool.free_page_ids()


def test_free_rejects_the_dummy_page_and_double_frees():
    pool = PagePool(4, page_size=2)
    pages = pool.allocate(2)
    with pytest.raises(AssertionError, match="dummy page"):
        pool.free([DUMMY_PAGE])
    with pytest.raises(AssertionError, match="twice"):
        pool.free([pages[0], pages[0]])


def test_reserve_takes_specific_pages():
    pool = PagePool(8, page_size=2)
    pool.reserve([1, 3])
    assert pool.allocate(2) == [2, 4]
    with pytest.raises(AssertionError, match="not free"):
        pool.reserve([2])
    pool.free([1, 3])
    assert pool.free_pages == 5


def test_pages_for_rounds_up():
    pool = PagePool(4, page_size=16)
    assert [pool.pages_for(n) for n in (1, 16, 17, 32)] == [1, 1, 2, 2]


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_device_pools_are_zero_filled_per_layer(precision):
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS["gemma3"])
    kv = init_kv_pool(config, num_pages=3, page_size=4, precision=precision)
    assert len(kv) == config.num_layers
    k, v = kv[0]
    assert k.shape == (3, 4, config.num_kv_heads, config.head_dim)
    assert k.dtype == (jnp.bfloat16 if precision == "bf16" else jnp.float32)
    assert not bool(jnp.any(k != 0)) and not bool(jnp.any(v != 0))
    per_page = kv_bytes_per_page(config, 4, precision)
    assert per_page == 2 * config.num_layers * k[0].size * k.dtype.itemsize
