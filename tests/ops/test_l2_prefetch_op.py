"""ops.l2_prefetch / ops.prefetched (the prism_l2_prefetch custom call): the value handed on bit
for bit, max_bytes checked; and the int8 model with
PRISM_ATTN_WEIGHT_PREFETCH=on issues one prefetch of the o weights per layer and computes the
same bits as without it. CPU and GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from prism_jax.config import ModelConfig
from prism_jax.model import forward, init_random
from tests.conftest import assert_bitwise_equal, run_on
from tests.model.tiny import TINY_HF_CONFIGS


def test_prefetched_hands_the_value_on(device, rng):
    y = rng.normal(0, 1, (37, 64)).astype(np.float32)
    w = rng.integers(-127, 128, (300, 1000), dtype=np.int8)
    w2 = rng.integers(-127, 128, (7,), dtype=np.int8)  # smaller than one 16-byte piece
    out = run_on(device, lambda a, b, c: ops.prefetched(a, b, c) * 2.0, y, w, w2)
    assert_bitwise_equal(out, y * 2.0, "prefetched(y, w) * 2 vs y * 2")
    passed = run_on(device, lambda a, b: ops.l2_prefetch(b, a, max_bytes=100), y, w)
    assert_bitwise_equal(passed, y, "l2_prefetch(w, after=y) vs y")


def test_bad_max_bytes_is_an_error():
    with pytest.raises(ValueError, match="max_bytes"):
        ops.l2_prefetch(jnp.zeros(4), jnp.zeros(1), max_bytes=-1)


def test_unknown_setting_is_an_error(monkeypatch):
    monkeypatch.setenv("PRISM_ATTN_WEIGHT_PREFETCH", "")  # gpu_suite's default: off
    assert not ops.prefetch_o_weights()
    monkeypatch.setenv("PRISM_ATTN_WEIGHT_PREFETCH", "yes")
    with pytest.raises(ValueError, match="PRISM_ATTN_WEIGHT_PREFETCH"):
        ops.prefetch_o_weights()


def _forward_hlo_and_hidden(device, params, config, tokens):
    """A fresh jit of a fresh function (the setting is read at trace time, and JAX keys its
    trace cache on the function): the lowered text and hidden [T, D]."""
    t = len(tokens)
    args = (jnp.asarray(tokens, jnp.int32), jnp.arange(t), jnp.tril(jnp.ones((t, t), bool)))
    fn = jax.jit(lambda p, *a: forward(p, config, *a))
    with jax.default_device(device):
        text = fn.lower(params, *args).as_text()
        hidden = np.asarray(fn(params, *args).astype(jnp.float32))
    return text, hidden


def test_int8_model_prefetches_o_weights_with_the_same_bits(device, rng, monkeypatch):
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS["gemma3"])
    params = jax.device_put(init_random(config, "int8", seed=int(rng.integers(1 << 30))), device)
    tokens = rng.integers(0, config.vocab_size, 13)
    monkeypatch.setenv("PRISM_ATTN_WEIGHT_PREFETCH", "off")
    plain_text, plain = _forward_hlo_and_hidden(device, params, config, tokens)
    monkeypatch.setenv("PRISM_ATTN_WEIGHT_PREFETCH", "on")
    text, hidden = _forward_hlo_and_hidden(device, params, config, tokens)
    assert "prism_l2_prefetch" not in plain_text
    calls = text.count("prism_l2_prefetch")
    digits = 2 if "o" in config.int8_two_digit_weights else 1
    assert calls == config.num_layers * digits, f"{calls} prefetch calls in the forward"
    assert_bitwise_equal(hidden, plain, "int8 forward with the o-weight prefetch vs without")
