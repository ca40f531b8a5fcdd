"""qkv_rope (split, qk-norm, rotary in one custom call) against its reference, bitwise.

The reference runs on the CPU: XLA's GPU sqrt and division are not IEEE correctly rounded,
while the kernels' are (as for the norms)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from prism_jax.ops.qkv_rope import rotate_reference
from tests.conftest import assert_bitwise_equal, run_on
from tests.ops.invariance import check_row_invariance

# (T, K, G, H): one token and head; GQA groups of 1-4; Gemma's 128, the 16 / 256 edges, and 80
# (the rotation's partner five lanes away).
SHAPES = [(1, 1, 1, 16), (3, 2, 2, 64), (5, 4, 2, 128), (2, 1, 3, 256), (9, 2, 4, 80)]
STYLES = [dict(eps=1e-6, weight_offset=1.0), dict(eps=1e-6, weight_offset=0.0)]  # Gemma, Qwen3


def inputs(rng, t, k, g, h, scale=1.0):
    qkv = rng.normal(0, scale, (t, k, g + 2, h)).astype(np.float32)
    qkv[t // 2, 0, 0] = 0.0  # an all-zero head row: the norm's inverse of eps alone
    positions = rng.integers(-1, 32768, t).astype(np.int32)  # -1: a padding token
    inv_freq = (1.0 / (10000.0 ** (np.arange(0, h, 2, dtype=np.float32) / h))).astype(np.float32)
    cos, sin = run_on(jax.devices("cpu")[0], ops.rope_tables, positions, inv_freq)
    gammas = [rng.normal(0, 0.5, h).astype(np.float32) for _ in range(2)]
    return qkv, cos, sin, gammas


def both(device, *args, **kwargs):
    cpu = jax.devices("cpu")[0]
    return (
        run_on(device, ops.qkv_rope, *args, **kwargs),
        run_on(cpu, ops.qkv_rope, *args, impl="reference", **kwargs),
    )


@pytest.mark.parametrize("t,k,g,h", SHAPES)
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("scale", [1.0, 3e4])
def test_qkv_rope_bitwise(device, rng, t, k, g, h, style, qk_norm, scale):
    qkv, cos, sin, gammas = inputs(rng, t, k, g, h, scale)
    args = (qkv, cos, sin, *(gammas if qk_norm else ()))
    out, ref = both(device, *args, **style)
    for name, a, b, shape in zip(
        ("q", "k", "v"), out, ref, ((t, k * g, h), (t, k, h), (t, k, h)), strict=True
    ):
        assert a.shape == shape and a.dtype == np.float32, f"{name}: {a.dtype} {a.shape}"
        assert_bitwise_equal(a, b, name)
    assert_bitwise_equal(out[2], qkv[:, :, g + 1], "v is qkv's value slot as it is")


@pytest.mark.parametrize("t,k,g,h", [(5, 4, 2, 128), (2, 1, 3, 64)])
def test_qkv_rope_norm_is_rmsnorm(device, rng, t, k, g, h):
    """Its q and k norms have ops.rmsnorm's bits (the unfused path's), on the same device."""
    qkv, cos, sin, (qg, kg) = inputs(rng, t, k, g, h)
    style = dict(eps=1e-6, weight_offset=1.0)
    q, kk, _ = run_on(device, ops.qkv_rope, qkv, cos, sin, qg, kg, **style)
    qn = run_on(device, ops.rmsnorm, qkv[:, :, :g].reshape(t, k * g, h), qg, **style)
    kn = run_on(device, ops.rmsnorm, qkv[:, :, g], kg, **style)
    cpu = jax.devices("cpu")[0]
    assert_bitwise_equal(q, run_on(cpu, rotate_reference, qn, cos, sin), "q")
    assert_bitwise_equal(kk, run_on(cpu, rotate_reference, kn, cos, sin), "k")


def test_qkv_rope_rotation_matches_hf_rope(rng):
    """Without the norm, the rotation is HF's rotate-half rope (apply_rope) to within an ulp
    of each product-sum (apply_rope may contract a product into an FMA; the kernel never)."""
    from prism_jax.model.layers import apply_rope

    t, k, g, h = 6, 2, 2, 128
    qkv, cos, sin, _ = inputs(rng, t, k, g, h)
    positions = np.arange(t, dtype=np.int32) * 977
    inv_freq = (1.0 / (10000.0 ** (np.arange(0, h, 2, dtype=np.float32) / h))).astype(np.float32)
    cos, sin = (np.asarray(a) for a in ops.rope_tables(positions, inv_freq))
    q, kk, _ = ops.qkv_rope(qkv, cos, sin)
    q_hf = apply_rope(qkv[:, :, :g].reshape(t, k * g, h), positions, inv_freq)
    np.testing.assert_allclose(q, q_hf, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        kk, apply_rope(qkv[:, :, g], positions, inv_freq), rtol=1e-6, atol=1e-6
    )


def test_qkv_rope_row_invariant(device, rng):
    """A token's q, k and v do not depend on the other tokens of the step."""
    k, g, h = 4, 2, 128
    qkv, cos, sin, gammas = inputs(rng, 301, k, g, h)

    def others(n):
        return qkv[:n] * 0.5, cos[:n], sin[:n]

    check_row_invariance(
        device,
        lambda x, c, s, qg, kg: ops.qkv_rope(x, c, s, qg, kg, eps=1e-6),
        (qkv[300], cos[300], sin[300]),
        others,
        shared_args=gammas,
    )


