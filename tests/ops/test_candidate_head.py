"""candidate_head and vocab_logsumexp: logits bitwise vs the canonical reference, log-probs
equal to the full softmax renormalised over the candidates, row invariance bitwise."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from tests.conftest import assert_bitwise_equal, run_on
from tests.ops.invariance import check_row_invariance

# (R, C, D, V): one row, one candidate, tile-unaligned sizes, V across several 2048-tiles.
SHAPES = [(1, 1, 8, 3), (2, 3, 7, 50), (5, 4, 300, 2049), (17, 9, 640, 5000)]


def inputs(rng, r, c, d, v, dtype=jnp.float32):
    hidden = np.asarray(jnp.asarray(rng.normal(0, 1, (r, d)).astype(np.float32)).astype(dtype))
    emb = np.asarray(jnp.asarray(rng.normal(0, 0.3, (v, d)).astype(np.float32)).astype(dtype))
    ids = rng.integers(0, v, (r, c)).astype(np.int32)
    counts = rng.integers(1, c + 1, r).astype(np.int32)
    return hidden, emb, ids, counts


@pytest.mark.parametrize("r,c,d,v", SHAPES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("softcap", [0.0, 30.0])
def test_candidate_head(device, rng, r, c, d, v, dtype, softcap):
    hidden, emb, ids, counts = inputs(rng, r, c, d, v, dtype)
    logits, logprobs = run_on(device, ops.candidate_head, hidden, emb, ids, counts, softcap=softcap)
    # References run on the CPU: XLA's GPU tanh is a fast approximation.
    ref_logits, ref_logprobs = run_on(
        jax.devices("cpu")[0],
        ops.candidate_head,
        hidden,
        emb,
        ids,
        counts,
        softcap=softcap,
        impl="reference",
    )
    valid = np.arange(c)[None] < counts[:, None]
    if softcap == 0.0:  # tanh is libm's in the kernel and XLA's in the reference
        assert_bitwise_equal(logits, ref_logits, "candidate logits")
    np.testing.assert_allclose(logits[valid], ref_logits[valid], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(logprobs[valid], ref_logprobs[valid], rtol=1e-5, atol=1e-5)
    assert np.all(logits[~valid] == -np.inf) and np.all(logprobs[~valid] == -np.inf)
    np.testing.assert_allclose(np.exp(logprobs).sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("r,c,d,v", SHAPES)
def test_equals_renormalised_full_softmax(device, rng, r, c, d, v):
    hidden, emb, ids, counts = inputs(rng, r, c, d, v)
    ids = np.stack([rng.permutation(v)[:c] if v >= c else ids[i] for i in range(r)])
    ids = ids.astype(np.int32)
    _, logprobs = run_on(device, ops.candidate_head, hidden, emb, ids, counts)
    full = hidden.astype(np.float64) @ emb.astype(np.float64).T  # (R, V)
    log_softmax = full - np.log(np.exp(full - full.max(-1, keepdims=True)).sum(-1, keepdims=True))
    log_softmax -= full.max(-1, keepdims=True)
    for i in range(r):
        chosen = log_softmax[i, ids[i, : counts[i]]]
        renorm = chosen - np.log(np.exp(chosen - chosen.max()).sum()) - chosen.max()
        np.testing.assert_allclose(logprobs[i, : counts[i]], renorm, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("r,c,d,v", SHAPES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_vocab_logsumexp(device, rng, r, c, d, v, dtype):
    hidden, emb, ids, counts = inputs(rng, r, c, d, v, dtype)
    lse = run_on(device, ops.vocab_logsumexp, hidden, emb)
    full = (
        np.asarray(jnp.asarray(hidden).astype(jnp.float32), np.float64)
        @ np.asarray(jnp.asarray(emb).astype(jnp.float32), np.float64).T
    )
    expected = np.log(np.exp(full - full.max(-1, keepdims=True)).sum(-1)) + full.max(-1)
    np.testing.assert_allclose(lse, expected, rtol=1e-5, atol=1e-5)
    ref = run_on(jax.devices("cpu")[0], ops.vocab_logsumexp, hidden, emb, impl="reference")
    np.testing.assert_allclose(lse, ref, rtol=1e-5, atol=1e-5)
    # Candidate logit minus lse is the full-vocabulary log-probability of that token.
    logits, _ = run_on(device, ops.candidate_head, hidden, emb, ids, counts)
    valid = np.arange(c)[None] < counts[:, None]
    full_logprob = np.take_along_axis(full, ids.astype(np.int64), 1) - expected[:, None]
    np.testing.assert_allclose((logits - lse[:, None])[valid], full_logprob[valid], atol=1e-4)


def test_row_invariance(device, rng):
    r, c, d, v = 1, 6, 250, 4500
    hidden, emb, ids, counts = inputs(rng, r, c, d, v, jnp.bfloat16)

    def others(n):
        h, _, i, k = inputs(rng, n, c, d, v, jnp.bfloat16)
        return h, i, k

    def head(h, i, k, emb):
        logits, logprobs = ops.candidate_head(h, emb, i, k)
        return logits, logprobs, ops.vocab_logsumexp(h, emb)

    check_row_invariance(device, head, [hidden[0], ids[0], counts[0]], others, [emb])


def test_cuda_matches_cpu(gpu, rng):
    hidden, emb, ids, counts = inputs(rng, 12, 16, 1152, 10000, jnp.bfloat16)
    cpu = jax.devices("cpu")[0]
    l_gpu, p_gpu = run_on(gpu, ops.candidate_head, hidden, emb, ids, counts)
    l_cpu, p_cpu = run_on(cpu, ops.candidate_head, hidden, emb, ids, counts)
    assert_bitwise_equal(l_gpu, l_cpu, "candidate logits CUDA vs CPU (canonical dot)")
    np.testing.assert_allclose(p_gpu, p_cpu, rtol=1e-6, atol=1e-6)
    lse_gpu = run_on(gpu, ops.vocab_logsumexp, hidden, emb)
    lse_cpu = run_on(cpu, ops.vocab_logsumexp, hidden, emb)
    np.testing.assert_allclose(lse_gpu, lse_cpu, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("c", [1, 7, 16, 19])
@pytest.mark.parametrize(
    "dtypes",
    [(jnp.bfloat16, jnp.bfloat16), (jnp.float32, jnp.bfloat16), (jnp.float32, jnp.float32)],
)
def test_row_and_warp_kernels_match_cpu_bitwise(gpu, rng, monkeypatch, c, dtypes):
    """The row kernel (staged hidden row, two candidates a warp) and the warp kernel give the
    CPU's logits bit for bit, with padding, a bad id and a bad count among the rows."""
    r, d, v = 37, 1000, 3000
    hidden, emb, ids, counts = inputs(rng, r, c, d, v)
    hidden = np.asarray(jnp.asarray(hidden).astype(dtypes[0]))
    emb = np.asarray(jnp.asarray(emb).astype(dtypes[1]))
    ids[3, 0] = v + 5  # a bad id: NaN
    counts[4] = 0  # a bad count: the whole row NaN
    cpu = jax.devices("cpu")[0]
    want, _ = run_on(cpu, ops.candidate_head, hidden, emb, ids, counts, softcap=30.0)
    for kernel in ("", "row", "warp"):
        monkeypatch.setenv("PRISM_CANDIDATE_HEAD_KERNEL", kernel)
        got, _ = run_on(gpu, ops.candidate_head, hidden, emb, ids, counts, softcap=0.0)
        plain, _ = run_on(cpu, ops.candidate_head, hidden, emb, ids, counts, softcap=0.0)
        assert_bitwise_equal(got, plain, f"logits, kernel {kernel!r} vs CPU")
        capped, _ = run_on(gpu, ops.candidate_head, hidden, emb, ids, counts, softcap=30.0)
        valid = np.isfinite(want)
        np.testing.assert_allclose(capped[valid], want[valid], rtol=1e-6, atol=1e-6)
        assert np.array_equal(np.isnan(capped), np.isnan(want)), kernel
    monkeypatch.delenv("PRISM_CANDIDATE_HEAD_KERNEL")


def test_unknown_head_kernel_name_is_an_error(gpu, rng, monkeypatch):
    hidden, emb, ids, counts = inputs(rng, 2, 3, 64, 100)
    monkeypatch.setenv("PRISM_CANDIDATE_HEAD_KERNEL", "rows")
    with pytest.raises(Exception, match="PRISM_CANDIDATE_HEAD_KERNEL"):
        run_on(gpu, ops.candidate_head, hidden, emb, ids, counts)
