"""Our fp32 / bf16 / int8 logits against HF transformers on tiny random models of every
family (gemma3 with sliding and global layers and a sequence longer than its window, llama
with llama3 rope and an untied head, qwen2 with q/k/v biases, qwen3 with qk-norm)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax.model import candidate_readout, vocab_logsumexp
from tests.model.helpers import (
    load_case,
    mean_kl,
    our_logits,
    our_params,
    rel_max_diff,
    run,
    top1,
)
from tests.model.tiny import FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_matches_hf(hf_dir, family):
    hf = np.load(hf_dir / family / "logits_fp32.npy")
    rel = rel_max_diff(our_logits(hf_dir / family, "fp32"), hf)
    print(f"{family} fp32 vs HF fp32: max|diff| = {rel:.2e} logit std")
    assert rel < 1e-4, f"{family}: fp32 logits differ from HF by {rel:.2e} std"


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_matches_hf(hf_dir, family):
    hf32 = np.load(hf_dir / family / "logits_fp32.npy")
    hf16 = np.load(hf_dir / family / "logits_bf16.npy")
    ours = our_logits(hf_dir / family, "bf16")
    rel16, rel32 = rel_max_diff(ours, hf16), rel_max_diff(ours, hf32)
    kl, hf_kl = mean_kl(hf32, ours), mean_kl(hf32, hf16)
    print(
        f"{family} bf16: vs HF bf16 {rel16:.3f} std, vs HF fp32 {rel32:.3f} std, "
        f"KL(HF fp32 || ours) {kl:.1e} (HF bf16's own: {hf_kl:.1e}), top-1 {top1(ours, hf32)}"
    )
    assert rel16 < 0.2 and rel32 < 0.2, f"{family}: bf16 logits off by {rel16:.3f}/{rel32:.3f} std"
    assert kl < max(3 * hf_kl, 1e-3), f"{family}: bf16 KL {kl:.2e} vs HF bf16's {hf_kl:.2e}"


@pytest.mark.parametrize("family", FAMILIES)
def test_int8_agrees_with_fp32(hf_dir, family):
    ref = our_logits(hf_dir / family, "fp32")
    ours = our_logits(hf_dir / family, "int8")
    rel, kl, agree = rel_max_diff(ours, ref), mean_kl(ref, ours), top1(ours, ref)
    print(f"{family} int8 vs fp32: max|diff| {rel:.3f} std, KL {kl:.1e}, top-1 {agree:.3f}")
    # D = 64 is the worst case for per-row INT8 (few elements share a scale); real models do
    # better. Random tiny models also have near-ties, hence top-1 >= 0.8 rather than 1.
    assert kl < 1e-2 and agree >= 0.8 and rel < 0.5, (
        f"{family}: int8 KL {kl:.2e}, top-1 {agree}, max diff {rel:.3f} std"
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_readouts_match_full_logits(hf_dir, precision):
    """candidate_readout and vocab_logsumexp (ops, softcapped) against full_logits."""
    case = hf_dir / "gemma3"  # has a final softcap
    config, _, tokens = load_case(case)
    params = our_params(case, precision)
    hidden = jnp.asarray(run(params, config, tokens)[-3:]).astype(
        jnp.bfloat16 if precision == "bf16" else jnp.float32
    )  # (R, D)
    full = our_logits(case, precision)[-3:]  # (R, V)
    ids = np.array([[5, 17, 300, 0], [1, 2, 3, 4], [383, 7, 0, 0]], np.int32)
    counts = np.array([3, 4, 2], np.int32)
    logits, logprobs = candidate_readout(
        params, config, hidden, jnp.asarray(ids), jnp.asarray(counts)
    )
    lse = np.asarray(vocab_logsumexp(params, config, hidden))
    tol = 2e-2 if precision == "bf16" else 2e-4
    for r in range(3):
        want = full[r, ids[r, : counts[r]]]
        np.testing.assert_allclose(np.asarray(logits)[r, : counts[r]], want, atol=tol, rtol=tol)
        lp = want - np.log(np.exp(want - want.max()).sum()) - want.max()
        np.testing.assert_allclose(np.asarray(logprobs)[r, : counts[r]], lp, atol=tol, rtol=tol)
        assert np.all(np.isneginf(np.asarray(logprobs)[r, counts[r] :])), "padding must be -inf"
    want_lse = np.log(np.exp(full - full.max(-1, keepdims=True)).sum(-1)) + full.max(-1)
    np.testing.assert_allclose(lse, want_lse, atol=tol, rtol=tol)
