"""SmoothQuant-style smoothing folded into HF weights at load, for the INT8 model.

Per-token activation scales lose accuracy when a few input channels of a projection are much
larger than the rest (the outliers set the scale and the ordinary channels fall into a few
INT8 codes). For each projection input channel j we pick
    s_j = max|X_j|^alpha / max|W[:, j]|^(1 - alpha)
and run the projection on X / s with W * s (columns): exactly the same function in real
arithmetic, with the activation range moved into the per-output-channel weight scales. The
division by s is folded into whatever produces X, so the runtime is unchanged:
  qkv, gate_up  X = rmsnorm(h) * (offset + gamma): gamma' = (offset + gamma) / s - offset
  down          X = act(gate) * up is linear in up: up_proj rows / s
  o             X = attention output, linear in v: v_proj rows (and bias) / s, with s shared
                by the G query heads that read one kv head
max|X_j| comes from one fp32 pass over calibration_text.py, cached in the user cache
(smoothing_calibration.py).

Shape letters: T tokens, D model dim, F ffw dim, N query heads, K kv heads, G = N / K,
H head dim.
"""

from __future__ import annotations

import hashlib
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from prism_jax.config import ModelConfig
from prism_jax.model.calibration_text import text_digest

# The calibration side lives in smoothing_calibration; what callers reach as smoothing.X stays.
from prism_jax.model.smoothing_calibration import (  # noqa: F401 (re-exported)
    ROW_LEN,
    Packed,
    activation_absmax,
    cached_activation_absmax,
    calibration_sequences,
    pack_sequences,
    tokens_key,
)

PROJECTIONS = ("qkv", "gate_up", "down", "o")
DEFAULT_ALPHA = 0.65  # chosen by benchmarks/int8_accuracy.py; see docs/INT8_SMOOTHING.md


def _norm_before(config: ModelConfig, projection: str) -> str:
    """HF name of the norm whose output feeds the projection."""
    if projection == "qkv":
        return "input_layernorm"
    return "pre_feedforward_layernorm" if config.sandwich_norms else "post_attention_layernorm"


# --- scales -------------------------------------------------------------------------------------


