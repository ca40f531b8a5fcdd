"""The decoder: Gemma 3 and Llama / Qwen2 / Qwen3 from one ModelConfig, as pure functions.

Shape letters: T tokens, D model dim, F ffw dim, N query heads, K kv heads, G = N / K,
H head dim, V vocab, R readout rows, C candidates per row.

    params = init_random(config, precision, seed)  # random_weights.py, or hf_weights.params_from_hf
    hidden = forward(params, config, tokens, positions, mask)  # steps.py; [T, D], final-normed
    logits, logprobs = candidate_readout(params, config, hidden[rows], ids, counts)  # readout.py

`params` is a Params pytree (nnx.State + the precision, static), so the step jits with
`jax.jit(forward, static_argnames="config")`. Modules hold weights only: no KV, no caches.

Residual stream: each layer returns (h, delta) and the next norm adds delta into h, so the
int8 model fuses "residual add + RMSNorm + quantise" into one custom call per norm; Gemma's
post-norm on the added block output rides in the same call (RMSNorm.project_input delta_norm).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from prism_jax import ops
from prism_jax.config import ModelConfig, Precision
from prism_jax.model.attention_backends import AttentionBackend
from prism_jax.model.layers import (
    Embedding,
    Linear,
    Quantized,
    RMSNorm,
    apply_rope,
    as_array,
    check_precision,
    glu,
    rope_inv_freq,
)


class Attention(nnx.Module):
    """Fused q/k/v projection laid out (K, G + 2, H): per kv head, its G query heads, then its
    key and value, so sharding the kv-head axis keeps each group whole on one device."""

    def __init__(self, config: ModelConfig, layer: int, precision: Precision) -> None:
        c = config
        self.config, self.layer, self.precision = c, layer, precision
        self.qkv = Linear(
            c.hidden_size,
            (c.num_kv_heads, c.num_groups + 2, c.head_dim),
            ("kv_heads", None, "head_dim", "embed"),
            precision,
            bias=c.qkv_bias,
            two_digit_weights="qkv" in c.int8_two_digit_weights,
        )
        self.o = Linear(
            c.num_heads * c.head_dim,
            (c.hidden_size,),
            ("embed", "heads"),
            precision,
            two_digit_weights="o" in c.int8_two_digit_weights,
        )
        self.q_norm = RMSNorm(c.head_dim, c, precision, "head_dim") if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c, precision, "head_dim") if c.qk_norm else None

    def __call__(
        self,
        x: Quantized | jax.Array,
        positions: jax.Array,
        attention: AttentionBackend,
        rows: jax.Array | None = None,
        partials: bool = False,
    ):
        """(T, D) output, or (R, D) for the tokens `rows` only (every token's k/v is written).
        partials: the o projection's Partials where it has them (the next norm adds them)."""
        c = self.config
        store = self._kv_store(attention)
        q, k, v = self._project(x, positions, store)
        if store is not None:  # qkv_rope stored k and v: k, v are the filled pools
            attention.put_pools(self.layer, (k, v))
            k = v = None
        a = attention(self.layer, q, k, v, rows)  # (T or R, N*H)
        if self.precision == "int8":
            digits = 2 if "o" in c.int8_two_digit_rows else 1
            aq = Quantized(*ops.quantize_digits(a.astype(jnp.float32), digits=digits))
            return self.o.partials_or_output(aq) if partials else self.o(aq)  # (T, D)
        return self.o(a)  # (T, D)

    def _kv_store(self, attention):
        """The pools and slot qkv_rope stores k and v into (ops.kv_write_fused), or None."""
        if self.precision != "int8" or not ops.qkv_rope_supported(self.config.head_dim):
            return None
        kv_store = getattr(attention, "kv_store", None)  # the paged backend's
        return kv_store(self.layer) if kv_store is not None else None

    def _project(self, x: Quantized | jax.Array, positions: jax.Array, store=None):
        """q [T, N, H], k and v [T, K, H]: the fused projection split, qk-normed and roped.
        With store ((k_pages, v_pages), slot): q and the pools with k and v stored in them."""
        c = self.config
        inv_freq = rope_inv_freq(c, self.layer)
        if self.precision == "int8" and ops.qkv_rope_supported(c.head_dim):
            # One custom call splits qkv, applies qk-norm and rotates (ops.qkv_rope); with two
            # digits it adds the projection's partial products first (ops.qkv_rope_sum), so
            # XLA never writes their sum out.
            cos, sin = ops.rope_tables(positions, inv_freq)
            gammas = (self.q_norm.gamma[...], self.k_norm.gamma[...]) if c.qk_norm else ()
            norm = dict(eps=c.rms_norm_eps, weight_offset=c.norm_weight_offset)
            if store is not None:
                norm.update(pools=store[0], slot=store[1])
            parts = self.qkv.int8_partials(x)  # ((2T, K, G+2, H), (T, K, G+2, H)) or None
            if parts is not None:
                return ops.qkv_rope_sum(*parts, cos, sin, *gammas, **norm)
            return ops.qkv_rope(self.qkv(x), cos, sin, *gammas, **norm)
        assert store is None, "k/v are stored by qkv_rope only (int8, a supported head dim)"
        qkv = self.qkv(x)  # (T, K, G+2, H)
        t, g = qkv.shape[0], c.num_groups
        q = qkv[:, :, :g].reshape(t, c.num_heads, c.head_dim)  # (T, N, H)
        k, v = qkv[:, :, g], qkv[:, :, g + 1]  # (T, K, H)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v


class MLP(nnx.Module):
    """Gated MLP; gate and up fused as (2, F) so the F axis shards without splitting a pair."""

    def __init__(self, config: ModelConfig, precision: Precision) -> None:
        c = config
        self.activation, self.precision = c.activation, precision
        self.two_digit = "down" in c.int8_two_digit_rows
        self.gate_up = Linear(
            c.hidden_size,
            (2, c.intermediate_size),
            (None, "mlp", "embed"),
            precision,
            two_digit_weights="gate_up" in c.int8_two_digit_weights,
        )
        self.down = Linear(
            c.intermediate_size,
            (c.hidden_size,),
            ("embed", "mlp"),
            precision,
            two_digit_weights="down" in c.int8_two_digit_weights,
        )

    def __call__(self, x: Quantized | jax.Array, partials: bool = False):
        """(T, D); partials: the down projection's Partials where it has them (the next norm
        adds them)."""
        down = self.down.partials_or_output if partials else self.down
        two_digit = self.precision == "int8" and self.two_digit
        parts = self.gate_up.int8_partials(x) if two_digit else None
        if parts is not None:  # gate_up's partial products, added inside the activation kernel
            return down(Quantized(*ops.glu_quant2_sum(*parts, activation=self.activation)))
        gu = self.gate_up(x)  # (T, 2, F)
        if self.precision == "int8":
            # The kernel reads gate and up in place from gu (no XLA slice copies); two digits:
            # (q, s, q2, s2) from one pass of the activation kernel.
            quant = ops.glu_quant2_pair if self.two_digit else ops.glu_quant_pair
            return down(Quantized(*quant(gu, activation=self.activation)))
        return self.down(glu(gu[:, 0], gu[:, 1], self.activation))


class DecoderLayer(nnx.Module):
    """Pre-norm block; Gemma adds post-norms on the attention and MLP outputs (sandwich)."""

    def __init__(self, config: ModelConfig, layer: int, precision: Precision) -> None:
        c, d = config, config.hidden_size
        self.two_digit_qkv = "qkv" in c.int8_two_digit_rows
        self.two_digit_gate_up = "gate_up" in c.int8_two_digit_rows
        self.input_norm = RMSNorm(d, c, precision, "embed")
        self.attn = Attention(c, layer, precision)
        self.post_attn_norm = RMSNorm(d, c, precision, "embed") if c.sandwich_norms else None
        self.pre_mlp_norm = RMSNorm(d, c, precision, "embed")
        self.mlp = MLP(c, precision)
        self.post_mlp_norm = RMSNorm(d, c, precision, "embed") if c.sandwich_norms else None

    def __call__(
        self, h, delta, positions, attention, delta_norm: RMSNorm | None = None, rows=None
    ):
        """(h, delta) -> (h + [delta_norm](delta) + attention, the MLP output before its
        post-norm): the MLP output's post-norm (Gemma) and residual add are left to the next
        norm, which fuses them (run_layers passes this layer's post_mlp_norm as delta_norm).
        With `rows` (int32 [R]) every token's k/v is written but only those tokens go on past
        the attention: (R, D) out. Every op after it is per row, so their bits are the full
        layer's rows."""
        x, h = self.input_norm.project_input(
            h, delta, two_digit=self.two_digit_qkv, delta_norm=delta_norm
        )
        # The o and down projections' partial products (two digits) go to the next norm, which
        # adds them in Linear's order: XLA never writes their sum out.
        o = self.attn(x, positions, attention, rows, partials=True)  # (T or R, D)
        if rows is not None:
            h = h[rows]
        x, h = self.pre_mlp_norm.project_input(
            h, o, two_digit=self.two_digit_gate_up, delta_norm=self.post_attn_norm
        )
        return h, self.mlp(x, partials=True)  # (T, D)


class Transformer(nnx.Module):
    """Embedding, decoder layers, final norm and (untied models) the lm_head."""

    def __init__(self, config: ModelConfig, precision: Precision) -> None:
        check_precision(precision)
        c = config
        self.config, self.precision = c, precision
        self.embed = Embedding(c.vocab_size, c.hidden_size, precision)
        self.layers = nnx.List([DecoderLayer(c, i, precision) for i in range(c.num_layers)])
        self.final_norm = RMSNorm(c.hidden_size, c, precision, "embed")
        self.lm_head = (
            None if c.tie_word_embeddings else Embedding(c.vocab_size, c.hidden_size, precision)
        )

    def __call__(
        self, tokens: jax.Array, positions: jax.Array, attention: AttentionBackend, rows=None
    ) -> jax.Array:
        h = self.embed.lookup(tokens, self.config.embed_scale)  # (T, D)
        layers = range(len(self.layers))
        h, delta = self.run_layers(h, None, positions, attention, layers, rows)
        return self.final_norm(h + delta)

    def run_layers(
        self, h, delta, positions, attention: AttentionBackend, layers: range, rows=None
    ):
        """(h, delta) through the decoder layers `layers` (delta None before the first). Inside
        the run each layer's MLP output goes to the next layer with its post-norm pending
        (fused into that layer's input norm); the run's last applies its own, so a run's
        (h, delta) is the same whatever runs a forward is cut into (forward_parts.py).
        `rows`: the run's last layer carries only those tokens on (R rows out). With as many
        rows as tokens or more (repeated questions on a cached state) the whole layer is the
        cheaper way to the same bits, so it runs whole and its output is gathered."""
        prune = rows is not None and rows.shape[0] < h.shape[0]
        for i in layers:
            pending = self.layers[i - 1].post_mlp_norm if i > layers.start else None
            only = rows if prune and i == layers.stop - 1 else None
            h, delta = self.layers[i](h, delta, positions, attention, pending, only)
        delta = as_array(delta)
        if rows is not None and not prune:
            h, delta = h[rows], delta[rows]
        last = self.layers[layers.stop - 1].post_mlp_norm
        return h, (last(delta) if last is not None else delta)

    def output_embedding(self) -> jax.Array:
        return (self.lm_head or self.embed).table[...]  # (V, D)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
    """The weights of one model at one precision: a pytree whose only leaves are arrays."""

    state: nnx.State
    precision: str = dataclasses.field(metadata=dict(static=True))


def abstract_model(config: ModelConfig, precision: Precision) -> Transformer:
    """The model with ShapeDtypeStruct leaves: no memory, ready to be loaded into."""
    return nnx.eval_shape(lambda: Transformer(config, precision))


@functools.lru_cache(maxsize=32)
def _graphdef(config: ModelConfig, precision: Precision) -> nnx.GraphDef:
    return nnx.split(abstract_model(config, precision))[0]


def to_params(model: Transformer) -> Params:
    abstract = [p for p in jax.tree.leaves(nnx.state(model)) if isinstance(p, jax.ShapeDtypeStruct)]
    assert not abstract, f"{len(abstract)} parameters were never loaded, e.g. {abstract[0]}"
    return Params(nnx.state(model), model.precision)


def bind(params: Params, config: ModelConfig) -> Transformer:
    """The module view of `params` (cheap; call it inside jit)."""
    return nnx.merge(_graphdef(config, params.precision), params.state)
