"""The row kernel (cc/ops/glu_rows.cuh) split over a cluster of blocks per row
(PRISM_GLU_CLUSTER=on, opt-in; it takes effect when the rows are too few to fill the SMs) gives
the bits of one block a row: glu_quant, glu_quant2, glu_quant2_sum and quantize_digits, cached
and recomputed rows, one and two digits. A misspelt setting is an error. GPU only."""

import jax.numpy as jnp
import pytest

from prism_jax import ops
from tests.conftest import assert_same_bits_under, run_on
from tests.ops.test_glu_rows_cache import ACT, glu_ops, rows

# (1, 21504): decode's row over a cluster of 8; (32, 21504): the 27B's follow-up step, 4 blocks
# a row; (5, 60000): rows too long to cache; (60, 300) and (200, 4096): too few chunks, and too
# many rows, to split (the same kernel as off).
SHAPES = [(1, 21504), (3, 2048), (32, 21504), (32, 4096), (5, 60000), (60, 300), (200, 4096)]


CLUSTER = ("PRISM_GLU_CLUSTER", ("off", "on"))  # one block a row, then clusters


@pytest.mark.gpu
@pytest.mark.parametrize("m,f", SHAPES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("cache", ["on", "off"])
def test_cluster_rows_match_block_rows_bitwise(gpu, rng, monkeypatch, m, f, dtype, cache):
    monkeypatch.setenv("PRISM_GLU_CACHE", cache)
    for name, fn, args in glu_ops(rng, m, f, dtype):
        what = f"{name} ({m}x{f}, cache {cache})"
        assert_same_bits_under(monkeypatch, *CLUSTER, gpu, fn, *args, what=what)


@pytest.mark.gpu
@pytest.mark.parametrize("m,d", [(1, 5376), (32, 4096), (32, 5376), (9, 257)])
@pytest.mark.parametrize("digits", [1, 2])
def test_cluster_quantize_digits_bitwise(gpu, rng, monkeypatch, m, d, digits):
    fn = lambda a: ops.quantize_digits(a, digits=digits)  # noqa: E731
    what = f"quantize_digits({digits}) ({m}x{d})"
    assert_same_bits_under(monkeypatch, *CLUSTER, gpu, fn, rows(rng, (m, d)), what=what)


@pytest.mark.gpu
def test_unknown_cluster_setting_is_an_error(gpu, rng, monkeypatch):
    monkeypatch.setenv("PRISM_GLU_CLUSTER", "8")
    with pytest.raises(Exception, match="PRISM_GLU_CLUSTER"):
        run_on(gpu, lambda a: ops.glu_quant_pair(a, activation=ACT), rows(rng, (2, 2, 64)))
