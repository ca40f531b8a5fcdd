"""The decoder's entry points as pure functions of (params, config, ...): one flat token
sequence under a mask (forward), one forest step against the paged KV pool (forward_paged),
and a run of that step's layers (forward_paged_part, for steps split over executables).

Shape letters: T tokens, D model dim, R readout rows; P pages, L page length, K kv heads,
H head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from prism_jax.config import ModelConfig
from prism_jax.model.attention_backends import MaskedAttention, PagedAttention, PagedTables
from prism_jax.model.transformer import Params, bind


def _check_step_inputs(tokens, positions, mask) -> None:
    t = tokens.shape[0] if tokens.ndim == 1 else -1
    if tokens.ndim != 1 or tokens.dtype != jnp.int32:
        raise ValueError(f"tokens must be int32 [T], got {tokens.dtype} {list(tokens.shape)}")
    if positions.shape != (t,) or positions.dtype != jnp.int32:
        raise ValueError(
            f"positions must be int32 [{t}], got {positions.dtype} {list(positions.shape)}"
        )
    if mask.shape != (t, t) or mask.dtype != jnp.bool_:
        raise ValueError(
            f"mask must be bool [{t}, {t}] (mask[q, k]: q may attend k), got "
            f"{mask.dtype} {list(mask.shape)}"
        )


def forward(
    params: Params,
    config: ModelConfig,
    tokens: jax.Array,
    positions: jax.Array,
    mask: jax.Array,
    rows: jax.Array | None = None,
) -> jax.Array:
    """Runs the decoder over one flat token sequence.

    Args:
      params: from init_random or params_from_hf.
      config: the model's config (static under jit).
      tokens: int32 [T] token ids.
      positions: int32 [T] rope positions (a forest repeats positions across branches).
      mask: bool [T, T]; mask[q, k] says query q may attend key k (causal, tree or forest).
        Sliding-window layers further require positions[q] - positions[k] < sliding_window.
      rows: optional int32 [R] token indices: the hidden states wanted (see forward_paged).

    Returns:
      Final-normed hidden states [T, D] (fp32 for int8 and fp32, bf16 for bf16), or [R, D].
    """
    _check_step_inputs(tokens, positions, mask)
    attention = MaskedAttention(config, positions, mask)
    return bind(params, config)(tokens, positions, attention, _check_rows(rows))


def _check_rows(rows: jax.Array | None) -> jax.Array | None:
    if rows is not None and (rows.ndim != 1 or rows.dtype != jnp.int32):
        raise ValueError(
            f"rows must be int32 [R] token indices, got {rows.dtype} {list(rows.shape)}"
        )
    return rows


def forward_paged(
    params: Params,
    config: ModelConfig,
    kv: tuple[tuple[jax.Array, jax.Array], ...],
    tokens: jax.Array,
    tables: PagedTables,
    rows: jax.Array | None = None,
) -> tuple[jax.Array, tuple[tuple[jax.Array, jax.Array], ...]]:
    """Runs the decoder over one step of a forest against the paged KV pool.

    Args:
      kv: per layer (k_pages, v_pages) [P, L, K, H] (kv_pages.init_kv_pool); donate them.
      tokens: int32 [T] this step's tokens (padding: any id).
      tables: slot / positions / chain tables of the step (scheduler.step_arrays).
      rows: optional int32 [R] token indices (repeats allowed): the hidden states the step
        reads out. The last layer then writes every token's k/v but computes its attention
        output, MLP and final norm for these R tokens only (when R < T; else it runs whole):
        the same bits as the full hidden's rows (hidden[rows]), for 1 / num_layers of the
        work on the other tokens.

    Returns:
      (final-normed hidden [T, D] or [R, D], the pools with this step's k/v written). A
      token's hidden state depends only on its own chain's tokens, never on the rest of the
      step (int8).
    """
    assert len(kv) == config.num_layers, f"kv has {len(kv)} layers, the model {config.num_layers}"
    layers = range(config.num_layers)
    return forward_paged_part(params, config, kv, tokens, None, tables, layers, rows)


def forward_paged_part(
    params: Params,
    config: ModelConfig,
    kv: tuple[tuple[jax.Array, jax.Array], ...],
    tokens: jax.Array,
    carry: tuple[jax.Array, jax.Array] | None,
    tables: PagedTables,
    layers: range,
    rows: jax.Array | None = None,
):
    """forward_paged's layers `layers` only, so a step can run as several executables
    (prism_jax/forward_parts.py); the parts in order compute forward_paged's bits.

    Args:
      kv: the pools of `layers` only (donate them).
      tokens: the step's tokens (read by the part starting at layer 0 only).
      carry: (h, delta) from the previous part; None for the first part.
      rows: forward_paged's rows; only for the part ending at the last layer.

    Returns:
      (carry for the next part, or the final-normed hidden [T, D] ([R, D] with rows) from the
      part ending at the last layer; the pools of `layers` with this step's k/v written).
    """
    assert len(layers) >= 1 and layers.step == 1, f"layers must be a non-empty run, got {layers}"
    assert 0 <= layers.start and layers.stop <= config.num_layers, f"{layers} outside the model"
    assert len(kv) == len(layers), f"kv has {len(kv)} layers, the part {len(layers)}"
    assert (carry is None) == (layers.start == 0), "only the first part starts without a carry"
    last = layers.stop == config.num_layers
    assert rows is None or last, "rows: only the part ending at the last layer reads out"
    positions = jnp.maximum(tables.positions, 0)  # padding rows: any valid rope position
    backend = PagedAttention(config, tables, dict(zip(layers, kv, strict=True)))
    m = bind(params, config)
    h, delta = carry if carry is not None else (m.embed.lookup(tokens, config.embed_scale), None)
    h, delta = m.run_layers(h, delta, positions, backend, layers, _check_rows(rows))
    out = m.final_norm(h + delta) if last else (h, delta)
    return out, tuple(backend.kv[i] for i in layers)
