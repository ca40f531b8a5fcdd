"""GPU smoke run of the model (a script for the H200 machine, not collected by pytest):

  1. tiny gemma3, int8: hidden states with the CUDA custom calls vs the CPU custom calls;
  2. Gemma-3-27B shapes: init_random (int8, then bf16) on the GPU, device memory, compile time
     and step time of forward + candidate readout at T tokens (plain-jnp attention for now).

Prints one JSON line per measurement. Usage: python3 tests/model/gpu_smoke.py [T]
"""

from __future__ import annotations

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax import config as C
from prism_jax.config import ModelConfig
from prism_jax.model import candidate_readout, forward, init_random
from tests.model.tiny import TINY_HF_CONFIGS


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def causal_inputs(t: int, vocab: int, device):
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, vocab, t), jnp.int32)
    args = (tokens, jnp.arange(t, dtype=jnp.int32), jnp.tril(jnp.ones((t, t), bool)))
    return [jax.device_put(a, device) for a in args]


def tiny_gpu_vs_cpu() -> None:
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS["gemma3"])
    step = jax.jit(forward, static_argnames="config")
    out = {}
    for platform in ("gpu", "cpu"):
        device = jax.devices(platform)[0]
        with jax.default_device(device):
            params = init_random(config, "int8", seed=0)
            out[platform] = np.asarray(step(params, config, *causal_inputs(24, 384, device)))
    diff = float(np.abs(out["gpu"] - out["cpu"]).max() / out["cpu"].std())
    emit(
        check="tiny gemma3 int8, CUDA vs CPU custom calls",
        max_diff_std=diff,
        bitwise=bool(np.array_equal(out["gpu"].view(np.uint32), out["cpu"].view(np.uint32))),
    )


def timed(fn, *args, runs: int = 10) -> list[float]:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times


def big_model(precision: str, t: int) -> None:
    config, device = C.GEMMA3_27B, jax.devices("gpu")[0]
    start = time.perf_counter()
    params = init_random(config, precision, seed=0)
    jax.block_until_ready(params)
    init_s = time.perf_counter() - start
    in_use = (device.memory_stats() or {}).get("bytes_in_use", 0) / 2**30

    def step(params, tokens, positions, mask):
        hidden = forward(params, config, tokens, positions, mask)
        ids = jnp.tile(jnp.arange(4, dtype=jnp.int32)[None], (8, 1))
        return candidate_readout(params, config, hidden[-8:], ids, jnp.full(8, 4, jnp.int32))

    args = causal_inputs(t, config.vocab_size, device)
    start = time.perf_counter()
    compiled = jax.jit(step).lower(params, *args).compile()
    compile_s = time.perf_counter() - start
    times = timed(compiled, params, *args)
    emit(
        check="gemma3-27b shapes",
        precision=precision,
        tokens=t,
        init_s=round(init_s, 1),
        params_gib=round(in_use, 2),
        compile_s=round(compile_s, 1),
        step_ms_median=round(1e3 * float(np.median(times)), 2),
        step_ms_min=round(1e3 * min(times), 2),
    )
    del params


def main() -> None:
    t = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    import flax  # noqa: PLC0415

    emit(jax=jax.__version__, flax=flax.__version__, devices=str(jax.devices()))
    tiny_gpu_vs_cpu()
    for precision in ("int8", "bf16"):
        big_model(precision, t)


if __name__ == "__main__":
    main()
