"""The attention dot's order, emulated on the CPU: a float32 fused multiply-add rounded once
(CUDA's __fmaf_rn), the warp's butterfly (tree_attention.h) and the block kernel's serial form
(tree_attention_block_tile.cuh), which must agree bit for bit."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from tests.conftest import assert_bitwise_equal


def _fma32(a, b, c) -> np.float32:
    """float32 fused multiply-add, exactly (CUDA's __fmaf_rn): a * b + c rounded once, to
    nearest even, with gradual underflow; an exact zero is -0 only for (-0 product) + -0."""
    a, b, c = (float(np.float32(x)) for x in (a, b, c))
    if not all(map(math.isfinite, (a, b, c))):
        return np.float32(a * b + c)  # inf and NaN cases: float64 gives the same
    x = Fraction(a) * Fraction(b) + Fraction(c)
    if x == 0:
        product_neg = math.copysign(1.0, a) * math.copysign(1.0, b) < 0
        return np.float32(-0.0 if product_neg and math.copysign(1.0, c) < 0 else 0.0)
    mag = abs(x)
    e = mag.numerator.bit_length() - mag.denominator.bit_length()  # 2^e <= mag < 2^(e+2)
    if Fraction(2) ** e > mag:
        e -= 1
    quantum = Fraction(2) ** max(e - 23, -149)  # 24 significant bits, or the denormal step
    n = round(mag / quantum)  # Fraction.__round__ rounds half to even
    y = float(n * quantum)  # exact in float64
    with np.errstate(over="ignore"):
        return np.float32(math.copysign(y, x))  # rounds to inf past the float32 range


def _butterfly_dot(q, k):
    """The attention dot as a CUDA warp computes it (tree_attention.h): lane l sums elements
    l*8 .. l*8+7 from +0 by fused multiply-add, then for off in 16, 8, 4, 2, 1 every lane adds
    lane l ^ off (lanes without elements hold +0)."""
    lanes = np.zeros(32, np.float32)
    for d in range(len(q)):
        lanes[d // 8] = _fma32(q[d], k[d], lanes[d // 8])
    for off in (16, 8, 4, 2, 1):
        lanes = np.float32(lanes + lanes[np.arange(32) ^ off])
    return lanes[0]


def _block_dot(q, k):
    """tree_attention_block_tile.cuh's serial form: fused partials in bit-reversed lane order,
    the levels with off >= H / 8 as one `+ 0`, then a binary-counter stack (PushLeaf)."""
    parts = len(q) // 8
    log = parts.bit_length() - 1
    stack = [np.float32(0)] * (log + 1)
    for seq in range(parts):
        lane = int(format(seq, f"0{log}b")[::-1], 2) if log else 0
        acc = np.float32(0)
        for d in range(lane * 8, lane * 8 + 8):
            acc = _fma32(q[d], k[d], acc)
        if log < 5:
            acc = np.float32(acc + np.float32(0))
        for b in range(log + 1):
            if b == log or not (seq >> b) & 1:
                stack[b] = acc
                break
            acc = np.float32(stack[b] + acc)
    return stack[log]


def test_fma32_is_one_rounding():
    """The emulation rounds once: cases where multiply-then-add rounds differently, signed
    zeros, and a negative product below the smallest denormal (-0)."""
    one_ulp = np.float32(2.0**-23)
    a = np.float32(1) + one_ulp
    exact = _fma32(a, a, -(np.float32(1) + 2 * one_ulp))  # (1+u)^2 - (1+2u) = u^2, exactly
    assert exact == np.float32(2.0**-46) and np.float32(a * a) - (1 + 2 * one_ulp) == 0
    assert math.copysign(1, _fma32(-0.0, 1.0, -0.0)) < 0
    assert math.copysign(1, _fma32(-0.0, 1.0, 0.0)) > 0
    tiny = _fma32(-(2.0**-100), 2.0**-100, 0.0)  # -2^-200 rounds to -0
    assert tiny == 0 and math.copysign(1, tiny) < 0
    assert _fma32(3.0, 5.0, 7.0) == 22.0 and _fma32(2.0**-74, 2.0**-75, 0.0) == 2.0**-149
    assert _fma32(2.0**-75, 2.0**-75, 0.0) == 0, "half the smallest denormal: ties to even"


@pytest.mark.parametrize("h", [64, 128, 256])
def test_block_dot_order_matches_butterfly(rng, h):
    """CPU emulation of the block kernel's one-thread dot against the warp's butterfly, bit for
    bit, on inputs that make the order visible: wide magnitudes, -0.0, denormals, cancellation,
    and products below the smallest denormal (fused partials of -0)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for trial in range(30):
            scale = np.float32(10.0) ** rng.integers(-30, 30, h)
            q = np.float32(rng.normal(0, 1, h) * scale)
            k = np.float32(rng.normal(0, 1, h))
            if trial % 3 == 0:  # signed zeros and denormals
                q[rng.random(h) < 0.5] = np.float32(-0.0)
                k[rng.random(h) < 0.2] = np.float32(1e-41)
            if trial % 5 == 0:
                q[:] = np.float32(-0.0)
            if trial % 4 == 1:  # negative products too small for a denormal: -0 partials
                q[:] = np.float32(-1e-30)
                k[:] = np.float32(1e-30)
            a, b = _butterfly_dot(q, k), _block_dot(q, k)
            assert_bitwise_equal(np.array([b]), np.array([a]), f"H={h} trial {trial}")