def smoothing_scales(x_absmax: np.ndarray, w_absmax: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), float64, geometric mean 1 over the live
    channels; a channel never seen active (or with zero weights) keeps s = 1."""
    x, w = np.asarray(x_absmax, np.float64), np.asarray(w_absmax, np.float64)
    live = (x > 0) & (w > 0)
    s = np.ones_like(x)
    if live.any():
        log_s = alpha * np.log(x[live]) - (1.0 - alpha) * np.log(w[live])
        s[live] = np.exp(log_s - log_s.mean())  # any common factor is absorbed by the scales
    return s


def _fold_into_norm(gamma: np.ndarray, s: np.ndarray, offset: float):
    """(gamma', s') with offset + gamma' = (offset + gamma) / s'.

    With Gemma's offset 1, gamma' = w / s - 1 loses the low bits of w / s when it is much
    smaller than 1; s is shrunk by a common factor (free: the scales absorb it) until every
    effective weight that is not ~0 is at least 1 in magnitude.
    """
    w = offset + np.asarray(gamma, np.float64)
    if offset:
        eff = np.abs(w) / s
        big = np.abs(w) > 1e-3 * np.abs(w).max()
        if big.any() and eff[big].min() < 1.0:
            s = s * eff[big].min()
    return (w / s - offset).astype(np.float32), s


# --- folding into HF tensors --------------------------------------------------------------------


def _f32(a) -> np.ndarray:
    return np.asarray(a, np.float32)  # no copy for float32 (memory-mapped) checkpoints


def _col_absmax(*weights: np.ndarray) -> np.ndarray:
    """max over every output row of every weight [out, K] -> [K] (max and -min: no |w| copy)."""
    return np.max([np.maximum(_f32(w).max(axis=0), -_f32(w).min(axis=0)) for w in weights], 0)


def _smooth_norm_input(config, t: dict, p: str, projection: str, x_absmax, alpha) -> None:
    names = ("q_proj", "k_proj", "v_proj") if projection == "qkv" else ("gate_proj", "up_proj")
    block = "self_attn." if projection == "qkv" else "mlp."
    keys = [f"{p}{block}{n}.weight" for n in names]
    norm = f"{p}{_norm_before(config, projection)}.weight"
    s = smoothing_scales(x_absmax, _col_absmax(*(t[k] for k in keys)), alpha)
    t[norm], s = _fold_into_norm(t[norm], s, config.norm_weight_offset)
    s32 = s.astype(np.float32)  # float32 products: no float64 copies of the weights
    for k in keys:
        t[k] = _f32(t[k]) * s32[None, :]  # (out, D)


def _smooth_down(t: dict, p: str, x_absmax, alpha) -> None:
    up, down = f"{p}mlp.up_proj.weight", f"{p}mlp.down_proj.weight"
    s = smoothing_scales(x_absmax, _col_absmax(t[down]), alpha).astype(np.float32)  # (F,)
    t[up] = _f32(t[up]) / s[:, None]  # (F, D): rows of up
    t[down] = _f32(t[down]) * s[None, :]  # (D, F)


def _smooth_o(config: ModelConfig, t: dict, p: str, x_absmax, alpha) -> None:
    c = config
    kgh = (c.num_kv_heads, c.num_groups, c.head_dim)
    a = p + "self_attn."
    w_o = _f32(t[a + "o_proj.weight"])  # (D, N*H), column n*H + h with n = k*G + g
    # One v row feeds G query heads, so its s is the group's: max over g of both statistics.
    x = np.asarray(x_absmax).reshape(kgh).max(axis=1)  # (K, H)
    w = _col_absmax(w_o).reshape(kgh).max(axis=1)  # (K, H)
    s = smoothing_scales(x.reshape(-1), w.reshape(-1), alpha).astype(np.float32)
    s = s.reshape(c.num_kv_heads, c.head_dim)  # (K, H)
    v = _f32(t[a + "v_proj.weight"]).reshape(c.num_kv_heads, c.head_dim, -1)  # (K, H, D)
    t[a + "v_proj.weight"] = (v / s[:, :, None]).reshape(-1, v.shape[-1])  # (K*H, D)
    if c.qkv_bias:
        t[a + "v_proj.bias"] = _f32(t[a + "v_proj.bias"]) / s.reshape(-1)
    cols = w_o.reshape(w_o.shape[0], *kgh) * s[None, :, None, :]  # (D, K, G, H)
    t[a + "o_proj.weight"] = cols.reshape(w_o.shape)


def _alphas(alpha: float | Mapping[str, float]) -> dict[str, float]:
    alphas = dict.fromkeys(PROJECTIONS, alpha) if np.isscalar(alpha) else dict(alpha)
    unknown = set(alphas) - set(PROJECTIONS)
    if unknown:
        raise ValueError(f"unknown projections {sorted(unknown)}; expected {PROJECTIONS}")
    return alphas


def smooth_layer(
    config: ModelConfig,
    tensors: Mapping[str, np.ndarray],
    layer: int,
    x_absmax: Mapping[str, np.ndarray],
    alpha: float | Mapping[str, float],
) -> dict[str, np.ndarray]:
    """The tensors of one decoder layer that smoothing changes, with it folded in (one layer
    at a time keeps the extra memory of a load to one layer's float32 copies)."""
    alphas = _alphas(alpha)
    t = ChainMap({}, tensors)  # writes land in the first map
    i, p = layer, f"model.layers.{layer}."
    # Row folds (o into v, down into up) first: the column folds then see their results.
    if "o" in alphas:
        _smooth_o(config, t, p, x_absmax[f"{i}.o"], alphas["o"])
    if "down" in alphas:
        _smooth_down(t, p, x_absmax[f"{i}.down"], alphas["down"])
    for proj in ("qkv", "gate_up"):
        if proj in alphas:
            _smooth_norm_input(config, t, p, proj, x_absmax[f"{i}.{proj}"], alphas[proj])
    return t.maps[0]


def smooth_hf_tensors(
    config: ModelConfig,
    tensors: Mapping[str, np.ndarray],
    x_absmax: Mapping[str, np.ndarray],
    alpha: float | Mapping[str, float],
) -> dict[str, np.ndarray]:
    """HF tensors with smoothing folded in (a new dict; unchanged tensors are shared).

    Args:
      config: the model's config.
      tensors: HF-named tensors (plain causal-LM names).
      x_absmax: {"<layer>.<projection>": max|X| per input channel}, from activation_absmax.
      alpha: one migration strength for every projection, or {projection: alpha} to smooth
        only the projections named.

    Returns:
      tensors whose fp32 function is the original's, up to rounding.
    """
    t = dict(tensors)
    for i in range(config.num_layers):
        t.update(smooth_layer(config, t, i, x_absmax, alpha))
    return t


# --- the load-time entry point -------------------------------------------------------------------


def _source_directory(tensors: Mapping[str, np.ndarray]):
    """The directory the tensors were memory-mapped from (loader.read_safetensors), if any."""
    from pathlib import Path  # noqa: PLC0415

    for a in tensors.values():
        while a is not None and not isinstance(a, np.memmap):
            a = getattr(a, "base", None)
        if a is not None and getattr(a, "filename", None):
            return Path(a.filename).parent
    return None


def text_calibration(tensors: Mapping[str, np.ndarray]):
    """(key, make_sequences) for the built-in text, tokenized with the tokenizer.json beside
    the checkpoint the tensors were memory-mapped from; None when there is none (tensors
    built in memory). The key hashes the text and tokenizer.json, not the tokens, so a cached
    load never builds the tokenizer."""
    directory = _source_directory(tensors)
    path = None if directory is None else directory / "tokenizer.json"
    if path is None or not path.is_file():
        return None
    key = f"text:{text_digest()}:{hashlib.sha256(path.read_bytes()).hexdigest()[:24]}"

    def make_sequences() -> list[list[int]]:
        from prism_jax.tokenizer import Tokenizer  # noqa: PLC0415

        tok = Tokenizer.from_dir(directory)
        return calibration_sequences(lambda text: tok.encode(text, add_bos=False), tok.bos_id)

    return key, make_sequences


def layer_folding(
    config: ModelConfig,
    tensors: Mapping[str, np.ndarray],
    alpha: float | Mapping[str, float],
    calibration_tokens: Sequence[Sequence[int]] | None = None,
) -> Callable[[int], dict[str, np.ndarray]] | None:
    """params_from_hf's hook: calibrates (or reads the cached statistics) and returns
    layer -> that layer's smoothed tensors (smooth_layer).

    None without calibration_tokens and without a tokenizer.json beside the checkpoint
    (tensors built in memory): smoothing needs real text, and random tokens calibrate
    visibly worse (docs/INT8_SMOOTHING.md); calibration_tokens=random_sequences(config)
    accepts that.
    """
    alphas = _alphas(alpha)  # fail on a bad alpha before calibrating
    if calibration_tokens:
        source = tokens_key(calibration_tokens), lambda: calibration_tokens
    else:
        source = text_calibration(tensors)
    if source is None:
        return None
    stats = cached_activation_absmax(config, tensors, *source)
    return lambda layer: smooth_layer(config, tensors, layer, stats, alphas)


def random_sequences(config: ModelConfig, n: int = 8, length: int = 192, seed: int = 0):
    """Token-free calibration: uniform random ids after BOS (worse than text; see the doc)."""
    rng = np.random.default_rng(seed)
    head = [] if config.bos_token_id is None else [config.bos_token_id]
    return [head + rng.integers(0, config.vocab_size, length).tolist() for _ in range(n)]
