"""Building blocks shared by every family: projections, RMSNorm, the embedding, rotary
embeddings and (for now plain-jnp) attention.

Shape letters: T tokens, S keys (= T until KV pages arrive), D model dim, F ffw dim, N query
heads, K kv heads, G = N / K query heads per kv head, H head dim, V vocab, R readout rows.

One model, three precisions:
  int8  every projection is ops.int8_gemm on INT8 weights (one scale per output channel) and
        INT8 rows (one scale per token) made by the fused norm / activation custom calls; the
        residual stream and attention are fp32. Projections named in
        config.int8_two_digit_rows get a second INT8 digit per row (the rounding remainder at
        its own per-token scale: the same GEMM on twice the rows), those named in
        config.int8_two_digit_weights a second INT8 weight matrix (the remainder at its own
        per-output-channel scale: one more GEMM); each cuts that operand's error ~127x.
  bf16  XLA dots on bf16 weights and activations, fp32 softmax: HF's bf16 numerics, the
        accuracy reference and the "generic engine" baseline.
  fp32  XLA dots in fp32 at HIGHEST precision: ground truth.

Logical axes (nnx.Param out_sharding metadata, mapped to the mesh in one place, never here):
  "vocab" V, "embed" D, "mlp" F, "heads" N*H (flattened by head), "kv_heads" K,
  "head_dim" H; None for small axes that are never sharded (the q/k/v and gate/up slots).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from prism_jax import ops
from prism_jax.config import ModelConfig, Precision

PRECISIONS: tuple[str, ...] = ("int8", "bf16", "fp32")
ACT_DTYPE = {"int8": jnp.float32, "bf16": jnp.bfloat16, "fp32": jnp.float32}
WEIGHT_DTYPE = {"bf16": jnp.bfloat16, "fp32": jnp.float32}  # int8: codes + fp32 scales
NORM_DTYPE = {"int8": jnp.float32, "bf16": jnp.bfloat16, "fp32": jnp.float32}
# The int8 model keeps its embedding in bf16: it is read row by row (lookup) and by the
# candidate head, never by a GEMM, and 27B's table is 2.8 GB in bf16 (5.6 GB in fp32).
EMBED_DTYPE = {"int8": jnp.bfloat16, "bf16": jnp.bfloat16, "fp32": jnp.float32}


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def dot_precision(dtype) -> jax.lax.Precision:
    # fp32 dots must not silently drop to TF32 / bf16 passes on GPUs.
    return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else jax.lax.Precision.DEFAULT


class Quantized(NamedTuple):
    """An INT8 activation: codes [..., K] and one fp32 scale per row [...]; optionally a
    second digit (q2, s2), the rows' rounding remainder quantised with its own per-row scale
    (ops.quantize_digits), so that the row is q * s + q2 * s2."""

    q: jax.Array
    s: jax.Array
    q2: jax.Array | None = None
    s2: jax.Array | None = None


class Partials(NamedTuple):
    """A two-digit projection's output left as its partial products (Linear.int8_partials):
    y2 [2T, *out] (x1 W1 stacked over x2 W1) and y_w2 [T, *out] (x1 W2), for a consumer that
    adds them itself (ops.add_rmsnorm_quant_sum) instead of XLA writing the sum out."""

    y2: jax.Array
    y_w2: jax.Array

    def total(self) -> jax.Array:
        """Linear's own output: the partials added in its order, y2[:T] + (y2[T:] + y_w2)."""
        t = self.y_w2.shape[0]
        return self.y2[:t] + (self.y2[t:] + self.y_w2)


def as_array(y: jax.Array | Partials) -> jax.Array:
    """A projection's output as one array (Partials added in Linear's order)."""
    return y.total() if isinstance(y, Partials) else y


