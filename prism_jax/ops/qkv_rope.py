"""qkv_rope: the fused q/k/v projection's output split, q and k normalised per head (qk-norm)
and rotated by position, in one custom call (cc/ops/qkv_rope.h has the arithmetic):

  qkv_rope(qkv [T, K, G + 2, H], cos, sin [T, H/2], q_gamma, k_gamma [H] or None)
      -> q [T, K * G, H], k [T, K, H], v [T, K, H]        (all float32)

  qkv_rope_sum(y2 [2T, K, G + 2, H], y_w2 [T, K, G + 2, H], cos, sin, ...)
      = qkv_rope(y2[:T] + (y2[T:] + y_w2), cos, sin, ...)   (the two-digit projection's parts)

With pools=(k_pages, v_pages) [P, L, K, H] and slot int32 [T], both store k and v at pool
row slot[t] (tree_attention's write) and returns (q, k_pages, v_pages): tree_attention then
runs with k_new = v_new = None and skips its write kernel (PRISM_QKV_ROPE_KV, kv_write_fused).

Per kv head, qkv holds its G query heads, then its key, then its value (Attention's layout).
It replaces two rmsnorm calls, the slices feeding them and XLA's rope fusions: on the H200
each of those ~6 launches a layer cost 2-3 us at 256 tokens. The norm is rmsnorm's canonical
arithmetic; the rotation rounds every product and sum separately, so the reference below is
bitwise on the CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax.ops import _checks
from prism_jax.ops._registry import require_target
from prism_jax.ops.dispatch import Impl, env_switch, resolve_impl
from prism_jax.ops.rmsnorm_quant import _normalize_reference
from prism_jax.ops.tree_attention import write_pool_rows

_OP = "qkv_rope"


def qkv_rope_supported(head_dim: int) -> bool:
    """Head dims the CUDA kernel serves (one 8-element chunk per lane, the rotation's partner
    a whole number of lanes away); the model keeps XLA's rope for others, on every device, so
    CPU and GPU run the same computation. PRISM_QKV_ROPE=off routes every head dim to XLA's
    rope (the unfused path, for A/B timings); unset or "on" leaves the choice to the head dim."""
    return env_switch("PRISM_QKV_ROPE", True) and head_dim % 16 == 0 and 16 <= head_dim <= 256


def kv_write_fused() -> bool:
    """Whether the model stores k and v in qkv_rope (pools=...) rather than in tree_attention.
    Unset or PRISM_QKV_ROPE_KV=on stores them in qkv_rope; off keeps tree_attention's write
    kernel (for A/B timings). CPU and CUDA give the same bits either way; the fused store took
    0.19 / 0.28 / 0.12 ms of GPU time off a one-digit 27B step (H100, benchmarks/BENCHMARKS.md,
    session 33). Read when a step is traced: executables compiled before a change keep what
    they were built with."""
    return env_switch("PRISM_QKV_ROPE_KV", True)


def rope_tables(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) float32 [T, H/2] of positions [T] times the inverse frequencies [H/2]."""
    freqs = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq, jnp.float32)[None, :]
    return jnp.cos(freqs), jnp.sin(freqs)


