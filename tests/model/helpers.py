"""Shared helpers for the model tests: loading the HF reference and running our model."""

from __future__ import annotations

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file

from prism_jax.config import ModelConfig
from prism_jax.model import Params, forward, full_logits, params_from_hf

_forward = jax.jit(forward, static_argnames="config")
_full_logits = jax.jit(full_logits, static_argnames="config")


def causal(t: int) -> jax.Array:
    return jnp.tril(jnp.ones((t, t), bool))


def run(params: Params, config: ModelConfig, tokens, positions=None, mask=None) -> np.ndarray:
    """Final hidden states [T, D] as float32 numpy (positions and mask default to causal)."""
    t = len(tokens)
    positions = np.arange(t) if positions is None else positions
    mask = causal(t) if mask is None else mask
    h = _forward(
        params,
        config,
        jnp.asarray(tokens, jnp.int32),
        jnp.asarray(positions, jnp.int32),
        jnp.asarray(mask),
    )
    return np.asarray(h.astype(jnp.float32))


@functools.cache
def load_case(case_dir: pathlib.Path) -> tuple[ModelConfig, dict, list[int]]:
    config = ModelConfig.from_hf_config(json.loads((case_dir / "config.json").read_text()))
    spec = json.loads((case_dir.parent / "spec.json").read_text())
    tokens = next(c["tokens"] for c in spec if c["name"] == case_dir.name)
    return config, load_file(case_dir / "model.safetensors"), tokens


@functools.cache
def our_params(case_dir: pathlib.Path, precision: str) -> Params:
    config, tensors, _ = load_case(case_dir)
    return params_from_hf(config, tensors, precision)


@functools.cache
def our_logits(case_dir: pathlib.Path, precision: str) -> np.ndarray:
    """Our logits [T, V] for the HF case's tokens, from its safetensors."""
    config, _, tokens = load_case(case_dir)
    params = our_params(case_dir, precision)
    t = len(tokens)
    h = _forward(
        params, config, jnp.asarray(tokens, jnp.int32), jnp.arange(t, dtype=jnp.int32), causal(t)
    )
    return np.asarray(_full_logits(params, config, h))


def rel_max_diff(a: np.ndarray, ref: np.ndarray) -> float:
    """max |a - ref| in units of the reference logits' standard deviation."""
    return float(np.abs(a.astype(np.float64) - ref).max() / ref.std())


def mean_kl(ref_logits: np.ndarray, logits: np.ndarray) -> float:
    """Mean over rows of KL(softmax(ref) || softmax(logits))."""
    lp = jax.nn.log_softmax(jnp.asarray(ref_logits, jnp.float32), -1)
    lq = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), -1)
    return float((jnp.exp(lp) * (lp - lq)).sum(-1).mean())


def top1(a: np.ndarray, b: np.ndarray) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).mean())


def machine_summary() -> str:
    """This machine's CPU, as far as XLA's CPU code could depend on it (for failure messages)."""
    import platform  # noqa: PLC0415

    info = pathlib.Path("/proc/cpuinfo")
    text = info.read_text() if info.exists() else ""
    model = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if "model name" in ln), "?"
    )
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    wanted = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return f"{platform.machine()} {model} [{' '.join(wanted)}], jax {jax.__version__}"