def _stacked_digits(x: Quantized) -> tuple[jax.Array, jax.Array]:
    """(codes, scales) of x's rows, both digits stacked ([x1; x2]) when it has two. Every op
    that writes two digits returns the halves of one stacked buffer, and XLA folds this
    concatenate of adjacent halves back into that buffer: no copy."""
    if x.q2 is None:
        return x.q, x.s
    return jnp.concatenate([x.q, x.q2]), jnp.concatenate([x.s, x.s2])


def _param(shape: tuple[int, ...], dtype, axes: tuple[str | None, ...]) -> nnx.Param:
    assert len(axes) == len(shape), f"axes {axes} do not name every dim of {shape}"
    # eager_sharding=False: the names are metadata for a later mesh, not a request to shard now.
    return nnx.Param(jnp.zeros(shape, dtype), out_sharding=axes, eager_sharding=False)


def assign(var: nnx.Param, value, what: str) -> None:
    """Sets a parameter, checking shape and dtype against what the module declared."""
    value = jnp.asarray(value)
    if value.shape != var.shape or value.dtype != var.dtype:
        raise ValueError(
            f"{what}: expected {np.dtype(var.dtype).name} {list(var.shape)}, "
            f"got {np.dtype(value.dtype).name} {list(value.shape)}"
        )
    var.set_value(value)


# Weights are quantised per output channel by the row-quantisation custom call, whose division
# 127 / amax is correctly rounded on both devices: XLA's on the GPU is not, so a checkpoint
# quantised there by ops.quantize_weight could differ by a code from the CPU's.
_quantize_weight = jax.jit(
    lambda w, digits: ops.quantize_digits(w.astype(jnp.float32), digits=digits),
    static_argnums=1,
)