def rotate_reference(y: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """y [T, n, H] rotated as the kernels do: y1 c - y2 s, y2 c + y1 s, every product and sum
    rounded (the barrier keeps XLA from contracting a product and its sum into an FMA)."""
    half = y.shape[-1] // 2
    y1, y2 = y[..., :half], y[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    p = jax.lax.optimization_barrier((y1 * c, y2 * s, y2 * c, y1 * s))
    return jnp.concatenate([p[0] - p[1], p[2] + p[3]], axis=-1)


def _check(qkv, cos, sin, q_gamma, k_gamma, op: str = _OP, name: str = "qkv") -> None:
    f32 = [jnp.float32]
    _checks.require(op, name, qkv, rank=4, dtypes=f32, expected="[T, K, G + 2, H]")
    t, _, slots, h = qkv.shape
    if slots < 3 or h % 2:
        raise ValueError(
            f"{op}: {name} must be [T, K, G + 2, H] with G >= 1 and H even, got "
            f"{_checks.describe(qkv)}"
        )
    for tname, table in (("cos", cos), ("sin", sin)):
        _checks.require(op, tname, table, rank=2, dtypes=f32, expected=f"[{t}, {h // 2}]")
        if table.shape != (t, h // 2):
            raise ValueError(
                f"{op}: {tname} must be [T, H/2] = [{t}, {h // 2}], got {_checks.describe(table)}"
            )
    if (q_gamma is None) != (k_gamma is None):
        raise ValueError(f"{op}: pass both q_gamma and k_gamma (qk-norm) or neither")
    for gname, g in (("q_gamma", q_gamma), ("k_gamma", k_gamma)):
        if g is not None:
            _checks.require(
                op, gname, g, rank=1, dtypes=[jnp.float32, jnp.bfloat16], expected=f"[{h}]"
            )
            _checks.require_dim(op, gname, g, 0, h, f"[H] with H = {h}")


def _check_pools(pools, slot, qkv, op: str) -> None:
    if pools is None:
        if slot is not None:
            raise ValueError(f"{op}: slot is only read with pools=(k_pages, v_pages)")
        return
    t, kv, _, h = qkv.shape
    want = f"float32 [P, L, K, H] with K = {kv}, H = {h}"
    if not isinstance(pools, (tuple, list)) or len(pools) != 2:
        raise ValueError(f"{op}: pools must be (k_pages, v_pages), got {type(pools).__name__}")
    for name, x in zip(("k_pages", "v_pages"), pools, strict=True):
        _checks.require(op, name, x, rank=4, dtypes=[jnp.float32], expected=want)
        if x.shape[2:] != (kv, h) or x.shape != pools[0].shape:
            raise ValueError(f"{op}: {name} must be {want}, both alike, got {_checks.describe(x)}")
    _checks.require(
        op, "slot", slot, rank=1, dtypes=[jnp.int32], expected=f"int32 [T] with T = {t}"
    )
    _checks.require_dim(op, "slot", slot, 0, t, f"int32 [T] with T = {t} (one per token)")


def _stored(q, k, v, pools, slot):
    """(q, k, v), or with pools (q, k_pages, v_pages) with k and v written at slot."""
    if pools is None:
        return q, k, v
    return q, write_pool_rows(pools[0], k, slot), write_pool_rows(pools[1], v, slot)


def _reference(qkv, cos, sin, q_gamma, k_gamma, eps: float, weight_offset: float):
    t, kv, slots, h = qkv.shape
    g = slots - 2
    q = qkv[:, :, :g].reshape(t, kv * g, h)
    k, v = qkv[:, :, g], qkv[:, :, g + 1]
    if q_gamma is not None:
        q = _normalize_reference(q, q_gamma, eps, weight_offset)
        k = _normalize_reference(k, k_gamma, eps, weight_offset)
    return rotate_reference(q, cos, sin), rotate_reference(k, cos, sin), v


def _call(target: str, operands: tuple, layout: tuple, gammas, eps, offset, pools=None, slot=None):
    """The FFI call of prism_qkv_rope(_sum)(_kv): its operands (cos and sin last), both gammas,
    then for _kv the pools (aliased to the results) and slot; layout is qkv's shape."""
    t, kv, slots, h = layout
    g = slots - 2
    q_gamma, k_gamma = gammas
    norm = q_gamma is not None
    zeros = jnp.zeros((h,), jnp.float32)
    args = (
        *operands,
        q_gamma.astype(jnp.float32) if norm else zeros,
        k_gamma.astype(jnp.float32) if norm else zeros,
    )
    q = jax.ShapeDtypeStruct((t, kv * g, h), jnp.float32)
    attrs = dict(eps=np.float32(eps), weight_offset=np.float32(offset), qk_norm=np.int32(norm))
    if pools is None:
        require_target(target)
        rows = jax.ShapeDtypeStruct((t, kv, h), jnp.float32)
        return jax.ffi.ffi_call(target, (q, rows, rows), vmap_method="sequential")(*args, **attrs)
    require_target(target + "_kv")
    pool = jax.ShapeDtypeStruct(pools[0].shape, jnp.float32)
    at = len(args)  # k_pages' operand index
    call = jax.ffi.ffi_call(
        target + "_kv",
        (q, pool, pool),
        input_output_aliases={at: 1, at + 1: 2},
        vmap_method="sequential",
    )
    return call(*args, *pools, slot, **attrs)


def qkv_rope(
    qkv,
    cos,
    sin,
    q_gamma=None,
    k_gamma=None,
    *,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
    pools=None,
    slot=None,
    impl: Impl | None = None,
):
    """Splits qkv, normalises q and k per head (when the gammas are given) and rotates them.

    Args:
      qkv: float32 [T, K, G + 2, H], per kv head its G query heads, its key, its value.
      cos, sin: float32 [T, H/2] (rope_tables).
      q_gamma, k_gamma: [H] qk-norm weights, or both None for models without qk-norm.
      eps, weight_offset: the norm's epsilon and weight offset (Gemma: 1, gamma is 1 + gamma).
      pools, slot: (k_pages, v_pages) float32 [P, L, K, H] (donate them) and int32 slot [T]:
        store k and v at pool row slot[t] instead of returning them (a slot outside [0, P * L)
        stores nothing; tokens sharing a slot: the last one's on the CPU, any one's on CUDA).

    Returns:
      (q [T, K * G, H], k [T, K, H], v [T, K, H]), float32; with pools (q, k_pages, v_pages).
    """
    _check(qkv, cos, sin, q_gamma, k_gamma)
    _check_pools(pools, slot, qkv, _OP)
    if resolve_impl(impl) == "reference":
        q, k, v = _reference(qkv, cos, sin, q_gamma, k_gamma, eps, weight_offset)
        return _stored(q, k, v, pools, slot)
    gammas = (q_gamma, k_gamma)
    operands = (qkv, cos, sin)
    return _call("prism_qkv_rope", operands, qkv.shape, gammas, eps, weight_offset, pools, slot)


def qkv_rope_sum(
    y2,
    y_w2,
    cos,
    sin,
    q_gamma=None,
    k_gamma=None,
    *,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
    pools=None,
    slot=None,
    impl: Impl | None = None,
):
    """qkv_rope of the two-digit projection's partial products, added in the kernel as
    Int8Linear adds them: qkv = y2[:T] + (y2[T:] + y_w2), each add rounded. One custom call
    instead of an XLA fusion that writes the sum out and qkv_rope reading it back.

    Args:
      y2: float32 [2T, K, G + 2, H], x1 W1 stacked over x2 W1 (Linear.int8_partials).
      y_w2: float32 [T, K, G + 2, H], x1 W2.
      cos, sin, q_gamma, k_gamma, eps, weight_offset, pools, slot: as qkv_rope.

    Returns:
      (q [T, K * G, H], k [T, K, H], v [T, K, H]), float32: qkv_rope's bits for that sum;
      with pools (q, k_pages, v_pages).
    """
    _check(y_w2, cos, sin, q_gamma, k_gamma, op="qkv_rope_sum", name="y_w2")
    t = y_w2.shape[0]
    want = (2 * t, *y_w2.shape[1:])
    _checks.require(
        "qkv_rope_sum", "y2", y2, rank=4, dtypes=[jnp.float32], expected=str(list(want))
    )
    if y2.shape != want:
        raise ValueError(
            f"qkv_rope_sum: y2 must be {list(want)} (x1 W1 over x2 W1 for y_w2 "
            f"{_checks.describe(y_w2)}), got {_checks.describe(y2)}"
        )
    _check_pools(pools, slot, y_w2, "qkv_rope_sum")
    if resolve_impl(impl) == "reference":
        qkv = y2[:t] + (y2[t:] + y_w2)
        q, k, v = _reference(qkv, cos, sin, q_gamma, k_gamma, eps, weight_offset)
        return _stored(q, k, v, pools, slot)
    gammas = (q_gamma, k_gamma)
    operands = (y2, y_w2, cos, sin)
    shape = y_w2.shape
    return _call("prism_qkv_rope_sum", operands, shape, gammas, eps, weight_offset, pools, slot)
