"""Where a layer's attention reads its keys: a dense mask over this step's tokens, or the paged
KV pool through the tree_attention custom call.

The decoder calls `backend(layer, q, k, v) -> [T, N * H]` once per layer with roped q and k;
with `rows` (int32 [R] token indices) only those tokens' outputs come back, [R, N * H], while
every token's k/v is still written (a step's last layer: only its readout rows are read).
The masked backend is the plain-jnp path (HF parity tests, notebooks on toy inputs); the paged
backend is what the engine runs: it writes this step's k/v into the pool and attends each
token's chain, with the numerics of DESIGN.md (batch-, paging- and chunking-invariant).
A backend may offer `kv_store(layer)`: the pools and slot table that qkv_rope can store k and
v into itself (ops.kv_write_fused); the decoder then hands the filled pools back with
`put_pools` and calls the backend with k = v = None.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import jax
import jax.numpy as jnp

from prism_jax import ops
from prism_jax.config import ModelConfig
from prism_jax.model.layers import attend, sliding_window_mask


class AttentionBackend(Protocol):
    def __call__(
        self, layer: int, q: jax.Array, k: jax.Array, v: jax.Array, rows: jax.Array | None = None
    ) -> jax.Array: ...


@dataclasses.dataclass
class MaskedAttention:
    """Dense attention over the step's own tokens; mask[q, k]: q may attend k."""

    config: ModelConfig
    positions: jax.Array  # int32 [T]
    mask: jax.Array  # bool [T, T]

    def __call__(self, layer: int, q: jax.Array, k: jax.Array, v: jax.Array, rows=None):
        c = self.config
        mask = self.mask
        if c.layer_types[layer] == "sliding":
            mask = sliding_window_mask(mask, self.positions, c.sliding_window)
        # Every row, then the gather: XLA's dots need not give a row the same bits in a
        # smaller batch, and this path is the plain reference.
        out = attend(q, k, v, mask, c.attention_scale)
        return out if rows is None else out[rows]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedTables:
    """The step's view of the KV pool (see ops.tree_attention for the semantics)."""

    slot: jax.Array  # int32 [T] pool row receiving token t's k/v
    positions: jax.Array  # int32 [T], -1 for padding
    chain_of: jax.Array  # int32 [T], -1 for padding
    chain_segments: jax.Array  # int32 [C, S, 3]
    pages_flat: jax.Array  # int32 [Pt]


@dataclasses.dataclass
class PagedAttention:
    """Tree attention over the pool; `kv` maps each layer the pass runs to its (k, v) pools
    and holds the updated pools after the pass."""

    config: ModelConfig
    tables: PagedTables
    kv: dict[int, tuple[jax.Array, jax.Array]]

    def kv_store(self, layer: int):
        """((k_pages, v_pages), slot) for qkv_rope to store this step's k/v into, or None where
        the pools hold digit rows (attention in digits cuts k and v itself)."""
        if self.config.attention_numerics == "digits" or not ops.kv_write_fused():
            return None
        return self.kv[layer], self.tables.slot

    def put_pools(self, layer: int, pools: tuple[jax.Array, jax.Array]) -> None:
        self.kv[layer] = pools

    def __call__(self, layer: int, q: jax.Array, k, v, rows=None):
        """k, v [T, K, H], or None when qkv_rope stored them (kv_store)."""
        c, tb = self.config, self.tables
        chain_of = tb.chain_of if rows is None else only_rows(tb.chain_of, rows)
        k_pages, v_pages = self.kv[layer]
        window = c.sliding_window if c.layer_types[layer] == "sliding" else 0
        digits = c.attention_numerics == "digits"
        attention = ops.tree_attention_digits if digits else ops.tree_attention
        kv_dtype = q.dtype if digits else k_pages.dtype  # digits: the kernel cuts k, v itself
        if k is None:
            assert not digits and v is None, "k and v come both or neither, and not in digits"
        else:
            k, v = k.astype(kv_dtype), v.astype(kv_dtype)
        out, k_pages, v_pages = attention(
            q,
            k,
            v,
            k_pages,
            v_pages,
            tb.slot,
            tb.positions,
            chain_of,
            tb.chain_segments,
            tb.pages_flat,
            scale=c.attention_scale,
            window=int(window or 0),
        )
        self.kv[layer] = (k_pages, v_pages)
        t = q.shape[0]
        out = out.reshape(t, -1)  # (T, N*H)
        return out if rows is None else out[rows]


def only_rows(chain_of: jax.Array, rows: jax.Array) -> jax.Array:
    """chain_of with every token outside `rows` marked as padding (-1): the kernels still write
    its k/v (the write depends on the slot only) but attend nothing for it. A query's bits
    depend only on its own chain and position (DESIGN.md), never on which other tokens attend,
    so the rows' outputs keep the bits of the full call."""
    keep = jnp.zeros(chain_of.shape, jnp.bool_).at[rows].set(True)
    return jnp.where(keep, chain_of, -1)