class Linear(nnx.Module):
    """y[T, *out] = x[T, K] . w[*out, K] (+ bias[*out]); weights in HF's [out, in] layout.

    `out` may have several axes (fused q/k/v as (K, G + 2, H), gate/up as (2, F)) so that
    every logical axis can be sharded on its own; the GEMM sees w as [prod(out), K].
    """

    def __init__(
        self,
        in_dim: int,
        out: tuple[int, ...],
        axes: tuple[str | None, ...],
        precision: Precision,
        *,
        bias: bool = False,
        two_digit_weights: bool = False,
    ) -> None:
        check_precision(precision)
        self.precision, self.in_dim, self.out = precision, in_dim, tuple(out)
        shape = (*self.out, in_dim)
        if precision == "int8":
            self.w_q = _param(shape, jnp.int8, axes)
            self.s_w = _param(self.out, jnp.float32, axes[:-1])
        two = precision == "int8" and two_digit_weights
        # The per-channel rounding remainder as its own INT8 matrix and scales.
        self.w_q2 = _param(shape, jnp.int8, axes) if two else None
        self.s_w2 = _param(self.out, jnp.float32, axes[:-1]) if two else None
        if precision != "int8":
            self.w = _param(shape, WEIGHT_DTYPE[precision], axes)
        self.bias = _param(self.out, ACT_DTYPE[precision], axes[:-1]) if bias else None

    def load(self, w, bias=None, *, what: str = "linear") -> None:
        """w: float [*out, K] (HF layout); quantised per output channel for int8."""
        w = jnp.asarray(w)
        if w.shape != (*self.out, self.in_dim):
            raise ValueError(f"{what}: expected {[*self.out, self.in_dim]}, got {list(w.shape)}")
        if self.precision == "int8":
            digits = _quantize_weight(w.reshape(-1, self.in_dim), 1 if self.w_q2 is None else 2)
            q, s = digits[:2]  # (prod(out), K), (prod(out),)
            assign(self.w_q, q.reshape(w.shape), what)
            assign(self.s_w, s.reshape(self.out), what + " scales")
            if self.w_q2 is not None:
                q2, s2 = digits[2:]
                assign(self.w_q2, q2.reshape(w.shape), what + " remainder")
                assign(self.s_w2, s2.reshape(self.out), what + " remainder scales")
        else:
            assign(self.w, w.astype(self.w.dtype), what)
        assert (bias is None) == (self.bias is None), f"{what}: bias given iff the layer has one"
        if bias is not None:
            assign(self.bias, jnp.asarray(bias).astype(self.bias.dtype), what + " bias")

    def __call__(self, x: Quantized | jax.Array) -> jax.Array:
        t = x.q.shape[0] if isinstance(x, Quantized) else x.shape[0]
        if self.precision == "int8":
            assert isinstance(x, Quantized), "the int8 model feeds projections INT8 rows"
            y = self._int8(x, t)  # (T, prod(out))
        else:
            w = self.w[...].reshape(-1, self.in_dim)  # (prod(out), K)
            y = jax.lax.dot_general(
                x,
                w,
                (((1,), (1,)), ((), ())),
                precision=dot_precision(w.dtype),
                preferred_element_type=jnp.float32,
            ).astype(x.dtype)
        y = y.reshape(t, *self.out)  # (T, *out)
        return y if self.bias is None else y + self.bias[...]

    def int8_partials(self, x: Quantized) -> tuple[jax.Array, jax.Array] | None:
        """With two-digit rows and weights (and no bias): the partial products (y2, y_w2),
        y2 [2T, *out] = x1 W1 stacked over x2 W1 and y_w2 [T, *out] = x1 W2, which this layer
        adds as y2[:T] + (y2[T:] + y_w2); a consumer that can add them itself (glu_quant2_sum)
        spares XLA writing the sum out. None for every other layout."""
        if self.precision != "int8" or x.q2 is None or self.w_q2 is None or self.bias is not None:
            return None
        t = x.q.shape[0]
        return self._w1_product(x).reshape(2 * t, *self.out), self._w2_product(x).reshape(
            t, *self.out
        )

    def partials_or_output(self, x: Quantized | jax.Array) -> Partials | jax.Array:
        """Partials where int8_partials has them (for a consumer that adds them), else the
        layer's output."""
        parts = self.int8_partials(x)
        return self(x) if parts is None else Partials(*parts)

    def _w1_product(self, x: Quantized) -> jax.Array:
        """x1 W1, stacked over x2 W1 when x has a second digit: (T or 2T, prod(out)). Both
        digits go through one GEMM, so the weights are read once."""
        w_q = self.w_q[...].reshape(-1, self.in_dim)  # (prod(out), K)
        q, s = _stacked_digits(x)  # (T or 2T, K), (T or 2T,)
        return ops.int8_gemm(q, s, w_q, self.s_w[...].reshape(-1), out_dtype=jnp.float32)

    def _w2_product(self, x: Quantized) -> jax.Array:
        """x1 W2, the two-digit weights' remainder matrix: (T, prod(out)). With two-digit rows
        the GEMM reads x1 as the first T rows of the stacked digits: a slice of them would be a
        copy for small T (ops.int8_gemm rows=)."""
        w_q2 = self.w_q2[...].reshape(-1, self.in_dim)  # (prod(out), K)
        q, s = _stacked_digits(x)
        s_w2 = self.s_w2[...].reshape(-1)
        return ops.int8_gemm(q, s, w_q2, s_w2, out_dtype=jnp.float32, rows=x.q.shape[0])

    def _int8(self, x: Quantized, t: int) -> jax.Array:
        """x1 W1 (+ x2 W1 when x has a second digit) (+ x1 W2 with two-digit weights), each an
        exact int32 GEMM with its own fp32 epilogue; x2 W2 is below fp32 rounding. A row's
        result never depends on the other rows, and the partial outputs add elementwise in a
        fixed order, so the sum is as batch-invariant as one GEMM."""
        y, small = self._w1_product(x), None  # (T, prod(out)), or (2T, prod(out)) stacked
        if x.q2 is not None:
            y, small = y[:t], y[t:]  # (T, prod(out)) each
        if self.w_q2 is not None:
            y_w2 = self._w2_product(x)
            small = y_w2 if small is None else small + y_w2
        return y if small is None else y + small


