"""A tour of prism_jax's custom calls on the CPU: one INT8 projection and a candidate readout,
and the property the engine is built on: a row's probabilities have the same bits whatever
else is in the batch.

Run: make demo   (the model-level `python -m prism_jax decide` demo comes with the model issue)
"""

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax import ops

D, F, V = 640, 2048, 262_144 // 16  # Gemma-3-270M widths; a 16K slice of its vocabulary


def readout(x, gamma, w_q, s_w, emb, ids, counts):
    x_q, s_x = ops.rmsnorm_quant(x, gamma, eps=1e-6, weight_offset=1.0)
    h = ops.int8_gemm(x_q, s_x, w_q, s_w)  # (M, D)
    _, logprobs = ops.candidate_head(h, emb, ids, counts)
    return logprobs, ops.vocab_logsumexp(h, emb)


def main() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.05, (D, D)).astype(np.float32)
    w_q, s_w = ops.quantize_weight(jnp.asarray(w))
    gamma = rng.normal(0, 0.1, D).astype(np.float32)
    emb = jnp.asarray(rng.normal(0, 0.05, (V, D)), jnp.bfloat16)
    step = jax.jit(readout)

    question = rng.normal(0, 1, (1, D)).astype(np.float32)
    options = np.array([[1001, 2002, 3003]], np.int32)  # three candidate tokens
    alone, lse_alone = step(question, gamma, w_q, s_w, emb, options, np.array([3], np.int32))
    print("candidate probabilities:", np.round(np.exp(np.asarray(alone[0])), 4))
    print("full-vocabulary log-sum-exp:", float(lse_alone[0]))

    crowd = rng.normal(0, 1, (63, D)).astype(np.float32)
    batch = np.concatenate([crowd[:40], question, crowd[40:]])
    ids = np.concatenate([rng.integers(0, V, (40, 3)), options, rng.integers(0, V, (23, 3))])
    counts = np.full(64, 3, np.int32)
    batched, _ = step(batch, gamma, w_q, s_w, emb, ids.astype(np.int32), counts)
    a, b = np.asarray(alone[0]), np.asarray(batched[40])
    digest = hashlib.sha256(a.tobytes()).hexdigest()[:16]
    same = np.array_equal(a.view(np.uint32), b.view(np.uint32))
    print(f"same row inside a batch of 64: bit-identical = {same} (sha256 {digest})")


if __name__ == "__main__":
    main()