@pytest.mark.parametrize("t,k,g,h", [(1, 1, 1, 16), (5, 4, 2, 128), (9, 2, 4, 80)])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_qkv_rope_sum_is_qkv_rope_of_the_sum(device, rng, t, k, g, h, qk_norm):
    """The two-digit form adds the partial products as Int8Linear does, y2[:T] + (y2[T:] +
    y_w2), then has qkv_rope's bits; its reference too (on the CPU)."""
    _, cos, sin, gammas = inputs(rng, t, k, g, h)
    y2 = rng.normal(0, 1.0, (2 * t, k, g + 2, h)).astype(np.float32)
    y2[t:] *= np.float32(2.0**-7)  # x2 W1: a digit's remainder, as in the model
    y_w2 = rng.normal(0, 2.0**-7, (t, k, g + 2, h)).astype(np.float32)
    style = dict(eps=1e-6, weight_offset=1.0)
    g_args = tuple(gammas) if qk_norm else ()
    out = run_on(device, ops.qkv_rope_sum, y2, y_w2, cos, sin, *g_args, **style)
    qkv = run_on(device, lambda a, b: a[:t] + (a[t:] + b), y2, y_w2)
    want = run_on(device, ops.qkv_rope, qkv, cos, sin, *g_args, **style)
    cpu = jax.devices("cpu")[0]
    ref = run_on(cpu, ops.qkv_rope_sum, y2, y_w2, cos, sin, *g_args, impl="reference", **style)
    for name, a, b, r in zip(("q", "k", "v"), out, want, ref, strict=True):
        assert_bitwise_equal(a, b, f"qkv_rope_sum {name} vs qkv_rope of the XLA sum")
        assert_bitwise_equal(a, r, f"qkv_rope_sum {name} vs its reference")


def test_qkv_rope_sum_bad_inputs():
    z = np.zeros
    with pytest.raises(ValueError, match="y2 must be \\[4, 1, 3, 8\\]"):
        ops.qkv_rope_sum(
            z((2, 1, 3, 8), np.float32),
            z((2, 1, 3, 8), np.float32),
            z((2, 4), np.float32),
            z((2, 4), np.float32),
        )
    with pytest.raises(ValueError, match="y_w2"):
        ops.qkv_rope_sum(
            z((4, 1, 3, 8), np.float32),
            z((2, 1, 2, 8), np.float32),
            z((2, 4), np.float32),
            z((2, 4), np.float32),
        )
    ops.register()
    outs = tuple(jax.ShapeDtypeStruct(s, jnp.float32) for s in ((2, 1, 8), (2, 1, 8), (2, 1, 8)))
    call = jax.ffi.ffi_call("prism_qkv_rope_sum", outs)
    with pytest.raises(Exception, match="y2 must be \\[2T, K, G \\+ 2, H\\]"):
        jax.block_until_ready(
            call(
                z((3, 1, 3, 8), np.float32),
                z((2, 1, 3, 8), np.float32),
                z((2, 4), np.float32),
                z((2, 4), np.float32),
                z(8, np.float32),
                z(8, np.float32),
                eps=np.float32(1e-6),
                weight_offset=np.float32(0),
                qk_norm=np.int32(0),
            )
        )


def test_qkv_rope_cuda_refuses_unsupported_head_dims(gpu, rng):
    """Head dims the kernel cannot serve are an error naming what to do, never wrong numbers
    (the model keeps XLA's rope for them: qkv_rope_supported)."""
    assert not ops.qkv_rope_supported(72) and ops.qkv_rope_supported(80)
    qkv, cos, sin, _ = inputs(rng, 2, 1, 1, 72)
    with pytest.raises(Exception, match="multiple of 16"):
        run_on(gpu, ops.qkv_rope, qkv, cos, sin)


@pytest.mark.parametrize(
    "call,needle",
    [
        (lambda z: ops.qkv_rope(z(2, 1, 2, 8), z(2, 4), z(2, 4)), "G >= 1"),
        (lambda z: ops.qkv_rope(z(2, 1, 3, 8), z(2, 3), z(2, 4)), "cos"),
        (lambda z: ops.qkv_rope(z(2, 1, 3, 8), z(2, 4), z(2, 4), z(8)), "both"),
        (lambda z: ops.qkv_rope(z(2, 1, 3, 8), z(2, 4), z(2, 4), z(8), z(7)), "k_gamma"),
        (lambda z: ops.qkv_rope(z(2, 1, 3, 8).astype(jnp.bfloat16), z(2, 4), z(2, 4)), "qkv"),
    ],
)
def test_qkv_rope_bad_inputs(call, needle):
    with pytest.raises(ValueError, match=needle):
        call(lambda *s: np.zeros(s, np.float32))