def _rmsnorm_float(x: jax.Array, gamma: jax.Array, eps: float, offset: float) -> jax.Array:
    """HF's float RMSNorm: statistics in fp32; Gemma scales by (1 + gamma) in fp32, Llama and
    Qwen multiply gamma in the activation dtype after rounding."""
    xf = x.astype(jnp.float32)
    normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + jnp.float32(eps))
    if offset:
        return (normed * (jnp.float32(offset) + gamma.astype(jnp.float32))).astype(x.dtype)
    return gamma.astype(x.dtype) * normed.astype(x.dtype)


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis (D, or H for qk-norm); Gemma's weight is (1 + gamma)."""

    def __init__(self, dim: int, config: ModelConfig, precision: Precision, axis: str) -> None:
        self.precision, self.eps = precision, config.rms_norm_eps
        self.offset = config.norm_weight_offset
        self.gamma = _param((dim,), NORM_DTYPE[precision], (axis,))

    def load(self, gamma, *, what: str = "norm") -> None:
        assign(self.gamma, jnp.asarray(gamma).astype(self.gamma.dtype), what)

    def __call__(self, x: jax.Array) -> jax.Array:
        """Float in, float out (x's dtype): qk-norm, Gemma's post-norms, the final norm."""
        if self.precision == "int8":
            return ops.rmsnorm(x, self.gamma[...], eps=self.eps, weight_offset=self.offset)
        return _rmsnorm_float(x, self.gamma[...], self.eps, self.offset)

    def project_input(
        self,
        h: jax.Array,
        delta: jax.Array | None,
        *,
        two_digit: bool = False,
        delta_norm: RMSNorm | None = None,
    ):
        """h += delta (delta_norm(delta) when given), then normalise h for a projection ->
        (projection input, new h). delta may be a projection's Partials.

        int8 fuses delta_norm (Gemma's post-norm on the previous block's output), the residual
        add, the norm and the row quantisation in one custom call; two_digit (int8 only) has it
        quantise the row's remainder too (the second digit, as ops.quantize_digits; the digits
        are slices of one stacked buffer, as the two-digit GEMM takes them).
        """
        if isinstance(delta, Partials) and self.precision != "int8":
            delta = delta.total()  # only the int8 norms add partial products themselves
        if delta_norm is not None:
            assert delta is not None, "delta_norm normalises delta: pass one"
            assert (delta_norm.eps, delta_norm.offset) == (self.eps, self.offset), (
                "the fused norms share eps and weight offset"
            )
        if self.precision != "int8":
            if delta is not None:
                h = h + (delta_norm(delta) if delta_norm is not None else delta)
            return self(h), h
        g = self.gamma[...]
        norm = dict(eps=self.eps, weight_offset=self.offset)
        if delta_norm is not None:
            norm["x_gamma"] = delta_norm.gamma[...]
        digits = 2 if two_digit else 1
        if delta is None:
            return Quantized(*ops.rmsnorm_quant(h, g, digits=digits, **norm)), h
        if isinstance(delta, Partials):  # y2[:T] + (y2[T:] + y_w2) added in the kernel
            *codes, h = ops.add_rmsnorm_quant_sum(*delta, h, g, digits=digits, **norm)
        else:
            *codes, h = ops.add_rmsnorm_quant(delta, h, g, digits=digits, **norm)
        return Quantized(*codes), h


class Embedding(nnx.Module):
    """Token embedding [V, D]; also the output embedding (tied) or the untied lm_head."""

    def __init__(self, vocab: int, dim: int, precision: Precision) -> None:
        self.precision = precision
        self.table = _param((vocab, dim), EMBED_DTYPE[precision], ("vocab", "embed"))

    def load(self, table, *, what: str = "embedding") -> None:
        assign(self.table, jnp.asarray(table).astype(self.table.dtype), what)

    def lookup(self, tokens: jax.Array, scale: float) -> jax.Array:
        dtype = ACT_DTYPE[self.precision]
        x = self.table[...][tokens].astype(dtype)  # (T, D)
        if scale == 1.0:
            return x
        # HF Gemma: the fp32 scale tensor is cast to the embedding dtype before the multiply.
        return x * jnp.asarray(np.float32(scale), dtype)


