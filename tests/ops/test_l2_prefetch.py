"""The L2 prefetch hints (cc/l2_prefetch.cuh, opt-in until an H200 has timed them) change when
data arrives, never a value: the gated-activation kernel's row tail (PRISM_GLU_PREFETCH=on) and
tree attention's next tile in the block and split kernels (PRISM_TREE_ATTENTION_PREFETCH=on)
give the same bits on and off, and a misspelt setting is an error rather than a silent default.
GPU only."""

import jax.numpy as jnp
import pytest

from prism_jax import ops
from tests.conftest import assert_same_bits_under, run_on
from tests.ops.test_glu_rows_cache import ACT, glu_ops, rows
from tests.ops.tree_attention_world import assert_same_kernels, forest_runs, long_state_runs

# (256, 21504): the 27B's one-question step, where pass 1 has a tail to prefetch past its
# first two chunks a thread; (600, 1000) and (9, 257): rows without one.
GLU_SHAPES = [(9, 257), (600, 1000), (256, 21504), (5, 60000)]


@pytest.mark.gpu
@pytest.mark.parametrize("m,f", GLU_SHAPES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_glu_prefetch_keeps_the_bits(gpu, rng, monkeypatch, m, f, dtype):
    for name, fn, args in glu_ops(rng, m, f, dtype):
        knob = ("PRISM_GLU_PREFETCH", ("off", "on"))
        assert_same_bits_under(monkeypatch, *knob, gpu, fn, *args, what=f"{name} ({m}x{f})")


@pytest.mark.gpu
def test_unknown_glu_prefetch_setting_is_an_error(gpu, rng, monkeypatch):
    monkeypatch.setenv("PRISM_GLU_PREFETCH", "yes")
    with pytest.raises(Exception, match="PRISM_GLU_PREFETCH"):
        run_on(gpu, lambda a: ops.glu_quant_pair(a, activation=ACT), rows(rng, (2, 2, 64)))


@pytest.mark.gpu
@pytest.mark.parametrize("setting", ["on", "off"])
@pytest.mark.parametrize("h", [64, 128, 256])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window", [0, 1000])
def test_attention_prefetch_long_state_bitwise(gpu, rng, monkeypatch, setting, h, dtype, window):
    """One chain (the prefetching case) over ~2.6K keys: the prefill and a 32-token follow-up,
    block and split kernels against the warp kernel, with the prefetch on and off."""
    monkeypatch.setenv("PRISM_TREE_ATTENTION_PREFETCH", setting)
    kernels = ("warp", "split", "block")
    results = long_state_runs(gpu, rng, monkeypatch, kernels, h, dtype, window, 32, 64)
    assert_same_kernels(results, kernels, f"prefetch {setting} H={h} window={window}")


@pytest.mark.gpu
@pytest.mark.parametrize("setting", ["on", "off"])
@pytest.mark.parametrize("order", ["sorted", "shuffled"])
def test_attention_prefetch_forest_bitwise(gpu, rng, monkeypatch, setting, order):
    """A forest: query tiles of one chain prefetch, tiles mixing chains do not."""
    monkeypatch.setenv("PRISM_TREE_ATTENTION_PREFETCH", setting)
    kernels = ("warp", "split", "block")
    results = forest_runs(
        gpu, rng, monkeypatch, kernels, 128, 4, jnp.float32, jnp.float32, 0, order
    )
    assert_same_kernels(results, kernels, f"prefetch {setting}, {order} forest")


@pytest.mark.gpu
def test_unknown_attention_prefetch_setting_is_an_error(gpu, rng, monkeypatch):
    monkeypatch.setenv("PRISM_TREE_ATTENTION_PREFETCH", "1")
    with pytest.raises(Exception, match="PRISM_TREE_ATTENTION_PREFETCH"):
        long_state_runs(gpu, rng, monkeypatch, ("split",), 64, jnp.float32, 0, 32, 64)
