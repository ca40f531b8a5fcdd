"""The statistics smoothing is chosen from: max|X| per input channel of every projection, from
one fp32 forward over calibration token sequences, cached in the user cache per checkpoint and
calibration (a few KB per model).

Shape letters: T tokens, K a projection's input channels.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax.config import ModelConfig
from prism_jax.model.calibration_text import PASSAGES

# Bump when the statistics or their meaning change, so cached files are not reused.
STATS_VERSION = 1
ROW_LEN = 512  # calibration tokens per forward

# --- calibration ---------------------------------------------------------------------------------


class _Recorder:
    """Stands in for a Linear while tracing the calibration pass: records max|x| per input
    channel over the valid rows, then runs the Linear."""

    def __init__(self, linear, key: str, sink: dict, valid: jax.Array) -> None:
        self.linear, self.key, self.sink, self.valid = linear, key, sink, valid

    def _record(self, x: jax.Array) -> None:
        ax = jnp.where(self.valid[:, None], jnp.abs(x.astype(jnp.float32)), 0.0)  # (T, K)
        self.sink[self.key] = jnp.max(ax, axis=0)

    def __call__(self, x: jax.Array) -> jax.Array:
        self._record(x)
        return self.linear(x)

    def partials_or_output(self, x: jax.Array):
        """The decoder layer asks o and down for this (Linear.partials_or_output)."""
        self._record(x)
        return self.linear.partials_or_output(x)


def _absmax_pass(params, config: ModelConfig, tokens, positions, mask, valid) -> dict:
    from prism_jax.model.attention_backends import MaskedAttention  # noqa: PLC0415
    from prism_jax.model.transformer import bind  # noqa: PLC0415 (transformer imports are heavy)

    model = bind(params, config)
    sink: dict[str, jax.Array] = {}
    for i, layer in enumerate(model.layers):
        for owner, attr, proj in (
            (layer.attn, "qkv", "qkv"),
            (layer.attn, "o", "o"),
            (layer.mlp, "gate_up", "gate_up"),
            (layer.mlp, "down", "down"),
        ):
            setattr(owner, attr, _Recorder(getattr(owner, attr), f"{i}.{proj}", sink, valid))
    model(tokens, positions, MaskedAttention(config, positions, mask))
    return sink


_absmax_jit = jax.jit(_absmax_pass, static_argnames="config")


class Packed(NamedTuple):
    """One row of several sequences: each sees only itself (block-diagonal causal mask) and
    its positions restart at 0; padding (segment -1) is invalid and attends only itself."""

    tokens: np.ndarray  # int32 [T]
    positions: np.ndarray  # int32 [T]
    mask: np.ndarray  # bool [T, T]
    valid: np.ndarray  # bool [T]
    segment: np.ndarray  # int [T]: which sequence, -1 for padding


def _pack_row(sequences: list[list[int]], row_len: int) -> Packed:
    n = sum(map(len, sequences))
    tokens, positions = np.zeros(row_len, np.int32), np.zeros(row_len, np.int32)
    segment = np.full(row_len, -1)
    tokens[:n] = np.concatenate(sequences)
    positions[:n] = np.concatenate([np.arange(len(s)) for s in sequences])
    segment[:n] = np.concatenate([np.full(len(s), i) for i, s in enumerate(sequences)])
    idx = np.arange(row_len)
    mask = (segment[:, None] == segment[None, :]) & (idx[None, :] <= idx[:, None])
    return Packed(tokens, positions, mask, segment >= 0, segment)


def pack_sequences(sequences: Sequence[Sequence[int]], row_len: int = ROW_LEN) -> list[Packed]:
    """Packs sequences (each cut to row_len) into rows of row_len tokens, first fit by
    decreasing length: one shape compiles once, attention costs row_len^2 rather than
    total^2, and little of each row is padding."""
    seqs = sorted(([int(x) for x in s][:row_len] for s in sequences), key=len, reverse=True)
    rows: list[list[list[int]]] = []
    for seq in filter(None, seqs):
        row = next((r for r in rows if sum(map(len, r)) + len(seq) <= row_len), None)
        if row is None:
            rows.append(row := [])
        row.append(seq)
    return [_pack_row(r, row_len) for r in rows]


def activation_absmax(
    config: ModelConfig, tensors: Mapping[str, np.ndarray], sequences: Sequence[Sequence[int]]
) -> dict[str, np.ndarray]:
    """max|X| per input channel of every projection, {"<layer>.<projection>": float32 [K]},
    from one fp32 forward over the token sequences (each should start with BOS)."""
    from prism_jax.model.hf_weights import params_from_hf  # noqa: PLC0415 (circular)

    if not sequences or not any(len(s) for s in sequences):
        raise ValueError("calibration needs at least one non-empty token sequence")
    params = params_from_hf(config, tensors, "fp32", smoothing=None)
    stats: dict[str, np.ndarray] = {}
    for row in pack_sequences(sequences):
        out = _absmax_jit(params, config, row.tokens, row.positions, row.mask, row.valid)
        for k, v in out.items():
            stats[k] = np.maximum(stats[k], v) if k in stats else np.asarray(v, np.float32)
    return stats


def calibration_sequences(encode, bos_id: int | None) -> list[list[int]]:
    """The built-in passages as token sequences, BOS first: encode(str) -> list[int]."""
    head = [] if bos_id is None else [bos_id]
    return [head + list(encode(p)) for p in PASSAGES]


# --- cache ---------------------------------------------------------------------------------------


def weights_fingerprint(config: ModelConfig, tensors: Mapping[str, np.ndarray]) -> str:
    """A cheap identity of a checkpoint: config, names, shapes, dtypes and 256 evenly spaced
    values of every tensor. A collision only costs accuracy, never correctness: any s keeps
    the function, the statistics only choose it."""
    h = hashlib.sha256(repr(config).encode())
    for name in sorted(tensors):
        a = tensors[name]
        flat = np.asarray(a).reshape(-1)
        step = max(1, flat.size // 256)
        h.update(f"{name}:{a.shape}:{a.dtype}".encode())
        h.update(np.ascontiguousarray(flat[::step][:256]).tobytes())
    return h.hexdigest()[:24]


def _cache_path(key: str):
    from prism_jax.model.registry import cache_root  # noqa: PLC0415

    return cache_root() / "smoothing" / f"absmax-v{STATS_VERSION}-{key}.npz"


def tokens_key(sequences: Sequence[Sequence[int]]) -> str:
    """Identifies calibration given as token ids."""
    h = hashlib.sha256(b"tokens")
    for seq in sequences:
        h.update(np.asarray(seq, np.int64).tobytes() + b"|")
    return h.hexdigest()[:24]


def cached_activation_absmax(
    config: ModelConfig,
    tensors: Mapping[str, np.ndarray],
    calibration_key: str,
    make_sequences: Callable[[], Sequence[Sequence[int]]],
) -> dict[str, np.ndarray]:
    """activation_absmax, read from the user cache (a few KB per model) when this checkpoint
    was calibrated on this calibration_key before; else computed on make_sequences() (only
    then: loading a tokenizer and encoding costs seconds) and stored."""
    h = hashlib.sha256(weights_fingerprint(config, tensors).encode() + calibration_key.encode())
    path = _cache_path(h.hexdigest()[:24])
    if path.is_file():
        try:
            with np.load(path) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError):
            pass  # unreadable (e.g. truncated): recompute and overwrite
    stats = activation_absmax(config, tensors, make_sequences())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **stats)
    os.replace(tmp, path)  # atomic: readers see a whole file or none
    return stats