def glu(gate: jax.Array, up: jax.Array, activation: str) -> jax.Array:
    """act(gate) * up for the float models (HF: activation rounded to the dtype first)."""
    g = gate.astype(jnp.float32)
    a = jax.nn.gelu(g, approximate=True) if activation == "gelu_tanh" else jax.nn.silu(g)
    return a.astype(gate.dtype) * up


# --- rotary embeddings ------------------------------------------------------------------------


def rope_inv_freq(config: ModelConfig, layer: int) -> np.ndarray:
    """Inverse frequencies [H/2] in fp32, computed as HF does (fp32 pow, then scaling)."""
    h = config.head_dim
    base = np.float32(config.rope_theta_for(layer))
    inv = np.float32(1.0) / (base ** (np.arange(0, h, 2).astype(np.float32) / np.float32(h)))
    if config.layer_types[layer] == "sliding":
        return inv  # Gemma's local rope is never scaled
    if config.rope_scaling_factor != 1.0:
        inv = inv / np.float32(config.rope_scaling_factor)
    if config.rope_llama3 is not None:
        inv = _llama3_scaling(inv, config.rope_llama3)
    return inv.astype(np.float32)


def _llama3_scaling(inv: np.ndarray, r) -> np.ndarray:
    low_wavelen = r.original_max_position_embeddings / r.low_freq_factor
    high_wavelen = r.original_max_position_embeddings / r.high_freq_factor
    wavelen = np.float32(2 * np.pi) / inv
    scaled = np.where(wavelen > low_wavelen, inv / np.float32(r.factor), inv)
    smooth = (r.original_max_position_embeddings / wavelen - r.low_freq_factor) / (
        r.high_freq_factor - r.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / np.float32(r.factor) + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotates x [T, n, H] by position, HF's half-split layout (rotate_half), in x's dtype."""
    cos, sin = ops.rope_tables(positions, inv_freq)  # (T, H/2) fp32
    cos, sin = cos.astype(x.dtype)[:, None, :], sin.astype(x.dtype)[:, None, :]  # (T, 1, H/2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # (T, n, H/2) each
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


# --- attention --------------------------------------------------------------------------------


def sliding_window_mask(mask: jax.Array, positions: jax.Array, window: int) -> jax.Array:
    """Sliding layers also require positions[q] - positions[k] < window (HF's convention)."""
    return mask & ((positions[:, None] - positions[None, :]) < window)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Plain-jnp GQA attention (a paged tree-attention custom call replaces it later).

    q [T, N, H], k and v [S, K, H], mask bool [T, S] -> [T, N * H] in q's dtype. Scores and
    softmax in fp32; masked keys get exact zero weight, so a fully masked (padding) row is 0.
    """
    t, n, h = q.shape
    kv = k.shape[1]
    prec = dot_precision(q.dtype)
    qg = q.reshape(t, kv, n // kv, h)  # (T, K, G, H): query head n uses kv head n // G, as HF
    scores = jnp.einsum(
        "tkgh,skh->kgts", qg, k, precision=prec, preferred_element_type=jnp.float32
    ) * jnp.float32(scale)  # (K, G, T, S)
    allowed = mask[None, None]
    scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
    probs = jnp.where(allowed, jax.nn.softmax(scores, axis=-1), 0.0).astype(v.dtype)
    out = jnp.einsum(
        "kgts,skh->tkgh", probs, v, precision=prec, preferred_element_type=jnp.float32
    )  # (T, K, G, H)
    return out.reshape(t, n * h).astype(q.dtype)  # (T, N*H)
